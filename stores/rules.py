"""Backend-neutral rules a store applies inside its claim and completion transactions.

Shared by every backend so they decide alike: which receipts keep a previous output,
when a lease holder counts as gone, how an output becomes column text or a refusal.
"""

from __future__ import annotations

from typing import Any

from stores.codec import encode_output
from stores.errors import InvalidOutputError, OutputNotStorableError
from stores.process import current_process_identity, process_gone
from stores.types import Owner, Receipt, ReceiptStatus, Refusal, RefusalReason

__all__ = [
    "IN_FLIGHT",
    "KEEPS_OUTPUT",
    "LOST_WHILE_RUNNING",
    "MAX_OUTPUT_BYTES",
    "NO_LEASE",
    "encode_for_store",
    "holder_gone",
    "output_too_large_error",
    "owner_identity",
    "resolved_as_failed",
]

MAX_OUTPUT_BYTES = 32 * 1024 * 1024
"""Largest serialised output one receipt may hold (32 MiB, docs/receipts.md, Outputs)."""

IN_FLIGHT = (ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)
KEEPS_OUTPUT = (ReceiptStatus.COMPLETED, ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)
"""A claim of a receipt in these statuses with ``completed_at`` set keeps its output."""

NO_LEASE: dict[str, Any] = dict.fromkeys(
    (
        "lease_id", "lease_owner_run_id", "lease_owner_attempt", "lease_expires_at",
        "lease_owner_host", "lease_owner_pid", "lease_owner_started_at",
    )
)  # fmt: skip
"""Receipt fields of a lease, cleared when a lost or failed refresh restores its output."""

LOST_WHILE_RUNNING = (
    "the owner was lost while the call ran (lease expired or process gone) and the tool is "
    "not retry-safe: the request may have reached the provider"
)


def owner_identity(owner: Owner) -> tuple[str | None, int | None, float | None]:
    """(host, pid, started_at) to record for a claim: the owner's, else this process's."""
    if owner.pid is not None:
        return owner.host, owner.pid, owner.started_at
    here = current_process_identity()
    return here.host, here.pid, here.started_at


def holder_gone(receipt: Receipt | None, now: float, seen: dict[Any, bool] | None = None) -> bool:
    """A live lease whose holder process is known to be gone (see ``process_gone``).

    ``seen`` caches answers per holder within one claim (one OS query per process).
    """
    if receipt is None or receipt.status not in IN_FLIGHT or not receipt.lease_live(now):
        return False
    holder = (receipt.lease_owner_host, receipt.lease_owner_pid, receipt.lease_owner_started_at)
    if seen is None:
        return process_gone(*holder)
    if holder not in seen:
        seen[holder] = process_gone(*holder)
    return seen[holder]


def output_too_large_error(size_bytes: int, salvage_path: str) -> str:
    """The error text to record with ``FailureKind.OUTPUT_TOO_LARGE`` (it names the salvage)."""
    return (
        f"the provider's answer ({size_bytes} bytes) is over the {MAX_OUTPUT_BYTES}-byte output cap: "
        f"it was salvaged to {salvage_path} (tooldispatch salvage ls); run with retry_failed or "
        "force_refresh to call the provider again"
    )


def encode_for_store(output: Any) -> tuple[str, Refusal | None]:
    """(column text, None), or ("", the refusal) for an output the store cannot take."""
    try:
        text = encode_output(output)
    except InvalidOutputError as exc:
        return "", Refusal(RefusalReason.INVALID_OUTPUT, str(exc))
    except OutputNotStorableError as exc:
        return "", Refusal(RefusalReason.OUTPUT_NOT_STORABLE, str(exc))
    if len(text) > MAX_OUTPUT_BYTES // 4 and len(text.encode()) > MAX_OUTPUT_BYTES:
        return "", Refusal(
            RefusalReason.OUTPUT_TOO_LARGE,
            f"output is {len(text.encode())} bytes; the cap is {MAX_OUTPUT_BYTES} bytes "
            "(salvage it and record failure kind output_too_large)",
        )
    return text, None


def resolved_as_failed(error: str | None, note: str) -> str:
    """The error text an uncertain receipt resolved as failed records."""
    text = "resolved as failed by an operator after an uncertain outcome"
    if note:
        text += f" ({note})"
    return f"{text}: {error}" if error else text
