"""The call lifecycle's messages: what a tool queue actor is told.

Calls submitted and cancelled; facts answering the lifecycle's requests (each
:class:`Answered` carries the request's ``batch`` number, a ``value`` and an ``error``,
exactly one of which is meaningful); the lifecycle's timers. Re-exported by
:mod:`actors.messages`.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = [
    "Answered",
    "CallCancelled",
    "CleanupDue",
    "CompletionsPersisted",
    "CompletionsWritten",
    "DeadlineDue",
    "FailuresRecorded",
    "ForgetMemo",
    "LatchTripped",
    "PollDue",
    "ReceiptsChanged",
    "ReceiptsClaimed",
    "ReceiptsRead",
    "ReceiptsReleased",
    "Reconciled",
    "RememberOutputs",
    "Resolved",
    "RetryCharged",
    "RetryDue",
    "RunningMarked",
    "SlotsGranted",
    "StoreCall",
    "SubmitCalls",
    "TripLatch",
    "UnitFinished",
    "WaitDue",
]


@attrs.frozen(kw_only=True)
class Answered:
    """Base of the facts that answer one of the lifecycle's requests."""

    batch: int
    """Which request (the number the lifecycle gave it)."""
    value: Any
    """The answer (None on error)."""
    error: BaseException | None
    """Why the request failed, or None."""


@attrs.frozen(kw_only=True)
class SubmitCalls:
    """Queue calls of one tool (``execute`` sends one, ``execute_many`` many)."""

    calls: tuple[Any, ...]
    """:class:`actors.lifecycle.calls.Call` each (input snapshot, key, mode, reply future)."""


@attrs.frozen(kw_only=True)
class ForgetMemo:
    """Drop the tool's memo: receipts were purged (by this process or another)."""


@attrs.frozen(kw_only=True)
class CallCancelled:
    """The caller gave up on a call (``future.cancel()``, an asyncio cancellation)."""

    call: Any
    """The :class:`actors.lifecycle.calls.Call`."""


@attrs.frozen(kw_only=True)
class ReceiptsClaimed(Answered):
    """Fact: a bulk claim answered.

    ``batch``: which claim request. ``value``: list of stores.Claim, request order (None on error).
    ``error``: why the claim failed, or None.
    """


@attrs.frozen(kw_only=True)
class ReceiptsRead(Answered):
    """Fact: a poll of other owners' receipts answered (a plain read).

    ``batch``: which poll. ``value``: list of stores.Receipt or None, request order (None on error).
    ``error``: why the read failed, or None.
    """


@attrs.frozen(kw_only=True)
class Reconciled(Answered):
    """Fact: a tool's reconcile hook answered for an uncertain receipt.

    ``batch``: which request. ``value``: the output the provider reports, or
    ``actors.tool.NOT_DONE``. ``error``: what the hook raised, or None.
    """


@attrs.frozen(kw_only=True)
class Resolved(Answered):
    """Fact: the store decided an uncertain receipt (rerun or complete).

    ``batch``: which request. ``value``: the receipt as it now stands. ``error``: why the store
    refused, or None.
    """


@attrs.frozen(kw_only=True)
class ReceiptsReleased(Answered):
    """Fact: receipts were given back (pending), or the release failed (leases expire).

    ``batch``: which release. ``value``: stores.FenceReport (None on error). ``error``: why the
    release failed, or None.
    """


@attrs.frozen(kw_only=True)
class RunningMarked(Answered):
    """Fact: admitted units' receipts were marked running (fenced).

    ``batch``: which admission. ``value``: stores.FenceReport (None on error). ``error``: why the
    write failed, or None.
    """


@attrs.frozen(kw_only=True)
class FailuresRecorded(Answered):
    """Fact: failures were recorded (fenced bulk write).

    ``batch``: which write. ``value``: stores.FenceReport (None on error). ``error``: why the write
    failed, or None.
    """


@attrs.frozen(kw_only=True)
class SlotsGranted:
    """Fact: the governor granted slots (or refused: budget, stop, provider down)."""

    value: Any
    """Number of slots granted (None on refusal)."""
    error: BaseException | None
    """Why nothing was granted, or None."""


@attrs.frozen(kw_only=True)
class RetryCharged:
    """Fact: the retry budget was charged for a unit's next attempt (or refused)."""

    unit: int
    """The unit id."""
    value: Any
    """True when charged."""
    error: BaseException | None
    """BudgetExceededError, or None."""


