"""What the tool queue actors of one dispatch system share (:class:`Ports`): actor refs,
the worker pool, timers, the latch and send-gate snapshots, stats, the salvage file.
Each actor performs its lifecycle's effects through them (:mod:`actors.queue.ports`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from actors.flusher.actor import Latch
from actors.flusher.salvage import SalvageLog
from actors.lifecycle.calls import Call
from actors.pacing.send_gate import SendGates
from actors.runtime.actor import Timers, WorkerPool
from actors.stats import Stats
from actors.tool import Policy, RunInfo, Tool
from actors.worker.launch import Launch
from stores.types import Owner

__all__ = ["Ports"]


@attrs.define(eq=False)
class Ports:
    """What the tool queue actors of one dispatch system share."""

    run: RunInfo
    owner: Owner
    policy: Policy
    store: Any
    """ReceiptStoreActor ref (takes the store commands of actors.messages)."""
    governor: Any
    """GovernorActor ref."""
    heartbeat: Any
    """HeartbeatActor ref."""
    flusher: Any
    """CompletionFlusherActor ref."""
    latch: Latch
    """Read-only here: the flusher trips it (TripLatch)."""
    launch: Launch
    """The last check before each request (the latch, a stop, withdrawals)."""
    gates: SendGates
    """Read-only here: the governor keeps their pauses and closures."""
    stats: Stats
    pool: WorkerPool
    timers: Timers
    salvage: SalvageLog
    requeue: Callable[[Call, BaseException], None]
    width: Callable[[Tool], int]
    telemetry: Any = None
    """The system's instruments when telemetry is on (``actors.telemetry.instruments``), else None."""
    writing: dict[int, Any] = attrs.field(factory=dict)
    """Writes of outputs in progress (the flusher's and the tool queue actors' own),
    salvaged by a stop whose bound runs out."""
