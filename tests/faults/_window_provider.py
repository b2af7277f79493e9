"""A paid API of the fault suite that counts requests per time window: ``POST`` to any path
is answered 200 (``{"ok": true}``, after ``--latency`` seconds) while the requests it
accepted in the last ``--window`` seconds number fewer than ``--rate * --window`` plus
``--burst``; beyond that it answers 429 with ``Retry-After: 1``. ``GET /stats`` says
``requests``, ``accepted``, ``rate_limited``, ``limit`` (the bound per window) and
``max_in_window`` (the most requests, answered or not, that arrived within one window).

Standard library only (a thread per connection), so that it runs the same under either
runtime of the suite. Run: ``python _window_provider.py --rate 100 --window 0.2 --burst 4``
prints ``listening on http://127.0.0.1:PORT`` and serves until killed.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Window:
    """Arrival times (monotonic seconds) and the per-window bound."""

    def __init__(self, rate: float, window_s: float, burst: int) -> None:
        self.window_s = window_s
        self.limit = round(rate * window_s) + burst
        self.lock = threading.Lock()
        self.accepted: list[float] = []
        self.arrivals: list[float] = []
        self.rate_limited = 0
        self.max_in_window = 0

    def admit(self) -> bool:
        """Count a request arriving now (timed under the lock: the times stay in order)."""
        with self.lock:
            now = time.monotonic()
            self.arrivals.append(now)
            start = bisect.bisect_right(self.arrivals, now - self.window_s)
            self.max_in_window = max(self.max_in_window, len(self.arrivals) - start)
            recent = len(self.accepted) - bisect.bisect_right(self.accepted, now - self.window_s)
            if recent >= self.limit:
                self.rate_limited += 1
                return False
            self.accepted.append(now)
            return True

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {
                "requests": len(self.arrivals),
                "accepted": len(self.accepted),
                "rate_limited": self.rate_limited,
                "limit": self.limit,
                "max_in_window": self.max_in_window,
            }


def serve(window: Window, latency_s: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer(200, window.stats())

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not window.admit():
                self._answer(429, {"error": "rate limited"}, {"Retry-After": "1"})
                return
            if latency_s > 0:
                time.sleep(latency_s)
            self._answer(200, {"ok": True})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--window", type=float, default=0.2)
    parser.add_argument("--burst", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    server = serve(Window(args.rate, args.window, args.burst), args.latency)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    main()
