"""Limits a provider announces in its answers: the standard and common rate-limit fields.

Read (by :func:`parse_rate_limit_headers`) from any answer, refusals (429) included:

* the IETF fields (draft-ietf-httpapi-ratelimit-headers, -08 to -12, the current form):
  ``RateLimit-Policy: "permin";q=50;w=60`` (each policy's quota ``q``, window ``w``
  seconds, quota unit ``qu``) and ``RateLimit: "permin";r=12;t=41`` (``r``: quota units
  remaining, ``t``: seconds until quota is made available), joined by policy name;
* the earlier drafts' forms (-00 to -07): ``RateLimit-Limit`` / ``-Remaining`` /
  ``-Reset`` (``RateLimit-Limit: 100, 100;w=60`` lists policies after the limit),
  ``RateLimit-Policy: 100;w=60`` and -07's ``RateLimit: limit=100, remaining=50,
  reset=30``;
* Anthropic's ``anthropic-ratelimit-requests-limit`` / ``-remaining`` / ``-reset`` (an
  RFC 3339 time) and their ``-tokens``, ``-input-tokens``, ``-output-tokens`` twins;
* the LLM APIs' (OpenAI's) ``x-ratelimit-limit-requests`` / ``-remaining-requests`` /
  ``-reset-requests`` and their ``-tokens`` twins (durations such as ``6m0s``, ``20ms``);
  Kong's ``X-RateLimit-Limit-Minute`` / ``-Remaining-Minute`` (and ``-Second``, ``-Hour``,
  ``-Day``, ``-Month``, ``-Year``);
* the common ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (reset as delta seconds
  or epoch seconds) and ``X-Rate-Limit-*``.

**A window not stated is inferred.** The IETF forms state it (``w``), and Kong's names
do; for the others:

* ``X-RateLimit-*`` and ``RateLimit-*`` without a policy: the shortest of 1 s, 1 min,
  1 h, 1 day that the reset fits in (a reset of 1 s or less: a per-second limit; 37 s: a
  per-minute one). One answer may mislead (a per-minute window answered in its last
  second): such a window is marked inferred (``window_stated=False``), and the governor
  trusts an inferred window of a second only once a later answer confirms it, and keeps
  the longest window seen for the same limit;
* OpenAI's and Anthropic's fields: 1 min (their limits are per minute; the reset there is
  the time until the bucket is full again, far below the window), or, for a reset
  longer than that, the shortest of 1 h, 1 day it fits in.

When several families state the same limit (the same unit and quota, or the same unit
and window, even when their quotas disagree), the most explicit one is kept, in the order
above: one answer yields one announcement per limit. Malformed fields are ignored, as the IETF draft requires
("Malformed RateLimit header fields MUST be ignored", section "Client Behavior"):
:func:`parse_rate_limit_headers` never raises.
"""

from __future__ import annotations

import base64
import calendar
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

__all__ = ["Announcement", "parse_rate_limit_headers"]


@attrs.frozen(kw_only=True)
class Announcement:
    """One limit as a provider's answer stated it; any part it did not state is None.

    Attributes:
        unit: what the limit counts: ``"requests"``, ``"tokens"`` or the provider's own
            quota unit (IETF ``qu``).
        limit: units allowed per window.
        window_s: the window's length, seconds.
        remaining: units left in the current window when the provider answered.
        reset_s: seconds from the answer until the window resets (full again).
        name: the policy's name (IETF), else ``""``.
        window_stated: whether the answer stated ``window_s`` (IETF ``w``, Kong's names);
            False when it was inferred from the reset, which one answer may mislead.
    """

    unit: str = "requests"
    limit: float | None = None
    window_s: float | None = None
    remaining: float | None = None
    reset_s: float | None = None
    name: str = ""
    window_stated: bool = True


