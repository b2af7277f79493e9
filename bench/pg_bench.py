"""Postgres receipt store benchmark: the store against the raw single-statement limit.

Run from the repository root (Postgres on 127.0.0.1:5432, or ``--url``)::

    python bench/pg_bench.py [--keys 20000] [--batch 500] [--url postgresql://...]
    python -m gevent.monkey bench/pg_bench.py      # the same under gevent

In one run, on fresh random sha256 keys, in batches of ``--batch``, interleaved batch by
batch so every figure sees the same background load:

- **fresh**: the store's claim, mark running and complete (three bulk statements, the
  drain's cycle) against ONE raw ``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO
  UPDATE`` writing the same keys as completed receipts into a table of the same
  schema (the physical limit: one statement, one round trip per batch);
- **rerun**: the store's claim of the now completed keys (every answer ``reused``)
  against a raw keyed read (``SELECT ... WHERE key = ANY(...)``) of the same keys;
- **read**: the store's ``get_many`` against the same raw keyed read.

It prints keys/s for each and the store-to-raw ratios side by side (issue 11 section 4
targets: fresh at least 50% of the raw upsert, rerun at least 50% of a raw keyed read).
Two schemas ``td_bench_*`` are created and dropped.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import click
import orjson

try:
    import stores  # noqa: F401 - is the package importable?
except ImportError:  # run as a script from a checkout: put the repository root on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stores import ClaimDisposition, ClaimRequest, Completion, LeaseRef, Owner
from stores.sqlite.offload import gevent_active
from stores.sqlite.schema import COLUMNS

ORG_ID = "org-bench"
SCOPE = "bench-play"
TOOL_ID = "verify_email"
LEASE_TTL_S = 600.0
OUTPUT = {"valid": True, "score": 0.93, "reason": "accepted_email"}
TARGET = 0.5


def _raw_upsert(table: str) -> str:
    return f"""
INSERT INTO {table} ({", ".join(COLUMNS)})
SELECT k, %(org)s, %(scope)s, %(tool)s, 'completed', k, %(output)s, NULL, NULL, l, %(run)s, 1, NULL,
       1, extract(epoch FROM now()), extract(epoch FROM now()), extract(epoch FROM now()), 1, NULL, NULL,
       NULL, NULL, NULL
FROM unnest(%(keys)s::text[], %(leases)s::text[]) AS u(k, l)
ON CONFLICT (org_id, key) DO UPDATE SET
  status = excluded.status, output = excluded.output, lease_id = excluded.lease_id,
  updated_at = excluded.updated_at, completed_at = excluded.completed_at
