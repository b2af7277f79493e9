"""The live view of ``tooldispatch run`` on a terminal: a table per provider under the
progress line, redrawn by :class:`~actors.job.report.ProgressDisplay` a few times a second.

Per provider: requests sent per second now, the pacing rate, the limit and how it was
learnt, calls in flight, 429s, what was spent and saved so far, and what holds it up.
Everything is read from one ``stats()`` snapshot (and the previous one, to see what
changed since); nothing here talks to the actors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from stores.money import total

__all__ = ["WAITS_KEY", "holdups", "live_view"]

WAITS_KEY = "waits"
"""``stats()["waits"]["providers"][provider]``: ``{reason: seconds}``, where its calls'
time went so far (:data:`actors.stats.WAIT_REASONS`). The live view names the reasons
that grew most since its last redraw (running aside: that is not being held up)."""

_WAIT_WORDS = {
    "slot": "a slot", "pacing": "its turn to send", "pause": "a pause", "retry_backoff": "retry back-offs",
    "owner": "another run's calls", "store": "the receipt store", "batch_grace": "batches to fill",
}  # fmt: skip


def _views_of(provider: str, pacing: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [view for key, view in sorted(pacing.items()) if key.rpartition("/")[2] == provider]


def holdups(provider: str, stats: Mapping[str, Any], before: Mapping[str, Any] | None = None) -> list[str]:
    """What holds ``provider``'s calls up now, in words, most pressing first.

    Args:
        provider: the provider's name.
        stats: the dispatch system's ``stats()`` now.
        before: the previous snapshot (what grew since tells what is happening now), or None.

    Returns:
        ``["circuit open"]``, ``["paused 0.8 s more (Retry-After 1)"]``, ``["pacing: calls
        wait their turn at 12.0/s"]``, the waits by reason that grew (:data:`WAITS_KEY`);
        empty when nothing holds it up.
    """
    now = _views_of(provider, stats.get("pacing") or {})
    old = _views_of(provider, (before or {}).get("pacing") or {}) if before is not None else []
    out: list[str] = []
    for i, view in enumerate(now):
        prev = old[i] if i < len(old) else None
        circuit = view.get("circuit", "closed")
        if circuit != "closed":
            out.append(f"circuit {circuit.replace('_', '-')}")
        paused = float(view.get("paused_for_s") or 0.0)
        if paused > 0:
            pauses = view.get("pauses") or []
            raw = pauses[-1].get("retry_after") if pauses else None
            out.append(f"paused {paused:.1f} s more" + (f" (Retry-After {raw})" if raw is not None else ""))
        elif prev is not None and float(view.get("held_s") or 0.0) > float(prev.get("held_s") or 0.0):
            rate = view.get("rate_rps")
            out.append("pacing: calls wait their turn" + (f" at {rate:.1f}/s" if rate is not None else ""))
    waits = _waits_of(provider, stats)
    if waits and before is not None:  # the waits by reason that grew since the last look
        waits_before = _waits_of(provider, before)
        grew = {
            reason: float(s) - float(waits_before.get(reason, 0.0))
            for reason, s in waits.items()
            if reason != "running" and float(s) > float(waits_before.get(reason, 0.0))
        }
        out += [
            f"waiting for {_WAIT_WORDS.get(reason, reason)}"
            for reason, _ in sorted(grew.items(), key=lambda kv: -kv[1])[:2]
        ]
    return out


def _waits_of(provider: str, stats: Mapping[str, Any]) -> Mapping[str, Any]:
    found = ((stats.get(WAITS_KEY) or {}).get("providers") or {}).get(provider)
    return found if isinstance(found, Mapping) else {}


def _money(sums: Mapping[str, Any], ids: Sequence[str]) -> str:
    tools = sums.get("tools") or {}
    amounts = total(m for t in ids for m in (tools.get(t) or {}).values())
    return ", ".join(str(m) for _, m in sorted(amounts.items())) or "-"


def _system_holdups(stats: Mapping[str, Any]) -> list[str]:
    """What holds every provider up: the store (or a shared pacer) away, other runs' receipts."""
    out = []
    for outage in stats.get("outages") or ():
        if outage.get("ongoing"):
            cause = " ".join(str(outage.get("cause", "")).split())[:80]
            out.append(
                f"{outage.get('service', '?')} away for {float(outage.get('duration_s', 0.0)):.1f} s"
                + (f": {cause}" if cause else "")
            )
    waiting = stats.get("waiting_on_owner")
    if waiting:
        out.append(f"{waiting} calls wait for another run's receipt")
    return out


def live_view(
    line: str,
    stats: Mapping[str, Any],
    providers: Mapping[str, Sequence[str]],
    sent_rps: Mapping[str, float],
    before: Mapping[str, Any] | None = None,
) -> RenderableType:
    """The progress ``line``, then a row per provider (see the module docstring) and a
    last line for what holds every provider up (the store away, other runs' receipts).

    Args:
        line: the progress line (:func:`~actors.job.report.progress_line`).
        stats: the dispatch system's ``stats()``.
        providers: provider name -> its paid tools' ids.
        sent_rps: provider name -> requests sent per second lately.
        before: the previous ``stats()`` (for :func:`holdups`), or None.
    """
    if not providers:
        return Text(line)
    per_tool = stats.get("tools") if isinstance(stats.get("tools"), dict) else {}
    assert isinstance(per_tool, dict)
    pacing = stats.get("pacing") or {}
    table = Table(box=None, header_style="bold", pad_edge=False, expand=False)
    for name, justify in (
        ("provider", "left"), ("sent/s", "right"), ("pacing", "left"), ("in flight", "right"),
        ("429s", "right"), ("spent", "right"), ("saved", "right"), ("holding it up", "left"),
    ):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for provider, ids in sorted(providers.items()):
        views = _views_of(provider, pacing)
        table.add_row(
            Text(provider),
            f"{sent_rps.get(provider, 0.0):.1f}",
            Text("; ".join(_pacing_words(v) for v in views) or "-"),
            str(sum(int(v.get("in_flight") or 0) for v in views)),
            str(sum(int(per_tool.get(t, {}).get("backpressure", 0)) for t in ids)),
            _money(stats.get("spent") or {}, ids),
            _money(stats.get("saved") or {}, ids),
            Text("; ".join(holdups(provider, stats, before)) or "-"),
        )
    parts: list[RenderableType] = [Text(line), table]
    everyone = _system_holdups(stats)
    if everyone:
        parts.append(Text("holding every provider up: " + "; ".join(everyone)))
    return Group(*parts)


def _pacing_words(view: Mapping[str, Any]) -> str:
    rate, limit = view.get("rate_rps"), view.get("limit_rps")
    if rate is None:
        return "unpaced"
    text = f"{rate:.1f}/s ({view.get('learnt')})"
    if limit is not None:
        text += f", limit {limit:.1f}/s"
    return text
