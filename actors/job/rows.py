"""Reading a run's input: its rows, from CSV, JSONL or plain text, each within the input cap.

Every row is held to the one input-size rule (:mod:`stores.inputs`, docs/cli.md, Input):
a line longer than :data:`~stores.inputs.MAX_INPUT_BYTES` in the file, its ending not
counted (for CSV, a record: a quoted field may span lines, and the endings inside it
count) is never read whole. It is passed over to its end, a chunk
at a time, and fails alone as a :class:`RowError` naming its line(s) and size; a row
that is read is then measured as a call's input is, by the one measure: its canonical
JSON text (RFC 8785). Either way nothing of it is sent, and the rows after it are read on.

Two rules, then, in this order: the line (record) as it is in the file, which guards
memory, and the row's canonical text, which is the cap itself. The first refuses a row
whose canonical text would fit only when its line holds more than that text: whitespace
around a plain-text line or inside a JSONL one, ``1.0`` for ``1``, ``\\u00e9`` for ``é``.
A CSV record is never longer than its row's canonical text, and a JSONL line written in
canonical form (``stores.canonical_json``) is as long as it, so those are refused
exactly when their canonical text is over the cap. A JSONL value with no canonical text
(an integer beyond +/-(2**53 - 1)) fails its row as it is read, as a call of it would.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TextIO

import orjson

from actors.errors import DispatchError
from stores.errors import InputTooLargeError, InvalidInputError
from stores.inputs import (
    MAX_INPUT_BYTES,
    check_input_size,
    unsafe_integer,
    unsafe_integer_text,
    utf8_size_bytes,
)

__all__ = ["CHUNK_CHARS", "InputError", "RowError", "count_rows", "read_rows"]

CHUNK_CHARS = 1 << 16
"""Characters read from the input at a time; a line over the cap is held a chunk at a time."""


class RowError(DispatchError):
    """One input row could not be read (it fails alone)."""


class InputError(DispatchError):
    """The input cannot be read on from this point (its message names the line)."""


def read_rows(path: str) -> Iterator[Any]:
    """Yield the rows of ``path``: CSV (a dict per row), JSONL, or one value per line.

    The format follows the extension (``.csv``; ``.jsonl``/``.ndjson``; anything else
    is one value per line, blank lines skipped), UTF-8 (a leading byte-order mark is
    dropped). A row that cannot be read, has no canonical JSON text (a JSONL integer
    beyond +/-(2**53 - 1)), or is over the input cap
    (:data:`stores.inputs.MAX_INPUT_BYTES`: its line or CSV record without its last
    line ending, or its canonical JSON text) is yielded as a :class:`RowError` naming
    its line(s), so it fails alone and the rest go on. A quoted CSV field may span lines
    (RFC 4180), so a row that a stray quote made swallow the lines after it is one row
    error naming them all.

    Raises:
        OSError: the file cannot be opened.
        InputError: no row after this point can be read right: the CSV header is not
            UTF-8 or is over the cap, or a quote is never closed before the end of the file
            (the message names the line where it opened).
    """
    ext = os.path.splitext(path)[1].lower()
    # surrogateescape: a byte that is not UTF-8 fails its own row, not the whole read
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
        lines = _Lines(fh)
        if ext == ".csv":
            yield from _csv_rows(lines)
        else:
            yield from _line_rows(lines, jsonl=ext in (".jsonl", ".ndjson"))


def count_rows(path: str) -> int:
    """The rows :func:`read_rows` yields from ``path``, counted without reading them
    (a total for progress): non-blank lines; for CSV, records (a quoted field may span
    lines) that are not blank, the header left out; a row over the cap, or one that
    fails, is one row too. Read :data:`COUNT_CHUNK_CHARS` at a time: a line of any length
    is never held whole.

    Raises:
        OSError: the file cannot be opened or read.
    """
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
        chunks = iter(lambda: fh.read(COUNT_CHUNK_CHARS), "")
        if os.path.splitext(path)[1].lower() == ".csv":
            return max(0, _count_records(chunks) - 1)
        return _count_filled_lines(chunks)


COUNT_CHUNK_CHARS = 1 << 20
"""Characters read at a time by :func:`count_rows`."""

_FILLED = re.compile(r"\S[^\r\n]*()")
"""From a line's first character that is not white space (``str.isspace``) to its end
(its one group is empty: ``findall`` lists ``""`` for each)."""
_LINE = re.compile(r"[^\r\n]+(?:\r\n|\r|\n)?|\r\n|\r|\n")


def _count_filled_lines(chunks: Iterator[str]) -> int:
    """Lines that are not blank (white space only), as :func:`_line_rows` skips them."""
    count, counted = 0, False  # counted: the line under way at a chunk's end was counted
    for chunk in chunks:
        start = 0
        if counted:  # its rest, up to its end, belongs to a line counted already
            found = _EOL.search(chunk)
            if found is None:
                continue
            start = found.end()
        count += len(_FILLED.findall(chunk, start))  # (a list of "", 8 bytes a line)
        tail = chunk[max(chunk.rfind("\n"), chunk.rfind("\r")) + 1 :]  # the line going on in the next
        counted = bool(tail) and not tail.isspace()
    return count


def _count_records(chunks: Iterator[str]) -> int:
    """CSV records that are not blank (an empty line is no record, as ``csv.reader``
    yields ``[]`` for it), header included: a record starts at a line with text that is
    not inside a quoted field (:class:`_QuoteScan`). A well-formed record whole in a
    chunk is matched at once (:data:`_RECORD`), and so are a quoted field's lines up to
    its next quote; the rest goes a line at a time."""
    scan = _QuoteScan()
    count, going = 0, False  # going: the line at a chunk's end goes on in the next chunk
    for chunk in chunks:
        pos, end = 0, len(chunk)
        while pos < end:
            if not going and not scan.inside:
                found = _RECORD.match(chunk, pos)
                if found is not None:
                    count += chunk[pos] not in "\r\n"  # (an empty line matches too: no record)
                    pos = found.end()
                    continue
            elif scan.inside:  # over the quoted field's lines, up to its next quote, at once
                found = _QUOTED_RUN.match(chunk, pos)
                if found is not None and found.end() > pos:
                    pos, going = found.end(), False
                    continue
            found = _LINE.match(chunk, pos)  # (always matches: at least one character)
            assert found is not None
            line, pos = found.group(), found.end()
            if not going and not scan.inside:
                if _EOL.fullmatch(line):  # an empty line: no record
                    continue
                count += 1
                scan.start()
            going = line[-1] not in "\r\n"  # no ending in this chunk: the line goes on in the next
            if going or scan.inside or '"' in line:  # (else the record ends with the line)
                scan.feed(line, 0)
    return count


_FIELD = r'(?:"(?:[^"]|"")*"|[^,"\r\n][^,\r\n]*)?'
_RECORD = re.compile(rf"{_FIELD}(?:,{_FIELD})*(?:\r\n|\r|\n)")
"""A CSV record ``csv.reader(strict=True)`` reads without error, with its line ending
(its quoted fields may hold line endings)."""


def _line_rows(lines: _Lines, *, jsonl: bool) -> Iterator[Any]:
    """One row per line: a JSON value (``jsonl``) or the line's text, stripped."""
    blank = True

    def seen(piece: str) -> None:  # a line passed over is still skipped when blank
        nonlocal blank
        if blank and piece and not piece.isspace():
            blank = False

    while True:
        blank = True
        got = lines.read(MAX_INPUT_BYTES, seen)
        if got is None:
            return
        text, size = got
        if blank if text is None else not text.strip():  # a line passed over: judged by its pieces
            continue
        where = f"line {lines.number}"
        value: Any = None
        try:
            if text is None:
                _refuse(size, "the line")
            if not _utf8(text):
                yield RowError(f"{where}: not UTF-8")
                continue
            if jsonl:
                try:
                    value = orjson.loads(text)
                except orjson.JSONDecodeError as exc:  # its place in the line, not a line of its own
                    why = _JSON_PLACE.sub(lambda m: f"column {int(m[1]) + 1}", str(exc), 1)
                    yield RowError(f"{where}: not JSON ({why})")
                    continue
                lost = _lossy_integer(text)
                if lost is not None:
                    yield RowError(f"{where}: {unsafe_integer_text(lost)}; quote it as a string")
                    continue
            else:
                value = text.strip()
            check_input_size(value)
        except InputTooLargeError as exc:
            yield RowError(f"{where}: {exc}")
            continue
        except InvalidInputError as exc:  # a JSONL value with no canonical text: no call could take it
            number = unsafe_integer(value)
            if number is not None:
                yield RowError(f"{where}: {unsafe_integer_text(number)}; quote it as a string")
            else:
                yield RowError(
                    f"{where}: not plain JSON ({str(exc).removeprefix('input is not canonical JSON: ')})"
                )
            continue
        yield value


