"""The example provider's limits (``--limit``) and the fields stating them (``--announce``):
several limits per API key, fixed windows, token limits charged the real use, 429 with
whole-second ``Retry-After`` naming the window's end, ``/stats`` per second and window,
and ``POST /limits`` mid-run. A real ``examples/provider.py`` process over HTTP."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "provider.py"


def _post(url: str, body: Any, key: str = "k") -> tuple[int, dict[str, str], Any]:
    """POST ``body`` as JSON; (status, fields by lower-case name, JSON body)."""
    request = urllib.request.Request(
        url, method="POST", data=json.dumps(body).encode(), headers={"X-Api-Key": key}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, json.load(response)
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, {k.lower(): v for k, v in refused.headers.items()}, json.load(refused)


def _policy(fields: dict[str, str]) -> str:
    return fields.get("ratelimit-policy", "")


def test_provider_window_limit_refuses_until_the_window_ends_and_announces_it(
    example_provider: Callable[..., Any],
) -> None:
    provider = example_provider("--limit", "5/min", "--announce")
    answers = [_post(f"{provider.url}/v1/country", {"code": "FR"}) for _ in range(7)]
    assert [status for status, _, _ in answers] == [200] * 5 + [429] * 2
    assert {_policy(fields) for _, fields, _ in answers} == {'"requests-60s";q=5;w=60'}
    remaining = [re.fullmatch(r'"requests-60s";r=(\d+);t=(\d+)', f["ratelimit"]) for _, f, _ in answers]
    assert [int(m.group(1)) for m in remaining if m] == [4, 3, 2, 1, 0, 0, 0]
    assert all(0 < int(m.group(2)) <= 60 for m in remaining if m)
    assert [f["x-ratelimit-remaining"] for _, f, _ in answers] == ["4", "3", "2", "1", "0", "0", "0"]
    assert {f["x-ratelimit-limit"] for _, f, _ in answers} == {"5"}
    for _, fields, _ in answers[5:]:  # whole seconds until the window's end
        assert re.fullmatch(r"\d+", fields["retry-after"]) and 1 <= int(fields["retry-after"]) <= 60
        assert abs(int(fields["retry-after"]) - int(fields["x-ratelimit-reset"])) <= 1
    assert _post(f"{provider.url}/v1/country", {"code": "FR"}, key="other")[0] == 200  # per API key
    stats = provider.stats()
    assert stats["windows"]["5/min"]["0"] == {"accepted": 6, "rate_limited": 2, "used": 6}
    assert sum(s.get("accepted", 0) for s in stats["per_second"].values()) == 6
    assert sum(s.get("rate_limited", 0) for s in stats["per_second"].values()) == stats["rate_limited"] == 2


def test_provider_several_limits_each_enforced(example_provider: Callable[..., Any]) -> None:
    provider = example_provider("--limit", "100/s", "--limit", "3/min", "--announce", "--burst", "50")
    statuses = [_post(f"{provider.url}/v1/domain", {"domain": "a.fr"})[0] for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]  # the bucket holds 50: the minute's 3 refuse
    _, fields, _ = _post(f"{provider.url}/v1/domain", {"domain": "a.fr"})
    assert _policy(fields) == '"requests-1s";q=100;w=1, "requests-60s";q=3;w=60'
    assert fields["ratelimit"].startswith('"requests-1s";r=47;t=1, "requests-60s";r=0;t=')
    assert fields["x-ratelimit-limit"] == "100"  # the first requests limit


def test_provider_token_limit_admits_on_the_stated_tokens_and_charges_the_real_use(
    example_provider: Callable[..., Any],
) -> None:
    provider = example_provider("--limit", "1000/min:tokens", "--announce")
    url = f"{provider.url}/v1/country"
    status, fields, body = _post(url, {"code": "FR", "tokens": 400, "used": 600})
    assert (status, body["usage"], fields["x-ratelimit-remaining-tokens"]) == (200, {"tokens": 600}, "400")
    assert _policy(fields) == '"tokens-60s";q=1000;w=60;qu="tokens"'
    assert fields["x-ratelimit-limit-tokens"] == "1000"
    assert re.fullmatch(r"(\d+m)?\d+s", fields["x-ratelimit-reset-tokens"])
    assert "x-ratelimit-limit" not in fields  # no requests limit to state
    status, fields, body = _post(
        f"{url}/batch", {"items": [{"code": "DE", "tokens": 150}, {"code": "IT", "tokens": 150}]}
    )
    assert (status, body["usage"], fields["x-ratelimit-remaining-tokens"]) == (200, {"tokens": 300}, "100")
    status, fields, _ = _post(url, {"code": "ES", "tokens": 200, "used": 10})
    assert status == 429 and re.fullmatch(r"\d+", fields["retry-after"])
    assert _post(url, {"code": "ES", "tokens": 90, "used": 10})[0] == 200
    assert _post(url, {"code": "ES", "tokens": 5000})[0] == 413  # never fits
    assert _post(url, {"code": "ES", "tokens": "many"})[0] == 400
    assert _post(url, {"code": "ES"})[2].get("usage") is None  # states none: uses none
    window = provider.stats()["windows"]["1000/min:tokens"]["0"]
    assert window == {"accepted": 4, "rate_limited": 1, "used": 910}


def test_provider_without_announce_states_no_limits(example_provider: Callable[..., Any]) -> None:
    provider = example_provider("--rate", "5", "--burst", "2")
    answers = [_post(f"{provider.url}/v1/country", {"code": "FR"}) for _ in range(3)]
    assert [status for status, _, _ in answers] == [200, 200, 429]
    assert float(answers[2][1]["retry-after"]) < 1  # the bucket's decimal wait, as before
    assert not [name for _, fields, _ in answers for name in fields if "ratelimit" in name]


def test_provider_limits_changed_mid_run(example_provider: Callable[..., Any]) -> None:
    provider = example_provider("--rate", "50", "--announce")
    assert _policy(_post(f"{provider.url}/v1/country", {"code": "FR"})[1]) == '"requests-1s";q=50;w=1'
    provider.set_limits("200/s", "10/h")
    fields = _post(f"{provider.url}/v1/country", {"code": "FR"})[1]
    assert _policy(fields) == '"requests-1s";q=200;w=1, "requests-3600s";q=10;w=3600'
    assert re.search(r'"requests-3600s";r=9;t=\d+$', fields["ratelimit"])


def test_provider_refuses_a_bad_limit() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--limit", "50/fortnight"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "50/fortnight" in run.stderr
