"""The front door: the host's handle (:class:`DispatchProxy`) and the caller's side of a call
(:class:`Intake`): keys, memo hits, and the hand-off.

Runs on the caller's thread. Every call's receipt key is computed here (the parts that
do not depend on the input are checked and hashed once per tool, credentials digest and
staleness: :func:`stores.keys.key_maker`); a call whose key this system completed is
answered at once from the tool's memo, a read-only view of encoded JSON text (each hit
decodes its own copy, so no caller can change what another sees), with a future that is
resolved when it is made. When many calls are left (:data:`READ_FIRST`), their receipts
are read from the store in one plain read (no lock, no write: ``read_settled``) and the
completed ones answered here too (the stored text, decoded per call), so a cold rerun
never reaches the actors. The rest are
queued on the tool's queue actor in one message.

Rules (docs/how-it-works.md, The life of a call): the memo answers normal calls only (a
forced refresh or a retry of a failure goes to the store), never past the call's
``stale_after_s``; an error that concerns one call (input that is not JSON, or over the
input cap, :data:`stores.inputs.MAX_INPUT_BYTES`, both found where its key is made) fails
that call's future alone, before anything is claimed or sent; an unknown tool, a bad
option or a stopped system fails them all. Messages quote what the caller passed through
:func:`stores.quoting.brief`, never whole.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import orjson
import pykka

from actors.checks import check_number
from actors.errors import (
    CallCancelledError,
    CallCycleError,
    DispatchError,
    InvalidInputError,
    UnknownToolError,
    error_text,
    hosts_own,
    is_a,
    signalled,
    type_name,
)
from actors.lifecycle.calls import Call
from actors.messages import CallCancelled, RememberOutputs, SubmitCalls
from actors.queue.read_ahead import ReadAhead
from actors.results import ToolResult
from actors.runtime.futures import Interjection, fail, new_future, resolved_future, takes_interjections
from actors.runtime.gathering import Gathering
from actors.runtime.host_signals import cover as cover_signals
from actors.runtime.nesting import in_tool, running_keys
from actors.stats import Stats
from actors.store.outage import SERVICE as STORE_SERVICE
from actors.store.salvaged import SalvageFile
from actors.tool import Policy, RunInfo, Tool
from stores.base import ReceiptStore
from stores.codec import decode_output
from stores.errors import StoreUnavailableError
from stores.inputs import sent_size_bytes
from stores.keys import key_maker, key_of_hash_maker
from stores.money import Money
from stores.quoting import brief
from stores.rows import INPUT_TEXT_MAX_CHARS
from stores.types import ClaimMode

__all__ = ["READ_FIRST", "DispatchProxy", "Intake", "MemoView", "ReadFirst"]

READ_FIRST = 32
"""Fewest calls (left after the memo) of one ``execute_many`` whose receipts are always read
on the caller's thread before they are queued: a cold rerun is then answered without the
actors. Fewer calls (a lone ``execute``) are read first while such reads keep finding
receipts (:class:`ReadFirst`), else they go straight to their queue, which claims them."""

READ_AHEAD_SCORE = 0.9
"""A tool's plain reads finding this share of what they ask for (running average:
:class:`ReadFirst`) start reading its rerun's receipts ahead (:mod:`actors.queue.read_ahead`)."""
REMEMBER_EVERY = 64
"""Outputs read on callers' threads are given to the tool's memo (one message to its queue
actor) this many at a time, or with the next hit once :data:`REMEMBER_AFTER_S` passed."""
REMEMBER_AFTER_S = 0.05

_MODES = {
    (False, False): ClaimMode.NORMAL,
    (False, True): ClaimMode.RETRY_FAILED,
    (True, False): ClaimMode.FORCE_REFRESH,
    (True, True): ClaimMode.FORCE_REFRESH,
}


