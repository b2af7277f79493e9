"""Calls, groups and units: the data the call lifecycle moves through its states.

A :class:`Call` is one ``execute``. Calls sharing a receipt key form a :class:`Group`
(one execution, one receipt). A :class:`Unit` is one provider call: a single group,
or the members of one compiled batch. What a group or unit holds (a lease, a slot, a
heartbeat registration) is recorded on it, so the lifecycle can release it in one
place whichever way it leaves (the house style: the life of a call).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import attrs

from actors.lifecycle.states import GroupState, check_transition
from actors.tool import Tool
from stores.money import Money
from stores.types import BatchRecord, ClaimMode, LeaseRef, Receipt

__all__ = [
    "Call",
    "Group",
    "GroupState",
    "OwnerWait",
    "Reread",
    "Role",
    "Unit",
    "note_wait",
    "patience_s",
    "strongest_mode",
]

_MODE_RANK = {ClaimMode.NORMAL: 0, ClaimMode.RETRY_FAILED: 1, ClaimMode.FORCE_REFRESH: 2}


def strongest_mode(modes: Iterable[ClaimMode]) -> ClaimMode:
    """force_refresh beats retry_failed beats normal."""
    return max(modes, key=_MODE_RANK.__getitem__)


def patience_s(groups: Iterable[Group]) -> float:
    """How long a store request made for ``groups`` rides out an outage of the store: the
    largest own ``timeout_s`` of their callers, seconds from the request (0 when no caller
    is left: answered at once)."""
    return max((c.timeout_s for g in groups for c in g.calls), default=0.0)


def note_wait(groups: Iterable[Group], reason: str, since: float, now: float) -> None:
    """Tell the trace of each caller of ``groups`` (telemetry on) that it waited for
    ``reason`` from ``since`` (or from when it came, if later: it joined the wait) to
    ``now`` (``time.monotonic()``)."""
    for group in groups:
        for call in group.calls:
            if call.trace is not None:
                call.trace.wait(reason, max(since, call.submitted_at), now)


def mode_covers(running: ClaimMode, wanted: ClaimMode) -> bool:
    """Whether a call in mode ``wanted`` may share an execution claimed in ``running``:
    a forced refresh or a retry of a failure never takes a normal call's answer."""
    return _MODE_RANK[running] >= _MODE_RANK[wanted]


class Role(str, enum.Enum):
    """How a call relates to its group's execution (decides its ``execution`` kind)."""

    OWNER = "owner"
    """The call the group was made for: ``live`` when the tool ran."""
    FOLLOWER = "follower"
    """Same key, same drain: ``in_flight``."""
    ATTACHED = "attached"
    """Same key, joined while the group was already past its queue: ``in_flight``."""


@attrs.define(eq=False)
class Call:
    """One ``execute`` from the host, with its reply future."""

    tool: Tool
    input: Any
    """A snapshot of the caller's input, taken at ``execute`` (later changes unseen)."""
    key: str
    input_hash: str
    credential_digest: str
    mode: ClaimMode
    stale_after_s: float | None
    timeout_s: float
    future: Any
    submitted_at: float
    requeued: bool = False
    nested: bool = False
    """Made from inside a running tool (borrows its parent's slot)."""
    ancestors: frozenset[str] = frozenset()
    """The receipt keys of the tool calls it was made inside (a call of one is a cycle)."""
    role: Role = Role.OWNER
    timed_from: float | None = None
    """``time.monotonic()`` when its timeout began (its call's first send, or its joining
    one already sent); a call queued again (credentials changed) keeps only what is left."""
    input_text: str | None = None
    """What its receipt keeps of the input (``Tool.keep_input``; None: nothing to say)."""
    input_bytes: int = 0
    """The size of its canonical input (RFC 8785 JSON, UTF-8), bytes: what it adds to a
    batch (``BatchStrategy.max_batch_bytes``)."""
    trace: Any = None
    """Its span and timings while telemetry is on (``actors.telemetry.instruments.CallTrace``),
    else None; the lifecycle only hands it on and tells it of waits."""


class Reread(enum.Enum):
    """Where a group's read woken by a change notification is (its key waits on another owner)."""

    NONE = "none"
    """No woken read is out."""
    OUT = "out"
    """A woken read is out."""
    AGAIN = "again"
    """Another notification came while that read was out: read once more after it."""


