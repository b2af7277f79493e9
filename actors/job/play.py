"""Plays: a workflow over rows. Loading a play, reading its rows, the row context.

A play is a Python file (``plays/enrich.py``), a module (``pkg.enrich``) or an object
(``pkg.enrich:PLAY``) with two attributes:

* ``tools``: a list of :class:`~actors.tool.Tool` (or a function returning one);
* ``play(row, ctx)``: runs one row; ``ctx.tool(tool_id, input)`` returns the tool's
  value (raising its error) and blocks only that row. Its return value (any JSON) is
  the row's result.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import orjson

from actors.errors import CallCancelledError, DispatchError, is_a
from stores import MAX_OUTPUT_BYTES

__all__ = ["InputError", "Play", "PlayContext", "PlayLoadError", "RowError", "load_play", "read_rows"]


class PlayLoadError(DispatchError):
    """The PLAY could not be imported or lacks ``tools``/``play``."""


class RowError(DispatchError):
    """One input row could not be read (it fails alone)."""


class InputError(DispatchError):
    """The input cannot be read on from this point (its message names the line)."""


@attrs.frozen
class Play:
    """A loaded play: its name (the receipt scope), tools and row function."""

    name: str
    tools: list[Any]
    run: Callable[[Any, Any], Any]


def load_play(spec: str) -> Play:
    """Load ``spec``: a ``.py`` path, a module name, ``module:attr`` or ``path.py:attr``
    (the attribute holds ``tools`` and ``play``; its name is then the receipt scope).

    Raises:
        PlayLoadError: it does not import, or has no ``tools`` / ``play``.
    """
    target: Any
    file_part, colon, file_attr = spec.rpartition(":")
    if colon and file_part.endswith(".py"):
        spec_path, attr = file_part, file_attr
    else:
        spec_path, attr = spec, ""
    try:
        if spec_path.endswith(".py") or os.sep in spec_path:
            path = os.path.abspath(spec_path)
            if not os.path.isfile(path):
                raise PlayLoadError(f"play file not found: {spec_path}")
            name = os.path.splitext(os.path.basename(path))[0]
            module_spec = importlib.util.spec_from_file_location(f"tooldispatch_play_{name}", path)
            if module_spec is None or module_spec.loader is None:
                raise PlayLoadError(f"cannot load {spec} as Python")
            target = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = target
            module_spec.loader.exec_module(target)
            name, where = attr or name, spec_path
        else:
            module_name, _, attr = spec.partition(":")
            name, where = attr or module_name.rsplit(".", 1)[-1], module_name
            target = importlib.import_module(module_name)
    except PlayLoadError:
        raise
    except Exception as exc:
        raise PlayLoadError(f"cannot import play {spec!r}: {type(exc).__name__}: {exc}") from exc
    if attr:
        if not hasattr(target, attr):
            raise PlayLoadError(f"play {spec!r}: {where} has no attribute {attr!r}")
        target = getattr(target, attr)
    tools = getattr(target, "tools", None)
    run = getattr(target, "play", None)
    if callable(tools):
        tools = tools()
    if not isinstance(tools, (list, tuple)) or not tools or not callable(run):
        raise PlayLoadError(
            f"play {spec!r} must define `tools` (a non-empty list of Tool) and `play(row, ctx)`"
        )
    return Play(name=name, tools=list(tools), run=run)


def read_rows(path: str) -> Iterator[Any]:
    """Yield the rows of ``path``: CSV (a dict per row), JSONL, or one value per line.

    The format follows the extension (``.csv``; ``.jsonl``/``.ndjson``; anything else
    is one value per line, blank lines skipped), UTF-8 (a leading byte-order mark is
    dropped). A row that cannot be read is yielded as a :class:`RowError` naming its
    line(s), so it fails alone and the rest go on. CSV fields may hold up to
    :data:`stores.MAX_OUTPUT_BYTES` characters; a quoted field may span lines (RFC 4180),
    so a row that a stray quote made swallow the lines after it is one row error naming
    them all.

    Raises:
        OSError: the file cannot be opened.
        InputError: no row after this point can be read right: the CSV header is not
            UTF-8, a quote is never closed before the end of the file, or a field is
            larger than the limit (the message names the line where it opened).
    """
    ext = os.path.splitext(path)[1].lower()
    # surrogateescape: a byte that is not UTF-8 fails its own row, not the whole read
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
        if ext == ".csv":
            yield from _csv_rows(fh)
        elif ext in (".jsonl", ".ndjson"):
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                if not _utf8(line):
                    yield RowError(f"line {number}: not UTF-8")
                    continue
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    yield RowError(f"line {number}: not JSON ({exc})")
        else:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    yield line.strip() if _utf8(line) else RowError(f"line {number}: not UTF-8")


def _lines(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first}-{last}"


def _csv_rows(fh: Any) -> Iterator[Any]:
    """The rows of a CSV file as dicts keyed by its header (see :func:`read_rows`)."""
    csv.field_size_limit(max(csv.field_size_limit(), MAX_OUTPUT_BYTES))
    # strict: a quote left open up to the end of the file, or a closing quote not followed
    # by a delimiter, is an error for that row (not a row that silently swallows the rest)
    reader = csv.reader(fh, strict=True)
    header: list[str] | None = None
    while True:
        first = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            where = _lines(first, reader.line_num)
            if "field larger than field limit" in str(exc):
                raise InputError(
                    f"line {first}: a field is larger than {MAX_OUTPUT_BYTES // 2**20} MiB "
                    "(a quote opened on this line and never closed does this); nothing after it was read"
                ) from None
            if "unexpected end of data" in str(exc):
                raise InputError(
                    f"line {first}: a quote opened on this line is never closed; "
                    f"{_lines(first, reader.line_num)} (to the end of the file) were not read as rows"
                ) from None
            yield RowError(f"{where}: {exc} (a stray quote makes a row swallow the lines after it)")
            continue
        if not fields:  # a blank line
            continue
        if header is None:
            if not _utf8(*fields):
                raise InputError("line 1 (the CSV header): not UTF-8")
            header = fields
            continue
        where = _lines(first, reader.line_num)
        if len(fields) != len(header):
            spans = " (a quoted field spans lines: is a quote left open?)" if reader.line_num > first else ""
            yield RowError(f"{where}: expected {len(header)} fields, found {len(fields)}{spans}")
        elif not _utf8(*fields):
            yield RowError(f"{where}: not UTF-8")
        else:
            yield dict(zip(header, fields, strict=True))


def _utf8(*texts: str) -> bool:
    """Whether every text was valid UTF-8 (surrogateescape left no lone surrogate)."""
    try:
        for text in texts:
            text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class PlayContext:
    """What ``play(row, ctx)`` receives: ``ctx.tool`` and the run's identity.

    Args:
        proxy: the dispatch system's proxy.
        force_refresh / retry_failed: applied to every call.
        timeout_s: how long one row waits for one call, seconds.
        tally: counts each call's outcome for the report (see :mod:`._tally`), or None.
    """

    def __init__(
        self,
        proxy: Any,
        *,
        force_refresh: bool = False,
        retry_failed: bool = False,
        timeout_s: float = 3600.0,
        tally: Any = None,
    ) -> None:
        self.proxy = proxy
        self.force_refresh = force_refresh
        self.retry_failed = retry_failed
        self.timeout_s = timeout_s
        self.tally = tally

    def tool(self, tool_id: str, input: Any, **options: Any) -> Any:
        """Run a tool and return its value; raises the call's error. Blocks this row only."""
        options.setdefault("force_refresh", self.force_refresh)
        options.setdefault("retry_failed", self.retry_failed)
        try:
            result = self.proxy.execute(tool_id, input, **options).get(timeout=self.timeout_s)
        except Exception as exc:
            if self.tally is not None:
                if is_a(exc, CallCancelledError):  # a stop cancelled it: not a failure
                    self.tally.record_cancelled(tool_id)
                else:
                    self.tally.record_error(tool_id)
            raise
        if self.tally is not None:
            self.tally.record(tool_id, result)
        return result.value
