"""The receipt store actor: the owner of the store inside a dispatch system.

It serialises every store operation on its own thread, a greenlet under gevent (the
SQLite store then runs the work on gevent's threadpool, so the hub never blocks). Lease
renewals are the exception: the heartbeat's renewer thread makes them on a store handle
of its own (see :mod:`actors.heartbeat.renewer`), so a tool starving the hub cannot stop them.
Callers use its typed proxy: each method returns a pykka future. It never waits on
another actor, so any actor may wait on its futures. It also keeps the keys tool queue
actors wait on for other owners (:class:`~actors.messages.WatchReceipts`), and when the
store has a change feed, a :class:`~actors.store.watch.ReceiptWatch` tells them of
changes.
"""

from __future__ import annotations

import inspect
import queue
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pykka

from actors.errors import CallCancelledError
from actors.messages import StoreCall, WatchReceipts
from actors.runtime.actor import InboxActor, log
from actors.runtime.inbox import answer_left, left_in
from actors.store.merge import Merged, answer, mergeable
from actors.store.watch import ReceiptWatch
from stores.base import ReceiptStore
from stores.types import (
    Claim,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FenceReport,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
)

__all__ = ["ReceiptStoreActor", "ReceiptStoreProxy"]


class ReceiptStoreActor(InboxActor):
    """Wraps a :class:`~stores.ReceiptStore`; same methods, same errors.

    Counts every operation (``ops``) so the governor's receipt budget and the stats
    can see them.
    """

    def __init__(self, store: ReceiptStore, max_ops: int | None = None) -> None:
        super().__init__()
        self.store = store
        self.ops = 0
        self.max_ops = max_ops
        """The ``receipt_ops`` budget (Policy.max_receipt_ops): every operation is charged;
        once spent, new claims are refused with BudgetExceededError. Writes that settle
        work already claimed (complete, fail, release, renew) always go: a paid result is
        never dropped for a budget."""
        lanes = getattr(store, "parallel_calls", 1)
        self.lanes: Lanes | None = Lanes(store, lanes) if lanes > 1 else None
        """Calls run side by side (a store with ``parallel_calls`` > 1: Postgres)."""
        self.watch: ReceiptWatch | None = None
        """Started by the first :class:`WatchReceipts` when the store has a change feed."""
        self._feedless = False
        self._takes_running = _takes_running(store)
        self._together = getattr(store, "write_together", None) if self.lanes is None else None
        """Group commit (SQLite): fenced writes waiting together run as one transaction."""

    def on_stop(self) -> None:
        """Requests left unread are answered (the lifecycle waits on each), never dropped."""
        if self.watch is not None:
            self.watch.close()
        if self.lanes is not None:
            self.lanes.close()
        answer_left(left_in(self.actor_inbox), CallCancelledError("the receipt store stopped"))

    def _watched(self, message: WatchReceipts) -> None:
        if self.watch is None:
            if self._feedless or not message.watch:
                return
            feed = None
            make = getattr(self.store, "change_feed", None)  # a store of another make may lack it
            try:
                feed = make() if make is not None else None
            except Exception:  # no feed: waiters poll, as they do without one
                log.exception("the store's change feed did not start")
            if feed is None:
                self._feedless = True
                return
            self.watch = ReceiptWatch(feed)
        if message.watch:
            self.watch.watch(message.org_id, message.keys, message.ref)
        else:
            self.watch.unwatch(message.org_id, message.keys, message.ref)

    def on_receive(self, message: Any) -> Any:
        """Run a :class:`~actors.messages.StoreCall`; its reply gets the result or the error.

        The reply is usually an :class:`~actors.runtime.actor.Reply`, so the answer reaches
        the requesting actor as a message: nobody waits on this actor.
        """
        if isinstance(message, WatchReceipts):
            self._watched(message)
            return None
        if isinstance(message, StoreCall):
            if message.method == "claim_many" and self.max_ops is not None and self.ops >= self.max_ops:
                from actors.errors import BudgetExceededError

                exc = BudgetExceededError(f"receipt_ops budget of {self.max_ops} is spent")
                message.reply.set_exception((type(exc), exc, None))
                return None
            self.ops += 1
            kwargs = message.kwargs
            if "running" in kwargs and not (kwargs["running"] and self._takes_running):
                kwargs = {k: v for k, v in kwargs.items() if k != "running"}  # see claim_many
            if self.lanes is not None:
                self.lanes.run(message, kwargs)
                return None
            if self._together is not None and mergeable(message) and not self.actor_inbox.empty():
                self._write_together(message, kwargs)
                return None
            _perform(self.store, message, kwargs)
        return None

    def _write_together(self, first: StoreCall, kwargs: dict[str, Any]) -> None:
        """``first`` and the fenced writes waiting behind it, in one transaction (see
        :mod:`stores.sqlite.together`); the first other message taken is handled after them,
        as it would have been (the inbox keeps its order)."""
        together = self._together
        assert together is not None
        calls = [(first, kwargs)]
        after = None
        inbox: Any = self.actor_inbox  # a SimpleQueue (InboxActor)
        while len(calls) < _TOGETHER_MAX:
            try:
                envelope = inbox.get_nowait()
            except queue.Empty:
                break
            message = envelope.message
            if envelope.reply_to is None and mergeable(message):
                self.ops += 1
                calls.append((message, message.kwargs))
            else:
                after = envelope
                break
        # not merged by kind (as the lanes do): in a savepoint of its own, one request's
        # error stays its own
        try:
            outcomes = together([(m.method, m.args, kw) for m, kw in calls])
        except Exception as exc:  # a store that failed the whole call: each is answered
            outcomes = [(None, exc)] * len(calls)
        for (message, _), (value, error) in zip(calls, outcomes, strict=True):
            answer(message, value, error)
        if after is not None:
            self._handle_taken(after)

    def _handle_taken(self, envelope: Any) -> None:
        """Handle an envelope taken from the inbox as pykka's actor loop would."""
        try:
            response = self._handle_receive(envelope.message)
        except Exception:
            if envelope.reply_to is None:
                raise
            envelope.reply_to.set_exception()
            return
        if envelope.reply_to is not None:
            envelope.reply_to.set(response)

    def claim_many(
        self,
        org_id: str,
        requests: Sequence[ClaimRequest],
        owner: Owner,
        *,
        lease_ttl_s: float,
        mode: ClaimMode = ClaimMode.NORMAL,
        stale_after_s: float | None = None,
        running: Collection[str] = frozenset(),
    ) -> list[Claim]:
        self.ops += 1
        if not running or not self._takes_running:  # a store written before claims
            # into running keeps working: its claims stay queued and are marked
            return self.store.claim_many(
                org_id, requests, owner, lease_ttl_s=lease_ttl_s, mode=mode, stale_after_s=stale_after_s
            )
        return self.store.claim_many(
            org_id, requests, owner, lease_ttl_s=lease_ttl_s, mode=mode, stale_after_s=stale_after_s,
            running=running,
        )  # fmt: skip

    def mark_running_many(
        self, org_id: str, leases: Sequence[LeaseRef], owner: Owner, *, lease_ttl_s: float | None = None
    ) -> FenceReport:
        self.ops += 1
        return self.store.mark_running_many(org_id, leases, owner, lease_ttl_s=lease_ttl_s)

    def complete_many(self, org_id: str, completions: Sequence[Completion], owner: Owner) -> FenceReport:
        self.ops += 1
        return self.store.complete_many(org_id, completions, owner)

    def fail_many(self, org_id: str, failures: Sequence[Failure], owner: Owner) -> FenceReport:
        self.ops += 1
        return self.store.fail_many(org_id, failures, owner)

    def release(self, org_id: str, leases: Sequence[LeaseRef], owner: Owner) -> FenceReport:
        self.ops += 1
        return self.store.release(org_id, leases, owner)

    def get_many(self, org_id: str, keys: Sequence[str]) -> list[Receipt | None]:
        self.ops += 1
        return self.store.get_many(org_id, keys)

    def purge(
        self,
        *,
        older_than_s: float = 0.0,
        statuses: Iterable[ReceiptStatus] | None = None,
        org_id: str | None = None,
    ) -> int:
        self.ops += 1
        return self.store.purge(older_than_s=older_than_s, statuses=statuses, org_id=org_id)


