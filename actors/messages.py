"""Typed messages exchanged by the actors.

Commands are imperative, facts past tense. A reply, when there is one, travels as a
pykka future inside the message (never a ``.get()`` inside ``on_receive`` on an actor
that may wait on the sender).

The actor-to-actor commands live here; the call lifecycle's own messages (calls
submitted, facts answering its requests, its timers) live in
:mod:`actors.lifecycle.messages` and are re-exported here.
"""

from __future__ import annotations

from typing import Any

import attrs

from actors.lifecycle.messages import (
    Answered,
    CallCancelled,
    CleanupDue,
    CompletionsPersisted,
    CompletionsWritten,
    DeadlineDue,
    FailuresRecorded,
    ForgetMemo,
    LatchTripped,
    PollDue,
    ReceiptsChanged,
    ReceiptsClaimed,
    ReceiptsRead,
    ReceiptsReleased,
    Reconciled,
    RememberOutputs,
    Resolved,
    RetryCharged,
    RetryDue,
    RunningMarked,
    SlotsGranted,
    StoreCall,
    SubmitCalls,
    TripLatch,
    UnitFinished,
    WaitDue,
)
from stores.types import LeaseRef, Owner

__all__ = [
    "AcquireSlots",
    "Answered",
    "BackpressureReported",
    "CallCancelled",
    "ChargeBudget",
    "CleanupDue",
    "CompletionsFlushed",
    "CompletionsPersisted",
    "CompletionsWritten",
    "DeadlineDue",
    "DrainDue",
    "FailuresRecorded",
    "FlushCompletions",
    "FlushDue",
    "ForgetMemo",
    "GovernorWake",
    "LatchTripped",
    "PollDue",
    "ReceiptsChanged",
    "ReceiptsClaimed",
    "ReceiptsRead",
    "ReceiptsReleased",
    "Reconciled",
    "RefundBudget",
    "RegisterLeases",
    "ReleaseSlots",
    "RememberOutputs",
    "Resolved",
    "RetryCharged",
    "RetryDue",
    "RetryWrite",
    "RunningMarked",
    "SlotsGranted",
    "StopQueue",
    "StoreCall",
    "SubmitCalls",
    "TripLatch",
    "UnitFinished",
    "UnregisterLeases",
    "WaitDue",
    "WatchReceipts",
]


@attrs.frozen(kw_only=True)
class DrainDue:
    """The batch grace window ended (or a drain is wanted now)."""

    generation: int
    """Which window this timer belongs to; stale timers are ignored."""


@attrs.frozen(kw_only=True)
class StopQueue:
    """Reject everything still queued with a cancellation error."""

    reply: Any
    """Resolved with the number of calls rejected."""
    idle: Any = None
    """Resolved once nothing of this tool is running, persisting or held (or None)."""


@attrs.frozen(kw_only=True)
class AcquireSlots:
    """Ask the governor for up to ``want`` slots of one (org, provider)."""

    org_id: str
    """The org whose bucket is charged."""
    provider: str
    """The provider whose pacing applies."""
    want: int
    """Most slots wanted; at least one is granted before the reply (unless ``immediate``)."""
    exempt: bool = False
    """A nested call (made by a running tool): not counted against the global ceiling
    nor the provider's max_concurrency (it borrows its waiting parent's slot); the
    provider's rate still applies."""
    immediate: bool = False
    """Slots asked before a claim: granted now or not at all (0), see
    :meth:`actors.governor.decisions.Governor.acquire`."""
    reply: Any
    """Resolved with the number granted, or with BudgetExceededError/CallCancelledError."""


@attrs.frozen(kw_only=True)
class ReleaseSlots:
    """Give slots back after provider calls ended."""

    org_id: str
    """The org."""
    provider: str
    """The provider."""
    count: int
    """How many slots."""
    successes: int = 0
    """How many of those calls succeeded (AIMD additive increase; closes the circuit)."""
    unavailable: int = 0
    """How many failed as unavailable: connection errors, 5xx, timeouts (the circuit)."""
    answered: int | None = None
    """How many the provider answered, successes included (None: ``successes``)."""
    exempt: bool = False
    """The slots were nested calls' (see AcquireSlots.exempt)."""
    refunds: int = 0
    """Slots under which nothing was sent: their provider_calls charge is given back."""
    sent_at: tuple[float, ...] = ()
    """When the successes' requests went out (``time.monotonic()``), where known: an
    unknown limit is estimated from what was *sent* before a 429."""


