"""The receipt store contract.

A receipt store keeps one durable :class:`~stores.types.Receipt` per (org, receipt
key). It is the result cache, the idempotency record and the lease. Every method is
a bulk operation: one transaction and O(1) store round trips whatever the number of
keys, with results in request order.

The clock rule: lease expiry is judged by **one clock, the store's**. A store reads
"now" from its ``clock`` (epoch seconds) inside the transaction that decides, never
from the caller. For SQLite every process shares one host clock. A store shared
between hosts (Postgres) must read the database server's clock (``now()``), so
clock skew between worker hosts can never make one worker think another's lease has
expired; the only skew that matters is the lease TTL itself against real time, which
is why heartbeats renew at a fraction of the TTL.

Fencing: ``mark_running_many``, ``renew_leases``, ``complete_many``, ``fail_many``
and ``release`` change a receipt only when its lease id, owner run id and owner
attempt all match the caller's; otherwise nothing changes for that key and the
:class:`~stores.types.FenceReport` says why. The six fenced writes (those five and
``mark_uncertain_many``) are written here once, over one method each backend
implements, ``_fence``: one statement applying an operation to items
(:mod:`stores.fenced`).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

import attrs

from stores.fenced import FenceItem, completion_items, failure_items, lease_items
from stores.money import Money
from stores.rules import MAX_OUTPUT_BYTES
from stores.types import (
    BatchRecord,
    Claim,
    ClaimDisposition,
    ClaimMode,
    ClaimRequest,
    Completion,
    Failure,
    FenceReport,
    LeaseRef,
    Owner,
    Receipt,
    ReceiptStatus,
    Refusal,
    ResolveAction,
)

__all__ = [
    "FENCED_WRITES", "MAX_OUTPUT_BYTES", "PLAIN_READ_WAIT_S", "ChangeFeed", "Clock", "ReceiptStore",
    "StoreCapabilities",
]  # fmt: skip

PLAIN_READ_WAIT_S = 0.1
"""Seconds a plain read on a caller's thread (:meth:`ReceiptStore.read_reusable`) may wait
for a connection or a lock before it gives up: the call then goes to its queue, whose
claim waits on the store actor's thread instead, where the caller's ``timeout_s`` and a
stop reach it."""

Clock = Callable[[], float]
"""A function returning the store's "now" in epoch seconds."""

Outcome = tuple[Any, BaseException | None]
"""One call's answer in :meth:`ReceiptStore.write_together`: (value, None) or (None, error)."""


class ChangeFeed(Protocol):
    """Tells that receipts of an org may have changed (see :meth:`ReceiptStore.change_feed`).

    Tokens only grow; a waiter compares them, then re-reads its own keys. A feed may
    say "changed" for nothing (another key, a reconnect), never "unchanged" wrongly
    while it is :attr:`live`.
    """

    @property
    def live(self) -> bool:
        """True while changes are being heard (False: waiters must rely on polling)."""
        ...

    def changes(self) -> int:
        """A counter that grows whenever any org's token changes."""
        ...

    def version(self, org_id: str) -> tuple[int, int]:
        """A token that changes whenever receipts of ``org_id`` may have changed."""
        ...

    def wait_any(self, seen: int, timeout_s: float) -> int:
        """Block until :meth:`changes` differs from ``seen`` (at most ``timeout_s``
        seconds); returns the counter now. Runs on the calling thread or greenlet."""
        ...


FENCED_WRITES = frozenset(
    {"mark_running_many", "renew_leases", "complete_many", "fail_many", "mark_uncertain_many", "release"}
)
"""The fenced writes by name: what :meth:`ReceiptStore.write_together` takes."""


