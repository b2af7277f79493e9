"""``http_tool`` reports the limits every answer announces (429s included) to the attempt's
collector; any tool can do the same through the hook. Real HTTP: ``examples/provider.py
--announce``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from actors.errors import RateLimitedError
from actors.http import http_tool
from actors.pacing.announced import Announcement, parse_rate_limit_headers
from actors.pacing.reports import collecting, report_limits
from actors.results import ToolContext


def _context(key: str = "ik") -> ToolContext:
    return ToolContext(
        tool_id="lookup", idempotency_key=key, receipt_keys=("k",), credential_scope_digest="d",
        deadline=time.monotonic() + 30.0, timeout_s=30.0,
    )  # fmt: skip


def test_http_tool_reports_the_limits_of_every_answer_429s_included(
    example_provider: Callable[..., Any],
) -> None:
    provider = example_provider("--limit", "2/min", "--announce")
    tool = http_tool("lookup", f"{provider.url}/v1/country")
    try:
        seen = []
        for n in range(3):
            with collecting() as report:
                try:
                    tool.fn({"code": "FR"}, _context(f"k{n}"))
                except RateLimitedError:
                    assert n == 2
            seen.append([(a.limit, a.window_s, a.remaining) for a in report.announced])
        assert seen == [[(2, 60, 1)], [(2, 60, 0)], [(2, 60, 0)]]
    finally:
        tool.fn.close()  # type: ignore[attr-defined]


def test_http_tool_reports_nothing_outside_an_attempt_nor_for_a_silent_provider(
    example_provider: Callable[..., Any],
) -> None:
    silent = example_provider("--rate", "100")
    tool = http_tool("lookup", f"{silent.url}/v1/country")
    try:
        with collecting() as report:
            tool.fn({"code": "FR"}, _context())
        assert report.announced == []
        tool.fn({"code": "DE"}, _context())  # no collector: nothing to report to, no error
    finally:
        tool.fn.close()  # type: ignore[attr-defined]


def test_any_tool_reports_what_its_own_client_read() -> None:
    """A tool on another client (here a mock transport) calls the same hook itself."""
    answer = httpx.Response(200, headers={"RateLimit-Policy": '"p";q=9;w=1'})
    client = httpx.Client(transport=httpx.MockTransport(lambda r: answer))

    def tool(body: Any, ctx: ToolContext) -> Any:
        response = client.post("https://p.example/")
        report_limits(parse_rate_limit_headers(response.headers, time.time()))
        return {}

    with collecting() as report:
        tool({}, _context())
    assert report.announced == [Announcement(limit=9, window_s=1, name="p")]
    client.close()


@pytest.mark.parametrize("value", ['"p";q=oops', "", '"p";q=5;w=1,,', "\u00e9\u221e"])
def test_http_tool_survives_garbage_limits(value: str) -> None:
    answers = httpx.MockTransport(
        lambda r: httpx.Response(
            200,
            json={"ok": 1},
            headers=[(b"RateLimit-Policy", value.encode()), (b"X-RateLimit-Limit", b"\xff")],
        )
    )
    tool = http_tool("lookup", "https://p.example/one", client=httpx.Client(transport=answers))
    with collecting() as report:
        assert tool.fn({"q": 1}, _context()) == {"ok": 1}
    assert report.announced == []


def test_http_tool_states_its_units() -> None:
    """An HTTP tool under a limit counted in units states its estimate and its real use
    like any tool (``Tool.units``, ``Tool.units_used``)."""

    def estimate(value: Any) -> dict[str, float]:
        return {"tokens": float(value["tokens"])}

    def used(value: Any, output: Any) -> dict[str, float]:
        return {"tokens": float(output["usage"])}

    tool = http_tool("t", "http://127.0.0.1:9/x", units=estimate, units_used=used)
    assert tool.units is estimate and tool.units_used is used
    assert http_tool("t", "http://127.0.0.1:9/x").units is None