@attrs.frozen(kw_only=True)
class UnitFinished:
    """Fact: a provider call returned on the worker pool."""

    unit: int
    """The unit id."""
    attempt: int
    """Which attempt (1 first)."""
    members: Any
    """Per group, in unit order: (encoded output text, None) or (None, exception); None
    when the whole call failed."""
    error: BaseException | None
    """The call's error (for every member), or None."""
    sent_at: float | None = None
    """``time.monotonic()`` when the request went out."""
    relayed: tuple[BaseException, ...] = ()
    """The errors (``error``, or members' outcomes) that came out of a nested call's future
    inside the tool's function: that call's errors, passed on; the tool's own request went
    out (``actors.runtime.nesting.relayed_here``)."""
    withdrawn: str = ""
    """Not sent, and why (``actors.worker.launch.WithdrawKind``): the last check before the
    request refused it (``error`` is the callers' answer); empty when it was sent."""


@attrs.frozen(kw_only=True)
class CompletionsPersisted(Answered):
    """Fact: the completion flusher settled outputs (persisted, salvaged, ...).

    ``batch``: which request. ``value``: receipt key -> FlushOutcome (None on error). ``error``: why
    the flusher failed, or None.
    """


@attrs.frozen(kw_only=True)
class CompletionsWritten(Answered):
    """Fact: the store answered a tool queue actor's own write of outputs (``value``: its
    FenceReport). The happy path: a write that fails goes on in the completion flusher,
    whose answer is a :class:`CompletionsPersisted` like any other."""


@attrs.frozen(kw_only=True)
class PollDue:
    """Timer: look at the receipts other owners hold again."""

    keys: tuple[str, ...]
    """The waiting groups' receipt keys."""


@attrs.frozen(kw_only=True)
class DeadlineDue:
    """Timer: the deadline of running units passed."""

    units: tuple[int, ...]
    """The ids of the units sent with the same timeout while one message was handled
    (one timer for them all)."""


@attrs.frozen(kw_only=True)
class WaitDue:
    """Timer: a caller's timeout may have passed while its key waits (on another owner's
    receipt, or on a reconcile hook)."""

    keys: tuple[str, ...]
    """The receipt keys waited on (one timer for those due at once)."""


@attrs.frozen(kw_only=True)
class RetryDue:
    """Timer: a unit's back-off before its next attempt elapsed."""

    unit: int
    """The unit id."""


@attrs.frozen(kw_only=True)
class StoreCall:
    """Run one receipt store method on the store actor; the answer goes to ``reply``."""

    method: str
    """The :class:`stores.ReceiptStore` method name."""
    args: tuple[Any, ...]
    """Positional arguments."""
    kwargs: dict[str, Any]
    """Keyword arguments."""
    reply: Any
    """A future or :class:`actors.runtime.actor.Reply`."""


@attrs.frozen(kw_only=True)
class TripLatch:
    """Open the persistence latch (recording a failure itself failed)."""

    reason: str
    """Why."""
    reply: Any = None
    """Told :class:`LatchTripped` once the latch is tripped (or None)."""


@attrs.frozen(kw_only=True)
class LatchTripped(Answered):
    """Fact: the flusher tripped the latch (callers of the failed write may be answered).

    ``batch``: which failed write. ``value``: None. ``error``: None.
    """


@attrs.frozen(kw_only=True)
class CleanupDue:
    """Timer: try again to give back leases a failed store write left this process holding."""

    keys: tuple[str, ...]
    """Receipts to read back for leases a failed claim left (empty: see ``leases``)."""
    leases: tuple[Any, ...]
    """stores.LeaseRef each, to release again (empty: see ``keys``)."""
    attempt: int
    """Which attempt this is (1 the first retry)."""


@attrs.frozen(kw_only=True)
class ReceiptsChanged:
    """Fact: the store heard that receipts waited on may have changed: read them now."""

    keys: tuple[str, ...]
    """Receipt keys this actor watches, in the org that changed."""


@attrs.frozen(kw_only=True)
class RememberOutputs:
    """Outputs a caller read from the store (completed receipts): keep them in the memo."""

    entries: tuple[tuple[str, str], ...]
    """(receipt key, encoded output text) per receipt."""
