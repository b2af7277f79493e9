"""A call waiting on another worker's running receipt is woken by NOTIFY (issue 11).

Worker A is a dispatch system on a Postgres store; worker B is a second store owner on
the same schema (in this process with its own pool and connections, or a child
process): B holds
the receipt running, A's call of the same key waits, B completes, and A's call is
answered from B's result. A's poll fallback is :data:`FALLBACK_S` (its first and every
poll), so only the notification can answer it within :data:`ANSWER_S`: the bound proves
"woken, not polled", it is not a timing test. The same holds when the listener's
connection is killed while A waits (it reconnects and A re-reads what it may have
missed), and a listener whose connection silently stops (a frozen TCP path) notices it
with its probe and reconnects. Every test works in its own schema, dropped afterwards.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import stores
from actors import DispatchSystem, Policy, RunInfo, Tool
from stores import ClaimRequest, Completion, LeaseRef, Owner
from stores.keys import key_and_input_hash
from stores.postgres.listen import Listener, channel_name

from ..conftest import wait_for

ORG, SCOPE = "acme", "enrich"
B = Owner("run-b")
FALLBACK_S = 30.0
"""A's poll interval (first poll included): far longer than any answer the tests accept."""
ANSWER_S = 10.0
"""Longest A's answer may take after B completes (a generous "does not hang" bound)."""


def _lookup(value: Any, ctx: Any) -> Any:
    raise AssertionError("worker A must never run the call: worker B holds its receipt")


TOOL = Tool(tool_id="lookup", fn=_lookup)


