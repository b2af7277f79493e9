"""The lease renewer: a native OS thread that renews leases on a timer, by itself.

Renewals must not wait for anything a tool can starve. Under gevent every actor is a
greenlet of one hub, and a tool that never yields (a pure-Python loop, a C call that
blocks) stops them all; an OS thread still runs (a Python loop gives up the GIL every
switch interval, 5 ms by default; a blocking C call releases it). So the renewer is a
real OS thread (``_thread.start_new_thread`` as it was before monkey-patching), with its
own store handle (:meth:`~stores.base.ReceiptStore.renewal_handle`: SQLite opens its own
connection on this thread, Postgres its own connection), and it touches nothing
greenlet-based: its lock and its wake-up are native locks. The same design serves plain
threads.

What it shares with the heartbeat actor is a :class:`~actors.heartbeat.actor.LeaseSet` under a
native lock (held for bookkeeping only, never across a store call). What it learns it
reports through ``report(message)``: :class:`LeasesRefused` (a renewal found leases gone)
and :class:`RenewalFailed` (a renewal raised; retried a quarter interval later, well
before the lease lapses). Under gevent ``report`` must be safe to call from a foreign
thread (see :func:`hub_caller`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs

from actors.heartbeat.lease_set import LeaseSet
from actors.messages import RegisterLeases
from actors.runtime.futures import bounded
from stores.base import ReceiptStore

__all__ = ["LeasesRefused", "RenewalFailed", "Renewer", "hub_caller", "native"]

_IDLE_WAIT_S = 60.0
"""Longest the thread sleeps with nothing due (a registration wakes it at once)."""


def native(module: str, name: str) -> Any:
    """``module.name`` as it was before gevent monkey-patched it (itself when unpatched)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original(module, name)
    return getattr(sys.modules.get(module) or __import__(module), name)


def hub_caller() -> Callable[..., object]:
    """``call(fn, *args)``: run ``fn(*args)`` where the actors live.

    Under gevent, on the hub of the calling thread (captured now), from any OS thread
    (``loop.run_callback_threadsafe``: gevent's objects are not to be touched from another
    thread); on plain threads, at once on the calling thread.
    """
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return lambda fn, *args: fn(*args)
    import gevent

    loop = gevent.get_hub().loop
    call: Callable[..., object] = loop.run_callback_threadsafe
    return call


@attrs.frozen
class LeasesRefused:
    """A renewal was refused by fencing for these keys: their leases are lost."""

    reg: RegisterLeases
    """The registration they belonged to."""
    keys: tuple[str, ...]
    """The receipt keys, sorted."""


@attrs.frozen
class RenewalFailed:
    """A renewal raised (a store hiccup); it is retried soon."""

    count: int
    """How many leases it carried."""
    error: BaseException
    """What it raised."""


class _Wake:
    """A one-bit wake-up on a native lock: :meth:`set` from any thread, :meth:`wait` on one."""

    def __init__(self) -> None:
        self._lock = native("_thread", "allocate_lock")()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # already set
            self._lock.release()

    def wait(self, timeout_s: float) -> None:
        if self._lock.acquire(timeout=max(0.0, min(timeout_s, _IDLE_WAIT_S))):
            return  # consumed the wake-up: the lock is held again


