"""The run's report as one self-contained HTML page (``tooldispatch run --report-html FILE``).

The page holds, per provider, an inline SVG chart over the run's time of the requests it
accepted and answered 429 (per second) and the pacing rate, then the report's tables (the
very rows of :func:`~actors.job.report.report_table` and
:func:`~actors.job.report.tools_table`, so its figures are the terminal's). No script, no
stylesheet or font fetched: it opens offline, and as a CI artefact. Every text that comes
from the play or the data (tool ids, provider names, error texts) is escaped.
"""

from __future__ import annotations

import datetime
import html
import itertools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from actors.job.views.timeline import Point

__all__ = ["ACCEPTED_COLOR", "LIMITED_COLOR", "RATE_COLOR", "render_html", "table_rows", "write_report_html"]

ACCEPTED_COLOR = "#0072b2"
"""The chart's line of requests the provider accepted per second (Okabe-Ito blue)."""
LIMITED_COLOR = "#d55e00"
"""The chart's line of requests answered 429 per second (Okabe-Ito vermilion)."""
RATE_COLOR = "#009e73"
"""The chart's line of the pacing rate (Okabe-Ito green)."""

_W, _H = 860, 240
_LEFT, _RIGHT, _TOP, _BOTTOM = 56, 16, 14, 34

