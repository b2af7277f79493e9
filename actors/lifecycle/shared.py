"""The state every part of one tool's call lifecycle reads and writes, and the parts
themselves (:class:`Parts`), composed by :class:`actors.lifecycle.machine.Lifecycle`.

The parts are collaborators, not base classes: each holds this one :class:`Shared`
object and reaches the others through :class:`Parts` (the exits every path ends in,
claims, waits, admission, finishing, persistence, cleanup). Everything here runs on
the owning tool queue actor's thread (or a test's).
"""

from __future__ import annotations

import collections
import itertools
import math
import time
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any, Protocol

from actors.lifecycle.calls import Call, Group, Unit
from actors.lifecycle.effects import Effects
from actors.lifecycle.units import UnitBias
from actors.tool import Policy, Tool
from stores.types import ClaimMode, LeaseRef, Owner, Receipt

__all__ = [
    "AdmissionPart",
    "ClaimsPart",
    "CleanupPart",
    "ExitsPart",
    "FinisherPart",
    "Parts",
    "PersisterPart",
    "Shared",
    "WaitsPart",
]


class Shared:
    """One tool's call groups and units, and the requests out for them.

    Args:
        tool: the tool.
        policy: timeouts, retries, receipt waits.
        org_id / scope: the run's org and scope (claim requests).
        fx: the effects port (the actor, or a recorder in tests).
        width: most units of this tool holding slots at once (suggested parallelism).
        owner: this process's lease owner (for the leases a failed claim may leave).
    """

    def __init__(
        self,
        tool: Tool,
        policy: Policy,
        org_id: str,
        scope: str,
        fx: Effects,
        width: int,
        owner: Owner | None = None,
    ) -> None:
        self.tool = tool
        self.owner = owner
        """This process's lease owner (None: leases left by a failed claim are not looked for)."""
        self.policy = policy
        self.org_id = org_id
        self.scope = scope
        self.fx = fx
        self.width = max(1, width)
        self.groups: dict[str, Group] = {}
        """Receipt key -> group past its queue and not settled (calls of that key attach)."""
        self.pending: collections.deque[Unit] = collections.deque()
        """Units waiting for a slot (counted against the ceiling)."""
        self.pending_exempt: collections.deque[Unit] = collections.deque()
        """Units of nested calls waiting for a slot (borrowed: not counted)."""
        self.units: dict[int, Unit] = {}
        """Unit id -> unit not yet left (queued, holding a slot, running or persisting)."""
        self.holding = 0
        """Units holding a non-exempt slot."""
        self.overdue_warned_at = -math.inf
        """When functions past their timeout were last said to hold slots (``Finisher``)."""
        self.acquiring = {False: False, True: False}
        """Per admission queue (exempt or not): a slot request is out."""
        self.spend_currency = (
            policy.spend_currency(tool.provider_name) if tool.durable and tool.priced else None
        )
        """The currency of the money budgets its calls are charged to (None: not charged)."""
        self.overrun = Decimal(0)
        """The most a call of this tool has cost past its estimate so far (a price function
        whose ``price_estimate`` is too low): later calls are charged that much more."""
        self.asked_prices: dict[bool, tuple[Decimal, ...]] = {False: (), True: ()}
        """Per admission queue: the prices its slot request out was sent with."""
        self.unit_limited = bool(tool.pacing.unit_limits) or tool.units is not None
        """Its provider has limits kept by the quota state (``Pacing.unit_limits``; or the
        tool states units, for limits another tool of its provider states): its slot
        requests state each request's units and its calls' timeout, its answers their real
        use."""
        self.bias = UnitBias()
        """How far its calls' real use has run past their estimates (per unit)."""
        self.asked_units: dict[bool, tuple[dict[str, float], ...]] = {False: (), True: ()}
        """Per admission queue: the units its slot request out was sent with."""
        self.slotting: list[Group] = []
        """Groups whose slots were asked for before their claim (``Claims.drained``)."""
        self.intake_out: set[int] = set()
        """Claims of drained groups not yet answered (request numbers)."""
        self.intake: list[Group] = []
        """Groups drained while a claim of drained groups (or its slot request) is out:
        claimed together once it is answered (``Claims.drained``)."""
        self.stopping = False
        """The dispatcher is stopping: nothing new is sent."""
        self.batches: dict[int, Any] = {}
        """Request number -> what its answer concerns (groups, units, outputs)."""
        self.cleanups: dict[int, Any] = {}
        """Request number -> a lease cleanup in flight (:mod:`actors.lifecycle.cleanup`)."""
        self.releasing: list[tuple[Group, BaseException | None, LeaseRef]] = []
        """Receipts to give back, sent as one request at the end of the message."""
        self.persisting: list[tuple[Group, str]] = []
        """Outputs to write, sent as one request at the end of the message (or later)."""
        self.unwatching: list[str] = []
        """Keys no longer waited on, unwatched at the end of the message."""
        self.deadlines: dict[float, list[int]] = {}
        """Timeout (seconds) -> units sent with it during this message (one timer each)."""
        self.wait_dues: dict[float, list[str]] = {}
        """Timer delay (ms-rounded seconds) -> keys whose callers' timeouts it ends (one
        timer per delay and message, as ``DeadlineDue``)."""
        self.woken: set[int] = set()
        """Read batches asked for by a change notification (not timer polls)."""
        self.ids = itertools.count(1)
        """Request, unit and batch numbers."""
        self.traced = False
        """Telemetry is on: calls carry traces (``Call.trace``), attempts hand them to
        their workers and waits are told to them (set by the owning actor)."""
        self.clock: Callable[[], float] = time.monotonic
        """Where a wait begins with no ``now`` at hand (``Exits.enqueue``, a store request);
        the owning actor's clock."""
        self.asked_at: dict[int, float] = {}
        """Store request (claim, write of outputs) -> when it was asked (``clock``): its
        answer counts the wait as ``store`` (``Effects.waited``)."""


