"""What runs on the worker pool: one attempt of a provider call and the last check before it is sent."""

from actors.worker.attempt import attempt, split_members
from actors.worker.launch import Launch

__all__ = [
    "Launch",
    "attempt",
    "split_members",
]