class Renewer:
    """Renews the leases of a :class:`LeaseSet` on its own OS thread.

    Args:
        store: the system's store; the thread renews through ``store.renewal_handle()``
            (opened on the thread, closed when it ends), with ``renew_leases``: the same
            fenced write as ever.
        interval_for: ``interval_for(lease_ttl_s) -> seconds`` between renewals.
        report: ``report(message)`` with a :class:`LeasesRefused` or :class:`RenewalFailed`,
            called on the renewer's thread (it should only hand the message on).
        clock: monotonic seconds.

    The thread starts with the first registration and ends on :meth:`stop`.
    """

    def __init__(
        self,
        store: ReceiptStore,
        interval_for: Callable[[float], float],
        report: Callable[[Any], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.leases = LeaseSet(interval_for)
        self.report = report
        self.clock = clock
        self.failures = 0
        """Renewals that raised (each retried)."""
        self._lock = native("_thread", "allocate_lock")()
        self._wake = _Wake()
        self._started = False
        self._stopped = False
        self._wake_at = 0.0
        """When the thread will look at the lease set next (monotonic seconds)."""
        self._done = native("_thread", "allocate_lock")()

    # -- called from the heartbeat actor ------------------------------------------------

    def register(self, reg: RegisterLeases) -> None:
        """Start renewing ``reg.leases`` (first renewal one interval from now)."""
        with self._lock:
            if self._stopped:
                return
            now = self.clock()
            self.leases.register(reg, now)
            if not self._started:
                self._started = True
                self._done.acquire()
                native("_thread", "start_new_thread")(self._run, ())
            due_at = min(now + self.leases.interval_for(reg.lease_ttl_s), reg.deadline)
            wake = due_at < self._wake_at
            if wake:  # sooner than the thread means to look: wake it to plan again
                self._wake_at = due_at
        if wake:
            self._wake.set()

    def unregister(self, token: int, keys: tuple[str, ...] | None = None) -> None:
        """Stop renewing a registration, or only ``keys`` of any (see :meth:`LeaseSet.unregister`)."""
        with self._lock:
            self.leases.unregister(token, keys)

    def stop(self, timeout_s: float = 5.0) -> bool:
        """End the thread (a renewal in flight finishes first); True once it has ended."""
        with self._lock:
            self._stopped = True
            self.leases.entries.clear()
            self.leases.token_of.clear()
            started = self._started
        self._wake.set()
        if not started:
            return True
        if self._done.acquire(timeout=timeout_s):
            self._done.release()
            return True
        return False

    @property
    def running(self) -> bool:
        """True while the thread lives."""
        return bool(self._started and self._done.locked())

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        handle: ReceiptStore | None = None
        try:
            while True:
                with self._lock:
                    if self._stopped:
                        return
                    now = self.clock()
                    due = self.leases.due(now)
                if due and handle is None:
                    try:
                        handle = self.store.renewal_handle()
                    except Exception as exc:  # cannot open one now: retried like a renewal
                        self._failed(due, exc, now)
                        due = []
                for renewal in due:
                    if handle is not None:
                        self._renew(handle, renewal, now)
                with self._lock:
                    now = self.clock()
                    at = self.leases.next_tick(now)
                    self._wake_at = now + _IDLE_WAIT_S if at is None else at
                self._wake.wait(bounded(self._wake_at - now))  # register() and stop() wake it sooner
        finally:
            if handle is not None and handle is not self.store:
                with contextlib.suppress(Exception):
                    handle.close()
            self._done.release()

    def _renew(self, handle: ReceiptStore, renewal: Any, now: float) -> None:
        try:
            report = handle.renew_leases(
                renewal.org_id, list(renewal.leases), renewal.owner, lease_ttl_s=renewal.lease_ttl_s
            )
        except Exception as exc:  # a store hiccup: retried well before the lease lapses
            self._failed([renewal], exc, now)
            return
        keys = set(report.refused)
        with self._lock:
            self.leases.renewals += 1
            reg = self.leases.refused(renewal.token, keys)
        if reg is not None:
            self._report(LeasesRefused(reg, tuple(sorted(keys))))

    def _failed(self, renewals: list[Any], exc: Exception, now: float) -> None:
        with self._lock:
            for renewal in renewals:
                self.failures += 1
                self.leases.retry_soon(renewal.token, now)
        for renewal in renewals:
            self._report(RenewalFailed(len(renewal.leases), exc))

    def _report(self, message: Any) -> None:
        with contextlib.suppress(Exception):  # the actor or its hub is gone: nobody to tell
            self.report(message)