class MemoView(Protocol):
    """What the front door reads of a tool's memo (:class:`actors.queue.memo.Memo`)."""

    max_bytes: int
    """Its bound in bytes; 0: the tool keeps no memo."""
    forgets: int
    """Times it forgot everything (a purge)."""

    def recall(self, key: str, stale_after_s: float | None, now: float) -> str | None:
        """The output text this system completed under ``key`` (``now``: ``time.monotonic()``),
        or None."""
        ...

    def take_owed(self, key: str) -> bool:
        """Whether this call takes ``key``'s mark: its receipt was completed by this system
        with no caller answered ``live`` (this one is)."""
        ...


class ReadFirst:
    """Whether a few calls (fewer than :data:`READ_FIRST`) left after a tool's memo are read
    from the store on the caller's thread first: while recent reads found most of what they
    asked for (a rerun), yes; otherwise (fresh calls, where the read would find nothing) only
    one such read in :attr:`PROBE_EVERY`, to notice a rerun. Thread-safe enough: a lost
    update only shifts one decision."""

    PROBE_EVERY = 64
    WEIGHT = 0.2
    """Weight of the latest read's hit ratio in the running score (exponential average)."""

    __slots__ = ("score", "skipped")

    def __init__(self) -> None:
        self.score = 1.0
        self.skipped = 0

    def wanted(self, n: int) -> bool:
        """Read ``n`` calls first?"""
        if n >= READ_FIRST or self.score >= 0.5:
            return True
        self.skipped += 1
        if self.skipped < self.PROBE_EVERY:
            return False
        self.skipped = 0
        return True

    def found(self, asked: int, answered: int) -> None:
        """A read of ``asked`` calls answered ``answered`` of them."""
        if asked:
            self.score += self.WEIGHT * (answered / asked - self.score)


