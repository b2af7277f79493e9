"""A rerun's receipts, read ahead of its calls into the tool's memo.

A rerun asks for the receipts an earlier run completed, in about the order it completed
them. Each call the memo cannot answer is a plain read on its caller's thread, which
with many caller threads costs far more than the read (every read gives up the GIL
and waits to take it back behind the others'). Once a tool's plain reads find what
they ask for, :class:`ReadAhead` reads that run's receipts in pages, in the order of
their last update and starting at the earliest among those found, and gives them to
the memo (:class:`~actors.messages.RememberOutputs` with ``ahead``): the calls that
follow are memo hits, answered on their callers' threads without a read of their own.

What it keeps is what a plain read would have answered: completed receipts a normal
claim reuses, whose key is the one this tool's calls make of the stored input hash
(this tool, credentials, version and scope; no ``stale_after_s``), none that the
salvage file holds a paid output for. A key the memo holds or owes is not replaced.
It stays a couple of pages ahead of the tool's calls, stops at half the memo's bound,
at the end of the receipts, at an error, once calls stop coming for
:data:`IDLE_S`, and when the system stops.
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

__all__ = ["AHEAD_PAGES", "IDLE_S", "PAGE", "ReadAhead"]

PAGE = 1000
"""Receipts a read takes."""
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
        self.kept = 0
        """Outputs given to the memo."""
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
        seen_calls, quiet_since = 0, time.monotonic()
        while not self.stopping.is_set():
            if self.read - self.calls >= AHEAD_PAGES * PAGE:
                now = time.monotonic()
                if self.calls != seen_calls:
                    seen_calls, quiet_since = self.calls, now
                elif now - quiet_since >= IDLE_S:
                    return
                self.stopping.wait(_LOOK_S)
                continue
            if self.memo.bytes * 2 >= self.memo.max_bytes:
                self._ended = True
                return
            rows = self.store.read_completed_since(
                self.org_id, self.tool_id, after=self._after, keys=found, limit=PAGE
            )
            if not rows:
                self._ended = True
                return
            last = rows[-1]
            self._after = (last[3], last[0])
            self.read += len(rows)
            key_of = self.key_of
            texts = {key: text for key, input_hash, text, _ in rows if key_of(input_hash) == key}
            for key in self.salvaged(texts) if texts else ():
                texts.pop(key, None)
            if texts:
                self.kept += len(texts)
                with contextlib.suppress(pykka.ActorDeadError):
                    self.queue.tell(RememberOutputs(entries=tuple(texts.items()), ahead=True))
