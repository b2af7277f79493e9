"""Runtime plumbing shared by the actors: futures, timers and worker pools.

Everything here works on plain threads and, unchanged, under gevent
monkey-patching (where ``threading`` objects are greenlet-based).
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pykka

__all__ = ["Timers", "fail", "new_future", "new_pool", "runtime_name"]


def runtime_name() -> str:
    """``"gevent"`` when gevent has monkey-patched threading, else ``"threads"``."""
    monkey = sys.modules.get("gevent.monkey")
    return "gevent" if monkey and monkey.is_module_patched("threading") else "threads"


def new_future() -> pykka.Future[Any]:
    """A pykka future (greenlet-friendly under monkey-patching)."""
    return pykka.ThreadingFuture()


def fail(future: pykka.Future[Any], exc: BaseException) -> None:
    """Resolve ``future`` with ``exc``."""
    future.set_exception((type(exc), exc, exc.__traceback__))


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
            try:
                fn()
            except pykka.ActorDeadError:
                pass
