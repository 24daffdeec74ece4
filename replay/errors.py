"""The base class of every error caused by bad input (files, rows, config values), and the
one line a command ends with on Ctrl-C.

``python -m replay`` reports these as one line naming what is wrong and exits with
status 2; anything else (a policy bug, say) keeps its traceback.
"""

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: What a command prints when Ctrl-C ends it (:func:`say_interrupted`).
INTERRUPTED = "interrupted (Ctrl-C)"


def say_interrupted(hint: str = "") -> None:
    """Print the interrupt's one line, once per process however many helpers the interrupt
    passes through (:func:`replay.config.cli.interrupted`, :func:`report_interrupt`, a
    Ctrl-C landing while the command ends), and from then on print nothing more: objects the
    interrupt left half-way (a library's context manager cut inside its ``__enter__``, say)
    are finalized while Python shuts down and report errors such as ``sys.meta_path is
    None``, "ignored", under the line. They are consequences of the interrupt, not news."""
    global _said
    if not _said:
        print(f"{INTERRUPTED}{f'; {hint}' if hint else ''}", file=sys.stderr, flush=True)
        _said = True
    sys.unraisablehook = _ignore


_said = False


def surfacing_interrupts(work: Callable[..., T], *args, **kwargs) -> T:
    """Call ``work``; an error raised while a Ctrl-C was being handled is the Ctrl-C.

    A library's cleanup can fail on the state an interrupt left half-built: CI's Ctrl-C of
    ``replay.fluid`` landed in omegaconf's config building, whose ``finally`` then raised an
    ``AttributeError``, wrapped in omegaconf's own error. Reported as it came, that is a
    traceback (or, in a sweep, a job recorded as failed while the sweep goes on) instead of
    the interrupt's one line and end."""
    try:
        return work(*args, **kwargs)
    except Exception as exc:
        cut = interrupt_behind(exc)
        if cut is None:
            raise
        raise cut from None


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt among ``exc``'s causes and contexts, if any."""
    pending, seen = [exc], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        if isinstance(current, KeyboardInterrupt):
            return current
        seen.add(id(current))
        pending += [current.__cause__, current.__context__]
    return None


def report_interrupt(kind, value, traceback) -> None:
    """``sys.excepthook`` of the commands: an interrupt that reaches the top ends with one line
    (:func:`say_interrupted`) instead of Python's traceback. Python still ends the process
    by SIGINT, as an interrupted program should (status 130 in a shell). Any other error
    keeps its traceback."""
    if issubclass(kind, KeyboardInterrupt):
        say_interrupted()
    else:
        sys.__excepthook__(kind, value, traceback)


def when_run_as_a_command() -> None:
    """Install :func:`report_interrupt` if a package is being imported for ``python -m
    PACKAGE.MODULE`` (Python imports the package before the module, with ``sys.argv[0]`` set
    to ``-m`` until then), so that Ctrl-C while the command still imports its libraries
    (pandas, numba: a second or more) is one line too. Importing the package otherwise (a
    library use, a test) leaves the hook alone."""
    if sys.argv[:1] == ["-m"]:
        sys.excepthook = report_interrupt
        resend_interrupts_lost_in_callbacks()


def resend_interrupts_lost_in_callbacks() -> None:
    """Install :func:`resend_lost_interrupt` in this process (unless the interrupt's line is
    already out). A command's own process gets it on import (:func:`when_run_as_a_command`);
    a sweep's worker process, which imports kvsched to run a job and compiles there, gets it
    from the job. The worker's interrupt needs no line of its own: the sweep prints it."""
    if sys.unraisablehook is not _ignore:
        sys.unraisablehook = resend_lost_interrupt


def resend_lost_interrupt(unraisable) -> None:
    """``sys.unraisablehook`` of the commands. A Ctrl-C that lands in a C library's callback
    (llvmlite's, while numba compiles) is "ignored" by Python, which prints a traceback and
    goes on: the command would neither stop nor end with one line. The interrupt is sent
    again a moment later instead (one raised inside this hook would be ignored too), so the
    next Python code the command runs stops as usual. A Ctrl-C that lands after the command's
    work, while Python ends it (in an ``atexit`` callback, say), has no Python code left to
    stop: its line is printed here and the process ends by SIGINT at once. Anything else
    is reported as Python does."""
    if not issubclass(unraisable.exc_type, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)
        return
    if not threading.main_thread().is_alive() and threading.current_thread() is \
            threading.main_thread():  # Python is ending the process: end it by SIGINT now
        say_interrupted()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.raise_signal(signal.SIGINT)
    threading.Timer(0.01, signal.pthread_kill,
                    (threading.main_thread().ident, signal.SIGINT)).start()


def end_worker_quietly_on_ctrl_c() -> None:
    """Initializer of every worker pool the commands start (a study's trials,
    ``replay.compile``): Ctrl-C reaches the whole process group, and a worker ends at once
    and without a word, since the command prints the one line. Otherwise an idle worker
    prints its queue read's KeyboardInterrupt, and a busy one hands the interrupt back as
    its result and takes the next task."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(128 + signal.SIGINT))


def _ignore(unraisable) -> None:
    """An unraisable hook that reports nothing (:func:`say_interrupted`)."""


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
