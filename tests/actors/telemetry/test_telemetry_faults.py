"""Telemetry observes and never decides: a span processor or a meter that raises (at a
span's start or end, at an event, at a measurement) loses no call, no answer and no paid
output; the receipts are completed, what was spent is counted, later calls are answered
from the receipts. Real dispatch systems on a SQLite file."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from actors import BatchStrategy, DispatchSystem, Policy, RunInfo, Telemetry, Tool
from stores import ReceiptStatus
from stores.money import Money

from ..conftest import ORG, SCOPE, WAIT_S

PAID = Money("1", "USD")


class Broken(SpanProcessor):  # type: ignore[misc]
    """A span processor that raises where it is told to."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start":
            raise RuntimeError("on_start boom")

    def on_end(self, span: Any) -> None:
        if self.where == "end":
            raise RuntimeError("on_end boom")


class BrokenMeter(MeterProvider):  # type: ignore[misc]
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        meter = super().get_meter(*args, **kwargs)

        class Failing:
            def __getattr__(self, name: str) -> Any:
                found = getattr(meter, name)
                if not name.startswith("create_"):
                    return found

                def create(*a: Any, **k: Any) -> Any:
                    instrument = found(*a, **k)

                    class Instrument:
                        def add(self, *_: Any, **__: Any) -> None:
                            raise RuntimeError("meter boom")

                        record = add

                    return Instrument() if name in ("create_counter", "create_histogram") else instrument

                return create

        return Failing()


def _tools() -> list[Tool]:
    batch = BatchStrategy(batch_fn=lambda payload, ctx: [{"n": i["n"]} for i in payload], max_batch_size=10)
    return [
        Tool(tool_id="single", fn=lambda input, ctx: {"n": input["n"]}, price=PAID),
        Tool(tool_id="batched", fn=lambda input, ctx: {"n": input["n"]}, batch=batch, price=PAID),
    ]


@pytest.fixture
def start(make_system: Any, open_store: Callable[..., Any]) -> Callable[..., DispatchSystem]:
    def start_(telemetry: Telemetry, run_id: str) -> DispatchSystem:
        system = DispatchSystem.start(
            tools=_tools(), store=open_store(), run=RunInfo(run_id=run_id, org_id=ORG, scope=SCOPE),
            policy=Policy(batch_grace_s=0.05), telemetry=telemetry,
        )  # fmt: skip
        make_system.systems.append(system)
        return system

    return start_


def _executions(system: DispatchSystem, tool_id: str, n: int) -> Sequence[str]:
    futures = system.proxy().execute_many(tool_id, [{"n": i} for i in range(n)])
    return [f.get(timeout=WAIT_S).execution for f in futures]


@pytest.mark.parametrize("where", ["start", "end", "meter"])
def test_a_failing_telemetry_backend_loses_no_paid_answer(
    start: Any, read_receipts: Any, key_of: Any, where: str
) -> None:
    tracer_provider = TracerProvider()
    reader = InMemoryMetricReader()
    if where == "meter":
        meter_provider: MeterProvider = BrokenMeter(metric_readers=[reader])
    else:
        tracer_provider.add_span_processor(Broken(where))
        meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    system = start(telemetry, "first")
    for tool_id in ("single", "batched"):
        assert _executions(system, tool_id, 5) == ["live"] * 5
    assert system.stats()["spent"]["total"] == {"USD": PAID * 10}
    for tool in _tools():
        receipts = read_receipts([key_of(tool, {"n": i}) for i in range(5)])
        assert [r.status for r in receipts] == [ReceiptStatus.COMPLETED] * 5
    assert _executions(system, "single", 5) == ["cached"] * 5  # the memo, on the caller's thread
    system.stop(timeout_s=WAIT_S)
    rerun = start(telemetry, "rerun")
    assert _executions(rerun, "batched", 5) == ["cached"] * 5  # the store's plain read
    tracer_provider.shutdown()
    meter_provider.shutdown()
