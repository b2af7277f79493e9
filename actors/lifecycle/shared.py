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
from typing import TYPE_CHECKING, Any

from actors.lifecycle.calls import Group, Unit
from actors.lifecycle.effects import Effects
from actors.tool import Policy, Tool
from stores.types import LeaseRef, Owner

if TYPE_CHECKING:
    from actors.lifecycle.admission import Admission
    from actors.lifecycle.claiming import Claims
    from actors.lifecycle.cleanup import Cleanup
    from actors.lifecycle.exits import Exits
    from actors.lifecycle.finishing import Finisher
    from actors.lifecycle.persisting import Persister
    from actors.lifecycle.reconciling import Waits

__all__ = ["Parts", "Shared"]


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
        self.slotting: list[Group] = []
        """Groups whose slots were asked for before their claim (``Claims.drained``)."""
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


class Parts:
    """The lifecycle's collaborators, for each to reach the others (set once by
    :class:`actors.lifecycle.machine.Lifecycle`)."""

    exits: Exits
    claims: Claims
    waits: Waits
    admission: Admission
    finisher: Finisher
    persister: Persister
    cleanup: Cleanup
