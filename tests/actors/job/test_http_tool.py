"""``actors.http`` against the real example provider: the Idempotency-Key header, and how
each kind of answer (429, 500, 404, 422, a timeout, a batch member's error) maps to an
error of tooldispatch."""

from __future__ import annotations

import sqlite3
import time

import pytest

from actors import (
    DispatchSystem,
    FailureKind,
    Policy,
    ProviderError,
    RateLimitedError,
    RunInfo,
    ToolContext,
    ToolTimeoutError,
)
from actors.http import HttpEndpoint, http_tool
from stores import SqliteReceiptStore

CALL_TIMEOUT_S = 60.0


def _ctx(idempotency_key: str, timeout_s: float = 10.0) -> ToolContext:
    return ToolContext(
        tool_id="country",
        idempotency_key=idempotency_key,
        receipt_keys=("0" * 64,),
        credential_scope_digest="",
        deadline=time.monotonic() + timeout_s,
        timeout_s=timeout_s,
    )


@pytest.fixture
def endpoint():
    """``endpoint(url)``: an HttpEndpoint closed at teardown."""
    made = []

    def make(url):
        made.append(HttpEndpoint(url))
        return made[-1]

    yield make
    for one in made:
        one.close()


def test_http_tool_sends_idempotency_key(provider, endpoint):
    country = endpoint(f"{provider.url}/v1/country")

    first = country({"code": "FR"}, _ctx("key-1"))
    replayed = country({"code": "FR"}, _ctx("key-1"))
    fresh = country({"code": "FR"}, _ctx("key-2"))

    assert first["name"] == "France"
    assert replayed == fresh == first
    stats = provider.stats()
    assert stats["idempotent_replays"] == 1  # the provider saw the same key twice
    assert stats["requests"] == 2  # and billed it once


def test_http_tool_tells_a_replayed_answer_apart(provider, endpoint):
    country = endpoint(f"{provider.url}/v1/country")
    first, again, other = _ctx("key-r"), _ctx("key-r"), _ctx("key-s")

    country({"code": "FR"}, first)
    country({"code": "FR"}, again)  # answered from the provider's record: Idempotent-Replayed: true
    country({"code": "DE"}, other)

    assert (first.replayed, again.replayed, other.replayed) == (False, True, False)
    assert provider.stats()["replayed_items"] == 1


def test_http_tool_429_is_rate_limited_with_retry_after(provider_factory, endpoint):
    server = provider_factory("--rate", "1", "--burst", "1")
    country = endpoint(f"{server.url}/v1/country")

    with pytest.raises(RateLimitedError) as caught:
        for attempt in range(10):  # the bucket holds one token and refills at 1/s
            country({"code": "FR"}, _ctx(f"key-{attempt}"))

    assert caught.value.retry_after is not None
    assert float(caught.value.retry_after) > 0
    assert caught.value.failure_kind is FailureKind.RATE_LIMITED
    stats = server.stats()
    assert stats["rate_limited"] == 1
    assert stats["requests"] >= 1


def test_http_tool_500_is_transient(provider_factory, endpoint):
    server = provider_factory("--error-rate", "1")
    country = endpoint(f"{server.url}/v1/country")

    with pytest.raises(ProviderError) as caught:
        country({"code": "FR"}, _ctx("key-1"))

    assert type(caught.value) is ProviderError
    assert caught.value.failure_kind is FailureKind.TRANSIENT
    assert "500" in str(caught.value)
    assert server.stats()["errors"] == 1


def test_http_tool_404_is_permanent(provider, endpoint):
    missing = endpoint(f"{provider.url}/v1/no-such-endpoint")

    with pytest.raises(ProviderError) as caught:
        missing({"code": "FR"}, _ctx("key-1"))

    assert type(caught.value) is ProviderError
    assert caught.value.failure_kind is FailureKind.PERMANENT
    assert "404" in str(caught.value)


