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
            lease_id=c.lease_id, generation=c.generation, replaces=c.replaces,
        ))  # fmt: skip
    return entries


class HeldOutputs:
    """The flusher's part that keeps ``writing`` in step with what it holds."""

    writing: dict[int, Any]
    _held: set[int]
    scope: str

    def _hold(self, token: int, make: Callable[[str], list[Any]]) -> None:
        """Show stop what this actor holds (a chunk being written or waiting on the ladder,
        a buffered request): should its bound run out while this thread waits on the store,
        stop salvages it from its own thread (:func:`actors.flusher.stop_salvage.salvage_writing`)."""
        self.writing[token] = make
        self._held.add(token)

    def _let_go(self, token: int) -> None:
        self.writing.pop(token, None)
        self._held.discard(token)

    def _held_chunk(self, chunk: Any) -> None:
        self._hold(id(chunk), functools.partial(self._entries_of_chunk, chunk))

    def _entries_of_chunk(self, chunk: Any, reason: str) -> list[Any]:
        members = [m for m in list(chunk.members) if m.completion.key in m.request.remaining]
        return [self._entry(chunk, m, reason) for m in members]

    def _entries_of(self, message: FlushCompletions, reason: str) -> list[Any]:
        return request_entries(message, self.scope, reason)

    def _entry(self, chunk: Any, member: Any, error: str) -> Any:
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
        )
