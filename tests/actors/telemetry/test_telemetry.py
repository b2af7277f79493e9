"""OpenTelemetry through real dispatch systems on a SQLite file: the call spans (GenAI
``execute_tool``) and their attributes for live, cached and in_flight calls, a batch
request's span linked to its members' spans, the caller's context inside the tool function,
the waits recorded by reason, the metrics' values; and no span at all when telemetry is off.

The SDK's in-memory span exporter and metric reader stand in for a backend. A span ends in
its call future's done callback, which may run just after the caller's ``get`` returns:
the tests wait for the spans they expect (bounded) rather than read them at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any

import attrs
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from actors import (
    BatchStrategy,
    DispatchSystem,
    Pacing,
    Policy,
    ProviderError,
    RateLimitedError,
    RunInfo,
    Telemetry,
    Tool,
)
from stores import FailureKind
from stores.money import Money

from ..conftest import ORG, SCOPE, WAIT_S, until


@attrs.define
class Otel:
    """An SDK tracer and meter provider exporting to memory."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    telemetry: Telemetry

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def wait_spans(self, name: str, n: int) -> list[ReadableSpan]:
        until(lambda: len(self.spans(name)) >= n, f"{n} spans named {name!r}")
        return self.spans(name)

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        found.append((m, list(m.data.data_points)))
        assert found, f"no metric {metric}"
        ((m, points),) = found
        return [(m.unit, dict(p.attributes), p) for p in points]


@pytest.fixture
def otel() -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(
        exporter,
        reader,
        tracer_provider,
        Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider),
    )
    tracer_provider.shutdown()
    meter_provider.shutdown()


@pytest.fixture
def start(make_system: Any, open_store: Callable[..., Any]) -> Callable[..., DispatchSystem]:
    """``start(tools, telemetry=..., run_id=..., policy=...)``: a system on the test's
    receipt file, stopped at teardown with ``make_system``'s."""

    def start_(
        tools: Sequence[Tool],
        *,
        telemetry: Telemetry | None,
        run_id: str = "r1",
        policy: Policy | None = None,
    ) -> DispatchSystem:
        system = DispatchSystem.start(
            tools=tools, store=open_store(), run=RunInfo(run_id=run_id, org_id=ORG, scope=SCOPE),
            policy=policy or Policy(batch_grace_s=0.05), telemetry=telemetry,
        )  # fmt: skip
        make_system.systems.append(system)
        return system

    return start_


def waits(span: ReadableSpan) -> dict[str, float]:
    """Reason -> seconds waited (added up), from the span's ``tooldispatch.wait`` events."""
    out: dict[str, float] = {}
    for event in span.events:
        assert event.name == "tooldispatch.wait"
        attributes = event.attributes or {}
        reason = str(attributes["tooldispatch.wait.reason"])
        out[reason] = out.get(reason, 0.0) + float(attributes["tooldispatch.wait.duration_s"])  # type: ignore[arg-type]
    return out


def test_telemetry_live_call_span_follows_the_genai_convention(otel: Otel, start: Any, key_of: Any) -> None:
    tool = Tool(
        tool_id="verify", fn=lambda input, ctx: {"ok": input}, provider="acme", price=Money("0.002", "USD")
    )
    system = start([tool], telemetry=otel.telemetry)
    result = system.proxy().execute("verify", 1).get(timeout=WAIT_S)
    assert result.execution == "live"
    (span,) = otel.wait_spans("execute_tool verify", 1)
    assert span.kind is SpanKind.INTERNAL
    assert span.status.status_code is StatusCode.UNSET
    key = key_of(tool, 1)
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "verify",
        "gen_ai.tool.call.id": key,
        "tooldispatch.receipt_key": key,
        "tooldispatch.provider": "acme",
        "tooldispatch.org": ORG,
        "tooldispatch.run_id": "r1",
        "tooldispatch.execution": "live",
        "tooldispatch.outcome": "ok",
        "tooldispatch.attempt": 1,
        "tooldispatch.cost.amount": "0.002",
        "tooldispatch.cost.currency": "USD",
    }
    assert "store_write" in waits(span)


