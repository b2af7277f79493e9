"""A dead provider fails fast: a connection that cannot be made is not retried within
the call, and the provider's circuit opens on what parallel calls found."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from actors import (
    FailureKind,
    Policy,
    ProviderError,
    ProviderUnavailableError,
    ProviderUnreachableError,
    ToolContext,
)
from actors.governor.decisions import Governor
from actors.http import HttpEndpoint, http_tool
from actors.tool import Pacing

ORG = "org"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed once the with block ends: nothing listens


def _ctx() -> ToolContext:
    return ToolContext(
        tool_id="t",
        idempotency_key="k",
        receipt_keys=("k",),
        credential_scope_digest="",
        deadline=0.0,
        timeout_s=5.0,
    )


def test_http_connection_refused_is_unreachable_and_not_retried_in_call() -> None:
    endpoint = HttpEndpoint(f"http://127.0.0.1:{_closed_port()}/call")
    with pytest.raises(ProviderUnreachableError) as caught:
        endpoint({"i": 1}, _ctx())
    endpoint.close()
    assert caught.value.retry_in_call is False
    assert caught.value.failure_kind == FailureKind.TRANSIENT


def test_provider_errors_are_retried_in_call_unless_they_say_otherwise() -> None:
    assert ProviderError("5xx", failure_kind=FailureKind.TRANSIENT).retry_in_call is True
    assert (
        ProviderError("down", failure_kind=FailureKind.TRANSIENT, retry_in_call=False).retry_in_call is False
    )
    assert issubclass(ProviderUnreachableError, ProviderError)


def test_circuit_opens_on_failures_gathered_by_parallel_calls() -> None:
    gov = Governor(Policy(max_concurrency=8, circuit_failures=5), {"p": Pacing()})
    first = gov.acquire(ORG, "p", 5, "five", now=0.0)
    assert first.grants == [("five", 5)]
    queued = [gov.acquire(ORG, "p", 1, f"w{i}", now=0.0) for i in range(4)]
    assert all(q.grants for q in queued[:3])  # three more in flight; the fourth waits
    # the five sent together all met a closed port: one release, the circuit opens
    out = gov.release(ORG, "p", 5, successes=0, now=0.1, unavailable=5, answered=0)
    assert gov.bucket(ORG, "p").circuit(0.1) == "open"
    assert (ORG, "p") in out.closed
    refused = dict(out.refusals)
    assert all(isinstance(exc, ProviderUnavailableError) for exc in refused.values())
    later = gov.acquire(ORG, "p", 1, "late", now=0.2)
    assert later.grants == [] and isinstance(dict(later.refusals)["late"], ProviderUnavailableError)


def test_dead_provider_calls_are_not_retried_and_the_circuit_refuses_the_rest(make_system: Any) -> None:
    tool = http_tool("verify", f"http://127.0.0.1:{_closed_port()}/call", provider="dead")
    system = make_system([tool], policy=Policy(batch_grace_s=0.05))
    futures = [system.proxy().execute("verify", {"i": i}) for i in range(200)]
    errors = []
    for future in futures:
        with pytest.raises((ProviderUnreachableError, ProviderUnavailableError)) as caught:
            future.get(timeout=60.0)
        errors.append(caught.value)
    stats = system.stats()
    assert stats["retries"] == 0
    unreachable = sum(1 for e in errors if isinstance(e, ProviderUnreachableError))
    assert unreachable <= 20  # a handful of connection attempts, then the open circuit refuses
    assert stats["requests"] == 0  # refused connections reached no provider
