"""Salvage: results produced (money spent) that could not be persisted.

An append-only JSONL file, created owner-read/write only (0600), each append flushed
and fsynced. Entries are written with the store's exact output codec
(:func:`stores.encode_output`: lone surrogates, integers beyond 64 bits, NaN and
Infinity come back exactly). An output that is not JSON, or that no store can hold,
is kept in :func:`stores.salvage_form` (a description with its repr, ``output_form``
``"described"``) for an operator and never replayed. :func:`replay` puts the others
into a receipt store later.

Appends and replays hold a cross-process lock (``filelock.FileLock`` on
``<path>.lock``, an OS ``flock``), so a replay in one process never loses what another
process appends or replays at the same time.

A dispatch system replays the file before it claims a receipt the file holds an output
for (:meth:`SalvageLog.salvaged` says which; see :mod:`actors.store.salvaged`), so a
rerun never judges a receipt its last run paid for and salvaged.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeGuard

import attrs
import cattrs
import filelock

from stores.base import MAX_OUTPUT_BYTES, ReceiptStore
from stores.codec import UnreadableOutput, converter, decode_output, encode_output, salvage_form
from stores.errors import InvalidOutputError, OutputNotStorableError
from stores.money import Money
from stores.types import (
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Completion,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
    ResolveAction,
)

__all__ = ["REPLAY_OWNER", "ReplayReport", "SalvageEntry", "SalvageLog"]

REPLAY_OWNER = Owner("salvage-replay", 1)
"""The lease owner used when replaying salvage into a store."""


@attrs.frozen(kw_only=True)
class SalvageEntry:
    """One salvaged output.

    Attributes:
        receipt_key: the receipt key.
        org_id / scope / tool_id / input_hash: enough to recreate the receipt.
        output: the tool's output (JSON).
        completion_attempts: how many times persisting it was tried.
        first_error_at: epoch seconds of the first failed attempt.
        error: the last error text.
        lease_id: the lease the output was produced under (None in older files);
            replay completes the receipt under it while the receipt still holds it.
        output_form: ``"json"`` (``output`` is the answer, exactly), or ``"described"``
            (the answer was not JSON or could not be stored: ``output`` describes it,
            ``output_problem`` says why; replay keeps such entries for an operator).
        output_problem: why the output is only described (None for ``"json"``).
        generation: the receipt generation the output was produced under (None in older
            files): of several entries of one call, a replay takes the latest.
        replaces: for a refresh, ``completed_at`` of the stored output it replaces, as its
            claim read it (None otherwise, and in older files): a replay puts the entry in
            place of a completed receipt's output only while that output is still this one.
        cost: what the call cost, in :class:`stores.Money`'s text form (``"0.0025 USD"``;
            None: unknown or free, and in older files); a replay writes it with the output.
    """

    receipt_key: str
    org_id: str
    scope: str
    tool_id: str
    input_hash: str
    output: Any
    completion_attempts: int
    first_error_at: float
    error: str
    lease_id: str | None = None
    output_form: str = "json"
    output_problem: str | None = None
    generation: int | None = None
    replaces: float | None = None
    cost: str | None = None


def _encode(entry: SalvageEntry) -> str:
    """One line of the file: the entry as a JSON object, the output in its exact form."""
    return encode_output(attrs.asdict(entry, recurse=False))


@attrs.frozen
class ReplayReport:
    """What :meth:`SalvageLog.replay` did: counts of entries (``unreadable``: lines that
    are not an entry, such as one torn by a crash mid-write; they are left in the file)."""

    completed: int
    already_completed: int
    kept: int
    unreadable: int = 0
    superseded: int = 0
    """Entries dropped for a later entry of the same call in the file (its newer output)."""


class SalvageLog:
    """Append-only JSONL salvage file at ``path`` (thread-safe)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = _lock_for(self.path)
        self._file_lock = filelock.FileLock(f"{self.path}.lock", mode=0o600)
        self._seen: tuple[tuple[int, int, int, int], frozenset[tuple[str, str]]] | None = None
        """(the file's device, inode, size and mtime in ns; the (org, key) pairs it then
        held a replayable output for), from the last look of :meth:`salvaged`."""
        self.appended = 0
        """Entries this instance wrote to the file (:meth:`append`): what a run salvaged."""

    def salvaged(self, org_id: str, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` (receipt keys of ``org_id``) the file holds an output for that
        :meth:`replay` would put into a store (not one kept only described, nor one over
        the output cap). One ``stat`` of the file per call: it is read again only when it
        changed (its size, mtime or inode), so what another system or process appended,
        or a replay removed, is seen. Any thread.

        Raises:
            OSError: the file exists but cannot be read.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return set()
        signature = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        seen = self._seen
        if seen is None or seen[0] != signature:
            # stat before read: an append in between is read again at the next look
            pending = frozenset((e.org_id, e.receipt_key) for e in self._read()[0] if _replayable(e))
            seen = self._seen = (signature, pending)
        held = seen[1]
        if not held:
            return set()
        return {key for key in keys if (org_id, key) in held}

    @property
    def lock(self) -> threading.Lock:
        """This process's lock for the file, held while appending or replaying: one per file
        (by its real path), shared by every SalvageLog on it (two DispatchSystems on one
        store share the default salvage file)."""
        return self._lock

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This process's lock for the file, then the cross-process one."""
        with self._lock, self._file_lock:
            yield

    def append(self, entries: Iterable[SalvageEntry]) -> int:
        """Append entries, flushed and fsynced; returns how many were written.

        Raises:
            InvalidOutputError / OutputNotStorableError: an entry built without
                :func:`salvage_entry` holds an output with no exact form.
        """
        lines = [_encode(entry) + "\n" for entry in entries]
        written = len(lines)
        if not lines:
            return 0
        with self._locked():
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    lines.insert(0, "\n")  # a line torn by a crash: never glue an entry onto it
                os.write(fd, "".join(lines).encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            self.appended += written
        return written

    def entries(self) -> list[SalvageEntry]:
        """Every entry in the file (an empty list when there is no file)."""
        return self._read()[0]

    def unreadable(self) -> int:
        """How many lines of the file are not an entry (torn by a crash, edited by hand)."""
        return len(self._read()[1])

    def _read(self) -> tuple[list[SalvageEntry], list[bytes], int]:
        """The entries, the lines that are not one, and the byte size they were read from."""
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return [], [], 0
        entries: list[SalvageEntry] = []
        unreadable: list[bytes] = []
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                entries.append(converter.structure(decode_output(line), SalvageEntry))
            except (
                ValueError,
                TypeError,
                cattrs.BaseValidationError,
            ):  # orjson's JSONDecodeError is a ValueError
                unreadable.append(line)
        return entries, unreadable, len(data)

    def _rewrite(self, entries: list[SalvageEntry], unreadable: list[bytes], carry_from: int) -> None:
        """Replace the file with ``entries`` and the ``unreadable`` lines (kept verbatim for
        an operator) plus whatever was appended past ``carry_from`` since it was read
        (another process's flusher appends without this lock)."""
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            body = "".join(_encode(e) + "\n" for e in entries).encode("utf-8")
            body += b"".join(line + b"\n" for line in unreadable)
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(carry_from)
                    body += fh.read()
            except FileNotFoundError:
                pass
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def replay(self, store: ReceiptStore, *, lease_ttl_s: float = 60.0) -> ReplayReport:
        """Complete salvaged receipts in ``store``; keep only what could not be replayed.

        A receipt already completed (by anyone) just drops its entry, unless its stored
        output is older than the entry's (a forced refresh, paid for, whose write failed:
        the entry's output then replaces it, as the refresh would have) or cannot be read
        back (:class:`~stores.codec.UnreadableOutput`: the entry's is then the only copy
        anyone can read, and replaces it); one still held
        under the lease its output was produced (and salvaged) under is completed
        under that lease, since the store gave up before that owner could; one recorded
        ``uncertain`` for that very lease (a worker that could not see this file judged
        it) is completed with the entry's output, the outcome it was uncertain of
        (:meth:`~stores.ReceiptStore.resolve`); one under another owner's live lease is
        kept for a later replay. An entry whose output is over the store's output cap
        (its receipt was recorded failed, ``output_too_large``) is kept for an operator,
        as a described one is, and its receipt left alone.

        Raises:
            StoreError: the store failed (the file is left unchanged).
        """
        with self._locked():
            entries, unreadable, size = self._read()
            if unreadable and not entries:  # never rewrite (or re-permission) someone else's file
                lines = len(unreadable)
                raise NotASalvageFileError(
                    f"{self.path} is not a salvage file: none of its {lines} lines is one"
                )
            kept: list[SalvageEntry] = [e for e in entries if not _replayable(e)]
            completed = already = superseded = 0
            by_org: dict[str, dict[str, SalvageEntry]] = {}
            for entry in entries:  # one per key: the latest generation's (the file's last of it)
                if _replayable(entry):
                    members_ = by_org.setdefault(entry.org_id, {})
                    seen = members_.get(entry.receipt_key)
                    if seen is not None:
                        superseded += 1  # one of the two goes: the later output of the call
                        if _gen(seen) > _gen(entry):
                            continue
                    members_[entry.receipt_key] = entry
            for org_id, members in by_org.items():
                keys = list(members)
                stored = store.get_many(org_id, keys)
                todo = []
                held_by: dict[Owner, list[SalvageEntry]] = {}
                refresh = []
                for key, receipt in zip(keys, stored, strict=True):
                    if receipt is not None and receipt.status is ReceiptStatus.COMPLETED:
                        if _newer(members[key], receipt) or isinstance(receipt.output, UnreadableOutput):
                            # a paid refresh the store never took; or what it holds is unreadable
                            refresh.append(members[key])
                        else:
                            already += 1
                    elif _still_held(receipt, members[key]):
                        held_by.setdefault(receipt.owner or REPLAY_OWNER, []).append(members[key])
                    elif _judged_uncertain(receipt, members[key]):
                        entry = members[key]
                        done_ = store.resolve(org_id, key, ResolveAction.COMPLETE, output=entry.output)
                        if done_ is not None and done_.status is ReceiptStatus.COMPLETED:
                            completed += 1
                        else:  # decided meanwhile by someone else: a later replay judges it
                            kept.append(entry)
                    else:
                        todo.append(members[key])
                for lease_owner, own in held_by.items():
                    late_completions = [
                        Completion(e.receipt_key, e.lease_id or "", e.output, cost=_cost(e)) for e in own
                    ]
                    late = store.complete_many(org_id, late_completions, lease_owner)
                    completed += len(late.applied)
                    todo.extend(e for e in own if e.receipt_key in late.refused)
                for entries_, mode in ((todo, ClaimMode.RETRY_FAILED), (refresh, ClaimMode.FORCE_REFRESH)):
                    if entries_:
                        done, left = _claim_and_complete(store, org_id, entries_, mode, lease_ttl_s)
                        completed += done
                        kept.extend(left)
            self._rewrite(kept, unreadable, carry_from=size)
            return ReplayReport(
                completed=completed, already_completed=already, kept=len(kept), unreadable=len(unreadable),
                superseded=superseded,
            )  # fmt: skip


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_for(path: str) -> threading.Lock:
    """One lock per salvage file in this process, shared by every SalvageLog on it
    (two DispatchSystems on one store share the default salvage file)."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(os.path.realpath(path), threading.Lock())


def _claim_and_complete(
    store: ReceiptStore, org_id: str, entries: list[SalvageEntry], mode: ClaimMode, lease_ttl_s: float
) -> tuple[int, list[SalvageEntry]]:
    """Claim the entries' receipts as the replay owner and complete them with their
    outputs: (how many completed, the entries to keep). No replay lease is left behind."""
    members = {e.receipt_key: e for e in entries}
    claims = store.claim_many(
        org_id,
        [ClaimRequest(e.receipt_key, e.scope, e.tool_id, e.input_hash) for e in entries],
        REPLAY_OWNER,
        lease_ttl_s=lease_ttl_s,
        mode=mode,
    )
    held = {c.receipt.key: c.receipt.lease_id for c in claims if c.disposition is ClaimDisposition.CLAIMED}
    kept = [e for e in entries if e.receipt_key not in held]
    leases = [LeaseRef(key, lease) for key, lease in held.items() if lease]
    store.mark_running_many(org_id, leases, REPLAY_OWNER)
    completions = [
        Completion(lease.key, lease.lease_id, members[lease.key].output, cost=_cost(members[lease.key]))
        for lease in leases
    ]
    done = store.complete_many(org_id, completions, REPLAY_OWNER)
    kept.extend(members[key] for key in done.refused)
    store.release(org_id, [lease for lease in leases if lease.key in done.refused], REPLAY_OWNER)
    return len(done.applied), kept


def _replayable(entry: SalvageEntry) -> bool:
    """A replay puts the entry's output into a store: exact JSON, within the output cap."""
    if entry.output_form != "json":
        return False
    if not isinstance(entry.output, str | list | dict):  # only these can be large
        return True
    try:
        text = encode_output(entry.output)
    except (InvalidOutputError, OutputNotStorableError):  # (a file edited by hand)
        return False
    return len(text) <= MAX_OUTPUT_BYTES // 4 or len(text.encode()) <= MAX_OUTPUT_BYTES


def _judged_uncertain(receipt: Receipt | None, entry: SalvageEntry) -> TypeGuard[Receipt]:
    """The receipt was recorded ``uncertain`` for the very lease the entry's output was
    produced under (its owner lost; judged by a worker that could not see this file)."""
    return (
        receipt is not None
        and receipt.status is ReceiptStatus.UNCERTAIN
        and entry.lease_id is not None
        and receipt.lease_id == entry.lease_id
    )


def _cost(entry: SalvageEntry) -> Money | None:
    """The entry's cost as Money; None when it has none, or a text that is not one (edited
    by hand: the output is still replayed)."""
    try:
        return None if entry.cost is None else Money.parse(entry.cost)
    except ValueError:
        return None


def _gen(entry: SalvageEntry) -> int:
    return -1 if entry.generation is None else entry.generation


def _newer(entry: SalvageEntry, receipt: Receipt) -> bool:
    """The entry's output came after the receipt's stored one: a refresh, paid for, whose
    write failed, while the receipt still holds the very output that refresh replaces
    (its ``completed_at``, the store's own value, unchanged; later refreshes that failed
    too leave it so). Never judged by clocks: the store's and the worker's differ."""
    return entry.replaces is not None and receipt.completed_at == entry.replaces


def _still_held(receipt: Receipt | None, entry: SalvageEntry) -> TypeGuard[Receipt]:
    """The receipt is still queued/running under the lease the entry was salvaged from."""
    return (
        receipt is not None
        and receipt.owner is not None
        and entry.lease_id is not None
        and receipt.lease_id == entry.lease_id
        and receipt.status in (ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)
    )


class NotASalvageFileError(ValueError):
    """``replay`` was pointed at a file that holds no salvage entry at all (it is left as it is)."""


def salvage_entry(
    *, key: str, org_id: str, scope: str, tool_id: str, input_hash: str, output: Any, attempts: int,
    first_error_at: float | None, error: str, lease_id: str | None = None, generation: int | None = None,
    replaces: float | None = None, cost: Money | None = None,
) -> SalvageEntry:  # fmt: skip
    """Build an entry (first_error_at defaults to now). An output with no exact stored
    form (not JSON, too deep, an integer beyond 4300 digits) is kept described
    (:func:`stores.salvage_form`), so the salvage log can always write it."""
    kept, problem = salvage_form(output)
    return SalvageEntry(
        receipt_key=key,
        org_id=org_id,
        scope=scope,
        tool_id=tool_id,
        input_hash=input_hash,
        output=kept,
        completion_attempts=attempts,
        first_error_at=first_error_at if first_error_at is not None else time.time(),
        error=error,
        lease_id=lease_id,
        output_form="json" if problem is None else "described",
        output_problem=problem,
        generation=generation,
        replaces=replaces,
        cost=None if cost is None else str(cost),
    )
