"""What stop salvages itself when its bound runs out while the flusher (or a tool queue's
own write) waits on the store: the actors' threads are daemons, so what they hold when
the process exits would be lost. Both run on stop's thread."""

from __future__ import annotations

import contextlib
import queue
from typing import Any

from actors.errors import ResultSalvagedError
from actors.flusher.held import request_entries
from actors.flusher.salvage import SalvageLog
from actors.messages import FlushCompletions
from actors.runtime.inbox import answer_left

__all__ = ["salvage_unread", "salvage_writing", "take_flushes"]


def salvage_writing(writing: dict[int, Any], salvage: SalvageLog) -> int:
    """Salvage the outputs of writes still in progress, and of what the flusher holds
    (waiting on its ladder, buffered), called by a stop whose bound ran out while the
    flusher waited on the store: a paid result is then on disk before stop returns even
    if the process exits. A write that lands later leaves a salvage entry of
    an already completed receipt, which ``salvage replay`` counts and drops. Returns the
    number of outputs salvaged."""
    entries = []
    for token, make in list(writing.items()):
        with contextlib.suppress(Exception):
            entries += make("the dispatcher stopped while this result was being stored")
        writing.pop(token, None)  # salvaged once
    if entries:
        salvage.append(entries)
    return len(entries)


def salvage_unread(inbox: Any, salvage: SalvageLog, scope: str) -> int:
    """Salvage the outputs of flush requests still unread in the flusher's inbox when
    stop's bound ran out (the flusher waits on a write to a locked or slow store, so its
    own ``on_stop`` may never come before the process exits: its thread is a daemon).
    Called from stop's thread; the flusher may take messages meanwhile, so each is taken
    without waiting. Their callers are answered (:class:`ResultSalvagedError`: the output
    is in the file, not to be salvaged again). Returns the number of outputs salvaged."""
    left = take_flushes(inbox)
    reason = "the dispatcher stopped before this result was stored"
    entries = [entry for message in left for entry in request_entries(message, scope, reason)]
    if entries:
        salvage.append(entries)
    # on disk now: the callers must not salvage them again (each output once in the file)
    answer_left(left, ResultSalvagedError("the dispatcher stopped before this result was stored; salvaged"))
    return len(entries)


def take_flushes(inbox: Any) -> list[FlushCompletions]:
    """Take the flush requests out of the flusher's inbox, without waiting; everything else
    (pykka's stop, a ``give_up_now``, a retry) is put back, so a flusher that gets past
    its wait on the store still stops (it did not: its stop was taken with the rest)."""
    taken: list[FlushCompletions] = []
    others: list[Any] = []
    while True:
        try:
            envelope = inbox.get_nowait()
        except queue.Empty:
            break
        message = getattr(envelope, "message", envelope)
        (taken if isinstance(message, FlushCompletions) else others).append(envelope)
    for envelope in others:
        inbox.put(envelope)
    return [getattr(e, "message", e) for e in taken]
