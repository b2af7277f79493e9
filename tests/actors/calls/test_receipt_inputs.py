"""A receipt says what its call was for: the call's canonical input, or, for a tool whose
inputs must not be stored, the readable digest the tool chose (``Tool.keep_input``), or
nothing. Real dispatch systems on a SQLite file, both runtimes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors import BatchStrategy, InvalidInputError, Tool

from ..conftest import WAIT_S, outcome


def _verify(input: Any, ctx: Any) -> Any:
    if input["email"].startswith("bad"):
        raise ValueError("mailbox does not exist")
    return {"valid": True}


def _masked(input: Any) -> str:
    user, _, domain = input["email"].partition("@")
    return f"{user[:1]}…@{domain}"


def test_receipt_keeps_the_canonical_input_of_a_completed_and_a_failed_call(
    make_system: Any, read_receipts: Any, key_of: Any
) -> None:
    tool = Tool(tool_id="verify", fn=_verify, provider="mail")
    system = make_system([tool])
    proxy = system.proxy()
    good, bad = {"list": "newsletter", "email": "ada@example.com"}, {"email": "bad@example.com"}
    assert proxy.execute("verify", good).get(timeout=WAIT_S).value == {"valid": True}
    with pytest.raises(Exception, match="mailbox does not exist"):
        proxy.execute("verify", bad).get(timeout=WAIT_S)
    completed, failed = read_receipts([key_of(tool, good), key_of(tool, bad)])
    assert completed is not None and completed.status.value == "completed"
    assert completed.input_text == '{"email":"ada@example.com","list":"newsletter"}'  # RFC 8785: keys sorted
    assert failed is not None and failed.status.value == "failed"
    assert failed.input_text == '{"email":"bad@example.com"}'


def _verify_many(payload: list[Any], ctx: Any) -> list[Any]:
    out: list[Any] = []
    for input in payload:
        try:
            out.append(_verify(input, ctx))
        except ValueError as exc:
            out.append(exc)
    return out


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize(
    ("keep", "kept"), [(_masked, "a…@example.com"), (False, "")], ids=["digest", "nothing"]
)
def test_tool_that_keeps_no_input_stores_its_digest_or_nothing(
    make_system: Any, read_receipts: Any, db_path: Path, keep: Any, kept: str, batched: bool
) -> None:
    # a batch tool's requests are recorded before they are sent (stores.BatchRecord): for
    # such a tool without the members' inputs, alone or in a batch
    batch = BatchStrategy(batch_fn=_verify_many, max_batch_size=10) if batched else None
    system = make_system([Tool(tool_id="verify", fn=_verify, provider="mail", keep_input=keep, batch=batch)])
    proxy = system.proxy()
    result = proxy.execute("verify", {"email": "ada.lovelace@example.com"}).get(timeout=WAIT_S)
    with pytest.raises(Exception, match="mailbox does not exist"):
        proxy.execute("verify", {"email": "bad.address@example.com"}).get(timeout=WAIT_S)
    many = proxy.execute_many("verify", [{"email": f"grace.hopper{i}@example.com"} for i in range(3)])
    assert [f.get(timeout=WAIT_S).value for f in many] == [{"valid": True}] * 3
    (receipt,) = read_receipts([result.receipt_key])
    assert receipt is not None and receipt.input_text == kept
    system.stop(timeout_s=WAIT_S)
    stored = b"".join(p.read_bytes() for p in db_path.parent.glob(f"{db_path.name}*"))
    assert b"ada.lovelace" not in stored and b"bad.address" not in stored  # nowhere in the file (nor its WAL)
    assert b"grace.hopper" not in stored


@pytest.mark.parametrize(
    ("keep", "says"),
    [(lambda input: 1 / 0, "keep_input raised ZeroDivisionError"), (lambda input: 42, "must return a str")],
    ids=["raises", "not-a-str"],
)
def test_keep_input_that_fails_fails_that_call_alone(make_system: Any, keep: Any, says: str) -> None:
    def picky(input: Any) -> str:
        return keep(input) if input["email"].startswith("odd") else "ok"

    system = make_system([Tool(tool_id="verify", fn=_verify, provider="mail", keep_input=picky)])
    proxy = system.proxy()
    odd, fine = proxy.execute_many("verify", [{"email": "odd@example.com"}, {"email": "ada@example.com"}])
    error = outcome(odd)
    assert isinstance(error, InvalidInputError) and says in str(error), error
    assert fine.get(timeout=WAIT_S).value == {"valid": True}


def test_keep_input_must_be_a_bool_or_a_function() -> None:
    with pytest.raises(ValueError, match="keep_input"):
        Tool(tool_id="verify", fn=_verify, keep_input="email")  # type: ignore[arg-type]
