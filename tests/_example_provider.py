"""``examples/provider.py`` in a subprocess, for tests anywhere in the suite (the
``example_provider`` fixture of ``tests/conftest.py``): its URL, its ``/stats``, and
``POST /limits`` to change its limits mid-run.

Loaded by path (tests are not a package), as ``tests/_nginx.py`` is.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "provider.py"
START_TIMEOUT_S = 30.0


class ExampleProvider:
    """``examples/provider.py --port 0 *args`` (e.g. ``--limit 50/s --announce``).

    Attributes:
        url: ``http://127.0.0.1:PORT``.

    Raises:
        RuntimeError: it did not say where it listens within 30 s.
    """

    def __init__(self, log_path: Path, *args: str) -> None:
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(START_TIMEOUT_S)
        match = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)", lines[0].strip() if lines else "")
        if match is None:
            self.stop()
            raise RuntimeError(f"the provider did not start: {log_path.read_text(errors='replace')}")
        self.url = match.group(1)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", method=method, data=data)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)

    def stats(self) -> dict[str, Any]:
        """Its counters (``requests``, ``rate_limited``, ...; ``started_at``; ``per_second``:
        second since its start -> ``accepted`` / ``rate_limited`` / ``tokens``; ``windows``:
        limit spec -> window index -> ``accepted`` / ``rate_limited`` / ``used``)."""
        return dict(self._call("GET", "/stats"))

    def set_limits(self, *specs: str, burst: float = 10.0) -> None:
        """Replace its limits (``--limit`` specs); their counts start afresh."""
        self._call("POST", "/limits", {"limits": list(specs), "burst": burst})

    def stop(self) -> None:
        """Terminate it (kill it if it does not exit within 10 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
