"""A rerun's receipts, read ahead of its calls into the tool's memo.

A rerun asks for the receipts an earlier run completed, in about the order it completed
them. Each call the memo cannot answer is a plain read on its caller's thread, which
with many caller threads costs far more than the read (every read gives up the GIL
and waits to take it back behind the others'). Once a tool's plain reads find what
they ask for, :class:`ReadAhead` reads that run's receipts in pages, in the order of
their last update and starting at the earliest among those found, and gives them to
the memo (:class:`~actors.messages.RememberOutputs` with ``ahead_at``): the calls that
follow are memo hits, answered on their callers' threads without a read of their own.

What it keeps is what a plain read would have answered: completed receipts a normal
claim reuses, whose key is the one this tool's calls make of the stored input hash
(this tool, credentials, version and scope; no ``stale_after_s``), none that the
salvage file holds a paid output for, none of a key claimed since (a refresh), none
read before a purge the memo has seen since, nothing that replaces what the memo
holds or owes. What is read ahead is used for
:data:`~actors.queue.memo.AHEAD_TTL_S` after its read (the longest a refresh made
elsewhere meanwhile goes unseen), within half the memo's bound. A read takes about
:data:`PAGE_S` of the tool's calls (at least :data:`MIN_PAGE`, at most :data:`PAGE`
receipts, never more output than the room left), and the reading stays
:data:`AHEAD_PAGES` reads ahead of the calls; it ends when the run's own outputs fill
half the memo, at the end of the receipts or an error, once calls stop coming for
:data:`IDLE_S` (a later rerun resumes it), and when the system stops.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pykka

from actors.messages import RememberOutputs
from actors.runtime.actor import log

__all__ = ["AHEAD_PAGES", "IDLE_S", "MIN_PAGE", "PAGE", "PAGE_S", "ReadAhead"]

PAGE = 1000
"""Most receipts a read takes."""
MIN_PAGE = 32
"""Fewest receipts a read takes."""
PAGE_S = 0.5
"""A read takes about this many seconds of the tool's calls (at their rate since the
previous read): what it keeps is used well within :data:`~actors.queue.memo.AHEAD_TTL_S`."""
AHEAD_PAGES = 2
"""Pages read ahead of the tool's calls (rows read minus calls made) before waiting."""
IDLE_S = 2.0
"""No call of the tool for this long: the reading stops (a later rerun starts it again
where it left off)."""
_LOOK_S = 0.005


class ReadAhead:
    """Reads one tool's receipts ahead of a rerun's calls (any thread).

    Args:
        store: the receipt store (:meth:`stores.base.ReceiptStore.read_completed_since`).
        org_id, tool_id: whose receipts.
        key_of: the receipt key this tool's calls make of an input hash
            (:func:`stores.keys.key_of_hash_maker`).
        memo: the tool's memo (its ``bytes`` and ``max_bytes`` are read).
        queue: the tool's queue actor (told :class:`~actors.messages.RememberOutputs`).
        salvaged: which keys of a ``{key: ...}`` mapping the salvage file holds an output for.
        stopping: set when the system stops.
    """

    def __init__(
        self, *, store: Any, org_id: str, tool_id: str, key_of: Callable[[str], str], memo: Any, queue: Any,
        salvaged: Callable[[Mapping[str, Any]], set[str]], stopping: threading.Event,
    ) -> None:  # fmt: skip
        self.store = store
        self.org_id = org_id
        self.tool_id = tool_id
        self.key_of = key_of
        self.memo = memo
        self.queue = queue
        self.salvaged = salvaged
        self.stopping = stopping
        self.calls = 0
        """The tool's calls counted since the reading began (:meth:`asked`)."""
        self.read = 0
        """Receipts read so far."""
        self._after: tuple[float, str] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ended = False
        """The receipts ran out, a read failed, or the memo is half full: never again."""

    @property
    def running(self) -> bool:
        """Whether the reading goes on now."""
        return self._thread is not None

    def noticed(self, found: Sequence[str]) -> None:
        """A plain read found the receipts of ``found`` (keys): a rerun; begin reading
        ahead from them (once; again after it stopped for want of calls)."""
        with self._lock:
            if self._thread is not None or self._ended or self.stopping.is_set():
                return
            self._thread = thread = threading.Thread(
                target=self._run,
                args=(list(found),),
                name=f"tooldispatch-read-ahead-{self.tool_id}",
                daemon=True,
            )
        thread.start()

    def asked(self, n: int) -> None:
        """The tool was called ``n`` more times (racy by design: a lost count only reads
        a little less far ahead)."""
        self.calls += n

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for the reading to end (after ``stopping`` is set)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _run(self, found: list[str]) -> None:
        try:
            self._read_ahead(found)
        except Exception:  # a read that fails ends the reading; the calls read for themselves
            log.debug("read-ahead of %s ended", self.tool_id, exc_info=True)
            self._ended = True
        finally:
            with self._lock:
                self._thread = None

    def _read_ahead(self, found: list[str]) -> None:
        self.calls = self.read = 0
        memo, page = self.memo, MIN_PAGE
        now = time.monotonic()
        seen_calls, quiet_since, rate_calls, rate_at = 0, now, 0, now
        while not self.stopping.is_set():
            now = time.monotonic()
            room = memo.max_bytes // 2 - memo.ahead_bytes
            if self.read - self.calls >= AHEAD_PAGES * page or room <= 0:
                if self.calls != seen_calls:
                    seen_calls, quiet_since = self.calls, now
                elif now - quiet_since >= IDLE_S:
                    return
                self.stopping.wait(_LOOK_S)
                continue
            if memo.bytes * 2 >= memo.max_bytes:  # the run's own outputs fill it
                self._ended = True
                return
            forgets = memo.forgets  # (before the read: a purge since voids it)
            rows = self.store.read_completed_since(
                self.org_id, self.tool_id, after=self._after, keys=found, limit=page, max_bytes=room
            )
            read_at = time.monotonic()
            if not rows:
                self._ended = True
                return
            last = rows[-1]
            self._after = (last[3], last[0])
            self.read += len(rows)
            key_of = self.key_of
            texts = {
                key: (text, cost) for key, input_hash, text, _, cost in rows if key_of(input_hash) == key
            }
            for key in self.salvaged(texts) if texts else ():
                texts.pop(key, None)
            if texts:
                entries = tuple((key, text, cost) for key, (text, cost) in texts.items())
                with contextlib.suppress(pykka.ActorDeadError):
                    self.queue.tell(RememberOutputs(entries=entries, forgets=forgets, ahead_at=read_at))
            if read_at > rate_at:  # the next page: PAGE_S of the calls, at their rate since this one's
                rate = (self.calls - rate_calls) / (read_at - rate_at)
                page = max(MIN_PAGE, min(PAGE, int(rate * PAGE_S)))
            rate_calls, rate_at = self.calls, read_at
