"""Runtime plumbing shared by the actors: futures, timers and worker pools.

Everything here works on plain threads and, unchanged, under gevent
monkey-patching (where ``threading`` objects are greenlet-based).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pykka

__all__ = ["LightFuture", "Timers", "fail", "guarded", "new_future", "new_pool", "runtime_name"]

log = logging.getLogger("tooldispatch")


def runtime_name() -> str:
    """``"gevent"`` when gevent has monkey-patched threading, else ``"threads"``."""
    monkey = sys.modules.get("gevent.monkey")
    return "gevent" if monkey and monkey.is_module_patched("threading") else "threads"


class LightFuture(pykka.Future[Any]):
    """A one-shot pykka future on a single lock (instead of a Condition).

    Same contract as :class:`pykka.ThreadingFuture` (``get(timeout=)``, ``set``,
    ``set_exception``, awaitable, ``map``/``join``), at a fraction of the cost: every
    call and every actor reply gets one. Set exactly once, by any thread; read by any
    number. Under gevent the lock is gevent's (greenlet-friendly).
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._lock.acquire()
        self._value: Any = None
        self._exc_info: Any = None
        self.done = False

    def get(self, *, timeout: float | None = None) -> Any:
        if self._get_hook is not None:
            return super().get(timeout=timeout)
        if not self.done:
            acquired = (
                self._lock.acquire() if timeout is None else self._lock.acquire(timeout=max(0.0, timeout))
            )
            if not acquired:
                raise pykka.Timeout(f"{timeout} seconds")
            self._lock.release()
        if self._exc_info is not None:
            exc = self._exc_info[1] or self._exc_info[0]()
            raise exc.with_traceback(self._exc_info[2])
        return self._value

    def set(self, value: Any = None) -> None:
        if self.done or self._get_hook is not None:
            raise queue.Full
        self._value = value
        self.done = True
        self._lock.release()

    def set_exception(self, exc_info: Any = None) -> None:
        if self.done or self._get_hook is not None:
            raise queue.Full
        self._exc_info = exc_info or sys.exc_info()
        self.done = True
        self._lock.release()


def new_future() -> pykka.Future[Any]:
    """A fresh :class:`LightFuture`."""
    return LightFuture()


def fail(future: pykka.Future[Any], exc: BaseException) -> None:
    """Resolve ``future`` with ``exc``."""
    future.set_exception((type(exc), exc, exc.__traceback__))


def guarded(on_receive: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Keep an actor alive when handling one message fails.

    pykka stops an actor whose ``on_receive`` raises on a told message, which would
    leave every later caller waiting. The error is logged, and the message's ``reply``
    future (if it has one still open) fails with it.
    """

    @functools.wraps(on_receive)
    def handle(self: Any, message: Any) -> Any:
        try:
            return on_receive(self, message)
        except Exception as exc:
            log.exception("%s failed on %s", type(self).__name__, type(message).__name__)
            reply = getattr(message, "reply", None)
            if isinstance(reply, LightFuture) and not reply.done:
                fail(reply, exc)
            return None

    return handle


def new_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """A bounded pool: OS threads, or greenlets once threading is monkey-patched."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)


class Timers:
    """One daemon thread (or greenlet) running callbacks at monotonic times.

    Callbacks run on the timer thread and must be quick (typically an actor ``tell``).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="tooldispatch-timers", daemon=True)
        self._thread.start()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` once, ``delay_s`` seconds from now."""
        with self._cond:
            heapq.heappush(self._heap, (self._clock() + max(0.0, delay_s), next(self._seq), fn))
            self._cond.notify()

    def stop(self) -> None:
        """Stop the thread; pending callbacks are dropped."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > self._clock()):
                    timeout = self._heap[0][0] - self._clock() if self._heap else None
                    self._cond.wait(timeout)
                if self._stopped:
                    return
                _, _, fn = heapq.heappop(self._heap)
            with contextlib.suppress(pykka.ActorDeadError):  # the actor stopped meanwhile
                fn()
