"""Governors of two runs pacing through one pacer get the runs' weighted fair shares: the
fairness key and weight of each governor (a run's ``RunInfo.fairness_key`` and
``fairness_weight``) go with every take. A plain state machine on a fake clock; the rules
themselves are tested in tests/actors/pacing/test_fair_shares.py."""

from __future__ import annotations

import math

import pytest

from actors import Pacing, Policy, RunInfo
from actors.governor.shared import shared_governor
from actors.pacing.pacers import LocalPacer


@pytest.mark.parametrize(("weights", "expected"), [((1.0, 1.0), (50, 50)), ((3.0, 1.0), (75, 25))])
def test_fair_governors_share_the_rate_by_weight(
    weights: tuple[float, float], expected: tuple[int, int]
) -> None:
    now = [100.0]
    pacer = LocalPacer(clock=lambda: now[0])
    pacings = {"p": Pacing(rps=102.0)}  # paced at 98%: 100/s
    govs = [
        shared_governor(Policy(max_concurrency=10_000), pacings, pacer, rng=lambda: 0.0,
                        fairness_key=key, fairness_weight=w)
        for key, w in zip(("a", "b"), weights, strict=True)
    ]  # fmt: skip
    for i, gov in enumerate(govs):  # each has more calls waiting than the rate serves
        for j in range(200):
            gov.acquire("org", "p", 1, f"reply-{i}-{j}", now[0])
    granted = [0, 0]
    for _ in range(1000):  # one second in steps of 1 ms
        now[0] += 0.001
        for i, gov in enumerate(govs):
            granted[i] += sum(n for _, n in gov.wake(now[0]).grants)
    assert granted[0] == pytest.approx(expected[0], abs=2)
    assert granted[1] == pytest.approx(expected[1], abs=2)


def test_fair_governors_run_info_refuses_a_bad_weight() -> None:
    for weight in (0.0, -1.0, math.nan, math.inf, 1e308, 1e-320, 10**400, True):
        with pytest.raises(ValueError, match="fairness_weight must be a number from 1e-06 to 1e"):
            RunInfo(run_id="r", org_id="o", scope="s", fairness_weight=weight)
    assert RunInfo(run_id="r", org_id="o", scope="s", fairness_weight=3).fairness_weight == 3.0
