"""OpenTelemetry's SDK set up to export over OTLP/HTTP, for ``tooldispatch run --otel``.

Where to and how are the SDK's standard environment variables (the OTLP exporter
specification): ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default ``http://localhost:4318``; traces
go to ``/v1/traces``, metrics to ``/v1/metrics``), ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_SERVICE_NAME`` (default here ``tooldispatch``), ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_METRIC_EXPORT_INTERVAL`` (ms) and the batch span processor's ``OTEL_BSP_*``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import attrs

from actors.telemetry.config import Telemetry, TelemetryUnavailableError

__all__ = ["EXPORT_TIMEOUT_S", "OtlpExport", "export_otlp"]

EXPORT_TIMEOUT_S = 5.0
"""Seconds an export to the collector may take (unless ``OTEL_EXPORTER_OTLP_TIMEOUT``
says otherwise), and the bound on the last flush at the run's end."""


@attrs.frozen
class OtlpExport:
    """The providers made by :func:`export_otlp` and how to end them."""

    telemetry: Telemetry
    """Give it to ``DispatchSystem.start(telemetry=...)``."""
    shutdown: Callable[[], None]
    """Export what is still held (spans, a last collection of the metrics) and stop; call
    once, after the system stopped."""


def export_otlp() -> OtlpExport:
    """Make a tracer provider (batch span processor) and a meter provider (periodic reader),
    both exporting over OTLP/HTTP (protobuf) as the ``OTEL_*`` variables say, and make them
    the global ones (so a play's own instrumentation is exported with the dispatcher's).

    Raises:
        TelemetryUnavailableError: the ``otel`` extra is not installed, or an ``OTEL_*``
            setting cannot be used (an export interval of 0, say).
    """
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TelemetryUnavailableError(
            f"--otel needs the opentelemetry packages: pip install 'tooldispatch[otel]' ({exc})"
        ) from exc
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": "tooldispatch"})
    # a collector that is not there must not hold the run's end for long (the SDK's default
    # is 10 s a request, with retries): 5 s unless OTEL_EXPORTER_OTLP_TIMEOUT says
    timeout = None if os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT") else EXPORT_TIMEOUT_S
    try:
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(timeout=timeout)))
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(timeout=timeout))
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    except (ValueError, TypeError) as exc:  # an OTEL_* setting out of its range, say
        raise TelemetryUnavailableError(f"--otel: the OTEL_* settings cannot be used: {exc}") from None
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)

    def shutdown() -> None:
        tracer_provider.force_flush(timeout_millis=int(EXPORT_TIMEOUT_S * 1000))
        tracer_provider.shutdown()
        meter_provider.shutdown(timeout_millis=EXPORT_TIMEOUT_S * 1000)  # (a last collection, exported)

    return OtlpExport(Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider), shutdown)
