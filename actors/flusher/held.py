"""What the completion flusher holds, shown to stop as salvage entries.

The flusher owns outputs from the moment a flush request reaches it until each is stored
or salvaged: buffered requests, chunks being written, chunks waiting on the retry
ladder. Its thread may be stuck in a store call (a locked file, an unreachable
database) when a stop's bound runs out, and it is a daemon: what it holds would die
with the process. So it registers each in the system's shared ``writing`` map (token ->
a maker of salvage entries), and stop salvages them from its own thread
(:func:`actors.flusher.stop_salvage.salvage_writing`). Runs on the flusher's thread.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from actors.flusher.salvage import salvage_entry
from actors.messages import FlushCompletions

__all__ = ["HeldOutputs", "request_entries"]


def request_entries(message: FlushCompletions, scope: str, reason: str) -> list[Any]:
    """Salvage entries for the outputs of one flush request (``reason``: why they are
    salvaged, unless the request says its first write failed)."""
    entries = []
    for c in message.entries:
        entries.append(salvage_entry(
            key=c.key, org_id=message.org_id, scope=scope, tool_id=message.tool_id,
            input_hash=message.input_hashes.get(c.key, ""), output=c.output,
            attempts=2 if message.failed else 1, first_error_at=None, error=message.failed or reason,
            lease_id=c.lease_id, generation=c.generation, replaces=c.replaces, cost=c.cost,
        ))  # fmt: skip
    return entries


class HeldOutputs:
    """What one flusher holds, kept in step with the system's ``writing`` map (token -> a
    maker of salvage entries, read by stop from its own thread when its bound runs out:
    :func:`actors.flusher.stop_salvage.salvage_writing`).

    Args:
        writing: the system's shared map (this object adds and removes its own tokens).
        scope: the receipts' scope, written into each salvage entry.
    """

    def __init__(self, writing: dict[int, Any], scope: str) -> None:
        self.writing = writing
        self.scope = scope
        self._tokens: set[int] = set()
        """This flusher's tokens in ``writing``."""

    def hold(self, token: int, make: Callable[[str], list[Any]]) -> None:
        """Show stop what the flusher holds (a chunk being written or waiting on the ladder,
        a buffered request) until :meth:`let_go`."""
        self.writing[token] = make
        self._tokens.add(token)

    def let_go(self, token: int) -> None:
        self.writing.pop(token, None)
        self._tokens.discard(token)

    def let_go_all(self) -> None:
        """Drop every token (the flusher salvages what it holds itself, at stop)."""
        for token in list(self._tokens):
            self.let_go(token)

    def hold_request(self, message: FlushCompletions) -> None:
        self.hold(-id(message), functools.partial(request_entries, message, self.scope))

    def let_go_request(self, message: FlushCompletions) -> None:
        self.let_go(-id(message))

    def hold_chunk(self, chunk: Any) -> None:
        self.hold(id(chunk), functools.partial(self._entries_of_chunk, chunk))

    def let_go_chunk(self, chunk: Any) -> None:
        self.let_go(id(chunk))

    def _entries_of_chunk(self, chunk: Any, reason: str) -> list[Any]:
        members = [m for m in list(chunk.members) if m.completion.key in m.request.remaining]
        return [self.entry(chunk, m, reason) for m in members]

    def entry(self, chunk: Any, member: Any, error: str) -> Any:
        """The salvage entry of one member of a chunk (``error``: why it is salvaged)."""
        return salvage_entry(
            key=member.completion.key,
            org_id=chunk.org_id,
            scope=self.scope,
            tool_id=member.tool_id,
            input_hash=member.input_hash,
            output=member.completion.output,
            attempts=chunk.failures + 1,
            first_error_at=chunk.first_error_at,
            error=error,
            lease_id=member.completion.lease_id,
            generation=member.completion.generation,
            replaces=member.completion.replaces,
            cost=member.completion.cost,
        )
