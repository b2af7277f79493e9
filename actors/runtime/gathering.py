"""Many senders, one message: items put from any thread for one actor to take together.

A put into an empty :class:`Gathering` asks its sender to ring the actor (one doorbell
message); items put before the actor takes them ride along with that ring. So a busy
actor reads, in one turn, everything sent to it since its last turn, and a hand-off (a
message, a thread woken) is paid once per turn instead of once per item; an idle actor
is rung at once, so nothing waits for company.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Generic, TypeVar

__all__ = ["Gathering"]

T = TypeVar("T")


class Gathering(Generic[T]):
    """Items waiting for one actor, in the order they were put.

    ``put`` from any thread; ``take`` and ``close`` from the actor's thread (``close``
    from its ``on_stop`` too). Once closed, puts are refused: the sender answers for
    what it would have put.
    """

    __slots__ = ("_closed", "_items", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[T] = []
        self._closed = False

    def put(self, items: Iterable[T]) -> bool | None:
        """Keep ``items``. Returns True: the gathering was empty, ring the actor; False:
        a ring is on its way (these ride along); None: closed, nothing was kept."""
        with self._lock:
            if self._closed:
                return None
            ring = not self._items
            self._items.extend(items)
            return ring and bool(self._items)

    def take(self) -> list[T]:
        """Every item put since the last take (the next put rings again)."""
        with self._lock:
            items, self._items = self._items, []
        return items

    def close(self) -> list[T]:
        """Refuse later puts; return the items left untaken."""
        with self._lock:
            self._closed = True
            items, self._items = self._items, []
        return items

    def __len__(self) -> int:
        """Items waiting (a snapshot: other threads may put meanwhile)."""
        return len(self._items)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` d."""
        return self._closed
