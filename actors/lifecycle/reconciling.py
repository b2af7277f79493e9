"""Waits held to their callers' timeouts, and uncertain receipts asked about.

A group that waits (on another owner's receipt, or on the tool's ``reconcile`` hook) answers
each caller at its own ``timeout_s``, counted from the start of the wait or from when the
caller joined, as a provider call does: ``ReceiptWaitTimeoutError`` for another owner's
receipt (never stolen; a group left with no caller stops waiting), ``UncertainOutcomeError``
for a hook, whose late answer is still stored for the next caller (a late ``NOT_DONE`` with
no caller left calls no provider).

The ``reconcile`` hook runs on the pool and asks the provider whether an uncertain attempt
acted; its answer is stored (the output, or the receipt made claimable again). Rules:
docs/how-it-works.md, the disposition table (uncertain).
"""

from __future__ import annotations

import math
from typing import Any

from actors.errors import ReceiptWaitTimeoutError, UncertainOutcomeError, error_text, is_a, type_name
from actors.lifecycle.calls import Call, Group, GroupState
from actors.lifecycle.exits import Done
from actors.lifecycle.shared import Parts, Shared
from actors.tool import NOT_DONE
from stores.codec import EncodedOutput, encode_output
from stores.errors import InvalidOutputError, OutputNotStorableError, StoreBusyError, StoreUnavailableError
from stores.types import Receipt

__all__ = ["Waits"]


