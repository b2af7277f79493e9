"""Fenced writes of one kind waiting together go to the store as one call.

A fenced bulk write applies or refuses each of its keys on its own (``FenceReport``), so
two ``complete_many`` of the same org and owner are the same as one over both lists:
one statement, one round trip (Postgres) instead of two. The receipt store actor merges
what waits in its inbox (SQLite, before its group commit) or in its lanes' queue
(Postgres), and answers each request with its own share of the report: its keys in its
order, applied or refused. Requests whose keys overlap are never merged (each key is in
one request of a merged call), and an error of the merged call is each request's error,
as a failed transaction would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stores._together import TOGETHER
from stores.types import FenceReport

from ._lifecycle_messages import StoreCall
from ._runtime import log

__all__ = ["MERGEABLE", "Merged", "merge"]

MERGEABLE = TOGETHER
"""The store methods taking ``(org_id, items, owner, **kwargs)`` whose items name keys
(the fenced writes, those SQLite's group commit takes too)."""


class Merged:
    """Requests sent as one store call (``method(org_id, items, owner, **kwargs)``)."""

    __slots__ = ("calls", "items", "keys", "kwargs", "method", "org_id", "owner")

    def __init__(self, call: StoreCall, kwargs: dict[str, Any]) -> None:
        self.method = call.method
        self.calls: list[StoreCall] = [call]
        self.kwargs = kwargs
        self.org_id, items, self.owner = call.args
        self.items = list(items)
        self.keys = _keys(self.items)
        """None: this request's items do not name distinct keys (never merged)."""

    @property
    def args(self) -> tuple[Any, ...]:
        """The merged call's positional arguments."""
        return (self.org_id, self.items, self.owner)

    def takes(self, call: StoreCall, kwargs: dict[str, Any]) -> bool:
        """Add ``call`` when it is of the same kind and names none of the keys already here."""
        if call.method != self.method or kwargs != self.kwargs or len(call.args) != 3:
            return False
        org_id, items, owner = call.args
        if org_id != self.org_id or owner != self.owner:
            return False
        keys = _keys(items)
        if keys is None or self.keys is None or not keys.isdisjoint(self.keys):
            return False
        self.keys |= keys
        self.calls.append(call)
        self.items.extend(items)
        return True

    def answer(self, value: Any, error: BaseException | None) -> None:
        """Each request gets its share of ``value`` (a FenceReport), or ``error``."""
        for call in self.calls:
            try:  # one reply that fails to be answered never keeps the others back
                if error is not None:
                    call.reply.set_exception((type(error), error, error.__traceback__))
                elif len(self.calls) == 1:
                    call.reply.set(value)
                else:
                    call.reply.set(_share(value, [item.key for item in call.args[1]]))
            except Exception:
                log.exception("answering a store call (%s) failed", call.method)


def merge(calls: Sequence[tuple[StoreCall, dict[str, Any]]]) -> list[Merged]:
    """Group fenced writes (methods in :data:`MERGEABLE`, three arguments) into as few
    store calls as their kinds and keys allow, in the order each kind first came."""
    merged: list[Merged] = []
    for call, kwargs in calls:
        if not any(m.takes(call, kwargs) for m in merged if m.method == call.method):
            merged.append(Merged(call, kwargs))
    return merged


def mergeable(call: Any) -> bool:
    """A told fenced write with the ``(org_id, items, owner)`` arguments merging needs."""
    return isinstance(call, StoreCall) and call.method in MERGEABLE and len(call.args) == 3


def _keys(items: Sequence[Any]) -> set[str] | None:
    try:
        keys = {item.key for item in items}
    except (AttributeError, TypeError):
        return None
    return keys if len(keys) == len(items) else None


def _share(report: FenceReport, keys: list[str]) -> FenceReport:
    applied = set(report.applied)
    return FenceReport(
        tuple(k for k in keys if k in applied), {k: report.refused[k] for k in keys if k in report.refused}
    )
