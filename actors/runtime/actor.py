"""Runtime plumbing shared by the actors: replies as messages, timers, the worker pool.

Futures (the calls' and the replies') are in :mod:`actors.runtime.futures`.

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
from typing import Any

import pykka

from actors.runtime.flavor import getcurrent, runtime_name
from actors.runtime.futures import bounded, fail
from actors.runtime.host_signals import hand_to_host
from actors.runtime.nesting import tool_greenlets, tool_thread

__all__ = [
    "InboxActor",
    "Reply",
    "Timers",
    "WorkerPool",
    "guarded",
    "log",
    "on_actor",
    "runtime_name",
]

log = logging.getLogger("tooldispatch")


class Reply:
    """A reply slot that turns into a message: ``set``/``set_exception`` tell an actor.

    Actors answer requests through the ``reply`` of a message. Giving them a
    :class:`Reply` instead of a future means the requester is never blocked: the
    answer arrives in its mailbox as ``fact(value=..., error=None, **fields)`` (or
    ``error=exc``), like any other message.

    Args:
        ref: the actor to tell.
        fact: the message class built with ``value``, ``error`` and ``fields``.
        fields: the rest of the message's fields (what the request was about).
    """

    __slots__ = ("done", "fact", "fields", "ref")

    def __init__(self, ref: Any, fact: Callable[..., Any], **fields: Any) -> None:
        self.ref = ref
        self.fact = fact
        self.fields = fields
        self.done = False

    def set(self, value: Any = None) -> None:
        if self.done:
            return
        self.done = True
        with contextlib.suppress(pykka.ActorDeadError):
            self.ref.tell(self.fact(value=value, error=None, **self.fields))

    def set_exception(self, exc_info: Any = None) -> None:
        if self.done:
            return
        self.done = True
        exc = (exc_info or sys.exc_info())[1]
        with contextlib.suppress(pykka.ActorDeadError):
            self.ref.tell(self.fact(value=None, error=exc, **self.fields))


class InboxActor(pykka.ThreadingActor):
    """A pykka ``ThreadingActor`` whose inbox is a ``queue.SimpleQueue`` (one C lock)
    instead of pykka's ``queue.Queue`` (a Condition that allocates a lock per wait): every
    hand-off to the actor is cheaper (a round trip between two threads: 34 -> 16 µs here),
    and a call crosses about a dozen. Under gevent the patched SimpleQueue (greenlets).

    Its thread is a daemon: a system its host never stopped is stopped at interpreter
    exit (``actors.runtime.at_exit``), after the host's own threads ended, and nothing an actor
    still waits on (a locked store, an interrupted stop) holds the exit up."""

    use_daemon_thread = True

    def __init__(self) -> None:
        super().__init__()
        # pykka's public attributes, set before the actor starts (nothing was put yet)
        self.actor_inbox = self.actor_ref.actor_inbox = self.new_inbox()

    @staticmethod
    def new_inbox() -> Any:
        """The inbox this actor is made with (a subclass may give its own; runs on the
        starting thread)."""
        return queue.SimpleQueue()


class _Handling(threading.local):
    on = False


_handling = _Handling()
"""Set on a thread (greenlet, under gevent) once it ran an actor's message handler: an
actor's thread is its own for life, and the flag dies with it (an ident kept in a set
could be another thread's later)."""


def on_actor() -> bool:
    """Whether the caller runs on an actor's thread (a future's done callback runs on the
    thread that resolved it: a tool queue actor's)."""
    return _handling.on


