"""The base class of every error caused by bad input (files, rows, config values), and the
one line a command ends with on Ctrl-C.

``python -m replay`` reports these as one line naming what is wrong and exits with
status 2; anything else (a policy bug, say) keeps its traceback.
"""

import signal
import sys
import threading

#: What a command prints when Ctrl-C ends it (:func:`report_interrupt`).
INTERRUPTED = "interrupted (Ctrl-C)"


def report_interrupt(kind, value, traceback) -> None:
    """``sys.excepthook`` of the commands: an interrupt that reaches the top ends with one line
    instead of Python's traceback (none if the line was printed already: ``value.reported``,
    :func:`replay.config.cli.interrupted`). Python still ends the process by SIGINT, as an
    interrupted program should (status 130 in a shell). Any other error keeps its traceback."""
    if not issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, traceback)
        return
    if not getattr(value, "reported", False):
        print(INTERRUPTED, file=sys.stderr, flush=True)
    ending_on_interrupt()


def ending_on_interrupt() -> None:
    """After the interrupt's line, the process only ends: objects the interrupt left half-way
    (a library's context manager cut inside its ``__enter__``, say) are finalized while
    Python shuts down and report errors such as ``sys.meta_path is None``, "ignored", under
    the one line. They are consequences of the interrupt, not news, so nothing of the kind
    is printed from here on."""
    sys.unraisablehook = _ignore


def when_run_as_a_command() -> None:
    """Install :func:`report_interrupt` if a package is being imported for ``python -m
    PACKAGE.MODULE`` (Python imports the package before the module, with ``sys.argv[0]`` set
    to ``-m`` until then), so that Ctrl-C while the command still imports its libraries
    (pandas, numba: a second or more) is one line too. Importing the package otherwise (a
    library use, a test) leaves the hook alone."""
    if sys.argv[:1] == ["-m"]:
        sys.excepthook = report_interrupt
        sys.unraisablehook = resend_lost_interrupt


def resend_lost_interrupt(unraisable) -> None:
    """``sys.unraisablehook`` of the commands. A Ctrl-C that lands in a C library's callback
    (llvmlite's, while numba compiles) is "ignored" by Python, which prints a traceback and
    goes on: the command would neither stop nor end with one line. The interrupt is sent
    again a moment later instead (one raised inside this hook would be ignored too), so the
    next Python code the command runs stops as usual. Anything else is reported as Python
    does."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        threading.Timer(0.01, signal.pthread_kill,
                        (threading.main_thread().ident, signal.SIGINT)).start()
    else:
        sys.__unraisablehook__(unraisable)


def _ignore(unraisable) -> None:
    """An unraisable hook that reports nothing (:func:`ending_on_interrupt`)."""


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
