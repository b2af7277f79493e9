"""``http_tool``'s requests as HTTP client spans (OpenTelemetry's HTTP semantic conventions)
under the call's span, with the trace context sent as ``traceparent``: a real system on a
SQLite file, a real HTTP server on 127.0.0.1 that answers 503 once, then 200."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from actors import DispatchSystem, Policy, RunInfo, Telemetry
from actors.http import http_tool

from ..conftest import ORG, SCOPE, WAIT_S, until


class Flaky(BaseHTTPRequestHandler):
    """Answers 503 (no Retry-After: a transient error, retried) to the first request, then
    echoes the JSON body; records each request's ``traceparent``."""

    traceparents: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).traceparents.append(self.headers.get("traceparent"))
        if len(type(self).traceparents) == 1:
            self.send_response(503)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"echo": json.loads(body)}).encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    Flaky.traceparents = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_http_spans_nest_under_the_call_with_resend_count(
    server: ThreadingHTTPServer, make_system: Any, open_store: Any
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/lookup"
    system = DispatchSystem.start(
        tools=[http_tool("lookup", url)], store=open_store(),
        run=RunInfo(run_id="r1", org_id=ORG, scope=SCOPE),
        policy=Policy(batch_grace_s=0.0, retry_backoff_s=0.01), telemetry=Telemetry(tracer_provider=provider),
    )  # fmt: skip
    make_system.systems.append(system)
    assert system.proxy().execute("lookup", {"q": 1}).get(timeout=WAIT_S).value == {"echo": {"q": 1}}
    until(
        lambda: any(s.name == "execute_tool lookup" for s in exporter.get_finished_spans()), "the call span"
    )
    spans = exporter.get_finished_spans()
    (call,) = [s for s in spans if s.name == "execute_tool lookup"]
    failed, answered = sorted((s for s in spans if s.name == "POST"), key=lambda s: s.start_time or 0)
    for span in (failed, answered):
        assert span.kind is SpanKind.CLIENT
        assert span.parent is not None and span.parent.span_id == call.context.span_id
    common = {
        "http.request.method": "POST",
        "url.full": url,
        "server.address": "127.0.0.1",
        "server.port": port,
    }
    assert dict(failed.attributes or {}) == {**common, "http.response.status_code": 503, "error.type": "503"}
    assert failed.status.status_code is StatusCode.ERROR
    assert dict(answered.attributes or {}) == {
        **common,
        "http.response.status_code": 200,
        "http.request.resend_count": 1,
    }
    assert Flaky.traceparents == [
        f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{span.context.trace_flags:02x}"
        for span in (failed, answered)
    ]


def test_http_spans_a_refused_connection_names_its_error(make_system: Any, open_store: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with ThreadingHTTPServer(("127.0.0.1", 0), Flaky) as closed:  # a port nobody listens on once closed
        port = closed.server_address[1]
    system = DispatchSystem.start(
        tools=[http_tool("lookup", f"http://127.0.0.1:{port}/x")], store=open_store(),
        run=RunInfo(run_id="r1", org_id=ORG, scope=SCOPE), policy=Policy(batch_grace_s=0.0),
        telemetry=Telemetry(tracer_provider=provider),
    )  # fmt: skip
    make_system.systems.append(system)
    with pytest.raises(Exception, match="could not be reached"):
        system.proxy().execute("lookup", {"q": 1}).get(timeout=WAIT_S)
    until(
        lambda: any(s.name == "execute_tool lookup" for s in exporter.get_finished_spans()), "the call span"
    )
    posts = [s for s in exporter.get_finished_spans() if s.name == "POST"]
    assert posts and all(s.attributes["error.type"] == "httpx.ConnectError" for s in posts)  # type: ignore[index]
    assert all("http.response.status_code" not in (s.attributes or {}) for s in posts)