_STANDARD_WINDOWS_S = (1.0, 60.0, 3600.0, 86400.0)
_PER_MINUTE_FAMILIES_WINDOWS_S = (60.0, 3600.0, 86400.0)
_KONG_WINDOWS_S = {
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "month": 30 * 86400.0,
    "year": 365 * 86400.0,
}
_EPOCH_FROM = 1e9
"""A reset at or above this is epoch seconds (2001-09-09 on), not a delay."""
_EPOCH_MS_FROM = 1e12
"""...and at or above this, epoch milliseconds."""


def parse_rate_limit_headers(headers: Any, now_wall: float) -> list[Announcement]:
    """The limits an answer's header fields announce (see the module's docstring).

    Args:
        headers: the answer's fields: a mapping of name to value (``httpx.Headers``, a
            ``dict`` in any case; repeated fields as ``httpx.Headers`` keeps them) or an
            iterable of (name, value) pairs.
        now_wall: the time the answer came, epoch seconds (``time.time()``): resets stated
            as a time (epoch seconds, RFC 3339) are made delays from it.

    Returns:
        One :class:`Announcement` per limit stated, the most explicit form first; empty
        when none is (or all are malformed). Never raises.
    """
    try:
        fields = _fields(headers)
    except Exception:
        return []
    if not isinstance(now_wall, (int, float)) or not math.isfinite(now_wall):
        now_wall = 0.0
    found: list[Announcement] = []
    for family in (_ietf, _ietf_older, _anthropic, _llm_and_kong, _x_ratelimit):
        try:
            stated = family(fields, float(now_wall))
        except Exception:  # a family's fields are malformed: ignored, the others still read
            continue
        earlier = list(found)
        found += [a for a in stated if _sane(a) and not any(_restates(a, kept) for kept in earlier)]
    return found


# -- the families --------------------------------------------------------------------


def _ietf(fields: dict[str, str], now_wall: float) -> list[Announcement]:
    """The current draft: named policies in ``RateLimit-Policy``, their state in ``RateLimit``."""
    policies: dict[str, dict[str, Any]] = {}
    for value, params in _sf_list(fields.get("ratelimit-policy")) or []:
        name = _name(value)
        if name is not None and "q" in params:
            policies.setdefault(name, params)
    states: dict[str, dict[str, Any]] = {}
    for value, params in _sf_list(fields.get("ratelimit")) or []:
        name = _name(value)
        if name is not None and "r" in params:
            states.setdefault(name, params)
    found = []
    for name in [*policies, *(n for n in states if n not in policies)]:
        policy, state = policies.get(name, {}), states.get(name, {})
        unit = policy.get("qu", "requests")
        found.append(
            Announcement(
                unit=str(unit) if isinstance(unit, str) and unit else "requests",
                limit=_count(policy.get("q")),
                window_s=_positive(policy.get("w")),
                remaining=_count(state.get("r")),
                reset_s=_count(state.get("t")),
                name=name,
            )
        )
    return found


def _ietf_older(fields: dict[str, str], now_wall: float) -> list[Announcement]:
    """Drafts -00 to -07: ``RateLimit-Limit/-Remaining/-Reset``, unnamed policies
    (``100;w=60``) in ``RateLimit-Policy`` or after the limit, -07's dictionary."""
    legacy = _sf_dict(fields.get("ratelimit")) or {}
    limit_items = _sf_list(fields.get("ratelimit-limit")) or []
    limit = _count(limit_items[0][0]) if limit_items else _count(legacy.get("limit"))
    remaining = _first_count(fields.get("ratelimit-remaining"))
    if remaining is None:
        remaining = _count(legacy.get("remaining"))
    reset = _reset(fields.get("ratelimit-reset"), now_wall)
    if reset is None:
        reset = _count(legacy.get("reset"))
    policies = [
        (quota, _positive(params.get("w")))
        for value, params in [*limit_items[1:], *(_sf_list(fields.get("ratelimit-policy")) or [])]
        if (quota := _count(value)) is not None
    ]
    found = []
    if limit is not None or remaining is not None:
        window = next((w for q, w in policies if q == limit and w is not None), None)
        found.append(
            Announcement(
                limit=limit,
                window_s=window or _infer(reset),
                remaining=remaining,
                reset_s=reset,
                window_stated=window is not None,
            )
        )
    found += [Announcement(limit=q, window_s=w) for q, w in policies if q != limit]
    return found


