"""What stop salvages itself when its bound runs out while the flusher (or a tool queue's
own write) waits on the store: the actors' threads are daemons, so what they hold when
the process exits would be lost. Both run on stop's thread."""

from __future__ import annotations

import contextlib
from typing import Any

from ._inbox import answer_left, left_in
from .errors import CallCancelledError
from .messages import FlushCompletions
from .salvage import SalvageLog, salvage_entry

__all__ = ["salvage_unread", "salvage_writing"]


def salvage_writing(writing: dict[int, Any], salvage: SalvageLog) -> int:
    """Salvage the outputs of writes still in progress (called by a stop whose bound ran
    out while the flusher waited on the store): a paid result is then on disk before stop
    returns even if the process exits. A write that lands later leaves a salvage entry of
    an already completed receipt, which ``salvage replay`` counts and drops. Returns the
    number of outputs salvaged."""
    entries = []
    for make in list(writing.values()):
        with contextlib.suppress(Exception):
            entries += make("the dispatcher stopped while this result was being stored")
    if entries:
        salvage.append(entries)
    return len(entries)


def salvage_unread(inbox: Any, salvage: SalvageLog, scope: str) -> int:
    """Salvage the outputs of flush requests still unread in the flusher's inbox when
    stop's bound ran out (the flusher waits on a write to a locked or slow store, so its
    own ``on_stop`` may never come before the process exits: its thread is a daemon).
    Called from stop's thread; the flusher may take messages meanwhile, so each is taken
    without waiting. Their callers are answered. Returns the number of outputs salvaged."""
    left = left_in(inbox)
    entries = []
    reason = "the dispatcher stopped before this result was stored"
    for message in left:
        if not isinstance(message, FlushCompletions):
            continue
        for completion in message.entries:
            entries.append(salvage_entry(
                key=completion.key, org_id=message.org_id, scope=scope, tool_id=message.tool_id,
                input_hash=message.input_hashes.get(completion.key, ""), output=completion.output,
                attempts=2 if message.failed else 1, first_error_at=None, error=message.failed or reason,
                lease_id=completion.lease_id, generation=completion.generation, replaces=completion.replaces,
            ))  # fmt: skip
    if entries:
        salvage.append(entries)
    answer_left(left, CallCancelledError("the dispatcher stopped before this result was stored"))
    return len(entries)