class Intake:
    """Takes calls for one :class:`~actors.system.DispatchSystem` (any thread).

    Args:
        run: the run's identity (org and scope key every call).
        policy: the system's settings.
        tools: the tools by id.
        stats: the system's counters.
        stopping: set once the system stops taking calls.
        memos: each tool's memo, by tool id.
        queues: each tool's queue actor, by tool id.
        store: the receipt store (plain reads of a cold rerun, on the caller's thread).
        salvage: the salvage file (a key it holds a paid output for is never answered by
            a plain read: its claim replays the file first).
        telemetry: the system's instruments (``actors.telemetry.instruments.Instruments``)
            when telemetry is on, else None: each call then gets a span, begun here.
    """

    def __init__(
        self, *, run: RunInfo, policy: Policy, tools: dict[str, Tool], stats: Stats,
        stopping: threading.Event, memos: Mapping[str, MemoView], queues: dict[str, Any], store: ReceiptStore,
        salvage: SalvageFile | None = None, telemetry: Any = None,
    ) -> None:  # fmt: skip
        self.run = run
        self.policy = policy
        self.tools = tools
        self.stats = stats
        self.stopping = stopping
        self.memos = memos
        self.queues = queues
        self.store = store
        self.salvage = salvage
        self.telemetry = telemetry
        self._where = repr(store)
        """The store as outages name it (:mod:`actors.store.outage`)."""
        self._digests: dict[str, str] = {}
        self._read_first = {tool_id: ReadFirst() for tool_id in tools}
        self._ahead: dict[str, ReadAhead] = {}
        """Tool id -> its rerun's receipts read ahead into its memo (made at the first rerun)."""
        self._waiting: dict[str, Gathering[Call]] = {tool_id: Gathering() for tool_id in tools}
        """Tool id -> calls submitted, not yet taken by its queue actor (:meth:`submit`)."""
        self._remember: dict[str, tuple[float, list[tuple[str, str, Money | None]], int]] = {}
        self._remember_lock = threading.Lock()
        self._makers: dict[tuple[str, str, float | None], Callable[[Any], tuple[str, str, bytes]]] = {}

    def key_maker(
        self, tool: Tool, digest: str, stale_after_s: float | None
    ) -> Callable[[Any], tuple[str, str, bytes]]:
        """The key function of ``tool`` under ``digest`` and ``stale_after_s``: ``make(input)
        -> (key, input hash, canonical input)`` (cached; a few entries per tool: one per
        credentials digest and staleness seen)."""
        cache_key = (tool.tool_id, digest, stale_after_s)
        make = self._makers.get(cache_key)
        if make is None:
            run = self.run
            make = key_maker(
                org_id=run.org_id, scope=run.scope, tool_id=tool.tool_id, credential_scope_digest=digest,
                version=tool.version, stale_after_s=stale_after_s, ignore_fields=tool.non_semantic_fields,
            )  # fmt: skip
            if len(self._makers) >= 256:  # many staleness values: keep the cache bounded
                self._makers.clear()
            self._makers[cache_key] = make
        return make

    def digest(self, tool: Tool) -> str:
        """The credential-scope digest of ``tool`` (asked once, then cached; '' without credentials)."""
        if tool.credentials is None:
            return ""
        found = self._digests.get(tool.tool_id)
        if found is None:
            try:
                found = str(tool.credentials())
            except (Exception, KeyboardInterrupt):  # an error, or the caller's own interrupt
                raise
            except BaseException as exc:  # SystemExit & co: this call's error, not the process's
                if signalled(exc):  # (unless a signal handler raised it: the host's)
                    raise
                raise DispatchError(f"{tool.tool_id}: its credentials function raised "
                                    f"{brief(error_text(exc))} ({type_name(exc)})") from None  # fmt: skip
            self._digests[tool.tool_id] = found
        return found

    def submit(self, tool_id: str, calls: list[Call]) -> None:
        """Queue ``calls`` on their tool's queue actor (cancelled if it is gone): put in
        the tool's gathering, which rings the actor only when it was empty, so calls
        submitted close together, from one thread or many, reach it in one message."""
        ref = self.queues[tool_id]
        for call in calls:
            call.future.on_cancel = _cancel_hook(ref, call)
        waiting = self._waiting[tool_id]
        ring = waiting.put(calls)
        if ring:
            try:
                ref.tell(SubmitCalls(waiting=waiting))
            except pykka.ActorDeadError:
                calls = waiting.close()  # with any that rode along
                ring = None
        if ring is None:
            for call in calls:
                fail(call.future, CallCancelledError("the dispatcher is stopped"))

    def forget_digest(self, tool_id: str) -> None:
        """Ask ``tool_id``'s credentials again at its next call."""
        self._digests.pop(tool_id, None)

    def execute_many(
        self,
        tool_id: str,
        inputs: Sequence[Any],
        force_refresh: bool,
        retry_failed: bool,
        stale_after_s: float | None,
        timeout_s: float | None,
    ) -> list[Any]:
        """One future per input, same order (see :meth:`DispatchProxy.execute_many`)."""

        cover_signals()  # (the host's handlers raise as the host's here: a start off the main thread)
        stats = self.stats
        tool = self.tools.get(tool_id) if isinstance(tool_id, str) else None
        try:
            if self.stopping.is_set():
                raise CallCancelledError("the dispatcher is stopped")
            if not isinstance(tool_id, str):
                raise InvalidInputError(f"tool_id must be a string, got {type(tool_id).__name__}")
            if tool is None:
                raise UnknownToolError(
                    f"unknown tool {brief(tool_id)}; known: {', '.join(sorted(self.tools))}"
                )
            for name, flag in (("force_refresh", force_refresh), ("retry_failed", retry_failed)):
                if not isinstance(flag, bool):
                    raise InvalidInputError(f"{name} must be True or False, got {type(flag).__name__}")
            check_seconds("timeout_s", timeout_s, positive=True)
            check_seconds("stale_after_s", stale_after_s, positive=False)
            digest = self.digest(tool)
            make = self.key_maker(tool, digest, stale_after_s)
        except Exception as exc:
            failed = [new_future() for _ in inputs]
            for future in failed:
                fail(future, exc)
            known = tool_id if tool is not None else None
            stats.add("calls", len(failed), tool=known)
            stats.add("errors", len(failed), tool=known)
            return failed
        mode = _MODES[force_refresh, retry_failed]
        ahead = self._ahead.get(tool_id)
        if ahead is not None and ahead.running:
            ahead.asked(len(inputs))
        memo = self.memos.get(tool_id)
        recall = memo.recall if memo is not None and memo.max_bytes and mode is ClaimMode.NORMAL else None
        nested = in_tool()
        cycle = running_keys() if nested else frozenset()
        now = time.monotonic()
        timeout = timeout_s or tool.timeout_s or self.policy.timeout_s
        futures: list[Any] = []
        misses: list[tuple[int, Any, str, str, bytes]] = []  # (index, input, key, input hash, canonical)
        errors = cached = 0
        saved: list[Money] = []  # what the calls answered from receipts cost when paid
        priced: dict[int, Money] | None = {} if self.telemetry is not None else None
        """(Telemetry on) index -> what a call answered here from a receipt cost when paid."""
        for input in inputs:
            try:
                key, input_hash, canonical = make(input)
            except BaseException as exc:  # SystemExit & co from the input's own code: its call's error
                if hosts_own(exc):  # the caller's own interrupt, or a signal's exit: never swallowed
                    raise
                future = new_future()
                fail(future, _as_input_error(exc))
                futures.append(future)
                errors += 1
                continue
            if key in cycle:
                future = new_future()
                fail(
                    future,
                    CallCycleError(f"{tool_id} was called inside its own call of that input (key {key})"),
                )
                futures.append(future)
                errors += 1
                continue
            if recall is not None:
                text = recall(key, stale_after_s, now)
                if text is not None:  # answered here, from a read-only view (a copy per call)
                    try:
                        value = decode_output(text)
                    except Exception:  # one that cannot be read: a miss, its claim says so
                        pass
                    else:
                        live = memo is not None and memo.take_owed(key)  # completed here, no caller told
                        futures.append(
                            resolved_future(ToolResult.of(value, "live" if live else "cached", key, tool_id))
                        )
                        if not live:
                            cached += 1
                            cost = memo.cost_of(key)  # type: ignore[union-attr]
                            if cost is not None:
                                saved.append(cost)
                                if priced is not None:
                                    priced[len(futures) - 1] = cost
                        continue
            misses.append((len(futures), input, key, input_hash, canonical))
            futures.append(None)
        if (
            misses
            and tool.durable
            and mode is not ClaimMode.FORCE_REFRESH
            and self._read_first[tool_id].wanted(len(misses))
        ):
            before = len(misses)
            # what the memo would answer, for calls that come a few at a time (one read
            # answers a bulk of them already)
            ahead_ok = recall is not None and stale_after_s is None and len(misses) < READ_FIRST
            misses, lives = self._from_store(
                tool, misses, futures, stale_after_s, saved, read_ahead=ahead_ok, priced=priced
            )
            cached += before - len(misses) - lives
        calls: list[Call] = []
        telemetry = self.telemetry
        for index, input, key, input_hash, canonical in misses:
            future = futures[index] = new_future()
            try:
                private = snapshot(input)
                input_text = kept_input_text(tool, private, canonical)
                size = sent_size_bytes(len(canonical), private, tool.non_semantic_fields)  # as make measured
            except BaseException as exc:  # an input that cannot be copied fails alone
                if hosts_own(exc):
                    raise
                fail(future, _as_input_error(exc))
                errors += 1
                continue
            calls.append(
                Call(
                    tool=tool,
                    input=private,
                    key=key,
                    input_hash=input_hash,
                    input_text=input_text,
                    input_bytes=size,
                    credential_digest=digest,
                    mode=mode,
                    stale_after_s=stale_after_s,
                    timeout_s=timeout,
                    future=future,
                    submitted_at=now,
                    nested=nested,
                    ancestors=cycle,
                    trace=telemetry.call(tool, key, now) if telemetry is not None else None,
                )
            )
        if telemetry is not None:
            telemetry.answered_here(tool, futures, now, [call.future for call in calls], priced or {})
            for call in calls:
                call.future.add_done_callback(call.trace.done)
        stats.add("calls", len(futures), tool=tool_id)
        if errors:
            stats.add("errors", errors, tool=tool_id)
        if cached:
            stats.add("cached", cached, tool=tool_id)
        if saved:
            stats.save(saved, tool=tool_id)
        if calls:
            self.submit(tool_id, calls)
        return futures

    def _from_store(
        self,
        tool: Tool,
        misses: list[tuple[int, Any, str, str, bytes]],
        futures: list[Any],
        stale_after_s: float | None,
        saved: list[Money],
        read_ahead: bool = False,
        priced: dict[int, Money] | None = None,
    ) -> tuple[list[tuple[int, Any, str, str, bytes]], int]:
        """Answer the calls whose receipts a plain read of the store finds completed (a
        cold rerun): their ``futures`` slots get resolved futures, and what those answers
        cost when paid is added to ``saved``; returns the misses left
        for the tool's queue, and how many answers were ``live`` (a receipt this system
        completed with no caller answered: :meth:`actors.queue.memo.Memo.owe`).

        Only completed receipts a normal claim would reuse are taken here
        (``read_reusable``: a recorded failure, an uncertain receipt or anything to claim
        goes to the queue, whose lifecycle decides it); a read that fails answers nothing
        (the claim will meet the error, and ride out an outage of the store). While the
        store is known to be away (:mod:`actors.store.outage`) no read is made: the caller
        would wait on the connection for nothing. Under a receipt-op budget every read
        must be charged by the store actor, so none is made here. A key the salvage file
        holds a paid output for is left to its claim, which replays the file first
        (:mod:`actors.store.salvaged`): the store may hold an older output (a refresh
        whose write failed), or one that cannot be read. With ``read_ahead``, a read that
        finds what it asks for (a rerun) starts the tool's :class:`ReadAhead`.
        """
        if self.policy.max_receipt_ops is not None:
            return misses, 0
        where, outages = self._where, self.stats.outages
        if outages.since(STORE_SERVICE, where) is not None:
            return misses, 0
        tool_id = tool.tool_id
        memo = self.memos.get(tool_id)
        forgets = memo.forgets if memo is not None else 0  # (before the read: a purge since voids it)
        started = time.monotonic()
        try:
            found = self.store.read_reusable(
                self.run.org_id, [miss[2] for miss in misses], stale_after_s=stale_after_s
            )
        except Interjection as interjection:  # a host's signal handler, run here; the read is given up
            interjection.run()
            return misses, 0
        except Exception as exc:
            if is_a(exc, StoreUnavailableError):
                outages.failed(STORE_SERVICE, where, f"{type_name(exc)}: {error_text(exc)}", started)
            return misses, 0
        outages.answered(STORE_SERVICE, where)
        read_first = self._read_first[tool_id]
        read_first.found(len(misses), len(found))
        if read_ahead and found and read_first.score >= READ_AHEAD_SCORE:
            ahead = self._read_ahead(tool)
            if ahead is not None:
                ahead.noticed(list(found))
        salvaged = self._salvaged(found)
        texts: dict[str, tuple[str, Money | None]] = {}
        left: list[tuple[int, Any, str, str, bytes]] = []
        memo, live = self.memos.get(tool_id), 0
        for miss in misses:
            index, _, key, input_hash, _ = miss
            stored = found.get(key)
            if stored is None or stored[0] != input_hash or stored[1] is None or key in salvaged:
                left.append(miss)  # a collision or a corrupted receipt: the lifecycle reports it
                continue
            try:
                value = decode_output(stored[1])
            except Exception:
                left.append(miss)
                continue
            texts[key] = (stored[1], stored[2])
            owed = memo is not None and memo.take_owed(key)  # completed here, no caller told
            live += owed
            if not owed and stored[2] is not None:
                saved.append(stored[2])
                if priced is not None:
                    priced[index] = stored[2]
            futures[index] = resolved_future(ToolResult.of(value, "live" if owed else "cached", key, tool_id))
        if texts and self.memos[tool_id].max_bytes:
            self._remember_later(tool_id, texts, forgets)
        return left, live

    def _read_ahead(self, tool: Tool) -> ReadAhead | None:
        """``tool``'s :class:`ReadAhead` (made at its first use; None while its credentials'
        digest is to be asked again: the next call asks it, on its own account)."""
        ahead = self._ahead.get(tool.tool_id)
        if ahead is None:
            digest = self._digests.get(tool.tool_id) if tool.credentials is not None else ""
            if digest is None:
                return None
            run = self.run
            key_of = key_of_hash_maker(
                org_id=run.org_id, scope=run.scope, tool_id=tool.tool_id,
                credential_scope_digest=digest, version=tool.version,
            )  # fmt: skip
            ahead = self._ahead.setdefault(tool.tool_id, ReadAhead(
                store=self.store, org_id=run.org_id, tool_id=tool.tool_id, key_of=key_of,
                memo=self.memos[tool.tool_id], queue=self.queues[tool.tool_id], salvaged=self._salvaged,
                stopping=self.stopping,
            ))  # fmt: skip
        return ahead

    def join_read_ahead(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds in all for the reads ahead to end (once
        ``stopping`` is set), so none reads the store after the system stopped."""
        end = time.monotonic() + timeout_s
        for ahead in list(self._ahead.values()):
            ahead.join(max(0.0, end - time.monotonic()))

    def _salvaged(self, found: Mapping[str, Any]) -> set[str]:
        """The keys of ``found`` the salvage file holds a paid output for (none when it
        cannot be read: the claim meets that too)."""
        if not found or self.salvage is None:
            return set()
        try:
            return self.salvage.salvaged(self.run.org_id, found)
        except OSError:
            return set()

    def _remember_later(self, tool_id: str, texts: dict[str, tuple[str, Money | None]], forgets: int) -> None:
        """Give ``texts`` (key -> (output text, its cost), read when the memo's ``forgets`` was
        ``forgets``) to the tool's memo, gathered: one message per :data:`REMEMBER_EVERY`
        outputs or :data:`REMEMBER_AFTER_S` (at the next read that finds some), so lone
        calls of a rerun do not each cost the queue actor a message."""
        now = time.monotonic()
        with self._remember_lock:
            since, entries, first = self._remember.get(tool_id) or (now, [], forgets)
            entries.extend((key, text, cost) for key, (text, cost) in texts.items())
            if len(entries) < REMEMBER_EVERY and now - since < REMEMBER_AFTER_S:
                self._remember[tool_id] = (since, entries, first)  # a purge since the first voids all
                return
            self._remember.pop(tool_id, None)
        with contextlib.suppress(pykka.ActorDeadError):
            self.queues[tool_id].tell(RememberOutputs(entries=tuple(entries), forgets=first))


takes_interjections(Intake._from_store)  # (the caller's thread waits on the store there)


def check_seconds(name: str, value: Any, *, positive: bool) -> None:
    """A duration option: None, or a finite number of seconds (> 0, or >= 0).

    Raises:
        InvalidInputError: anything else (a string, a bool, NaN, a negative number).
    """
    try:  # a number (not NaN, an int within a float's range), and here finite too
        check_number(name, value, positive=positive, optional=True)
        ok = value is None or math.isfinite(value)
    except ValueError:
        ok = False
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise InvalidInputError(f"{name} must be a number of seconds {bound}, got {brief(value)}")


def snapshot(value: Any) -> Any:
    """A private copy of a caller's input, taken at ``execute``: later changes by the
    caller are not seen by the tool (docs/host-api.md, Calls)."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    try:
        return orjson.loads(orjson.dumps(value))
    except (TypeError, orjson.JSONDecodeError):
        return copy.deepcopy(value)


def kept_input_text(tool: Tool, input: Any, canonical: bytes) -> str | None:
    """What a receipt of ``tool`` keeps of ``input`` (``Tool.keep_input``): its canonical
    form (``canonical``, RFC 8785 UTF-8), the tool's own digest of it, ``""`` (nothing), or
    None for a tool without receipts. Runs on the caller's thread.

    Raises:
        InvalidInputError: the tool's digest raised, or returned something other than a str.
    """
    keep = tool.keep_input
    if not tool.durable:
        return None
    if keep is True:  # no more than the receipt keeps is decoded (the cut is ClaimRequest's)
        return canonical[: 4 * (INPUT_TEXT_MAX_CHARS + 1)].decode("utf-8", "ignore")
    if keep is False:
        return ""
    try:
        text = keep(input)
    except Exception as exc:
        raise InvalidInputError(
            f"{tool.tool_id}: its keep_input raised {type_name(exc)}: {error_text(exc)}"
        ) from exc
    if not isinstance(text, str):
        raise InvalidInputError(
            f"{tool.tool_id}: its keep_input must return a str, not {type(text).__name__}"
        )
    return text


def _as_input_error(exc: BaseException) -> Exception:
    """What a caller hears when its input could not be keyed or copied: the error itself
    when it already says so (InvalidInputError), else an InvalidInputError naming it
    (its message may itself raise: the type alone then)."""
    if isinstance(exc, InvalidInputError):
        return exc
    error = InvalidInputError(f"input cannot be used: {type(exc).__name__}: {error_text(exc)}")
    error.__cause__ = exc
    return error


class _cancel_hook:
    """A call's ``on_cancel``: tells its queue actor (one object per call, not a closure)."""

    __slots__ = ("call", "ref")

    def __init__(self, ref: Any, call: Call) -> None:
        self.ref = ref
        self.call = call

    def __call__(self) -> None:
        with contextlib.suppress(pykka.ActorDeadError):
            self.ref.tell(CallCancelled(call=self.call))


class DispatchProxy:
    """The host's handle for submitting calls; every method is thread-safe."""

    def __init__(self, intake: Intake, stats: Callable[[], dict[str, Any]]) -> None:
        self._intake = intake
        self._stats = stats

    def execute(
        self,
        tool_id: str,
        input: Any,
        *,
        force_refresh: bool = False,
        retry_failed: bool = False,
        stale_after_s: float | None = None,
        timeout_s: float | None = None,
    ) -> pykka.Future[Any]:
        """Queue one call.

        Args:
            tool_id: a tool the system was started with.
            input: the call's JSON input.
            force_refresh: re-run even if a completed receipt exists.
            retry_failed: re-run a receipt that failed.
            stale_after_s: completed receipts older than this (seconds) are re-run.
            timeout_s: this call's timeout (default the tool's, then the policy's).

        Returns:
            A pykka future (awaitable) of :class:`~actors.results.ToolResult`. It fails
            with UnknownToolError, InvalidInputError (InputTooLargeError: the input is
            over ``stores.MAX_INPUT_BYTES`` of JSON text), the tool's error,
            RecordedFailureError, LeaseLostError, ReceiptWaitTimeoutError,
            BudgetExceededError, PersistenceCircuitOpenError, CallCancelledError,
            CallCycleError (from inside a tool, a call of the input it runs for) or
            StoreUnavailableError (the store away, or locked by another connection:
            StoreBusyError, for the whole of ``timeout_s``).
        """
        (future,) = self._intake.execute_many(
            tool_id, (input,), force_refresh, retry_failed, stale_after_s, timeout_s
        )
        one: pykka.Future[Any] = future
        return one

    def execute_many(
        self,
        tool_id: str,
        inputs: Iterable[Any],
        *,
        force_refresh: bool = False,
        retry_failed: bool = False,
        stale_after_s: float | None = None,
        timeout_s: float | None = None,
    ) -> list[pykka.Future[Any]]:
        """Queue many calls of one tool in one message (same options as :meth:`execute`).

        Returns:
            list of futures, same order as ``inputs``. An input that is not JSON, or is
            over the input cap (InputTooLargeError), fails its own future alone, before
            anything is claimed or sent; the others go on.
        """
        return self._intake.execute_many(
            tool_id, tuple(inputs), force_refresh, retry_failed, stale_after_s, timeout_s
        )

    def stats(self) -> dict[str, Any]:
        """See :meth:`DispatchSystem.stats`."""
        return self._stats()