def test_http_tool_single_lookup_error_is_permanent(provider, endpoint):
    country = endpoint(f"{provider.url}/v1/country")

    with pytest.raises(ProviderError) as caught:
        country({"code": "XX"}, _ctx("key-1"))

    assert caught.value.failure_kind is FailureKind.PERMANENT
    assert "unknown country code" in str(caught.value)


def test_http_tool_timeout(provider_factory, endpoint, tmp_path):
    server = provider_factory("--latency", "2")
    country = endpoint(f"{server.url}/v1/country")

    with pytest.raises(ToolTimeoutError) as caught:
        country({"code": "FR"}, _ctx("key-1", timeout_s=0.2))

    assert caught.value.failure_kind is FailureKind.TIMEOUT

    # through the dispatcher: the request timeout is the tool's timeout_s
    tool = http_tool("country", f"{server.url}/v1/country", timeout_s=0.2)
    system, store = _system([tool], tmp_path)
    try:
        with pytest.raises(ToolTimeoutError):
            system.proxy().execute("country", {"code": "DE"}).get(timeout=CALL_TIMEOUT_S)
    finally:
        system.stop()
        store.close()
        tool.fn.close()
    assert _statuses(tmp_path / "receipts.db") == ["failed"]


def _system(tools, tmp_path):
    store = SqliteReceiptStore(str(tmp_path / "receipts.db"))
    system = DispatchSystem.start(
        tools=tools,
        store=store,
        run=RunInfo(run_id="http-test", org_id="acme", scope="http"),
        policy=Policy(batch_grace_s=0.5),
    )
    return system, store


def _statuses(db):
    with sqlite3.connect(db) as conn:
        return sorted(status for (status,) in conn.execute("select status from receipts"))


def test_http_tool_batch_member_error_fails_alone(provider, tmp_path):
    country = http_tool(
        "country", f"{provider.url}/v1/country", batch_url=f"{provider.url}/v1/country/batch",
        max_batch_size=50, provider="local-provider",
    )  # fmt: skip
    codes = ["FR", "DE", "XX", "JP"]
    system, store = _system([country], tmp_path)
    try:
        futures = [system.proxy().execute("country", {"code": code}) for code in codes]
        outcomes = {}
        for code, future in zip(codes, futures, strict=True):
            try:
                outcomes[code] = future.get(timeout=CALL_TIMEOUT_S).value["name"]
            except ProviderError as exc:
                outcomes[code] = exc
    finally:
        system.stop()
        store.close()
        country.fn.close()

    assert outcomes["FR"] == "France"
    assert outcomes["DE"] == "Germany"
    assert outcomes["JP"] == "Japan"
    failed = outcomes["XX"]
    assert isinstance(failed, ProviderError)
    assert failed.failure_kind is FailureKind.PERMANENT
    assert "unknown country code" in str(failed)
    stats = provider.stats()
    assert stats["batch_requests"] == 1  # one batch request served all four
    assert stats["items"] == len(codes)
    assert "single_requests" not in stats
    assert _statuses(tmp_path / "receipts.db") == ["completed", "completed", "completed", "failed"]


def test_http_tool_lone_call_error_fails_like_a_batch_member(provider, tmp_path):
    # A lone call goes to the single endpoint: its error must fail the call just as it
    # does inside a batch, not complete it with an error body as its output.
    country = http_tool(
        "country", f"{provider.url}/v1/country", batch_url=f"{provider.url}/v1/country/batch",
        provider="local-provider",
    )  # fmt: skip
    system, store = _system([country], tmp_path)
    try:
        with pytest.raises(ProviderError) as caught:
            system.proxy().execute("country", {"code": "XX"}).get(timeout=CALL_TIMEOUT_S)
    finally:
        system.stop()
        store.close()
        country.fn.close()

    assert caught.value.failure_kind is FailureKind.PERMANENT
    assert provider.stats()["single_requests"] == 1
    assert _statuses(tmp_path / "receipts.db") == ["failed"]


