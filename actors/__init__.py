"""The dispatch actor system (pykka): the host-facing front door of tooldispatch.

.. code-block:: python

    from actors import DispatchSystem, Tool, RunInfo
    from stores import SqliteReceiptStore
"""

from actors.errors import (
    AuthScopeChangedError,
    BudgetExceededError,
    CallCancelledError,
    CallCycleError,
    DispatchError,
    InvalidOutputError,
    LeaseLostError,
    NotSentError,
    OutputNotStorableError,
    PersistenceCircuitOpenError,
    ProviderError,
    ProviderUnavailableError,
    ProviderUnreachableError,
    QuotaExhaustedError,
    RateLimitedError,
    ReceiptPersistenceError,
    ReceiptWaitTimeoutError,
    RecordedFailureError,
    ResultSalvagedError,
    SuspendedError,
    ToolTimeoutError,
    UncertainOutcomeError,
    UnknownToolError,
    UnreadableToolError,
)
from actors.flusher.salvage import SalvageEntry, SalvageLog
from actors.results import ToolContext, ToolResult
from actors.system import DispatchProxy, DispatchSystem
from actors.telemetry import Telemetry
from actors.tool import BatchStrategy, Limit, Pacing, Policy, RunInfo, Tool
from stores.errors import InputTooLargeError, InvalidInputError, StoreError, ToolDispatchError
from stores.types import FailureKind

__all__ = [
    "AuthScopeChangedError",
    "BatchStrategy",
    "BudgetExceededError",
    "CallCancelledError",
    "CallCycleError",
    "DispatchError",
    "DispatchProxy",
    "DispatchSystem",
    "FailureKind",
    "InputTooLargeError",
    "InvalidInputError",
    "InvalidOutputError",
    "LeaseLostError",
    "Limit",
    "NotSentError",
    "OutputNotStorableError",
    "Pacing",
    "PersistenceCircuitOpenError",
    "Policy",
    "ProviderError",
    "ProviderUnavailableError",
    "ProviderUnreachableError",
    "QuotaExhaustedError",
    "RateLimitedError",
    "ReceiptPersistenceError",
    "ReceiptWaitTimeoutError",
    "RecordedFailureError",
    "ResultSalvagedError",
    "RunInfo",
    "SalvageEntry",
    "SalvageLog",
    "StoreError",
    "SuspendedError",
    "Telemetry",
    "Tool",
    "ToolContext",
    "ToolDispatchError",
    "ToolResult",
    "ToolTimeoutError",
    "UncertainOutcomeError",
    "UnknownToolError",
    "UnreadableToolError",
]
