"""What the pacing bench's cases share: the example provider in a subprocess, and a case
run in a child process of a runtime (plain threads, or gevent's monkey-patching)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROVIDER = ROOT / "examples" / "provider.py"


class ExampleProvider:
    """``examples/provider.py --port 0 *args`` in a subprocess; ``url`` once it listens.

    Raises:
        RuntimeError: it did not start (its first line is not ``listening on URL``).
    """

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PROVIDER), "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().strip()
        match = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)", first)
        if match is None:
            self.stop()
            raise RuntimeError(f"the example provider did not start: {first!r}")
        self.url = match.group(1)

    def stats(self) -> dict[str, Any]:
        """Its ``/stats``: what it accepted and refused."""
        return provider_stats(self.url)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def provider_stats(url: str) -> dict[str, Any]:
    """The ``/stats`` of the example provider at ``url``."""
    with urllib.request.urlopen(f"{url}/stats", timeout=30) as response:
        return dict(json.load(response))


def runtime_command(runtime: str, script: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``script *args`` on ``runtime`` (``"threads"``
    or ``"gevent"``: under ``python -m gevent.monkey``) with this checkout importable."""
    cmd = [sys.executable, *(["-m", "gevent.monkey"] if runtime == "gevent" else []), str(script), *args]
    env = {**os.environ, "TOOLDISPATCH_RUNTIME": runtime}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return cmd, env


def in_runtime(runtime: str, script: Path, args: list[str], timeout_s: float, what: str) -> Any:
    """Run ``script *args`` in a child process of ``runtime``; the JSON of the last line it
    printed that starts with ``{`` or ``[``.

    Raises:
        RuntimeError: it failed or printed no such line (``what`` names it; its stderr's tail).
    """
    cmd, env = runtime_command(runtime, script, *args)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in out.stdout.splitlines() if line.startswith(("{", "["))]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed: {out.stderr[-3000:]}")
    return json.loads(lines[-1])
