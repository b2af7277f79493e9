"""One queue per tool: batch grace window, dedupe by receipt key, drains.

:class:`ToolQueue` is the plain state machine: calls in, decisions out, time passed
in. :class:`ToolQueueActor` feeds it and performs the decisions: arming the grace
timer, handing drained groups to the system's drain pool, resolving futures when a
drain reports its groups settled.

Rules (SEMANTICS.md, Life of a call): a tool without a batch strategy drains at once;
a batchable tool drains when ``max_batch_size`` unique calls are queued, otherwise
``batch_grace_s`` after the first queued call. Calls with the same receipt key share
one execution: same drain → followers; while the key is in flight → attached
(execution ``in_flight``).
"""

from __future__ import annotations

import collections
import enum
import math
import time
from collections.abc import Callable
from typing import Any

import attrs
import pykka

from stores.types import ClaimMode

from ._calls import Call, Group
from ._runtime import Timers, fail, guarded
from .errors import CallCancelledError
from .messages import DrainDue, GroupsSettled, StopQueue, SubmitCall
from .stats import Stats
from .tool import Tool

__all__ = ["Submitted", "ToolQueue", "ToolQueueActor"]


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
    """

    def __init__(self, tool: Tool, batch_grace_s: float, memo_size: int = 50_000) -> None:
        self.tool = tool
        self.batch_grace_s = batch_grace_s
        self.memo_size = memo_size if tool.durable else 0
        self.memo: collections.OrderedDict[str, tuple[float, Any]] = collections.OrderedDict()
        self.recalled: Any = None
        """The result :meth:`submit` found in the memo for the call it answered MEMO."""
        self.queued: dict[str, Group] = {}
        self.inflight: dict[str, Group] = {}
        self.window_opened_at: float | None = None
        self.generation = 0

    def submit(self, call: Call) -> Submitted:
        """Queue ``call``; the decision says what the actor must do."""
        key = call.key
        if self.memo_size and call.mode is not ClaimMode.FORCE_REFRESH:
            self.recalled = self.recall(call)
            if self.recalled is not None:
                return Submitted.MEMO
        running = self.inflight.get(key)
        if running is not None:
            running.attached.append(call)
            return Submitted.ATTACHED
        queued = self.queued.get(key)
        if queued is not None:
            queued.followers.append(call)
            return Submitted.FOLLOWER
        self.queued[key] = Group(call)
        batch = self.tool.batch
        if batch is None or len(self.queued) >= batch.max_batch_size:
            return Submitted.DRAIN_NOW
        if self.window_opened_at is None:
            self.window_opened_at = call.submitted_at
            self.generation += 1
            return Submitted.ARM
        return Submitted.QUEUED

    def recall(self, call: Call) -> Any:
        """The remembered result of ``call``'s key (execution ``cached``), or None.

        Completed receipts are immutable until refreshed, so a key this system saw
        completed can be answered from memory; a memo older than the call's
        ``stale_after_s`` is not used.
        """
        found = self.memo.get(call.key)
        if found is None:
            return None
        at, result = found
        if call.stale_after_s is not None and call.submitted_at - at > call.stale_after_s:
            return None
        return result if result.execution == "cached" else attrs.evolve(result, execution="cached")

    def remember(self, key: str, result: Any, now: float) -> None:
        """Remember a completed key's result (most recent ``memo_size`` keys)."""
        if not self.memo_size:
            return
        # a reused receipt may have completed long before ``now``: its age is unknown, so
        # a call bounded by ``stale_after_s`` never takes it from memory
        at = -math.inf if result.execution == "cached" else now
        self.memo[key] = (at, result)
        self.memo.move_to_end(key)
        while len(self.memo) > self.memo_size:
            self.memo.popitem(last=False)

    def grace_deadline(self) -> float:
        """When the open window ends (monotonic seconds)."""
        assert self.window_opened_at is not None
        return self.window_opened_at + self.batch_grace_s

    def drain(self, generation: int | None = None, *, whole_batches: bool = False) -> list[Group]:
        """Take what is queued (nothing if ``generation`` names an older window).

        With ``whole_batches`` (a batchable tool that reached ``max_batch_size``), only
        whole batches are taken, so N calls over U keys make exactly ceil(U/M) batch
        calls; the rest stay queued in the open window, whose timer drains them. The
        groups taken move to in flight until :meth:`settle`.
        """
        if generation is not None and generation != self.generation:
            return []
        groups = list(self.queued.values())
        batch = self.tool.batch
        if whole_batches and batch is not None:
            cut = len(groups) // batch.max_batch_size * batch.max_batch_size
            groups, left = groups[:cut], groups[cut:]
            if left:
                self.queued = {g.key: g for g in left}
                for group in groups:
                    self.inflight[group.key] = group
                return groups
        self.queued.clear()
        self.window_opened_at = None
        self.generation += 1
        for group in groups:
            self.inflight[group.key] = group
        return groups

    def settle(self, key: str) -> Group | None:
        """The group of ``key`` finished: forget it (None if unknown)."""
        return self.inflight.pop(key, None)

    def cancel_queued(self) -> list[Call]:
        """Remove every queued call (for stop); returns them."""
        calls = [call for group in self.queued.values() for call in group.calls]
        self.queued.clear()
        self.window_opened_at = None
        self.generation += 1
        return calls


