"""The fluid model of the WAIT paper and its command (``python -m replay.fluid``)."""
