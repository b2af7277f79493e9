"""Each provider's limits, from the tools that call it (one :class:`Pacing` per provider)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from actors.pacing.bucket import SLOW_START_RPS
from actors.tool import Pacing, Tool

__all__ = ["provider_pacings"]

log = logging.getLogger("tooldispatch")


def provider_pacings(tools: Iterable[Tool]) -> dict[str, Pacing]:
    """Each provider's limits: the one :class:`Pacing` its tools give (tools left at a
    default, ``Pacing()`` or :func:`~actors.http.http_tool`'s slow start, take another's;
    with only defaults, the slow start).

    A limit in a unit other than requests that none of the provider's tools states
    (``Tool.units`` or ``Tool.units_used``) is warned about (only ``report_usage`` could
    count it: likely never enforced).

    Raises:
        ValueError: two tools of one provider give different pacings (before, the last
            tool's silently replaced the others'); a limit's unit is a misspelling of
            ``"requests"`` (``"request"``, ``"Requests"``, ``"reqs"``): never enforced.
    """
    defaults = (Pacing(start_rps=SLOW_START_RPS), Pacing())  # http_tool's, Tool's; most careful first
    given: dict[str, dict[Pacing, list[str]]] = {}
    stating: set[str] = set()
    for tool in tools:
        if tool.units is not None or tool.units_used is not None:
            stating.add(tool.provider_name)
        given.setdefault(tool.provider_name, {}).setdefault(tool.pacing, []).append(tool.tool_id)
    out: dict[str, Pacing] = {}
    for provider, pacings in given.items():
        chosen = {p: ids for p, ids in pacings.items() if p not in defaults}
        if not chosen:  # only defaults: the most careful of them
            first = next(p for p in defaults if p in pacings)
            chosen = {first: pacings[first]}
        if len(chosen) > 1:
            listed = "; ".join(f"{', '.join(ids)}: {p}" for p, ids in chosen.items())
            raise ValueError(
                f"tools of provider {provider!r} give different pacings ({listed}): a provider has one "
                "set of limits, give them all the same Pacing (or leave all but one at the default)"
            )
        (out[provider],) = chosen
    for provider, pacing in out.items():
        _check_units(provider, pacing, _tools_of(given, provider), provider in stating)
    return out


REQUESTS_TYPOS = frozenset({"request", "requests", "req", "reqs", "requets", "requsts", "rquests"})
"""Misspellings of ``"requests"`` (compared lowercased, stripped)."""


def _tools_of(given: dict[str, dict[Pacing, list[str]]], provider: str) -> list[str]:
    """The ids of ``provider``'s tools."""
    return [tool_id for ids in given[provider].values() for tool_id in ids]


def _check_units(provider: str, pacing: Pacing, tool_ids: list[str], stating: bool) -> None:
    for lim in pacing.unit_limits:
        unit = lim.unit
        if unit != "requests" and unit.strip().lower() in REQUESTS_TYPOS:
            raise ValueError(
                f"provider {provider!r}: Limit {lim.name!r} counts {unit!r}, which no call states: "
                "did you mean 'requests' (the unit of a limit on the number of requests)?"
            )
        if unit != "requests" and not stating:
            log.warning(
                "provider %r: Limit %r counts %r, which none of its tools (%s) states (Tool.units, "
                "Tool.units_used): only report_usage can count it",
                provider, lim.name, unit, ", ".join(tool_ids),
            )  # fmt: skip