class _ShortProbes(stores.PostgresReceiptStore):
    """A store whose change feed probes a silent connection after 0.2 s and gives the probe
    1 s (a listener's own defaults are 5 s and 5 s): its own :class:`Listener`, started by
    the first caller, as the store's is."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.feed: Listener | None = None
        self.feed_lock = threading.Lock()

    def change_feed(self) -> Listener:
        with self.feed_lock:
            if self.feed is None:
                self.feed = Listener(
                    self.url, channel_name(self.schema), {}, probe_after_s=0.2, probe_timeout_s=1.0
                )
                self.feed.start()
            return self.feed

    def close(self) -> None:
        if self.feed is not None:
            self.feed.close()
        super().close()


class Workers:
    """Worker A (a dispatch system) and worker B (a bare store owner) on one schema."""

    def __init__(
        self, pg_url: str, schema: str, *, url_a: str | None = None, short_probes: bool = False
    ) -> None:
        store_a = _ShortProbes if short_probes else stores.PostgresReceiptStore
        self.store_a = store_a(url_a or pg_url, schema=schema, max_size=3)
        self.store_b = stores.PostgresReceiptStore(pg_url, schema=schema, max_size=2)
        policy = Policy(batch_grace_s=0.0, receipt_poll_initial_s=FALLBACK_S, receipt_poll_max_s=FALLBACK_S)
        self.system = DispatchSystem.start(
            tools=[TOOL],
            store=self.store_a,
            run=RunInfo(run_id="run-a", org_id=ORG, scope=SCOPE),
            policy=policy,
        )

    def hold(self, input: Any) -> LeaseRef:
        """B claims the receipt of ``lookup(input)`` and marks it running."""
        key, input_hash = key_and_input_hash(
            org_id=ORG, scope=SCOPE, tool_id=TOOL.tool_id, input=input, version=TOOL.version
        )
        (claim,) = self.store_b.claim_many(
            ORG, [ClaimRequest(key, SCOPE, TOOL.tool_id, input_hash)], B, lease_ttl_s=300.0
        )
        lease = LeaseRef(key, claim.receipt.lease_id)
        assert self.store_b.mark_running_many(ORG, [lease], B).ok
        return lease

    def a_waits(self, input: Any) -> Any:
        """A's call of ``lookup(input)``, once it waits on B and A's listener is live."""
        future = self.system.proxy().execute("lookup", input)
        wait_for(lambda: self.system.stats_.snapshot().get("waiting_on_owner"))
        wait_for(self._watching)  # A's store actor watches the key (else only a poll could tell)
        assert self.store_a.change_feed().wait_connected(ANSWER_S)  # A's, started by its system
        return future

    def _watching(self) -> bool:
        watch = self.system.ports.store.proxy().watch.get(timeout=ANSWER_S)
        return watch is not None and watch.watched > 0

    def close(self) -> None:
        try:
            self.system.stop(timeout_s=ANSWER_S)
        finally:
            self.store_a.close()
            self.store_b.close()


@pytest.fixture
def workers(pg_url: str, pg_schema: str) -> Iterator[Workers]:
    pair = Workers(pg_url, pg_schema)
    try:
        yield pair
    finally:
        pair.close()


def test_waiter_is_answered_when_the_other_worker_completes(workers: Workers) -> None:
    lease = workers.hold({"email": "a@example.com"})
    future = workers.a_waits({"email": "a@example.com"})

    started = time.monotonic()
    assert workers.store_b.complete_many(ORG, [Completion(lease.key, lease.lease_id, {"by": "b"})], B).ok
    result = future.get(timeout=ANSWER_S)  # the poll fallback would take FALLBACK_S
    print(f"\nwake latency after B's completion: {(time.monotonic() - started) * 1000:.1f} ms")

    assert (result.value, result.execution) == ({"by": "b"}, "in_flight")
    assert workers.system.stats_.snapshot().get("waiting_on_owner", 0) == 0


def test_waiter_is_answered_after_the_listener_connection_is_killed(workers: Workers, pg_url: str) -> None:
    import psycopg

    lease = workers.hold({"email": "b@example.com"})
    future = workers.a_waits({"email": "b@example.com"})
    listener = workers.store_a.change_feed()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (listener.backend_pid,)).fetchone()[0]
    # completed while the listener may be down: its reconnect makes A re-read the key
    assert workers.store_b.complete_many(ORG, [Completion(lease.key, lease.lease_id, {"by": "b"})], B).ok

    result = future.get(timeout=ANSWER_S)

    assert (result.value, result.execution) == ({"by": "b"}, "in_flight")
    wait_for(lambda: listener.reconnects)


_WORKER_B = """
import json, sys
from stores import ClaimRequest, Completion, LeaseRef, Owner, PostgresReceiptStore
url, schema, org, scope, tool_id, key, input_hash = (json.loads(arg) for arg in sys.argv[1:])
store = PostgresReceiptStore(url, schema=schema, max_size=1)
owner = Owner("run-b-process")
(claim,) = store.claim_many(org, [ClaimRequest(key, scope, tool_id, input_hash)], owner, lease_ttl_s=300.0)
lease = LeaseRef(key, claim.receipt.lease_id)
assert store.mark_running_many(org, [lease], owner).ok
print(json.dumps("held"), flush=True)
sys.stdin.readline()  # complete when told
assert store.complete_many(org, [Completion(key, lease.lease_id, {"by": "process b"})], owner).ok
print(json.dumps("completed"), flush=True)
sys.stdin.readline()  # exit when told (an exited holder's lease would be taken over at once)
store.close()
"""


def test_waiter_is_answered_when_another_process_completes(
    workers: Workers, pg_url: str, children: Any
) -> None:
    input = {"email": "c@example.com"}
    key, input_hash = key_and_input_hash(
        org_id=ORG, scope=SCOPE, tool_id=TOOL.tool_id, input=input, version=TOOL.version
    )
    schema = workers.store_a.schema
    worker_b = children.start(_WORKER_B, [pg_url, schema, ORG, SCOPE, TOOL.tool_id, key, input_hash])
    assert children.receive(worker_b) == "held"
    future = workers.a_waits(input)

    children.send(worker_b, "complete")
    assert children.receive(worker_b) == "completed"
    result = future.get(timeout=ANSWER_S)  # the poll fallback would take FALLBACK_S

    assert (result.value, result.execution) == ({"by": "process b"}, "in_flight")
    children.send(worker_b, "exit")
    children.finish()


# -- a LISTEN connection that silently stops -------------------------------------------------


class FreezingProxy:
    """A TCP relay to Postgres whose open connections can be frozen (bytes swallowed,
    sockets open: a dead path that sends no reset). Connections made later relay again.
    Use ``sslmode=disable`` through it, so it can tell which connection sent ``LISTEN``."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._paths: list[dict[str, Any]] = []
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def conninfo(self, pg_url: str) -> str:
        from psycopg.conninfo import make_conninfo

        return make_conninfo(pg_url, host="127.0.0.1", port=self.port, sslmode="disable")

    def freeze(self, *, listening_only: bool = False) -> int:
        """Stop relaying on the connections open now (only those that sent LISTEN);
        returns how many were frozen."""
        chosen = [p for p in self._paths if p["listens"] or not listening_only]
        for path in chosen:
            path["frozen"] = True
        return len(chosen)

    def close(self) -> None:
        for sock in [self._server, *self._sockets]:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            path = {"frozen": False, "listens": False}
            self._paths.append(path)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._relay, args=(src, dst, path, src is client), daemon=True
                ).start()

    def _relay(self, src: socket.socket, dst: socket.socket, path: dict[str, Any], from_client: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                return
            if from_client and b"LISTEN " in data:
                path["listens"] = True
            if path["frozen"]:
                continue  # swallowed: the other end hears nothing, and no reset
            try:
                dst.sendall(data)
            except OSError:
                return


@pytest.fixture
def proxy(pg_url: str) -> Iterator[FreezingProxy]:
    from psycopg.conninfo import conninfo_to_dict

    target = conninfo_to_dict(pg_url)
    relay = FreezingProxy(str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432))
    try:
        yield relay
    finally:
        relay.close()


