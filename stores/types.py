"""Value types of the receipt store: receipts, claims, leases and fenced results.

All are frozen attrs classes. Times are float seconds since the Unix epoch, read
from the store's clock (see :mod:`stores.base`).
"""

from __future__ import annotations

import enum
from typing import Any

import attrs

from stores.money import Money
from stores.quoting import kept_input

__all__ = [
    "BatchRecord",
    "Claim",
    "ClaimDisposition",
    "ClaimMode",
    "ClaimRequest",
    "Completion",
    "Failure",
    "FailureKind",
    "FenceReport",
    "LeaseRef",
    "Owner",
    "Receipt",
    "ReceiptStatus",
    "Refusal",
    "RefusalReason",
    "ResolveAction",
]


class ReceiptStatus(str, enum.Enum):
    """Where a receipt is in its life."""

    PENDING = "pending"
    """Known but not owned: released by a suspension, free to claim."""
    QUEUED = "queued"
    """Claimed under a lease, not yet admitted to the provider."""
    RUNNING = "running"
    """Marked running by its lease holder: a provider call may be in flight."""
    COMPLETED = "completed"
    """Has an output: the cache entry."""
    FAILED = "failed"
    """The call failed; ``error`` and ``failure_kind`` say why."""
    SKIPPED = "skipped"
    """Deliberately not run (treated like pending by claims)."""
    UNCERTAIN = "uncertain"
    """A call of a tool that is not retry-safe may have reached the provider (timed out
    or cut off after sending, or its owner was lost while it ran): never re-run
    silently. Claims answer ``UNCERTAIN`` until ``ReceiptStore.resolve``; one that kept
    a previous output (a refresh) is ``REUSED`` by ordinary claims meanwhile."""


class ClaimMode(str, enum.Enum):
    """How a claim treats completed and failed receipts (docs/receipts.md, Claims and dispositions)."""

    NORMAL = "normal"
    RETRY_FAILED = "retry_failed"
    FORCE_REFRESH = "force_refresh"


class ClaimDisposition(str, enum.Enum):
    """What a claim found, and so what the caller must do next."""

    CLAIMED = "claimed"
    """The caller holds a lease (status queued) and must mark it running."""
    REUSED = "reused"
    """A fresh completed receipt: its output is the result. Also the last good output of
    a refresh whose own outcome is uncertain (the receipt's status is ``uncertain``) for
    a normal or retry_failed claim."""
    RUNNING = "running"
    """Another live lease holds it: wait for its output."""
    BLOCKED_ACTIVE_LEASE = "blocked_active_lease"
    """Force refresh met a live lease: wait, then claim again with force."""
    FAILED = "failed"
    """A failed receipt in normal mode: the recorded error is the answer."""
    UNCERTAIN = "uncertain"
    """An uncertain receipt (no lease; any mode, or only a forced or stale re-run of one
    that kept a previous output): ask the tool's reconcile hook by the receipt's
    idempotency key, or refuse the call until an operator resolves it."""


class FailureKind(str, enum.Enum):
    """Why a call failed; decides whether a later claim may run it again."""

    TIMEOUT = "timeout"
    RATE_LIMITED = "rate_limited"
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    INVALID_INPUT = "invalid_input"
    OUTPUT_TOO_LARGE = "output_too_large"
    """The provider answered, but the output is over ``MAX_OUTPUT_BYTES``: it went to
    the salvage log, and the receipt holds no output. A normal claim answers FAILED
    (the error text names the salvage); retry_failed and force_refresh run it again."""

    @classmethod
    def _missing_(cls, value: object) -> FailureKind:
        """A kind this code does not know (written by a newer version) reads as
        ``PERMANENT``: never retried silently, so never paid for again."""
        return cls.PERMANENT

    @property
    def retryable(self) -> bool:
        """True for timeouts, rate limiting and transient provider errors."""
        return self in (FailureKind.TIMEOUT, FailureKind.RATE_LIMITED, FailureKind.TRANSIENT)


@attrs.frozen
class Owner:
    """The run that holds a lease: fencing (and ``==``) compares run id and attempt.

    The process fields say where the holder runs. A claim that meets a live lease whose
    holder ran on this host (same boot, same pid namespace) in a process that no
    longer exists takes it over at once instead of waiting for the TTL. A store fills
    them from :func:`stores.current_process_identity` when a claim leaves them None.
    """

    run_id: str
    """The run's id."""
    run_attempt: int = 1
    """Which retry of the run (1 for the first)."""
    host: str | None = attrs.field(default=None, eq=False)
    """Host name plus a digest of the boot id and pid namespace (pids compare only there)."""
    pid: int | None = attrs.field(default=None, eq=False)
    """The holder's process id."""
    started_at: float | None = attrs.field(default=None, eq=False)
    """The holder process's start time, epoch seconds (tells a reused pid apart)."""


