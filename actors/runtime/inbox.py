"""What a stopping actor left unread is answered, never dropped.

pykka discards the told messages a stopped actor leaves in its inbox (it answers only
``ask`` futures). Every request of this system that carries a reply slot (``reply``) is a
told message, so each actor's ``on_stop`` reads what is left with :func:`left_in` and
fails the reply slots with :func:`answer_left`.
"""

from __future__ import annotations

import queue
from typing import Any

from actors.errors import CallCancelledError
from actors.runtime.futures import fail

__all__ = ["TakeBackInbox", "answer_left", "left_in"]


def left_in(inbox: Any) -> list[Any]:
    """The messages left in a stopping actor's inbox (called from its ``on_stop``; its own
    thread reads it, and stop's thread may too: nothing here waits).

    pykka discards what a stopped actor leaves unread, answering only ``ask`` futures;
    a request whose reply slot travels inside a told message would never be answered.
    """
    left = []
    while True:
        try:  # never waits: another thread (stop's, salvaging) may drain it too
            envelope = inbox.get_nowait()
        except queue.Empty:
            break
        reply_to = getattr(envelope, "reply_to", None)
        if reply_to is not None:
            fail(reply_to, CallCancelledError("the dispatcher stopped before handling the request"))
        left.append(getattr(envelope, "message", envelope))
    return left


def answer_left(messages: list[Any], exc: BaseException) -> None:
    """Fail the reply slot (``message.reply``) of every message left unhandled."""
    for message in messages:
        reply = getattr(message, "reply", None)
        if reply is not None and not getattr(reply, "done", False):
            fail(reply, exc)


class TakeBackInbox:
    """A ``queue.SimpleQueue`` inbox the actor's own thread can put one envelope back at
    the front of (:meth:`put_back`): an actor that reads ahead for messages to handle
    together leaves the first other one to its loop, in order.

    ``put`` from any thread; ``get``, ``get_nowait``, ``empty`` and ``put_back`` from the
    actor's own thread (and its ``on_stop``).
    """

    __slots__ = ("_front", "_queue")

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._front: Any = None

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self._queue.put(item)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        front = self._front
        if front is not None:
            self._front = None
            return front
        return self._queue.get(block, timeout)

    def get_nowait(self) -> Any:
        return self.get(False)

    def empty(self) -> bool:
        return self._front is None and self._queue.empty()

    def put_back(self, item: Any) -> None:
        """Make ``item`` the next one :meth:`get` returns (one at a time).

        Raises:
            RuntimeError: one is put back already.
        """
        if self._front is not None:
            raise RuntimeError("an envelope is put back already")
        self._front = item
