"""What every drain needs from its dispatch system."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from stores.types import Owner

from ._send_gate import SendGates
from .completion_flusher import Latch
from .stats import Stats
from .tool import Policy, RunInfo

__all__ = ["Context"]


@attrs.define(eq=False)
class Context:
    """Shared handles: actors (refs and proxies), pools, run identity and switches."""

    run: RunInfo
    owner: Owner
    policy: Policy
    store: Any
    """ReceiptStoreProxy."""
    governor: Any
    """GovernorActor ref."""
    heartbeat: Any
    """HeartbeatActor ref."""
    flusher: Any
    """CompletionFlusherActor ref."""
    latch: Latch
    stats: Stats
    tool_pool: ThreadPoolExecutor
    stopping: threading.Event
    tokens: Any
    """itertools.count for heartbeat registration tokens."""
    send_gates: SendGates = attrs.field(factory=SendGates)
    """(org, provider) -> SendGate, waited at before each request; the governor keeps them."""
