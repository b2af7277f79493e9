"""Fenced writes of one kind waiting together go to the store as one call.

A fenced bulk write applies or refuses each of its keys on its own (``FenceReport``), so
two :class:`~actors.messages.CompleteReceipts` of the same org and owner are the same as
one over both lists: one statement, one round trip (Postgres) instead of two. Each lane of the receipt store
actor (Postgres) takes, with the write it picks up, the writes waiting behind it that
merge with it (up to :data:`MAX_REQUESTS` requests, :data:`MAX_ITEMS` keys), and
answers each request with its own share of the report: its keys in its order, applied or
refused. Requests whose keys overlap are never merged (each key is in one request of a
merged call), and an error of the merged call is each request's error, as a failed
transaction would be. Only requests whose items are a list naming distinct keys are
merged (:func:`mergeable`); others go to the store alone. SQLite does not merge: its
group commit keeps each request in a savepoint of its own.
"""

from __future__ import annotations

import contextlib
from typing import Any

from actors.messages import FencedWrite
from actors.runtime.actor import log
from stores.types import FenceReport

__all__ = ["Merged", "answer", "mergeable"]

MAX_REQUESTS = 16
"""Most requests in one merged call."""
MAX_ITEMS = 500
"""Most items (keys) in one merged call (the completion flusher's bulk cap)."""


class Merged:
    """Requests sent as one store call: the first request's write over every request's
    items; each request must be :func:`mergeable`."""

    __slots__ = ("calls", "first", "items", "keys", "shares")

    def __init__(self, call: FencedWrite) -> None:
        self.first = call
        self.calls: list[FencedWrite] = [call]
        self.items = list(call.items)
        self.shares = [[item.key for item in self.items]]
        """Each request's keys, in its order (what its answer covers)."""
        self.keys = set(self.shares[0])

    def command(self) -> FencedWrite:
        """The merged call: the first request's write over every request's items."""
        return self.first if len(self.calls) == 1 else self.first.with_items(self.items)

    def takes(self, call: Any) -> bool:
        """Add ``call`` when it is a write of the same kind, org, owner and extra
        arguments, names none of the keys already here, and the merged call stays within
        :data:`MAX_REQUESTS` and :data:`MAX_ITEMS`."""
        first = self.first
        if type(call) is not type(first) or not mergeable(call):
            return False
        if call.org_id != first.org_id or call.owner != first.owner or call.extra() != first.extra():
            return False
        items = call.items
        if len(self.calls) >= MAX_REQUESTS or len(self.items) + len(items) > MAX_ITEMS:
            return False
        keys = [item.key for item in items]
        if not self.keys.isdisjoint(keys):
            return False
        self.keys.update(keys)
        self.calls.append(call)
        self.shares.append(keys)
        self.items.extend(items)
        return True

    def answer(self, value: Any, error: BaseException | None) -> None:
        """Each request gets its share of ``value`` (a FenceReport), or ``error``."""
        if len(self.calls) == 1:
            answer(self.calls[0], value, error)
            return
        for call, keys in zip(self.calls, self.shares, strict=True):
            answer(call, None, error, lambda keys=keys: _share(value, keys))


def answer(call: Any, value: Any, error: BaseException | None, share: Any = None) -> None:
    """Answer one request (a store command) with ``value`` (or what ``share()`` makes of
    it) or ``error``; it is answered whatever making its share or its reply slot raises."""
    try:
        if error is not None:
            call.reply.set_exception((type(error), error, error.__traceback__))
        else:
            call.reply.set(share() if share is not None else value)
    except Exception as exc:  # e.g. a store answering with something else
        log.exception("answering a store command (%s) failed", type(call).__name__)
        with contextlib.suppress(Exception):
            call.reply.set_exception((type(exc), exc, exc.__traceback__))


def mergeable(call: Any) -> bool:
    """A :class:`~actors.messages.FencedWrite` whose items are a list naming distinct
    keys: what merging (and SQLite's group commit) takes. Anything else goes to the
    store alone, and gets its own answer or error there."""
    if not isinstance(call, FencedWrite):
        return False
    items = call.items
    if type(items) is not list:
        return False
    try:
        keys = {item.key for item in items}
    except (AttributeError, TypeError):
        return False
    return len(keys) == len(items) and all(type(k) is str for k in keys)


def _share(report: FenceReport, keys: list[str]) -> FenceReport:
    applied = set(report.applied)
    return FenceReport(
        tuple(k for k in keys if k in applied), {k: report.refused[k] for k in keys if k in report.refused}
    )
