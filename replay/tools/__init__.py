"""Command-line tools of the timing backends: ``fit_linear`` (fit the linear model to Vidur),
``shapes`` (price standard batch shapes, decompose a B iteration), ``attention_sources``
(compare the derived 7B attention table with kernel tables) and ``timing_sources`` (compare
the kernel tables and the measured profiles with Vidur; writes docs/timing-sources.md)."""