def test_telemetry_cached_and_in_flight_calls(otel: Otel, start: Any) -> None:
    release = threading.Event()
    entered = threading.Event()

    def slow(input: Any, ctx: Any) -> Any:
        entered.set()
        assert release.wait(WAIT_S)
        return {"v": input}

    tool = Tool(tool_id="slow", fn=slow, price=Money("1.5", "EUR"))
    system = start([tool], telemetry=otel.telemetry)
    proxy = system.proxy()
    first = proxy.execute("slow", 1)
    assert entered.wait(WAIT_S)
    joined = proxy.execute("slow", 1)  # the same key while it runs: joins it
    release.set()
    assert first.get(timeout=WAIT_S).execution == "live"
    assert joined.get(timeout=WAIT_S).execution == "in_flight"
    assert proxy.execute("slow", 1).get(timeout=WAIT_S).execution == "cached"  # the memo
    spans = otel.wait_spans("execute_tool slow", 3)
    by = {s.attributes["tooldispatch.execution"]: s for s in spans}  # type: ignore[index]
    assert set(by) == {"live", "in_flight", "cached"}
    assert by["live"].attributes["tooldispatch.cost.amount"] == "1.5"  # type: ignore[index]
    assert "tooldispatch.cost.amount" not in by["in_flight"].attributes  # type: ignore[operator]
    assert "tooldispatch.attempt" not in by["cached"].attributes  # type: ignore[operator]
    assert by["cached"].attributes["tooldispatch.cost.currency"] == "EUR"  # type: ignore[index]

    rerun = start([tool], telemetry=otel.telemetry, run_id="r2")  # a rerun: a plain read answers
    assert rerun.proxy().execute("slow", 1).get(timeout=WAIT_S).execution == "cached"
    # under a receipt-op budget no plain read is made: the claim finds the receipt completed
    claimed = start([tool], telemetry=otel.telemetry, run_id="r3", policy=Policy(max_receipt_ops=100))
    assert claimed.proxy().execute("slow", 1).get(timeout=WAIT_S).execution == "cached"
    spans = otel.wait_spans("execute_tool slow", 5)
    cached = [s for s in spans if s.attributes["tooldispatch.execution"] == "cached"]  # type: ignore[index]
    assert [s.attributes["tooldispatch.cost.amount"] for s in cached] == ["1.5"] * 3  # type: ignore[index]


def test_telemetry_failed_call_span_has_error_type(otel: Otel, start: Any) -> None:
    def refuse(input: Any, ctx: Any) -> Any:
        raise ProviderError("no such mailbox", failure_kind=FailureKind.PERMANENT)

    system = start([Tool(tool_id="refuse", fn=refuse)], telemetry=otel.telemetry)
    with pytest.raises(ProviderError):
        system.proxy().execute("refuse", 1).get(timeout=WAIT_S)
    (span,) = otel.wait_spans("execute_tool refuse", 1)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["tooldispatch.outcome"] == "error"  # type: ignore[index]
    assert span.attributes["error.type"] == "actors.errors.ProviderError"  # type: ignore[index]


def test_telemetry_context_reaches_the_tool_function(otel: Otel, start: Any) -> None:
    """The caller's span is the call span's parent; the call span is current inside the tool
    function, so the tool's own spans nest under it."""
    tracer = otel.tracer_provider.get_tracer("host")
    seen: list[Any] = []

    def fn(input: Any, ctx: Any) -> Any:
        seen.append(trace.get_current_span().get_span_context())
        with tracer.start_as_current_span("inside the tool"):
            return input

    system = start([Tool(tool_id="fn", fn=fn)], telemetry=otel.telemetry)
    with tracer.start_as_current_span("host row") as row:
        system.proxy().execute("fn", 1).get(timeout=WAIT_S)
    (call,) = otel.wait_spans("execute_tool fn", 1)
    (inner,) = otel.spans("inside the tool")
    assert call.parent is not None and call.parent.span_id == row.get_span_context().span_id
    assert call.context.trace_id == row.get_span_context().trace_id
    assert seen == [call.context]
    assert inner.parent is not None and inner.parent.span_id == call.context.span_id


