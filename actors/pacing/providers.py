"""Each provider's limits, from the tools that call it (one :class:`Pacing` per provider)."""

from __future__ import annotations

from collections.abc import Iterable

from actors.pacing.bucket import SLOW_START_RPS
from actors.tool import Pacing, Tool

__all__ = ["provider_pacings"]


def provider_pacings(tools: Iterable[Tool]) -> dict[str, Pacing]:
    """Each provider's limits: the one :class:`Pacing` its tools give (tools left at a
    default, ``Pacing()`` or :func:`~actors.http.http_tool`'s slow start, take another's;
    with only defaults, the slow start).

    Raises:
        ValueError: two tools of one provider give different pacings (before, the last
            tool's silently replaced the others').
    """
    defaults = (Pacing(start_rps=SLOW_START_RPS), Pacing())  # http_tool's, Tool's; most careful first
    given: dict[str, dict[Pacing, list[str]]] = {}
    for tool in tools:
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
    return out
