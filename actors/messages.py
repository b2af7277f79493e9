"""Typed messages exchanged by the actors.

Commands are imperative, facts past tense. A reply, when there is one, travels as a
pykka future inside the message (never a ``.get()`` inside ``on_receive`` on an actor
that may wait on the sender).

One catalogue: the actor-to-actor commands first, then the call lifecycle's own
messages (calls submitted, facts answering its requests, its timers).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, ClassVar

import attrs

from stores.money import Money
from stores.types import (
    BatchRecord,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    LeaseRef,
    Owner,
    ResolveAction,
)

__all__ = [
    "AcquireSlots",
    "Answered",
    "BackpressureReported",
    "CallCancelled",
    "ChargeBudget",
    "ClaimHeld",
    "ClaimReceipts",
    "CleanupDue",
    "CompleteReceipts",
    "CompletionsPersisted",
    "CompletionsWritten",
    "DeadlineDue",
    "DrainDue",
    "FailuresRecorded",
    "FencedWrite",
    "FlushCompletions",
    "FlushDue",
    "ForgetMemo",
    "GovernorWake",
    "LatchTripped",
    "LeasesLost",
    "MarkRunning",
    "PollDue",
    "ReadPurgeEpoch",
    "ReadReceipts",
    "ReceiptsChanged",
    "ReceiptsClaimed",
    "ReceiptsRead",
    "ReceiptsReleased",
    "Reconciled",
    "RecordFailures",
    "RecordUncertain",
    "RefundBudget",
    "RegisterLeases",
    "ReleaseReceipts",
    "ReleaseSlots",
    "RememberOutputs",
    "ResolveReceipt",
    "Resolved",
    "RetryCharged",
    "RetryDue",
    "RetryWrite",
    "RunningMarked",
    "SlotsGranted",
    "StopQueue",
    "StoreCommand",
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
    prices: tuple[Decimal, ...] = ()
    """Under a money budget: what each of the ``want`` requests is known to cost, in the
    order they go, in the budget's currency (a grant of n charges the first n)."""
    units: tuple[Mapping[str, float], ...] = ()
    """Under limits in units: what each of the ``want`` requests is expected to use."""
    patience_s: float | None = None
    """A spent quota holding the request longer than this refuses it (QuotaExhaustedError)."""
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
    unspent: Decimal = Decimal(0)
    """Money charged for these calls and not spent, in the budget's currency: given back
    to the money budgets (negative: what a call cost above its estimate)."""
    unsent_units: Mapping[str, float] = attrs.field(factory=dict)
    """Units taken for requests granted and never sent (``"requests"``: how many)."""
    usage: tuple[tuple[float, Mapping[str, float]], ...] = ()
    """Per answered request: (when granted, ``time.monotonic()``; real less estimated units)."""
    announced: tuple[tuple[float, tuple[Any, ...]], ...] = ()
    """Per answer that announced limits: (when its request was sent; its
    :class:`~actors.pacing.announced.Announcement` values)."""


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


# -- the call lifecycle's messages: what a tool queue actor is told --------------------


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
    """Calls of one tool wait in ``waiting``: take them all (the doorbell of the front
    door: sent by the put that found it empty; ``execute`` puts one call, ``execute_many``
    many, callers on other threads put theirs meanwhile)."""

    waiting: Any
    """An :class:`actors.runtime.gathering.Gathering` of
    :class:`actors.lifecycle.calls.Call` (input snapshot, key, mode, reply future)."""


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
class ClaimHeld:
    """Fact: the store is away, and the claim of ``batch`` is held to be tried again (told
    once, at its first failure; its :class:`ReceiptsClaimed` comes when it is answered, or
    at its callers' timeout). Calls drained meanwhile stop waiting for it."""

    batch: int
    cause: BaseException | None = None
    """The error its first attempt met (a StoreBusyError: another connection's lock)."""


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
    exempt: bool = False
    """The request was for nested calls' slots (not counted against the ceiling)."""


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
    replayed: bool = False
    """The tool said the provider answered from its record of an earlier request with
    the same idempotency key (``ToolContext.mark_replayed``): not billed again."""
    costs: tuple[Money | None, ...] = ()
    """Per member, in unit order, what its answer cost (``actors.worker.prices``); ()
    for an unpriced tool."""
    gated: tuple[str, float] | None = None
    """Its wait at the provider's send gate, when it waited: (``"pacing"`` or ``"pause"``,
    seconds)."""
    usage: Mapping[str, float] = attrs.field(factory=dict)
    """What the request really used, per unit (``Tool.units_used`` of its answered members,
    summed; what the tool reported with ``report_usage`` instead, unit by unit); {}: not known."""
    announced: tuple[Any, ...] = ()
    """The limits its answer announced (:class:`~actors.pacing.announced.Announcement`,
    oldest first), a 429's included."""


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


