"""``tooldispatch run`` on a terminal (a pseudo-terminal, 150 columns): the live view
redraws a row per provider under the progress line, in the report's words, and the report
follows. The example provider is rate-limited, so its pacing has something to show."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _run_on_a_terminal(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> tuple[int, str]:
    """Run ``argv`` with a 150 x 20 pseudo-terminal as its stdin, stdout and stderr; its
    exit code and everything it wrote (escape sequences left in)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 20, 150, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed its end
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, out.decode("utf-8", "replace")


def test_cli_live_view_shows_a_row_per_provider_on_a_terminal(
    cli: Any, provider_factory: Any, tmp_path: Path
) -> None:
    limited = provider_factory("--rate", "10", "--burst", "2")
    rows = tmp_path / "rows.txt"
    rows.write_text("".join(f"live{i}.example.fr\n" for i in range(40)), encoding="utf-8")
    env = cli.env(TOOLDISPATCH_PROVIDER_URL=limited.url, TOOLDISPATCH_BATCH="0", TERM="xterm-256color")
    del env["COLUMNS"]  # the terminal's width, as a user's
    argv = cli.command("run", cli.examples / "domains_play.py", "--input", rows, "--db", tmp_path / "r.db")
    code, raw = _run_on_a_terminal(argv, env, tmp_path, timeout_s=180)
    text = ESCAPES.sub("", raw)
    assert code == 0, text[-4000:]
    assert "Traceback" not in text
    header = re.search(r"^provider +sent/s +pacing +in flight +429s +spent +saved +holding it up", text, re.M)
    assert header is not None, text[-4000:]
    row = re.findall(r"^local-provider +[\d.]+ +(?:[\d.]+/s \(\w+\)|unpaced).*$", text, re.M)
    assert row, text[-4000:]
    assert "progress: rows" not in text  # a terminal gets the live view, not the plain lines
    assert "tooldispatch run report" in text
