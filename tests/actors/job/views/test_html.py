"""The report as HTML: the report's own rows, every text from the play or the data
escaped (a tool id with ``<script>`` injects nothing), no script and nothing fetched, and
a chart per provider that a real browser draws (chromium, headless: its screenshot holds
the series' colours)."""

from __future__ import annotations

import html.parser
import re
from pathlib import Path
from typing import Any

import pytest

from actors import Tool
from actors.job.report import report_table, tools_table
from actors.job.runner import RunSummary
from actors.job.views import Point, render_html, write_report_html
from actors.job.views.html import ACCEPTED_COLOR, LIMITED_COLOR, RATE_COLOR, chart_svg, table_rows
from actors.stats import Stats
from stores.money import Money

EVIL = '<script>alert("x")</script>'


def _noop(input: Any, ctx: Any) -> Any:
    return input


TOOLS = [
    Tool(tool_id=f"verify{EVIL}", provider=f"acme{EVIL}", fn=_noop, price=Money("0.1", "USD")),
    Tool(tool_id="geo", provider="maps", fn=_noop),
]


def _stats() -> dict[str, Any]:
    stats = Stats()
    stats.spend([Money("0.1", "USD")] * 3, f"verify{EVIL}")
    return {
        **stats.snapshot(),
        "spent": stats.snapshot_spent(),
        "tools": {
            f"verify{EVIL}": {"requests": 40, "backpressure": 4, "answered": 36},
            "geo": {"requests": 9},
        },
        "pacing": {f"default/acme{EVIL}": {"rate_rps": 10.0, "learnt": "plateau", "limit_rps": 10.5}},
    }


def _series() -> dict[str, list[Point]]:
    acme, maps = [], []
    for second in range(1, 31):  # 10/s accepted, a burst of 429s at 10 s, the rate cut then regrown
        acme.append(
            Point(t_s=float(second), requests=11 * second, limited=second, rate_rps=8.0 + (second % 5))
        )
        maps.append(Point(t_s=float(second), requests=2 * second, limited=0, rate_rps=None))
    return {f"acme{EVIL}": acme, "maps": maps}


def _page() -> str:
    summary = RunSummary(rows=20, ok=19, failed=1, wall_s=30.0)
    summary.errors.add(f"ToolError: no such domain {EVIL}")  # an error text from the data
    stats = _stats()
    return render_html(
        report_table(stats, summary, None, TOOLS), tools_table(stats), _series(), status="finished"
    )


class _Tables(html.parser.HTMLParser):
    """The page's tables as lists of rows of cell texts, and every tag met."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.tags: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _parse(page: str) -> _Tables:
    parser = _Tables()
    parser.feed(page)
    return parser


def test_report_html_holds_the_reports_own_rows() -> None:
    summary = RunSummary(rows=20, ok=19, failed=1, wall_s=30.0)
    stats = _stats()
    table = report_table(stats, summary, None, TOOLS)
    parsed = _parse(render_html(table, tools_table(stats), _series(), status="finished"))
    _, rows = table_rows(table)
    assert parsed.tables[0][1:] == rows  # the same figures as the terminal's report
    cells = dict(tuple(row) for row in parsed.tables[0][1:])  # type: ignore[misc]
    assert cells[f"requests sent to acme{EVIL}"] == "40 (4 answered 429)"
    assert cells[f"spent at acme{EVIL} (by the tools' prices)"] == "0.3 USD"


def test_report_html_escapes_what_the_play_and_the_data_say() -> None:
    page = _page()
    assert "<script" not in page.lower()  # not one script, injected or ours
    assert EVIL not in page
    assert html_escaped(EVIL) in page
    parsed = _parse(page)
    assert "script" not in parsed.tags
    texts = [cell for table in parsed.tables for row in table for cell in row]
    assert any(EVIL in text for text in texts)  # shown as text, as written
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched


def html_escaped(text: str) -> str:
    import html as html_module

    return html_module.escape(text, quote=True)


def test_chart_svg_draws_accepted_429s_and_the_pacing_rate() -> None:
    svg = chart_svg("acme", _series()[f"acme{EVIL}"])
    for cls, color in (("accepted", ACCEPTED_COLOR), ("429", LIMITED_COLOR), ("pacing", RATE_COLOR)):
        assert f'class="{cls}" fill="none" stroke="{color}"' in svg
    accepted = re.search(r'class="accepted"[^>]*points="([^"]+)"', svg)
    assert accepted is not None
    assert len(accepted.group(1).split()) == 2 * 30  # a step per sampled interval


def test_write_report_html_writes_the_page_whole(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    write_report_html(str(path), _page())
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temporary file left
    with pytest.raises(OSError):
        write_report_html(str(tmp_path / "no-such-folder" / "report.html"), _page())


@pytest.mark.scenario
def test_report_html_charts_render_in_a_real_browser(tmp_path: Path, browser: Any) -> None:
    page = tmp_path / "report.html"
    write_report_html(str(page), _page())
    png = browser.screenshot(page, tmp_path / "report.png")
    # each series is a 3 px line across the chart (~800 px): thousands of pixels of its
    # colour, far beyond the legend's swatch (18 x 3 px)
    for color in (ACCEPTED_COLOR, LIMITED_COLOR, RATE_COLOR):
        assert browser.pixels_of(png, color) > 800, color
    # and a colour no series uses is nowhere: the count tells lines from noise
    assert browser.pixels_of(png, "#ff00ff", tolerance=8) == 0