@attrs.frozen(kw_only=True)
class StoreCapabilities:
    """What a store can do beyond the contract's required methods.

    The dispatch system reads these and nothing else to choose how to use a store; the
    defaults (the base class's) suit any store that implements the abstract methods.
    """

    parallel_calls: int = 1
    """Store calls a dispatcher may run at once, each its own transaction on a pooled
    connection (Postgres: up to 4); 1: one at a time."""
    group_commit: bool = False
    """:meth:`ReceiptStore.write_together` runs fenced writes in one transaction (SQLite)."""
    claims_into_running: bool = False
    """:meth:`ReceiptStore.claim_many` honours ``running`` (claims straight into running);
    False: the dispatcher leaves ``running`` out and marks its claims running after."""
    batch_records: bool = False
    """:meth:`ReceiptStore.mark_running_many` records ``batches`` and
    :meth:`ReceiptStore.claim_many` takes a recorded batch request's members together
    (``Claim.batch``); False: the dispatcher leaves ``batches`` out, and a batch request
    cut short by a crash is not sent again as it was."""
    bounded_waits: bool = False
    """:meth:`ReceiptStore.claim_many`, :meth:`ReceiptStore.mark_running_many` and
    :meth:`ReceiptStore.release` take ``wait_s`` (their lock waits bounded by their
    callers' ``timeout_s``; ``_fence`` is given it); False: the dispatcher leaves it out,
    and the store's own bound applies."""
    file_path: str | None = None
    """The store's database file, when it is one: files kept for a run (the salvage log)
    go beside it by default. None: not a file (a server, ``":memory:"``)."""


