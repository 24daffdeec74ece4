"""Where requests come from: workloads (one module per kind of source), arrival
processes and output-length predictions."""
