"""The bias factor estimates in units are taken at (``actors.lifecycle.units.UnitBias``)."""

from __future__ import annotations

import pytest

from actors.lifecycle.units import COLD_FACTOR, COLD_SAMPLES, MAX_FACTOR, UnitBias
from actors.tool import Limit


def test_bias_is_cold_then_follows_a_high_percentile_not_one_outlier() -> None:
    bias = UnitBias()
    assert bias.factor("tokens") == COLD_FACTOR
    for _ in range(20):
        bias.learn({"tokens": 2000}, {"tokens": 2000})
    bias.learn({"tokens": 50}, {"tokens": 2000})  # a short prompt, a long answer: ratio 40
    assert bias.factor("tokens") == pytest.approx(1.05)


def test_bias_is_capped_and_ignores_absurd_reports() -> None:
    bias = UnitBias()
    for _ in range(COLD_SAMPLES):
        bias.learn({"tokens": 10}, {"tokens": 1e300})
    bias.learn({"tokens": 10}, {"tokens": float("inf")})
    assert bias.factor("tokens") == MAX_FACTOR


def test_bias_is_one_for_a_tool_that_never_reports_real_use() -> None:
    bias = UnitBias()
    for _ in range(COLD_SAMPLES):
        bias.learn({"tokens": 20}, {})
    assert bias.factor("tokens") == 1.0


def test_scaled_is_taken_at_a_quota_the_estimate_fits() -> None:
    bias, quota = UnitBias(), [Limit(400, "minute", "tokens")]
    assert bias.scaled({"tokens": 300}, quota) == {"tokens": 400.0}  # 600 at the cold factor
    assert bias.scaled({"tokens": 500}, quota) == {"tokens": 500.0}  # its estimate passes it
    assert bias.scaled({"tokens": 100}, quota) == {"tokens": 200.0}
