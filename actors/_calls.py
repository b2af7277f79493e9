"""Calls, groups and units: what flows from the front door through a drain."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from stores.types import ClaimMode, LeaseRef, Receipt

from .tool import Tool

__all__ = ["Call", "Group", "Unit", "strongest_mode"]

_MODE_RANK = {ClaimMode.NORMAL: 0, ClaimMode.RETRY_FAILED: 1, ClaimMode.FORCE_REFRESH: 2}


def strongest_mode(modes: Iterable[ClaimMode]) -> ClaimMode:
    """force_refresh beats retry_failed beats normal."""
    return max(modes, key=_MODE_RANK.__getitem__)


@attrs.define(eq=False)
class Call:
    """One ``execute`` from the host, with its reply future."""

    tool: Tool
    input: Any
    key: str
    input_hash: str
    credential_digest: str
    mode: ClaimMode
    stale_after_s: float | None
    timeout_s: float
    future: Any
    submitted_at: float
    requeued: bool = False


@attrs.define(eq=False)
class Group:
    """Calls sharing one receipt key: the owner, same-drain followers, and calls that
    attached while it was in flight."""

    owner: Call
    followers: list[Call] = attrs.field(factory=list)
    attached: list[Call] = attrs.field(factory=list)
    receipt: Receipt | None = None
    """The claimed receipt (durable tools), set by the drain."""
    key: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.key = self.owner.key

    @property
    def calls(self) -> list[Call]:
        """Owner and followers (not the attached calls)."""
        return [self.owner, *self.followers] if self.followers else [self.owner]

    @property
    def mode(self) -> ClaimMode:
        if not self.followers:
            return self.owner.mode
        return strongest_mode(c.mode for c in self.calls)

    @property
    def lease(self) -> LeaseRef | None:
        receipt = self.receipt
        if receipt is None or receipt.lease_id is None:
            return None
        return LeaseRef(receipt.key, receipt.lease_id)


@attrs.define(eq=False)
class Unit:
    """One provider call: a single group, or the members of one compiled batch."""

    groups: list[Group]
    readmissions: int = 0
    """Times re-admitted after a 429."""
    timeout_s: float = attrs.field(init=False)
    """The smallest per-call timeout of the unit's calls (fixed at compile time)."""

    def __attrs_post_init__(self) -> None:
        self.timeout_s = min(c.timeout_s for g in self.groups for c in g.calls)
