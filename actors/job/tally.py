"""What each call of a run cost, counted from the results the rows got back.

The dispatch system's counters (``stats()``) count calls by how they were answered;
the paying user asks other questions: how many lookups ran this run, how many answers
were reused from earlier runs, how many calls joined a lookup already under way. (What
the provider billed is the system's ``answered`` counter: a lookup that ran may have
been answered from the provider's record of its idempotency key, and one that failed
may have been answered, and billed, all the same.) Every ``ctx.tool`` call's
:class:`~actors.results.ToolResult` carries its receipt key and execution, so the CLI
classifies each call itself, exactly:

* ``ran``: the first call of a receipt key answered ``live`` this run: the tool ran for
  it and its receipt was completed this run (the system answers one call ``live`` per
  receipt it completes, a member of a request taken over and sent again included).
* ``joined``: a call answered by a lookup of this run that was already under way
  (``in_flight``, or ``live`` for a key already counted as ran: the followers of a
  call in the same batch window).
* ``reused_this_run``: ``cached`` for a key that ran earlier in this run (the memo).
* ``reused``: ``cached`` for a key that did not run this run: a receipt from an earlier run
  (``reused_receipts`` counts those receipts once each). Rows finish in any order, so a
  cached answer seen before its key's live one is moved to ``reused_this_run`` then.
* ``failed``: the call raised: the tool's error (this run's, or one its receipt
  recorded), or the system's (a provider down, an uncertain outcome...).
* ``input_refused``: the call raised :class:`~stores.errors.InvalidInputError` (or
  ``InputTooLargeError``): its input is not plain JSON or is over the input cap, and
  was refused before anything was claimed or sent (or the tool itself raised it).
* ``cancelled``: a stop (a signal) cancelled the call (refused before it was sent, or not
  answered within the abort's bound): not a failure, and its row is not done (a rerun
  makes the call; one that was sent goes again under the same idempotency key).
* ``salvaged``: a stop's bound ran out while the call's paid result was being stored
  (:class:`~actors.errors.ResultSalvagedError`): the result is in the salvage file, and
  its row is not done; a rerun stores it from there, without calling the tool again.

Local tools (``durable=False``: no receipts, free) are counted the same way, apart.
Memory: two small integers per distinct receipt key that ran or was reused.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["CallTally"]

KINDS = (
    "calls", "ran", "joined", "reused_this_run", "reused", "reused_receipts", "failed", "input_refused",
    "cancelled", "salvaged",
)  # fmt: skip


def _short(key: str) -> int:
    try:
        return int(key[:16], 16)  # 64 bits of a sha256: a collision among a run's keys is negligible
    except ValueError:
        return hash(key)


class CallTally:
    """Per tool counts of :data:`KINDS` (thread-safe).

    Args:
        tools: the play's tools; those with ``durable=False`` are local.
    """

    def __init__(self, tools: Iterable[Any]) -> None:
        self._lock = threading.Lock()
        self.local = {t.tool_id for t in tools if not getattr(t, "durable", True)}
        self.counts: dict[str, collections.Counter[str]] = {}
        self._ran: dict[str, set[int]] = {}
        self._cached: dict[str, dict[int, int]] = {}
        """tool -> key -> calls answered ``cached`` for it (a key that runs later in this run
        moves them from ``reused`` to ``reused_this_run``: rows finish in any order)."""

    def record(self, tool_id: str, result: Any) -> None:
        """Count one call's :class:`~actors.results.ToolResult`."""
        key = _short(result.receipt_key)
        with self._lock:
            counts = self.counts.setdefault(tool_id, collections.Counter())
            ran = self._ran.setdefault(tool_id, set())
            counts["calls"] += 1
            cached = self._cached.setdefault(tool_id, {})
            if result.execution == "live":
                if key in ran:
                    counts["joined"] += 1
                else:
                    ran.add(key)
                    counts["ran"] += 1
                    moved = cached.get(key, 0)
                    if moved:  # its cached answers were seen first: they were this run's
                        counts["reused"] -= moved
                        counts["reused_this_run"] += moved
                        counts["reused_receipts"] -= 1
            elif result.execution == "in_flight":
                counts["joined"] += 1
            else:
                cached[key] = cached.get(key, 0) + 1
                if key in ran:
                    counts["reused_this_run"] += 1
                else:
                    counts["reused"] += 1
                    if cached[key] == 1:
                        counts["reused_receipts"] += 1

    def record_error(self, tool_id: str) -> None:
        """Count one call that raised."""
        with self._lock:
            counts = self.counts.setdefault(tool_id, collections.Counter())
            counts["calls"] += 1
            counts["failed"] += 1

    def record_input_refused(self, tool_id: str) -> None:
        """Count one call refused for its input (``InvalidInputError``)."""
        with self._lock:
            counts = self.counts.setdefault(tool_id, collections.Counter())
            counts["calls"] += 1
            counts["input_refused"] += 1

    def record_cancelled(self, tool_id: str) -> None:
        """Count one call a stop cancelled (``CallCancelledError``)."""
        with self._lock:
            counts = self.counts.setdefault(tool_id, collections.Counter())
            counts["calls"] += 1
            counts["cancelled"] += 1

    def record_salvaged(self, tool_id: str) -> None:
        """Count one call whose paid result an abort salvaged (``ResultSalvagedError``)."""
        with self._lock:
            counts = self.counts.setdefault(tool_id, collections.Counter())
            counts["calls"] += 1
            counts["salvaged"] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Tool id -> ``{kind: count}`` for every kind in :data:`KINDS`."""
        with self._lock:
            return {tool: {k: counts.get(k, 0) for k in KINDS} for tool, counts in self.counts.items()}

    def totals(self, *, local: bool = False) -> dict[str, int]:
        """Sums over the paid tools (``local=False``) or the local ones."""
        out = dict.fromkeys(KINDS, 0)
        for tool, counts in self.snapshot().items():
            if (tool in self.local) == local:
                for k, v in counts.items():
                    out[k] += v
        return out