if TYPE_CHECKING:
    from pykka.typing import ActorMemberMixin, proxy_method

    class ReceiptStoreProxy(ActorMemberMixin, pykka.ActorProxy[ReceiptStoreActor]):
        """Typed proxy of :class:`ReceiptStoreActor`: each method returns a future."""

        claim_many = proxy_method(ReceiptStoreActor.claim_many)
        mark_running_many = proxy_method(ReceiptStoreActor.mark_running_many)
        complete_many = proxy_method(ReceiptStoreActor.complete_many)
        fail_many = proxy_method(ReceiptStoreActor.fail_many)
        release = proxy_method(ReceiptStoreActor.release)
        get_many = proxy_method(ReceiptStoreActor.get_many)
        purge = proxy_method(ReceiptStoreActor.purge)
else:
    ReceiptStoreProxy = Any


def _takes_running(store: ReceiptStore) -> bool:
    """``store.claim_many`` takes ``running`` (by name, or through ``**kwargs``)."""
    try:
        params = inspect.signature(store.claim_many).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "running" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _perform(store: ReceiptStore, message: StoreCall, kwargs: dict[str, Any]) -> None:
    try:
        value = getattr(store, message.method)(*message.args, **kwargs)
    except Exception as exc:
        message.reply.set_exception((type(exc), exc, exc.__traceback__))
    else:
        message.reply.set(value)


