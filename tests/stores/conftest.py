"""Fixtures of the receipt store contract suite.

``store`` is parametrized over every backend in :data:`BACKENDS`. A backend is a
factory plus an availability probe, so a server-backed store (Postgres) joins by
appending one :class:`Backend`: when its server is missing the tests skip locally and
fail when the ``CI`` environment variable is set, so CI can never go green by
skipping a backend.

Every backend must honour the FakeClock it is built with: lease expiry, staleness
and purge ages are all judged by the store's clock. A backend whose production clock
is its server's (Postgres ``now()``) needs a test hook that feeds it the fake time.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

import stores
from stores import (
    Claim,
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FailureKind,
    FenceReport,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
    ReceiptStore,
    SqliteReceiptStore,
)

REPO_ROOT = Path(stores.__file__).resolve().parent.parent
CHILD_TIMEOUT_S = 120.0

START_S = 1_700_000_000.0
"""Where every FakeClock starts (epoch seconds)."""


class FakeClock:
    """A store clock the test moves by hand: ``clock()`` returns epoch seconds."""

    def __init__(self, start_s: float = START_S) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds``; returns the new now."""
        if seconds < 0:
            raise ValueError("a store clock never goes back")
        self.now_s += seconds
        return self.now_s


@attrs.frozen
class Backend:
    """One receipt store implementation the contract suite runs against."""

    id: str
    """The pytest id (``sqlite-file``)."""
    make: Callable[[Path, FakeClock], ReceiptStore]
    """Builds a fresh, empty store in ``tmp_path`` driven by the fake clock."""
    unavailable: Callable[[], str | None] = lambda: None
    """Returns why the backend cannot run here (say, no server), or None."""
    drop: Callable[[ReceiptStore], None] = lambda store: None
    """Removes what ``make`` created outside tmp_path (a Postgres schema), after close."""


PG_URL = os.environ.get("TOOLDISPATCH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
"""The Postgres the tests use; every test works in a schema of its own, dropped after."""


@functools.cache
def pg_unavailable() -> str | None:
    """Why Postgres tests cannot run here, or None (probed once per process)."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed: pip install 'tooldispatch[postgres]' (or the test extra)"
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return (
            f"cannot connect to {PG_URL} ({str(exc).strip()}); start PostgreSQL 15 on 127.0.0.1:5432 "
            "(trust auth, database test) or point TOOLDISPATCH_TEST_PG at a postgresql:// URL"
        )
    return None


def new_pg_schema() -> str:
    """A fresh schema name for one test."""
    return f"td_test_{uuid.uuid4().hex[:12]}"


def wait_for(predicate: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    """Re-check ``predicate`` until it is truthy (returns its value); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        threading.Event().wait(0.01)
    raise AssertionError("condition not reached")


def drop_pg_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def make_pg_store(tmp: Path, clock: FakeClock) -> ReceiptStore:
    from stores import PostgresReceiptStore

    return PostgresReceiptStore(PG_URL, schema=new_pg_schema(), clock=clock, max_size=4)


BACKENDS: list[Backend] = [
    Backend("sqlite-file", lambda tmp, clock: SqliteReceiptStore(tmp / "receipts.db", clock=clock)),
    Backend("sqlite-memory", lambda tmp, clock: SqliteReceiptStore(":memory:", clock=clock)),
    Backend(
        "postgres",
        make_pg_store,
        unavailable=pg_unavailable,
        drop=lambda store: drop_pg_schema(store.schema),  # type: ignore[attr-defined]
    ),
]


def require_backend(backend: Backend) -> None:
    """Skip a backend that cannot run here; in CI (``CI`` set) fail instead."""
    why = backend.unavailable()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"backend {backend.id} unavailable in CI: {why}", pytrace=False)
    pytest.skip(f"backend {backend.id} unavailable: {why}")


@pytest.fixture
def gate_unavailable_backend() -> Callable[[str], None]:
    """``gate(why)`` applies :func:`require_backend` to a backend unavailable for ``why``."""

    def gate(why: str) -> None:
        require_backend(Backend("probe", lambda tmp, clock: SqliteReceiptStore(":memory:"), lambda: why))

    return gate