def _anthropic(fields: dict[str, str], now_wall: float) -> list[Announcement]:
    """``anthropic-ratelimit-<unit>-limit/-remaining/-reset`` (reset: RFC 3339)."""
    found = []
    for unit in _units(fields, r"anthropic-ratelimit-([a-z-]+)-(?:limit|remaining|reset)"):
        prefix = f"anthropic-ratelimit-{unit}"
        reset = _reset(fields.get(f"{prefix}-reset"), now_wall)
        found.append(
            Announcement(
                unit=unit.replace("-", "_"),
                limit=_first_count(fields.get(f"{prefix}-limit")),
                window_s=_infer_per_minute(reset),
                remaining=_first_count(fields.get(f"{prefix}-remaining")),
                reset_s=reset,
                window_stated=False,
            )
        )
    return found


def _llm_and_kong(fields: dict[str, str], now_wall: float) -> list[Announcement]:
    """``x-ratelimit-limit-<unit>`` (OpenAI: reset a duration) and Kong's
    ``x-ratelimit-limit-<window>``."""
    found = []
    for suffix in _units(fields, r"x-ratelimit-(?:limit|remaining|reset)-([a-z-]+)"):
        limit = _first_count(fields.get(f"x-ratelimit-limit-{suffix}"))
        remaining = _first_count(fields.get(f"x-ratelimit-remaining-{suffix}"))
        if suffix in _KONG_WINDOWS_S:
            reset = _reset(fields.get("ratelimit-reset"), now_wall)
            found.append(
                Announcement(
                    limit=limit, window_s=_KONG_WINDOWS_S[suffix], remaining=remaining, reset_s=reset
                )
            )
            continue
        reset = _reset(fields.get(f"x-ratelimit-reset-{suffix}"), now_wall)
        found.append(
            Announcement(
                unit=suffix.replace("-", "_"),
                limit=limit,
                window_s=_infer_per_minute(reset),
                remaining=remaining,
                reset_s=reset,
                window_stated=False,
            )
        )
    return found


def _x_ratelimit(fields: dict[str, str], now_wall: float) -> list[Announcement]:
    """``X-RateLimit-Limit/-Remaining/-Reset`` (and ``X-Rate-Limit-*``)."""
    found = []
    for prefix in ("x-ratelimit", "x-rate-limit"):
        limit = _first_count(fields.get(f"{prefix}-limit"))
        remaining = _first_count(fields.get(f"{prefix}-remaining"))
        if limit is None and remaining is None:
            continue
        reset = _reset(fields.get(f"{prefix}-reset"), now_wall)
        if reset is None:
            reset = _reset(fields.get(f"{prefix}-reset-after"), now_wall)
        found.append(
            Announcement(
                limit=limit, window_s=_infer(reset), remaining=remaining, reset_s=reset, window_stated=False
            )
        )
    return found


# -- values ----------------------------------------------------------------------------


def _fields(headers: Any) -> dict[str, str]:
    """Lower-case name -> value; a repeated field's values joined by ", " (RFC 9110
    section 5.3)."""
    if hasattr(headers, "multi_items"):
        pairs: Iterable[Any] = headers.multi_items()
    elif isinstance(headers, Mapping):
        pairs = headers.items()
    else:
        pairs = headers
    fields: dict[str, str] = {}
    for pair in pairs:
        name, value = pair
        if isinstance(name, bytes):
            name = name.decode("latin-1")
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if not isinstance(name, str) or not isinstance(value, str):
            continue
        key = name.strip().lower()
        fields[key] = f"{fields[key]}, {value}" if key in fields else value
    return fields


def _units(fields: dict[str, str], pattern: str) -> list[str]:
    """The distinct names ``pattern``'s group matches among the fields, in order."""
    units: list[str] = []
    for name in fields:
        match = re.fullmatch(pattern, name)
        if match and match.group(1) not in units:
            units.append(match.group(1))
    return units


