"""Issue 9, parts 3 and 5, through running systems on real SQLite files: retry_failed
never attaches to a normal call in flight; a retryable failed receipt is re-claimed so
that a result another run stored meanwhile is reused; a provider-calls charge for a
call granted but never sent is refunded; a connection broken after sending makes the
outcome of a tool that is not retry-safe uncertain. Both runtimes."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from actors import (
    BudgetExceededError,
    LeaseLostError,
    Pacing,
    Policy,
    ProviderError,
    Tool,
    UncertainOutcomeError,
)
from actors.http import HttpEndpoint
from stores import (
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Completion,
    FailureKind,
    Owner,
    ReceiptStatus,
    SqliteReceiptStore,
)

WAIT_S = 15.0
ORG, SCOPE = "acme", "enrich"


def test_modes_retry_failed_never_takes_a_normal_call_in_flight(make_system: Any, recorder: Any) -> None:
    started, gate = threading.Event(), threading.Event()

    def fn(i: Any, c: Any) -> Any:
        recorder.record("fn", i, c)
        if recorder.count("fn") == 1:
            started.set()
            gate.wait(WAIT_S)
            raise ProviderError("the provider said no", failure_kind=FailureKind.PERMANENT)
        return {"run": recorder.count("fn")}

    system = make_system([Tool(tool_id="t", fn=fn)])
    normal = system.proxy().execute("t", {"k": 1})
    assert started.wait(WAIT_S)
    retry = system.proxy().execute("t", {"k": 1}, retry_failed=True)
    gate.set()
    with pytest.raises(ProviderError, match="said no"):
        normal.get(timeout=WAIT_S)
    result = retry.get(timeout=WAIT_S)  # its own claim after the failure: not that error
    assert (result.execution, result.value) == ("live", {"run": 2})


class _OtherRunCompletesMeanwhile(SqliteReceiptStore):
    """A real SQLite store where, once armed, another run completes a receipt right after
    a normal claim of this one found it failed (between this run's two claims)."""

    armed = False
    done: list[str]

    def claim_many(self, org_id: str, requests: Any, owner: Any, **kwargs: Any) -> Any:
        claims = super().claim_many(org_id, requests, owner, **kwargs)
        if self.armed and kwargs.get("mode", ClaimMode.NORMAL) is ClaimMode.NORMAL:
            for claim in claims:
                if claim.disposition is ClaimDisposition.FAILED:
                    self.armed = False
                    self._complete_as_another_run(org_id, claim.receipt)
        return claims

    def _complete_as_another_run(self, org_id: str, receipt: Any) -> None:
        other, owner = SqliteReceiptStore(self.path), Owner("another-run")
        try:
            request = ClaimRequest(receipt.key, receipt.scope, receipt.tool_id, receipt.input_hash)
            (claim,) = other.claim_many(
                org_id, [request], owner, lease_ttl_s=60.0, mode=ClaimMode.RETRY_FAILED
            )
            assert claim.disposition is ClaimDisposition.CLAIMED
            lease = claim.receipt.lease_id or ""
            other.complete_many(org_id, [Completion(receipt.key, lease, {"by": "another run"})], owner)
            self.done.append(receipt.key)
        finally:
            other.close()


@pytest.fixture
def meanwhile_store(db_path: Any) -> Iterator[_OtherRunCompletesMeanwhile]:
    store = _OtherRunCompletesMeanwhile(db_path)
    store.done = []
    yield store
    store.close()


def test_modes_retryable_failure_reclaimed_reuses_what_another_run_stored_meanwhile(
    make_system: Any, recorder: Any, meanwhile_store: Any
) -> None:
    def fn(i: Any, c: Any) -> Any:
        recorder.record("fn", i, c)
        raise ProviderError("busy, try later", failure_kind=FailureKind.TRANSIENT)

    system = make_system([Tool(tool_id="t", fn=fn)], store=meanwhile_store)
    with pytest.raises(ProviderError, match="busy"):
        system.proxy().execute("t", {"k": 1}).get(timeout=WAIT_S)  # failed, retryable
    meanwhile_store.armed = True
    result = system.proxy().execute("t", {"k": 1}).get(timeout=WAIT_S)
    assert len(meanwhile_store.done) == 1  # the other run did complete it between our claims
    assert (result.execution, result.value) == ("cached", {"by": "another run"})
    assert recorder.count("fn") == 1  # not paid again
    (receipt,) = meanwhile_store.get_many(ORG, meanwhile_store.done)
    assert receipt.status is ReceiptStatus.COMPLETED and receipt.output == {"by": "another run"}


def test_modes_provider_call_granted_but_never_sent_is_refunded(
    make_system: Any, open_store: Any, read_receipts: Any, key_of: Any, recorder: Any
) -> None:
    started, gate = threading.Event(), threading.Event()

    def fn(i: Any, c: Any) -> Any:
        recorder.record("fn", i, c)
        if i["n"] == 1:
            started.set()
            gate.wait(WAIT_S)
        return {"n": i["n"]}

    # one call at a time; leases not renewed, so the second call's lease runs out while
    # it waits for the slot and another run takes its receipt: granted, never sent
    tool = Tool(tool_id="t", fn=fn, pacing=Pacing(max_concurrency=1))
    policy = Policy(batch_grace_s=0.01, max_provider_calls=2, heartbeats=False, lease_ttl_s=0.3)
    system = make_system([tool], policy=policy)
    first = system.proxy().execute("t", {"n": 1})
    assert started.wait(WAIT_S)
    second = system.proxy().execute("t", {"n": 2})
    _take_over_once_expired(open_store(), read_receipts, key_of(tool, {"n": 2}))
    gate.set()
    assert first.get(timeout=WAIT_S).value == {"n": 1}
    with pytest.raises(LeaseLostError):  # its charge (the budget's second call) comes back...
        second.get(timeout=WAIT_S)
    third = system.proxy().execute("t", {"n": 3}).get(timeout=WAIT_S)  # ... so this fits
    assert (third.execution, third.value) == ("live", {"n": 3})
    assert [c.input["n"] for c in recorder.calls] == [1, 3]
    with pytest.raises(BudgetExceededError):  # and the budget still holds
        system.proxy().execute("t", {"n": 4}).get(timeout=WAIT_S)


def _take_over_once_expired(store: SqliteReceiptStore, read_receipts: Any, key: str) -> None:
    """Claim ``key`` as another run as soon as its lease has expired."""
    deadline = time.monotonic() + WAIT_S
    while True:
        (receipt,) = read_receipts([key])
        if receipt is not None:
            request = ClaimRequest(key, receipt.scope, receipt.tool_id, receipt.input_hash)
            (claim,) = store.claim_many(ORG, [request], Owner("another-run"), lease_ttl_s=60.0)
            if claim.disposition is ClaimDisposition.CLAIMED:
                return
        assert time.monotonic() < deadline, "the waiting call's lease never expired"
        threading.Event().wait(0.05)


def test_modes_connection_reset_after_sending_is_uncertain_for_a_tool_not_retry_safe(
    make_system: Any, read_receipts: Any, key_of: Any, recorder: Any
) -> None:
    def charge(i: Any, c: Any) -> Any:
        recorder.record("charge", i, c)
        raise ConnectionResetError(104, "Connection reset by peer")  # after the request went

    tool = Tool(tool_id="charge", fn=charge)  # not retry-safe
    system = make_system([tool])
    with pytest.raises(ConnectionResetError):
        system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
    (receipt,) = read_receipts([key_of(tool, {"card": 1})])
    assert receipt is not None and receipt.status.value == "uncertain"
    for system_ in (system, make_system([tool], run_id="r2")):
        with pytest.raises(UncertainOutcomeError, match="receipts resolve"):
            system_.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
    assert recorder.count("charge") == 1  # never re-run silently


@pytest.fixture
def hangs_up_after_reading() -> Iterator[tuple[str, list[bytes]]]:
    """A local HTTP server that reads each request whole, then closes the connection
    without answering (the provider got it; the answer was lost). Yields (url, requests)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)  # so the loop sees the stop
    seen: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(WAIT_S)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(v)
                        for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                        if k.lower() == b"content-length"
                    ),
                    0,
                )
                while len(body) < length:
                    body += conn.recv(65536)
                seen.append(body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/charge", seen
    stop.set()
    thread.join(WAIT_S)
    server.close()


def test_modes_http_connection_dropped_after_sending_is_uncertain_for_a_tool_not_retry_safe(
    make_system: Any, read_receipts: Any, key_of: Any, hangs_up_after_reading: Any
) -> None:
    url, seen = hangs_up_after_reading
    endpoint = HttpEndpoint(url)
    tool = Tool(tool_id="charge", fn=endpoint, timeout_s=5.0)  # not retry-safe
    system = make_system([tool])
    try:
        with pytest.raises(ProviderError):
            system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
        (receipt,) = read_receipts([key_of(tool, {"card": 1})])
        assert receipt is not None and receipt.status.value == "uncertain"
        with pytest.raises(UncertainOutcomeError, match="receipts resolve"):
            make_system([tool], run_id="r2").proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
        assert seen == [b'{"card":1}']  # the provider got it once, never again
    finally:
        endpoint.close()


@pytest.fixture
def never_accepts() -> Iterator[str]:
    """A port whose accept queue is full: a new connection is never made (the SYN is
    dropped), so a client's connect times out. Yields its URL."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(3):  # fill the accept queue
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    yield f"http://127.0.0.1:{port}/charge"
    for each in (*fillers, server):
        each.close()


def test_modes_http_connect_timeout_sent_nothing_so_is_not_uncertain(
    make_system: Any, read_receipts: Any, key_of: Any, never_accepts: str
) -> None:
    endpoint = HttpEndpoint(never_accepts)
    tool = Tool(tool_id="charge", fn=endpoint, timeout_s=0.3)  # not retry-safe
    system = make_system([tool])
    try:
        with pytest.raises(ProviderError):  # the call's deadline, or the connect timeout
            system.proxy().execute("charge", {"card": 1}).get(timeout=WAIT_S)
        end = time.monotonic() + WAIT_S
        (receipt,) = read_receipts([key_of(tool, {"card": 1})])
        while receipt is not None and receipt.status.value == "running" and time.monotonic() < end:
            threading.Event().wait(0.05)  # the attempt keeps its lease until it returns
            (receipt,) = read_receipts([key_of(tool, {"card": 1})])
        assert receipt is not None and receipt.status.value == "failed", receipt  # not uncertain
        assert "could not be reached" in (receipt.error or "")
    finally:
        endpoint.close()


def test_modes_http_pool_timeout_sent_nothing() -> None:
    import httpx

    from actors.errors import NotSentError
    from actors.results import ToolContext

    silent = socket.create_server(("127.0.0.1", 0))  # its kernel queue takes connections; never answers
    client = httpx.Client(limits=httpx.Limits(max_connections=1))
    endpoint = HttpEndpoint("http://127.0.0.1:9/charge", client=client)
    holding = threading.Event()

    def trace(event: str, info: Any) -> None:
        if event == "http11.send_request_headers.complete":  # the pool's one connection is taken
            holding.set()

    def hold() -> None:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        with contextlib.suppress(httpx.HTTPError):  # reset when the test closes the server
            client.get(url, timeout=WAIT_S, extensions={"trace": trace})

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert holding.wait(WAIT_S)
        context = ToolContext(
            tool_id="charge", idempotency_key="k", receipt_keys=("k",), credential_scope_digest="",
            deadline=time.monotonic() + 0.2, timeout_s=0.2,
        )  # fmt: skip
        with pytest.raises(NotSentError, match="pool"):  # every connection busy: it waited for the pool
            endpoint({"card": 1}, context)
    finally:
        silent.close()  # resets the held connection, still in the server's queue
        holder.join(WAIT_S)
        client.close()
