"""Systems still running when the interpreter exits are stopped first.

A host that never calls :meth:`~actors.system.DispatchSystem.stop` (its script raised,
was interrupted, or just ended) must still exit, and keep what its running calls paid
for. The actors run on daemon threads, so they never hold the exit up; this ``atexit``
hook stops each system left running, within :data:`AT_EXIT_STOP_S`, once the host's own
(non-daemon) threads have ended, so calls those threads still make are served. Calls
not yet sent are cancelled, running ones finish and are stored (or salvaged).

An interrupt while it waits (a second Ctrl-C) ends the wait: the process exits, and
calls still running are left to their leases, as after a crash. A child made by
``os.fork`` does not stop its parent's systems (their threads are not in it); a
``multiprocessing`` child, which leaves through ``os._exit``, stops its own as it runs
multiprocessing's finalizers.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import threading
from typing import Any

from actors.runtime.actor import log

__all__ = ["AT_EXIT_STOP_S", "ExitHook", "track", "untrack"]

AT_EXIT_STOP_S = 30.0
"""Bound, seconds, on stopping each system left running at interpreter exit."""


class ExitHook:
    """The systems started and not stopped, and the hook that stops them (:meth:`run`).

    Systems are held strongly: a system its host let go of still runs, and still has calls
    to finish. The process's own hook runs at interpreter exit (``atexit``) and, in a
    ``multiprocessing`` child, as one of multiprocessing's finalizers: so it may run twice.
    """

    def __init__(self) -> None:
        self._running: set[Any] = set()
        self._lock = threading.Lock()
        self._interrupted = False
        """An interrupt ended the hook's wait: every later run of it returns at once."""

    def add(self, system: Any) -> None:
        """Stop ``system`` when the hook runs, unless it was stopped before."""
        with self._lock:
            self._running.add(system)

    def discard(self, system: Any) -> None:
        """``system`` was stopped."""
        with self._lock:
            self._running.discard(system)

    def forget_in_child(self) -> None:
        """In a child made by ``os.fork``: the parent's systems are not here (their threads
        are not)."""
        self._lock = threading.Lock()  # a lock held by another thread at the fork stays held in the copy
        self._running.clear()

    def run(self) -> None:
        """Stop each system still running, each within :data:`AT_EXIT_STOP_S`; an interrupt
        (``KeyboardInterrupt``) ends the wait, and this run and every later one return."""
        if self._interrupted:  # told to leave: a later run of the hook (multiprocessing's) leaves too
            return
        with self._lock:
            left = list(self._running)
        for system in left:
            if system.stopped:
                continue
            try:
                log.warning(
                    "the interpreter is exiting with a DispatchSystem still running (stop() was not "
                    "called): stopping it, up to %.0f s (interrupt again to leave at once)", AT_EXIT_STOP_S,
                )  # fmt: skip
                system.stop(timeout_s=AT_EXIT_STOP_S)
            except KeyboardInterrupt:
                self._interrupted = True
                log.warning("interrupted again: leaving now; calls still running are left to their leases")
                return
            except BaseException:
                log.exception("stopping a DispatchSystem at interpreter exit failed")


_hook = ExitHook()
"""This process's hook."""
_finalizer_lock = threading.Lock()
_finalizer_pid: int | None = None


def track(system: Any) -> None:
    """Stop ``system`` at interpreter exit unless it was stopped before."""
    global _finalizer_pid
    _hook.add(system)
    with _finalizer_lock:
        if _finalizer_pid == os.getpid():
            return
        _finalizer_pid = os.getpid()
    # a multiprocessing child made by fork leaves through os._exit (no atexit), after
    # running multiprocessing's finalizers: the same hook is one of them, in each process
    multiprocessing.util.Finalize(None, _hook.run, exitpriority=100)


def untrack(system: Any) -> None:
    """``system`` was stopped."""
    _hook.discard(system)


def _forget_in_child() -> None:
    global _finalizer_lock
    _finalizer_lock = threading.Lock()
    _hook.forget_in_child()


atexit.register(_hook.run)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