# -- issue 26: a key never changes between attempts of one request ---------------------------


@pytest.mark.waits
def test_http_tool_a_key_still_being_served_is_asked_again_and_replayed(provider_factory, endpoint):
    """A second request under a key whose first request the provider still serves (a
    crashed run's, sent again by its rerun) is answered 409 with Retry-After: the endpoint
    waits and asks again under the same key, and gets the stored answer: billed once."""
    import threading

    server = provider_factory("--latency", "1")
    country = endpoint(f"{server.url}/v1/country")
    answers = {}
    first = threading.Thread(target=lambda: answers.setdefault("first", country({"code": "FR"}, _ctx("k"))))
    first.start()
    poll_until(lambda: server.calls()["serving"] == 1)
    answers["again"] = country({"code": "FR"}, _ctx("k"))
    first.join(CALL_TIMEOUT_S)

    assert answers["again"] == answers["first"] and answers["first"]["name"] == "France"
    stats = server.stats()
    assert stats["requests"] == 1 and stats["idempotent_replays"] == 1
    assert stats["idempotent_conflicts"] >= 1
    assert server.calls()["billed"] == {'/v1/country {"code": "FR"}': 1}


@pytest.mark.waits
def test_http_tool_a_key_still_being_served_past_the_timeout_is_a_timeout(provider_factory, endpoint):
    import threading

    server = provider_factory("--latency", "2")
    country = endpoint(f"{server.url}/v1/country")
    first = threading.Thread(target=lambda: country({"code": "FR"}, _ctx("k")))
    first.start()
    poll_until(lambda: server.calls()["serving"] == 1)
    with pytest.raises(ToolTimeoutError, match="still processing"):
        country({"code": "FR"}, _ctx("k", timeout_s=0.5))
    first.join(CALL_TIMEOUT_S)
    assert server.stats()["requests"] == 1


def test_http_tool_another_409_is_the_providers_answer(tmp_path, endpoint):
    """A 409 that is a conflict of the provider's own data (no Retry-After, no word of an
    idempotency key) is a permanent failure at once, not asked again."""
    import http.server
    import threading

    seen = []

    class Conflict(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.headers.get("Idempotency-Key"))
            body = b'{"error": "this email address is taken"}'
            self.send_response(409)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Conflict)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        signup = endpoint(f"http://127.0.0.1:{server.server_port}/v1/signup")
        with pytest.raises(ProviderError, match="409") as caught:
            signup({"email": "a@example.com"}, _ctx("k"))
    finally:
        server.shutdown()
        server.server_close()
    assert caught.value.failure_kind is FailureKind.PERMANENT
    assert seen == ["k"]


@pytest.mark.waits
def test_http_tool_a_timed_out_call_asks_again_under_the_same_key(provider_factory, tmp_path):
    """The call times out (every in-call attempt under one key) and is recorded failed,
    kind timeout; the next call of it asks again under that same key, and the provider,
    which served the first request meanwhile, answers from its record: billed once."""
    server = provider_factory("--latency", "1.5")
    tool = http_tool("country", f"{server.url}/v1/country", timeout_s=0.3)
    system, store = _system([tool], tmp_path)
    try:
        with pytest.raises(ToolTimeoutError):
            system.proxy().execute("country", {"code": "DE"}).get(timeout=CALL_TIMEOUT_S)
        poll_until(lambda: server.calls()["serving"] == 0)
        result = system.proxy().execute("country", {"code": "DE"}).get(timeout=CALL_TIMEOUT_S)
    finally:
        system.stop()
        store.close()
        tool.fn.close()
    assert result.value["name"] == "Germany"
    calls = server.calls()
    assert calls["billed"] == {'/v1/country {"code": "DE"}': 1}
    assert len(calls["received"]) == 1 and sum(calls["replayed"].values()) == 1
    assert _statuses(tmp_path / "receipts.db") == ["completed"]


def poll_until(probe, timeout_s=CALL_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
