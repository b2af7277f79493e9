"""The host's handle on a dispatch system: ``execute``, ``execute_many``, ``stats``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pykka

if TYPE_CHECKING:
    from actors.system import DispatchSystem

__all__ = ["DispatchProxy"]


class DispatchProxy:
    """The host's handle for submitting calls; every method is thread-safe."""

    def __init__(self, system: DispatchSystem) -> None:
        self._system = system

    def execute(
        self,
        tool_id: str,
        input: Any,
        *,
        force_refresh: bool = False,
        retry_failed: bool = False,
        stale_after_s: float | None = None,
        timeout_s: float | None = None,
    ) -> pykka.Future[Any]:
        """Queue one call.

        Args:
            tool_id: a tool the system was started with.
            input: the call's JSON input.
            force_refresh: re-run even if a completed receipt exists.
            retry_failed: re-run a receipt that failed.
            stale_after_s: completed receipts older than this (seconds) are re-run.
            timeout_s: this call's timeout (default the tool's, then the policy's).

        Returns:
            A pykka future (awaitable) of :class:`~actors.results.ToolResult`. It fails
            with UnknownToolError, InvalidInputError, the tool's error,
            RecordedFailureError, LeaseLostError, ReceiptWaitTimeoutError,
            BudgetExceededError, PersistenceCircuitOpenError, CallCancelledError or
            CallCycleError (from inside a tool, a call of the input it runs for).
        """
        (future,) = self._system._intake.execute_many(
            tool_id, (input,), force_refresh, retry_failed, stale_after_s, timeout_s
        )
        one: pykka.Future[Any] = future
        return one

    def execute_many(
        self,
        tool_id: str,
        inputs: Iterable[Any],
        *,
        force_refresh: bool = False,
        retry_failed: bool = False,
        stale_after_s: float | None = None,
        timeout_s: float | None = None,
    ) -> list[pykka.Future[Any]]:
        """Queue many calls of one tool in one message (same options as :meth:`execute`).

        Returns:
            list of futures, same order as ``inputs``. An input that is not JSON fails
            its own future alone.
        """
        return self._system._intake.execute_many(
            tool_id, tuple(inputs), force_refresh, retry_failed, stale_after_s, timeout_s
        )

    def stats(self) -> dict[str, Any]:
        """See :meth:`DispatchSystem.stats`."""
        return self._system.stats()
