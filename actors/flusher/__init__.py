"""The completion flusher: bulk completion, the latch, and salvage of what could not be persisted."""

from actors.flusher.actor import CompletionFlusherActor
from actors.flusher.held import HeldOutputs, request_entries
from actors.flusher.latch import FlushOutcome, Latch, OutcomeKind, fence_outcomes, ladder_backoff
from actors.flusher.salvage import REPLAY_OWNER, ReplayReport, SalvageEntry, SalvageLog
from actors.flusher.stop_salvage import salvage_unread, salvage_writing, take_flushes

__all__ = [
    "REPLAY_OWNER",
    "CompletionFlusherActor",
    "FlushOutcome",
    "HeldOutputs",
    "Latch",
    "OutcomeKind",
    "ReplayReport",
    "SalvageEntry",
    "SalvageLog",
    "fence_outcomes",
    "ladder_backoff",
    "request_entries",
    "salvage_unread",
    "salvage_writing",
    "take_flushes",
]
