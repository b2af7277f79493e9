"""``tooldispatch run --otel`` end to end: the CLI in a subprocess exports its spans and
metrics over OTLP/HTTP (protobuf) to a receiver started here, a plain HTTP server on
127.0.0.1 that decodes each ``ExportTraceServiceRequest`` and ``ExportMetricsServiceRequest``
with opentelemetry-proto (no OpenTelemetry collector binary is installed here)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

pytest.importorskip("opentelemetry.proto")

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

pytestmark = pytest.mark.scenario

PLAY = """
from actors import Tool
from stores.money import Money


def double(input, ctx):
    return {"n": input["n"] * 2}


tools = [Tool(tool_id="double", fn=double, provider="math", price=Money("0.01", "USD"))]


def play(row, ctx):
    return ctx.tool("double", {"n": int(row["n"])})
"""


class Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps what each export carried, answers an empty success."""

    traces: ClassVar[list[ExportTraceServiceRequest]] = []
    metrics: ClassVar[list[ExportMetricsServiceRequest]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert self.headers["Content-Type"] == "application/x-protobuf"
        if self.path == "/v1/traces":
            request: Any = ExportTraceServiceRequest.FromString(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            kept: list[Any] = Receiver.traces
        elif self.path == "/v1/metrics":
            request = ExportMetricsServiceRequest.FromString(body)
            reply = ExportMetricsServiceResponse().SerializeToString()
            kept = Receiver.metrics
        else:
            self.send_response(404)
            self.end_headers()
            return
        with Receiver.lock:
            kept.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.traces, Receiver.metrics = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_cli_otel_without_the_packages(cli: Any, tmp_path: Any) -> None:
    """Where ``opentelemetry`` cannot be imported, a run without ``--otel`` never needs it,
    and ``--otel`` is a configuration error naming the extra to install (exit 2)."""
    blocked = tmp_path / "blocked"
    (blocked / "opentelemetry").mkdir(parents=True)
    (blocked / "opentelemetry" / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    play = tmp_path / "math_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "rows.csv"
    rows.write_text("n\n1\n", encoding="utf-8")
    env = cli.env()
    env["PYTHONPATH"] = f"{blocked}{os.pathsep}{env['PYTHONPATH']}"
    plain = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", env=env)
    assert plain.returncode == 0, plain.stderr
    traced = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--otel", env=env)
    assert traced.returncode == 2, traced.stderr
    assert "pip install 'tooldispatch[otel]'" in traced.stderr


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


def test_cli_otel_exports_spans_and_metrics_over_otlp_http(cli: Any, tmp_path: Any, receiver: str) -> None:
    play = tmp_path / "math_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "rows.csv"
    rows.write_text("n\n1\n2\n2\n", encoding="utf-8")
    env = cli.env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver, OTEL_SERVICE_NAME="otel-test")
    done = cli.run("run", play, "--input", rows, "--db", tmp_path / "r.db", "--otel", env=env)
    assert done.returncode == 0, done.stderr

    spans = [
        (resource.resource, span)
        for request in Receiver.traces
        for resource in request.resource_spans
        for scope in resource.scope_spans
        if scope.scope.name == "tooldispatch"
        for span in scope.spans
    ]
    calls = [(r, s) for r, s in spans if s.name == "execute_tool double"]
    assert len(calls) == 3
    resource = {a.key: _value(a.value) for a in calls[0][0].attributes}
    assert resource["service.name"] == "otel-test"
    attributes = [{a.key: _value(a.value) for a in s.attributes} for _, s in calls]
    assert {a["gen_ai.operation.name"] for a in attributes} == {"execute_tool"}
    assert {a["tooldispatch.provider"] for a in attributes} == {"math"}
    assert sorted(a["tooldispatch.execution"] for a in attributes) in (
        ["cached", "live", "live"],  # the second 2 answered from the memo
        ["in_flight", "live", "live"],  # or joined the first while it ran
    )
    assert sorted(
        a.get("tooldispatch.cost.amount", "") for a in attributes if a["tooldispatch.execution"] == "live"
    ) == [
        "0.01",
        "0.01",
    ]

    metrics = {
        metric.name: metric
        for request in Receiver.metrics
        for resource in request.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert {"tooldispatch.calls", "tooldispatch.call.duration", "tooldispatch.cost.spent"} <= set(metrics)
    assert sum(p.as_int for p in metrics["tooldispatch.calls"].sum.data_points) == 3
    (spent,) = metrics["tooldispatch.cost.spent"].sum.data_points
    assert spent.as_double == pytest.approx(0.02)
    assert metrics["tooldispatch.call.duration"].unit == "s"


SYSTEM_WITHOUT_OTEL = """
import sys, threading
from actors import DispatchSystem, RunInfo, Telemetry, Tool
from actors.telemetry import TelemetryUnavailableError
from stores import open_store

store = open_store(sys.argv[1])
try:
    DispatchSystem.start(tools=[Tool(tool_id="t", fn=lambda i, c: i)], store=store,
                         run=RunInfo(run_id="r", org_id="o", scope="s"), telemetry=Telemetry())
except TelemetryUnavailableError as exc:
    print("refused:", exc)
store.close()
print("threads:", sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()))
"""


def test_a_system_asked_for_telemetry_without_the_packages_starts_nothing(cli: Any, tmp_path: Any) -> None:
    blocked = tmp_path / "blocked"
    (blocked / "opentelemetry").mkdir(parents=True)
    (blocked / "opentelemetry" / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    script = tmp_path / "start.py"
    script.write_text(SYSTEM_WITHOUT_OTEL, encoding="utf-8")
    env = cli.env()
    env["PYTHONPATH"] = f"{blocked}{os.pathsep}{env['PYTHONPATH']}"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "r.db")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "tooldispatch[otel]" in done.stdout
    assert "threads: []" in done.stdout, done.stdout  # no actor, timer or pool thread left behind


@pytest.mark.parametrize("setting", ["OTEL_METRIC_EXPORT_INTERVAL=0", "OTEL_BSP_MAX_QUEUE_SIZE=0"])
def test_cli_otel_settings_that_cannot_be_used_are_a_one_line_error(
    cli: Any, tmp_path: Any, setting: str
) -> None:
    play = tmp_path / "math_play.py"
    play.write_text(PLAY, encoding="utf-8")
    rows = tmp_path / "rows.csv"
    rows.write_text("n\n1\n", encoding="utf-8")
    name, _, value = setting.partition("=")
    done = cli.run(
        "run", play, "--input", rows, "--db", tmp_path / "r.db", "--otel", env=cli.env(**{name: value})
    )
    assert done.returncode == 2, done.stderr
    assert "the OTEL_* settings cannot be used" in done.stderr and "Traceback" not in done.stderr
