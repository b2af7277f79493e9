"""Limits a provider announces in its answers: the standard and common rate-limit fields.

Read (by :func:`parse_rate_limit_headers`) from any answer, refusals (429) included:

* the IETF fields (draft-ietf-httpapi-ratelimit-headers): ``RateLimit-Policy`` (each
  policy's quota ``q``, window ``w`` seconds, quota unit ``qu``) and ``RateLimit``
  (``r``: quota units remaining, ``t``: seconds until the quota resets), and the earlier
  drafts' ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset``;
* the common ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (reset as delta seconds
  or epoch seconds);
* the LLM APIs' ``x-ratelimit-limit-requests`` / ``-remaining-requests`` /
  ``-reset-requests`` and their ``-tokens`` twins (durations such as ``6m0s``, ``20ms``).
"""

from __future__ import annotations

import attrs

__all__ = ["Announcement"]


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
    """

    unit: str = "requests"
    limit: float | None = None
    window_s: float | None = None
    remaining: float | None = None
    reset_s: float | None = None
    name: str = ""
