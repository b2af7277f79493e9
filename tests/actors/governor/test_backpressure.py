"""System tests of admission: backpressure gates, pacing isolation, cache hits, width.

Real dispatch systems on a SQLite file, both runtimes. Durations are measured with
``time.monotonic`` around futures that are awaited with a timeout; nothing sleeps to
wait for a result. Behaviour reference: SEMANTICS.md (Admission) and issue 3.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from actors import CallCancelledError, Pacing, Policy, RateLimitedError, Tool

WAIT_S = 10.0
"""Longest a test waits for a future or an event (far above any expected time)."""

RETRY_AFTER_S = 1.0
"""The Retry-After of the 429 test (seconds)."""


def echo(recorder: Any, name: str) -> Any:
    def fn(input: Any, ctx: Any) -> Any:
        recorder.record(name, input, ctx)
        return {name: input}

    return fn


@pytest.mark.waits
def test_backpressure_429_pauses_every_tool_of_that_provider(make_system: Any, recorder: Any) -> None:
    limited_at: list[float] = []

    def search(input: Any, ctx: Any) -> Any:
        recorder.record("search", input, ctx)
        if not limited_at:
            limited_at.append(time.monotonic())
            raise RateLimitedError("429 too many requests", retry_after=str(int(RETRY_AFTER_S)))
        return {"hits": input["q"]}

    reported = threading.Event()

    def perf_hook(phase: str, ms: float, extra: dict[str, Any]) -> None:
        if phase == "provider":  # recorded after the 429 was reported to the governor
            reported.set()

    tools = [
        Tool(tool_id="search", fn=search, provider="acme-api"),
        Tool(tool_id="lookup", fn=echo(recorder, "lookup"), provider="acme-api"),
        Tool(tool_id="weather", fn=echo(recorder, "weather"), provider="other-api"),
    ]
    system = make_system(tools, policy=Policy(batch_grace_s=0.05, perf_hook=perf_hook))
    limited = system.proxy().execute("search", {"q": "rust"})
    assert reported.wait(WAIT_S), "the 429 never reached the governor"

    submitted = time.monotonic()
    same_provider = system.proxy().execute("lookup", {"id": 1})
    other_provider = system.proxy().execute("weather", {"city": "Oslo"})
    other = other_provider.get(timeout=WAIT_S)
    other_done = time.monotonic()
    same = same_provider.get(timeout=WAIT_S)
    same_done = time.monotonic()

    assert other.execution == "live"
    assert other_done - submitted < 0.5 * RETRY_AFTER_S, "another provider's tool waited for the gate"
    assert same.execution == "live"
    assert same_done - limited_at[0] >= 0.9 * RETRY_AFTER_S, (
        "a tool of the paused provider ran during the pause"
    )
    (lookup_call,) = recorder.of("lookup")
    assert lookup_call.at - limited_at[0] >= 0.9 * RETRY_AFTER_S

    result = limited.get(timeout=WAIT_S)
    assert (result.execution, result.value) == ("live", {"hits": "rust"})
    searches = recorder.of("search")
    assert len(searches) == 2 and searches[1].at - searches[0].at >= 0.9 * RETRY_AFTER_S
    stats = system.stats()
    assert stats["retries"] >= 1 and stats["backpressure"] >= 1


@pytest.mark.parametrize("timeout_s", [30.0, 0.5], ids=["waits-out-the-pause", "re-admitted-unsent"])
@pytest.mark.waits
def test_backpressure_429_holds_back_requests_already_waiting_to_be_sent(
    make_system: Any, recorder: Any, timeout_s: float
) -> None:
    # Calls are granted two at once (burst 2, which the send gate also lets go together),
    # then one per 50 ms; the third is answered 429. The ones granted or waiting at the
    # gate must not go out into the pause: they are held or booked again after it. With a
    # 0.5 s timeout a turn that comes after the deadline is given back unsent,
    # re-admitted, and still succeeds. (A burst of 10 would send all ten before the 429
    # came back: nothing would be left to hold.)
    limited_at: list[float] = []
    lock = threading.Lock()

    def api(input: Any, ctx: Any) -> Any:
        call = recorder.record("api", input, ctx)
        with lock:
            first_429 = len(recorder.of("api")) == 3 and not limited_at
            if first_429:
                limited_at.append(call.at)
        if first_429:
            raise RateLimitedError("429 too many requests", retry_after=str(int(RETRY_AFTER_S)))
        return {"n": input["n"]}

    tool = Tool(tool_id="api", fn=api, pacing=Pacing(rps=20.0, burst=2.0), timeout_s=timeout_s)
    system = make_system([tool], policy=Policy(batch_grace_s=0.05))
    futures = [system.proxy().execute("api", {"n": n}) for n in range(10)]
    results = [f.get(timeout=WAIT_S) for f in futures]

    assert [(r.execution, r.value) for r in results] == [("live", {"n": n}) for n in range(10)]
    assert limited_at, "no 429 was raised (the test would prove nothing)"
    during_pause = [
        c.at - limited_at[0] for c in recorder.of("api") if 0 < c.at - limited_at[0] < 0.9 * RETRY_AFTER_S
    ]
    assert during_pause == [], "requests went out while the provider's Retry-After pause was on"
    assert recorder.count("api") == 11  # ten calls, one of them twice (after its 429); none lost


def test_pacing_unknown_rate_with_a_start_rate_is_not_hit_all_at_once(
    make_system: Any, recorder: Any
) -> None:
    tool = Tool(tool_id="api", fn=echo(recorder, "api"), pacing=Pacing(start_rps=5.0))
    system = make_system([tool])
    futures = [system.proxy().execute("api", {"n": n}) for n in range(6)]
    assert all(f.get(timeout=WAIT_S).execution == "live" for f in futures)
    starts = sorted(c.at for c in recorder.of("api"))
    # slow start from 5/s: sends spaced ~0.2 s apart at first (the rate doubles every 0.5 s)
    assert starts[2] - starts[0] >= 0.25, "an unknown provider got the first calls all at once"


def test_http_tool_slow_starts_when_the_rate_is_not_stated() -> None:
    from actors.http import http_tool
    from actors.pacing.bucket import SLOW_START_RPS

    assert http_tool("t", "http://127.0.0.1:9/x").pacing == Pacing(start_rps=SLOW_START_RPS)
    stated = Pacing(rps=3.0)
    assert http_tool("t", "http://127.0.0.1:9/x", pacing=stated).pacing is stated


@pytest.mark.waits
def test_pacing_slow_provider_does_not_delay_another_provider(make_system: Any, recorder: Any) -> None:
    tools = [
        Tool(tool_id="paced", fn=echo(recorder, "paced"), pacing=Pacing(rps=2, burst=1)),
        Tool(tool_id="free", fn=echo(recorder, "free")),
    ]
    system = make_system(tools)
    start = time.monotonic()
    paced = [system.proxy().execute("paced", {"n": n}) for n in range(4)]  # ~1.5 s at 2 rps, burst 1
    free = system.proxy().execute("free", {"n": 0}).get(timeout=WAIT_S)
    free_done = time.monotonic()
    results = [f.get(timeout=WAIT_S) for f in paced]
    paced_done = time.monotonic()

    assert free.execution == "live" and all(r.execution == "live" for r in results)
    assert free_done - start < 0.4, "the free provider's call waited behind the paced provider"
    assert paced_done - start >= 1.3, "the paced provider was not paced (test would prove nothing)"
    starts = sorted(c.at for c in recorder.of("paced"))
    assert starts[-1] - starts[0] >= 1.3


def test_pacing_cached_call_never_waits(make_system: Any, recorder: Any) -> None:
    first = make_system([Tool(tool_id="geo", fn=echo(recorder, "geo"), provider="maps")], run_id="r1")
    assert first.proxy().execute("geo", {"addr": "1 Main St"}).get(timeout=WAIT_S).execution == "live"
    first.stop()

    slow = Tool(tool_id="geo", fn=echo(recorder, "geo"), provider="maps", pacing=Pacing(rps=0.01, burst=1))
    second = make_system([slow], run_id="r2")
    drain = second.proxy().execute("geo", {"addr": "2 Main St"}).get(timeout=WAIT_S)  # takes the only token
    assert drain.execution == "live"
    starved = second.proxy().execute("geo", {"addr": "3 Main St"})  # next token in ~100 s

    start = time.monotonic()
    cached = second.proxy().execute("geo", {"addr": "1 Main St"}).get(timeout=WAIT_S)
    elapsed = time.monotonic() - start

    assert (cached.execution, cached.value) == ("cached", {"geo": {"addr": "1 Main St"}})
    assert elapsed < 0.5
    assert recorder.count("geo") == 2
    second.stop()  # ends the starved call's wait for pacing
    with pytest.raises(CallCancelledError):
        starved.get(timeout=WAIT_S)
    assert recorder.count("geo") == 2


def test_parallelism_unbatched_calls_launch_at_most_max_concurrency(make_system: Any, recorder: Any) -> None:
    def fn(input: Any, ctx: Any) -> Any:
        with recorder.running("crawl", input, ctx):
            threading.Event().wait(0.03)  # simulated provider latency, so calls overlap
        return {"page": input["n"]}

    system = make_system([Tool(tool_id="crawl", fn=fn, pacing=Pacing(max_concurrency=3))])
    futures = [system.proxy().execute("crawl", {"n": n}) for n in range(12)]
    results = [f.get(timeout=WAIT_S) for f in futures]

    assert [r.value for r in results] == [{"page": n} for n in range(12)]
    assert recorder.count("crawl") == 12
    assert recorder.max_running == 3


def test_circuit_dead_provider_fails_fast_and_recovers_after_a_probe(
    make_system: Any, recorder: Any, read_receipts: Any, key_of: Any
) -> None:
    from actors import ProviderUnavailableError

    up = threading.Event()

    def api(input: Any, ctx: Any) -> Any:
        recorder.record("api", input, ctx)
        if not up.is_set():
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return {"n": input["n"]}

    tool = Tool(tool_id="api", fn=api, pacing=Pacing(max_concurrency=2))
    policy = Policy(batch_grace_s=0.05, retry_attempts=1, circuit_failures=3, circuit_open_s=0.3)
    system = make_system([tool], policy=policy)
    futures = [system.proxy().execute("api", {"n": n}) for n in range(40)]
    errors = []
    for f in futures:
        with pytest.raises(Exception) as caught:
            f.get(timeout=WAIT_S)
        errors.append(caught.value)

    sent = recorder.count("api")
    refused = [n for n, e in enumerate(errors) if isinstance(e, ProviderUnavailableError)]
    assert sent <= 4, f"{sent} requests went to a dead provider; the circuit should stop them after 3"
    assert len(refused) == 40 - sent
    assert "unavailable" in str(errors[refused[0]])
    receipts = read_receipts([key_of(tool, {"n": n}) for n in refused])
    assert all(r is None or r.status.value == "pending" for r in receipts), (
        "refused calls must stay retryable"
    )
    assert system.stats()["unavailable"] == len(refused)

    up.set()  # the provider is back: after the open period one probe goes, then everyone
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            result = system.proxy().execute("api", {"n": 100}).get(timeout=WAIT_S)
            break
        except ProviderUnavailableError:
            assert time.monotonic() < deadline, "the circuit never let a probe through"
            threading.Event().wait(0.05)
    assert result.execution == "live"
    assert [
        f.get(timeout=WAIT_S).execution for f in [system.proxy().execute("api", {"n": n}) for n in refused]
    ] == ["live"] * len(refused)


def test_pacing_unknown_limit_learns_from_when_requests_were_sent(make_system: Any) -> None:
    # an unknown limit's learner gets each accepted request's send time, not only its
    # answer's: behind a slow provider the two differ by its latency (see
    # test_pacing_learn's slow-provider test for why that matters)
    def slow(input: Any, ctx: Any) -> Any:
        time.sleep(0.2)
        return input

    tool = Tool(tool_id="api", fn=slow, pacing=Pacing(start_rps=50.0))
    system = make_system([tool])
    before = time.monotonic()
    futures = [system.proxy().execute("api", {"n": n}) for n in range(3)]
    assert all(f.get(timeout=WAIT_S).execution == "live" for f in futures)
    answered = time.monotonic()
    buckets = system.ports.governor.proxy().governor.get().buckets
    (bucket,) = [b for (_, provider), b in buckets.items() if provider == tool.provider_name]
    sent = list(bucket.learner.sent)
    assert len(sent) == 3 and all(before <= t <= answered - 0.15 for t in sent), (before, sent, answered)
