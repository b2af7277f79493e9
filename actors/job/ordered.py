"""The output writer: JSONL lines in input order, memory bounded by bytes.

A row that finishes before an earlier one waits for it. Waiting lines are held in
memory up to ``memory_bytes`` in total; past that, each further one is appended to a
temporary file (in the output's folder, so it uses the output's disk, not a
memory-backed ``/tmp``) and read back when its turn comes. One slow row thus costs at
most ``memory_bytes`` of memory plus a few integers per waiting row, however many rows
finish behind it.
"""

from __future__ import annotations

import os
import tempfile
import threading
from typing import IO, Any

__all__ = ["DEFAULT_MEMORY_BYTES", "OrderedWriter"]

DEFAULT_MEMORY_BYTES = 16 * 1024 * 1024
"""Bytes of finished rows held in memory while an earlier row runs (16 MiB)."""


class OrderedWriter:
    """Writes lines in index order (0, 1, 2, ...); thread-safe.

    Args:
        out: the output file (binary), or None to write nothing.
        memory_bytes: most bytes of waiting lines kept in memory; the rest wait in a
            temporary file, deleted on :meth:`close`.
    """

    def __init__(self, out: IO[bytes] | None, *, memory_bytes: int = DEFAULT_MEMORY_BYTES) -> None:
        self.out = out
        self.memory_bytes = memory_bytes
        self.lock = threading.Lock()
        self.next = 0
        self.pending: dict[int, bytes | tuple[int, int]] = {}
        """index -> its line, or (offset, length) of it in the spill file."""
        self.held_bytes = 0
        self.peak_memory_bytes = 0
        self.spilled_bytes = 0
        self.written = 0
        self._spill: IO[bytes] | None = None
        self._spill_end = 0

    def put(self, index: int, line: bytes) -> None:
        """Write ``line`` now if it is next, else keep it until the rows before it come.

        Raises:
            OSError: the output (or the spill file) cannot be written.
        """
        if self.out is None:
            return
        with self.lock:
            if index != self.next:
                self._hold(index, line)
                return
            self._write(line)
            self.next += 1
            while self.next in self.pending:
                self._write(self._take(self.next))
                self.next += 1
            if not self.pending and self._spill is not None:
                self._spill.truncate(0)  # everything read back: reuse the file from the start
                self._spill_end = 0

    def close(self) -> None:
        """Write what is left (rows after a gap left by an interruption), in order, and
        delete the spill file."""
        if self.out is None:
            return
        with self.lock:
            try:
                for index in sorted(self.pending):
                    self._write(self._take(index))
            finally:
                if self._spill is not None:
                    self._spill.close()
                    self._spill = None

    def _hold(self, index: int, line: bytes) -> None:
        if self.held_bytes + len(line) <= self.memory_bytes:
            self.pending[index] = line
            self.held_bytes += len(line)
            self.peak_memory_bytes = max(self.peak_memory_bytes, self.held_bytes)
            return
        spill = self._spill_file()
        spill.seek(self._spill_end)
        spill.write(line)
        self.pending[index] = (self._spill_end, len(line))
        self._spill_end += len(line)
        self.spilled_bytes += len(line)

    def _take(self, index: int) -> bytes:
        held = self.pending.pop(index)
        if isinstance(held, bytes):
            self.held_bytes -= len(held)
            return held
        offset, length = held
        assert self._spill is not None
        self._spill.seek(offset)
        return self._spill.read(length)

    def _spill_file(self) -> IO[bytes]:
        if self._spill is None:
            name: Any = getattr(self.out, "name", None)
            folder = os.path.dirname(os.path.abspath(name)) if isinstance(name, str) else None
            self._spill = tempfile.TemporaryFile(prefix=".tooldispatch-spill-", dir=folder)  # noqa: SIM115
        return self._spill

    def _write(self, line: bytes) -> None:
        assert self.out is not None
        self.out.write(line)
        self.written += 1