_JSON_PLACE = re.compile(r"line \d+ column \d+ \(char (\d+)\)$")
"""Where orjson says a text stops being JSON (its line counts the row's own line ending
as a line of its own): the column in the row's line is the character's, from 1."""

_LONG_INTEGER = re.compile(r"\d{19}")
"""Digits enough for an integer orjson reads as a float (beyond 64 bits)."""


class _Lossy(Exception):
    def __init__(self, literal: str) -> None:
        super().__init__(literal)
        self.literal = literal


def _lossy_integer(text: str) -> str | None:
    """The first integer written in JSON ``text`` that orjson read as a float that is not
    that integer (one beyond 64 bits that no double holds, ``12345678901234567890123``),
    or None. One a double holds exactly (``100000000000000000000``) is that number, and
    one within 64 bits is read as an int (held to +/-(2**53 - 1) with the rest)."""
    if _LONG_INTEGER.search(text) is None:  # (the common case: no such run of digits)
        return None

    def parse_int(literal: str) -> int:
        if len(literal) >= 19:
            try:
                number = int(literal)
                lossy = not -(2**63) <= number < 2**64 and int(float(number)) != number
            except (ValueError, OverflowError):  # past 4300 digits, or past a double's range
                lossy = True
            if lossy:
                raise _Lossy(literal)
        return 0

    try:
        json.loads(text, parse_int=parse_int)
    except _Lossy as found:
        return found.literal
    except (ValueError, RecursionError):
        pass
    return None