class Waits:
    """Callers' own timeouts during waits, and the reconcile hook (a part of
    :class:`actors.lifecycle.machine.Lifecycle`; runs on its owner's thread)."""

    def __init__(self, s: Shared, p: Parts) -> None:
        self.s = s
        self.p = p
        self.tool = s.tool
        self.policy = s.policy
        self.fx = s.fx

    def time_waiters(self, group: Group, since: float, calls: list[Call], now: float) -> None:
        """A timer for each of ``calls``' own deadlines, counted from ``since`` (or joining)."""
        for deadline in {max(since, c.submitted_at) + c.timeout_s for c in calls}:
            if not math.isinf(deadline):
                self.s.wait_dues.setdefault(round(max(0.0, deadline - now), 3), []).append(group.key)

    def waiting_joined(self, group: Group, call: Call, now: float) -> None:
        """A caller joined a waiting group: its own timeout, from now."""
        since = group.reconciling_since if group.reconciling_since is not None else group.wait.since
        if since is not None:
            self.time_waiters(group, since, [call], now)
        elif group.held_since is not None:  # its claim is held in an outage: its own deadline
            self.time_waiters(group, -math.inf, [call], now)
        if group.wait.counted:  # one more caller waiting on another owner (the gauge)
            group.wait.counted += 1
            self.fx.count("waiting_on_owner")

    def on_wait_due(self, keys: tuple[str, ...], now: float) -> None:
        """Callers of waiting groups whose own timeout passed are answered now."""
        for key in keys:
            group = self.s.groups.get(key)
            if group is None:
                continue
            if group.reconciling_since is not None:
                for call in group.take_late(group.reconciling_since, now):
                    self.fx.answer(call, UncertainOutcomeError(
                        f"the outcome of {key} is uncertain and the tool's reconcile hook did not "
                        f"answer within {call.timeout_s} s (its answer is stored when it comes)",
                        failure_kind=None,
                    ))  # fmt: skip
            elif group.held_since is not None:  # its claim is held in an outage of the store
                cause = group.held_by
                kind = StoreBusyError if is_a(cause, StoreBusyError) else StoreUnavailableError
                why = f" ({error_text(cause)})" if cause is not None else ""
                for call in group.take_late(-math.inf, now):
                    self.fx.answer(call, kind(
                        f"the receipt store is unavailable: the claim of {key} is held to be tried "
                        f"again{why}; gave up at this call's timeout_s ({call.timeout_s} s)"
                    ))  # fmt: skip
            elif group.state in (GroupState.WAITING, GroupState.CLAIMING, GroupState.RECONCILING):
                # claiming: a reclaim is out (it finds no caller); reconciling: the store's
                # resolve of the hook's answer is out
                self.owner_wait_over(group, now)

    def owner_wait_over(self, group: Group, now: float) -> bool:
        """Answer the callers whose timeout passed while ``group`` waits on another owner;
        True when none is left and it was waiting (settled: it stops polling; one whose
        reclaim is out is released or waits on when the claim answers)."""
        if group.wait.since is None:
            return False
        late = group.take_late(group.wait.since, now)
        for call in late:
            self.fx.answer(call, ReceiptWaitTimeoutError(
                f"receipt {group.key} is still held by another owner's live lease after this "
                f"call's timeout_s ({call.timeout_s} s); it was not taken over"
            ))  # fmt: skip
        if late and group.wait.counted:
            gone = min(len(late), group.wait.counted)
            group.wait.counted -= gone
            self.fx.count("waiting_on_owner", -gone)
        if group.calls or group.state is not GroupState.WAITING:
            return False
        self.p.exits.settle(group, None)
        return True

    def reconcile(self, group: Group, receipt: Receipt, now: float) -> None:
        """Ask the provider about ``group``'s uncertain receipt; time its callers out."""
        group.receipt = receipt
        group.state = GroupState.RECONCILING
        group.reconciling_since = now
        batch = next(self.s.ids)
        self.s.batches[batch] = group
        self.fx.reconcile(batch, group)
        self.time_waiters(group, now, group.calls, now)

    def on_reconciled(self, batch: int, value: Any, error: BaseException | None, now: float) -> None:
        """The reconcile hook answered: store what the provider did, or run it again."""
        group: Group | None = self.s.batches.pop(batch, None)
        if group is None:
            return
        group.reconciling_since = None
        if error is not None or group.receipt is None:
            self.p.exits.settle(group, UncertainOutcomeError(
                f"the outcome of {group.key} is uncertain and reconciling it failed: "
                + (error_text(error) if error is not None else "its receipt is gone"),
                failure_kind=None,
            ))  # fmt: skip
            return
        try:
            text = None if value is NOT_DONE else encode_output(value)
        except BaseException as exc:  # whatever the hook's value raises: this call's error alone
            if not is_a(exc, (InvalidOutputError, OutputNotStorableError)):  # (raised by the value's
                exc = InvalidOutputError(  # own code, as a repr: read by its real type and name)
                    f"the reconcile hook's value cannot be stored: {type_name(exc)}: {error_text(exc)}"
                )
            self.fx.salvage(group, value, f"the reconcile hook's answer: {error_text(exc)}")  # the provider's
            self.fx.count("salvaged")  # paid answer, kept for an operator; the receipt stays uncertain
            self.p.exits.settle(group, exc)
            return
        batch = next(self.s.ids)
        self.s.batches[batch] = (group, text)
        if text is None:
            self.fx.resolve(batch, group.key, "rerun")
        else:
            self.fx.resolve(batch, group.key, "complete", EncodedOutput(text))

    def on_resolved(self, batch: int, error: BaseException | None, now: float) -> None:
        """The store took the reconcile hook's answer: reuse the output, or claim again
        (only for a caller still waiting: no caller, no provider call)."""
        found = self.s.batches.pop(batch, None)
        if found is None:
            return
        group, text = found
        if error is not None:
            self.p.exits.settle(group, error)
        elif text is None:
            if group.calls and not self.s.stopping:
                self.p.claims.claim([group], None)
            else:
                self.p.exits.settle(group, None)  # claimable again: the next caller runs it
        else:
            self.p.exits.settle(group, Done(text, "cached"))

    @staticmethod
    def uncertain(group: Group, receipt: Receipt) -> BaseException:
        why = f": {receipt.error}" if receipt.error else ""
        return UncertainOutcomeError(
            f"the outcome of {group.key} is uncertain (its request may have reached the provider){why}; "
            "resolve it with `tooldispatch receipts resolve KEY --rerun | --fail`",
            failure_kind=receipt.failure_kind,
        )
