"""Row errors grouped by kind, for the report.

A row error's message usually carries the row's own values ("not a domain name:
'x.'", "boom in row 2"), so counting messages gives one line per row. The *kind* is
the message with quoted text, numbers and long hex ids replaced by placeholders; the
report shows each kind with its count and the first message seen as an example.
"""

from __future__ import annotations

import re
import threading

__all__ = ["ErrorKinds", "error_kind"]

_PATTERNS = (
    (re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""), "'…'"),  # quoted values
    (re.compile(r"\b[0-9a-fA-F]{12,}\b"), "…"),  # receipt keys, ids
    # numbers (line numbers, counts, a range "3-7", a date), not digits that belong to a
    # word: 5xx, v1, UTF-8, ISO-8859-1, x86-64, sha-256
    (re.compile(r"(?<![\w.])(?<!\w-)\d+(?:\.\d+)*(?:-\d+)*(?![\w-])"), "N"),
)

MESSAGE_CHARS = 160
"""Characters of a kind and of an example message shown (a message can hold a whole row)."""
_READ_CHARS = 4000
"""Characters of a message abstracted (values are replaced before the kind is cut)."""


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def error_kind(message: str) -> str:
    """``message`` with its values abstracted, then cut to :data:`MESSAGE_CHARS`:
    ``"ValueError: boom in row 2"`` -> ``"ValueError: boom in row N"``."""
    kind = message[:_READ_CHARS]
    for pattern, placeholder in _PATTERNS:
        kind = pattern.sub(placeholder, kind)
    return _cut(kind)


class ErrorKinds:
    """Counts of row errors by kind, with the first message of each kind (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.examples: dict[str, str] = {}

    def add(self, message: str) -> None:
        kind = error_kind(message)
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.examples.setdefault(kind, _cut(message))

    def most_common(self, n: int) -> list[tuple[str, int, str]]:
        """The ``n`` most frequent kinds as ``(kind, rows, example message)``."""
        with self._lock:
            ranked = sorted(self.counts.items(), key=lambda item: -item[1])[:n]
            return [(kind, count, self.examples[kind]) for kind, count in ranked]

    def __len__(self) -> int:
        return len(self.counts)

    def total(self) -> int:
        return sum(self.counts.values())
