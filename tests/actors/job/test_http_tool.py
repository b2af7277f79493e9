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
