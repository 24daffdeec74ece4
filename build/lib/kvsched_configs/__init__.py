"""The Hydra config tree, installed as the package ``kvsched_configs`` (see pyproject.toml),
so that ``pip install .`` and wheels carry it and ``python -m replay`` runs anywhere."""