class ReceiptStore(abc.ABC):
    """Abstract receipt store. Backends: :class:`stores.sqlite.store.SqliteReceiptStore`,
    :class:`stores.postgres.store.PostgresReceiptStore`.

    Implementations are safe to call from several threads (and greenlets) at once,
    and never block a gevent hub. A subclass implements the abstract methods and the
    fenced writes' one statement, ``_fence`` (or overrides each fenced write instead);
    it declares what it can do beyond them in :attr:`capabilities` (default: nothing
    more).
    """

    clock: Clock = time.time
    capabilities: StoreCapabilities = StoreCapabilities()
    """What this store can do beyond the contract (a class or an instance attribute)."""

    @abc.abstractmethod
    def claim_many(
        self,
        org_id: str,
        requests: Sequence[ClaimRequest],
        owner: Owner,
        *,
        lease_ttl_s: float,
        mode: ClaimMode = ClaimMode.NORMAL,
        stale_after_s: float | None = None,
        running: Collection[str] = frozenset(),
        wait_s: float | None = None,
    ) -> list[Claim]:
        """Claim receipts: one read, then one transaction for the keys it did not settle.

        Args:
            org_id: the org; receipts of other orgs are never read or written.
            requests: one per key; duplicate keys are claimed once and answered alike.
            owner: the claiming run.
            lease_ttl_s: lease lifetime in seconds from the store's now.
            mode: normal, retry_failed or force_refresh.
            stale_after_s: completed receipts older than this are claimed again.
            running: keys the caller will send at once (it holds a slot for each): when
                this claim takes one, it is written ``running`` in the same transaction
                (claim straight into running: no separate :meth:`mark_running_many`).
            wait_s: the longest the claim waits for a lock another connection holds,
                seconds (None: the store's own bound, SQLite's ``busy_timeout_s``,
                Postgres's ``lock_timeout_s``); given only to a store whose
                ``capabilities.bounded_waits``.

        Returns:
            list of Claim, same order as ``requests``. A ``CLAIMED`` receipt is
            ``queued`` (``running`` if its key is in ``running``) under a new lease id
            owned by ``owner``; reclaiming an expired lease is a compare-and-set, so of
            two racing claimers exactly one wins.

        Contract details (tests/stores/test_contract_*.py):

        * receipts a plain read settles (completed and reused, failed in normal mode,
          uncertain: :func:`stores.claims.settled_by_read`) are answered by a read
          without the write lock; only the other keys are claimed in the transaction
          (a rerun of settled keys never waits for another writer);

        * the owner's process identity is recorded with the lease; when ``owner``
          leaves it None the store records :func:`stores.current_process_identity`;
        * a live lease whose holder ran on this host in a process that is gone is
          taken over at once (``stores.dispositions.decide_disposition(holder_gone=True)``);
        * claiming a completed receipt (force refresh, or stale) keeps its output and
          ``completed_at``: failing, releasing or losing that lease restores it as
          ``completed``, and a later normal claim of a lost refresh reuses it;
        * ``generation`` follows :func:`stores.dispositions.next_generation`;
        * a ``running`` receipt whose lease was lost, claimed with
          ``retry_safe=False``, is recorded ``uncertain`` (answer ``UNCERTAIN``);
        * a request naming a ``lease_id`` takes a new lease under that id; one whose
          receipt is already leased under that id to ``owner`` (queued or running: an
          earlier attempt of the same claim that committed) is answered ``CLAIMED`` with
          the receipt as it stands, nothing written (:func:`stores.claims.already_taken`);
        * an ``uncertain`` receipt that kept a previous output (a refresh whose own
          outcome is uncertain) answers a normal or retry_failed claim ``REUSED`` while
          that output is fresh enough (the claim's receipt says ``uncertain``); a forced
          or stale re-run gets ``UNCERTAIN``;
        * with ``capabilities.batch_records``: a receipt taken with its generation kept
          whose ``batch_key`` names a recorded batch request (:meth:`mark_running_many`)
          is taken with every other member of that request in the same transaction
          (each a new lease; members not asked for are answered inside
          ``Claim.members`` only), its answer carrying the record (``Claim.batch``);
          when a member cannot be taken (gone, completed, failed, uncertain, named by
          another request, under another live lease), the members that could are
          recorded ``uncertain`` instead (see :mod:`stores.claims`).

        Raises:
            StoreBusyError: another connection held its lock past ``wait_s`` (nothing
                was claimed).
            StoreUnavailableError: no connection, or it was lost.
            StoreError: any other failure.
        """

    def mark_running_many(
        self,
        org_id: str,
        leases: Sequence[LeaseRef],
        owner: Owner,
        *,
        lease_ttl_s: float | None = None,
        batches: Sequence[BatchRecord] = (),
        wait_s: float | None = None,
    ) -> FenceReport:
        """Move queued (or already running) receipts to ``running``, fenced.

        With ``lease_ttl_s`` the lease is also renewed to now + ``lease_ttl_s`` seconds,
        so a lease that ran out while the call waited for admission (and that nobody
        took) is not left reclaimable while the provider call runs.

        ``batches`` (a store with ``capabilities.batch_records``; others are never given
        any): the requests about to be sent, each over members among ``leases``. In the
        same transaction, a record whose every member was applied is stored (once per
        org and key) and its members' ``batch_key`` set to its key; a record with a
        refused member is not stored at all (the caller forms its request again without
        that member).

        ``wait_s``: as :meth:`claim_many` takes it (StoreBusyError past it).
        """
        op = "running" if lease_ttl_s is None else "running_renew"
        items = lease_items(leases)
        extra: dict[str, Any] = {} if wait_s is None else {"wait_s": wait_s}
        if batches:
            extra["batches"] = batches
        return self._fence(org_id, owner, op, items, {}, ttl_s=lease_ttl_s, **extra)

    def renew_leases(
        self, org_id: str, leases: Sequence[LeaseRef], owner: Owner, *, lease_ttl_s: float
    ) -> FenceReport:
        """Extend held leases to now + ``lease_ttl_s`` seconds, fenced."""
        return self._fence(org_id, owner, "renew", lease_items(leases), {}, ttl_s=lease_ttl_s)

    def complete_many(self, org_id: str, completions: Sequence[Completion], owner: Owner) -> FenceReport:
        """Store outputs and mark receipts completed, fenced.

        A key already completed by another owner is refused with
        ``COMPLETED_BY_OTHER`` and the stored receipt; an output larger than
        :data:`MAX_OUTPUT_BYTES` once serialised is refused for that key alone.
        """
        items, refused = completion_items(completions)
        report = self._fence(org_id, owner, "complete", items, refused, ReceiptStatus.COMPLETED)
        applied = set(report.applied)
        return FenceReport(tuple(c.key for c in completions if c.key in applied), report.refused)

    def fail_many(self, org_id: str, failures: Sequence[Failure], owner: Owner) -> FenceReport:
        """Record failures (error text and kind) and drop the leases, fenced.

        A receipt holding a previous output (a refresh) goes back to ``completed``
        with that output instead; no error is recorded.
        """
        return self._fence(org_id, owner, "fail", failure_items(failures), {}, ReceiptStatus.FAILED)

    def mark_uncertain_many(self, org_id: str, failures: Sequence[Failure], owner: Owner) -> FenceReport:
        """Record ``uncertain`` outcomes (error text, kind of the failure seen), fenced.

        For a tool that is not retry-safe whose request may have reached the provider.
        The lease is dropped; claims answer ``UNCERTAIN`` until :meth:`resolve`. A
        receipt holding a previous output (a refresh) keeps it: ordinary claims still
        reuse it (see :meth:`claim_many`).
        """
        items = failure_items(failures)
        return self._fence(org_id, owner, "uncertain", items, {}, ReceiptStatus.UNCERTAIN)

    def release(
        self, org_id: str, leases: Sequence[LeaseRef], owner: Owner, *, wait_s: float | None = None
    ) -> FenceReport:
        """Give receipts back (status ``pending``, no lease), fenced.

        A receipt holding a previous output (a refresh) goes back to ``completed``.
        ``wait_s``: as :meth:`claim_many` takes it (StoreBusyError past it).
        """
        extra: dict[str, Any] = {} if wait_s is None else {"wait_s": wait_s}
        return self._fence(org_id, owner, "release", lease_items(leases), {}, **extra)

    def _fence(
        self,
        org_id: str,
        owner: Owner,
        op: str,
        items: list[FenceItem],
        refused: dict[str, Refusal],
        idempotent_status: ReceiptStatus | None = None,
        ttl_s: float | None = None,
        batches: Sequence[BatchRecord] = (),
        wait_s: float | None = None,
    ) -> FenceReport:
        """The one statement the six fenced writes above are built on (each backend's own).

        Applies ``op`` (``running``, ``running_renew``, ``renew``, ``complete``, ``fail``,
        ``uncertain``, ``release``) to every item whose lease ``owner`` holds, in one
        transaction; for ``running`` and ``running_renew``, stores in that transaction each
        of ``batches`` whose every member was applied and sets its members' ``batch_key``.
        ``ttl_s``: the new lease lifetime (``running_renew``, ``renew``), seconds.
        ``wait_s``: the longest the transaction waits for another connection's lock,
        seconds (given only with ``capabilities.bounded_waits``; StoreBusyError past it).

        Returns:
            The :class:`FenceReport` in the order of ``items``: keys not applied are added
            to ``refused`` with :func:`stores.fenced.refusal` (which also counts a retried
            write that already landed as applied: the receipt already has
            ``idempotent_status`` under the same lease).

        Raises:
            NotImplementedError: this default; a store either implements it (SQLite,
                Postgres) or overrides each of the six fenced writes instead.
        """
        raise NotImplementedError(
            f"{type(self).__name__} implements neither _fence nor the fenced write {op!r}"
        )

    @abc.abstractmethod
    def resolve(
        self, org_id: str, key: str, action: ResolveAction, *, output: object = None, note: str = ""
    ) -> Receipt | None:
        """Decide an ``uncertain`` receipt (an operator, or a reconcile hook).

        Args:
            org_id: the org.
            key: the receipt key.
            action: ``RERUN`` (claimable again, same generation; no longer bound to
                a recorded batch request), ``FAIL`` (failed, kind permanent) or
                ``COMPLETE`` (stores ``output`` as completed). A refresh that kept a
                previous output is ``completed`` with it again after ``RERUN`` or
                ``FAIL``, no lease left on it.
            output: the output for ``COMPLETE``.
            note: text added to the recorded error for ``FAIL``.

        Returns:
            The receipt as it now stands (unchanged unless it was ``uncertain``), or
            None when there is none.

        Raises:
            InvalidOutputError / OutputNotStorableError: ``COMPLETE`` with an output
                the store cannot hold (nothing changes).
        """

    @abc.abstractmethod
    def purge_epoch(self) -> int:
        """How many purges have deleted receipts in this store, ever (a point read).

        An in-process memo compares it with the value it last saw and drops what it
        holds when it changed, so a purge by any process is noticed.
        """

    @abc.abstractmethod
    def get_many(self, org_id: str, keys: Sequence[str]) -> list[Receipt | None]:
        """Read receipts: list of Receipt or None, same order as ``keys``."""

    @abc.abstractmethod
    def purge(
        self,
        *,
        older_than_s: float = 0.0,
        statuses: Iterable[ReceiptStatus] | None = None,
        org_id: str | None = None,
    ) -> int:
        """Delete receipts (with their outputs) last updated more than ``older_than_s`` ago.

        Args:
            older_than_s: minimum age in seconds since ``updated_at``.
            statuses: which statuses to delete; default completed, failed, pending
                and skipped. Receipts under a live lease are never deleted.
            org_id: limit to one org (default every org).

        Returns:
            The number of receipts deleted. When it is not 0, :meth:`purge_epoch`
            grows by one in the same transaction. Batch records older than
            ``older_than_s`` that no receipt still needs (none whose next claim keeps
            its generation names them) are deleted too (not counted).
        """

    def read_settled(
        self,
        org_id: str,
        requests: Sequence[ClaimRequest],
        *,
        mode: ClaimMode = ClaimMode.NORMAL,
        stale_after_s: float | None = None,
    ) -> tuple[dict[str, Claim], list[ClaimRequest]]:
        """Answer from one plain read (no lock, no write) the claims it settles.

        Args:
            org_id: the org.
            requests: one per key (unique keys).
            mode / stale_after_s: as :meth:`claim_many`.

        Returns:
            (key -> Claim answered ``REUSED``, ``FAILED`` or ``UNCERTAIN`` exactly as
            :meth:`claim_many` would at the read's instant, the other requests in order).
            Nothing is written: a caller claims the rest. A forced refresh settles nothing.

        Raises:
            StoreError: the read failed.

        This default reads with :meth:`get_many` and judges by :attr:`clock`; a store
        whose clock is its server's (Postgres) overrides it.
        """
        from stores.claims import settled_by_read

        if mode is ClaimMode.FORCE_REFRESH or not requests:
            return {}, list(requests)
        found = self.get_many(org_id, [r.key for r in requests])
        existing = {r.key: receipt for r, receipt in zip(requests, found) if receipt is not None}  # noqa: B905
        if not existing:
            return {}, list(requests)
        return settled_by_read(requests, existing, self.clock(), mode, stale_after_s)

    def read_reusable(
        self, org_id: str, keys: Sequence[str], *, stale_after_s: float | None = None
    ) -> dict[str, tuple[str, str, Money | None]]:
        """The stored outputs a normal claim of ``keys`` would reuse, by one plain read.

        Args:
            org_id: the org.
            keys: receipt keys.
            stale_after_s: as :meth:`claim_many` (older completions are not returned).

        Returns:
            key -> (input hash, output text as :func:`stores.codec.encode_output` writes
            it, what the call cost when it was paid: ``Receipt.cost``) for every
            ``completed`` receipt fresh enough; other keys are absent (a
            caller claims them). Nothing is written. A store that reads the text directly
            may return a text that does not decode (changed by hand): its caller decodes
            and leaves such a key to a claim, which reports it for that call alone.

        Raises:
            StoreError: the read failed. It runs on a caller's thread, inside
                ``execute()``: it must not wait behind a write, another connection's lock
                or a busy connection pool; it answers within about
                :data:`PLAIN_READ_WAIT_S`, or raises (StoreUnavailableError when it would
                have had to wait).

        This default goes through :meth:`read_settled`; a store may read the text directly.
        """
        from stores.codec import UnreadableOutput, encode_output

        requests = [ClaimRequest(key, "", "", "") for key in dict.fromkeys(keys)]
        answers, _ = self.read_settled(org_id, requests, stale_after_s=stale_after_s)
        return {
            key: (claim.receipt.input_hash, encode_output(claim.receipt.output), claim.receipt.cost)
            for key, claim in answers.items()
            if claim.disposition is ClaimDisposition.REUSED
            and claim.receipt.status is ReceiptStatus.COMPLETED
            and type(claim.receipt.output) is not UnreadableOutput  # its claim reports it
        }

    def read_completed_since(
        self,
        org_id: str,
        tool_id: str,
        *,
        after: tuple[float, str] | None,
        keys: Sequence[str] = (),
        limit: int,
        max_bytes: int,
    ) -> list[tuple[str, str, str, float, Money | None]] | None:
        """A page of the ``completed`` receipts of ``tool_id`` a normal claim would reuse
        (``stale_after_s`` aside), in the order of their last update: the receipts a rerun
        will ask for next, read ahead of its calls (:mod:`actors.queue.read_ahead`).

        Args:
            org_id, tool_id: whose receipts.
            after: the last (update time, key) of the previous page; None: the first page,
                starting at the earliest update time among ``keys`` (receipts a rerun's
                first calls found).
            limit: most rows.
            max_bytes: the page ends with the row whose output text reaches this size,
                added up over the page (at least one row).

        Returns:
            (key, input hash, output text, update time, cost) per receipt, at most ``limit``;
            ``[]`` at the end; None when this store does not read ahead (this default).

        Raises:
            StoreError: the read failed; like :meth:`read_reusable`, it does not wait
                behind a lock (``stop()`` waits for the reader).
        """
        return None

    def change_feed(self) -> ChangeFeed | None:
        """What tells waiters on other owners' receipts that something changed, if anything.

        A store that can hear other workers' writes (Postgres: LISTEN/NOTIFY) returns its
        feed, started; it never blocks (the feed connects in the background). None (this
        default, and SQLite): nothing is heard, waiters poll; a same-process completion is
        known to its dispatch system without the store. Either way polling stays the
        fallback, since a lease that simply expires sends nothing.
        """
        return None

    def write_together(self, calls: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[Outcome]:
        """Run fenced writes (``(method name, args, kwargs)``, names in :data:`FENCED_WRITES`).

        Returns:
            per call, in order, ``(value, None)`` or ``(None, error)``: the value or the
            error that call alone would have had.

        Raises:
            ValueError: a method not in :data:`FENCED_WRITES` (nothing is run).

        This default runs each call on its own, in order; a store with
        ``capabilities.group_commit`` runs them in one transaction (SQLite).
        """
        writes: dict[str, Callable[..., Any]] = {
            "mark_running_many": self.mark_running_many,
            "renew_leases": self.renew_leases,
            "complete_many": self.complete_many,
            "fail_many": self.fail_many,
            "mark_uncertain_many": self.mark_uncertain_many,
            "release": self.release,
        }
        for method, _, _ in calls:
            if method not in writes:
                raise ValueError(f"write_together takes fenced writes only, not {method!r}")
        outcomes: list[Outcome] = []
        for method, args, kwargs in calls:
            try:
                outcomes.append((writes[method](*args, **kwargs), None))
            except Exception as exc:
                outcomes.append((None, exc))
        return outcomes

    def renewal_handle(self) -> ReceiptStore:
        """A handle for renewing leases from one native OS thread (the lease renewer).

        Called on that thread; the renewer calls only :meth:`renew_leases` on it and
        closes it when it ends (unless it is ``self``). It must not need a gevent hub:
        a tool that never yields starves the hub, and renewals must go on regardless.
        The default is ``self``, for a store whose methods are thread-safe and never
        wait for a hub; SQLite opens its own connection on the calling thread, Postgres
        its own connection.
        """
        return self

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Further calls raise :class:`~stores.errors.StoreError`."""

    def __enter__(self) -> ReceiptStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