# -- to the receipt store actor: one command per store operation ------------------------
# Each runs the ReceiptStore method it names on the store actor; ``reply`` (a future or
# an actors.runtime.actor.Reply) gets its value or its error.


@attrs.frozen(kw_only=True)
class ClaimReceipts:
    """Claim receipts (``ReceiptStore.claim_many``); reply: list of Claim, request order.

    Refused with BudgetExceededError once the ``receipt_ops`` budget is spent.
    """

    org_id: str
    """The org."""
    requests: Sequence[ClaimRequest]
    """One per key."""
    owner: Owner
    """The claiming run."""
    lease_ttl_s: float
    """Lease lifetime, seconds from the store's now."""
    mode: ClaimMode = ClaimMode.NORMAL
    """Normal, retry_failed or force_refresh."""
    stale_after_s: float | None = None
    """Completed receipts older than this, seconds, are claimed again."""
    running: frozenset[str] = frozenset()
    """Keys to claim straight into running (left out for a store that cannot)."""
    reply: Any
    """Gets the claims."""
    retry_until: float = 0.0
    """``time.monotonic()`` until which a store that is away is tried again (0: its
    error is answered at once; :mod:`actors.store.outage`). A claim tried again must name
    its lease ids (``ClaimRequest.lease_id``)."""


