"""The spans and metrics of one dispatch system (imported only when telemetry is on).

Conventions followed (OpenTelemetry semantic conventions, where they exist):

* a call is a GenAI tool execution span (``gen_ai`` semconv, "Execute tool span"): name
  ``execute_tool {gen_ai.tool.name}``, kind INTERNAL, ``gen_ai.operation.name =
  "execute_tool"``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id`` (the receipt key),
  ``error.type`` on failure; the rest under ``tooldispatch.``;
* an HTTP request of ``http_tool`` is an HTTP client span (``http`` semconv): name
  ``{http.request.method}``, kind CLIENT, ``http.request.method``, ``url.full``,
  ``server.address``, ``server.port``, ``http.response.status_code``,
  ``http.request.resend_count`` (when it is a resend), ``error.type``;
* metric units are UCUM as the semconv asks: ``s`` for durations, ``{call}`` and
  ``{request}`` for counts.

Every method here runs on whichever thread meets the event (a caller's, a tool queue
actor's, a worker's): the SDK's spans and instruments are thread-safe.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import propagate
from opentelemetry import trace as otel_trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from actors.results import ToolResult
from actors.telemetry.config import ACTIVE, Telemetry
from actors.tool import RunInfo, Tool
from stores.money import Money

__all__ = ["CallTrace", "HttpSpan", "Instruments", "Sending"]

SCOPE = "tooldispatch"
"""The instrumentation scope's name (tracer and meter)."""


log = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])
_faulted: set[str] = set()


def observer(fn: _F) -> _F:
    """Telemetry observes and never decides: an error in it (an exporter's, a span
    processor's, a meter's) is logged (at WARNING the first time for each place, then at
    DEBUG) and goes no further, so no call, answer or paid output is lost to it. The
    wrapped function then returns None."""

    where = fn.__qualname__

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception:
            _fault(where)
            return None

    return guarded  # type: ignore[return-value]


def _fault(where: str) -> None:
    """Log the error being handled, telemetry's in ``where`` (see :func:`observer`)."""
    level = logging.DEBUG if where in _faulted else logging.WARNING
    _faulted.add(where)
    log.log(level, "telemetry failed in %s (the call goes on without it)", where, exc_info=True)


