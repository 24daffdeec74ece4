"""The base class of every error caused by bad input (files, rows, config values).

``python -m replay`` reports these as one line naming what is wrong and exits with
status 2; anything else (a policy bug, say) keeps its traceback.
"""


class InputError(Exception):
    """Bad input the user can fix: a missing or malformed file, an impossible request,
    an invalid option."""


class ConfigError(InputError, ValueError):
    """A config value a component rejects (named by its config key in the message)."""


class SolverError(InputError, RuntimeError):
    """An LP or MILP behind a policy's plan did not reach optimality (time limit or solver
    failure); the message names the status and the option that changes it."""


class OutputError(InputError, OSError):
    """A result file or folder that cannot be written (a file in the way, a read-only or
    full disk, an impossible path). The message is ``cannot write PATH (reason)``; it is
    also an ``OSError`` so that code that guards file operations still sees it."""

    def __init__(self, path, reason: str) -> None:
        super().__init__(f"cannot write {path} ({reason})")
        self.path, self.reason = str(path), reason

    def __reduce__(self):
        # Rebuilt from its own arguments when a sweep worker hands it to the main process.
        return type(self), (self.path, self.reason)


class LimitError(ConfigError):
    """A config implies a size (requests, LP nonzeros, ...) beyond a limit: the message
    names the estimate, the limit and the keys it follows from."""
