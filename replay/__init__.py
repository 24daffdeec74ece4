"""kvsched replay: an iteration-level simulator of LLM serving under a KV-cache limit.

The engine (:mod:`replay.engine.loop`) owns time, arrivals, KV accounting, evictions
and metrics; a policy (:mod:`policies`) only decides which requests run in each
iteration; a timing backend (:mod:`replay.timing`) prices each iteration.
"""

from replay.errors import when_run_as_a_command

when_run_as_a_command()  # Ctrl-C while a command imports is one line too
