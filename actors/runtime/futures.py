"""Futures: the one-shot future every call and actor reply gets, and its helpers.

:class:`LightFuture` keeps :class:`pykka.ThreadingFuture`'s contract on a single lock;
under gevent monkey-patching the lock is gevent's, and ``await`` never blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import pykka

from actors.errors import exc_info_of, with_traceback

__all__ = [
    "MAX_WAIT_S",
    "Interjection",
    "LightFuture",
    "bounded",
    "fail",
    "new_future",
    "resolved_future",
    "takes_interjections",
    "wait_interjected",
    "waits_here",
]

MAX_WAIT_S = 1e9
"""Longest single wait handed to a lock, condition or event, seconds (about 31 years).
Longer ones (a ``timeout_s=1e10`` meaning "no timeout") raise OverflowError there
(``threading.TIMEOUT_MAX`` is about 9.2e9), so every wait is cut to this; the waits
that loop simply wait again."""


def bounded(seconds: float) -> float:
    """``seconds`` cut to :data:`MAX_WAIT_S` (and never below 0)."""
    return max(0.0, min(seconds, MAX_WAIT_S))


log = logging.getLogger("tooldispatch")

_NO_RESULT: Any = object()
"""A get hook's "not run yet" marker, shared by every future."""

on_raise: Callable[[BaseException], None] | None = None
"""Told of each error a future's ``get`` raises (set by :mod:`actors.runtime.actor`: an error a
tool's function got from a nested call)."""


settle: Callable[[], None] | None = None
"""Called by each ``get`` before it answers, while set (by :mod:`actors.runtime.host_signals`,
while a host's signal handler runs in a greenlet of its own)."""


class Interjection(BaseException):
    """Thrown into a greenlet that waits in :meth:`LightFuture.get` (or
    :func:`wait_interjected`) to run ``run()`` there: what it raises leaves the wait, else
    the wait goes on (under gevent, a host's signal handler brought to the main greenlet:
    :mod:`actors.runtime.host_signals`).

    Args:
        run: called with no argument on the greenlet it was thrown into.
    """

    def __init__(self, run: Callable[[], Any]) -> None:
        super().__init__()
        self.run = run


class LightFuture(pykka.Future[Any]):
    """A one-shot pykka future on a single lock (instead of a Condition).

    Same contract as :class:`pykka.ThreadingFuture` (``get(timeout=)``, ``set``,
    ``set_exception``, ``map``/``join``), at a fraction of the cost: every call and
    every actor reply gets one. Set exactly once, by any thread; read by any number.
    Under gevent the lock is gevent's (greenlet-friendly).

    Beyond pykka's contract:

    * ``await future`` never blocks the event loop: the value is handed to the loop
      with ``call_soon_threadsafe`` when the future is set.
    * :meth:`add_done_callback` runs a callback (on the setting thread) once set.
    * :meth:`cancel` says the caller gave up (``asyncio`` cancellation of an
      ``await`` calls it too); a timeout on :meth:`get` is not giving up.
    """

    def __init__(self) -> None:  # not pykka's: its marker object per future is GC pressure
        self._hook: Callable[[float | None], Any] | None = None
        self._hook_result: Any = _NO_RESULT
        self._lock = threading.Lock()
        self._lock.acquire()
        self._value: Any = None
        self._exc_info: Any = None
        self._callbacks: list[Callable[[LightFuture], None]] | None = None
        self.done = False
        self.cancelled = False
        self.on_cancel: Callable[[], None] | None = None
        """Set by the dispatcher: told when the caller cancels (runs on the caller's thread)."""

    def get(self, *, timeout: float | None = None) -> Any:
        if self._hook is not None:  # map/filter/join/reduce: computed once, on the first get
            if self._hook_result is _NO_RESULT:
                self._hook_result = self._hook(None if timeout is None else bounded(timeout))
            return self._hook_result
        if not self.done:
            try:
                acquired = (
                    self._lock.acquire() if timeout is None else self._lock.acquire(timeout=bounded(timeout))
                )
            except Interjection as interjection:  # run where this waits, then wait on
                acquired = _interjected(interjection, self._lock.acquire, timeout)
            if not acquired:
                timed_out = pykka.Timeout(f"{timeout} seconds")
                if on_raise is not None:  # a tool's own wait on a nested call ran out
                    on_raise(timed_out)
                raise timed_out
            self._lock.release()
        if settle is not None:  # a host's handler first: what it raises, the host has first
            settle()
        if self._exc_info is not None:
            # read by identity and BaseException's own method: a tool's error may be falsy
            # (its __len__ says 0), or make its own with_traceback raise
            exc = self._exc_info[1] if self._exc_info[1] is not None else self._exc_info[0]()
            if on_raise is not None:
                on_raise(exc)
            raise with_traceback(exc, self._exc_info[2])
        return self._value

    def set(self, value: Any = None) -> None:
        if self.done or self._hook is not None:
            raise queue.Full
        self._value = value
        self.done = True
        self.on_cancel = None  # never called once set; it holds the call (a cycle)
        self._lock.release()
        self._run_callbacks()

    def set_exception(self, exc_info: Any = None) -> None:
        if self.done or self._hook is not None:
            raise queue.Full
        self._exc_info = exc_info or sys.exc_info()
        self.done = True
        self.on_cancel = None
        self._lock.release()
        self._run_callbacks()

    def set_get_hook(self, func: Callable[[float | None], Any]) -> None:
        """pykka's public hook (``map``, ``filter``, ``join``, ``reduce`` use it): ``get``
        returns ``func(timeout)``, computed once.

        Raises:
            queue.Full: the future is already set.
        """
        if self.done:
            raise queue.Full
        self._hook = func

    def add_done_callback(self, fn: Callable[[LightFuture], None]) -> None:
        """Call ``fn(self)`` once set: at once if it is set already, else on the setter's thread."""
        if not self.done:
            callbacks = self._callbacks
            if callbacks is None:
                callbacks = self._callbacks = []
            callbacks.append(fn)
            if not self._is_done():
                return
            # set meanwhile: run it here unless the setter already took it
            with contextlib.suppress(ValueError):
                callbacks.remove(fn)
                fn(self)
            return
        fn(self)

    def _is_done(self) -> bool:
        return self.done

    def peek(self) -> tuple[Any, BaseException | None]:
        """A set future's (value, None), or (None, its error); never waits (a future not
        set yet, or one with a get hook, gives (None, None))."""
        if not self.done or self._hook is not None:
            return None, None
        if self._exc_info is not None:
            error: BaseException | None = self._exc_info[1]
            return None, error
        return self._value, None

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            try:
                fn(self)
            except Exception:
                log.exception("a future's done callback failed")

    def cancel(self) -> bool:
        """Give up on this call: a call not yet sent to its provider is removed (unless
        another caller shares it); once sent, it is persisted as usual.

        Returns:
            False when the future is already resolved, else True (the future then
            fails with CallCancelledError once the dispatcher has taken it out).
        """
        if self.done:
            return False
        if not self.cancelled:
            self.cancelled = True
            hook = self.on_cancel
            if hook is not None:
                hook()
        return True

    def __await__(self) -> Generator[Any, None, Any]:
        if not self.done:
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()

            def wake(_: LightFuture) -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(_resolve, waiter)

            self.add_done_callback(wake)
            try:
                yield from waiter.__await__()
            except asyncio.CancelledError:
                self.cancel()
                raise
        return self.get(timeout=0)