@attrs.define(eq=False)
class OwnerWait:
    """A group's wait on another owner's receipt: how it polls, and what the wait holds
    (a timer, a change-notification registration, a count in the gauge), each given
    back by ``Exits.stop_waiting`` (the watch and the count) or when its timer fires."""

    since: float | None = None
    """``time.monotonic()`` when it began to wait, while it waits (its callers' timeouts)."""
    polls: int = 0
    """Timer polls read so far (woken reads do not count)."""
    poll_delay_s: float = 0.0
    """The delay of its next poll timer (doubles up to ``Policy.receipt_poll_max_s``)."""
    timer_armed: bool = False
    """A poll timer (PollDue) is pending for its key."""
    watched: bool = False
    """Its key is registered for change notifications."""
    reread: Reread = Reread.NONE
    """Its read woken by a change notification."""
    force_after: bool = False
    """A force refresh that met a live lease: claim with force once it is free."""
    counted: int = 0
    """Callers counted in the ``waiting_on_owner`` gauge."""


@attrs.define(eq=False)
class Group:
    """Calls sharing one receipt key, and what their execution holds."""

    key: str
    tool: Tool
    input: Any
    """The owner's input snapshot: what the tool runs on."""
    input_hash: str
    credential_digest: str
    stale_after_s: float | None
    calls: list[Call] = attrs.field(factory=list)
    """Every caller still waiting (owner, followers, attached)."""
    _state: GroupState = GroupState.QUEUED
    """Where it is in its life (read and set as :attr:`state`)."""
    receipt: Receipt | None = None
    """The claimed receipt (durable tools)."""
    mode: ClaimMode = ClaimMode.NORMAL
    nested: bool = False
    ancestors: frozenset[str] = frozenset()
    """The receipt keys of the tool calls its nested callers were made inside."""
    unit: Unit | None = None
    beating: bool = False
    """Its lease is registered with the heartbeat."""
    wait: OwnerWait = attrs.field(factory=OwnerWait)
    """Its wait on another owner's receipt: the polls, and what the wait holds."""
    lease_lost: bool = False
    answered: bool = False
    """Its callers were answered early (timed out, lease lost): a late result is still
    persisted for the next caller."""
    ran: bool = False
    """The tool ran for it (its owner's result is ``live``)."""
    live_given: bool = False
    """A caller was answered ``live`` with its output (one caller a receipt: the owner, or
    the first caller answered with it when the owner left or never was)."""
    owed: bool = False
    """Its output went to the store with no caller to answer ``live`` (a member riding
    along in a request sent again, callers gone): the first call of its key answered
    anywhere in this system takes the memo's mark and is ``live``
    (:meth:`actors.queue.memo.Memo.owe`)."""
    input_text: str | None = None
    """What its receipt keeps of the input (the owner's ``Call.input_text``)."""
    input_bytes: int = 0
    """The owner's ``Call.input_bytes`` (0: not known, a member riding along)."""
    input_known: bool = True
    """:attr:`input` is a call's input (False: a member riding along in a request taken
    over whose record holds no input, until a call of it brings one)."""
    slotted: bool = False
    """Holds a slot taken before its claim (claimed straight into running)."""
    reconciling_since: float | None = None
    """When its reconcile hook was started, while the hook is out (its callers' timeouts)."""
    held_since: float | None = None
    """When the store held its claim to try it again (an outage), until the claim is
    answered: each caller is answered at its own timeout meanwhile."""
    held_by: BaseException | None = None
    """What the held claim's first attempt met (set with ``held_since``)."""
    written: Any = None
    """What its write in progress will answer (a ``Done`` or the error being recorded): a
    caller whose timeout passes meanwhile gets it then."""
    cost: Money | None = None
    """What its answer cost, once paid (:mod:`actors.worker.prices`), for its receipt."""

    @classmethod
    def of(cls, call: Call) -> Group:
        """A new group owned by ``call``."""
        call.role = Role.OWNER
        return cls(
            key=call.key, tool=call.tool, input=call.input, input_hash=call.input_hash,
            credential_digest=call.credential_digest, stale_after_s=call.stale_after_s,
            calls=[call], mode=call.mode, nested=call.nested, ancestors=call.ancestors,
            input_text=call.input_text, input_bytes=call.input_bytes,
        )  # fmt: skip

    def join(self, call: Call, role: Role) -> None:
        """Add a caller (mode and nesting are the strongest of the callers)."""
        call.role = role
        self.calls.append(call)
        if call.mode is not self.mode:
            self.mode = strongest_mode((self.mode, call.mode))
        self.nested = self.nested or call.nested
        if call.ancestors:
            self.ancestors |= call.ancestors

    def take_late(self, since: float, now: float) -> list[Call]:
        """Take out the callers whose own ``timeout_s`` has passed, counted from ``since``
        (a send, or the start of a wait) or from when the caller came, if later."""
        late = [c for c in self.calls if max(since, c.submitted_at) + c.timeout_s <= now + 1e-3]
        if late:
            self.calls = [c for c in self.calls if c not in late]
        return late

    @property
    def timeout_s(self) -> float:
        """The largest timeout of its callers (inf when none is left): the call runs as
        long as its most patient caller waits; each caller times out at its own."""
        return max((c.timeout_s for c in self.calls), default=math.inf)

    @property
    def lease(self) -> LeaseRef | None:
        receipt = self.receipt
        if receipt is None or receipt.lease_id is None:
            return None
        return LeaseRef(receipt.key, receipt.lease_id)

    @property
    def state(self) -> GroupState:
        """Where it is in its life; each assignment is checked against
        :data:`actors.lifecycle.states.TRANSITIONS`.

        Raises:
            IllegalTransitionError: on assignment, a move not in the table (the state
                does not change).
        """
        return self._state

    @state.setter
    def state(self, new: GroupState) -> None:
        self._state = check_transition(self.key, self._state, new)