@attrs.frozen(kw_only=True)
class BackpressureReported:
    """A provider answered 429 / Retry-After."""

    org_id: str
    """The org."""
    provider: str
    """The provider."""
    retry_after: Any
    """The raw Retry-After value (delta-seconds, HTTP-date, garbage or None)."""
    sent_at: float | None = None
    """When the request that got the 429 was sent (``time.monotonic()``), if known."""


@attrs.frozen(kw_only=True)
class ChargeBudget:
    """Charge a budget (``retries`` or ``receipt_ops``)."""

    kind: str
    """Which budget."""
    amount: int
    """How much."""
    reply: Any
    """Resolved True, or with BudgetExceededError."""


@attrs.frozen(kw_only=True)
class RefundBudget:
    """Give back a charge that bought nothing (a retry charged, then never sent)."""

    kind: str
    """Which budget."""
    amount: int
    """How much (never below nothing spent)."""


@attrs.frozen(kw_only=True)
class GovernorWake:
    """A pacing timer fired: grant what can be granted now."""


@attrs.frozen(kw_only=True)
class RegisterLeases:
    """Renew these leases every heartbeat until unregistered or past ``deadline``."""

    token: int
    """Registration handle, for unregistering."""
    org_id: str
    """The org."""
    owner: Owner
    """The lease holder."""
    leases: tuple[LeaseRef, ...]
    """The leases to renew."""
    lease_ttl_s: float
    """TTL applied at each renewal, seconds."""
    deadline: float
    """Monotonic time after which renewals stop (the call's hard deadline)."""
    lost: Any = None
    """A threading.Event set when any of these leases is found lost (or None)."""
    on_lost: Any = None
    """``on_lost(keys)``, called on the heartbeat actor's thread with the receipt keys
    whose lease a renewal found lost (it should only ``tell`` the owner)."""


@attrs.frozen(kw_only=True)
class UnregisterLeases:
    """Stop renewing a registration."""

    token: int
    """The handle given at registration."""
    keys: tuple[str, ...] | None = None
    """Only these receipt keys (None: the whole registration)."""


@attrs.frozen(kw_only=True)
class FlushCompletions:
    """Persist these outputs (bulk, with retries, recovery and salvage)."""

    org_id: str
    """The org."""
    owner: Owner
    """The lease holder."""
    entries: tuple[Any, ...]
    """stores.Completion per member."""
    tool_id: str
    """The tool (for salvage entries)."""
    input_hashes: dict[str, str]
    """Receipt key -> input hash (for salvage entries)."""
    reply: Any
    """Resolved with dict key -> FlushOutcome."""
    failed: str = ""
    """Not empty: the error of a first write its tool queue actor made itself (the happy
    path writes without the flusher); the ladder goes on from there."""


@attrs.frozen(kw_only=True)
class FlushDue:
    """Write what is buffered (or retry a write whose back-off elapsed)."""


@attrs.frozen(kw_only=True)
class CompletionsFlushed:
    """Fact: a flush ended (for observers and tests)."""

    persisted: int
    """Members whose receipts are completed."""
    salvaged: int
    """Members kept in salvage."""


@attrs.frozen(kw_only=True)
class RetryWrite:
    """A completion write's back-off elapsed: try it again."""

    chunk_id: int
    """Which pending write."""


@attrs.frozen(kw_only=True)
class WatchReceipts:
    """To the receipt store actor: ``ref`` waits on (or, ``watch`` False, no longer waits on)
    other owners' receipts ``keys`` of ``org_id``; tell it when the store hears of a change."""

    org_id: str
    keys: tuple[str, ...]
    ref: Any
    """The tool queue actor told :class:`ReceiptsChanged`."""
    watch: bool = True