@attrs.frozen
class ClaimRequest:
    """One receipt to claim: the key plus what a new receipt row records."""

    key: str
    """The receipt key (sha256 hex, see :func:`stores.keys.receipt_key`)."""
    scope: str
    """The play's name that namespaces the receipt."""
    tool_id: str
    """The tool the call runs."""
    input_hash: str
    """sha256 hex of the canonical input, to detect a mismatch under one key."""
    retry_safe: bool = True
    """False for a tool that must not be re-sent blindly: a receipt found ``running``
    under a lost lease (expired, or its holder's process gone) is then recorded
    ``uncertain`` and answered ``UNCERTAIN`` instead of being claimed."""
    lease_id: str | None = None
    """The lease id a new lease takes (None: the store makes one). A claim sent again
    after its connection dropped sends the ids of its first attempt: a key that attempt
    did take (still leased under this id to the same owner, queued or running, live or
    lapsed) is answered ``CLAIMED`` as it stands, nothing written, as a retried fenced
    write that already landed counts as applied."""
    input_text: str | None = attrs.field(default=None, converter=kept_input)
    """What the receipt keeps of the input, to show what it was for: the canonical input
    (RFC 8785 JSON), or the readable digest its tool chose (``Tool.keep_input``); ``""``
    keeps nothing. Cut to ``stores.quoting.INPUT_TEXT_MAX_CHARS``. A claim that writes the
    receipt stores it; None leaves what the receipt holds (a salvage replay)."""


@attrs.frozen
class LeaseRef:
    """A lease on one receipt, as fenced operations name it."""

    key: str
    """The receipt key."""
    lease_id: str
    """The lease id the claim returned."""


@attrs.frozen
class Completion:
    """One output to store under a held lease."""

    key: str
    """The receipt key."""
    lease_id: str
    """The lease the completer holds."""
    output: Any
    """The tool's output: any JSON value (stored through the cattrs/orjson converter)."""
    generation: int | None = attrs.field(default=None, eq=False)
    """The receipt generation the output was produced under (not written: a salvage entry
    keeps it, to order several entries of one call)."""
    replaces: float | None = attrs.field(default=None, eq=False)
    """``completed_at`` of the stored output this call refreshes, as its claim read it
    (not written: a salvage entry keeps it, so a replay knows the stored output is the
    older one when it is still that one)."""
    cost: Money | None = None
    """The price paid for this call's answer, written with the output (``Receipt.cost``);
    None: unknown, or free."""


@attrs.frozen
class Failure:
    """One failure to record under a held lease."""

    key: str
    """The receipt key."""
    lease_id: str
    """The lease the caller holds."""
    error: str
    """Human-readable error text."""
    failure_kind: FailureKind
    """Why it failed (decides retries)."""


@attrs.frozen
class Receipt:
    """The durable record of one call (one row of table ``receipts``)."""

    key: str
    org_id: str
    scope: str
    tool_id: str
    status: ReceiptStatus
    input_hash: str
    output: Any = None
    """Decoded JSON output (completed receipts only)."""
    error: str | None = None
    failure_kind: FailureKind | None = None
    lease_id: str | None = None
    lease_owner_run_id: str | None = None
    lease_owner_attempt: int | None = None
    lease_expires_at: float | None = None
    """Epoch seconds on the store's clock; None when no lease is held."""
    attempts: int = 0
    """Sends of its request: how many times the receipt has been claimed for execution,
    each claim one attempt at sending it (a takeover after a crash included; in-call
    retries not)."""
    created_at: float = 0.0
    updated_at: float = 0.0
    completed_at: float | None = None
    """When the output was stored. Kept while a force refresh (or a re-run of a stale
    receipt) holds a lease, and when that refresh ends ``uncertain``: the previous output
    stays until a new one is persisted."""
    generation: int = 1
    """Execution generation: 1 for a new receipt, +1 when a completed (forced or stale)
    or failed receipt is claimed again; unchanged when a lost owner's lease is taken
    over or a released receipt is claimed. The provider idempotency key derives from
    (key, generation), so a crashed attempt's retry sends the same key."""
    lease_owner_host: str | None = None
    lease_owner_pid: int | None = None
    lease_owner_started_at: float | None = None
    input_text: str | None = None
    """What the call was for, as its claim recorded it (``ClaimRequest.input_text``): the
    canonical input (at most ``stores.quoting.INPUT_TEXT_MAX_CHARS`` characters), the
    tool's readable digest of it, ``""`` (the tool keeps nothing), or None (a receipt
    written before schema v3, or by a salvage replay)."""
    batch_key: str | None = None
    """The ``Idempotency-Key`` of the batch request this execution was (or is about to
    be) sent in, as recorded by ``mark_running_many`` (a :class:`BatchRecord`); None when
    it was sent alone, or not yet. Kept until a claim starts a new generation."""
    cost: Money | None = None
    """What the call whose output the receipt holds cost when it was paid (v5), as its
    completion said: replaced by each completion that stores an output (a refresh paid
    again), kept by everything else (claims, a failed or lost refresh, resolve). None:
    unknown or free, a receipt never completed, a receipt completed before schema v5,
    or a stored text that is not an amount of money (set by hand)."""

    @property
    def owner(self) -> Owner | None:
        """The lease holder (with its process identity when recorded), or None."""
        if self.lease_owner_run_id is None:
            return None
        return Owner(
            self.lease_owner_run_id,
            self.lease_owner_attempt or 0,
            self.lease_owner_host,
            self.lease_owner_pid,
            self.lease_owner_started_at,
        )

    def lease_live(self, now: float) -> bool:
        """True while a lease is held and has not expired at ``now``."""
        return self.lease_expires_at is not None and self.lease_expires_at > now


