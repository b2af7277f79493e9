"""Plays: a workflow over rows. Loading a play, and the row context (its rows are read
by :mod:`actors.job.rows`).

A play is a Python file (``plays/enrich.py``), a module (``pkg.enrich``) or an object
(``pkg.enrich:PLAY``) with two attributes:

* ``tools``: a list of :class:`~actors.tool.Tool` (or a function returning one);
* ``play(row, ctx)``: runs one row; ``ctx.tool(tool_id, input)`` returns the tool's
  value (raising its error) and blocks only that row. Its return value (any JSON) is
  the row's result.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import attrs

from actors.errors import CallCancelledError, DispatchError, InvalidInputError, ResultSalvagedError, is_a
from actors.job.rows import InputError, RowError, read_rows
from stores import canonical_json

__all__ = ["InputError", "Play", "PlayContext", "PlayLoadError", "RowError", "load_play", "read_rows"]


class PlayLoadError(DispatchError):
    """The PLAY could not be imported or lacks ``tools``/``play``."""


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


class PlayContext:
    """What ``play(row, ctx)`` receives: ``ctx.tool`` and the run's identity.

    Args:
        proxy: the dispatch system's proxy.
        force_refresh / retry_failed: applied to every call. A forced refresh pays for each
            distinct call once per run: once a forced call of an input has returned, later
            calls of it in this run are made without ``force_refresh`` and take that fresh
            output (calls made while it runs join it); a failed one is forced again.
        timeout_s: how long one row waits for one call, seconds.
        tally: counts each call's outcome for the report (see :mod:`._tally`), or None.
        tools: the play's tools; their ``non_semantic_fields`` are left out when calls are
            matched as the same input (as their receipt keys leave them out).
    """

    def __init__(
        self,
        proxy: Any,
        *,
        force_refresh: bool = False,
        retry_failed: bool = False,
        timeout_s: float = 3600.0,
        tally: Any = None,
        tools: Any = (),
    ) -> None:
        self.proxy = proxy
        self.force_refresh = force_refresh
        self.retry_failed = retry_failed
        self.timeout_s = timeout_s
        self.tally = tally
        self._row = threading.local()
        self._ignored = {tool.tool_id: tool.non_semantic_fields for tool in tools}
        self._refreshed: set[tuple[str, str]] = set()  # (tool id, input) forced and returned
        self._refreshed_lock = threading.Lock()
        self.before_wait: Callable[[], object] | None = None
        """Told on the row's thread before it waits for a call not answered at once (the
        row runner adds a row worker for the wait)."""

    def start_row(self) -> None:
        """A row begins on this thread (greenlet): :meth:`cancelled_in_row` is False again."""
        self._row.cancelled = False

    def cancelled_in_row(self) -> bool:
        """Whether a call made on this thread since :meth:`start_row` was cancelled
        (``CallCancelledError``: a stop refused it), even if the play caught the error."""
        return bool(getattr(self._row, "cancelled", False))

    def _same_call(self, tool_id: str, input: Any) -> tuple[str, str] | None:
        """What identifies ``input``'s call of ``tool_id`` in this run (its canonical JSON,
        the tool's non-semantic fields left out), or None when it is not JSON (the call
        then fails on its own)."""
        ignored = self._ignored.get(tool_id)
        if ignored and isinstance(input, dict):
            input = {k: v for k, v in input.items() if k not in ignored}
        try:
            return tool_id, canonical_json(input)
        except Exception:
            return None

    def tool(self, tool_id: str, input: Any, **options: Any) -> Any:
        """Run a tool and return its value; raises the call's error. Blocks this row only."""
        same = None
        if "force_refresh" not in options and self.force_refresh:
            same = self._same_call(tool_id, input)
            with self._refreshed_lock:
                refreshed = same is not None and same in self._refreshed
            options["force_refresh"] = not refreshed
            if refreshed:
                same = None
        options.setdefault("retry_failed", self.retry_failed)
        try:
            future = self.proxy.execute(tool_id, input, **options)
            if self.before_wait is not None and getattr(future, "done", False) is not True:
                self.before_wait()
            result = future.get(timeout=self.timeout_s)
        except Exception as exc:
            if is_a(exc, CallCancelledError):
                self._row.cancelled = True
            if self.tally is not None:
                if is_a(exc, ResultSalvagedError):  # paid, kept in the salvage file: not a failure
                    self.tally.record_salvaged(tool_id)
                elif is_a(exc, CallCancelledError):  # a stop cancelled it: not a failure
                    self.tally.record_cancelled(tool_id)
                elif is_a(exc, InvalidInputError):  # refused for its input: nothing was sent
                    self.tally.record_input_refused(tool_id)
                else:
                    self.tally.record_error(tool_id)
            raise
        if same is not None:  # refreshed: the rest of the run takes this output
            with self._refreshed_lock:
                self._refreshed.add(same)
        if self.tally is not None:
            self.tally.record(tool_id, result)
        return result.value
