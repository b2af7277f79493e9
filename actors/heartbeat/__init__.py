"""The heartbeat: renews the leases of running receipts."""

from actors.heartbeat.actor import HeartbeatActor
from actors.heartbeat.deferred_beats import MAX_DEFER_S, DeferredBeats
from actors.heartbeat.lease_set import LeaseSet, Renewal
from actors.heartbeat.renewer import LeasesRefused, RenewalFailed, Renewer, hub_caller, native

__all__ = [
    "MAX_DEFER_S",
    "DeferredBeats",
    "HeartbeatActor",
    "LeaseSet",
    "LeasesRefused",
    "Renewal",
    "RenewalFailed",
    "Renewer",
    "hub_caller",
    "native",
]
