"""Leases this process may still hold after a store write failed: given back, retried.

Two writes can fail and leave a receipt leased to this process with nobody running it:

* a **release** that raised (a store hiccup): the receipt stays ``queued`` under our lease
  until the lease lapses, so every later call of that key, here or in another worker,
  waits out the lease (minutes) for nothing;
* a **claim** that committed and then raised (the connection dropped after COMMIT): the
  callers were told the claim failed, yet the store holds receipts leased to us.

:class:`Cleanup` retries the first (the same fenced release, on :data:`CLEANUP_RETRY_S`);
for the second it reads the keys back (a plain read) and releases, fenced by their lease
ids, those leased to this owner *in this process* (same run, attempt, host and pid: two
workers started with the same run id never release each other's leases) that no live
group of this tool holds (a lease id never repeats, so a later claim of the same key is
never released by mistake). Each attempt
that fails is retried on the same ladder, then given up with a log line and the
``lease_cleanup_failed`` counter: the lease then lapses at its TTL as before.
Callers are answered at the first failure; nobody waits on the cleanup, so each of its
requests rides out an outage of the store for up to the lease TTL (after which the lease
has lapsed anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs

from actors.lifecycle.shared import Parts, Shared
from actors.messages import CleanupDue
from stores.process import current_process_identity
from stores.types import LeaseRef, Owner, Receipt, ReceiptStatus

__all__ = ["CLEANUP_RETRY_S", "Cleanup", "owner_here"]

log = logging.getLogger("tooldispatch")

CLEANUP_RETRY_S = (1.0, 3.0, 9.0)
"""Delays before each new attempt of a failed release or orphan read (seconds); then give up."""


class Cleanup:
    """Releases answered, failed releases retried, orphaned claims found and given back
    (a part of :class:`actors.lifecycle.machine.Lifecycle`; runs on its owner's thread)."""

    def __init__(self, s: Shared, p: Parts) -> None:
        self.s = s
        self.p = p
        self.tool = s.tool
        self.policy = s.policy
        self.fx = s.fx

    def on_released(self, batch: int, now: float, error: BaseException | None = None) -> None:
        """The store released receipts, or could not: the callers are answered either
        way; a failed release is tried again later (see the module doc)."""
        retry = self.s.cleanups.pop(batch, None)
        if retry is not None:
            if error is not None:
                self._again(retry.keys, retry.leases, retry.attempt, error)
            return
        found = self.s.batches.pop(batch, [])
        for group, err, _ in found:
            self.p.exits.released(group, err)
        if error is not None and found:
            self._again((), tuple(lease for _, _, lease in found), 0, error)

    def claim_failed(self, keys: Sequence[str]) -> None:
        """A claim raised: it may have committed. Look for leases it left us holding."""
        if self.s.owner is not None and self.tool.durable and keys:
            self._cleanup(tuple(keys), (), 0)

    def on_cleanup_due(
        self, keys: Sequence[str], leases: Sequence[LeaseRef], attempt: int, now: float
    ) -> None:
        """Timer: try a failed release (``leases``) or orphan read (``keys``) again."""
        self._cleanup(tuple(keys), tuple(leases), attempt)

    def on_read(
        self, batch: int, receipts: list[Any] | None, error: BaseException | None, now: float
    ) -> None:
        """A read answered: a cleanup's read-back here, a poll's in :meth:`Claims.on_read`."""
        retry = self.s.cleanups.pop(batch, None)
        if retry is None:
            self.p.claims.on_read(batch, receipts, error, now)
            return
        # the read-back of a failed claim's keys: release what is leased to us, unheld
        if error is not None or receipts is None:
            self._again(retry.keys, (), retry.attempt, error)
            return
        owner = self.s.owner
        if owner is None:
            return
        held = {g.receipt.lease_id for g in self.s.groups.values() if g.receipt is not None}
        orphans = [
            LeaseRef(r.key, r.lease_id)
            for r in receipts
            if isinstance(r, Receipt)
            and r.lease_id is not None
            and r.lease_id not in held
            and r.status in (ReceiptStatus.QUEUED, ReceiptStatus.RUNNING)
            and r.owner == owner
            and (r.lease_owner_host, r.lease_owner_pid) == (owner.host, owner.pid)
        ]
        if orphans:
            self.fx.count("orphan_leases_released", len(orphans))
            self._cleanup((), tuple(orphans), 0)

    def _cleanup(self, keys: tuple[str, ...], leases: tuple[LeaseRef, ...], attempt: int) -> None:
        batch = next(self.s.ids)
        self.s.cleanups[batch] = _Retry(keys, leases, attempt)
        patience = self.tool.lease_ttl_s or self.policy.lease_ttl_s
        if leases:
            self.fx.release_receipts(batch, list(leases), patience)
        else:
            self.fx.read(batch, list(keys), patience)

    def _again(
        self, keys: tuple[str, ...], leases: tuple[LeaseRef, ...], attempt: int, error: BaseException | None
    ) -> None:
        if attempt >= len(CLEANUP_RETRY_S):
            what = f"{len(leases)} leases" if leases else f"a failed claim's {len(keys)} receipts"
            log.warning("giving up releasing %s (they lapse at their lease TTL): %s", what, error)
            self.fx.count("lease_cleanup_failed", len(leases) or len(keys))
            return
        self.fx.later(CLEANUP_RETRY_S[attempt], CleanupDue(keys=keys, leases=leases, attempt=attempt + 1))


class _Retry:
    """A cleanup request in flight: what it carries and which attempt it is."""

    __slots__ = ("attempt", "keys", "leases")

    def __init__(self, keys: tuple[str, ...], leases: tuple[LeaseRef, ...], attempt: int) -> None:
        self.keys, self.leases, self.attempt = keys, leases, attempt


def owner_here(owner: Owner) -> Owner | None:
    """``owner`` with this process's identity, as the store records it on a claim (None
    when the OS does not tell: leases a failed claim left are then not looked for)."""
    if owner.pid is not None:
        return owner
    try:
        me = current_process_identity()
    except Exception:
        return None
    return attrs.evolve(owner, host=me.host, pid=me.pid, started_at=me.started_at)