@attrs.frozen(kw_only=True)
class FencedWrite(abc.ABC):
    """A fenced bulk write: ``method(org_id, <items>, owner, **extra)``; reply: FenceReport.

    Writes of one kind, org, owner and extra waiting together may be merged into one
    store call or committed together (:mod:`actors.store.merge`).
    """

    method: ClassVar[str]
    """The ReceiptStore method (the name crosses into ``ReceiptStore.write_together``)."""
    org_id: str
    """The org."""
    owner: Owner
    """The lease holder (the fence)."""
    reply: Any
    """Gets the FenceReport."""
    retry_until: float = 0.0
    """``time.monotonic()`` until which a store that is away is tried again (0: its
    error is answered at once; :mod:`actors.store.outage`)."""

    @property
    @abc.abstractmethod
    def items(self) -> Sequence[Any]:
        """The keyed items written (each has ``.key``)."""

    @abc.abstractmethod
    def with_items(self, items: list[Any]) -> FencedWrite:
        """The same write over ``items``."""

    def extra(self) -> dict[str, Any]:
        """The keyword arguments beyond (org_id, items, owner)."""
        return {}

    def store_call(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        """``(method, args, kwargs)``, as ``ReceiptStore.write_together`` takes it."""
        return self.method, (self.org_id, self.items, self.owner), self.extra()


@attrs.frozen(kw_only=True)
class MarkRunning(FencedWrite):
    """Move claimed receipts to running (``mark_running_many``), renewing their leases,
    and record the batch requests about to be sent (in the same transaction)."""

    method: ClassVar[str] = "mark_running_many"
    leases: Sequence[LeaseRef]
    """The leases held."""
    lease_ttl_s: float | None = None
    """Renew to now + this, seconds (None: leave the expiry)."""
    batches: tuple[BatchRecord, ...] = ()
    """The requests about to be sent, over members among ``leases`` (a store without
    ``capabilities.batch_records`` is given none)."""

    @property
    def items(self) -> Sequence[LeaseRef]:
        return self.leases

    def with_items(self, items: list[Any]) -> MarkRunning:
        return attrs.evolve(self, leases=items)

    def extra(self) -> dict[str, Any]:
        if self.batches:  # (only equal records merge: in practice, none)
            return {"lease_ttl_s": self.lease_ttl_s, "batches": self.batches}
        return {"lease_ttl_s": self.lease_ttl_s}


@attrs.frozen(kw_only=True)
class CompleteReceipts(FencedWrite):
    """Store outputs and mark receipts completed (``complete_many``)."""

    method: ClassVar[str] = "complete_many"
    completions: Sequence[Completion]
    """One per key."""

    @property
    def items(self) -> Sequence[Completion]:
        return self.completions

    def with_items(self, items: list[Any]) -> CompleteReceipts:
        return attrs.evolve(self, completions=items)


@attrs.frozen(kw_only=True)
class RecordFailures(FencedWrite):
    """Record failures and drop the leases (``fail_many``)."""

    method: ClassVar[str] = "fail_many"
    failures: Sequence[Failure]
    """One per key."""

    @property
    def items(self) -> Sequence[Failure]:
        return self.failures

    def with_items(self, items: list[Any]) -> RecordFailures:
        return attrs.evolve(self, failures=items)


@attrs.frozen(kw_only=True)
class RecordUncertain(FencedWrite):
    """Record uncertain outcomes and drop the leases (``mark_uncertain_many``)."""

    method: ClassVar[str] = "mark_uncertain_many"
    failures: Sequence[Failure]
    """One per key: the failure seen."""

    @property
    def items(self) -> Sequence[Failure]:
        return self.failures

    def with_items(self, items: list[Any]) -> RecordUncertain:
        return attrs.evolve(self, failures=items)


@attrs.frozen(kw_only=True)
class ReleaseReceipts(FencedWrite):
    """Give receipts back (``release``)."""

    method: ClassVar[str] = "release"
    leases: Sequence[LeaseRef]
    """The leases held."""

    @property
    def items(self) -> Sequence[LeaseRef]:
        return self.leases

    def with_items(self, items: list[Any]) -> ReleaseReceipts:
        return attrs.evolve(self, leases=items)


@attrs.frozen(kw_only=True)
class ReadReceipts:
    """Read receipts (``get_many``); reply: list of Receipt or None, key order."""

    org_id: str
    """The org."""
    keys: Sequence[str]
    """Receipt keys."""
    reply: Any
    """Gets the receipts."""
    retry_until: float = 0.0
    """``time.monotonic()`` until which a store that is away is tried again (0: its
    error is answered at once; :mod:`actors.store.outage`)."""


@attrs.frozen(kw_only=True)
class ResolveReceipt:
    """Decide an uncertain receipt (``resolve``); reply: the Receipt as it now stands, or None."""

    org_id: str
    """The org."""
    key: str
    """The receipt key."""
    action: ResolveAction
    """Rerun, fail or complete."""
    output: Any = None
    """The output for ``COMPLETE``."""
    note: str = ""
    """Text added to the recorded error for ``FAIL``."""
    reply: Any
    """Gets the receipt."""


@attrs.frozen(kw_only=True)
class ReadPurgeEpoch:
    """Read how many purges ever deleted receipts (``purge_epoch``); reply: int."""

    reply: Any
    """Gets the epoch."""


StoreCommand = ClaimReceipts | FencedWrite | ReadReceipts | ResolveReceipt | ReadPurgeEpoch
"""Every command the receipt store actor runs on its store."""


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
class LeasesLost:
    """Fact: a lease renewal found these receipts' leases taken by another owner."""

    keys: tuple[str, ...]
    """The receipt keys whose leases were lost."""


@attrs.frozen(kw_only=True)
class ReceiptsChanged:
    """Fact: the store heard that receipts waited on may have changed: read them now."""

    keys: tuple[str, ...]
    """Receipt keys this actor watches, in the org that changed."""


@attrs.frozen(kw_only=True)
class RememberOutputs:
    """Outputs a caller read from the store (completed receipts): keep them in the memo."""

    entries: tuple[tuple[str, str, Money | None], ...]
    """(receipt key, encoded output text, what it cost when paid: ``Receipt.cost``) per receipt."""
    forgets: int
    """The memo's :attr:`~actors.queue.memo.Memo.forgets` before the read: a purge seen
    since voids the read."""
    ahead_at: float | None = None
    """Read ahead of the calls at this time (monotonic seconds;
    :mod:`actors.queue.read_ahead`): kept by :meth:`~actors.queue.memo.Memo.keep_ahead`."""