def guarded(on_receive: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Keep an actor alive when handling one message fails.

    pykka stops an actor whose ``on_receive`` raises on a told message, which would
    leave every later caller waiting. The error is logged, and the message's ``reply``
    (if it has one still open) fails with it.
    """

    @functools.wraps(on_receive)
    def handle(self: Any, message: Any) -> Any:
        if not _handling.on:  # (a read a message, once a write: the thread is an actor's for life)
            _handling.on = True
        try:
            return on_receive(self, message)
        except (KeyboardInterrupt, SystemExit) as exc:  # a signal handler's, under gevent
            if not hand_to_host(exc):
                raise
            log.error(
                "%s: a signal handler raised %r inside it, handling %s: passed on to the host",
                type(self).__name__, exc, type(message).__name__,
            )  # fmt: skip
            return None
        except Exception as exc:
            log.exception("%s failed on %s", type(self).__name__, type(message).__name__)
            reply = getattr(message, "reply", None)
            if reply is not None and not getattr(reply, "done", True):
                fail(reply, exc)
            return None

    return handle


class WorkerPool:
    """Runs tool functions: daemon workers, started on demand, reused when idle.

    Not a ThreadPoolExecutor: its threads are not daemons (the interpreter joins
    them at exit, so one hung tool keeps the process alive) and it queues work when
    all workers are busy (a queued unit would "run" late). Here a submitted task
    starts at once: on an idle worker, else on a new one. The governor's slots bound
    how many run; ``in_tool()`` is True inside a task. Under gevent each task runs on
    a plain greenlet of its own (``gevent.spawn_raw``, nothing kept idle): a
    monkey-patched ``Thread.start`` switches to the new greenlet and waits for it to
    signal it started, ~100 µs per worker (5,000 started at once took 0.6 s), where a
    raw spawn only schedules it.
    """

    def __init__(self, name: str, idle_s: float = 30.0) -> None:
        self._name = name
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[Any]] = []
        self._ids = itertools.count(1)
        self._closed = False
        self.started = 0
        self._spawn: Callable[..., Any] | None = None
        if runtime_name() == "gevent":
            import gevent

            self._spawn = gevent.spawn_raw

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` now on a worker. Exceptions are logged (``fn`` reports its own
        outcome).

        Raises:
            RuntimeError: the pool is shut down.
        """
        spawn = self._spawn
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker pool is shut down")
            inbox = self._idle.pop() if self._idle else None
        if spawn is not None:  # gevent: a greenlet per task (no idle workers to keep)
            self.started += 1
            spawn(self._run_greenlet, fn, args)
            return
        if inbox is not None:
            inbox.put((fn, args))
            return
        inbox = queue.SimpleQueue()
        inbox.put((fn, args))
        self.started += 1
        threading.Thread(
            target=self._work, args=(inbox,), name=f"{self._name}-{next(self._ids)}", daemon=True
        ).start()

    @staticmethod
    def _run(fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        tool_thread.active = True
        try:
            fn(*args)
        except BaseException:
            log.exception("a worker task failed")
        finally:
            tool_thread.active = False

    @staticmethod
    def _run_greenlet(fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        assert getcurrent is not None
        me = getcurrent()
        tool_greenlets.add(me)
        try:
            fn(*args)
        except BaseException as exc:
            if not hand_to_host(exc):  # (a signal handler's KeyboardInterrupt is the host's)
                log.exception("a worker task failed")
        finally:
            tool_greenlets.discard(me)

    def _work(self, inbox: queue.SimpleQueue[Any]) -> None:
        while True:
            try:
                task = inbox.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:
                        self._idle.remove(inbox)
                        return
                task = inbox.get()  # handed work while timing out
            if task is None:
                return
            self._run(*task)
            with self._lock:
                if self._closed:
                    return
                self._idle.append(inbox)

    def shutdown(self) -> None:
        """Stop idle workers; busy ones end after their task (never waited for)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)


class Timers:
    """One daemon thread (or greenlet) running callbacks at monotonic times.

    Callbacks run on the timer thread and must be quick (typically an actor ``tell``).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="tooldispatch-timers", daemon=True)
        self._thread.start()

    def call_later(self, delay_s: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` once, ``delay_s`` seconds from now."""
        with self._cond:
            entry = (self._clock() + max(0.0, delay_s), next(self._seq), fn, args)
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:  # a later one leaves the thread's wait as it is
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
                    self._cond.wait(None if timeout is None else bounded(timeout))
                if self._stopped:
                    return
                _, _, fn, args = heapq.heappop(self._heap)
            with contextlib.suppress(pykka.ActorDeadError):  # the actor stopped meanwhile
                fn(*args)
