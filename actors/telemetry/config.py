"""How a dispatch system is told to emit OpenTelemetry, and the names it emits under.

Nothing here imports ``opentelemetry``: a system started without ``telemetry=`` never
imports it, and its hot path pays one ``is not None`` check per call at most.
"""

from __future__ import annotations

import contextvars
from typing import Any

import attrs

from actors.errors import DispatchError

__all__ = ["ACTIVE", "WAIT_REASONS", "Telemetry", "TelemetryUnavailableError", "installed"]

WAIT_REASONS = ("batch_grace", "slot", "pacing", "pause", "owner", "retry_backoff", "store_write")
"""Why a call waited (the ``tooldispatch.wait.reason`` attribute): the batch grace window,
a governor slot, its turn at the provider's send gate (pacing), a 429's pause (at the
gate, or re-admitted after it), another owner's receipt, a retry's back-off, and the
write of its result (from the provider's answer to the caller's)."""


class TelemetryUnavailableError(DispatchError, ImportError):
    """``telemetry=`` was given but the ``opentelemetry`` packages are not installed
    (``pip install tooldispatch[otel]``)."""


@attrs.frozen(kw_only=True)
class Telemetry:
    """Turn OpenTelemetry on for one :class:`~actors.system.DispatchSystem`
    (``DispatchSystem.start(..., telemetry=Telemetry())``).

    Args:
        tracer_provider: an ``opentelemetry.trace.TracerProvider``; None: the global one
            (``opentelemetry.trace.get_tracer_provider()``, a no-op until one is set).
        meter_provider: an ``opentelemetry.metrics.MeterProvider``; None: the global one.
        traces: emit spans (call spans, batch spans, HTTP client spans).
        metrics: record metrics.
    """

    tracer_provider: Any = None
    meter_provider: Any = None
    traces: bool = True
    metrics: bool = True


ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("tooldispatch_telemetry", default=None)
"""The running system's instruments (:class:`actors.telemetry.instruments.Instruments`)
while a worker sends a traced request (set on the worker's thread or greenlet), else None:
what ``http_tool`` reads to make its HTTP client spans."""


def installed() -> bool:
    """Whether the ``opentelemetry`` API and SDK can be imported."""
    try:
        import opentelemetry.sdk
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True
