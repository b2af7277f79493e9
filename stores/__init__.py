"""Receipt stores: the durable record of every tool call.

The contract is :class:`ReceiptStore`; :class:`SqliteReceiptStore` is the embedded
default. Keys come from :func:`receipt_key`. This package never imports ``actors``.
"""

from .base import MAX_OUTPUT_BYTES, Clock, ReceiptStore, decide_disposition
from .errors import (
    InvalidInputError,
    SchemaVersionError,
    StoreCorruptError,
    StoreError,
    StoreUnavailableError,
    ToolDispatchError,
)
from .keys import KeyExplanation, canonical_json, explain_key, receipt_key
from .sqlite import SqliteReceiptStore
from .types import (
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
    Refusal,
    RefusalReason,
)

__all__ = [
    "MAX_OUTPUT_BYTES",
    "Claim",
    "ClaimDisposition",
    "ClaimMode",
    "ClaimRequest",
    "Clock",
    "Completion",
    "Failure",
    "FailureKind",
    "FenceReport",
    "InvalidInputError",
    "KeyExplanation",
    "LeaseRef",
    "Owner",
    "Receipt",
    "ReceiptStatus",
    "ReceiptStore",
    "Refusal",
    "RefusalReason",
    "SchemaVersionError",
    "SqliteReceiptStore",
    "StoreCorruptError",
    "StoreError",
    "StoreUnavailableError",
    "ToolDispatchError",
    "canonical_json",
    "decide_disposition",
    "explain_key",
    "receipt_key",
]
