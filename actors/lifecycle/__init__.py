"""The life of a call group: a plain state machine, messages in, effects out, time passed in.

:class:`Lifecycle` (:mod:`actors.lifecycle.machine`) is the entry point
(``handle(event, now)``); the states and their legal moves are the table of
:mod:`actors.lifecycle.states`.
"""

from actors.lifecycle.calls import Call, Group, OwnerWait, Reread, Role, Unit
from actors.lifecycle.effects import Effects
from actors.lifecycle.machine import EVENTS, Lifecycle
from actors.lifecycle.states import TRANSITIONS, GroupState, IllegalTransitionError, check_transition

__all__ = [
    "EVENTS",
    "TRANSITIONS",
    "Call",
    "Effects",
    "Group",
    "GroupState",
    "IllegalTransitionError",
    "Lifecycle",
    "OwnerWait",
    "Reread",
    "Role",
    "Unit",
    "check_transition",
]