"""


def _raw_read(table: str) -> str:
    return f"SELECT {', '.join(COLUMNS)} FROM {table} WHERE org_id = %s AND key = ANY(%s::text[])"


class Timer:
    """Accumulated wall-clock seconds per label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def time(self, label: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        result = fn()
        self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start
        return result


@click.command()
@click.option(
    "--url", default=os.environ.get("TOOLDISPATCH_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
)
@click.option("--keys", "n_keys", default=20_000, show_default=True)
@click.option("--batch", default=500, show_default=True)
def main(url: str, n_keys: int, batch: int) -> None:
    import psycopg

    from stores import PostgresReceiptStore

    store_schema, raw_schema = f"td_bench_{uuid.uuid4().hex[:8]}", f"td_bench_{uuid.uuid4().hex[:8]}"
    store = PostgresReceiptStore(url, schema=store_schema, max_size=2)
    PostgresReceiptStore(url, schema=raw_schema, max_size=1).close()  # same table, same indexes
    raw = psycopg.connect(url, autocommit=True)
    table = f'"{raw_schema}".receipts'
    upsert, read = _raw_upsert(table), _raw_read(table)
    output_text = orjson.dumps(OUTPUT).decode()
    keys = [hashlib.sha256(os.urandom(16)).hexdigest() for _ in range(n_keys)]
    batches = [keys[i : i + batch] for i in range(0, n_keys, batch)]
    owner, timer = Owner("bench-run"), Timer()
    try:
        for round_ in range(6):  # warm both paths: psycopg prepares a statement on its 5th run
            _warm(store, raw, upsert, output_text, owner, round_)
        for chunk in batches:
            requests = [ClaimRequest(k, SCOPE, TOOL_ID, k) for k in chunk]

            def fresh(requests: list[ClaimRequest] = requests) -> None:
                claims = store.claim_many(ORG_ID, requests, owner, lease_ttl_s=LEASE_TTL_S)
                leases = [LeaseRef(c.receipt.key, c.receipt.lease_id or "") for c in claims]
                assert store.mark_running_many(ORG_ID, leases, owner).ok
                done = [Completion(lease.key, lease.lease_id, OUTPUT) for lease in leases]
                assert store.complete_many(ORG_ID, done, owner).ok

            timer.time("store fresh", fresh)
            params = _raw_params(chunk, output_text)
            timer.time("raw upsert", lambda params=params: raw.execute(upsert, params).close())
        for chunk in batches:
            requests = [ClaimRequest(k, SCOPE, TOOL_ID, k) for k in chunk]
            claims = timer.time(
                "store rerun", lambda r=requests: store.claim_many(ORG_ID, r, owner, lease_ttl_s=LEASE_TTL_S)
            )
            assert all(c.disposition is ClaimDisposition.REUSED for c in claims)
            got = timer.time("store read", lambda c=chunk: store.get_many(ORG_ID, c))
            assert all(r is not None for r in got)
            rows = timer.time("raw read", lambda c=chunk: raw.execute(read, (ORG_ID, c)).fetchall())
            assert len(rows) == len(chunk)
    finally:
        store.close()
        for schema in (store_schema, raw_schema):
            raw.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        raw.close()
    _report(timer.seconds, n_keys, batch)


def _warm(store: Any, raw: Any, upsert: str, output_text: str, owner: Owner, round_: int) -> None:
    keys = [hashlib.sha256(f"warm-{round_}-{i}".encode()).hexdigest() for i in range(20)]
    requests = [ClaimRequest(k, SCOPE, TOOL_ID, k) for k in keys]
    claims = store.claim_many(ORG_ID, requests, owner, lease_ttl_s=LEASE_TTL_S)
    leases = [LeaseRef(c.receipt.key, c.receipt.lease_id or "") for c in claims]
    store.mark_running_many(ORG_ID, leases, owner)
    store.complete_many(ORG_ID, [Completion(le.key, le.lease_id, OUTPUT) for le in leases], owner)
    store.claim_many(ORG_ID, requests, owner, lease_ttl_s=LEASE_TTL_S)
    store.get_many(ORG_ID, keys)
    raw.execute(upsert, _raw_params(keys, output_text)).close()
    raw.execute(_raw_read(upsert.split()[2]), (ORG_ID, keys)).fetchall()


def _raw_params(chunk: list[str], output_text: str) -> dict[str, Any]:
    random_hex = os.urandom(16 * len(chunk)).hex()
    return {
        "org": ORG_ID,
        "scope": SCOPE,
        "tool": TOOL_ID,
        "output": output_text,
        "run": "bench-run",
        "keys": chunk,
        "leases": [random_hex[32 * i : 32 * i + 32] for i in range(len(chunk))],
    }


def _report(seconds: dict[str, float], n_keys: int, batch: int) -> None:
    rate = {label: n_keys / s for label, s in seconds.items()}
    runtime = "gevent" if gevent_active() else "threads"
    print(f"Postgres receipt store, {n_keys} fresh random keys, batches of {batch}, runtime {runtime},")
    print(f"python {platform.python_version()}, {os.cpu_count()} cpus")
    print()
    print(f"{'':28}{'store keys/s':>14}{'raw keys/s':>14}{'store/raw':>11}{'target':>9}")
    for name, store_label, raw_label in (
        ("fresh (claim+run+complete)", "store fresh", "raw upsert"),
        ("rerun (claim, all reused)", "store rerun", "raw read"),
        ("keyed read (get_many)", "store read", "raw read"),
    ):
        ratio = rate[store_label] / rate[raw_label]
        target = f">= {TARGET:.0%}" if store_label != "store read" else ""
        print(f"{name:28}{rate[store_label]:>14,.0f}{rate[raw_label]:>14,.0f}{ratio:>10.0%}{target:>10}")


if __name__ == "__main__":
    main()
