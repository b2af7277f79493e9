"""The provider idempotency key follows the receipt's execution generation (issue 9, 4b).

The store side (when the generation moves) is in tests/stores/test_contract_generations.py; here the
key itself: one per (receipt key, generation), never derived from the lease id.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import BatchStrategy, FailureKind, Policy, ProviderError, Tool
from actors.results import batch_idempotency_key, provider_idempotency_key
from stores import ClaimMode, ClaimRequest, Completion, LeaseRef, Owner, SqliteReceiptStore, StoreError

WAIT_S = 15.0

KEY = hashlib.sha256(b"idem").hexdigest()


def test_idempotency_key_depends_on_receipt_key_and_generation_only() -> None:
    assert provider_idempotency_key(KEY, 1) == provider_idempotency_key(KEY, 1)
    assert provider_idempotency_key(KEY, 1) != provider_idempotency_key(KEY, 2)
    assert provider_idempotency_key(KEY, 1) != provider_idempotency_key(KEY[::-1], 1)
    assert provider_idempotency_key(KEY, None) != provider_idempotency_key(KEY, 0)
    assert len(provider_idempotency_key(KEY, 1)) == 64


def test_idempotency_key_same_after_lost_owner_new_after_force_refresh(tmp_path: Path) -> None:
    """Claims through a real store: a crashed owner's lease taken over keeps the key."""
    now = [1_700_000_000.0]
    with SqliteReceiptStore(tmp_path / "r.db", clock=lambda: now[0]) as store:
        request = [ClaimRequest(KEY, "play", "tool", KEY)]
        first = store.claim_many("org", request, Owner("run-1"), lease_ttl_s=10.0)[0].receipt
        now[0] += 11  # the owner died: its lease ran out
        second = store.claim_many("org", request, Owner("run-2"), lease_ttl_s=10.0)[0].receipt
        assert first.lease_id != second.lease_id
        assert provider_idempotency_key(KEY, first.generation) == provider_idempotency_key(
            KEY, second.generation
        )
        assert second.lease_id
        done = store.complete_many("org", [Completion(KEY, second.lease_id, 1)], Owner("run-2"))
        assert done.ok
        forced = store.claim_many(
            "org", request, Owner("run-3"), lease_ttl_s=10.0, mode=ClaimMode.FORCE_REFRESH
        )
        third = forced[0].receipt
        assert provider_idempotency_key(KEY, third.generation) != provider_idempotency_key(
            KEY, second.generation
        )
        assert store.release("org", [LeaseRef(KEY, third.lease_id or "")], Owner("run-3")).ok


def test_batch_idempotency_key_is_order_free() -> None:
    a, b = provider_idempotency_key("a" * 64, 1), provider_idempotency_key("b" * 64, 1)
    assert batch_idempotency_key([a, b]) == batch_idempotency_key([b, a])


@pytest.mark.waits
def test_a_batch_sent_again_in_another_order_gets_each_member_its_own_replayed_result(
    make_system: Any, db_path: Path
) -> None:
    # The provider stores each batch's answer under its Idempotency-Key and replays it (as
    # examples/provider.py does). That key is order-free, so a rerun that batches the same
    # members in another order must still send them in the order first sent: else the
    # replayed answer, split by position, gives each member another member's result.
    answers: dict[str, list[Any]] = {}
    held = threading.Event()

    def batch_fn(payload: list[Any], ctx: Any) -> list[Any]:
        if ctx.idempotency_key not in answers:  # billed once; a repeat is replayed
            answers[ctx.idempotency_key] = [{"n": item["n"]} for item in payload]
        return answers[ctx.idempotency_key]

    class StoresNothing(SqliteReceiptStore):
        """The first run's store: its results are never written (as when killed)."""

        def complete_many(self, *args: Any, **kwargs: Any) -> Any:
            held.wait(WAIT_S)
            raise StoreError("killed before this was stored")

    tool = Tool(
        tool_id="b", fn=lambda i, c: i, retry_safe=True,
        batch=BatchStrategy(batch_fn=batch_fn, max_batch_size=4),
    )  # fmt: skip
    policy = Policy(batch_grace_s=0.2, lease_ttl_s=1.0)
    first_store = StoresNothing(db_path)
    try:
        first = make_system([tool], policy=policy, store=first_store, run_id="killed")
        first.proxy().execute_many("b", [{"n": n} for n in range(4)])
        deadline = time.monotonic() + WAIT_S
        while not answers and time.monotonic() < deadline:  # the provider answered: paid
            time.sleep(0.01)
        first.stop(timeout_s=0.2)  # its results never stored; its leases lapse
        time.sleep(1.5)
        rerun = make_system([tool], policy=policy, run_id="rerun")
        results = [
            f.get(timeout=WAIT_S) for f in rerun.proxy().execute_many("b", [{"n": n} for n in (3, 1, 0, 2)])
        ]
        assert len(answers) == 1  # the same request: replayed, not billed again
        assert [r.value for r in results] == [{"n": 3}, {"n": 1}, {"n": 0}, {"n": 2}]
    finally:
        held.set()
        first_store.close()


def _sent_error() -> BaseException:
    error = ProviderError("the connection broke after sending", failure_kind=FailureKind.TRANSIENT)
    error.sent = True
    return error


@pytest.mark.parametrize(
    ("error", "same"),
    [
        (lambda: TimeoutError("no answer in time"), True),
        (_sent_error, True),
        (lambda: ProviderError("503 Service Unavailable", failure_kind=FailureKind.TRANSIENT), False),
    ],
    ids=["timed-out", "cut-off-after-sending", "answered-503"],
)
def test_idempotency_key_after_a_recorded_failure_is_kept_unless_the_provider_answered(
    make_system: Any, read_receipts: Any, key_of: Any, error: Any, same: bool
) -> None:
    """Issue 26: a failure after which no answer came (a timeout, a connection cut after
    sending) is recorded ``timeout`` and the next call of it asks under the same key (a
    provider that served it replays its answer); an answered failure (a 503) is a new
    execution, under a new key."""
    keys: list[str] = []

    def fn(input: Any, ctx: Any) -> Any:
        keys.append(ctx.idempotency_key)
        if len(keys) == 1:
            raise error()
        return {"ok": input["n"]}

    tool = Tool(tool_id="t", fn=fn, retry_safe=True)
    system = make_system([tool], policy=Policy(retry_attempts=0))
    with pytest.raises(Exception):  # noqa: B017 - the tool's own error, as raised
        system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S)
    (receipt,) = read_receipts([key_of(tool, {"n": 1})])
    assert receipt.status.value == "failed"
    assert receipt.failure_kind is (FailureKind.TIMEOUT if same else FailureKind.TRANSIENT)
    assert system.proxy().execute("t", {"n": 1}).get(timeout=WAIT_S).value == {"ok": 1}
    assert len(keys) == 2 and (keys[0] == keys[1]) is same