def _refuse(size_bytes: int, what: str) -> NoReturn:
    """Raise the input cap's error for ``what`` was passed over unread (over the cap)."""
    check_input_size(size_bytes=size_bytes, what=what)
    raise AssertionError(f"{what} was passed over within the cap")  # pragma: no cover


def _lines_named(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first}-{last}"


def _csv_rows(lines: _Lines) -> Iterator[Any]:
    """The rows of a CSV file as dicts keyed by its header (see :func:`read_rows`)."""
    csv.field_size_limit(max(csv.field_size_limit(), MAX_INPUT_BYTES))  # the record cap comes first
    source = _CsvLines(lines)
    # strict: a quote left open up to the end of the file, or a closing quote not followed
    # by a delimiter, is an error for that row (not a row that silently swallows the rest)
    reader = csv.reader(source, strict=True)
    header: list[str] | None = None
    while True:
        source.new_record = True
        try:
            fields = next(reader)
        except StopIteration:
            return
        except _TooLarge as big:
            where = _lines_named(big.first, big.last)
            if header is None:
                raise InputError(f"{where} (the CSV header): {big.error}") from None
            yield RowError(f"{where}: {big.error}")
            continue
        except csv.Error as exc:
            where = _lines_named(source.first, lines.number)
            if "unexpected end of data" in str(exc):
                raise InputError(source.never_closed()) from None
            yield RowError(f"{where}: {exc} (a stray quote makes a row swallow the lines after it)")
            continue
        if not fields:  # a blank line
            continue
        if header is None:
            if not _utf8(*fields):
                raise InputError("line 1 (the CSV header): not UTF-8")
            header = fields
            continue
        if len(fields) != len(header):
            spans = (
                " (a quoted field spans lines: is a quote left open?)" if lines.number > source.first else ""
            )
            where = _lines_named(source.first, lines.number)
            yield RowError(f"{where}: expected {len(header)} fields, found {len(fields)}{spans}")
        elif not _utf8(*fields):
            yield RowError(f"{_lines_named(source.first, lines.number)}: not UTF-8")
        else:
            row = dict(zip(header, fields, strict=True))
            try:
                check_input_size(row)
            except InputTooLargeError as exc:
                yield RowError(f"{_lines_named(source.first, lines.number)}: {exc}")
                continue
            yield row


def _utf8(*texts: str) -> bool:
    """Whether every text was valid UTF-8 (surrogateescape left no lone surrogate)."""
    try:
        for text in texts:
            text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_EOL = re.compile(r"\r\n|\r|\n")


