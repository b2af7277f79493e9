"""Open the pacer a ``--pacer`` option or ``TOOLDISPATCH_PACER`` names (a URL).

Imports both pacers (:mod:`actors.pacing.pacers`, :mod:`actors.pacing.redis_pacer`), which
import neither this module nor each other's opener. redis-py itself is imported only when a
:class:`~actors.pacing.redis_pacer.RedisPacer` is made, after gevent patched the sockets.
"""

from __future__ import annotations

import importlib.util
import urllib.parse
from collections.abc import Mapping
from typing import Any

from actors.errors import DispatchError
from actors.pacing.pacers import LocalPacer, Pacer
from actors.pacing.redis_pacer import DEFAULT_PREFIX, RedisPacer
from actors.pacing.values import PacerSettings, ProviderLimits

__all__ = ["MAX_TIMEOUT_S", "InvalidPacerURLError", "open_pacer"]


class InvalidPacerURLError(DispatchError, ValueError):
    """A ``--pacer`` / ``TOOLDISPATCH_PACER`` value is not a pacer URL this version knows."""


MAX_TIMEOUT_S = 60.0
"""The longest Redis connect or read timeout a pacer URL may set, seconds (each call may
wait that long while Redis is away)."""


def open_pacer(
    url: str | None,
    limits: Mapping[str, ProviderLimits] | None = None,
    settings: PacerSettings | None = None,
) -> Pacer:
    """The pacer a ``--pacer`` option (or ``TOOLDISPATCH_PACER``) names.

    ``None``, ``""`` or ``local``: a :class:`~actors.pacing.pacers.LocalPacer`.
    ``redis://[:password@]host[:port][/db]`` (or ``rediss://``, ``unix://``): a shared
    :class:`~actors.pacing.redis_pacer.RedisPacer`; query parameters:
    ``prefix`` (key prefix, default ``tooldispatch:pacer``; keys are
    ``PREFIX:{org/provider}:...``, so a trailing ``:`` is the separator already and is
    dropped; an empty prefix is refused), ``workers`` (how many workers to assume
    sharing a bucket when Redis is away and none was seen, default 4),
    ``connect_timeout`` / ``timeout`` (seconds, default 0.25 / 0.5). Other query
    parameters are handed to redis-py.

    Raises:
        InvalidPacerURLError: another scheme, a bad value, or redis-py not installed.
    """
    if not url or url.strip() == "local":
        return LocalPacer(limits, settings)
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise InvalidPacerURLError(
            f"--pacer {url!r}: expected 'local' or a redis://host:port/db URL (also rediss://, unix://)"
        )
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    ours: dict[str, Any] = {}
    try:
        for name, key, kind in (
            ("prefix", "prefix", str),
            ("workers", "expected_workers", int),
            ("connect_timeout", "connect_timeout_s", float),
            ("timeout", "timeout_s", float),
        ):
            if name in query:
                ours[key] = kind(query.pop(name))
    except ValueError as exc:
        raise InvalidPacerURLError(f"--pacer {url!r}: {exc}") from None
    if "prefix" in ours:
        ours["prefix"] = ours["prefix"].rstrip(":")
        if not ours["prefix"]:
            raise InvalidPacerURLError(
                f"--pacer {url!r}: prefix must not be empty (default {DEFAULT_PREFIX})"
            )
    if ours.get("expected_workers", 1) < 1:
        raise InvalidPacerURLError(f"--pacer {url!r}: workers must be at least 1")
    for name in ("connect_timeout_s", "timeout_s"):  # NaN, inf, 1e300, -1: refused here, not per call
        value = ours.get(name)
        if value is not None and not (0 < value <= MAX_TIMEOUT_S):
            option = name.removesuffix("_s")
            raise InvalidPacerURLError(
                f"--pacer {url!r}: {option} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]"
            )
    rest = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    if importlib.util.find_spec("redis") is None:  # found, not imported: gevent may patch later
        raise InvalidPacerURLError(
            f"--pacer {url!r}: a shared pacer needs redis-py (not installed): "
            "pip install 'tooldispatch[redis]'"
        )
    return RedisPacer(rest, limits, settings, **ours)
