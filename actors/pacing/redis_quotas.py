"""The quota state in Redis: the script ``quotas.lua`` (:data:`QUOTA_SCRIPT`), its
arguments (:func:`quota_args`) and replies (:func:`parse_quota_reply`), as
:class:`~actors.pacing.redis_pacer.RedisPacer` runs them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from importlib import resources

from actors.pacing.quotas import (
    Announce,
    Correct,
    GiveBack,
    QuotaOp,
    QuotaRead,
    TakeUnits,
    UnitsTaken,
    announced_limit,
    limit_key,
    request_units,
)
from actors.tool import Limit

__all__ = ["QUOTA_SCRIPT", "parse_quota_reply", "quota_args", "quota_ttl_ms"]

QUOTA_SCRIPT = resources.files("actors.pacing").joinpath("quotas.lua").read_text(encoding="utf-8")
"""The Lua script of the quota state (``actors/pacing/quotas.lua``, package data; its
header documents the keys and arguments)."""


def quota_ttl_ms(limits: Sequence[Limit], state_ttl_s: float) -> int:
    """The quota hash's TTL: ``state_ttl_s`` past the last write, at least two of the
    longest window (a day's quota outlives an idle hour)."""
    longest = max((lim.window_s for lim in limits), default=0.0)
    return math.ceil(max(state_ttl_s, 2 * longest) * 1000)


def quota_args(op: QuotaOp, limits: Sequence[Limit], ttl_ms: int) -> list[str] | None:
    """The script's ARGV for ``op`` under ``limits`` (None: nothing to run, an
    announcement no limit counts).

    Raises:
        TypeError: ``op`` is not a quota operation.
    """
    head = [str(ttl_ms), str(len(limits))]
    for lim in limits:
        burst = -1.0 if lim.burst is None else float(lim.burst)
        head += ["1" if lim.is_rate else "0", repr(float(lim.amount)), repr(lim.window_s), repr(burst)]
        head.append(limit_key(lim))
    if isinstance(op, TakeUnits):
        own = ["take", str(len(op.requests))]
        own += [repr(request_units(lim, r)) for r in op.requests for lim in limits]
    elif isinstance(op, GiveBack):
        own = ["giveback", repr(float(op.age_s))]
        own += [repr(float(op.units.get(lim.unit, 0.0))) for lim in limits]
    elif isinstance(op, Correct):
        own = ["correct", repr(float(op.age_s))]
        own += [repr(float(op.delta.get(lim.unit, 0.0))) for lim in limits]
    elif isinstance(op, Announce):
        i = announced_limit(op, limits)
        if i is None:
            return None
        own = ["announce", str(i + 1), repr(float(op.remaining)), repr(float(op.reset_s))]
        own += [repr(float(op.sent_ago_s))]
    else:
        raise TypeError(f"not a quota operation: {op!r}")
    return [own[0], *head, *own[1:]]


def parse_quota_reply(op: QuotaOp, reply: Sequence[str], n_limits: int) -> QuotaRead:
    """The script's reply as the value :meth:`~actors.pacing.pacers.Pacer.apply_quota`
    returns (its first item, the server's time, is left out)."""
    room = tuple(float(x) for x in reply[1 : 1 + n_limits])
    if isinstance(op, TakeUnits):
        rest = reply[1 + n_limits :]
        return UnitsTaken(
            room=room, granted=int(rest[0]), wait_s=float(rest[1]), limit=int(rest[2]), reset_s=float(rest[3])
        )
    return QuotaRead(room=room)