@attrs.frozen
class BatchRecord:
    """What one request of a batch tool carried, recorded durably before it is sent
    (``ReceiptStore.mark_running_many``), so that after a crash, a takeover or a retry
    exactly that request can be sent again under the same key.

    A request of a single member (a batch tool's call sent alone) is recorded too: it
    must go alone again, never inside a batch of other members.
    """

    key: str
    """The ``Idempotency-Key`` the request carries (a batch key, or the single member's
    provider idempotency key); unique per org."""
    tool_id: str
    """The tool whose request it is."""
    members: tuple[str, ...]
    """The members' receipt keys, in the request's order (distinct)."""
    inputs: tuple[str | None, ...]
    """Each member's input as sent, in the same order, as
    :func:`stores.codec.encode_output` writes JSON (dict order kept); None for a member
    whose tool keeps no raw input in the store (``Tool.keep_input`` not True): the request
    is then rebuilt from the inputs of the calls that take it over, which match the input
    hash on that member's receipt."""

    def __attrs_post_init__(self) -> None:
        if len(self.members) != len(self.inputs) or not self.members:
            raise ValueError("a batch record needs one input per member, and at least one member")
        if len(set(self.members)) != len(self.members):
            raise ValueError("a batch record names each member once")


@attrs.frozen
class Claim:
    """The answer to one claim: a disposition and the receipt as it now stands."""

    disposition: ClaimDisposition
    receipt: Receipt
    batch: BatchRecord | None = None
    """Set on a ``CLAIMED`` answer that took over a receipt recorded in a batch request
    (its ``batch_key``): the request to send again, whole, before anything else."""
    members: tuple[Claim, ...] = ()
    """With :attr:`batch`: every member's claim (``CLAIMED``, a new lease each), in the
    request's order; the claimed key's own is among them. All were taken together in the
    one transaction, or none was (the members are then ``UNCERTAIN``)."""


class RefusalReason(str, enum.Enum):
    """Why a fenced operation changed nothing for a key."""

    LEASE_LOST = "lease_lost"
    """The lease id or owner does not match: another holder, or released."""
    COMPLETED_BY_OTHER = "completed_by_other"
    """Already completed; the refusal carries the stored receipt."""
    MISSING = "missing"
    """No receipt with that key in this org."""
    OUTPUT_TOO_LARGE = "output_too_large"
    """The serialised output exceeds the store's per-output cap."""
    INVALID_OUTPUT = "invalid_output"
    """The output is not plain JSON (a set, bytes, a tuple...): permanent by nature."""
    OUTPUT_NOT_STORABLE = "output_not_storable"
    """JSON the store cannot hold exactly (too deep, too big an integer): salvage it."""


class ResolveAction(str, enum.Enum):
    """An operator's (or a reconcile hook's) decision on an ``uncertain`` receipt."""

    RERUN = "rerun"
    """Run it again: the receipt becomes claimable (same generation, so a provider that
    honours idempotency keys answers a call that did go through from its records). A
    member of a recorded batch request is freed from it (``batch_key`` cleared): it goes
    in a new request, as the one who decided asked."""
    FAIL = "fail"
    """Record it failed (kind permanent): later calls are refused with that error."""
    COMPLETE = "complete"
    """The provider did act: store the output it reported (reconcile hook)."""


@attrs.frozen
class Refusal:
    """Why one key of a fenced operation was left unchanged."""

    reason: RefusalReason
    message: str
    receipt: Receipt | None = None
    """The receipt as stored, when there is one."""


@attrs.frozen
class FenceReport:
    """Result of a fenced bulk operation.

    ``applied`` lists the keys changed (request order); ``refused`` maps every other
    key to why nothing changed for it.
    """

    applied: tuple[str, ...] = ()
    refused: dict[str, Refusal] = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        """True when every key was applied."""
        return not self.refused
