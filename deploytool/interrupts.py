"""Ctrl-C during long work that runs Python inside TVM's C++ (tuning).

A KeyboardInterrupt raised in a Python callback that C++ called (a relax pass, a schedule rule,
the cost model) does not come back as a KeyboardInterrupt: TVM's FFI turns it into a RuntimeError,
which a fallback (``except Exception``: a rule that fails leaves its kernel unscheduled) may take
for a failure and carry on, so the run went on to its end with exit 0; raised on one of
MetaSchedule's search threads, it is std::terminate. So while :class:`Deferred` is active, the
first Ctrl-C only sets a flag and the work stops at its next ``check()``; a second one exits at
once (tuning logs are flushed record by record, workers die with the process).

Z3 (TVM's analyzer proves bounds with it, inside schedule post-processing and MetaSchedule's
search) installs a SIGINT handler of its own for the length of each solver call, which cancels the
solve and puts Python's back without passing the signal on: a Ctrl-C that lands there is lost (a
tune ran on to its end; CI stop 38 and this suite under load failed ``test_ctrl_c_stops_cleanly``).
No thread then runs a SIGINT handler at all while a :class:`Watcher` is active: SIGINT is blocked
and a thread of ours takes it with ``sigwait``, then acts for Python's handler.

Worker processes must not take the Ctrl-C that a terminal sends to the whole process group: one
hit while starting (before its initializer could ignore SIGINT) printed a KeyboardInterrupt
traceback, or hung in TVM's start-up and held its batch. :func:`sigint_blocked` wraps the calls
that start workers; they start with SIGINT blocked and ignore it before unblocking
(:func:`ignore_in_worker`).
"""
from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading


def _python_takes_sigint() -> bool:
    """In the main thread, where SIGINT is not ignored (a background job of a script ignores it)."""
    return threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) not in (
        signal.SIG_IGN, None)


class _SigintHandler:
    """Context manager installing ``self._handler`` for SIGINT while active: only in the main
    thread, and not where SIGINT is ignored (a background job of a script: nothing changes)."""

    def __init__(self):
        self.hit = False
        self._old = None

    def _handler(self, signum, frame):
        raise NotImplementedError

    def _install(self) -> None:
        if _python_takes_sigint():
            self._old = signal.signal(signal.SIGINT, self._handler)

    def __enter__(self):
        self._install()
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None


class Deferred(_SigintHandler):
    """Defer Ctrl-C to :meth:`check`. Nested use shares the outer one's flag."""

    def __init__(self, message: str = "stopping after the step in flight (Ctrl-C again: at once)"):
        super().__init__()
        self.message = message
        self._watcher: Watcher | None = None

    def _handler(self, signum, frame):
        if self.hit:
            _say("deploytool: interrupted")
            os._exit(130)
        self.hit = True
        _say(f"deploytool: {self.message}")

    def check(self) -> None:
        """Raise KeyboardInterrupt when Ctrl-C came since this was entered."""
        if self.hit:
            raise KeyboardInterrupt

    def __enter__(self) -> "Deferred":
        outer = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
        if isinstance(outer, Deferred):
            return outer  # an outer one is active: share its flag (this one's exit changes nothing)
        self._install()
        self._watcher = Watcher().__enter__() if self._old is not None else None
        return self

    def __exit__(self, *exc) -> None:
        if self._watcher is not None:
            self._watcher.__exit__(*exc)
            self._watcher = None
        super().__exit__(*exc)


class Watcher:
    """While active, SIGINT is blocked in this thread and every thread started from it, and a
    thread of ours takes it (``sigwait``) and acts as the Python handler then installed would: a
    :class:`Deferred`'s handler runs on that thread (the flag, or the exit at a second Ctrl-C); any
    other handler runs in the main thread (``_thread.interrupt_main``). So no handler another
    library installs meanwhile (Z3's, see the module's docstring) can swallow it. Threads that
    existed before keep SIGINT unblocked: enter it before the imports that start threads (numpy's
    BLAS pool), as ``deploytool tune`` does. Nested: an inner one does nothing. Processes started
    meanwhile inherit SIGINT blocked (this module's workers unblock it: :func:`ignore_in_worker`)."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._old = None
        self._stop = False

    def __enter__(self) -> "Watcher":
        if not _python_takes_sigint():
            return self
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        if signal.SIGINT in old:  # an outer one watches already
            return self
        self._old = old
        self._thread = threading.Thread(target=self._take, name="deploytool-sigint", daemon=True)
        self._thread.start()
        return self

    def _take(self) -> None:
        while True:
            signal.sigwait({signal.SIGINT})
            if self._stop:
                return
            owner = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
            if isinstance(owner, Deferred):
                owner._handler(signal.SIGINT, None)
            else:
                _thread.interrupt_main(signal.SIGINT)

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._stop = True
        signal.pthread_kill(self._thread.ident, signal.SIGINT)
        self._thread.join()
        self._thread = None
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)


class Noted(_SigintHandler):
    """For a whole command: Ctrl-C raises KeyboardInterrupt as usual, and is noted (``hit``), so
    that an error a KeyboardInterrupt became inside TVM (a RuntimeError from its FFI) still reads
    as the interrupt."""

    def _handler(self, signum, frame):
        self.hit = True
        raise KeyboardInterrupt


def _say(line: str) -> None:
    # the handler may interrupt a write to stderr (the progress line): a second write into the same
    # buffered stream raises "reentrant call"; the raw fd does not care
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass


@contextlib.contextmanager
def sigint_blocked():
    """Block SIGINT in this thread meanwhile: processes started here start with it blocked. A
    Ctrl-C that comes meanwhile is delivered here when it ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_in_worker() -> None:
    """In a worker started under :func:`sigint_blocked`: ignore SIGINT (the parent handles it and
    stops the worker), then unblock it (a pending one is dropped)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def exit_interrupted(code: int = 130) -> None:
    """Leave at once after a Ctrl-C once clean-up ran: without Python's exit handlers, which join
    the worker pools' threads (a feeder thread writing to a killed worker's pipe can block that
    join, or print an OSError traceback)."""
    try:  # multiprocessing's own clean-ups that cannot block (its semaphores: else the resource
        # tracker warns of leaked ones); the queue joins that can (priority < 0) are left out
        from multiprocessing import util

        util._run_finalizers(0)
    except Exception:
        pass
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    os._exit(code)