@pytest.mark.scenario
def test_listener_notices_a_silent_connection_and_listens_again(
    pg_url: str, pg_schema: str, proxy: FreezingProxy
) -> None:
    import psycopg

    channel = f"tooldispatch:{pg_schema}"
    listener = Listener(proxy.conninfo(pg_url), channel, {}, probe_after_s=0.2, probe_timeout_s=1.0)
    try:
        listener.start()
        assert listener.wait_connected(ANSWER_S)
        seen = listener.version(ORG)
        assert proxy.freeze() == 1
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, %s)", (channel, ORG))  # lost on the frozen path
            # the probe finds the path silent, the listener reconnects (a new path) and
            # tells every waiter to re-read: the lost notification is made up for
            assert listener.wait(ORG, seen, ANSWER_S)
            wait_for(lambda: listener.reconnects and listener.live, ANSWER_S)
            seen = listener.version(ORG)
            conn.execute("SELECT pg_notify(%s, %s)", (channel, ORG))
            assert listener.wait(ORG, seen, ANSWER_S)  # and the new connection listens
    finally:
        listener.close()


@pytest.mark.scenario
def test_waiter_is_answered_after_the_listener_connection_goes_silent(
    pg_url: str, pg_schema: str, proxy: FreezingProxy
) -> None:
    # A's connections go through the relay; its listener probes after 0.2 s of silence
    pair = Workers(pg_url, pg_schema, url_a=proxy.conninfo(pg_url), short_probes=True)
    try:
        lease = pair.hold({"email": "d@example.com"})
        future = pair.a_waits({"email": "d@example.com"})
        listener = pair.store_a.change_feed()
        assert proxy.freeze(listening_only=True) == 1  # A's pool still works, its LISTEN hears nothing
        assert pair.store_b.complete_many(ORG, [Completion(lease.key, lease.lease_id, {"by": "b"})], B).ok

        result = future.get(timeout=ANSWER_S)  # the poll fallback would take FALLBACK_S

        assert (result.value, result.execution) == ({"by": "b"}, "in_flight")
        wait_for(lambda: listener.reconnects, ANSWER_S)  # and it listens again
    finally:
        pair.close()
