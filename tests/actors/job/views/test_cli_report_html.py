"""``tooldispatch run --report-html FILE`` against the example provider in its own process,
rate-limited so that 429s happen: the page's figures are the report's and the provider's
own counts, its chart's last point holds them, and a real browser draws the chart.

``TOOLDISPATCH_SCREENSHOT_TO=PATH`` keeps the screenshot (docs/report-html.png is made so)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from actors.job.views.html import ACCEPTED_COLOR, LIMITED_COLOR, RATE_COLOR

pytestmark = pytest.mark.scenario

PROVIDER = "local-provider"


def _cells(page: str) -> dict[str, str]:
    """The report table's rows (the page's first table) as ``{metric: value}``."""
    import html

    first = page[page.index("<table>") : page.index("</table>")]
    rows = re.findall(r"<tr><td>(.*?)</td><td class=v>(.*?)</td></tr>", first)
    return {html.unescape(m): html.unescape(v) for m, v in rows}


def test_cli_report_html_figures_equal_the_report_and_the_providers_counts(
    cli: Any, provider_factory: Any, tmp_path: Path, browser: Any
) -> None:
    limited = provider_factory("--rate", "10", "--burst", "2")  # slow start from 20/s meets 429s
    rows = tmp_path / "rows.txt"
    rows.write_text("".join(f"site{i}.example.fr\n" for i in range(80)), encoding="utf-8")
    page = tmp_path / "report.html"
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=limited.url, TOOLDISPATCH_BATCH="0", COLUMNS="400")
    done = cli.run("run", cli.examples / "domains_play.py", "--input", rows, "--db", tmp_path / "r.db",
                   "--report-html", page, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr

    served = limited.stats()
    assert served.get("rate_limited", 0) > 0, served  # the run met the provider's limit
    sent = served["requests"] + served["rate_limited"]
    text = page.read_text(encoding="utf-8")
    cells = _cells(text)
    assert cells[f"requests sent to {PROVIDER}"] == f"{sent} ({served['rate_limited']} answered 429)"
    assert cells[f"lookups {PROVIDER} answered (billable)"] == str(served["items"])
    terminal = cli.report(done.stderr)
    assert {k: v for k, v in cells.items()} == {k: terminal[k] for k in cells}  # the terminal's figures
    # the chart's last point holds the run's totals
    assert f"{sent} requests sent, {served['rate_limited']} answered 429" in text
    for cls in ("accepted", "429", "pacing"):
        assert f'<polyline class="{cls}"' in text, cls
    # the plain progress lines are what they were (not a terminal: no live view)
    assert re.search(r"^progress: rows \d+/80 ", done.stderr, flags=re.M), done.stderr[:2000]
    assert "holding it up" not in done.stderr

    png = browser.screenshot(page, tmp_path / "report.png", width=1000, height=640)
    for color in (ACCEPTED_COLOR, LIMITED_COLOR, RATE_COLOR):
        assert browser.pixels_of(png, color) > 500, color
    keep = os.environ.get("TOOLDISPATCH_SCREENSHOT_TO")
    if keep:
        shutil.copyfile(png, keep)


def test_cli_report_html_next_to_the_input_is_refused(cli: Any, tmp_path: Path) -> None:
    rows = tmp_path / "rows.txt"
    rows.write_text("a.example\n", encoding="utf-8")
    done = cli.run("run", cli.examples / "domains_play.py", "--input", rows, "--report-html", rows)
    assert done.returncode == 2
    assert "--report-html" in done.stderr and "is also --input" in done.stderr
    assert rows.read_text(encoding="utf-8") == "a.example\n"


def test_cli_report_html_is_written_for_an_interrupted_run(
    cli: Any, provider_factory: Any, tmp_path: Path
) -> None:
    limited = provider_factory("--rate", "5", "--burst", "1")
    rows = tmp_path / "rows.txt"
    rows.write_text("".join(f"cut{i}.example.fr\n" for i in range(300)), encoding="utf-8")
    page, err_path = tmp_path / "report.html", tmp_path / "stderr.txt"
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=limited.url, TOOLDISPATCH_BATCH="0", COLUMNS="400")
    argv = cli.command("run", cli.examples / "domains_play.py", "--input", rows, "--db", tmp_path / "r.db",
                       "--report-html", page)  # fmt: skip
    with open(err_path, "w") as err:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        try:  # a plain progress line: two seconds in, the time series has samples
            cli.poll_until(
                lambda: proc.poll() is not None or "progress: rows" in err_path.read_text(),
                timeout_s=60, what="a progress line",
            )  # fmt: skip
            assert proc.poll() is None, err_path.read_text()[-3000:]
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = err_path.read_text()
    assert code == 130, text[-3000:]
    cells = _cells(page.read_text(encoding="utf-8"))
    assert cells["status"].startswith("interrupted: "), cells
    assert cells == {k: cli.report(text)[k] for k in cells}
    served = limited.stats()
    sent = served["requests"] + served.get("rate_limited", 0)
    assert cells[f"requests sent to {PROVIDER}"] == f"{sent} ({served.get('rate_limited', 0)} answered 429)"
    assert "status: <b>interrupted</b>" in page.read_text(encoding="utf-8")
