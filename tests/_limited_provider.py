"""A provider on 127.0.0.1 with several limits, in requests and in tokens, strictly kept.

``LimitedProvider(limits)`` serves ``POST`` (any path) on a free port of 127.0.0.1. A body
``{"tokens": E, ...}`` asks for a call estimated at E tokens; its real use is E times a
factor in [1 - spread, 1 + spread] drawn from the body's ``"i"`` (the same call always
uses the same), answered as ``{"tokens": real, "i": ...}``. Each limit is
``(amount, window_s, unit)``: a window of a second or less is a token bucket (rate
amount / window_s, its burst ``burst``); a longer one counts **fixed** windows from the
server's start (the common provider's way). A request that would pass any limit, with its
real use, is answered 429 with ``Retry-After`` (whole seconds until that window
ends) and counted in none. ``accepted`` keeps (time.monotonic(), tokens) of each
accepted request, to check any window against its limit afterwards.

Plain sockets under ``http.server`` threads: cooperative under gevent monkey-patching.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["LimitedProvider", "most_in_window"]


def most_in_window(events: list[tuple[float, float]], window_s: float) -> float:
    """The most units ``events`` ((time, units), any order) hold in any window of ``window_s``."""
    events = sorted(events)
    most, total, start = 0.0, 0.0, 0
    for t, units in events:
        total += units
        while events[start][0] <= t - window_s:
            total -= events[start][1]
            start += 1
        most = max(most, total)
    return most


class LimitedProvider:
    """The server (:meth:`start`, :meth:`stop`); ``statuses`` counts answers by status."""

    def __init__(
        self, limits: list[tuple[float, float, str]], burst: float = 5.0, spread: float = 0.5
    ) -> None:
        self.limits = limits
        self.burst = burst
        self.spread = spread
        self.lock = threading.Lock()
        self.accepted: list[tuple[float, float]] = []
        self.statuses: dict[int, int] = {}
        self.refused_by: dict[int, int] = {}
        """Limit index -> requests it refused."""
        self.started = time.monotonic()
        self._buckets = {i: (burst, self.started) for i, lim in enumerate(limits) if lim[1] <= 1.0}
        self._windows: dict[int, tuple[int, float]] = {}
        self.server: ThreadingHTTPServer | None = None
        self.url = ""

    def real_tokens(self, body: dict[str, Any]) -> float:
        factor = 1 - self.spread + 2 * self.spread * random.Random(str(body.get("i"))).random()
        return round(float(body.get("tokens", 0)) * factor, 1)

    def admit(self, tokens: float) -> tuple[bool, float]:
        """Count a request of ``tokens`` against every limit, or none: (accepted, retry after)."""
        now = time.monotonic()
        with self.lock:
            updates: dict[int, Any] = {}
            for i, (amount, window_s, unit) in enumerate(self.limits):
                units = 1.0 if unit == "requests" else tokens
                if window_s <= 1.0:
                    level, at = self._buckets[i]
                    level = min(self.burst, level + (now - at) * amount / window_s)
                    if level < units:
                        self.refused_by[i] = self.refused_by.get(i, 0) + 1
                        return False, (units - level) * window_s / amount
                    updates[i] = ("bucket", level - units)
                else:
                    n = math.floor((now - self.started) / window_s)
                    seen_n, held = self._windows.get(i, (n, 0.0))
                    held = held if seen_n == n else 0.0
                    if held + units > amount:
                        self.refused_by[i] = self.refused_by.get(i, 0) + 1
                        return False, self.started + (n + 1) * window_s - now
                    updates[i] = ("window", (n, held + units))
            for i, (kind, value) in updates.items():
                if kind == "bucket":
                    self._buckets[i] = (value, now)
                else:
                    self._windows[i] = value
            self.accepted.append((now, tokens))
            return True, 0.0

    def start(self) -> LimitedProvider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                tokens = provider.real_tokens(body)
                ok, wait = provider.admit(tokens)
                status = 200 if ok else 429
                with provider.lock:
                    provider.statuses[status] = provider.statuses.get(status, 0) + 1
                out = json.dumps({"tokens": tokens, "i": body.get("i")} if ok else {"error": "rate limited"})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if not ok:
                    self.send_header("Retry-After", str(max(1, math.ceil(wait))))
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out.encode())

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.request_queue_size = 256
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/call"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
