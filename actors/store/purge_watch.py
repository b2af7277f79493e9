"""Purges made by anyone are seen by every running system's memo.

A memo answers ``cached`` from memory; after ``tooldispatch receipts purge`` (this
process or another) those answers must stop. :class:`PurgeWatcher` reads the store's
purge epoch every :data:`PURGE_POLL_S` (a point read on the store actor, answered
there, no thread held) and, when it changed, tells every tool queue actor to drop its
memo (:class:`~actors.messages.ForgetMemo`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import pykka

from actors.messages import ForgetMemo, ReadPurgeEpoch
from actors.runtime.actor import Timers

__all__ = ["PURGE_POLL_S", "PurgeWatcher"]

PURGE_POLL_S = 0.5
"""How often a running system looks for purges made by anyone (seconds)."""


class PurgeWatcher:
    """Polls the purge epoch until ``stopping`` is set.

    Args:
        store: the ReceiptStoreActor ref (takes ReadPurgeEpoch).
        queues: the tool queue actor refs to tell.
        timers: where the polls are scheduled.
        stopping: set when the system stops; the polls end.
    """

    def __init__(self, store: Any, queues: Sequence[Any], timers: Timers, stopping: threading.Event) -> None:
        self.store = store
        self.queues = queues
        self.timers = timers
        self.stopping = stopping
        self.epoch: Any = None

    def start(self) -> None:
        """Begin polling (the first read at once)."""
        self.timers.call_later(0.0, self._poll)

    def _poll(self) -> None:
        if self.stopping.is_set():
            return
        try:
            self.store.tell(ReadPurgeEpoch(reply=self))
        except pykka.ActorDeadError:
            return
        self.timers.call_later(PURGE_POLL_S, self._poll)

    def set(self, value: Any = None) -> None:
        """The store's answer (runs on the store actor's thread)."""
        if self.epoch is not None and value != self.epoch:
            for ref in self.queues:
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.tell(ForgetMemo())
        self.epoch = value

    def set_exception(self, exc_info: Any = None) -> None:
        """A store hiccup: the next read tells."""