def _name(value: Any) -> str | None:
    """A policy's name: an sf-string (or, leniently, a token)."""
    if isinstance(value, _Token):
        return str(value)
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    """A finite number (an int, float or numeric string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip()
        if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)", value, re.ASCII):
            return None
    if not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def _count(value: Any) -> float | None:
    """A number >= 0 (a negative remaining is 0), else None."""
    number = _number(value)
    return None if number is None else max(number, 0.0)


def _positive(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and number > 0 else None


def _first_count(value: str | None) -> float | None:
    """The count a field states: a number, or the first member of a list of them."""
    if value is None:
        return None
    direct = _count(value)
    if direct is not None:
        return direct
    items = _sf_list(value)
    return _count(items[0][0]) if items else None


def _reset(value: str | None, now_wall: float) -> float | None:
    """Seconds until a reset stated as delay seconds, epoch seconds (or milliseconds),
    a duration (``1m30s``, ``20ms``) or an RFC 3339 time; None when malformed."""
    if value is None:
        return None
    value = value.strip()
    number = _number(value)
    if number is None:  # a list (``30, 30;w=60``): its first member
        items = _sf_list(value)
        number = _number(items[0][0]) if items else None
    if number is not None:
        if number >= _EPOCH_MS_FROM:
            return max(number / 1000 - now_wall, 0.0)
        if number >= _EPOCH_FROM:
            return max(number - now_wall, 0.0)
        return number if number >= 0 else None
    duration = _duration_s(value)
    if duration is not None:
        return duration
    at = _rfc3339(value)
    return None if at is None else max(at - now_wall, 0.0)


_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(h|ms|m|s|us|µs|ns)", re.ASCII)
_DURATION_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def _duration_s(value: str) -> float | None:
    """A Go duration (``6m0s``, ``1h2m``, ``20ms``, ``1.5s``), as OpenAI states resets."""
    if not re.fullmatch(r"(?:(?:\d+\.?\d*|\.\d+)(?:h|ms|m|s|us|µs|ns))+", value, re.ASCII):
        return None
    total = sum(float(n) * _DURATION_UNIT_S[unit] for n, unit in _DURATION_PART.findall(value))
    return total if math.isfinite(total) else None


_RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-]\d\d:\d\d)", re.ASCII)


def _rfc3339(value: str) -> float | None:
    """An RFC 3339 date-time as epoch seconds, else None."""
    match = _RFC3339.fullmatch(value)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        return None
    at = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)) + float(match.group(7) or 0)
    zone = match.group(8)
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        at -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return float(at)


def _infer(reset_s: float | None) -> float | None:
    """The shortest standard window (1 s, 1 min, 1 h, 1 day) a reset fits in."""
    if reset_s is None:
        return None
    return next((w for w in _STANDARD_WINDOWS_S if reset_s <= w), None)


def _infer_per_minute(reset_s: float | None) -> float:
    """1 min, or the shortest of 1 h, 1 day a longer reset fits in (else 1 day)."""
    if reset_s is None:
        return 60.0
    return next((w for w in _PER_MINUTE_FAMILIES_WINDOWS_S if reset_s <= w), 86400.0)


def _sane(announcement: Announcement) -> bool:
    """States something: a limit, or what is left of one."""
    return announcement.limit is not None or announcement.remaining is not None


def _restates(a: Announcement, b: Announcement) -> bool:
    """``a`` (a less explicit family's) speaks of the limit ``b`` states: the same unit and
    quota, or the same unit and window (two families' forms of one limit that disagree:
    the more explicit one, ``b``, is kept). A limit or window unstated is never the same."""
    if a.unit != b.unit:
        return False
    same_quota = a.limit is not None and a.limit == b.limit
    return same_quota or (a.window_s is not None and a.window_s == b.window_s)


# -- structured fields (RFC 9651), the parts these fields use --------------------------


class _Token(str):
    """An sf-token (a bare word), told apart from an sf-string."""


class _Malformed(ValueError):
    pass


def _sf_list(value: str | None) -> list[tuple[Any, dict[str, Any]]] | None:
    """An sf-list of items with parameters (RFC 9651 section 4.2.1), or None when the
    field is absent or malformed (the whole field, as the RFC says)."""
    if value is None:
        return None
    try:
        return _SfParser(value).members(dictionary=False)
    except (_Malformed, IndexError, ValueError):
        return None


def _sf_dict(value: str | None) -> dict[str, Any] | None:
    """An sf-dictionary's bare values by key (RFC 9651 section 4.2.2), or None."""
    if value is None:
        return None
    try:
        return {key: item for key, item, _ in _SfParser(value).members(dictionary=True)}
    except (_Malformed, IndexError, ValueError):
        return None


_SF_NUMBER = re.compile(r"@?-?\d{1,15}(\.\d{1,3})?", re.ASCII)
_SF_TOKEN = re.compile(r"[A-Za-z*][A-Za-z0-9!#$%&'*+.^_`|~:/-]*", re.ASCII)
_SF_KEY = re.compile(r"[a-z*][a-z0-9_.*-]*", re.ASCII)


class _SfParser:
    """A strict reader of sf-lists and sf-dictionaries of bare items (no inner lists)."""

    def __init__(self, text: str) -> None:
        self.text = text.strip(" \t")
        self.at = 0

    def members(self, dictionary: bool) -> list[tuple[Any, ...]]:
        found: list[tuple[Any, ...]] = []
        while self.at < len(self.text):
            if dictionary:
                key = self._key()
                item: Any = True
                if self._peek() == "=":
                    self.at += 1
                    item = self._bare_item()
                found.append((key, item, self._params()))
            else:
                item = self._bare_item()
                found.append((item, self._params()))
            self._skip(" \t")
            if self.at >= len(self.text):
                break
            if self.text[self.at] != ",":
                raise _Malformed(self.text)
            self.at += 1
            self._skip(" \t")
            if self.at >= len(self.text):
                raise _Malformed("a trailing comma")
        return found

    def _peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def _skip(self, chars: str) -> None:
        while self.at < len(self.text) and self.text[self.at] in chars:
            self.at += 1

    def _params(self) -> dict[str, Any]:
        params: dict[str, Any] = {}
        while self._peek() == ";":
            self.at += 1
            self._skip(" ")
            key = self._key()
            value: Any = True
            if self._peek() == "=":
                self.at += 1
                value = self._bare_item()
            params[key] = value
        return params

    def _key(self) -> str:
        match = _SF_KEY.match(self.text, self.at)
        if match is None:
            raise _Malformed("a key")
        self.at = match.end()
        return match.group(0)

    def _bare_item(self) -> Any:
        char = self._peek()
        if char == '"':
            return self._string()
        if char == ":":
            end = self.text.index(":", self.at + 1)
            data = base64.b64decode(self.text[self.at + 1 : end], validate=True)
            self.at = end + 1
            return data
        if char == "?":
            flag = self.text[self.at + 1 : self.at + 2]
            if flag not in ("0", "1"):
                raise _Malformed("a boolean")
            self.at += 2
            return flag == "1"
        number = _SF_NUMBER.match(self.text, self.at)
        if number is not None:
            self.at = number.end()
            text = number.group(0).lstrip("@")
            return float(text) if "." in text else int(text)
        token = _SF_TOKEN.match(self.text, self.at)
        if token is not None:
            self.at = token.end()
            return _Token(token.group(0))
        raise _Malformed("a bare item")

    def _string(self) -> str:
        out = []
        self.at += 1
        while True:
            char = self.text[self.at]
            self.at += 1
            if char == "\\":
                escaped = self.text[self.at]
                if escaped not in '"\\':
                    raise _Malformed("an escape")
                out.append(escaped)
                self.at += 1
            elif char == '"':
                return "".join(out)
            elif not (" " <= char <= "~"):
                raise _Malformed("a string's character")
            else:
                out.append(char)