@pytest.fixture
def fake_clock() -> FakeClock:
    """A fresh FakeClock at :data:`START_S`."""
    return FakeClock()


ON_DISK = [backend for backend in BACKENDS if backend.id != "sqlite-memory"]
"""The backends whose rows something outside the store can edit (a file, a server)."""


def opened(backend: Backend, tmp_path: Path, clock: FakeClock) -> Iterator[ReceiptStore]:
    """An empty store of ``backend`` on ``clock`` (skipped where it cannot run), closed
    and dropped afterwards: the body of a store fixture."""
    require_backend(backend)
    instance = backend.make(tmp_path, clock)
    try:
        yield instance
    finally:
        instance.close()
        backend.drop(instance)


@pytest.fixture(params=BACKENDS, ids=[backend.id for backend in BACKENDS])
def store(request: pytest.FixtureRequest, tmp_path: Path, fake_clock: FakeClock) -> Iterator[ReceiptStore]:
    """An empty receipt store of each backend, on ``fake_clock``; closed afterwards."""
    yield from opened(request.param, tmp_path, fake_clock)


@pytest.fixture
def pg_url() -> str:
    """The test Postgres URL; skips (fails in CI) when Postgres is not there."""
    require_backend(next(b for b in BACKENDS if b.id == "postgres"))
    return PG_URL


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[str]:
    """A schema name of this test's own, dropped afterwards."""
    schema = new_pg_schema()
    try:
        yield schema
    finally:
        drop_pg_schema(schema)


