"""Which tool call the calling worker (thread or greenlet) works for: nested calls.

A call made while a tool's function runs is that call's nested call: it borrows its
waiting parent's slot and is refused at once if it would wait for its own result
(:class:`~actors.errors.CallCycleError`). Workers are told apart by thread, or by
greenlet under gevent. A thread or greenlet the tool starts itself is not its worker:
inside :meth:`~actors.results.ToolContext.nested` it is lent to the call (its calls are
nested, the errors their futures raise are relayed to the call) while that call runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from actors.errors import cause_chain
from actors.runtime import futures as _futures
from actors.runtime.flavor import getcurrent

__all__ = [
    "NestScope",
    "cause_chain",
    "enter_keys",
    "in_tool",
    "leave_keys",
    "lend",
    "relayed_here",
    "running_keys",
    "tool_greenlets",
    "tool_thread",
]

tool_thread = threading.local()
"""On threads: its ``active`` is True on a worker while it runs a tool's function (set by
the worker pool, :class:`~actors.runtime.actor.WorkerPool`)."""
tool_greenlets: set[Any] = set()
"""Under gevent: the greenlets running a tool's function, kept by the worker pool (a
greenlet-local flag would cost each attempt half a dozen objects for the collector to walk)."""


_running: dict[Any, frozenset[str]] = {}
"""The receipt keys each worker (thread or greenlet) runs a tool's function for."""

_lent: dict[Any, NestScope] = {}
"""Threads or greenlets a tool started, lent to its running call (``ToolContext.nested``)."""


class NestScope:
    """The worker running one attempt of a tool call, while it runs (None before and after).

    Held by the attempt's :class:`~actors.results.ToolContext`; :func:`enter_keys` fills
    it and :func:`leave_keys` empties it, so a thread lent to the call after it returned
    acts for nobody.
    """

    __slots__ = ("keys", "token")

    def __init__(self) -> None:
        self.token: Any = None
        self.keys: frozenset[str] | None = None


def _worker_id() -> Any:
    return getcurrent() if tool_greenlets and getcurrent is not None else threading.get_ident()


def enter_keys(keys: Iterable[str], scope: NestScope | None = None) -> Any:
    """The calling worker runs a tool's function for ``keys`` (its calls' receipt keys and
    those of the calls it was made inside); returns the token to leave. ``scope``: the
    attempt's, told which worker runs it."""
    me = _worker_id()
    held = _running[me] = frozenset(keys)
    if scope is not None:
        scope.token, scope.keys = me, held
    return me


def leave_keys(token: Any, scope: NestScope | None = None) -> None:
    _running.pop(token, None)
    if scope is not None:
        scope.token = scope.keys = None


def _acting_for(me: Any) -> Any:
    """The worker whose running tool call ``me`` works for: itself while it runs one, the
    call it is lent to while that call runs, else None."""
    if me in _running:
        return me
    scope = _lent.get(me) if _lent else None
    if scope is not None and scope.keys is not None and _running.get(scope.token) is scope.keys:
        return scope.token
    return None


@contextlib.contextmanager
def lend(scope: NestScope | None) -> Iterator[None]:
    """Lend the calling thread (or greenlet) to the tool call ``scope`` belongs to, for the
    block: see :meth:`~actors.results.ToolContext.nested`. Nothing to do on the call's
    own worker, or when ``scope`` is None (a context made by hand)."""
    me = _worker_id()
    if scope is None or scope.token is None or scope.token == me:
        yield
        return
    before = _lent.get(me)
    _lent[me] = scope
    try:
        yield
    finally:
        if before is None:
            _lent.pop(me, None)
        else:
            _lent[me] = before


_MARK = "_tooldispatch_relayed_into"
"""Attribute a nested call's error gets when its future raises it into a running tool
function: the running keys object (one per attempt, compared by identity) of each
attempt it was raised into. Held by the error, so nothing here grows with the calls."""


def _note_relayed(exc: BaseException) -> None:
    me = _acting_for(_worker_id())
    held = _running.get(me) if me is not None else None
    if held is None:
        return
    try:
        marks = exc.__dict__.get(_MARK)
        if marks is None:
            setattr(exc, _MARK, [held])
        elif not any(m is held for m in marks):
            del marks[:-15]  # an error raised into many attempts: the latest few
            marks.append(held)
    except BaseException:  # an error that takes no attribute, or refuses it (SystemExit too):
        pass  # not recognised later; whoever waits on the future still gets the very error


_futures.on_raise = _note_relayed


def relayed_here(token: Any, exc: BaseException) -> bool:
    """Whether the tool's function running under ``token`` got ``exc`` itself (the very
    object), or the error ``exc`` was explicitly raised from (``raise X from e``, a few
    levels), from a nested call's future (on its worker, or on one lent to it): raised
    on, it is that call's error, not one about the function's own request."""
    held = _running.get(token)
    return held is not None and any(any(m is held for m in _marks(link)) for link in cause_chain(exc))


def _marks(link: BaseException) -> list[Any]:
    """The attempts ``link`` was raised into (read from its own ``__dict__``: a class's
    ``__getattr__`` is never asked, whatever it raises)."""
    try:
        marks = vars(link).get(_MARK)
    except BaseException:  # no __dict__, or one that cannot be read; SystemExit too (this runs
        return []  # where the worker reports the call's error: it is told whatever this does)
    return marks if type(marks) is list else []


def running_keys() -> frozenset[str]:
    """The receipt keys the calling worker's tool function runs for, or was called inside
    (empty elsewhere)."""
    me = _acting_for(_worker_id())
    return frozenset() if me is None else _running.get(me, frozenset())


def in_tool() -> bool:
    """True on a worker thread (or greenlet) while it runs a tool's function, and on one
    lent to a running tool call."""
    if tool_greenlets and getcurrent is not None and getcurrent() in tool_greenlets:
        return True
    if getattr(tool_thread, "active", False):
        return True
    return bool(_lent) and _acting_for(_worker_id()) is not None
