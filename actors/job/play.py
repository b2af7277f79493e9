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

from ..errors import DispatchError

__all__ = ["Play", "PlayContext", "PlayLoadError", "RowError", "load_play", "read_rows"]


class PlayLoadError(DispatchError):
    """The PLAY could not be imported or lacks ``tools``/``play``."""


class RowError(DispatchError):
    """One input row could not be read (it fails alone)."""


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
    dropped). A row that cannot be read is yielded as a :class:`RowError` so it fails
    alone and the rest go on.

    Raises:
        OSError: the file cannot be opened.
        ValueError: the CSV header is not UTF-8 (no row could be read right).
    """
    ext = os.path.splitext(path)[1].lower()
    # surrogateescape: a byte that is not UTF-8 fails its own row, not the whole read
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
        if ext == ".csv":
            reader = csv.DictReader(fh)
            if reader.fieldnames is not None and not _utf8(*reader.fieldnames):
                raise ValueError("line 1 (the CSV header): not UTF-8")
            for row in reader:
                if None in row or any(v is None for v in row.values()):
                    yield RowError(f"line {reader.line_num}: expected {len(reader.fieldnames or [])} fields")
                elif not _utf8(*row, *row.values()):
                    yield RowError(f"line {reader.line_num}: not UTF-8")
                else:
                    yield row
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
    """

    def __init__(
        self,
        proxy: Any,
        *,
        force_refresh: bool = False,
        retry_failed: bool = False,
        timeout_s: float = 3600.0,
    ) -> None:
        self.proxy = proxy
        self.force_refresh = force_refresh
        self.retry_failed = retry_failed
        self.timeout_s = timeout_s

    def tool(self, tool_id: str, input: Any, **options: Any) -> Any:
        """Run a tool and return its value; raises the call's error. Blocks this row only."""
        options.setdefault("force_refresh", self.force_refresh)
        options.setdefault("retry_failed", self.retry_failed)
        return self.proxy.execute(tool_id, input, **options).get(timeout=self.timeout_s).value
