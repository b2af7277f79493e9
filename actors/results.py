"""What a call resolves to (:class:`ToolResult`) and what a tool receives (:class:`ToolContext`)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, Literal, TypeVar

import attrs

from actors.runtime.nesting import NestScope, lend

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = [
    "Execution",
    "ToolContext",
    "ToolResult",
    "batch_idempotency_key",
    "provider_idempotency_key",
]

Execution = Literal["live", "cached", "in_flight"]


@attrs.frozen(kw_only=True)
class ToolResult:
    """The result of one call.

    Attributes:
        value: the tool's output (any JSON value), None when ``status`` is ``no_result``.
        execution: ``live`` (this call ran it: the first call answered with the output
            of this system's execution of its receipt, one per receipt the system
            completes; when the owner left, or the receipt rode along in a request sent
            again, the first of its later calls), ``cached`` (a completed receipt),
            ``in_flight`` (attached to another owner's running call).
        receipt_key: the receipt key (sha256 hex).
        tool_id: the tool.
        status: ``ok``, or ``no_result`` when the tool (or a batch split) gave nothing.
        refresh_uncertain: True when ``value`` is the receipt's last good output, given
            while a refresh of it has an uncertain outcome (its request may have reached
            the provider, so a newer answer may exist there); ``execution`` is then
            ``cached`` or ``in_flight``. Counted in ``stats()["refresh_uncertain"]``.
        refresh_running: True when ``value`` is the receipt's last good output, given to
            a call that did not force a refresh while a refresh of it is under way (in
            any system: ordinary calls never wait on a refresh); ``execution`` is then
            ``cached``. Counted in ``stats()["refresh_running"]``.
    """

    value: Any
    execution: Execution
    receipt_key: str
    tool_id: str
    status: Literal["ok", "no_result"] = "ok"
    refresh_uncertain: bool = False
    refresh_running: bool = False

    @classmethod
    def of(
        cls,
        value: Any,
        execution: Execution,
        receipt_key: str,
        tool_id: str,
        refresh_uncertain: bool = False,
        refresh_running: bool = False,
    ) -> ToolResult:
        """A result whose status follows its value: None is ``no_result``."""
        status: Literal["ok", "no_result"] = "no_result" if value is None else "ok"
        return cls(
            value=value, execution=execution, receipt_key=receipt_key, tool_id=tool_id, status=status,
            refresh_uncertain=refresh_uncertain, refresh_running=refresh_running,
        )  # fmt: skip


@attrs.frozen(kw_only=True)
class ToolContext:
    """Passed to a tool as its second argument.

    Attributes:
        tool_id: the tool.
        idempotency_key: provider idempotency key (:func:`provider_idempotency_key`):
            the same for in-call retries, after a timeout and for a re-claim after a
            lost owner, new after a recorded failure with an answer or for a forced
            refresh, aggregated over the members for a batch (a batch request's key as
            recorded before it was first sent: it goes again only whole). Send it as
            ``Idempotency-Key``.
        receipt_keys: the receipt keys this provider call serves (one unless batched).
        credential_scope_digest: the credentials the call runs under.
        deadline: ``time.monotonic()`` value after which the call is timed out.
        timeout_s: seconds left to ``deadline`` when this attempt started (the
            call's own timeout on its first attempt; retries get what is left).
        attempt: 1 for the first in-call attempt, then 2, 3 for retries.

    Calls the function makes on its own thread (or greenlet) are its nested calls; calls
    from threads or greenlets it starts itself are nested only inside :meth:`nested` (or
    through :meth:`wrap`).
    """

    tool_id: str
    idempotency_key: str
    receipt_keys: tuple[str, ...]
    credential_scope_digest: str
    deadline: float
    timeout_s: float
    attempt: int = 1
    _nest: NestScope | None = attrs.field(default=None, eq=False, repr=False, alias="_nest")
    """The worker running this attempt (set by the dispatcher while the function runs)."""
    _said: dict[str, bool] = attrs.field(factory=dict, eq=False, repr=False, alias="_said")
    """What the tool said of its provider's answer (:meth:`mark_replayed`)."""

    def mark_replayed(self) -> None:
        """Say that the provider answered this attempt from its record of an earlier
        request with the same idempotency key (a replay, which providers do not bill
        again; ``http_tool`` says so when the answer carries ``Idempotent-Replayed:
        true``). The run's report counts the lookups of such answers apart from those
        answered anew. Call it from the tool's function, before it returns or raises."""
        self._said["replayed"] = True

    @property
    def replayed(self) -> bool:
        """Whether the tool said the provider replayed its answer (:meth:`mark_replayed`)."""
        return self._said.get("replayed", False)

    @property
    def receipt_key(self) -> str:
        """The first (for unbatched calls, the only) receipt key."""
        return self.receipt_keys[0]

    def nested(self) -> AbstractContextManager[None]:
        """A block whose calls, on the calling thread or greenlet, are this call's nested
        calls, as if made on the function's own thread: they borrow its slot (no global
        ceiling, no provider ``max_concurrency``; rates still apply), a call of an input
        this call was made inside gets :class:`~actors.errors.CallCycleError`, and an error
        their futures raise counts as passed on (relayed), not as the provider's answer.

        For a tool that fans out on threads of its own (a ``ThreadPoolExecutor``, gevent
        greenlets) and waits for those calls: made outside this block, they wait for
        slots their waiting parents hold, and at the ceiling nothing moves until the
        parents' timeouts. Only while the function runs: entered after it returned (or on
        a context made by hand), the block changes nothing.
        """
        return lend(self._nest)

    def wrap(self, fn: _F) -> _F:
        """``fn`` made to run inside :meth:`nested`, for an executor:
        ``pool.map(ctx.wrap(lambda x: proxy.execute("child", x).get()), inputs)``."""
        nest = self._nest

        @functools.wraps(fn)
        def inside(*args: Any, **kwargs: Any) -> Any:
            with lend(nest):
                return fn(*args, **kwargs)

        return inside  # type: ignore[return-value]


def provider_idempotency_key(receipt_key: str, generation: int | None) -> str:
    """The provider idempotency key of one receipt's execution: sha256 hex.

    Args:
        receipt_key: the receipt key.
        generation: the receipt's execution generation (``Receipt.generation``), or None
            for a call without a receipt (a tool that is not durable).

    The generation is unchanged when a lease is taken over from a lost owner (crash,
    SIGKILL, expiry) or a released receipt is claimed again, so that retry sends the
    crashed attempt's key and a provider that honours ``Idempotency-Key`` (IETF draft
    "The Idempotency-Key HTTP Header Field") answers it from its records instead of
    billing again. It grows after a recorded failure that had an answer (not a timeout)
    or for a forced (or stale) re-run, which must reach the provider anew
    (docs/receipts.md, A key never changes between attempts).
    """
    return hashlib.sha256(f"{receipt_key}:{'' if generation is None else generation}".encode()).hexdigest()


def batch_idempotency_key(member_keys: Iterable[str]) -> str:
    """sha256 hex over the sorted members' provider idempotency keys.

    A batch request's key is computed once, before it is first sent, and recorded with its
    members (``stores.BatchRecord``): every later attempt (a retry, a rerun after a crash)
    sends those members under that recorded key."""
    return hashlib.sha256(":".join(sorted(member_keys)).encode()).hexdigest()
