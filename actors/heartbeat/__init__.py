"""The heartbeat: renews the leases of running receipts."""
