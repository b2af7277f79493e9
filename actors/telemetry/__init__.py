"""OpenTelemetry traces and metrics of a dispatch system: optional, off by default.

``pip install tooldispatch[otel]``, then ``DispatchSystem.start(..., telemetry=Telemetry())``
(or ``tooldispatch run --otel``). Off (no ``telemetry=``), nothing of ``opentelemetry`` is
imported and no span is made; docs/telemetry.md lists the spans, attributes and metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from actors.telemetry.config import ACTIVE, WAIT_REASONS, Telemetry, TelemetryUnavailableError, installed
from actors.tool import RunInfo

if TYPE_CHECKING:
    from actors.telemetry.instruments import Instruments

__all__ = [
    "ACTIVE",
    "WAIT_REASONS",
    "Telemetry",
    "TelemetryUnavailableError",
    "installed",
    "open_instruments",
]


def open_instruments(
    config: Telemetry, run: RunInfo, pacing: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None
) -> Instruments:
    """The instruments of one system (see :class:`~actors.telemetry.instruments.Instruments`).

    Raises:
        TelemetryUnavailableError: ``opentelemetry`` is not installed.
    """
    try:
        from actors.telemetry.instruments import Instruments
    except ImportError as exc:
        raise TelemetryUnavailableError(
            f"telemetry needs the opentelemetry packages: pip install 'tooldispatch[otel]' ({exc})"
        ) from exc
    return Instruments(config, run, pacing)
