"""Row errors grouped by kind, for the report.

A row error's message usually carries the row's own values ("not a domain name:
'x.'", "boom in row 2"), so counting messages gives one line per row. The *kind* is
the message with its values (quoted text, numbers, long hex ids) replaced by
placeholders; messages of one kind are one group. What the report shows for a group
is its *label*: the first message of the group, with a placeholder only where a value
differs between the group's messages ("line N: input too large: the line is N bytes;
the cap is 33554432 bytes (32 MiB)"), so a value the same in every message (a limit,
a unit, a status code) is shown as it was written, and a group of one message shows
that message. The report gives its count and the first message as an example.
"""

from __future__ import annotations

import re
import threading

__all__ = ["ErrorKinds", "error_kind"]

_VALUES = re.compile(
    r"(?P<quoted>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"  # quoted values
    r"|(?P<hex>\b[0-9a-fA-F]{12,}\b)"  # receipt keys, ids
    # numbers (line numbers, counts, a range "3-7", a date), not digits that belong to a
    # word: 5xx, v1, UTF-8, ISO-8859-1, x86-64, sha-256
    r"|(?P<number>(?<![\w.])(?<!\w-)\d+(?:\.\d+)*(?:-\d+)*(?![\w-]))"
)
_PLACEHOLDERS = {"quoted": "'…'", "hex": "…", "number": "N"}

MESSAGE_CHARS = 160
"""Characters of a kind, a label and an example message shown (a message can hold a whole row)."""
VALUE_CHARS = 40
"""Characters of a value a label shows (the same in every message of its group) before it is cut."""
_READ_CHARS = 4000
"""Characters of a message abstracted (values are replaced before the kind is cut)."""


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def _parts(message: str) -> tuple[list[str], list[str], list[str]]:
    """(texts, values, placeholders) of ``message``'s first :data:`_READ_CHARS`
    characters: ``texts[0] + values[0] + texts[1] + ...`` is that text, one more text
    than values."""
    texts: list[str] = []
    values: list[str] = []
    placeholders: list[str] = []
    text, at = message[:_READ_CHARS], 0
    for found in _VALUES.finditer(text):
        texts.append(text[at : found.start()])
        values.append(found.group())
        placeholders.append(_PLACEHOLDERS[str(found.lastgroup)])
        at = found.end()
    texts.append(text[at:])
    return texts, values, placeholders


def _join(texts: list[str], shown: list[str]) -> str:
    return "".join(piece for pair in zip(texts, [*shown, ""], strict=True) for piece in pair)


def error_kind(message: str) -> str:
    """``message`` with its values abstracted, then cut to :data:`MESSAGE_CHARS`:
    ``"ValueError: boom in row 2"`` -> ``"ValueError: boom in row N"``."""
    texts, _, placeholders = _parts(message)
    return _cut(_join(texts, placeholders))


def _shortened(value: str) -> str:
    """A value shown in a label: whole up to :data:`VALUE_CHARS`, else its head and ``…``
    (inside its quotes, for a quoted one)."""
    if len(value) <= VALUE_CHARS:
        return value
    if value[0] in "'\"":
        return value[: VALUE_CHARS - 2] + "…" + value[0]
    return value[: VALUE_CHARS - 1] + "…"


class _Group:
    """One kind's messages: its first message's parts, and which values were the same in
    every message so far."""

    def __init__(self, message: str) -> None:
        self.texts, self.values, self.placeholders = _parts(message)
        self.same = [True] * len(self.values)
        self.count = 1
        self.example = _cut(message)

    def add(self, values: list[str]) -> None:
        self.count += 1
        for i, first in enumerate(self.values):
            if self.same[i] and (i >= len(values) or values[i] != first):
                self.same[i] = False

    def label(self) -> str:
        """The first message, each value that differs within the group replaced by its
        placeholder, showing no more of it than its kind compares (the kind's first
        :data:`MESSAGE_CHARS` characters), cut to :data:`MESSAGE_CHARS`."""
        whole = _join(self.texts, self.placeholders)
        budget = len(whole) if len(whole) <= MESSAGE_CHARS else MESSAGE_CHARS - 1
        pieces: list[str] = []
        for i, text in enumerate(self.texts):
            pieces.append(text[:budget])
            budget -= len(text)
            if budget <= 0 or i == len(self.values):
                break
            placeholder = self.placeholders[i]
            pieces.append(_shortened(self.values[i]) if self.same[i] else placeholder)
            budget -= len(placeholder)
            if budget <= 0:
                break
        shown = "".join(pieces)
        return _cut(shown if len(whole) <= MESSAGE_CHARS else shown + "…")


class ErrorKinds:
    """Counts of row errors by kind, with each kind's label and first message (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, _Group] = {}

    def add(self, message: str) -> None:
        texts, values, placeholders = _parts(message)
        kind = _cut(_join(texts, placeholders))
        with self._lock:
            group = self._groups.get(kind)
            if group is None:
                self._groups[kind] = _Group(message)
            else:
                group.add(values)

    def most_common(self, n: int) -> list[tuple[str, int, str]]:
        """The ``n`` most frequent kinds as ``(label, rows, first message)`` (see the module)."""
        with self._lock:
            ranked = sorted(self._groups.values(), key=lambda group: -group.count)[:n]
            return [(group.label(), group.count, group.example) for group in ranked]

    def __len__(self) -> int:
        return len(self._groups)

    def total(self) -> int:
        return sum(group.count for group in self._groups.values())
