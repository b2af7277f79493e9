"""Typed messages exchanged by the actors.

Commands are imperative, facts past tense. A reply, when there is one, travels as a
pykka future inside the message (never a ``.get()`` inside ``on_receive`` on an actor
that may wait on the sender).
"""

from __future__ import annotations

from typing import Any

import attrs

from stores.types import LeaseRef, Owner

__all__ = [
    "AcquireSlots",
    "BackpressureReported",
    "CallCancelled",
    "ChargeBudget",
    "CompletionsFlushed",
    "CompletionsPersisted",
    "DeadlineDue",
    "DrainDue",
    "FailuresRecorded",
    "FlushCompletions",
    "FlushDue",
    "ForgetMemo",
    "GovernorWake",
    "GroupsSettled",
    "HeartbeatTick",
    "LatchTripped",
    "LeasesLost",
    "PollDue",
    "ReceiptsClaimed",
    "ReceiptsRead",
    "ReceiptsReleased",
    "Reconciled",
    "RegisterLeases",
    "ReleaseSlots",
    "RememberOutputs",
    "Resolved",
    "RetryDue",
    "RetryWrite",
    "RunningMarked",
    "SlotsGranted",
    "StopQueue",
    "StoreCall",
    "SubmitCall",
    "SubmitCalls",
    "TripLatch",
    "UnitFinished",
    "UnregisterLeases",
]


@attrs.frozen(kw_only=True)
class SubmitCall:
    """Queue one call on its tool's queue."""

    call: Any
    """The :class:`actors._calls.Call` (input, key, mode, reply future)."""


@attrs.frozen(kw_only=True)
class DrainDue:
    """The batch grace window ended (or a drain is wanted now)."""

    generation: int
    """Which window this timer belongs to; stale timers are ignored."""


@attrs.frozen(kw_only=True)
class GroupsSettled:
    """A drain finished some groups: resolve their owners and followers."""

    outcomes: list[tuple[str, Any]]
    """(receipt key, ToolResult-producing outcome or exception) per group."""


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
    """Most slots wanted; at least one is granted before the reply."""
    exempt: bool = False
    """A nested call (made by a running tool): not counted against the global ceiling
    nor the provider's max_concurrency (it borrows its waiting parent's slot); the
    provider's rate still applies."""
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
class HeartbeatTick:
    """Time to renew leases."""


@attrs.frozen(kw_only=True)
class LeasesLost:
    """A renewal found these leases gone (expired and taken)."""

    keys: tuple[str, ...]
    """Receipt keys whose lease is lost."""


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


# -- the call lifecycle (tool queue actor) -----------------------------------------------


@attrs.frozen(kw_only=True)
class SubmitCalls:
    """Queue calls of one tool (``execute`` sends one, ``execute_many`` many)."""

    calls: tuple[Any, ...]
    """:class:`actors._calls.Call` each (input snapshot, key, mode, reply future)."""


@attrs.frozen(kw_only=True)
class ForgetMemo:
    """Drop the tool's memo: receipts were purged (by this process or another)."""


@attrs.frozen(kw_only=True)
class CallCancelled:
    """The caller gave up on a call (``future.cancel()``, an asyncio cancellation)."""

    call: Any
    """The :class:`actors._calls.Call`."""


@attrs.frozen(kw_only=True)
class ReceiptsClaimed:
    """Fact: a bulk claim answered."""

    batch: int
    """Which claim request."""
    value: Any
    """list of stores.Claim, request order (None on error)."""
    error: BaseException | None
    """Why the claim failed, or None."""


@attrs.frozen(kw_only=True)
class ReceiptsRead:
    """Fact: a poll of other owners' receipts answered (a plain read)."""

    batch: int
    """Which poll."""
    value: Any
    """list of stores.Receipt or None, request order (None on error)."""
    error: BaseException | None
    """Why the read failed, or None."""


@attrs.frozen(kw_only=True)
class Reconciled:
    """Fact: a tool's reconcile hook answered for an uncertain receipt."""

    batch: int
    """Which request."""
    value: Any
    """The output the provider reports, or ``actors.tool.NOT_DONE``."""
    error: BaseException | None
    """What the hook raised, or None."""


@attrs.frozen(kw_only=True)
class Resolved:
    """Fact: the store decided an uncertain receipt (rerun or complete)."""

    batch: int
    """Which request."""
    value: Any
    """The receipt as it now stands."""
    error: BaseException | None
    """Why the store refused, or None."""


@attrs.frozen(kw_only=True)
class ReceiptsReleased:
    """Fact: receipts were given back (pending), or the release failed (leases expire)."""

    batch: int
    """Which release."""
    value: Any
    """stores.FenceReport (None on error)."""
    error: BaseException | None
    """Why the release failed, or None."""


@attrs.frozen(kw_only=True)
class RunningMarked:
    """Fact: admitted units' receipts were marked running (fenced)."""

    batch: int
    """Which admission."""
    value: Any
    """stores.FenceReport (None on error)."""
    error: BaseException | None
    """Why the write failed, or None."""


@attrs.frozen(kw_only=True)
class FailuresRecorded:
    """Fact: failures were recorded (fenced bulk write)."""

    batch: int
    """Which write."""
    value: Any
    """stores.FenceReport (None on error)."""
    error: BaseException | None
    """Why the write failed, or None."""


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


@attrs.frozen(kw_only=True)
class CompletionsPersisted:
    """Fact: the completion flusher settled outputs (persisted, salvaged, ...)."""

    batch: int
    """Which request."""
    value: Any
    """receipt key -> FlushOutcome (None on error)."""
    error: BaseException | None
    """Why the flusher failed, or None."""


@attrs.frozen(kw_only=True)
class PollDue:
    """Timer: look at the receipts other owners hold again."""

    keys: tuple[str, ...]
    """The waiting groups' receipt keys."""


@attrs.frozen(kw_only=True)
class DeadlineDue:
    """Timer: a running unit's deadline passed."""

    unit: int
    """The unit id."""


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
    """A future or :class:`actors._runtime.Reply`."""


@attrs.frozen(kw_only=True)
class TripLatch:
    """Open the persistence latch (recording a failure itself failed)."""

    reason: str
    """Why."""
    reply: Any = None
    """Told :class:`LatchTripped` once the latch is tripped (or None)."""


@attrs.frozen(kw_only=True)
class LatchTripped:
    """Fact: the flusher tripped the latch (callers of the failed write may be answered)."""

    batch: int
    """Which failed write."""
    value: Any
    """None."""
    error: BaseException | None
    """None."""


@attrs.frozen(kw_only=True)
class RememberOutputs:
    """Outputs a caller read from the store (completed receipts): keep them in the memo."""

    entries: tuple[tuple[str, str], ...]
    """(receipt key, encoded output text) per receipt."""
