"""kvsched's Hydra sweeper (``hydra/sweeper=kvsched``, the default of ``python -m replay``;
:mod:`.sweeper`). It lives in Hydra's plugin namespace (``hydra_plugins``) because Hydra
instantiates sweepers only from there."""