_STYLE = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 24px 0 8px; }
.meta { color: #666; margin-bottom: 16px; }
table { border-collapse: collapse; margin-bottom: 8px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
td.v { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; }
.legend span { display: inline-block; margin-right: 16px; }
.legend i { display: inline-block; width: 18px; height: 3px; vertical-align: middle; margin-right: 4px; }
svg text { font: 11px system-ui, sans-serif; fill: #555; }
"""


def _e(text: Any) -> str:
    """``text`` escaped for HTML and SVG, in text and in quoted attributes."""
    return html.escape(str(text), quote=True)


def table_rows(table: Table) -> tuple[list[str], list[list[str]]]:
    """A rich table's header and rows as plain text (its cells are text: the report's are)."""
    header = [str(column.header) for column in table.columns]
    columns = [[str(cell) for cell in column.cells] for column in table.columns]
    return header, [list(row) for row in zip(*columns, strict=True)]


def _html_table(table: Table, *, numeric_from: int = 1) -> str:
    header, rows = table_rows(table)
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=v' if i >= numeric_from else ''}>{_e(c)}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )  # fmt: skip
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


Steps = list[tuple[float, float, float]]
"""(from s, to s, value) per sampled interval."""


def _steps(points: Sequence[Point]) -> tuple[Steps, Steps]:
    """Per interval between neighbours (the run's start, with nothing sent, before the
    first): (from s, to s, accepted/s) and (from s, to s, 429s/s)."""
    accepted: Steps = []
    limited: Steps = []
    before = Point(t_s=0.0, requests=0, limited=0, rate_rps=None)
    for point in points:
        span = point.t_s - before.t_s
        if span > 0:
            sent, refused = point.requests - before.requests, point.limited - before.limited
            accepted.append((before.t_s, point.t_s, max(0, sent - refused) / span))
            limited.append((before.t_s, point.t_s, max(0, refused) / span))
            before = point
    return accepted, limited


def _nice(top: float) -> float:
    """A round axis maximum at or above ``top`` (1, 2, 5 times a power of ten: its fifths
    are round too)."""
    if top <= 0:
        return 1.0
    scale = 10.0 ** math.floor(math.log10(top)) if top >= 1 else 1.0
    for step in (1, 2, 5, 10):
        if top <= step * scale:
            return step * scale
    return 10 * scale


def chart_svg(provider: str, points: Sequence[Point]) -> str:
    """One provider's chart: accepted requests/s and 429s/s (steps per sampled interval)
    and the pacing rate, over the run's seconds."""
    accepted, limited = _steps(points)
    rates = [(p.t_s, p.rate_rps) for p in points if p.rate_rps is not None]
    end = max([p.t_s for p in points] + [1.0])
    top = _nice(
        max([v for *_, v in accepted] + [v for *_, v in limited] + [r for _, r in rates] + [0.0]) * 1.05
    )
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(t: float) -> float:
        return _LEFT + plot_w * t / end

    def y(v: float) -> float:
        return _TOP + plot_h * (1 - v / top)

    def step_path(steps: Steps) -> str:
        coords: list[str] = []
        for t0, t1, v in steps:
            coords += [f"{x(t0):.1f},{y(v):.1f}", f"{x(t1):.1f},{y(v):.1f}"]
        return " ".join(coords)

    grid = []
    for i in range(6):
        v = top * i / 5
        grid.append(
            f'<line x1="{_LEFT}" y1="{y(v):.1f}" x2="{_W - _RIGHT}" y2="{y(v):.1f}" stroke="#e6e6e6"/>'
            f'<text x="{_LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>'
        )
    every = _nice(end / 5)  # a round step of seconds, at most 5 labels
    for i in range(int(end / every) + 1):
        t = every * i
        grid.append(f'<text x="{x(t):.1f}" y="{_H - _BOTTOM + 16}" text-anchor="middle">{t:.0f} s</text>')
    lines = []
    for steps, color, what in ((accepted, ACCEPTED_COLOR, "accepted"), (limited, LIMITED_COLOR, "429")):
        if steps:
            lines.append(
                f'<polyline class="{what}" fill="none" stroke="{color}" stroke-width="3" '
                f'stroke-linejoin="round" points="{step_path(steps)}"/>'
            )
    if rates:
        coords = [f"{x(rates[0][0]):.1f},{y(rates[0][1]):.1f}"]
        for (_, r0), (t1, r1) in itertools.pairwise(rates):
            coords += [f"{x(t1):.1f},{y(r0):.1f}", f"{x(t1):.1f},{y(r1):.1f}"]
        lines.append(
            f'<polyline class="pacing" fill="none" stroke="{RATE_COLOR}" stroke-width="3" '
            f'stroke-dasharray="8 4" points="{" ".join(coords)}"/>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
        f'role="img" aria-label="{_e(provider)}: requests per second over the run">'
        f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#ccc"/>'
        + "".join(grid)
        + "".join(lines)
        + f'<text x="{_LEFT + 4}" y="{_TOP + 12}">requests/s</text></svg>'
    )


def render_html(
    report: Table,
    tools: Table,
    series: Mapping[str, Sequence[Point]],
    *,
    status: str,
    title: str = "tooldispatch run report",
    generated_at: datetime.datetime | None = None,
) -> str:
    """The page: a chart per provider, then the report and per-tool tables.

    Args:
        report: :func:`~actors.job.report.report_table`'s table.
        tools: :func:`~actors.job.report.tools_table`'s table.
        series: provider name -> its sampled points (:meth:`Timeline.series`).
        status: ``finished``, ``interrupted`` or ``aborted``.
        title: the page's title (escaped).
        generated_at: when it was written (default: now, UTC).
    """
    when = (generated_at or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d %H:%M:%S UTC")
    legend = (
        '<div class="legend">'
        f'<span><i style="background:{ACCEPTED_COLOR}"></i>accepted requests/s</span>'
        f'<span><i style="background:{LIMITED_COLOR}"></i>answered 429/s</span>'
        f'<span><i style="background:{RATE_COLOR}"></i>pacing rate (requests/s)</span></div>'
    )
    charts = []
    for provider, points in sorted(series.items()):
        if not points:
            charts.append(
                f"<h2>{_e(provider)}</h2><p>No sample was taken (the run was shorter than a second).</p>"
            )
            continue
        sent, refused = points[-1].requests, points[-1].limited
        charts.append(
            f'<section class="provider"><h2>{_e(provider)}</h2>'
            f"<p>{sent} requests sent, {refused} answered 429, over {points[-1].t_s:.1f} s "
            f"({len(points)} samples)</p>{legend}{chart_svg(provider, points)}</section>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>"
        f'<h1>{_e(title)}</h1><div class="meta">status: <b>{_e(status)}</b> · written {when}</div>'
        f"{''.join(charts)}<h2>Report</h2>{_html_table(report)}<h2>Per tool</h2>{_html_table(tools)}"
        "</body></html>\n"
    )


def write_report_html(path: str, page: str) -> None:
    """Write ``page`` to ``path`` (UTF-8), through a temporary file beside it.

    Raises:
        OSError: the file cannot be written.
    """
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(page)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
