"""A call group's states and its legal transitions, written down as data (after h11).

:data:`TRANSITIONS` maps each :class:`GroupState` to the states it may move to.
:func:`check_transition` is the one place a move is judged: every assignment of
``Group.state`` goes through it (the property's setter), so a move not in
the table raises :class:`IllegalTransitionError` at once, on the thread that made it
(the tool queue actor's, or a test's).

The happy path of a durable call::

    queued -> claiming -> claimed -> admitted -> running -> persisting -> settled

A tool that is not durable skips the claim (``queued -> claimed``) and settles from
``running``; an uncertain receipt is reconciled (``claiming -> reconciling``) and claimed
again or settled. ``settled`` is the only final state: every exit, whichever message made
the group leave, ends there.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from stores.errors import ToolDispatchError

__all__ = ["TRANSITIONS", "GroupState", "IllegalTransitionError", "check_transition"]


class GroupState(str, enum.Enum):
    """Where a group is in its life (one receipt key, one execution)."""

    QUEUED = "queued"
    """In its tool's batch grace window."""
    CLAIMING = "claiming"
    """A bulk claim of its receipt is out."""
    RECONCILING = "reconciling"
    """Its receipt is uncertain: the tool's reconcile hook, then the store's resolve of its
    answer, is out."""
    WAITING = "waiting"
    """Another owner holds the receipt: polled on a timer."""
    CLAIMED = "claimed"
    """We hold the lease; waiting for a slot (heartbeats renew the lease)."""
    ADMITTED = "admitted"
    """Its unit holds a slot; marking the receipt running."""
    RUNNING = "running"
    """Its unit's provider call is out (or being retried)."""
    PERSISTING = "persisting"
    """The output (or failure) is being written."""
    RELEASING = "releasing"
    """Its receipt is being given back (pending); then its callers hear why."""
    SETTLED = "settled"
    """Every caller was answered and nothing is held."""


_S = GroupState

TRANSITIONS: Mapping[GroupState, frozenset[GroupState]] = {
    # drained: claimed (durable), compiled into a unit (not durable), or refused (a stop)
    _S.QUEUED: frozenset({_S.CLAIMING, _S.CLAIMED, _S.SETTLED}),
    # claiming -> claiming: slots asked first, then the claim; -> reconciling: the claim
    # found the receipt uncertain and the tool has a reconcile hook
    _S.CLAIMING: frozenset({_S.CLAIMING, _S.CLAIMED, _S.WAITING, _S.RECONCILING, _S.SETTLED}),
    # reconciling -> claiming: the hook said the provider did not act (run it again)
    _S.RECONCILING: frozenset({_S.CLAIMING, _S.SETTLED}),
    # waiting -> waiting: polled again; -> claiming: the receipt may be free
    _S.WAITING: frozenset({_S.WAITING, _S.CLAIMING, _S.SETTLED}),
    # claimed -> claimed: compiled into its unit (or a retry queued again); -> persisting /
    # releasing: a retry's back-off or budget ended it (deadline, budget refused, a stop)
    _S.CLAIMED: frozenset({_S.CLAIMED, _S.ADMITTED, _S.PERSISTING, _S.RELEASING, _S.SETTLED}),
    # admitted -> claimed: re-admitted (the provider paused); -> persisting / releasing:
    # refused at its send (its deadline, the latch, a stop, a lost lease)
    _S.ADMITTED: frozenset({_S.CLAIMED, _S.RUNNING, _S.PERSISTING, _S.RELEASING, _S.SETTLED}),
    # running -> claimed: a retry or a 429 re-admission; -> releasing: withdrawn, or an
    # error that was never the call's fault
    _S.RUNNING: frozenset({_S.CLAIMED, _S.PERSISTING, _S.RELEASING, _S.SETTLED}),
    # persisting -> persisting: the store refused the output; its failure is recorded
    _S.PERSISTING: frozenset({_S.PERSISTING, _S.SETTLED}),
    _S.RELEASING: frozenset({_S.SETTLED}),
    _S.SETTLED: frozenset(),
}
"""State -> the states it may move to. A state missing from a row's set is illegal."""


class IllegalTransitionError(ToolDispatchError):
    """A group was moved between states :data:`TRANSITIONS` does not link (a bug in the
    lifecycle, raised at the move)."""

    def __init__(self, key: str, old: GroupState, new: GroupState) -> None:
        super().__init__(f"group {key}: {old.value} -> {new.value} is not a legal transition")
        self.key = key
        self.old = old
        self.new = new


def check_transition(key: str, old: GroupState, new: GroupState) -> GroupState:
    """Return ``new`` when ``old -> new`` is in :data:`TRANSITIONS`.

    Raises:
        IllegalTransitionError: the move is not in the table.
    """
    if new not in TRANSITIONS[old]:
        raise IllegalTransitionError(key, old, new)
    return new
