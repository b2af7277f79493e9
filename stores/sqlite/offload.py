"""Run blocking SQLite work where it cannot stall a gevent hub.

Under gevent monkey-patching, sqlite3 calls would block the whole hub, and a busy
wait on a database lock would deadlock it. When ``threading`` is patched, work is
handed to the hub's threadpool (real OS threads) and guarded by an unpatched lock;
otherwise it runs inline under an ordinary lock. On an OS thread that has no hub (a
native thread such as the lease renewer, which must never wait for a hub) it runs inline
too: no greenlet lives there to be blocked.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["BlockingRunner", "gevent_active"]

T = TypeVar("T")


def gevent_active() -> bool:
    """True when gevent has monkey-patched ``threading`` in this process."""
    monkey = sys.modules.get("gevent.monkey")
    return bool(monkey and monkey.is_module_patched("threading"))


class BlockingRunner:
    """Serialises calls to one resource and keeps them off the gevent hub."""

    def __init__(self) -> None:
        self._gevent = gevent_active()
        if self._gevent:
            from gevent import monkey

            # Not threading.RLock: patched, it builds a Python RLock on a gevent lock,
            # which deadlocks threadpool threads waiting on each other.
            self._lock: Any = monkey.get_original("_thread", "RLock")()
            self._ident: Callable[[], int] = monkey.get_original("_thread", "get_ident")
        else:
            self._lock = threading.RLock()
            self._ident = threading.get_ident
        self._owner: int | None = None
        """The OS thread running work under the lock (None: nobody)."""

    def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` under the lock; off the hub when gevent is active and this
        thread runs one. Work that calls back into the runner (a store method inside
        another's transaction) runs inline on the thread already holding the lock: handed
        to another pool thread, it would wait for that lock forever (a gevent primitive
        used on a pool thread, such as a patched ``Event.wait`` in a store subclass, gives
        that thread a hub of its own)."""
        if self._gevent and self._owner != self._ident():
            from gevent._hub_local import get_hub_if_exists

            hub = get_hub_if_exists()
            if hub is not None:
                # the error comes back as a value, raised here: one raised on the pool
                # thread is printed by gevent with its traceback (a busy file, a closed
                # store: errors the caller handles)
                value, error = hub.threadpool.apply(self._caught, (fn, *args))
                if error is not None:
                    raise error
                return value  # type: ignore[return-value]
        return self._locked(fn, *args)

    def _caught(self, fn: Callable[..., T], *args: Any) -> tuple[T | None, BaseException | None]:
        try:
            return self._locked(fn, *args), None
        except Exception as exc:
            return None, exc

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            outer, self._owner = self._owner, self._ident()
            try:
                return fn(*args)
            finally:
                self._owner = outer