class Children:
    """Plain Python child processes speaking one JSON object per line.

    A child is ``sys.executable`` running a script file, never a fork of this
    process, so a gevent-patched test run starts unpatched children. The parent
    talks over stdin/stdout: writing a line to every child at once is the start
    barrier, no sleeping involved. Children still alive after CHILD_TIMEOUT_S are
    killed, so a hang fails the test instead of stalling the suite.
    """

    def __init__(self, tmp_path: Path) -> None:
        self._tmp_path = tmp_path
        self.procs: list[subprocess.Popen[str]] = []
        self._watchdog = threading.Timer(CHILD_TIMEOUT_S, self.kill)
        self._watchdog.daemon = True
        self._watchdog.start()

    def start(
        self, script: str, argv: list[Any], *, script_dir: Path | None = None, **popen: Any
    ) -> subprocess.Popen[str]:
        """Start one child running ``script`` with ``argv`` (each item JSON-encoded).

        The script file goes to ``script_dir`` (default the test's tmp_path); extra
        keyword arguments go to :class:`subprocess.Popen` (``user=``, ``group=``...).
        """
        path = (script_dir or self._tmp_path) / f"child_{hashlib.sha256(script.encode()).hexdigest()[:12]}.py"
        if not path.exists():  # never rewrite a script a running child may be reading
            path.with_suffix(".tmp").write_text(script)
            path.with_suffix(".tmp").replace(path)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        proc = subprocess.Popen(
            [sys.executable, str(path), *(json.dumps(a) for a in argv)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            **popen,
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def send(proc: subprocess.Popen[str], message: Any) -> None:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()

    @staticmethod
    def receive(proc: subprocess.Popen[str]) -> Any:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            assert proc.stderr is not None
            raise AssertionError(f"child {proc.pid} exited early: {proc.wait()} {proc.stderr.read()}")
        return json.loads(line)

    def broadcast(self, message: Any) -> None:
        """Send one line to every child (writes first, so all start together)."""
        for proc in self.procs:
            self.send(proc, message)

    def gather(self) -> list[Any]:
        """One message from every child, in start order."""
        return [self.receive(proc) for proc in self.procs]

    def finish(self) -> list[str]:
        """Close stdin, wait for every child; returns their stderr. Asserts exit 0."""
        errors = []
        for proc in self.procs:
            _, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
            assert proc.returncode == 0, err
            errors.append(err)
        return errors

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()

    def close(self) -> None:
        self._watchdog.cancel()
        self.kill()
        for proc in self.procs:
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            proc.wait()


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Children]:
    """Start plain Python child processes; any left running are killed afterwards."""
    group = Children(tmp_path)
    try:
        yield group
    finally:
        group.close()


def held_keys(store: Any, org_id: str, keys: list[str]) -> set[str]:
    """The keys of ``org_id`` still under a live lease, by the Postgres server's clock."""
    rows = store.query(
        "SELECT key FROM receipts WHERE org_id = %s AND key = ANY(%s) AND status IN ('queued', 'running')"
        " AND coalesce(lease_expires_at > extract(epoch FROM now())::float8, false)",
        (org_id, keys),
    )
    return {row["key"] for row in rows}


def wait_settled(store: Any, org_id: str, keys: list[str], timeout_s: float) -> set[str]:
    """A waiter on another owner's receipts, by the store's change feed and nothing else
    (no polling): read; while every key is still held, wait for the org's token to change
    (LISTEN/NOTIFY, or the listener's reconnect), then read again. Returns the settled keys
    (empty when ``timeout_s`` passed first)."""
    feed = store.change_feed()
    deadline = time.monotonic() + timeout_s
    while True:
        seen = feed.version(org_id)
        settled = set(keys) - held_keys(store, org_id, keys)
        remaining = deadline - time.monotonic()
        if settled or remaining <= 0:
            return settled
        feed.wait(org_id, seen, remaining)


# -- the contract suite's vocabulary: names, requests, receipts in each state ----------

ORG = "org-a"
OTHER_ORG = "org-b"
ME = Owner("run-me", 1)
OTHER = Owner("run-other", 1)
TTL_S = 30.0
KEEPS_OUTPUT = (ReceiptStatus.COMPLETED, ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)

N = ClaimMode.NORMAL
R = ClaimMode.RETRY_FAILED
F = ClaimMode.FORCE_REFRESH
CLAIMED = ClaimDisposition.CLAIMED


def nested(depth: int) -> Any:
    """A list ``depth`` containers deep: [[[...]]]."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def same(got: Any, want: Any) -> bool:
    """Equal with the same types all the way down (NaN equals NaN, -0.0 is not 0.0)."""
    return _shape(got) == _shape(want)


def _shape(value: Any) -> Any:
    stack: list[Any] = []
    out: list[Any] = []
    stack.append(value)
    while stack:  # iterative: deep outputs must not hit the recursion limit here
        item = stack.pop()
        if isinstance(item, dict):
            out.append(("dict", len(item)))
            for k, v in item.items():
                out.append(("key", k))
                stack.append(v)
        elif isinstance(item, list):
            out.append(("list", len(item)))
            stack.extend(item)
        elif isinstance(item, float):
            out.append(("float", "nan" if math.isnan(item) else item.hex()))
        else:
            out.append((type(item).__name__, item))
    return out


def key_of(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def request_for(key: str, *, input_hash: str | None = None) -> ClaimRequest:
    return ClaimRequest(key, "play", "verify_email", input_hash or key_of("input:" + key))


def claim(
    store: ReceiptStore,
    keys: list[str],
    owner: Owner = ME,
    *,
    mode: ClaimMode = N,
    stale_after_s: float | None = None,
    org: str = ORG,
    lease_ttl_s: float = TTL_S,
) -> list[Claim]:
    return store.claim_many(
        org,
        [request_for(k) for k in keys],
        owner,
        lease_ttl_s=lease_ttl_s,
        mode=mode,
        stale_after_s=stale_after_s,
    )


def claim_one(store: ReceiptStore, key: str, owner: Owner = ME, **kw: Any) -> Claim:
    (result,) = claim(store, [key], owner, **kw)
    return result


def lease_of(result: Claim) -> LeaseRef:
    assert result.receipt.lease_id
    return LeaseRef(result.receipt.key, result.receipt.lease_id)


def get(store: ReceiptStore, key: str, org: str = ORG) -> Receipt | None:
    (receipt,) = store.get_many(org, [key])
    return receipt


def complete(
    store: ReceiptStore, lease: LeaseRef, output: Any, owner: Owner = ME, org: str = ORG
) -> FenceReport:
    return store.complete_many(org, [Completion(lease.key, lease.lease_id, output)], owner)


def fail(
    store: ReceiptStore,
    lease: LeaseRef,
    owner: Owner = ME,
    kind: FailureKind = FailureKind.TRANSIENT,
) -> FenceReport:
    return store.fail_many(ORG, [Failure(lease.key, lease.lease_id, "provider said no", kind)], owner)


def assert_claimed(
    result: Claim,
    store: ReceiptStore,
    owner: Owner,
    now_s: float,
    before: Receipt | None,
) -> None:
    """A CLAIMED answer: a new queued lease for ``owner``, exactly as stored."""
    assert result.disposition is CLAIMED
    receipt = result.receipt
    assert receipt.status is ReceiptStatus.QUEUED
    assert receipt.lease_id
    assert receipt.owner == owner
    assert receipt.lease_expires_at == now_s + TTL_S
    assert [receipt.error, receipt.failure_kind] == [None] * 2
    if before is not None and before.completed_at is not None and before.status in KEEPS_OUTPUT:
        # A re-run of a completed receipt keeps its output until a new one is stored.
        assert (receipt.output, receipt.completed_at) == (
            before.output,
            before.completed_at,
        )
    else:
        assert (receipt.output, receipt.completed_at) == (None, None)
    assert receipt.updated_at == now_s
    if before is None:
        assert receipt.attempts == 1
        assert receipt.created_at == now_s
        assert receipt.generation == 1
    else:
        assert receipt.lease_id != before.lease_id
        assert receipt.attempts == before.attempts + 1
        assert receipt.created_at == before.created_at
        bumped = before.status is ReceiptStatus.COMPLETED or (
            before.status is ReceiptStatus.FAILED and before.failure_kind is not FailureKind.TIMEOUT
        )
        assert receipt.generation == before.generation + bumped
    assert get(store, receipt.key) == receipt


def assert_untouched(
    result: Claim, store: ReceiptStore, disposition: ClaimDisposition, before: Receipt
) -> None:
    """A non-claim answer: the stored receipt is returned and nothing changed."""
    assert result.disposition is disposition
    assert result.receipt == before
    assert get(store, before.key) == before


# -- store states the dispositions table starts from ------------------------------------


def make_pending(store: ReceiptStore, key: str) -> None:
    assert store.release(ORG, [lease_of(claim_one(store, key, OTHER))], OTHER).ok


def make_completed(store: ReceiptStore, key: str, output: Any = None) -> None:
    lease = lease_of(claim_one(store, key, OTHER))
    assert store.mark_running_many(ORG, [lease], OTHER).ok
    assert complete(store, lease, output if output is not None else {"answer": 42}, OTHER).ok


def make_queued(store: ReceiptStore, key: str) -> None:
    assert claim_one(store, key, OTHER).disposition is CLAIMED


def make_running(store: ReceiptStore, key: str) -> None:
    lease = lease_of(claim_one(store, key, OTHER))
    assert store.mark_running_many(ORG, [lease], OTHER).ok


def make_failed(store: ReceiptStore, key: str) -> None:
    assert fail(store, lease_of(claim_one(store, key, OTHER)), OTHER).ok


IN_FLIGHT = {"queued": make_queued, "running": make_running}


FencedOp = Callable[[ReceiptStore, LeaseRef, Owner], FenceReport]

OPS: dict[str, FencedOp] = {
    "mark_running_many": lambda s, lease, owner: s.mark_running_many(ORG, [lease], owner),
    "renew_leases": lambda s, lease, owner: s.renew_leases(ORG, [lease], owner, lease_ttl_s=TTL_S),
    "complete_many": lambda s, lease, owner: complete(s, lease, {"ok": True}, owner),
    "fail_many": lambda s, lease, owner: fail(s, lease, owner),
    "release": lambda s, lease, owner: s.release(ORG, [lease], owner),
    "mark_uncertain_many": lambda s, lease, owner: s.mark_uncertain_many(
        ORG,
        [
            Failure(
                lease.key,
                lease.lease_id,
                "timed out after sending",
                FailureKind.TIMEOUT,
            )
        ],
        owner,
    ),
}
