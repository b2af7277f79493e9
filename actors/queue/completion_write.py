"""A tool queue actor's own write of its outputs: the happy path of completion.

When none of the actor's own writes is out, the outputs a lifecycle gathers are written
with one ``complete_many`` sent straight to the receipt store actor (one hand-off each
way) instead of through the completion flusher (two more: the flusher, then its wait on
the store). While one is out, outputs go to the flusher, which gathers all that come
back meanwhile into one transaction (group commit). The flusher keeps the rest too:
a write that fails goes on there, on its ladder (this write counts as attempt 1); so do
writes while the latch is tripped, and writes over one chunk's caps
(``completion_max_members``, ``completion_max_bytes``), which the flusher splits.

Durability is the flusher's: callers hear back only after the store answered; outputs
whose lease was lost (or whose receipt is gone) are salvaged before that; a write still
out when stop's bound runs out is salvaged by stop (the system's ``writing`` map, shared
with the flusher: :func:`actors.flusher.stop_salvage.salvage_writing`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors.errors import error_text
from actors.flusher.latch import FlushOutcome, fence_outcomes
from actors.flusher.salvage import salvage_entry
from actors.messages import CompletionsPersisted, CompletionsWritten
from actors.runtime.actor import log
from stores.codec import EncodedOutput
from stores.types import Completion

if TYPE_CHECKING:
    from actors.queue.system_ports import Ports

__all__ = ["CompletionWriter"]

_tokens = itertools.count(1 << 40)
"""Keys of this module's entries in the shared ``writing`` map (the flusher uses ``id``s)."""


class CompletionWriter:
    """The direct writes of one tool queue actor (runs on that actor's thread).

    Args:
        ports: the system's ports (policy, latch, salvage file, ``writing`` map).
        tool_id / org_id: whose outputs (for salvage entries).
    """

    def __init__(self, ports: Ports, tool_id: str, org_id: str) -> None:
        self.ports = ports
        self.tool_id = tool_id
        self.org_id = org_id
        self._out: dict[int, tuple[list[Completion], dict[str, str], int]] = {}
        """Batch -> (its completions, their input hashes, its key in ``writing``)."""

    def takes(self, entries: list[Completion]) -> bool:
        """Whether these outputs are written here (else they go to the flusher).

        Only while none of this actor's writes is out: a lone call skips two hand-offs,
        but under load the flusher gathers every output that comes back while one write is
        in flight into the next (group commit). Writing each unit's outputs on its own
        made each a transaction: on Postgres, fresh calls fell from 2,675/s to 539/s."""
        policy = self.ports.policy
        if self._out or self.ports.latch.tripped or len(entries) > policy.completion_max_members:
            return False
        if policy.completion_max_bytes and len(entries) > 1:
            size = 0
            for entry in entries:
                output = entry.output
                if not isinstance(output, EncodedOutput):
                    return False
                size += len(output.text)
            if size > policy.completion_max_bytes:
                return False
        return True

    def write(
        self,
        batch: int,
        entries: list[Completion],
        input_hashes: dict[str, str],
        send: Callable[[], None],
    ) -> None:
        """Record the write of ``batch`` (so stop can salvage it), then ``send`` it."""
        token = next(_tokens)
        self._out[batch] = (entries, input_hashes, token)
        self.ports.writing[token] = lambda reason: [self._entry(c, input_hashes, reason) for c in entries]
        send()

    def answered(self, message: CompletionsWritten) -> tuple[CompletionsPersisted | None, Any]:
        """The store answered ``batch``: the outcome per key as the flusher would give it,
        after salvaging lost leases' outputs; or, when the write failed, None and what to
        hand the flusher (its completions, input hashes and error text)."""
        entries, input_hashes, token = self._out.pop(message.batch)
        try:
            if message.error is not None:
                return None, (entries, input_hashes, error_text(message.error))
            outcomes: dict[str, FlushOutcome] = {}
            lost = []
            keys = [c.key for c in entries]
            for entry, (outcome, salvage) in zip(entries, fence_outcomes(message.value, keys), strict=True):
                outcomes[entry.key] = outcome
                if salvage:
                    lost.append(self._entry(entry, input_hashes, outcome.error))
            if lost:
                try:
                    self.ports.salvage.append(lost)  # on disk before any caller hears back
                except Exception:
                    log.exception("salvaging %d outputs whose lease was lost", len(lost))
            return CompletionsPersisted(batch=message.batch, value=outcomes, error=None), None
        finally:
            self.ports.writing.pop(token, None)

    def _entry(self, completion: Completion, input_hashes: dict[str, str], error: str) -> Any:
        return salvage_entry(
            key=completion.key, org_id=self.org_id, scope=self.ports.run.scope, tool_id=self.tool_id,
            input_hash=input_hashes.get(completion.key, ""), output=completion.output, attempts=1,
            first_error_at=None, error=error, lease_id=completion.lease_id, generation=completion.generation,
            replaces=completion.replaces, cost=completion.cost,
        )  # fmt: skip
