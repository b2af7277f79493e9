"""How another actor asks the receipt store actor and waits for the answer.

Only the completion flusher waits on store answers (the receipt store actor never waits
on any actor, so waiting on it cannot deadlock); tool queue actors send store commands
whose replies come back as messages (:mod:`actors.queue.ports`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.messages import CompleteReceipts, ReadReceipts
from actors.runtime.futures import LightFuture, new_future
from stores.types import Completion, Owner

__all__ = ["StoreClient"]


class StoreClient:
    """Sends store commands to the receipt store actor; each method returns the reply's
    future (``get()`` it for the store's value; the store's error is raised there).

    Args:
        ref: the ReceiptStoreActor ref.

    Raises (each method):
        pykka.ActorDeadError: the store actor has stopped.
    """

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def complete(self, org_id: str, completions: Sequence[Completion], owner: Owner) -> LightFuture:
        """:class:`~actors.messages.CompleteReceipts`; the future's value is a FenceReport."""
        reply = new_future()
        self.ref.tell(CompleteReceipts(org_id=org_id, completions=completions, owner=owner, reply=reply))
        return reply

    def read(self, org_id: str, keys: Sequence[str]) -> LightFuture:
        """:class:`~actors.messages.ReadReceipts`; the future's value is a list of Receipt
        or None, in key order."""
        reply = new_future()
        self.ref.tell(ReadReceipts(org_id=org_id, keys=keys, reply=reply))
        return reply