def _interjected(interjection: Interjection, acquire: Callable[..., bool], timeout: float | None) -> bool:
    """Run ``interjection`` (what it raises leaves), then wait on with ``acquire`` (a lock's
    or an event's) for what is left of ``timeout`` (counted from here: the time the
    interjection took is its own)."""
    end = None if timeout is None else time.monotonic() + bounded(timeout)
    while True:
        interjection.run()
        try:
            if end is None:
                return acquire()
            return acquire(timeout=bounded(end - time.monotonic()))
        except Interjection as another:
            interjection = another


def wait_interjected(event: threading.Event, timeout: float | None) -> bool:
    """``event.wait(timeout)``, taking :class:`Interjection` s as :meth:`LightFuture.get` does."""
    try:
        return event.wait(None if timeout is None else bounded(timeout))
    except Interjection as interjection:
        return _interjected(interjection, event.wait, timeout)


_WAITS = {LightFuture.get.__code__, wait_interjected.__code__, _interjected.__code__}


def takes_interjections(fn: Callable[..., Any]) -> None:
    """Say that ``fn`` catches an :class:`Interjection` raised by what it waits on (its
    own code; between them, gevent's or this project's store code only)."""
    _WAITS.add(fn.__code__)


def waits_here(frame: Any) -> bool:
    """Whether a greenlet suspended at ``frame`` (its ``gr_frame``) waits in
    :meth:`LightFuture.get`, :func:`wait_interjected` or a function given to
    :func:`takes_interjections`, with nothing between but gevent's or the stores' own
    code: an :class:`Interjection` thrown into it lands there, and no one else's code is
    unwound."""
    while frame is not None:
        if frame.f_code in _WAITS:
            return True
        if not str(frame.f_globals.get("__name__", "")).startswith(("gevent.", "stores.")):
            return False
        frame = frame.f_back
    return False


def _resolve(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def new_future() -> LightFuture:
    """A fresh :class:`LightFuture`."""
    return LightFuture()


class _Resolved(LightFuture):
    """A :class:`LightFuture` made already set (a memo hit): no lock is ever taken."""

    def __init__(self, value: Any) -> None:  # every attribute of LightFuture, set
        self._hook = None
        self._hook_result = _NO_RESULT
        self._value = value
        self._exc_info = None
        self._callbacks = None
        self.done = True
        self.cancelled = False
        self.on_cancel = None


def resolved_future(value: Any) -> LightFuture:
    """A :class:`LightFuture` already resolved with ``value``."""
    return _Resolved(value)


def fail(future: Any, exc: BaseException) -> None:
    """Resolve ``future`` with ``exc`` (a future already resolved is left alone)."""
    with contextlib.suppress(queue.Full):
        future.set_exception(exc_info_of(exc))  # (a tool's error may make __traceback__ raise)
