"""The lifecycle's effects that stay in the process: tool attempts, callers, salvage, memo.

:class:`LocalEffects` is the half of :class:`actors.queue.ports.ActorEffects` that talks to no
other actor: it submits attempts and reconcile hooks to the worker pool (each reports
back to the tool queue actor as a message), answers callers' futures, appends to the
salvage file, counts, and fills the tool's memo. It runs on the tool queue actor's thread.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import pykka

from actors.errors import NotSentError, error_text, exc_info_of, is_a
from actors.flusher.salvage import salvage_entry
from actors.lifecycle.attempts import AttemptSpec
from actors.lifecycle.calls import Call, Group
from actors.messages import Reconciled, UnitFinished
from actors.results import ToolContext, ToolResult, provider_idempotency_key
from actors.runtime.actor import Reply, log
from actors.runtime.futures import fail
from actors.runtime.gathering import Gathering
from actors.worker.attempt import attempt
from stores.codec import EncodedOutput
from stores.money import Money

if TYPE_CHECKING:
    from actors.queue.system_ports import Ports
    from actors.tool import Tool

__all__ = ["FINISHED_READY", "FinishReport", "Finished", "LocalEffects"]


class LocalEffects:
    """Effects on the worker pool, the callers, the salvage file and the memo.

    Args:
        actor: the tool queue actor (its ``lifecycle``'s units, its ``queue``'s memo), on
            whose thread every method but :meth:`keep_late_of` runs.
        tool: the actor's tool.
        ports: what the system's tool queue actors share.
        finished: where the tool's attempts put their outcomes for the actor.
    """

    def __init__(self, actor: Any, tool: Tool, ports: Ports, finished: Finished) -> None:
        self.actor = actor
        self.tool = tool
        self.ports = ports
        self.ref = actor.actor_ref
        self.org_id = ports.run.org_id
        self.finished = finished
        self._tell = self.ref.tell

    def start(self, spec: AttemptSpec) -> None:
        tell = self._tell
        gate = self.ports.gates.get(self.org_id, self.tool.provider_name)
        unit = self.actor.lifecycle.units.get(spec.unit)
        groups = list(unit.groups) if unit is not None and self.tool.durable else None
        report = FinishReport(self.finished, tell, self, groups)
        try:
            self.ports.pool.submit(attempt, spec, report, time.monotonic, gate, self.ports.launch)
        except Exception as exc:  # shut down (the system stopped), or no thread could start
            error = NotSentError(f"{self.tool.tool_id}: its attempt could not start: {error_text(exc)}")
            error.__cause__ = exc
            tell(UnitFinished(unit=spec.unit, attempt=spec.attempt, members=None, error=error))

    def keep_late(self, message: UnitFinished) -> list[str]:
        """An attempt's answer left unhandled in the stopping actor's inbox: salvaged.
        Returns the receipt keys salvaged."""
        unit = self.actor.lifecycle.units.get(message.unit)
        if unit is not None and self.tool.durable:
            return self.keep_late_of(list(unit.groups), message)
        return []

    def keep_late_of(self, groups: list[Group], message: Any) -> list[str]:
        """Where an attempt's outputs go when it returns after the system stopped (stop's
        bound ran out while it ran): the salvage file, so a paid result is never lost
        (``tooldispatch salvage replay`` stores it). ``groups``: the unit's groups when
        the attempt started (the order of its members). Runs on the worker. Returns the
        receipt keys salvaged (none when the file could not be written)."""
        if not isinstance(message, UnitFinished) or message.members is None:
            return []
        error = "the dispatcher stopped before this result was stored"
        kept = [
            (group.key, self._entry(group, EncodedOutput(text), error))
            for group, (text, failure) in zip(groups, message.members, strict=False)
            if failure is None and isinstance(text, str)
        ]
        if kept:
            try:
                self.ports.salvage.append([entry for _, entry in kept])
                log.warning("stopped before %d results were stored: salvaged", len(kept))
            except Exception:
                log.exception("could not salvage %d results that came back after stop", len(kept))
                return []
        return [key for key, _ in kept]

    def reconcile(self, batch: int, group: Group) -> None:
        hook = self.tool.reconcile
        assert hook is not None
        receipt = group.receipt
        context = ToolContext(
            tool_id=self.tool.tool_id,
            idempotency_key=provider_idempotency_key(group.key, receipt.generation if receipt else None),
            receipt_keys=(group.key,), credential_scope_digest=group.credential_digest,
            deadline=time.monotonic() + group.timeout_s, timeout_s=group.timeout_s,
        )  # fmt: skip
        reply = Reply(self.ref, Reconciled, batch=batch)
        inp = group.input

        def ask() -> None:
            try:
                reply.set(hook(inp, context))
            except BaseException as exc:  # SystemExit too: the call is answered, never left waiting
                reply.set_exception(exc_info_of(exc))  # (the hook's error may make __traceback__ raise)

        try:
            self.ports.pool.submit(ask)
        except Exception as exc:  # shut down, or no thread could start: answered all the same
            reply.set_exception((type(exc), exc, None))

    def answer(self, call: Call, outcome: Any) -> None:
        future = call.future
        if is_a(outcome, ToolResult):  # by its real type: a tool's error may say it is one
            with contextlib.suppress(Exception):
                future.set(outcome)
            if outcome.execution != "live":
                self.ports.stats.add(outcome.execution, tool=self.tool.tool_id)
            if outcome.refresh_uncertain:
                self.ports.stats.add("refresh_uncertain", tool=self.tool.tool_id)
            elif outcome.refresh_running:
                self.ports.stats.add("refresh_running", tool=self.tool.tool_id)
            return
        fail(future, outcome)
        self.ports.stats.add("errors", tool=self.tool.tool_id)

    def requeue(self, call: Call, error: BaseException) -> None:
        self.ports.requeue(call, error)

    def salvage(self, group: Group, output: Any, error: str) -> None:
        """Keep a paid output the store could not take in the salvage file. Never raises:
        the lifecycle answers its callers whatever the file does; when not even a
        stand-in can be written (disk full, a bad path) the loss is logged and counted
        (``salvage_failed``)."""
        try:
            self._salvage(group, output, error)
        except BaseException:  # an output whose very description fails: keep what can be kept
            log.exception("salvaging %s", group.key)
            stand_in = {"type": type(output).__qualname__, "reason": error, "repr": "<unrepresentable>"}
            try:
                self._salvage(group, stand_in, error, described=True)
            except Exception:
                log.exception("the salvage file %s could not be written: the output of %s is lost",
                              self.ports.salvage.path, group.key)  # fmt: skip
                self.count("salvage_failed")

    def _entry(self, group: Group, output: Any, error: str) -> Any:
        return salvage_entry(
            key=group.key, org_id=self.org_id, scope=self.ports.run.scope, tool_id=self.tool.tool_id,
            input_hash=group.input_hash, output=output, attempts=1, first_error_at=None, error=error,
            lease_id=group.receipt.lease_id if group.receipt else None,
            generation=group.receipt.generation if group.receipt else None,
            replaces=group.receipt.completed_at if group.receipt else None,
        )  # fmt: skip

    def _salvage(self, group: Group, output: Any, error: str, described: bool = False) -> None:
        entry = self._entry(group, output, error)
        if described:  # a stand-in: kept for an operator, never replayed into the store
            entry = attrs.evolve(entry, output_form="described", output_problem=error)
        self.ports.salvage.append([entry])

    def count(self, name: str, n: int = 1) -> None:
        if n:  # n < 0 for gauges (waiting_on_owner)
            self.ports.stats.add(name, n, tool=self.tool.tool_id)

    def spend(self, costs: Sequence[Money]) -> None:
        if costs:
            self.ports.stats.spend(costs, tool=self.tool.tool_id)

    def save(self, cost: Money) -> None:
        self.ports.stats.save([cost], tool=self.tool.tool_id)

    def waited(self, reason: str, seconds: float) -> None:
        self.ports.stats.waited(self.tool.tool_id, reason, seconds)

    def waste(self, costs: Sequence[Money], reason: str) -> None:
        if costs:
            self.ports.stats.waste(costs, self.tool.tool_id, reason)

    def salvage_path(self) -> str:
        return str(self.ports.salvage.path)

    def remember(self, key: str, text: str, cached: bool, cost: Money | None = None) -> None:
        self.actor.queue.memo.remember(key, text, -float("inf") if cached else time.monotonic(), cost)

    def forget(self, key: str) -> None:
        self.actor.queue.memo.forget(key)

    def owe(self, key: str) -> None:
        self.actor.queue.memo.owe(key)

    def owed(self, key: str) -> bool:
        return bool(self.actor.queue.memo.take_owed(key))


class FinishedReady:
    """The doorbell: attempts' outcomes wait in the tool's :class:`Finished`."""

    __slots__ = ()


FINISHED_READY = FinishedReady()


class Finished:
    """Attempts' outcomes, as workers report them, for the tool queue actor to take.

    Only the first outcome put into an empty buffer rings the actor (one
    :data:`FINISHED_READY` message); the outcomes put before the actor takes them ride
    along (a :class:`~actors.runtime.gathering.Gathering`). Units finishing together are
    so handled, and their outputs written, together, and a finishing call costs no
    message of its own. Once :meth:`close` d (the actor stopped), a put is refused and
    its worker salvages the outcome itself.
    """

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: Gathering[tuple[UnitFinished, FinishReport]] = Gathering()

    def put(self, message: UnitFinished, report: FinishReport) -> bool | None:
        """Keep an outcome. Returns True: ring the actor; False: a ring is on its way;
        None: closed (nothing kept)."""
        return self._items.put(((message, report),))

    def take(self) -> list[tuple[UnitFinished, FinishReport]]:
        """Every outcome kept so far (on the actor's thread). The actor answers for them
        from now on: their reports let go of the groups kept for salvage (a worker still
        returning from its report, or idle with its last task, holds nothing of the call)."""
        items = self._items.take()
        for _, report in items:
            report.groups = None
        return items

    def close(self) -> list[tuple[UnitFinished, FinishReport]]:
        """Refuse later puts; return what is left unread."""
        return self._items.close()

    def __len__(self) -> int:
        """Outcomes waiting to be taken."""
        return len(self._items)


class FinishReport:
    """How an attempt tells its outcome (on the worker): into the tool's
    :class:`Finished`, or, once its actor is gone, to the salvage file (``groups``:
    durable tools only)."""

    __slots__ = ("effects", "finished", "groups", "tell")

    def __init__(
        self, finished: Finished, tell: Any, effects: LocalEffects, groups: list[Group] | None
    ) -> None:
        self.finished = finished
        self.tell = tell
        self.effects = effects
        self.groups = groups

    def __call__(self, message: Any) -> None:
        ring = self.finished.put(message, self)
        if ring is None:  # the system stopped before this attempt returned
            self.keep_late(message)
        elif ring:
            try:
                self.tell(FINISHED_READY)
            except pykka.ActorDeadError:  # stopped between the put and the ring
                for left, report in self.finished.close():
                    report.keep_late(left)

    def keep_late(self, message: UnitFinished) -> list[str]:
        """Salvage a late answer; returns the receipt keys salvaged."""
        if self.groups is not None:
            return self.effects.keep_late_of(self.groups, message)
        return []
