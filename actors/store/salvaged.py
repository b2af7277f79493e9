"""Salvage first: a claim never judges a receipt whose paid output waits in the salvage file.

A run that ends during an outage of the store (an abort, a stop whose bound runs out)
salvages the outputs it could not write, and their receipts stay ``running`` under its
lease. When the lease expires, a claim would judge such a receipt lost: run again (a
retry-safe tool, paid twice) or ``uncertain`` (the caller meets UncertainOutcomeError).
So before the receipt store actor runs a claim of a key the salvage file holds an output
for, it replays the file (:meth:`actors.flusher.salvage.SalvageLog.replay`): the
salvaged receipts are completed (fenced by the lease they were salvaged under, as the
entries record it) and the claim then reuses them.

Which keys the file holds is a ``stat`` away (the file is read again only when it
changed), so appends by another system or process sharing the file are seen at the next
claim. A replay that meets an outage of the store fails the claim with it, and the
claim's outage retries apply (:mod:`actors.store.outage`): the next attempt replays
first again; any other error of the store fails the claim too (it never goes on past a
replay that did not happen). A file that cannot be read, or is not a salvage file, is
logged and claims go on as they would without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from actors.messages import ClaimReceipts
from actors.runtime.actor import log
from stores.base import ReceiptStore
from stores.errors import ToolDispatchError

__all__ = ["SalvageFile", "SalvageFirst"]


class SalvageFile(Protocol):
    """What salvage first needs of a salvage file (:class:`actors.flusher.SalvageLog`)."""

    path: str

    def salvaged(self, org_id: str, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` the file holds a replayable output for."""

    def replay(self, store: ReceiptStore) -> Any:
        """Put the file's outputs into ``store``."""


class SalvageFirst:
    """Replays ``salvage`` into ``store`` before a claim of a key it holds (see the
    module doc). Runs on the receipt store actor's thread.

    Args:
        salvage: the system's salvage file.
        store: the receipt store (the store actor's own handle).
    """

    def __init__(self, salvage: SalvageFile, store: ReceiptStore) -> None:
        self.salvage = salvage
        self.store = store

    def before(self, claim: ClaimReceipts) -> None:
        """Replay the file when it holds an output for a key ``claim`` asks for.

        Raises:
            StoreUnavailableError: the replay met an outage of the store (the claim is
                tried again by its outage retries, or answered with it).
            Exception: any other error the store raised in the replay (the claim's answer).
        """
        try:
            held = self.salvage.salvaged(claim.org_id, [request.key for request in claim.requests])
        except OSError:
            log.exception("the salvage file %s cannot be read; claims go on without it", self.salvage.path)
            return
        if not held:
            return
        try:
            report = self.salvage.replay(self.store)
        except (OSError, ValueError) as exc:  # the file: unreadable, or not a salvage file
            if isinstance(exc, ToolDispatchError):  # the store's own (an output error is a ValueError)
                raise
            log.exception(
                "the salvage file %s cannot be replayed; claims go on without it", self.salvage.path
            )
            return
        log.info("replayed the salvage file %s before a claim: %s", self.salvage.path, report)
