"""Building blocks that only policies use (lookahead checks, the F metric, planned
orders, staging, the serving policies' preemption rule)."""
