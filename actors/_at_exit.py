"""Systems still running when the interpreter exits are stopped first.

The actors run on non-daemon threads (so a stop can finish the work in flight), and the
interpreter joins those before it runs ``atexit`` handlers: a script that ended (or
raised, or was interrupted) without :meth:`~actors.system.DispatchSystem.stop` would
hang at exit. The hook here runs at that join, as ``concurrent.futures`` does for its
workers (``threading._register_atexit``): each running system is stopped within
:data:`AT_EXIT_STOP_S`, so what its running calls paid for is stored (or salvaged) and
the process exits.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

from ._runtime import log

__all__ = ["AT_EXIT_STOP_S", "track", "untrack"]

AT_EXIT_STOP_S = 30.0
"""Bound, seconds, on stopping each system left running at interpreter exit."""

_running: set[Any] = set()
"""Systems started and not stopped (held strongly: a system its host let go of still runs
its actors' threads, which would hold the exit up just the same)."""
_hooked = False
_lock = threading.Lock()


def track(system: Any) -> None:
    """Stop ``system`` at interpreter exit unless it was stopped before."""
    global _hooked
    with _lock:
        _running.add(system)
        if _hooked:
            return
        _hooked = True
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(_stop_all)
    except RuntimeError:  # interpreter already shutting down, or no such hook: the late one
        atexit.register(_stop_all)


def untrack(system: Any) -> None:
    """``system`` was stopped."""
    with _lock:
        _running.discard(system)


def _stop_all() -> None:
    with _lock:
        left = list(_running)
    for system in left:
        if system.stopped:
            continue
        log.warning(
            "the interpreter is exiting with a DispatchSystem still running (stop() was not "
            "called): stopping it, up to %.0f s", AT_EXIT_STOP_S,
        )  # fmt: skip
        try:
            system.stop(timeout_s=AT_EXIT_STOP_S)
        except BaseException:
            log.exception("stopping a DispatchSystem at interpreter exit failed")
