"""Receipt stores: the durable record of every tool call.

The contract is :class:`ReceiptStore`; :class:`SqliteReceiptStore` is the embedded
default. Keys come from :func:`receipt_key`. This package never imports ``actors``.
"""

from ._codec import decode_output, encode_output, salvage_form, validate_output
from ._process import ProcessIdentity, current_process_identity, process_gone
from ._rules import output_too_large_error
from .base import MAX_OUTPUT_BYTES, Clock, ReceiptStore, decide_disposition, next_generation
from .errors import (
    InvalidInputError,
    InvalidOutputError,
    OutputNotStorableError,
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
    ResolveAction,
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
    "InvalidOutputError",
    "KeyExplanation",
    "LeaseRef",
    "OutputNotStorableError",
    "Owner",
    "ProcessIdentity",
    "Receipt",
    "ReceiptStatus",
    "ReceiptStore",
    "Refusal",
    "RefusalReason",
    "ResolveAction",
    "SchemaVersionError",
    "SqliteReceiptStore",
    "StoreCorruptError",
    "StoreError",
    "StoreUnavailableError",
    "ToolDispatchError",
    "canonical_json",
    "current_process_identity",
    "decide_disposition",
    "decode_output",
    "encode_output",
    "explain_key",
    "next_generation",
    "output_too_large_error",
    "process_gone",
    "receipt_key",
    "salvage_form",
    "validate_output",
]
