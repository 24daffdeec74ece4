"""Request-length traces: download (:mod:`traces.fetch`), build (:mod:`traces.build`), describe
(:mod:`traces.stats`).

The replay reads traces from ``${data_dir}/traces/`` (see ``configs/workload/``); nothing here
is imported by a replay.
"""

from replay.errors import when_run_as_a_command

when_run_as_a_command()  # Ctrl-C while a command imports is one line too