class ToolQueueActor(pykka.ThreadingActor):
    """Runs one :class:`ToolQueue`.

    Args:
        tool: the tool.
        batch_grace_s: the grace window, seconds.
        run_drain: ``run_drain(queue_ref, tool, groups)`` hands groups to the drain
            pool; called on this actor's thread and must not block.
        requeue: ``requeue(call, error)`` re-submits a call after a credential change.
        stats: the system's counters.
        timers: the system's timer thread.
    """

    def __init__(
        self,
        tool: Tool,
        batch_grace_s: float,
        run_drain: Callable[[Any, Tool, list[Group]], None],
        requeue: Callable[[Call, BaseException], None],
        stats: Stats,
        timers: Timers,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.queue = ToolQueue(tool, batch_grace_s)
        self.run_drain = run_drain
        self.requeue = requeue
        self.stats = stats
        self.timers = timers
        self.clock = clock
        self._drain_pending = False

    @guarded
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, SubmitCall):
            self._submit(message.call)
        elif isinstance(message, DrainDue):
            self._drain(message.generation)
        elif isinstance(message, GroupsSettled):
            for key, outcome in message.outcomes:
                group = self.queue.settle(key)
                if group is not None:
                    self._resolve(group, outcome)
        elif isinstance(message, StopQueue):
            calls = self.queue.cancel_queued()
            for call in calls:
                fail(call.future, CallCancelledError("the dispatcher stopped before the call started"))
            self.stats.add("cancelled", len(calls))
            message.reply.set(len(calls))
        return None

    def _submit(self, call: Call) -> None:
        decision = self.queue.submit(call)
        if decision is Submitted.MEMO:
            call.future.set(self.queue.recalled)
            self.stats.add("cached", tool=self.queue.tool.tool_id)
        elif decision in (Submitted.FOLLOWER, Submitted.ATTACHED):
            self.stats.add("deduped", tool=self.queue.tool.tool_id)
        elif decision is Submitted.DRAIN_NOW:
            if not self._drain_pending:
                self._drain_pending = True
                self.actor_ref.tell(DrainDue(generation=-1))
        elif decision is Submitted.ARM:
            ref, generation = self.actor_ref, self.queue.generation
            self.timers.call_later(
                self.queue.grace_deadline() - self.clock(), lambda: ref.tell(DrainDue(generation=generation))
            )

    def _drain(self, generation: int) -> None:
        start = time.perf_counter()
        if generation == -1:
            self._drain_pending = False
            groups = self.queue.drain(whole_batches=True)
        else:
            groups = self.queue.drain(generation)
        if groups:
            calls = sum(len(g.followers) + 1 for g in groups)
            self.stats.record(
                "group", (time.perf_counter() - start) * 1000.0, groups=len(groups), calls=calls
            )
            self.run_drain(self.actor_ref, self.queue.tool, groups)

    def _resolve(self, group: Group, outcome: Any) -> None:
        if isinstance(outcome, _Requeue):
            for call in group.calls + group.attached:
                self.requeue(call, outcome.error)
            return
        if isinstance(outcome, BaseException):
            for call in group.calls + group.attached:
                fail(call.future, outcome)
            self.stats.add("errors", len(group.calls) + len(group.attached), tool=self.queue.tool.tool_id)
            return
        self.queue.remember(group.key, outcome, self.clock())
        for call in group.calls:
            call.future.set(outcome)
        self.stats.add(outcome.execution, len(group.calls), tool=self.queue.tool.tool_id)
        if group.attached:
            attached = (
                outcome if outcome.execution != "live" else attrs.evolve(outcome, execution="in_flight")
            )
            for call in group.attached:
                call.future.set(attached)
            self.stats.add(attached.execution, len(group.attached), tool=self.queue.tool.tool_id)


@attrs.frozen
class _Requeue:
    """Outcome: credentials changed; re-queue every call of the group once."""

    error: BaseException


def requeue_outcome(error: BaseException) -> Any:
    """The outcome a drain reports for a group whose credentials changed."""
    return _Requeue(error)