def test_telemetry_batch_span_is_linked_to_its_members(otel: Otel, start: Any) -> None:
    tracer = otel.tracer_provider.get_tracer("host")

    def many(payload: Any, ctx: Any) -> Any:
        with tracer.start_as_current_span("inside the batch"):
            return [{"v": v} for v in payload]

    tool = Tool(tool_id="b", fn=lambda i, c: {"v": i}, batch=BatchStrategy(batch_fn=many, max_batch_size=10))
    system = start([tool], telemetry=otel.telemetry, policy=Policy(batch_grace_s=0.1))
    futures = system.proxy().execute_many("b", [1, 2, 3])
    assert [f.get(timeout=WAIT_S).execution for f in futures] == ["live"] * 3
    members = otel.wait_spans("execute_tool b", 3)
    (batch,) = otel.spans("tooldispatch.batch b")
    (inner,) = otel.spans("inside the batch")
    assert {link.context.span_id for link in batch.links} == {m.context.span_id for m in members}
    assert batch.attributes["tooldispatch.batch.size"] == 3  # type: ignore[index]
    assert inner.parent is not None and inner.parent.span_id == batch.context.span_id
    for member in members:  # each waited in the grace window for its mates
        assert waits(member)["batch_grace"] >= 0.05


def test_telemetry_waits_for_retry_backoff_and_pause(otel: Otel, start: Any) -> None:
    attempts: dict[str, int] = {}

    def flaky(input: Any, ctx: Any) -> Any:
        attempts[input] = attempts.get(input, 0) + 1
        if attempts[input] == 1:
            if input == "limited":
                raise RateLimitedError("429", retry_after="0.3")
            raise ProviderError("503", failure_kind=FailureKind.TRANSIENT)
        return input

    tool = Tool(tool_id="flaky", fn=flaky, retry_safe=True)
    system = start([tool], telemetry=otel.telemetry, policy=Policy(batch_grace_s=0.0, retry_backoff_s=0.2))
    assert system.proxy().execute("flaky", "transient").get(timeout=WAIT_S).value == "transient"
    assert system.proxy().execute("flaky", "limited").get(timeout=WAIT_S).value == "limited"
    spans = otel.wait_spans("execute_tool flaky", 2)
    transient, limited = sorted(spans, key=lambda s: s.start_time or 0)
    assert transient.attributes["tooldispatch.attempt"] == 2  # type: ignore[index]
    assert waits(transient)["retry_backoff"] >= 0.15  # jittered around 0.2 s
    assert waits(limited)["pause"] >= 0.15  # most of the 0.3 s Retry-After (its start was told late)
    ((unit, attributes, point),) = otel.points("tooldispatch.rate_limited")
    assert (unit, attributes, point.value) == (
        "{request}",
        {"gen_ai.tool.name": "flaky", "tooldispatch.provider": "flaky"},
        1,
    )


def test_telemetry_waits_at_the_send_gate(otel: Otel, start: Any) -> None:
    tool = Tool(tool_id="paced", fn=lambda i, c: i, pacing=Pacing(rps=50.0))
    system = start([tool], telemetry=otel.telemetry, policy=Policy(batch_grace_s=0.0))
    assert system.proxy().execute("paced", 0).get(timeout=WAIT_S).value == 0
    system.gates.get(ORG, "paced").set_rate(4.0)  # a turn every 0.25 s (as after a 429's cut)
    assert [f.get(timeout=WAIT_S).value for f in system.proxy().execute_many("paced", [1, 2])] == [1, 2]
    spans = otel.wait_spans("execute_tool paced", 3)
    assert max(waits(s).get("pacing", 0.0) for s in spans) >= 0.2


def test_telemetry_waits_on_another_owner(otel: Otel, start: Any) -> None:
    release = threading.Event()
    entered = threading.Event()

    def slow(input: Any, ctx: Any) -> Any:
        entered.set()
        assert release.wait(WAIT_S)
        return input

    tool = Tool(tool_id="slow", fn=slow)
    policy = Policy(batch_grace_s=0.0, receipt_poll_initial_s=0.01, receipt_poll_max_s=0.05)
    owner = start([tool], telemetry=None, run_id="owner", policy=policy)
    waiter = start([tool], telemetry=otel.telemetry, run_id="waiter", policy=policy)
    first = owner.proxy().execute("slow", 1)
    assert entered.wait(WAIT_S)
    second = waiter.proxy().execute("slow", 1)
    until(lambda: waiter.stats()["waiting_on_owner"] == 1, "the second run to wait on the first's receipt")
    threading.Event().wait(0.2)  # (a wait long enough to measure)
    third = waiter.proxy().execute("slow", 1)  # joins the waiting call, 0.2 s later
    until(lambda: waiter.stats()["waiting_on_owner"] == 2, "the third call to join the wait")
    release.set()
    assert first.get(timeout=WAIT_S).execution == "live"
    assert second.get(timeout=WAIT_S).value == third.get(timeout=WAIT_S).value == 1  # the owner's output
    spans = sorted(otel.wait_spans("execute_tool slow", 2), key=lambda s: s.start_time or 0)
    assert waits(spans[0])["owner"] >= 0.2
    assert waits(spans[1])["owner"] < waits(spans[0])["owner"] - 0.15  # from when it joined