class _Lines:
    """The physical lines of a text file opened with ``newline=""``, split as its iterator
    splits them (``\\r\\n``, ``\\r`` or ``\\n`` ends one, and is kept), numbered from 1,
    read :data:`CHUNK_CHARS` at a time: a line over its cap is never held whole."""

    def __init__(self, fh: TextIO) -> None:
        self._fh = fh
        self._buf = ""
        self._pos = 0
        self._eof = False
        self.number = 0
        """The number of the last line read."""
        self.ending_bytes = 0
        """Bytes of the last line's ending (0 for a last line without one)."""
        self._ready: list[str] = []
        """Whole lines read ahead, the next last (a buffer without ``\r``)."""
        self._cr = False
        """The buffer holds a ``\r``: its lines are found one at a time."""

    def read(
        self, limit_bytes: int, seen: Callable[[str], None] | None = None
    ) -> tuple[str | None, int] | None:
        """The next line (its ending kept) and its size in bytes without its ending (UTF-8,
        as in the file; the ending's are :attr:`ending_bytes`); None at the end.

        Args:
            limit_bytes: most bytes of it (its ending not counted) to keep; past that (or
                when negative) the line is passed over to its end and returned as None.
            seen: called with each piece of a line passed over, as it is read (those
                read before it was found over the limit too), in order.
        """
        piece, ended = self._piece()
        if piece is None:
            return None
        size = utf8_size_bytes(piece)
        self.ending_bytes = _ending_bytes(piece) if ended else 0
        size -= self.ending_bytes
        if ended and size <= limit_bytes:  # the usual line: one piece, within the limit
            self.number += 1
            return piece, size
        keep = limit_bytes >= 0
        parts: list[str] = []
        while True:
            if keep:
                parts.append(piece)
                if size > limit_bytes:  # over: what was kept is passed over too
                    keep = False
                    if seen is not None:
                        for part in parts:
                            seen(part)
                    parts = []
            elif seen is not None:
                seen(piece)
            if ended:
                break
            piece, ended = self._piece()
            if piece is None:
                break
            self.ending_bytes = _ending_bytes(piece) if ended else 0
            size += utf8_size_bytes(piece) - self.ending_bytes
        self.number += 1
        return ("".join(parts) if keep else None), size

    def _piece(self) -> tuple[str | None, bool]:
        """The next piece of the current line (at most a chunk) and whether it ends the
        line; (None, True) at the end of the file."""
        ready = self._ready
        if ready:
            return ready.pop(), True
        while True:
            buf, pos = self._buf, self._pos
            if not self._cr:  # only "\n" ends a line here: split every whole line at once
                last = buf.rfind("\n", pos)
                if last >= 0:
                    ready.extend(line + "\n" for line in buf[pos:last].split("\n"))
                    ready.reverse()
                    self._pos = last + 1
                    return ready.pop(), True
            found = _EOL.search(buf, pos)
            if found is not None and (found.end() < len(buf) or found.group() != "\r" or self._eof):
                self._pos = found.end()
                return buf[pos : found.end()], True
            end = len(buf) if found is None else found.start()  # a last "\r" waits: "\n" may follow
            if end > pos:
                self._pos = end
                return buf[pos:end], False
            if self._eof:
                return None, True
            chunk = self._fh.read(CHUNK_CHARS)
            self._eof = not chunk
            self._buf, self._pos = buf[pos:] + chunk, 0
            self._cr = "\r" in self._buf


def _ending_bytes(piece: str) -> int:
    """Bytes of the line ending that closes ``piece`` (0 at the end of a file without one)."""
    if piece.endswith("\r\n"):
        return 2
    return 1 if piece.endswith(("\n", "\r")) else 0


class _TooLarge(Exception):
    """A CSV record over the cap, passed over (raised through ``csv.reader``)."""

    def __init__(self, first: int, last: int, error: InputTooLargeError) -> None:
        super().__init__(str(error))
        self.first = first
        self.last = last
        self.error = error


