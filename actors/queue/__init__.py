"""The tool queue actor: one per tool; grace window, dedupe, memo, and the effects of its lifecycle."""

from actors.queue.actor import Submitted, ToolQueue, ToolQueueActor
from actors.queue.completion_write import CompletionWriter
from actors.queue.local_effects import FINISHED_READY, Finished, FinishReport, LocalEffects
from actors.queue.memo import Memo, held_bytes
from actors.queue.ports import ActorEffects
from actors.queue.system_ports import Ports

__all__ = [
    "FINISHED_READY",
    "ActorEffects",
    "CompletionWriter",
    "FinishReport",
    "Finished",
    "LocalEffects",
    "Memo",
    "Ports",
    "Submitted",
    "ToolQueue",
    "ToolQueueActor",
    "held_bytes",
]
