"""The receipt store actor: the owner of the store inside a dispatch system.

It serialises every store operation on its own thread, a greenlet under gevent (the
SQLite store then runs the work on gevent's threadpool, so the hub never blocks). Lease
renewals are the exception: the heartbeat's renewer thread makes them on a store handle
of its own (see :mod:`actors.heartbeat.renewer`), so a tool starving the hub cannot stop
them. Callers tell it the store commands of :mod:`actors.messages` (``ClaimReceipts``,
``MarkRunning``, ``CompleteReceipts`` ...), each carrying its reply; it dispatches them by
type (:data:`PERFORM`). It never waits on another actor, so any actor may wait on its
replies (the flusher does, through :class:`~actors.store.client.StoreClient`). It also
keeps the keys tool queue actors wait on for other owners
(:class:`~actors.messages.WatchReceipts`), and when the store has a change feed, a
:class:`~actors.store.watch.ReceiptWatch` tells them of changes. A command that meets an
outage of the store is tried again until its ``retry_until`` before its caller hears back
(:mod:`actors.store.outage`). A claim of a key the salvage file holds a paid output for
replays that file first (:mod:`actors.store.salvaged`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from actors.errors import BudgetExceededError, CallCancelledError
from actors.messages import (
    ClaimReceipts,
    CompleteReceipts,
    FencedWrite,
    MarkRunning,
    ReadPurgeEpoch,
    ReadReceipts,
    RecordFailures,
    RecordUncertain,
    ReleaseReceipts,
    ResolveReceipt,
    WatchReceipts,
)
from actors.runtime.actor import InboxActor, log
from actors.runtime.inbox import TakeBackInbox, answer_left, left_in
from actors.stats import Outages
from actors.store.merge import Merged, answer, mergeable
from actors.store.outage import StoreRetries
from actors.store.salvaged import SalvageFile, SalvageFirst
from actors.store.watch import ReceiptWatch
from stores.base import ReceiptStore

__all__ = ["Lanes", "ReceiptStoreActor"]


class ReceiptStoreActor(InboxActor):
    """Runs the store commands of :mod:`actors.messages` (``ClaimReceipts`` ...) on a
    :class:`~stores.ReceiptStore`; each command's ``reply`` gets the store's value or
    error. How it runs them follows ``store.capabilities``: side by side on lanes
    (``parallel_calls`` > 1), fenced writes waiting together in one transaction
    (``group_commit``), else one at a time.

    Counts every operation (``ops``) so the governor's receipt budget and the stats
    can see them.

    Args:
        store: the receipt store.
        max_ops: the ``receipt_ops`` budget (None: unlimited).
        outages: where outages of the store are counted (default: a record of its own).
        timers: runs the next attempt of a command that met an outage (None: no command
            is tried again; each is answered with its error).
        stopping: set once the dispatcher stops: nothing is tried again from then on.
        salvage: the salvage file replayed before a claim of a key it holds
            (:mod:`actors.store.salvaged`); None: claims never look at one.
    """

    def __init__(
        self,
        store: ReceiptStore,
        max_ops: int | None = None,
        *,
        outages: Outages | None = None,
        timers: Any = None,
        stopping: threading.Event | None = None,
        salvage: SalvageFile | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.salvage_first = SalvageFirst(salvage, store) if salvage is not None else None
        """Replays the salvage file before a claim of a key it holds a paid output for."""
        # a command's next attempt comes back through this actor's own inbox (from the
        # timer thread), as any command: it talks to no other actor
        resend = self.actor_ref.tell
        self.retries = StoreRetries(
            repr(store), outages if outages is not None else Outages(), resend, timers, stopping
        )
        """Commands that met an outage of the store, tried again (:mod:`actors.store.outage`)."""
        self.ops = 0
        self.max_ops = max_ops
        """The ``receipt_ops`` budget (Policy.max_receipt_ops): every operation is charged;
        once spent, new claims are refused with BudgetExceededError. Writes that settle
        work already claimed (complete, fail, release, renew) always go: a paid result is
        never dropped for a budget."""
        capabilities = store.capabilities
        lanes = capabilities.parallel_calls
        self.lanes: Lanes | None = Lanes(store, lanes, self.retries) if lanes > 1 else None
        """Calls run side by side (a store with ``parallel_calls`` > 1: Postgres)."""
        self.watch: ReceiptWatch | None = None
        """Started by the first :class:`WatchReceipts` when the store has a change feed."""
        self._feedless = False
        self._claims_into_running = capabilities.claims_into_running
        self._batch_records = capabilities.batch_records
        self._together = capabilities.group_commit and self.lanes is None
        """Group commit (SQLite): fenced writes waiting together run as one transaction."""

    @staticmethod
    def new_inbox() -> TakeBackInbox:
        """An inbox a group commit can put the first other message back into."""
        return TakeBackInbox()

    def on_stop(self) -> None:
        """Requests left unread, or waiting to be tried again, are answered (the lifecycle
        waits on each), never dropped."""
        if self.watch is not None:
            self.watch.close()
        if self.lanes is not None:
            self.lanes.close()
        self.retries.give_up()
        answer_left(left_in(self.actor_inbox), CallCancelledError("the receipt store stopped"))

    def _watched(self, message: WatchReceipts) -> None:
        if self.watch is None:
            if self._feedless or not message.watch:
                return
            feed = None
            try:
                feed = self.store.change_feed()
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
        """Run a store command; its reply gets the result or the error.

        The reply is usually an :class:`~actors.runtime.actor.Reply`, so the answer reaches
        the requesting actor as a message: nobody waits on this actor.
        """
        if isinstance(message, WatchReceipts):
            self._watched(message)
            return None
        if type(message) not in PERFORM:
            return None
        if type(message) is ClaimReceipts:
            if self.max_ops is not None and self.ops >= self.max_ops and not self.retries.retrying(message):
                exc = BudgetExceededError(f"receipt_ops budget of {self.max_ops} is spent")
                message.reply.set_exception((type(exc), exc, None))
                return None
            if self.salvage_first is not None and not self._salvaged_first(message):
                return None
            if message.running and not self._claims_into_running:
                # a store that cannot: its claims stay queued and are marked running after
                message = attrs.evolve(message, running=frozenset())
        elif type(message) is MarkRunning and message.batches and not self._batch_records:
            message = attrs.evolve(message, batches=())  # a store that keeps no batch records
        self.ops += 1
        if self.lanes is not None:
            self.lanes.run(message)
            return None
        if self._together and mergeable(message) and not self.actor_inbox.empty():
            self._write_together(message)
            return None
        perform_one(self.store, message, self.retries)
        return None

    def _salvaged_first(self, claim: ClaimReceipts) -> bool:
        """Replay the salvage file if it holds a key of ``claim``; False when the replay
        failed (the claim is then held for another attempt, or answered with the error)."""
        assert self.salvage_first is not None
        started = time.monotonic()
        try:
            self.salvage_first.before(claim)
        except Exception as exc:
            error = self.retries.failed(claim, exc, started)
            if error is not None:
                claim.reply.set_exception((type(error), error, error.__traceback__))
            return False
        return True

    def _write_together(self, first: FencedWrite) -> None:
        """``first`` and the fenced writes waiting behind it, in one transaction (see
        ``SqliteReceiptStore.write_together``); the first other message taken is put back,
        to be handled next (the inbox keeps its order)."""
        calls = [first]
        inbox: TakeBackInbox = self.actor_inbox  # type: ignore[assignment]  # new_inbox()
        while len(calls) < _TOGETHER_MAX:
            try:
                envelope = inbox.get_nowait()
            except queue.Empty:
                break
            message = envelope.message
            if envelope.reply_to is None and mergeable(message):
                self.ops += 1
                calls.append(message)
            else:
                inbox.put_back(envelope)
                break
        # not merged by kind (as the lanes do): in a savepoint of its own, one request's
        # error stays its own
        started = time.monotonic()
        together = []
        for m in calls:  # each bounded write says its wait (the transaction takes the longest)
            method, args, kwargs = m.store_call()
            together.append((method, args, {**kwargs, **_waits(self.store, m)}))
        try:
            outcomes = self.store.write_together(together)
        except Exception as exc:  # a store that failed the whole call: each is answered
            outcomes = [(None, exc)] * len(calls)
        for message, (value, error) in zip(calls, outcomes, strict=True):
            if error is None:
                self.retries.answered(message)
            elif (error := self.retries.failed(message, error, started)) is None:
                continue  # held: tried again after a back-off
            answer(message, value, error)


LOCK_SLICE_S = 0.5
"""The longest one attempt of a claim, a running mark or a release waits for another
connection's lock, seconds: a lock held longer is ridden out by attempts
(:mod:`actors.store.outage`), so that the store's one writer (SQLite) is free between
them for the other commands, each answered by its own deadline."""


_BOUNDED = (ClaimReceipts, MarkRunning, ReleaseReceipts)
"""The commands sent before anything is paid (or after nothing was): their lock waits are
bounded by their deadlines."""


def _wait_s(store: ReceiptStore, m: Any) -> float | None:
    """The lock wait of command ``m``'s attempt, seconds: at most :data:`LOCK_SLICE_S`, and
    no more than is left of its ``retry_until`` when it has one (one without is answered
    at once: a release's cleanup has its own ladder); None for a write of paid outcomes
    (it waits the store's own bound) or a store without ``capabilities.bounded_waits``."""
    capabilities = getattr(store, "capabilities", None)
    if type(m) not in _BOUNDED or capabilities is None or not capabilities.bounded_waits:
        return None
    until = float(m.retry_until)
    if not until:
        return LOCK_SLICE_S
    return min(LOCK_SLICE_S, max(0.0, until - time.monotonic()))


def _waits(store: ReceiptStore, m: Any) -> dict[str, Any]:
    """``{"wait_s": ...}`` (:func:`_wait_s`), or {} when it is None."""
    wait = _wait_s(store, m)
    return {} if wait is None else {"wait_s": wait}


def _claim(store: ReceiptStore, m: ClaimReceipts) -> Any:
    """The claim, its lock waits bounded (:func:`_waits`; a lock held past them is
    answered as an outage: :mod:`actors.store.outage`)."""
    extra: dict[str, Any] = _waits(store, m)
    if m.running:
        extra["running"] = m.running
    return store.claim_many(
        m.org_id, m.requests, m.owner, lease_ttl_s=m.lease_ttl_s, mode=m.mode, stale_after_s=m.stale_after_s,
        **extra,
    )  # fmt: skip


PERFORM: dict[type, Callable[[ReceiptStore, Any], Any]] = {
    ClaimReceipts: _claim,
    MarkRunning: lambda store, m: store.mark_running_many(
        m.org_id, m.leases, m.owner, **m.extra(), **_waits(store, m)
    ),
    CompleteReceipts: lambda store, m: store.complete_many(m.org_id, m.completions, m.owner),
    RecordFailures: lambda store, m: store.fail_many(m.org_id, m.failures, m.owner),
    RecordUncertain: lambda store, m: store.mark_uncertain_many(m.org_id, m.failures, m.owner),
    ReleaseReceipts: lambda store, m: store.release(m.org_id, m.leases, m.owner, **_waits(store, m)),
    ReadReceipts: lambda store, m: store.get_many(m.org_id, m.keys),
    ResolveReceipt: lambda store, m: store.resolve(m.org_id, m.key, m.action, output=m.output, note=m.note),
    ReadPurgeEpoch: lambda store, m: store.purge_epoch(),
}
"""Store command type -> how it runs on the store (returns the store's value)."""


def perform_one(store: ReceiptStore, message: Any, retries: StoreRetries | None = None) -> None:
    """Run one store command; its reply gets the value or the error (unless ``retries``
    holds it for another attempt: the store is away)."""
    started = time.monotonic()
    try:
        value = PERFORM[type(message)](store, message)
    except Exception as exc:
        error = exc if retries is None else retries.failed(message, exc, started)
        if error is not None:
            message.reply.set_exception((type(error), error, error.__traceback__))
    else:
        if retries is not None:
            retries.answered(message)
        message.reply.set(value)


def _perform_merged(store: ReceiptStore, merged: Merged, retries: StoreRetries | None) -> None:
    started = time.monotonic()
    try:
        value = PERFORM[type(merged.first)](store, merged.command())
    except Exception as exc:
        if retries is None:
            merged.answer(None, exc)
            return
        for call in merged.calls:  # each by its own deadline (held, or answered)
            error = retries.failed(call, exc, started)
            if error is not None:
                answer(call, None, error)
    else:
        if retries is not None:
            for call in merged.calls:
                retries.answered(call)
        merged.answer(value, None)


class Lanes:
    """``n`` threads (greenlets under gevent) running store calls side by side, for a
    store whose every call is its own transaction on a pooled connection (Postgres):
    the calls of one lifecycle are causally ordered already (a group has one store call
    out at a time), so only unrelated calls overlap. SQLite has one writer: no lanes."""

    def __init__(self, store: ReceiptStore, n: int, retries: StoreRetries | None = None) -> None:
        self.store = store
        self.retries = retries
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        """Store commands waiting for a lane (None: a lane's stop)."""
        self.threads = [
            threading.Thread(target=self._loop, name=f"tooldispatch-store-lane-{i}", daemon=True)
            for i in range(n)
        ]
        for thread in self.threads:
            thread.start()

    def run(self, message: Any) -> None:
        """Queue a store command for the first free lane (any thread)."""
        self.inbox.put(message)

    def _loop(self) -> None:
        while (task := self.inbox.get()) is not None:
            try:
                if not self.run_merged(task):
                    return
            except Exception:  # a lane never dies: the next call still finds it
                log.exception("a receipt store lane failed on %s", type(task).__name__)

    def run_merged(self, task: Any) -> bool:
        """Run the store command ``task`` (on the calling lane), with the fenced writes
        waiting behind it that merge with it (one statement); the first that does not
        runs next, on this lane (the other lanes go on meanwhile). Returns False when
        this lane took its stop."""
        if not mergeable(task):
            perform_one(self.store, task, self.retries)
            return True
        merged, after, going = Merged(task), None, True
        while True:
            try:
                more = self.inbox.get_nowait()
            except queue.Empty:
                break
            if more is None:  # a stop meant for one lane: this one, once its call is done
                going = False
                break
            if not merged.takes(more):
                after = more
                break
        _perform_merged(self.store, merged, self.retries)
        if after is not None:
            perform_one(self.store, after, self.retries)
        return going

    def close(self) -> None:
        """Calls already taken finish (their callers are answered; waited for up to
        10 s); the rest are refused."""
        left: list[Any] = []
        while True:
            try:
                task = self.inbox.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                left.append(task)
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