def _wall_ns(monotonic_s: float) -> int:
    """Epoch nanoseconds of a ``time.monotonic()`` instant (span and event timestamps)."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


def error_type(error: BaseException | None) -> str:
    """An error's ``error.type``: its fully qualified class name (a builtin's bare name)."""
    if error is None:
        return "unknown"
    kind = type(error)
    try:  # (a foreign error's class may answer anything)
        module, name = str(kind.__module__), str(kind.__qualname__)
    except Exception:
        return "unknown"
    return name if module == "builtins" else f"{module}.{name}"


def _amount(money: Money) -> str:
    return f"{money.amount:f}"


class Instruments:
    """The tracer, the meter and the instruments of one system.

    Args:
        config: what to emit, and with which providers.
        run: the run (its org is an attribute of every call span).
        pacing: ``() -> {"org/provider": {"rate_rps": float | None, ...}}``, the
            governor's pacing report (read by the pacing-rate gauge's callback, on the
            metric reader's thread); None: no such gauge.

    Raises:
        TelemetryUnavailableError: never here (this module imports ``opentelemetry``:
            :func:`actors.telemetry.open_instruments` raises it when that fails).
    """

    def __init__(
        self,
        config: Telemetry,
        run: RunInfo,
        pacing: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
    ) -> None:
        self.run = run
        self._pacing = pacing
        self.tracer: Any = None
        if config.traces:
            provider = config.tracer_provider or otel_trace.get_tracer_provider()
            self.tracer = provider.get_tracer(SCOPE)
        self.metrics = config.metrics
        meter_provider = config.meter_provider or otel_metrics.get_meter_provider()
        meter = meter_provider.get_meter(SCOPE)
        self.calls = meter.create_counter(
            "tooldispatch.calls", unit="{call}",
            description="Calls answered, by tool, provider, execution and outcome.",
        )  # fmt: skip
        self.duration = meter.create_histogram(
            "tooldispatch.call.duration", unit="s",
            description="From execute to the caller's answer, by tool, provider, execution and outcome.",
        )  # fmt: skip
        self.waits = meter.create_histogram(
            "tooldispatch.wait.duration", unit="s",
            description="Time calls waited, by reason (tooldispatch.wait.reason).",
        )  # fmt: skip
        self.rate_limited = meter.create_counter(
            "tooldispatch.rate_limited", unit="{request}",
            description="Requests the provider answered 429 (or 503 with Retry-After).",
        )  # fmt: skip
        self.spent = meter.create_counter(
            "tooldispatch.cost.spent", unit="1",
            description="What paid answers cost, in the currency named by tooldispatch.cost.currency.",
        )  # fmt: skip
        self.saved = meter.create_counter(
            "tooldispatch.cost.saved", unit="1",
            description="What calls answered from receipts cost when paid, per tooldispatch.cost.currency.",
        )  # fmt: skip
        if pacing is not None:
            meter.create_observable_gauge(
                "tooldispatch.pacing.rate", callbacks=[self._rates], unit="{request}/s",
                description="Current pacing rate per org and provider (paced providers only).",
            )  # fmt: skip

    # -- calls ------------------------------------------------------------------------

    @observer
    def call(self, tool: Tool, key: str, now: float) -> CallTrace | None:
        """A call of ``tool`` under receipt ``key`` begins (``now``: ``time.monotonic()``),
        on the caller's thread: its span's parent is the caller's current context."""
        return CallTrace(self, tool, key, now)

    @observer
    def answered_here(
        self, tool: Tool, futures: Sequence[Any], now: float, skip: Sequence[Any], priced: Mapping[int, Money]
    ) -> None:
        """Calls answered on the caller's thread (memo hits, a rerun's plain reads, inputs
        that cannot be keyed): a span each, begun and ended now. ``skip``: futures whose
        call has a trace of its own (queued); ``priced``: index -> what a receipt that
        answered one cost when paid."""
        queued = {id(f) for f in skip}
        for index, future in enumerate(futures):
            if id(future) not in queued:
                value, _ = future.peek()
                trace = CallTrace(self, tool, value.receipt_key if isinstance(value, ToolResult) else "", now)
                trace.cost = priced.get(index)
                trace.done(future)

    @observer
    def money(self, costs: Sequence[Money], tool: str, saved: bool) -> None:
        """What answers of ``tool`` cost (paid now, or ``saved``: answered from receipts)."""
        if not self.metrics:
            return
        counter = self.saved if saved else self.spent
        for cost in costs:
            counter.add(
                float(cost.amount), {"gen_ai.tool.name": tool, "tooldispatch.cost.currency": cost.currency}
            )

    @observer
    def backpressure(self, tool: str, provider: str) -> None:
        """A request of ``tool`` was answered 429 (or 503 with Retry-After)."""
        if self.metrics:
            self.rate_limited.add(1, {"gen_ai.tool.name": tool, "tooldispatch.provider": provider})

    def _rates(self, options: CallbackOptions) -> list[Observation]:
        assert self._pacing is not None
        try:
            report = self._pacing()
        except Exception:  # stopped, or busy past the bound: no figure this time
            return []
        out = []
        for name, entry in report.items():
            rate = entry.get("rate_rps")
            if rate is None:
                continue
            org, _, provider = name.partition("/")
            out.append(Observation(float(rate), {"tooldispatch.org": org, "tooldispatch.provider": provider}))
        return out

    # -- sending ----------------------------------------------------------------------

    def sending(
        self,
        tool: Tool,
        traces: Sequence[CallTrace | None],
        attempt: int,
        batched: bool,
        idempotency_key: str,
    ) -> Sending:
        """A worker is about to send one request for the calls of ``traces`` (each
        member's owner, or None); see :class:`Sending` (one that fails to begin is an
        inert one: :func:`observer`)."""
        begun: Sending = _begun(Sending, self, tool, traces, attempt, batched, idempotency_key)
        return begun

    def http(self, method: str, url: Any, resend_count: int, headers: dict[str, str]) -> HttpSpan:
        """An HTTP request begins (``url``: an ``httpx.URL``); its ``traceparent`` is put
        in ``headers`` (W3C trace context, the global propagator)."""
        begun: HttpSpan = _begun(HttpSpan, self, method, url, resend_count, headers)
        return begun


