"""The receipt store actor: the owner of the store inside a dispatch system, its lanes and watches."""

from actors.store.actor import Lanes, ReceiptStoreActor
from actors.store.client import StoreClient
from actors.store.merge import Merged, answer, mergeable
from actors.store.purge_watch import PURGE_POLL_S, PurgeWatcher
from actors.store.salvaged import SalvageFile, SalvageFirst
from actors.store.watch import ReceiptWatch

__all__ = [
    "PURGE_POLL_S",
    "Lanes",
    "Merged",
    "PurgeWatcher",
    "ReceiptStoreActor",
    "ReceiptWatch",
    "SalvageFile",
    "SalvageFirst",
    "StoreClient",
    "answer",
    "mergeable",
]
