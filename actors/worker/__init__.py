"""What runs on the worker pool: one attempt of a provider call, the last check before it is
sent, and what its answers cost."""

from actors.worker.attempt import attempt, split_members
from actors.worker.launch import Launch

__all__ = [
    "Launch",
    "attempt",
    "split_members",
]
