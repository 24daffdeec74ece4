"""``python -m replay [overrides]``: see :mod:`replay.app`."""

from replay.app import main

if __name__ == "__main__":
    main()
