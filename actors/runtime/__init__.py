"""The runtime the actors stand on: the actor base, futures, timers, the worker pool, nesting."""

from actors.runtime.actor import InboxActor, Reply, Timers, WorkerPool, guarded, log, on_actor
from actors.runtime.at_exit import AT_EXIT_STOP_S, ExitHook, track, untrack
from actors.runtime.flavor import runtime_name
from actors.runtime.futures import MAX_WAIT_S, LightFuture, bounded, fail, new_future, resolved_future
from actors.runtime.inbox import TakeBackInbox, answer_left, left_in
from actors.runtime.nesting import (
    NestScope,
    cause_chain,
    enter_keys,
    in_tool,
    leave_keys,
    lend,
    relayed_here,
    running_keys,
)

__all__ = [
    "AT_EXIT_STOP_S",
    "MAX_WAIT_S",
    "ExitHook",
    "InboxActor",
    "LightFuture",
    "NestScope",
    "Reply",
    "TakeBackInbox",
    "Timers",
    "WorkerPool",
    "answer_left",
    "bounded",
    "cause_chain",
    "enter_keys",
    "fail",
    "guarded",
    "in_tool",
    "leave_keys",
    "left_in",
    "lend",
    "log",
    "new_future",
    "on_actor",
    "relayed_here",
    "resolved_future",
    "running_keys",
    "runtime_name",
    "track",
    "untrack",
]
