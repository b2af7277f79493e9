"""A receipt as every backend stores it: its columns, a row read back as a
:class:`~stores.types.Receipt`, error text as stored, the statuses a purge takes by default.

:data:`INPUT_TEXT_MAX_CHARS` and :func:`kept_input` (how a receipt keeps its input's
text) are :mod:`stores.quoting`'s, named here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import orjson

from stores.codec import decode_stored
from stores.money import Money
from stores.quoting import INPUT_TEXT_MAX_CHARS, kept_input, shorten, storable
from stores.types import BatchRecord, FailureKind, Receipt, ReceiptStatus

__all__ = [
    "COLUMNS",
    "DEFAULT_PURGE",
    "INPUT_TEXT_MAX_CHARS",
    "batch_from_row",
    "batch_row",
    "error_text",
    "kept_input",
    "read_cost",
    "receipt_from_row",
]

COLUMNS = (
    "key",
    "org_id",
    "scope",
    "tool_id",
    "status",
    "input_hash",
    "output",
    "error",
    "failure_kind",
    "lease_id",
    "lease_owner_run_id",
    "lease_owner_attempt",
    "lease_expires_at",
    "attempts",
    "created_at",
    "updated_at",
    "completed_at",
    "generation",
    "lease_owner_host",
    "lease_owner_pid",
    "lease_owner_started_at",
    "input_text",
    "batch_key",
    "cost",
)
"""Column order, which is also :class:`stores.types.Receipt`'s field order."""

DEFAULT_PURGE = (
    ReceiptStatus.COMPLETED,
    ReceiptStatus.FAILED,
    ReceiptStatus.PENDING,
    ReceiptStatus.SKIPPED,
)
"""The statuses a purge removes when none are named (never in-flight receipts)."""


def error_text(error: str) -> str:
    """Error text as stored: cut to :data:`~stores.quoting.MAX_ERROR_CHARS` (head and
    tail; a provider's error may quote the whole input), NUL and lone surrogates written
    as backslash escapes (:func:`~stores.quoting.storable`)."""
    return storable(shorten(error))


_STATUS_BY_VALUE = {status.value: status for status in ReceiptStatus}

_IN_FLIGHT_STATUSES = (ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)

# column index: default when its value is not a number (None: optional); "decides":
# a claim's decision reads it, so a bad value makes the receipt uncertain instead
_NUMBERS: tuple[tuple[int, Any], ...] = (
    (11, None),  # lease_owner_attempt
    (13, 0),  # attempts
    (14, 0.0),  # created_at
    (19, None),  # lease_owner_pid
    (20, None),  # lease_owner_started_at
)
_INTS = frozenset({11, 13, 17, 19})


def _number(value: Any, integer: bool) -> bool:
    kind = type(value)
    if kind is int:
        return True
    return kind is float and not integer and math.isfinite(value)


def _odd_numbers(values: list[Any], status: ReceiptStatus) -> str | None:
    """Normalise the numeric columns of ``values`` in place; the column a claim would decide
    by wrongly, if any (then the receipt is uncertain)."""
    for index, default in _NUMBERS:
        value = values[index]
        if value is not None and not _number(value, index in _INTS):
            values[index] = default
    lease = values[12]
    if lease is not None and not _number(lease, False):
        values[12] = None
        if status in _IN_FLIGHT_STATUSES:
            return f"lease_expires_at {lease!r}"
    for index in (15, 16):  # updated_at, completed_at
        if values[index] is not None and not _number(values[index], False):
            values[index] = None
    if values[15] is None:
        values[15] = 0.0
        if status is ReceiptStatus.COMPLETED and values[16] is None:
            return "updated_at (none, nor completed_at)"
    if values[22] is not None and type(values[22]) is not str:  # batch_key set by hand
        values[22] = str(values[22])
    if not _number(values[17], True):
        generation = values[17]
        values[17] = 1
        return f"generation {generation!r}"
    return None


def receipt_from_row(row: Sequence[Any]) -> Receipt:
    """A receipt from a row of :data:`COLUMNS` (SQLite's and Postgres's). A row this code
    cannot read whole fails nobody else's key: an output that does not decode is an
    :class:`~stores.codec.UnreadableOutput`; a status it does not know, or a value a
    claim decides by that is not a number (a lease expiry, an output's times, the
    generation: text or NaN set by hand), reads as ``uncertain`` (never re-run nor
    reused silently; an operator resolves it), with an error saying why and no
    ``completed_at`` (so no claim takes its output as a last good one); other numbers
    that are not (counts, times only shown) read as their defaults. A cost whose text is
    not an amount of money (:meth:`~stores.money.Money.parse`; set by hand) reads as None
    (unknown), never failing the read."""
    values = list(row)
    status = _STATUS_BY_VALUE.get(values[4])  # a dict hit is cheaper than the enum call
    odd = f"status {values[4]!r}" if status is None else _odd_numbers(values, status)
    if odd is not None:
        values[7] = (
            f"its stored {odd} is not one this code can read (changed by hand?): decide it with "
            f"`tooldispatch receipts resolve {str(values[0])[:16]} --rerun` (or --fail)"
        )
        status = ReceiptStatus.UNCERTAIN
        values[16] = None
    values[4] = status
    values[6] = decode_stored(values[6])  # one damaged output never fails a bulk read
    if values[8] is not None:
        values[8] = FailureKind(values[8])
    if values[23] is not None:
        values[23] = read_cost(values[23])
    return Receipt(*values)


def read_cost(text: Any) -> Money | None:
    """The cost column's text as :class:`~stores.money.Money`; None when it is NULL or not
    an amount of money (set by hand)."""
    if text is None:
        return None
    try:
        return Money.parse(text)
    except ValueError:
        return None


def batch_row(record: BatchRecord) -> tuple[str, str, str]:
    """(batch_key, tool_id, members text) of a batch record as every backend stores it:
    ``members`` is a JSON array of ``[receipt key, input text]`` in the request's order
    (``null`` for an input not recorded)."""
    members = orjson.dumps([[k, text] for k, text in zip(record.members, record.inputs, strict=True)])
    return record.key, record.tool_id, members.decode()


def batch_from_row(row: Sequence[Any]) -> BatchRecord:
    """A batch record from (batch_key, tool_id, members text)."""
    pairs = orjson.loads(row[2])
    members, inputs = tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    return BatchRecord(key=row[0], tool_id=row[1], members=members, inputs=inputs)