class ExitsPart(Protocol):
    """What every path ends in: leaving, settling, giving back (:class:`~actors.lifecycle.exits.Exits`)."""

    def compile(self, groups: list[Group]) -> list[Unit]: ...
    def enqueue(self, units: Iterable[Unit], front: bool = False) -> None: ...
    def cancel_groups(self, groups: list[Group]) -> None: ...
    def refuse_latch(self, units: list[Unit], reason: str) -> None: ...
    def give_back(self, unit: Unit, error: BaseException) -> None: ...
    def release_group(self, group: Group, error: BaseException | None, lease_lost: bool = False) -> None: ...
    def released(self, group: Group, error: BaseException | None) -> None: ...
    def drop_from_unit(self, group: Group) -> None: ...
    def readmit(self, unit: Unit, now: float, front: bool = False) -> None: ...
    def free_slot(self, unit: Unit) -> None: ...
    def leave(self, unit: Unit) -> None: ...
    def stop_waiting(self, group: Group) -> None: ...
    def unbeat(self, group: Group) -> bool: ...
    def answer_early(self, group: Group, outcome: Any) -> None: ...
    def answer_last_good(self, group: Group, receipt: Receipt | None, mark: str | None) -> None: ...
    def settle(self, group: Group, outcome: Any) -> None: ...
    def outcome_for(self, call: Call, group: Group, outcome: Any) -> Any: ...


class AdmissionPart(Protocol):
    """Slots and sending (:class:`~actors.lifecycle.admission.Admission`)."""

    def pump(self, now: float) -> None: ...
    def admit(self, units: list[Unit], now: float, marked: bool = False) -> None: ...


class CleanupPart(Protocol):
    """Leases a failed claim may have left (:class:`~actors.lifecycle.cleanup.Cleanup`)."""

    def claim_failed(self, keys: Sequence[str]) -> None: ...


class WaitsPart(Protocol):
    """Waits on other owners' receipts and reconciling (:class:`~actors.lifecycle.reconciling.Waits`)."""

    def time_waiters(self, group: Group, since: float, calls: list[Call], now: float) -> None: ...
    def waiting_joined(self, group: Group, call: Call, now: float) -> None: ...
    def owner_wait_over(self, group: Group, now: float) -> bool: ...
    def reconcile(self, group: Group, receipt: Receipt, now: float) -> None: ...
    @staticmethod
    def uncertain(group: Group, receipt: Receipt) -> BaseException: ...


class ClaimsPart(Protocol):
    """Claims and reads (:class:`~actors.lifecycle.claiming.Claims`)."""

    def slots_for_claim(self, n: int, now: float) -> None: ...
    def claim(self, groups: list[Group], force: ClaimMode | None) -> None: ...
    def on_read(
        self, batch: int, receipts: list[Any] | None, error: BaseException | None, now: float
    ) -> None: ...


class FinisherPart(Protocol):
    """An attempt's outcome: retries, re-admission, deadlines
    (:class:`~actors.lifecycle.finishing.Finisher`)."""

    def conclude(
        self,
        unit: Unit,
        members: list[Any] | None,
        error: BaseException | None,
        now: float,
        uncertain: bool = False,
    ) -> None: ...


class PersisterPart(Protocol):
    """Outputs and failure records to the store (:class:`~actors.lifecycle.persisting.Persister`)."""

    def persist(self, values: list[tuple[Group, str]]) -> None: ...
    def fail(
        self, failed: list[tuple[Group, BaseException]], counted: bool = True, uncertain: bool = False
    ) -> None: ...


class Parts:
    """The lifecycle's collaborators, for each to reach the others (set once by
    :class:`actors.lifecycle.machine.Lifecycle`)."""

    exits: ExitsPart
    claims: ClaimsPart
    waits: WaitsPart
    admission: AdmissionPart
    finisher: FinisherPart
    persister: PersisterPart
    cleanup: CleanupPart