class _CsvLines:
    """The lines handed to ``csv.reader``, each record's within the cap.

    The reader asks for a line when a record starts (``new_record``, set before each row
    is asked of it) or when the line before ended inside a quoted field. A record's size
    is its lines' bytes without the ending of its last line (the endings inside it are
    part of a field), as a line row's is without its ending. A record whose lines come
    to more than the cap is not handed on: the rest of it is passed over to
    the record's end (:class:`_QuoteScan` finds it as the reader would, from the state
    the record was in when its line was dropped), and :class:`_TooLarge` is raised
    through the reader, whose next row starts afresh after it. A quote still open at the
    end of the file while passing over raises :class:`InputError`.
    """

    def __init__(self, lines: _Lines) -> None:
        self.lines = lines
        self.scan = _QuoteScan()
        self.new_record = True
        """The next line asked for starts a record (else it goes on inside a quoted field)."""
        self.first = 1
        """The first line of the record being read."""
        self._size = 0

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        if self.new_record:
            self.new_record = False
            self.first, self._size = self.lines.number + 1, 0
            self.scan.start()
        else:  # the line before ended inside a quoted field: its ending is part of the record
            self.scan.inside_since(self.first)
            self._size += self.lines.ending_bytes
        got = self.lines.read(MAX_INPUT_BYTES - self._size, self._see)
        if got is None:
            raise StopIteration
        text, size = got
        self._size += size
        if text is not None:
            return text
        while self.scan.inside:  # pass over the rest of the record, keeping nothing
            ending = self.lines.ending_bytes
            got = self.lines.read(-1, self._see)
            if got is None:
                raise InputError(self.never_closed())
            self._size += ending + got[1]
        try:
            _refuse(self._size, "the line" if self.first == self.lines.number else "the record")
        except InputTooLargeError as exc:
            raise _TooLarge(self.first, self.lines.number, exc) from None

    def _see(self, piece: str) -> None:
        self.scan.feed(piece, self.lines.number + 1)

    def never_closed(self) -> str:
        """The message for a quote still open at the end of the file."""
        opened = self.scan.opened if self.scan.inside else self.first
        return (
            f"line {opened}: a quote opened on this line is never closed; "
            f"{_lines_named(self.first, self.lines.number)} (to the end of the file) were not read as rows"
        )


_QUOTED_RUN = re.compile(r'(?:[^"]+|"")*')
"""The inside of a quoted field up to a quote that is not doubled (or the end)."""


class _QuoteScan:
    """Where a CSV record stands after the text fed so far, under the ``csv`` module's
    default dialect (``,`` between fields, ``"`` quoting a field, doubled inside it): in
    a quoted field (a line end there is part of the field) or not (a line end ends the
    record). Fed in pieces of any size; a few steps per quoted field, the rest in C. A
    closed quoted field followed by anything but ``,``, a quote or a line end is what
    ``csv.reader(strict=True)`` refuses: the reader drops the rest of that line, and the
    record ends with it."""

    START, UNQUOTED, QUOTED, QUOTE, REFUSED = range(5)
    """At a field's start; in an unquoted field (or after a quoted one closed); in a
    quoted field; just after a quote inside a quoted field (closing it, or doubled); on a
    line the reader refused (the record ends with it)."""

    def __init__(self) -> None:
        self.state = self.START
        self.opened = 0
        """The line where the quoted field now open opened."""

    def start(self) -> None:
        """A record starts here."""
        self.state = self.START

    def inside_since(self, line: int) -> None:
        """A line starts inside a quoted field, opened on ``line`` (or later)."""
        if self.state != self.QUOTED:
            self.state, self.opened = self.QUOTED, line

    @property
    def inside(self) -> bool:
        """A line end here belongs to a quoted field: the record goes on."""
        return self.state == self.QUOTED

    def feed(self, text: str, line: int) -> None:
        """Move over ``text``, part of line ``line``."""
        state, i, n = self.state, 0, len(text)
        while i < n:
            if state == self.QUOTED:
                found = _QUOTED_RUN.match(text, i)
                i = found.end() if found is not None else i
                if i >= n:
                    break
                state, i = self.QUOTE, i + 1  # a quote: closing the field, or doubled
            elif state == self.QUOTE:
                if text[i] == '"':
                    state, i = self.QUOTED, i + 1
                elif text[i] in ",\r\n":
                    state = self.UNQUOTED
                else:
                    state = self.REFUSED
            elif state == self.REFUSED:
                break
            elif state == self.START and text[i] == '"':
                state, i, self.opened = self.QUOTED, i + 1, line
            else:  # unquoted: only a quote just after a delimiter opens a field
                i = text.find(',"', i)
                if i < 0:
                    state = self.START if text[-1] in ",\r\n" else self.UNQUOTED
                    break
                state, i, self.opened = self.QUOTED, i + 2, line
        self.state = state
