"""The completion flusher: bulk receipt completion, retry ladder, latch, recovery, salvage.

Completions from every drain are buffered and written in bulk: store requests of at
most ``completion_max_members`` members and ``completion_max_bytes`` of serialised
output (docs/receipts.md, Outputs). A write that raises is retried on the ladder
(default 1 s, 3 s, 9 s), giving up early when the run's deadline leaves less than the
back-off plus the headroom, or when the latch is already tripped. Giving up trips the
latch, reads every member back (``recovery_max_reads`` at a time) and salvages what
is not safely stored. Retries are timer messages: the actor never sleeps.

Threads: every method runs on the flusher actor's thread. It waits on the receipt
store actor's futures, which is safe because that actor never waits on anyone.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import attrs

from actors.errors import CallCancelledError, error_text, exc_info_of, type_name
from actors.flusher.held import HeldOutputs
from actors.flusher.latch import FlushOutcome, Latch, fence_outcomes, ladder_backoff
from actors.flusher.salvage import SalvageLog
from actors.messages import FlushCompletions, FlushDue, RetryWrite, TripLatch
from actors.runtime.actor import InboxActor, Timers, guarded, log
from actors.runtime.inbox import answer_left, left_in
from actors.store.client import StoreClient
from actors.tool import Policy
from stores.codec import encode_output
from stores.types import Completion, Owner, ReceiptStatus

__all__ = ["CompletionFlusherActor", "FlushOutcome", "Latch", "ladder_backoff"]


@attrs.define
class _Request:
    reply: Any
    remaining: set[str]
    outcomes: dict[str, FlushOutcome] = attrs.field(factory=dict)


@attrs.define
class _Member:
    completion: Completion
    input_hash: str
    tool_id: str
    request: _Request


@attrs.define
class _Chunk:
    org_id: str
    owner: Owner
    members: list[_Member]
    failures: int = 0
    first_error_at: float | None = None
    error: str = ""


class CompletionFlusherActor(InboxActor):
    """Buffers completions and writes them in bulk (see the module doc)."""

    def __init__(
        self,
        store: StoreClient,
        policy: Policy,
        latch: Latch,
        salvage: SalvageLog,
        timers: Timers,
        scope: str,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        stats: Any = None,
        writing: dict[int, Any] | None = None,
    ) -> None:
        super().__init__()
        self.stats = stats
        self.held = HeldOutputs(writing if writing is not None else {}, scope)
        """What this flusher holds, shown to stop (:func:`salvage_writing` reads its map)."""
        self.store = store
        self.policy = policy
        self.latch = latch
        self.salvage = salvage
        self.timers = timers
        self.scope = scope
        self.deadline = deadline
        self.clock = clock
        self._buffer: list[FlushCompletions] = []
        self._due = False
        self._retrying: dict[int, _Chunk] = {}
        self._ids = itertools.count()

    @guarded
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, FlushCompletions) and message.failed:
            self._failed_first(message)
        elif isinstance(message, FlushCompletions):
            self._buffer.append(message)
            self.held.hold_request(message)
            if self._due:  # a FlushDue in the inbox takes it
                return None
            if self.actor_inbox.empty():
                self._flush()  # nothing else sent: now, without a message
            else:  # more is coming (other tools' outputs): gather it, write once
                self._due = True
                self.actor_ref.tell(FlushDue())
        elif isinstance(message, FlushDue):
            self._due = False
            self._flush()
        elif isinstance(message, RetryWrite):
            retry = self._retrying.pop(message.chunk_id, None)
            if retry is not None:
                self._write_guarded(retry)
        elif isinstance(message, TripLatch):
            self.latch.trip(message.reason)
            if message.reply is not None:
                message.reply.set(None)
        return None

    def _flush(self) -> None:
        """Write everything buffered, in chunks."""
        buffered, self._buffer = self._buffer, []
        chunks: list[_Chunk] = []
        try:
            chunks = self._chunks(buffered)
        except Exception as exc:  # never leave a request unanswered
            for request in buffered:
                if not getattr(request.reply, "done", False):
                    request.reply.set_exception(exc_info_of(exc))
        for chunk in chunks:  # every chunk shown to stop before the first write waits on the store
            self.held.hold_chunk(chunk)
        for message in buffered:
            self.held.let_go_request(message)  # held as chunks from here on
        for chunk in chunks:
            self._write_guarded(chunk)

    def _failed_first(self, message: FlushCompletions) -> None:
        """Outputs whose first write (made by their tool queue actor) failed: the ladder
        goes on from there (that write was attempt 1)."""
        try:
            chunks = self._chunks([message])
        except Exception as exc:
            if not getattr(message.reply, "done", False):
                message.reply.set_exception(exc_info_of(exc))
            return
        for chunk in chunks:  # all shown to stop first: a give-up's read-backs wait on the store
            self.held.hold_chunk(chunk)
        for chunk in chunks:
            self._failed(chunk, message.failed)

    def _write_guarded(self, chunk: _Chunk) -> None:
        """Write a chunk; whatever goes wrong, every member's caller hears back (salvaged)."""
        self.held.hold_chunk(chunk)
        try:
            self._write(chunk)
        except Exception as exc:
            log.exception("the completion flusher failed on a chunk; salvaging it")
            chunk.error = f"{type_name(exc)}: {error_text(exc)}"
            members = [m for m in chunk.members if m.completion.key in m.request.remaining]
            salvage = [self.held.entry(chunk, m, chunk.error) for m in members]
            try:
                self.salvage.append(salvage)
            finally:
                for member in members:
                    self._settle(member, FlushOutcome("salvaged", error=chunk.error))
        finally:
            if not any(c is chunk for c in self._retrying.values()):  # else held on the ladder
                self.held.let_go_chunk(chunk)

    def on_stop(self) -> None:
        """Outputs not yet stored when the flusher stops (stop's bound ran out) are
        salvaged, never dropped: buffered, waiting on the ladder, or left in the inbox."""
        left = left_in(self.actor_inbox)
        for message in left:
            if isinstance(message, TripLatch):
                self.latch.trip(message.reason)
        self._buffer += [m for m in left if isinstance(m, FlushCompletions)]
        reason = "the dispatcher stopped before this result was stored"
        chunks = list(self._retrying.values())
        self._retrying.clear()
        try:
            chunks += self._chunks(self._buffer)
        except Exception:
            log.exception("salvaging at stop")
        self._buffer = []
        self.held.let_go_all()  # salvaged below, here on this thread
        for chunk in chunks:
            members = [m for m in chunk.members if m.completion.key in m.request.remaining]
            try:
                self.salvage.append([self.held.entry(chunk, m, chunk.error or reason) for m in members])
            except Exception:
                log.exception("salvaging at stop")
            for member in members:
                self._settle(member, FlushOutcome("salvaged", error=chunk.error or reason))
        answer_left(left, CallCancelledError("the completion flusher stopped"))

    def give_up_now(self) -> None:
        """Stop retrying: give up every write waiting on the ladder (used at stop)."""
        for chunk_id in list(self._retrying):
            chunk = self._retrying.pop(chunk_id)
            self._give_up(chunk)

    # -- chunking and writing ---------------------------------------------------------

    def _chunks(self, buffered: list[FlushCompletions]) -> list[_Chunk]:
        chunks: list[_Chunk] = []
        open_chunks: dict[tuple[str, Owner], tuple[_Chunk, int]] = {}
        for message in buffered:
            request = _Request(message.reply, {c.key for c in message.entries})
            hashes = message.input_hashes
            for completion in message.entries:
                try:
                    size = len(encode_output(completion.output)) if self.policy.completion_max_bytes else 0
                except BaseException as exc:  # no JSON form (anything it raises): refuse this member alone
                    member = _Member(completion, hashes.get(completion.key, ""), message.tool_id, request)
                    reason = (
                        "output_not_storable"
                        if type_name(exc) == "OutputNotStorableError"
                        else "invalid_output"
                    )
                    why = f"output has no JSON form: {error_text(exc)}"
                    self._settle(member, FlushOutcome("refused", error=why, reason=reason))
                    continue
                group = (message.org_id, message.owner)
                current = open_chunks.get(group)
                if (
                    current is None
                    or len(current[0].members) >= self.policy.completion_max_members
                    or (current[1] + size > self.policy.completion_max_bytes and current[0].members)
                ):
                    current = (_Chunk(message.org_id, message.owner, []), 0)
                    chunks.append(current[0])
                member = _Member(completion, hashes.get(completion.key, ""), message.tool_id, request)
                current[0].members.append(member)
                open_chunks[group] = (current[0], current[1] + size)
        return chunks

    def _write(self, chunk: _Chunk) -> None:
        completions = [m.completion for m in chunk.members]
        try:
            report = self.store.complete(chunk.org_id, completions, chunk.owner).get()
        except Exception as exc:
            self._failed(chunk, f"{type_name(exc)}: {error_text(exc)}")
            return
        salvage = []
        settled: list[tuple[_Member, FlushOutcome]] = []
        keys = [m.completion.key for m in chunk.members]
        for member, (outcome, lost) in zip(chunk.members, fence_outcomes(report, keys), strict=True):
            if lost:
                salvage.append(self.held.entry(chunk, member, outcome.error))
            settled.append((member, outcome))
        try:
            self.salvage.append(salvage)  # on disk before any caller hears back
        finally:
            for member, outcome in settled:
                self._settle(member, outcome)

    def _failed(self, chunk: _Chunk, error: str) -> None:
        """A write of ``chunk`` failed: retry it after the ladder's next back-off, or give up."""
        chunk.failures += 1
        chunk.error = error
        if chunk.first_error_at is None:
            chunk.first_error_at = time.time()
        backoff = ladder_backoff(
            chunk.failures,
            self.policy.completion_ladder_s,
            self.clock(),
            self.deadline,
            self.policy.completion_deadline_headroom_s,
            self.latch.tripped,
        )
        if backoff is None:
            self._give_up(chunk)
        else:
            chunk_id = next(self._ids)
            self._retrying[chunk_id] = chunk
            self.held.hold_chunk(chunk)
            self.timers.call_later(backoff, self.actor_ref.tell, RetryWrite(chunk_id=chunk_id))

    def _give_up(self, chunk: _Chunk) -> None:
        """Trip the latch, recover what can be recovered by reading back, salvage the rest."""
        self.held.hold_chunk(chunk)  # the read-backs wait on the store: held until settled
        try:
            self._recover_or_salvage(chunk)
        finally:
            self.held.let_go_chunk(chunk)

    def _recover_or_salvage(self, chunk: _Chunk) -> None:
        self.latch.trip(f"receipt completion failed after {chunk.failures} attempts: {chunk.error}")
        step = max(1, self.policy.recovery_max_reads)
        started = time.perf_counter()
        salvage = []
        settled: list[tuple[_Member, FlushOutcome]] = []
        for start in range(0, len(chunk.members), step):
            members = chunk.members[start : start + step]
            for member, outcome in zip(members, self._recover(chunk, members), strict=True):
                if outcome is None:
                    salvage.append(self.held.entry(chunk, member, chunk.error))
                    outcome = FlushOutcome("salvaged", error=chunk.error)
                settled.append((member, outcome))
        try:
            self.salvage.append(salvage)  # on disk before any caller hears back
        finally:
            for member, outcome in settled:
                self._settle(member, outcome)
        if self.stats is not None:
            recovered = len(chunk.members) - len(salvage)
            ms = (time.perf_counter() - started) * 1000.0
            self.stats.record("recovery", ms, recovered=recovered, failed=len(salvage))

    def _recover(self, chunk: _Chunk, members: list[_Member]) -> list[FlushOutcome | None]:
        try:
            stored = self.store.read(chunk.org_id, [m.completion.key for m in members]).get()
        except Exception:
            return [None] * len(members)
        out: list[FlushOutcome | None] = []
        for member, receipt in zip(members, stored, strict=True):
            ours = receipt is not None and receipt.lease_id == member.completion.lease_id
            if receipt is not None and receipt.status is ReceiptStatus.COMPLETED:
                out.append(
                    FlushOutcome("persisted") if ours else FlushOutcome("completed_by_other", receipt.output)
                )
            elif (
                receipt is not None
                and ours
                and receipt.status in (ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)
            ):
                try:
                    alone = self.store.complete(chunk.org_id, [member.completion], chunk.owner).get()
                    out.append(FlushOutcome("persisted") if alone.ok else None)
                except Exception:
                    out.append(None)
            else:
                out.append(None)
        return out

    # -- settling ---------------------------------------------------------------------

    def _settle(self, member: _Member, outcome: FlushOutcome) -> None:
        key = member.completion.key
        request = member.request
        request.outcomes[key] = outcome
        request.remaining.discard(key)
        if not request.remaining:
            request.reply.set(request.outcomes)
