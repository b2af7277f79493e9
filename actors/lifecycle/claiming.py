"""Claims and waits: a drained group's receipt claimed in bulk, its disposition sorted,
another owner's receipt waited on with timers and plain reads (no thread held).

Rules: docs/receipts.md, Claims and dispositions (the disposition table; a retryable failure re-claimed in
``retry_failed`` mode so a receipt completed meanwhile is reused; a live lease never
stolen: after the last poll, ReceiptWaitTimeoutError).

Claims and reads ride out an outage of the store for as long as their callers' own
``timeout_s`` (``patience_s``; :mod:`actors.store.outage`): a claim names its lease ids,
so the same claim sent again after its first attempt committed is answered ``claimed``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from actors.errors import (
    CallCancelledError,
    ReceiptWaitTimeoutError,
    RecordedFailureError,
    StoreError,
)
from actors.lifecycle.attempts import recorded_value
from actors.lifecycle.calls import Group, GroupState, Reread, Unit, patience_s
from actors.lifecycle.exits import Done
from actors.lifecycle.shared import Parts, Shared
from actors.messages import PollDue
from stores.codec import encode_output
from stores.errors import UnreadableOutputError
from stores.types import (
    BatchRecord,
    Claim,
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Receipt,
    ReceiptStatus,
)

__all__ = ["CLAIM_CHUNK", "Claims"]

RUNNING = ReceiptStatus.RUNNING
_RUNNING_REFRESH = (ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)
_LAST_GOOD = {
    ReceiptStatus.QUEUED: "refresh_running",
    ReceiptStatus.RUNNING: "refresh_running",
    ReceiptStatus.UNCERTAIN: "refresh_uncertain",
}
"""How a reused receipt's output is marked by its status: only a refresh's last good
output is reused from a queued, running or uncertain receipt (stores.serves_last_good)."""
CLAIM_CHUNK = 500
"""Most receipts in one claim of a bulk drain claimed straight into running: its first
calls start while the store claims the rest (chunking calls that wait for slots anyway
cost 12% of fresh calls/s in dispatch_bench, threads)."""


class Claims:
    """Claims and waits on other owners (a part of :class:`actors.lifecycle.machine.Lifecycle`;
    runs on its owner's thread)."""

    def __init__(self, s: Shared, p: Parts) -> None:
        self.s = s
        self.p = p
        self.tool = s.tool
        self.policy = s.policy
        self.fx = s.fx

    # -- from the queue -----------------------------------------------------------------

    def drained(self, groups: list[Group], now: float) -> None:
        """Groups leave the batch grace window: claim (durable) or run (not durable)."""
        for group in groups:
            self.s.groups[group.key] = group
        if self.s.stopping:
            self.p.exits.cancel_groups(groups)
            return
        if not self.tool.durable:
            self.p.exits.enqueue(self.p.exits.compile(groups))
            self.p.admission.pump(now)
            return
        if self.s.intake_out or self.s.slotting:
            # a claim of drained groups is out: these go with the next one, sent when it
            # is answered (under load one transaction and one turn claim many calls; an
            # idle call is claimed at once)
            for group in groups:
                group.state = GroupState.CLAIMING
            self.s.intake.extend(groups)
            return
        self._intake(groups)

    def _intake(self, groups: list[Group]) -> None:
        fits = self.s.width - self.s.holding >= len(groups)
        if fits and self.straight_into_running and not self.s.pending and not self.s.acquiring[False]:
            # admission looks immediate: take the slots first and claim straight into
            # running (one transaction and one turn through the store fewer per call)
            for group in groups:
                group.state = GroupState.CLAIMING
            self.s.acquiring[False] = True
            self.s.slotting = groups
            self.fx.acquire(len(groups), False, immediate=True)
            return
        self.claim(groups, None, intake=True)

    def _next_intake(self) -> None:
        """The claim of drained groups answered: claim those drained meanwhile."""
        if self.s.intake_out or self.s.slotting or not self.s.intake:
            return
        groups, self.s.intake = self.s.intake, []
        if self.s.stopping:  # (stop refuses them itself; kept safe all the same)
            self.p.exits.cancel_groups(groups)
            return
        wanted = []
        for group in groups:
            if group.calls:
                wanted.append(group)
            else:  # every caller gave up while it waited: nothing was claimed
                self.p.exits.settle(group, None)
        if wanted:
            self._intake(wanted)

    @property
    def straight_into_running(self) -> bool:
        """A durable, non-batch tool of a provider with no rate stated or to start from
        (the governor grants such slots at once only while it paces nothing)."""
        pacing = self.tool.pacing
        return self.tool.batch is None and pacing.rps is None and pacing.start_rps is None

    def slots_for_claim(self, n: int, now: float) -> None:
        """The slots asked for before a claim: ``n`` granted (0 or -1: none; the claim
        goes the usual way). The first ``n`` groups still wanted are claimed straight
        into running, the rest as usual, in one claim."""
        groups, self.s.slotting = self.s.slotting, []
        self.s.acquiring[False] = False
        try:
            self._claim_slotted(groups, n, now)
        finally:  # (whatever it met: the calls drained meanwhile are never left waiting)
            self._next_intake()

    def _claim_slotted(self, groups: list[Group], n: int, now: float) -> None:
        for group in groups:
            if n <= 0:
                break
            if group.calls and not group.nested and not self.s.stopping:
                group.slotted = True
                self.s.holding += 1
                n -= 1
        if n > 0:  # granted, charged, never sent
            self.fx.release_slots(n, refunds=n)
        self.claim(groups, None, intake=True)
        self.p.admission.pump(now)

    def _spare_slot(self, group: Group) -> None:
        """A group that took a slot before its claim and will not be sent on it."""
        if group.slotted:
            group.slotted = False
            self.s.holding -= 1
            self.fx.release_slots(1, refunds=1)

    def claim(self, groups: list[Group], force: ClaimMode | None, intake: bool = False) -> None:
        """Claim ``groups`` in bulk (``force``: in that mode, else each group's own);
        ``intake``: drained groups (others drained meanwhile wait for the answer)."""
        buckets: dict[tuple[ClaimMode, float | None], list[Group]] = {}
        for group in groups:
            group.state = GroupState.CLAIMING
            buckets.setdefault((force or group.mode, group.stale_after_s), []).append(group)
        safe = self.tool.retry_safe
        for (mode, stale), bucket in buckets.items():
            # claimed straight into running: in chunks, so the first calls start while the
            # store claims the next ones (calls that wait for slots anyway: one claim)
            chunk = CLAIM_CHUNK if any(g.slotted for g in bucket) else len(bucket)
            for start in range(0, len(bucket), chunk):
                members = bucket[start : start + chunk]
                batch = next(self.s.ids)
                self.s.batches[batch] = members
                # lease ids of our own (16 random bytes each, one read of the OS's source):
                # sent again after a dropped connection, the claim finds what it took
                ids = os.urandom(16 * len(members)).hex()
                scope, tool_id = self.s.scope, self.tool.tool_id
                requests = [
                    ClaimRequest(
                        g.key,
                        scope,
                        tool_id,
                        g.input_hash,
                        retry_safe=safe,
                        lease_id=ids[32 * i : 32 * i + 32],
                        input_text=g.input_text,
                    )
                    for i, g in enumerate(members)
                ]
                running = frozenset(g.key for g in members if g.slotted)
                if intake:
                    self.s.intake_out.add(batch)
                self.s.asked_at[batch] = self.s.clock()
                self.fx.claim(batch, mode, stale, requests, running, patience_s(members))

    def on_claimed(
        self, batch: int, claims: list[Any] | None, error: BaseException | None, now: float
    ) -> None:
        """A bulk claim answered: sort the dispositions; then claim the groups drained
        while it was out."""
        intake = self._intake_answered(batch)
        asked = self.s.asked_at.pop(batch, None)
        if asked is not None:
            self.fx.waited("store", (now - asked) * len(self.s.batches.get(batch, ())))
        for group in self.s.batches.get(batch, ()):
            group.held_since = group.held_by = None
        try:
            self._sort(batch, claims, error, now)
        finally:  # (whatever sorting met: the calls drained meanwhile are never left waiting)
            if intake:
                self._next_intake()

    def on_claim_held(self, batch: int, now: float, cause: BaseException | None = None) -> None:
        """The store is away (``cause``: the error its first attempt met) and holds the
        claim of ``batch`` to try it again (for its callers' longest timeout): each of its
        callers is answered at its own timeout meanwhile (``Waits.on_wait_due``), and the
        calls drained meanwhile stop waiting for it and go in a claim of their own."""
        for group in self.s.batches.get(batch, ()):
            if group.held_since is None and group.state is GroupState.CLAIMING:
                group.held_since, group.held_by = now, cause
                self.p.waits.time_waiters(group, -math.inf, group.calls, now)
        if self._intake_answered(batch):
            self._next_intake()

    def _intake_answered(self, batch: int) -> bool:
        """Whether ``batch`` is the claim of drained groups that was out (it no longer is:
        the groups drained meanwhile may go)."""
        if batch not in self.s.intake_out:
            return False
        self.s.intake_out.discard(batch)
        return True

    def _sort(self, batch: int, claims: list[Any] | None, error: BaseException | None, now: float) -> None:
        members: list[Group] = self.s.batches.pop(batch, [])
        if error is not None or claims is None:
            self.p.cleanup.claim_failed([group.key for group in members])
            for group in members:
                self._spare_slot(group)
                self.p.exits.settle(group, error or StoreError("the claim returned nothing"))
            self.p.admission.pump(now)
            return
        claimed: list[Group] = []
        started: list[Group] = []
        again: list[Group] = []
        waiting: list[Group] = []
        resent: dict[str, tuple[BatchRecord, tuple[Claim, ...], list[Group]]] = {}
        created = 0
        for group, claim in zip(members, claims, strict=True):
            disposition, receipt = claim.disposition, claim.receipt
            if disposition is ClaimDisposition.CLAIMED:
                self.p.exits.stop_waiting(group)
                group.receipt = receipt
                if receipt.completed_at is not None and self.tool.durable:  # a refresh of an output
                    self.fx.forget(group.key)  # the memo's copy: later calls get it marked, from the group
                    self.p.exits.answer_last_good(group, receipt, "refresh_running")
                if receipt.attempts <= 1 and receipt.generation <= 1:
                    created += 1
                group.state = GroupState.CLAIMED
                if claim.batch is not None:  # taken over with the request that carried it
                    self._spare_slot(group)
                    resent.setdefault(claim.batch.key, (claim.batch, claim.members, []))[2].append(group)
                    continue
                if not group.calls or self.s.stopping:  # every caller gave up meanwhile, or the stop
                    if self.s.stopping:  # its callers are refused now: counted as the stop's
                        self.fx.count("cancelled", len(group.calls))
                    self._spare_slot(group)
                    self.p.exits.release_group(
                        group, CallCancelledError("the call was cancelled before it was sent")
                    )
                    continue
                (started if group.slotted else claimed).append(group)
                continue
            self._spare_slot(group)
            if disposition is ClaimDisposition.REUSED:
                self.p.exits.settle(
                    group, self._reused(group, receipt, "in_flight" if group.wait.polls else "cached")
                )
            elif disposition is ClaimDisposition.FAILED:
                kind = receipt.failure_kind
                if kind is not None and kind.retryable and group.mode is ClaimMode.NORMAL:
                    group.mode = ClaimMode.RETRY_FAILED  # reuses a receipt completed meanwhile
                    again.append(group)
                else:
                    self.p.exits.settle(group, self._recorded_failure(group, receipt))
            elif disposition.value == "uncertain":
                self.p.exits.answer_last_good(group, receipt, "refresh_uncertain")  # its ordinary callers
                if self.tool.reconcile is None:
                    self.p.exits.settle(group, self.p.waits.uncertain(group, receipt))
                else:  # ask the provider whether the uncertain attempt acted
                    self.p.waits.reconcile(group, receipt, now)
            elif group.wait.polls >= self.policy.receipt_wait_max_attempts:
                self.p.exits.settle(
                    group,
                    ReceiptWaitTimeoutError(
                        f"receipt {group.key} is still held by another owner's live lease"
                    ),
                )
            elif not group.calls:  # every caller gave up (cancelled, or timed out while the
                self.p.exits.settle(group, None)  # claim was held): nobody waits on the owner
            else:  # running, blocked_active_lease: another owner holds it
                group.wait.force_after = disposition is ClaimDisposition.BLOCKED_ACTIVE_LEASE
                if not self._last_good_given(group, receipt):
                    waiting.append(group)
        self.fx.count("receipts_created", created)  # once per claim (a count takes a lock)
        for record, member_claims, asked in resent.values():
            self._send_again(batch, record, member_claims, asked, now)
        if claimed or started:
            leases = [lease for g in (*claimed, *started) if (lease := g.lease) is not None]
            self.fx.beat(batch, leases)
            for group in (*claimed, *started):
                group.beating = True
            self.p.exits.enqueue(self.p.exits.compile(claimed))
        if started:  # claimed straight into running on slots taken before the claim
            units = self.p.exits.compile(started)
            for unit in units:
                unit.slot = True
                unit.exempt = False  # a nested call that joined since holds the same slot
                for group in unit.groups:
                    group.slotted = False
            # a store that did not write them running (written before such claims): marked
            marked: list[Unit] = []
            queued: list[Unit] = []
            for unit in units:
                ran = all(g.receipt.status is RUNNING for g in unit.groups if g.receipt)
                (marked if ran else queued).append(unit)
            self.p.admission.admit(marked, now, marked=True)
            self.p.admission.admit(queued, now)
        if again:
            self.claim(again, None)
        if waiting:
            self._wait(waiting, now)
        self.p.admission.pump(now)

    def _send_again(
        self,
        batch: int,
        record: BatchRecord,
        member_claims: tuple[Claim, ...],
        asked: list[Group],
        now: float,
    ) -> None:
        """A request that may have reached the provider, taken over with all its members
        (``Claim.batch``): it goes again first, exactly as recorded (a unit of those
        members, in that order, under that key), before anything else is done with them.
        A member no caller here asked for rides along (its output is stored for the next
        caller); nobody left waiting, or a stop: every member is given back (pending, the
        record kept for the next claim). A member whose input the record does not hold (a
        tool that keeps no raw input) takes it from a call of it here whose input hash is
        its receipt's; until every such input is at hand the request waits (``Unit.missing``)
        for its callers' timeout, then its members are recorded uncertain."""
        mine = {g.key: g for g in asked}
        template = asked[0]
        groups: list[Group] = []
        missing: set[str] = set()
        for text, claim in zip(record.inputs, member_claims, strict=True):
            receipt = claim.receipt
            if text is None:  # not recorded: a call of it here brings it, or none has yet
                source = mine.get(receipt.key) or self.s.groups.get(receipt.key)
                if source is None or source.input_hash != receipt.input_hash or not source.input_known:
                    missing.add(receipt.key)
            group = mine.get(receipt.key)
            if group is None:  # not asked for here: it rides along, callerless
                group = Group(
                    key=receipt.key, tool=self.tool, input=None, input_hash=receipt.input_hash,
                    credential_digest=template.credential_digest, stale_after_s=template.stale_after_s,
                    mode=template.mode,
                )  # fmt: skip
                group.state = GroupState.CLAIMING
                group.state = GroupState.CLAIMED
                group.receipt = receipt
                self.s.groups.setdefault(receipt.key, group)  # later calls of it attach
            if text is not None:
                group.input = recorded_value(text)  # exactly what the request carried
            elif receipt.key in missing:
                group.input_known = False
            elif group is not mine.get(receipt.key):
                group.input = self.s.groups[receipt.key].input  # a call of it here, same input hash
            groups.append(group)
        leases = [lease for g in groups if (lease := g.lease) is not None]
        self.fx.beat(batch, leases)
        for group in groups:
            group.beating = True
        unit = Unit(
            next(self.s.ids), groups, record=record, taken_over=True, exempt=any(g.nested for g in groups)
        )
        for group in groups:
            group.unit = unit
        self.s.units[unit.id] = unit
        if self.s.stopping or not any(g.calls for g in groups):
            if self.s.stopping:
                self.fx.count("cancelled", sum(len(g.calls) for g in groups))
            self.p.exits.give_back(unit, CallCancelledError("the call was cancelled before it was sent"))
            return
        if missing:  # rebuilt once the calls of those members bring their inputs
            unit.missing = missing
            timeout_s = unit.timeout_s
            if not math.isinf(timeout_s):
                unit.deadline = now + timeout_s
                self.s.deadlines.setdefault(timeout_s, []).append(unit.id)
            return
        self.fx.count("requests_resent")
        self.p.exits.enqueue([unit])

    def _reused(self, group: Group, receipt: Receipt, execution: str) -> Any:
        if receipt.input_hash != group.input_hash:
            return StoreError(
                f"receipt {group.key} holds input hash {receipt.input_hash}, not {group.input_hash}: "
                "a receipt key collision or a corrupted receipt"
            )
        try:
            text = encode_output(receipt.output)
        except Exception as exc:
            return UnreadableOutputError(
                f"receipt {group.key} of {self.tool.tool_id} holds an output that cannot be read back "
                f"({exc}); inspect it with `tooldispatch receipts show {group.key[:16]}`, or run the call "
                "with force_refresh (`tooldispatch run --force-refresh`) to pay for it again and replace it"
            )
        last_good = _LAST_GOOD.get(receipt.status)
        owed = last_good is None and bool(group.calls) and self.fx.owed(group.key)  # ours, callerless
        return Done(text, execution, last_good=last_good, owed=owed, cost=receipt.cost)

    def _last_good_given(self, group: Group, receipt: Receipt) -> bool:
        """A forced refresh waiting on another owner's refresh of a receipt holding its last
        good output: its ordinary callers get that output now (never waiting on either
        refresh). Returns True when no caller is left to wait (the group settled)."""
        if receipt.status in _RUNNING_REFRESH and receipt.completed_at is not None:
            self.p.exits.answer_last_good(group, receipt, "refresh_running")
            if not group.calls:
                self.p.exits.settle(group, None)
                return True
        return False

    @staticmethod
    def _recorded_failure(group: Group, receipt: Receipt) -> BaseException:
        return RecordedFailureError(
            f"durable tool call {group.key} failed earlier: {receipt.error or 'unknown error'}",
            failure_kind=receipt.failure_kind,
        )

    # -- waiting on another owner (timers and plain reads, no thread held) -------------
    # A change notification (ReceiptsChanged, when the store has a change feed) makes an
    # extra read at once; the timer polls go on as the fallback and alone count attempts.

    def _wait(self, groups: list[Group], now: float) -> None:
        policy = self.policy
        watch: list[str] = []
        groups = list(groups)
        for group in list(groups):
            group.state = GroupState.WAITING
            if group.wait.since is None:  # each caller waits at most its own timeout_s
                group.wait.since = now
                self.p.waits.time_waiters(group, now, group.calls, now)
            elif self.p.waits.owner_wait_over(group, now):
                groups.remove(group)
                continue
            if group.wait.polls == 0:
                group.wait.poll_delay_s = policy.receipt_poll_initial_s
                self.fx.count("owner_waits", len(group.calls))
            if not group.wait.counted:
                group.wait.counted = len(group.calls)
                self.fx.count("waiting_on_owner", group.wait.counted)
            if not group.wait.watched:
                group.wait.watched = True
                watch.append(group.key)
        if watch:  # before the timer: its read then sees any change the feed did not hear
            self.fx.watch(watch)
        timed = [g for g in groups if not g.wait.timer_armed]  # left a wait early: its timer still runs
        if not timed:
            return
        delay = min(g.wait.poll_delay_s for g in timed)
        for group in timed:
            group.wait.timer_armed = True
            group.wait.poll_delay_s = min(group.wait.poll_delay_s * 2, policy.receipt_poll_max_s)
        self.fx.later(delay, PollDue(keys=tuple(g.key for g in timed)))

    def on_changed(self, keys: Iterable[str], now: float) -> None:
        """The store heard that some of ``keys`` may have changed: read them now (a key
        whose woken read is still out is read once more when it answers)."""
        groups: list[Group] = []
        for key in keys:
            group = self.s.groups.get(key)
            if group is None or group.state is not GroupState.WAITING:
                continue
            if group.wait.reread is not Reread.NONE:
                group.wait.reread = Reread.AGAIN
            else:
                groups.append(group)
        if not groups or self.s.stopping:
            return
        for group in groups:
            group.wait.reread = Reread.OUT
        batch = next(self.s.ids)
        self.s.batches[batch] = groups
        self.s.woken.add(batch)
        self.fx.read(batch, [g.key for g in groups], patience_s(groups))

    def on_poll(self, keys: Iterable[str], now: float) -> None:
        """A poll timer fired: read the receipts still waited on."""
        for key in keys:
            if (group := self.s.groups.get(key)) is not None:
                group.wait.timer_armed = False
        groups = [
            g for k in keys if (g := self.s.groups.get(k)) is not None and g.state is GroupState.WAITING
        ]
        if not groups:
            return
        if self.s.stopping:
            self.p.exits.cancel_groups(groups)
            return
        batch = next(self.s.ids)
        self.s.batches[batch] = groups
        self.fx.read(batch, [g.key for g in groups], patience_s(groups))

    def on_read(
        self, batch: int, receipts: list[Any] | None, error: BaseException | None, now: float
    ) -> None:
        """A poll's read answered: take completed outputs; claim what may be free; wait on.

        A read woken by a notification counts no attempt and arms no timer: what is
        still held waits on for the timer already pending."""
        woken = batch in self.s.woken
        self.s.woken.discard(batch)
        groups: list[Group] = self.s.batches.pop(batch, [])
        again: list[str] = []
        if woken:
            for group in groups:
                if group.wait.reread is Reread.AGAIN:
                    again.append(group.key)
                group.wait.reread = Reread.NONE
        read = {id(g): i for i, g in enumerate(groups)}
        groups = [g for g in groups if g.state is GroupState.WAITING and g.calls]
        reclaim: list[Group] = []
        force: list[Group] = []
        still: list[Group] = []
        for group in groups:
            i = read[id(group)]
            if not woken:
                group.wait.polls += 1
            receipt = None if receipts is None else receipts[i]
            status = None if receipt is None else receipt.status.value
            if error is None and receipt is not None and status == "completed":
                if group.wait.force_after:
                    force.append(group)
                else:
                    self.p.exits.settle(group, self._reused(group, receipt, "in_flight"))
                continue
            held = status in ("queued", "running")
            if error is None and receipt is not None and held and receipt.completed_at is not None:
                # a refresh holding the last good output: ordinary calls never wait on it
                if group.wait.force_after:
                    if self._last_good_given(group, receipt):
                        continue
                elif group.mode is not ClaimMode.FORCE_REFRESH and group.stale_after_s is None:
                    reclaim.append(group)  # a plain read answers it (stores.serves_last_good)
                    continue
            free = error is None and status not in ("queued", "running")
            # the store judges leases: claim when the read says free, now and then (the
            # owner may have died), and after the last poll (a live lease then times out)
            if woken and not free:
                continue  # the pending timer polls it
            if free or group.wait.polls % 8 == 0 or group.wait.polls >= self.policy.receipt_wait_max_attempts:
                (force if group.wait.force_after else reclaim).append(group)
            else:
                still.append(group)
        if reclaim:
            self.claim(reclaim, None)
        if force:
            self.claim(force, ClaimMode.FORCE_REFRESH)
        if still:
            self._wait(still, now)
        if again:  # the read may predate the change last heard of
            self.on_changed(again, now)