def test_telemetry_metrics_count_calls_duration_and_money(otel: Otel, start: Any) -> None:
    tool = Tool(tool_id="t", fn=lambda i, c: i, provider="acme", price=Money("0.25", "USD"))
    system = start([tool], telemetry=otel.telemetry)
    proxy = system.proxy()
    assert [f.get(timeout=WAIT_S).execution for f in proxy.execute_many("t", [1, 2])] == ["live", "live"]
    assert proxy.execute("t", 1).get(timeout=WAIT_S).execution == "cached"
    otel.wait_spans("execute_tool t", 3)
    calls = {
        (a["tooldispatch.execution"], a["tooldispatch.outcome"]): (unit, p.value)
        for unit, a, p in otel.points("tooldispatch.calls")
    }
    assert calls == {("live", "ok"): ("{call}", 2), ("cached", "ok"): ("{call}", 1)}
    durations = {
        a["tooldispatch.execution"]: (unit, p.count)
        for unit, a, p in otel.points("tooldispatch.call.duration")
    }
    assert durations == {"live": ("s", 2), "cached": ("s", 1)}
    ((_, spent_attributes, spent),) = otel.points("tooldispatch.cost.spent")
    ((_, saved_attributes, saved),) = otel.points("tooldispatch.cost.saved")
    assert (
        spent_attributes == saved_attributes == {"gen_ai.tool.name": "t", "tooldispatch.cost.currency": "USD"}
    )
    assert (Decimal(str(spent.value)), Decimal(str(saved.value))) == (Decimal("0.5"), Decimal("0.25"))
    reasons = {a["tooldispatch.wait.reason"] for _, a, _ in otel.points("tooldispatch.wait.duration")}
    assert "store_write" in reasons


def test_telemetry_pacing_rate_gauge(otel: Otel, start: Any) -> None:
    tool = Tool(tool_id="paced", fn=lambda i, c: i, provider="acme", pacing=Pacing(rps=25.0))
    system = start([tool], telemetry=otel.telemetry)
    system.proxy().execute("paced", 1).get(timeout=WAIT_S)
    ((unit, attributes, point),) = otel.points("tooldispatch.pacing.rate")
    assert (unit, attributes) == ("{request}/s", {"tooldispatch.org": ORG, "tooldispatch.provider": "acme"})
    assert 20.0 <= point.value <= 25.0  # the stated rate, less the bucket's headroom


def test_telemetry_off_makes_no_span(otel: Otel, start: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``telemetry=`` nothing is traced, even with an SDK provider as the global one
    (and the tool function runs with no span current); with ``Telemetry()`` the global
    providers are the default."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", otel.tracer_provider)  # the global, for this test
    seen: list[Any] = []

    def fn(input: Any, ctx: Any) -> Any:
        seen.append(trace.get_current_span())
        return input

    off = start([Tool(tool_id="fn", fn=fn)], telemetry=None)
    assert off.telemetry is None
    assert off.proxy().execute("fn", 1).get(timeout=WAIT_S).execution == "live"
    assert off.proxy().execute("fn", 1).get(timeout=WAIT_S).execution == "cached"
    assert seen == [trace.INVALID_SPAN]
    assert otel.spans() == []
    on = start([Tool(tool_id="fn", fn=fn)], telemetry=Telemetry(), run_id="r2")
    on.proxy().execute("fn", 2).get(timeout=WAIT_S)
    assert [s.name for s in otel.wait_spans("execute_tool fn", 1)] == ["execute_tool fn"]