@attrs.define(eq=False)
class Unit:
    """One provider call: a single group, or the members of one compiled batch."""

    id: int
    groups: list[Group]
    attempt: int = 0
    """Attempts sent so far."""
    readmissions: int = 0
    """Times put back for admission (429, not sent)."""
    slot: bool = False
    """Holds a governor slot."""
    queued: bool = False
    """Waits in the lifecycle's admission queue."""
    sent_on_slot: bool = False
    """A request went out under the slot it holds now (else the slot's charge is refunded)."""
    charge: Decimal | None = None
    """Under a money budget: what its slot's grant charged (the budget's currency), held
    until its answer settles it, or given back when nothing went."""
    exempt: bool = False
    """Its slot is a nested call's (not counted against the ceiling)."""
    units: dict[str, float] | None = None
    """Under limits in units: what its slot's grant took (its estimate at the tool's bias),
    held until its answer corrects it, or given back when nothing went."""
    units_estimate: dict[str, float] = attrs.field(factory=dict)
    """Its members' estimates, unscaled (what the bias learns from)."""
    granted_at: float = 0.0
    """``time.monotonic()`` of its slot's grant (a correction comes off that time's count)."""
    deadline: float | None = None
    """``time.monotonic()`` after which its last callers time out (set at the first send)."""
    sent_first_at: float | None = None
    """``time.monotonic()`` of its first send: each caller times out ``timeout_s`` after it."""
    out: bool = False
    """A provider call is running on the pool."""
    ticket: Any = None
    """Its last attempt's ``actors.worker.launch.SendTicket`` (withdrawn while not yet sent)."""
    counted: tuple[str, ...] = ()
    """The stats its last send counted (``requests``, ...), taken back if nothing went."""
    timed_out: bool = False
    relayed: tuple[BaseException, ...] = ()
    """Its last attempt's errors (the call's, or members') that the tool's function passed
    on from nested calls: its own request went out, and they say nothing of its provider."""

    def relayed_error(self, exc: BaseException | None) -> bool:
        """Whether ``exc`` is one of :attr:`relayed` (the very object)."""
        return exc is not None and any(e is exc for e in self.relayed)

    last_error: BaseException | None = None
    """The previous attempt's error (its outcome if no further attempt goes)."""
    persisting: int = 0
    """Groups whose write is still out; the slot is free when it reaches 0."""
    retry_charged: bool = False
    """The retry budget was charged for its next attempt, and that attempt has not yet
    shown a request went out (else the charge comes back: ``Effects.refund_retry``)."""
    record: BatchRecord | None = None
    """The request it sends (a batch tool's), recorded by the store before its first send,
    or taken over with its members from a lost owner: every attempt sends exactly these
    members, in this order, under this key (``attempts.spec_for``)."""
    proposed: BatchRecord | None = None
    """The record asked for with its running mark, until the store answers."""
    waiting: tuple[str, float] | None = None
    """While telemetry is on (``Shared.traced``): why and since when (``time.monotonic()``)
    it waits to be sent (``"slot"``, ``"pause"``, ``"retry_backoff"``), told to its callers'
    traces when the wait ends (:func:`note_wait`)."""
    taken_over: bool = False
    """Its request was recorded by an owner that was lost (crashed, or its lease ran
    out): it may have been sent already, by that owner."""
    missing: set[str] = attrs.field(factory=set)
    """Members (receipt keys) of a request taken over whose input its record does not hold
    (``BatchRecord.inputs``: a tool that keeps no raw input) and no call here has brought
    yet: it is sent once this is empty (a call of such a member brings it,
    ``Admission.joined``), or its members are recorded uncertain at its deadline."""

    @property
    def timeout_s(self) -> float:
        """The largest per-call timeout of its groups' callers (groups whose callers all
        left do not count): the provider call's own deadline."""
        return max((g.timeout_s for g in self.groups if g.calls), default=math.inf)