def _perform_merged(store: ReceiptStore, merged: Merged) -> None:
    try:
        value = getattr(store, merged.method)(*merged.args, **merged.kwargs)
    except Exception as exc:
        merged.answer(None, exc)
    else:
        merged.answer(value, None)


class Lanes:
    """``n`` threads (greenlets under gevent) running store calls side by side, for a
    store whose every call is its own transaction on a pooled connection (Postgres):
    the calls of one lifecycle are causally ordered already (a group has one store call
    out at a time), so only unrelated calls overlap. SQLite has one writer: no lanes."""

    def __init__(self, store: ReceiptStore, n: int) -> None:
        self.store = store
        self.inbox: queue.SimpleQueue[tuple[StoreCall, dict[str, Any]] | None] = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._loop, name=f"tooldispatch-store-lane-{i}", daemon=True)
            for i in range(n)
        ]
        for thread in self.threads:
            thread.start()

    def run(self, message: StoreCall, kwargs: dict[str, Any]) -> None:
        self.inbox.put((message, kwargs))

    def _loop(self) -> None:
        while (task := self.inbox.get()) is not None:
            try:
                if not self._run_merged(task):
                    return
            except Exception:  # a lane never dies: the next call still finds it
                log.exception("a receipt store lane failed on %s", task[0].method)

    def _run_merged(self, task: tuple[StoreCall, dict[str, Any]]) -> bool:
        """Run ``task``, with the fenced writes waiting behind it that merge with it (one
        statement); the first that does not runs next, on this lane (the other lanes go
        on meanwhile). Returns False when this lane took its stop."""
        if not mergeable(task[0]):
            _perform(self.store, *task)
            return True
        merged, after, going = Merged(*task), None, True
        while True:
            try:
                more = self.inbox.get_nowait()
            except queue.Empty:
                break
            if more is None:  # a stop meant for one lane: this one, once its call is done
                going = False
                break
            if not merged.takes(*more):
                after = more
                break
        _perform_merged(self.store, merged)
        if after is not None:
            _perform(self.store, *after)
        return going

    def close(self) -> None:
        """Calls already taken finish (their callers are answered; waited for up to
        10 s); the rest are refused."""
        left: list[StoreCall] = []
        while True:
            try:
                task = self.inbox.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                left.append(task[0])
        for _ in self.threads:
            self.inbox.put(None)
        answer_left(left, CallCancelledError("the receipt store stopped"))
        end = time.monotonic() + _CLOSE_WAIT_S  # as a serial store finishes its call at stop
        for thread in self.threads:
            thread.join(max(0.0, end - time.monotonic()))


_TOGETHER_MAX = 64
"""Most fenced writes in one group-committed transaction."""

_CLOSE_WAIT_S = 10.0
"""Longest a stopping store waits for the calls its lanes already took."""
