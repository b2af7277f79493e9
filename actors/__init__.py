"""The dispatch actor system (pykka): the host-facing front door of tooldispatch.

.. code-block:: python

    from actors import DispatchSystem, Tool, RunInfo
    from stores import SqliteReceiptStore
"""

from stores.errors import InvalidInputError, StoreError, ToolDispatchError
from stores.types import FailureKind

from .errors import (
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
    RateLimitedError,
    ReceiptPersistenceError,
    ReceiptWaitTimeoutError,
    RecordedFailureError,
    SuspendedError,
    ToolTimeoutError,
    UncertainOutcomeError,
    UnknownToolError,
    UnreadableToolError,
)
from .results import ToolContext, ToolResult
from .salvage import SalvageEntry, SalvageLog
from .system import DispatchProxy, DispatchSystem
from .tool import BatchStrategy, Pacing, Policy, RunInfo, Tool

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
    "InvalidInputError",
    "InvalidOutputError",
    "LeaseLostError",
    "NotSentError",
    "OutputNotStorableError",
    "Pacing",
    "PersistenceCircuitOpenError",
    "Policy",
    "ProviderError",
    "ProviderUnavailableError",
    "ProviderUnreachableError",
    "RateLimitedError",
    "ReceiptPersistenceError",
    "ReceiptWaitTimeoutError",
    "RecordedFailureError",
    "RunInfo",
    "SalvageEntry",
    "SalvageLog",
    "StoreError",
    "SuspendedError",
    "Tool",
    "ToolContext",
    "ToolDispatchError",
    "ToolResult",
    "ToolTimeoutError",
    "UncertainOutcomeError",
    "UnknownToolError",
    "UnreadableToolError",
]
