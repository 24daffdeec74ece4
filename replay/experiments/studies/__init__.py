"""Multi-trial studies run through the ``study`` hook of ``python -m replay``."""