def _begun(kind: Any, *args: Any) -> Any:
    """``kind(*args)``, or an inert ``kind`` (every slot None: its ``close`` does nothing)
    when beginning it failed (:func:`observer`)."""
    try:
        return kind(*args)
    except Exception:
        _fault(kind.__qualname__)
        inert = kind.__new__(kind)
        for slot in kind.__slots__:
            setattr(inert, slot, None)
        return inert


class CallTrace:
    """One call's span and timings, from ``execute`` to its answer.

    ``done`` is the call future's done callback (runs on whichever thread answers it);
    :meth:`wait` records a wait (a span event ``tooldispatch.wait`` and the wait
    histogram); the worker sets :attr:`attempt`, :attr:`returned_at` and :attr:`cost`.
    """

    __slots__ = (
        "attempt",
        "context",
        "cost",
        "ins",
        "key",
        "provider",
        "returned_at",
        "span",
        "started",
        "tool",
    )

    def __init__(self, ins: Instruments, tool: Tool, key: str, now: float) -> None:
        self.ins = ins
        self.tool = tool.tool_id
        self.provider = tool.provider_name
        self.key = key
        self.started = now
        self.attempt = 0
        """Attempts sent for it (its execution's, for the call that ran the tool)."""
        self.cost: Money | None = None
        """What its answer cost (paid: ``live``; when paid: ``cached``)."""
        self.returned_at: float | None = None
        """``time.monotonic()`` when the tool's function returned for it (the store write's start)."""
        self.span: Any = None
        self.context: Any = None
        """The OpenTelemetry context with its span current (attached on the worker)."""
        if ins.tracer is not None:
            self._start_span(ins, key, now)

    @observer
    def _start_span(self, ins: Instruments, key: str, now: float) -> None:
        if ins.tracer is not None:
            self.span = ins.tracer.start_span(
                f"execute_tool {self.tool}", kind=SpanKind.INTERNAL, start_time=_wall_ns(now),
                attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": self.tool,
                    "gen_ai.tool.call.id": key, "tooldispatch.receipt_key": key,
                    "tooldispatch.provider": self.provider, "tooldispatch.org": ins.run.org_id,
                    "tooldispatch.run_id": ins.run.run_id,
                },
            )  # fmt: skip
            self.context = otel_trace.set_span_in_context(self.span)

    @observer
    def wait(self, reason: str, since: float, until: float) -> None:
        """It waited from ``since`` to ``until`` (``time.monotonic()``) for ``reason`` (one
        of :data:`~actors.telemetry.config.WAIT_REASONS`)."""
        duration = max(0.0, until - since)
        ins = self.ins
        if ins.metrics:
            ins.waits.record(duration, {
                "tooldispatch.wait.reason": reason, "gen_ai.tool.name": self.tool,
                "tooldispatch.provider": self.provider,
            })  # fmt: skip
        span = self.span
        if span is not None and span.is_recording():
            span.add_event(
                "tooldispatch.wait",
                {"tooldispatch.wait.reason": reason, "tooldispatch.wait.duration_s": duration},
                timestamp=_wall_ns(since),
            )

    @observer
    def done(self, future: Any) -> None:
        """The call's future is set: its answer ends the span and counts in the metrics."""
        now = time.monotonic()
        value, error = future.peek()
        attributes: dict[str, Any] = {"gen_ai.tool.name": self.tool, "tooldispatch.provider": self.provider}
        if isinstance(value, ToolResult):
            attributes["tooldispatch.execution"] = value.execution
            attributes["tooldispatch.outcome"] = value.status
            if self.returned_at is not None:
                self.wait("store_write", self.returned_at, now)
        else:
            attributes["tooldispatch.outcome"] = "error"
            attributes["error.type"] = error_type(error)
        ins = self.ins
        if ins.metrics:
            ins.calls.add(1, attributes)
            ins.duration.record(now - self.started, attributes)
        span = self.span
        if span is None:
            return
        if isinstance(value, ToolResult):
            if not self.key:
                span.set_attribute("gen_ai.tool.call.id", value.receipt_key)
                span.set_attribute("tooldispatch.receipt_key", value.receipt_key)
        else:
            span.set_status(Status(StatusCode.ERROR, error_type(error)))
        span.set_attributes(attributes)
        if self.attempt:
            span.set_attribute("tooldispatch.attempt", self.attempt)
        cost = self.cost
        if cost is not None:
            span.set_attribute("tooldispatch.cost.amount", _amount(cost))
            span.set_attribute("tooldispatch.cost.currency", cost.currency)
        span.end(end_time=_wall_ns(now))


