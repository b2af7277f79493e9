"""One actor per tool: the batch grace window, dedupe, the memo, and the call lifecycle.

:class:`ToolQueue` is the plain queue state machine (calls in, decisions out, time
passed in); :class:`~actors.lifecycle.machine.Lifecycle` is the plain state machine of every
group past the queue. :class:`ToolQueueActor` feeds both with messages and performs
their effects, each as a message to another actor or a task on the worker pool: it
never waits on anyone.

Rules (docs/how-it-works.md, The life of a call): a tool without a batch strategy drains at once;
a batchable tool drains when ``max_batch_size`` unique calls are queued, otherwise
``batch_grace_s`` after the first queued call. Calls with the same receipt key share
one execution: same drain -> followers; while the key is in flight -> attached (both
``in_flight``). A forced refresh or a retry of a failure never takes a normal call's
execution.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from typing import Any

from actors.errors import CallCancelledError, ReceiptWaitTimeoutError
from actors.lifecycle.calls import Call, Group, GroupState, Role, mode_covers
from actors.lifecycle.cleanup import owner_here
from actors.messages import (
    DrainDue,
    ForgetMemo,
    RememberOutputs,
    StopQueue,
    SubmitCalls,
    UnitFinished,
    WaitDue,
)
from actors.queue.memo import Memo, held_bytes
from actors.results import ToolResult
from actors.runtime.actor import InboxActor, guarded
from actors.runtime.futures import fail
from actors.runtime.gathering import Gathering
from actors.runtime.inbox import answer_left, left_in
from actors.tool import Tool
from stores.codec import decode_output
from stores.types import ClaimMode

__all__ = ["Memo", "Submitted", "ToolQueue", "ToolQueueActor", "held_bytes"]


HELD = -2
"""DrainDue generation: drain what waited behind a key that just settled."""


class Submitted(enum.Enum):
    """What the queue decided for a submitted call."""

    QUEUED = "queued"
    """Waits in the grace window (already armed)."""
    ARM = "arm"
    """First call of a window: arm the grace timer."""
    DRAIN_NOW = "drain_now"
    """Drain as soon as the calls already sent are queued."""
    FOLLOWER = "follower"
    """Same key as a queued call: shares its execution."""
    ATTACHED = "attached"
    """Same key as an in-flight group: takes its result."""
    MEMO = "memo"
    """This system completed the key already: resolve at once from memory."""


class ToolQueue:
    """The queue state machine of one tool.

    Args:
        tool: the tool (its batch strategy decides the draining rule).
        batch_grace_s: the grace window, seconds.
        inflight: receipt key -> group past the queue (the lifecycle's map).
        memo: the tool's memo (None or a non-durable tool: none).
    """

    def __init__(
        self,
        tool: Tool,
        batch_grace_s: float,
        inflight: dict[str, Group] | None = None,
        memo: Memo | None = None,
    ) -> None:
        self.tool = tool
        self.batch_grace_s = batch_grace_s
        self.memo = memo if memo is not None and tool.durable else Memo(0)
        self.recalled: str | None = None
        """The output text :meth:`submit` found in the memo for the call it answered MEMO."""
        self.recalled_value: Any = None
        """That text decoded (each call its own copy)."""
        self.queued: dict[str, Group] = {}
        self.inflight: dict[str, Group] = inflight if inflight is not None else {}
        self.window_opened_at: float | None = None
        self.generation = 0

    def submit(self, call: Call) -> Submitted:
        """Queue ``call``; the decision says what the actor must do."""
        key = call.key
        if self.memo.max_bytes and call.mode is ClaimMode.NORMAL:
            self.recalled = self.memo.recall(key, call.stale_after_s, call.submitted_at)
            if self.recalled is not None:
                try:
                    self.recalled_value = decode_output(self.recalled)
                except Exception:  # (a text read ahead, changed by hand): its claim says so, for it alone
                    self.memo.forget(key)
                else:
                    return Submitted.MEMO
        running = self.inflight.get(key)
        if (
            running is not None
            and mode_covers(running.mode, call.mode)
            and not running.lease_lost
            and running.state is not GroupState.RELEASING
        ):
            running.join(call, Role.ATTACHED)
            return Submitted.ATTACHED
        queued = self.queued.get(key)
        if queued is not None:
            queued.join(call, Role.FOLLOWER)
            return Submitted.FOLLOWER
        self.queued[key] = Group.of(call)
        batch = self.tool.batch
        if batch is None or len(self.queued) >= batch.max_batch_size:
            return Submitted.DRAIN_NOW
        if self.window_opened_at is None:
            self.window_opened_at = call.submitted_at
            self.generation += 1
            return Submitted.ARM
        return Submitted.QUEUED

    def grace_deadline(self) -> float:
        """When the open window ends (monotonic seconds)."""
        assert self.window_opened_at is not None
        return self.window_opened_at + self.batch_grace_s

    def drain(self, generation: int | None = None, *, whole_batches: bool = False) -> list[Group]:
        """Take what is queued (nothing if ``generation`` names an older window).

        With ``whole_batches`` (a batchable tool that reached ``max_batch_size``), only
        whole batches are taken, so N calls over U keys make exactly ceil(U/M) batch
        calls; the rest stay queued in the open window, whose timer drains them.
        Groups whose key is still in flight (a forced refresh behind a normal call)
        stay queued until it settles.
        """
        if generation is not None and generation != self.generation:
            return []
        groups = [g for g in self.queued.values() if g.key not in self.inflight]
        held = [g for g in self.queued.values() if g.key in self.inflight]
        batch = self.tool.batch
        if whole_batches and batch is not None:
            cut = len(groups) // batch.max_batch_size * batch.max_batch_size
            groups, left = groups[:cut], groups[cut:]
            if left or held:
                self.queued = {g.key: g for g in left + held}
                return groups
        self.queued = {g.key: g for g in held}
        # held groups go when their key settles (drain_held); later calls open a new window
        self.window_opened_at = None
        self.generation += 1
        return groups

    def held_late(self, keys: tuple[str, ...], now: float) -> list[Call]:
        """Take out the calls held behind their key's execution in another mode (a forced
        refresh behind a normal call) whose own ``timeout_s`` passed while they waited."""
        late: list[Call] = []
        for key in keys:
            group = self.queued.get(key)
            if group is not None and key in self.inflight:
                late += [c for c in list(group.calls) if c.submitted_at + c.timeout_s <= now + 1e-3]
        for call in late:
            self.remove(call)
        return late

    def remove(self, call: Call) -> bool:
        """Take a cancelled call out of the window (its group goes when it is empty)."""
        group = self.queued.get(call.key)
        if group is None or call not in group.calls:
            return False
        group.calls.remove(call)
        if not group.calls:
            del self.queued[call.key]
        elif call.role is Role.OWNER:  # the next caller owns the execution (``live``)
            group.calls[0].role = Role.OWNER
        return True

    def cancel_queued(self) -> list[Call]:
        """Remove every queued call (for stop); returns them."""
        calls = [call for group in self.queued.values() for call in group.calls]
        self.queued.clear()
        self.window_opened_at = None
        self.generation += 1
        return calls


class ToolQueueActor(InboxActor):
    """Runs one tool's :class:`ToolQueue` and :class:`~actors.lifecycle.machine.Lifecycle`.

    Args:
        tool: the tool.
        ports: the :class:`~actors.queue.ports.Ports` of its dispatch system (other actors,
            the worker pool, the latch and gate snapshots, stats).
        memo: the tool's memo (the system reads it on callers' threads).
        clock: ``time.monotonic`` (a fake in tests).
    """

    def __init__(
        self, tool: Tool, ports: Any, memo: Memo | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        from actors.lifecycle.machine import Lifecycle
        from actors.queue.ports import ActorEffects

        self.ports = ports
        self.clock = clock
        self.effects = ActorEffects(self, tool, ports)
        self.lifecycle = Lifecycle(
            tool,
            ports.policy,
            ports.run.org_id,
            ports.run.scope,
            self.effects,
            ports.width(tool),
            owner_here(ports.owner),
        )
        self.queue = ToolQueue(tool, ports.policy.batch_grace_s, self.lifecycle.groups, memo)
        self.traced = getattr(ports, "telemetry", None) is not None
        """Telemetry is on: waits in the batch grace window are told to the calls' traces."""
        self.lifecycle.state.traced = self.traced
        self.lifecycle.state.clock = clock  # where waits begin: the clock of every ``now``
        self._drain_pending = False
        """A DrainDue(-1) is in the inbox."""
        self._drain_wanted = False
        self._stop_replies: list[Any] = []
        self._waiting: Gathering[Call] | None = None
        """The calls submitted and not yet taken (the front door's, known from its first ring)."""

    @property
    def memo(self) -> Memo:
        """The memo (read from callers' threads)."""
        return self.queue.memo

    @guarded
    def on_receive(self, message: Any) -> Any:
        now = self.clock()
        try:
            if isinstance(message, SubmitCalls):
                self._waiting = message.waiting
                for call in message.waiting.take():
                    self._submit(call, now)
                wanted, self._drain_wanted = self._drain_wanted, False
                if wanted and not self._drain_pending:  # (else a DrainDue in the inbox takes them)
                    if self.actor_inbox.empty():  # drain once the calls already sent are queued
                        self._drain(-1, now)  # nothing else sent: now, without a message
                    else:
                        self._drain_pending = True
                        self.actor_ref.tell(DrainDue(generation=-1))
            elif isinstance(message, DrainDue):
                self._drain(message.generation, now)
            elif isinstance(message, StopQueue):
                self._stop_queue(message, now)
            elif isinstance(message, WaitDue):
                for call in self.queue.held_late(message.keys, now):
                    self.effects.answer(call, ReceiptWaitTimeoutError(
                        f"{self.queue.tool.tool_id}: a call of the same input in another mode still runs "
                        f"after this call's timeout_s ({call.timeout_s} s); this one was not started"
                    ))  # fmt: skip
                self.effects.dispatch(message, now)
            elif isinstance(message, ForgetMemo):
                self.queue.memo.forget()
            elif isinstance(message, RememberOutputs):
                self._remember_read(message)
            else:
                self.effects.dispatch(message, now)
        finally:
            idle = self.actor_inbox.empty()
            self.lifecycle.flush(idle)
            self.effects.flush(idle)
            if self._stop_replies and self.lifecycle.idle:
                replies, self._stop_replies = self._stop_replies, []
                for reply in replies:
                    reply.set(0)
        return None

    def _remember_read(self, message: RememberOutputs) -> None:
        """Outputs read from the store, for the memo: none after a purge seen since the
        read; none of a key claimed since (a refresh: its group answers); none replacing
        what this system completed or owes (newer than the read)."""
        memo, running = self.queue.memo, self.lifecycle.groups
        if message.forgets != memo.forgets:
            return
        entries, owed, ahead_at = memo.entries, memo.owed, message.ahead_at
        for key, text, cost in message.entries:
            if key in running or key in owed:
                continue
            if ahead_at is not None:
                memo.keep_ahead(key, text, ahead_at, cost)
                continue
            held = entries.get(key)
            if held is None or held[0] == -float("inf"):  # (a store's read has no known age)
                memo.remember(key, text, -float("inf"), cost)

    def on_stop(self) -> None:
        """Calls that reached the inbox as the actor stopped are answered, never dropped
        (pykka discards told messages left in a stopped actor's inbox)."""
        kept: list[str] = []  # keys whose paid answer is salvaged: their callers are told so
        for finished, report in self.effects.finished.close():  # paid answers, never read
            kept += report.keep_late(finished)
        left = left_in(self.actor_inbox)
        waiting = [self._waiting] if self._waiting is not None else []
        for message in left:
            if isinstance(message, SubmitCalls):
                waiting.append(message.waiting)
            elif isinstance(message, UnitFinished):  # a paid answer that came in as it stopped
                kept += self.effects.keep_late(message)
            elif isinstance(message, StopQueue):
                for slot in (message.reply, message.idle):
                    if slot is not None:
                        slot.set(0)
        for calls in waiting:  # (closed: a later submit is refused at once)
            for call in calls.close():
                fail(call.future, CallCancelledError("the dispatcher stopped before the call started"))
        answer_left(left, CallCancelledError("the dispatcher stopped"))
        # stop's bound ran out before these finished (answers the other actors never sent,
        # since they stopped too): every caller still hears back
        self.lifecycle.abandon(CallCancelledError("the dispatcher stopped before the call finished"), kept)

    def _submit(self, call: Call, now: float) -> None:
        if self.lifecycle.stopping:
            fail(call.future, CallCancelledError("the dispatcher is stopped"))
            return
        if call.future.cancelled:  # gave up before its call reached the queue
            self.ports.stats.add("cancelled", tool=self.queue.tool.tool_id)
            fail(call.future, CallCancelledError("the call was cancelled"))
            return
        decision = self.queue.submit(call)
        tool_id = self.queue.tool.tool_id
        if decision is Submitted.MEMO:
            value = self.queue.recalled_value
            if self.queue.memo.take_owed(call.key):  # completed here, no caller told: this one
                call.future.set(ToolResult.of(value, "live", call.key, tool_id))
            else:
                call.future.set(ToolResult.of(value, "cached", call.key, tool_id))
                self.ports.stats.add("cached", tool=tool_id)
                cost = self.queue.memo.cost_of(call.key)
                if cost is not None:
                    self.ports.stats.save([cost], tool=tool_id)
        elif decision in (Submitted.FOLLOWER, Submitted.ATTACHED):
            self.ports.stats.add("deduped", tool=tool_id)
            if decision is Submitted.ATTACHED:  # joined an execution past the queue: its own timeout
                self.lifecycle.joined(call, now)
        elif decision is Submitted.DRAIN_NOW:
            self._drain_wanted = True  # at the end of this message (on_receive)
        elif decision is Submitted.ARM:
            ref, generation = self.actor_ref, self.queue.generation
            self.ports.timers.call_later(
                self.queue.grace_deadline() - self.clock(), lambda: ref.tell(DrainDue(generation=generation))
            )
        held = decision not in (Submitted.MEMO, Submitted.ATTACHED) and call.key in self.queue.inflight
        if held and not math.isinf(call.timeout_s):  # it waits at most its own timeout_s for its turn
            ref, keys = self.actor_ref, (call.key,)
            self.ports.timers.call_later(call.timeout_s, lambda: ref.tell(WaitDue(keys=keys)))
        if call.nested and call.key in self.queue.inflight and decision is not Submitted.MEMO:
            self.lifecycle.nested_joined(call.key)  # joined it or held behind it: a borrowed slot
            self.lifecycle.pump(now)

    def _drain(self, generation: int, now: float) -> None:
        start = time.perf_counter()
        if generation == -1:
            self._drain_pending = False
            groups = self.queue.drain(whole_batches=True)
        elif generation == HELD:
            groups = self.queue.drain()
        else:
            groups = self.queue.drain(generation)
        if groups:
            tool = self.queue.tool
            if tool.batch is not None:  # the calls gathered for a batch (each execution counted once)
                waited = sum(now - g.calls[0].submitted_at for g in groups if g.calls)
                self.ports.stats.waited(tool.tool_id, "batch_grace", waited)
                if self.traced:
                    for group in groups:
                        for call in group.calls:
                            if call.trace is not None:
                                call.trace.wait("batch_grace", call.submitted_at, now)
            calls = sum(len(g.calls) for g in groups)
            self.ports.stats.record(
                "group", (time.perf_counter() - start) * 1000.0, groups=len(groups), calls=calls
            )
            self.lifecycle.drained(groups, now)

    def drain_held(self, key: str, now: float) -> None:
        """A key settled: calls queued behind it (a forced refresh) go now."""
        if key in self.queue.queued:
            self.actor_ref.tell(DrainDue(generation=HELD))

    def _stop_queue(self, message: StopQueue, now: float) -> None:
        calls = self.queue.cancel_queued()
        for call in calls:
            fail(call.future, CallCancelledError("the dispatcher stopped before the call started"))
        refused = self.lifecycle.stop(now)
        self.ports.stats.add("cancelled", len(calls) + refused)
        message.reply.set(len(calls) + refused)
        if message.idle is not None:
            self._stop_replies.append(message.idle)

    def cancel(self, call: Call) -> None:
        """Handle a caller's cancel (on this actor's thread)."""
        now = self.clock()
        if self.queue.remove(call):
            self.ports.stats.add("cancelled", tool=self.queue.tool.tool_id)
            fail(call.future, CallCancelledError("the call was cancelled"))
            return
        self.lifecycle.cancel(call, now)