class Sending:
    """One request on its worker: the calls' attempt noted, the context attached (the
    single call's span, or a batch span linked to its members' call spans), and
    :data:`~actors.telemetry.config.ACTIVE` set, until :meth:`close` (same thread)."""

    __slots__ = ("_active", "_token", "span", "traces")

    def __init__(
        self, ins: Instruments, tool: Tool, traces: Sequence[CallTrace | None], attempt: int,
        batched: bool, idempotency_key: str,
    ) -> None:  # fmt: skip
        self.traces = traces
        for trace in traces:
            if trace is not None:
                trace.attempt = attempt
        self.span: Any = None
        context = None
        if batched and ins.tracer is not None:
            links = [Link(t.span.get_span_context()) for t in traces if t is not None and t.span is not None]
            self.span = ins.tracer.start_span(
                f"tooldispatch.batch {tool.tool_id}", kind=SpanKind.INTERNAL, links=links,
                context=otel_context.Context(),  # a root: its members' spans are its links
                attributes={
                    "gen_ai.tool.name": tool.tool_id, "tooldispatch.provider": tool.provider_name,
                    "tooldispatch.org": ins.run.org_id, "tooldispatch.batch.size": len(traces),
                    "tooldispatch.attempt": attempt, "tooldispatch.idempotency_key": idempotency_key,
                },
            )  # fmt: skip
            context = otel_trace.set_span_in_context(self.span)
        elif traces and traces[0] is not None:
            context = traces[0].context
        self._token = otel_context.attach(context) if context is not None else None
        self._active = ACTIVE.set(ins)

    @observer
    def close(self, error: BaseException | None) -> None:
        """The request returned (or raised ``error``)."""
        if self._active is not None:
            ACTIVE.reset(self._active)
        if self._token is not None:
            otel_context.detach(self._token)
        now = time.monotonic()
        for trace in self.traces or ():
            if trace is not None:
                trace.returned_at = now
        span = self.span
        if span is not None:
            if error is not None:
                span.set_attribute("error.type", error_type(error))
                span.set_status(Status(StatusCode.ERROR, error_type(error)))
            span.end()


class HttpSpan:
    """One HTTP client span (``http`` semconv); end it with :meth:`close`."""

    __slots__ = ("span",)

    def __init__(
        self, ins: Instruments, method: str, url: Any, resend_count: int, headers: dict[str, str]
    ) -> None:
        self.span: Any = None
        if ins.tracer is None:
            return
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.full": str(url),
            "server.address": url.host,
        }
        if url.port is not None:
            attributes["server.port"] = url.port
        if resend_count:
            attributes["http.request.resend_count"] = resend_count
        self.span = ins.tracer.start_span(method, kind=SpanKind.CLIENT, attributes=attributes)
        propagate.inject(headers, context=otel_trace.set_span_in_context(self.span))

    @observer
    def close(self, status: int | None, error: BaseException | None) -> None:
        """The answer's status code, or the error the request raised."""
        span = self.span
        if span is None:
            return
        if status is not None:
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                span.set_attribute("error.type", str(status))
                span.set_status(Status(StatusCode.ERROR))
        elif error is not None:
            span.set_attribute("error.type", error_type(error))
            span.set_status(Status(StatusCode.ERROR, error_type(error)))
        span.end()
