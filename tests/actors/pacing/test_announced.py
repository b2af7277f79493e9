"""Reading the limits an answer announces: every family of fields
(draft-ietf-httpapi-ratelimit-headers current and older, X-RateLimit-*, OpenAI's, Anthropic's,
Kong's), windows inferred, the most explicit family kept, and garbage ignored, never raised."""

from __future__ import annotations

import calendar
import math
import re
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.pacing.announced import Announcement, parse_rate_limit_headers

NOW = 1_800_000_000.0


def _one(headers: object, now: float = NOW) -> Announcement:
    found = parse_rate_limit_headers(headers, now)
    assert len(found) == 1, found
    return found[0]


def test_announced_ietf_current_policies_joined_with_their_state_by_name() -> None:
    found = parse_rate_limit_headers(
        {
            "RateLimit-Policy": '"burst";q=100;w=1, "daily";q=1000;w=86400, "tok";q=20000;qu="tokens";w=60',
            "RateLimit": '"daily";r=993;t=41000, "burst";r=50;t=1',
        },
        NOW,
    )
    assert found == [
        Announcement(limit=100, window_s=1, remaining=50, reset_s=1, name="burst"),
        Announcement(limit=1000, window_s=86400, remaining=993, reset_s=41000, name="daily"),
        Announcement(unit="tokens", limit=20000, window_s=60, name="tok"),
    ]


def test_announced_ietf_current_state_without_its_policy_and_split_fields() -> None:
    assert _one({"RateLimit": '"default";r=50;t=30'}) == Announcement(
        remaining=50, reset_s=30, name="default"
    )
    # a list split over several fields (RFC 9651 section 3.1), as httpx keeps them
    headers = httpx.Headers([("RateLimit-Policy", '"a";q=10;w=1'), ("ratelimit-policy", '"b";q=600;w=60')])
    assert [a.name for a in parse_rate_limit_headers(headers, NOW)] == ["a", "b"]
    # as pairs, as bytes (a raw ASGI/WSGI list)
    assert _one([(b"RateLimit-Policy", b'"p";q=7;w=1')]).limit == 7
    # parameters that are comments, a partition key, a token name: read leniently
    found = _one({"RateLimit-Policy": "peruser;q=100;w=60;pk=:cHsdsRa894==:;acme-burst=5"})
    assert (found.name, found.limit, found.window_s) == ("peruser", 100, 60)


def test_announced_ietf_older_drafts() -> None:
    assert _one({"RateLimit-Limit": "100", "RateLimit-Remaining": "50", "RateLimit-Reset": "30"}) == (
        Announcement(limit=100, window_s=60, remaining=50, reset_s=30, window_stated=False)
    )
    found = parse_rate_limit_headers(
        {
            "RateLimit-Limit": "10",
            "RateLimit-Remaining": "9",
            "RateLimit-Reset": "1",
            "RateLimit-Policy": "10;w=1, 1000;w=3600",
        },
        NOW,
    )
    assert found == [
        Announcement(limit=10, window_s=1, remaining=9, reset_s=1),
        Announcement(limit=1000, window_s=3600),
    ]
    # drafts -00 to -05: the policies follow the limit in RateLimit-Limit
    assert _one({"RateLimit-Limit": "100, 100;w=600", "RateLimit-Reset": "5"}).window_s == 600
    # draft -07: a dictionary
    assert _one({"RateLimit": "limit=100, remaining=50, reset=30", "RateLimit-Policy": "100;w=60"}) == (
        Announcement(limit=100, window_s=60, remaining=50, reset_s=30)
    )


@pytest.mark.parametrize(
    ("reset", "reset_s", "window_s"),
    [
        ("1", 1.0, 1.0),
        ("0", 0.0, 1.0),
        ("37", 37.0, 60.0),
        ("1800", 1800.0, 3600.0),
        ("40000", 40000.0, 86400.0),
        (str(int(NOW) + 1), 1.0, 1.0),  # epoch seconds
        (str(int(NOW) + 1800), 1800.0, 3600.0),
        (str(int(NOW * 1000) + 45_000), 45.0, 60.0),  # epoch milliseconds
        (str(int(NOW) - 5), 0.0, 1.0),  # a reset already past
        ("0.25", 0.25, 1.0),
        ("not a time", None, None),
    ],
)
def test_announced_x_ratelimit_reset_and_the_window_inferred(
    reset: str, reset_s: float | None, window_s: float | None
) -> None:
    found = _one({"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "12", "X-RateLimit-Reset": reset})
    assert found == Announcement(
        limit=60, window_s=window_s, remaining=12, reset_s=reset_s, window_stated=False
    )


def test_announced_x_ratelimit_variants() -> None:
    assert _one({"x-rate-limit-limit": "15", "x-rate-limit-remaining": "3"}) == Announcement(
        limit=15, remaining=3, window_stated=False
    )
    assert _one({"X-RateLimit-Remaining": "-2"}).remaining == 0  # a negative remaining: none left
    assert _one({"X-RateLimit-Limit": "5", "X-RateLimit-Reset-After": "0.5"}).window_s == 1
    assert _one({"X-RateLimit-Limit": "5, 5;w=1"}).limit == 5


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [
        ("6m0s", 360.0),
        ("1s", 1.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0.5", 0.5),
        ("1m", 60.0),
        ("7us", 7e-6),
    ],
)
def test_announced_openai_fields_with_durations(duration: str, seconds: float) -> None:
    found = parse_rate_limit_headers(
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": duration,
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "29000",
            "x-ratelimit-reset-tokens": "12ms",
        },
        NOW,
    )
    requests, tokens = found
    assert requests.unit == "requests" and requests.limit == 500 and requests.remaining == 499
    assert requests.reset_s == pytest.approx(seconds)
    expected = 60 if seconds <= 60 else 3600 if seconds <= 3600 else 86400
    assert requests.window_s == expected  # per minute: a bucket's refill is no window
    assert tokens == Announcement(
        unit="tokens",
        limit=30000,
        window_s=60,
        remaining=29000,
        reset_s=pytest.approx(0.012),
        window_stated=False,
    )


def test_announced_anthropic_fields_with_rfc3339_resets() -> None:
    found = parse_rate_limit_headers(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:02Z",
            "anthropic-ratelimit-tokens-limit": "90000",
            "anthropic-ratelimit-tokens-remaining": "85000",
            "anthropic-ratelimit-tokens-reset": "2027-01-15T09:00:01.5+01:00",
            "anthropic-ratelimit-output-tokens-limit": "8000",
        },
        float(calendar.timegm((2027, 1, 15, 8, 0, 0, 0, 0, 0))),
    )
    assert found == [
        Announcement(limit=50, window_s=60, remaining=49, reset_s=2, window_stated=False),
        Announcement(
            unit="tokens", limit=90000, window_s=60, remaining=85000, reset_s=1.5, window_stated=False
        ),
        Announcement(unit="output_tokens", limit=8000, window_s=60, window_stated=False),
    ]


def test_announced_kong_windows_are_stated() -> None:
    found = parse_rate_limit_headers(
        {
            "X-RateLimit-Limit-Second": "5",
            "X-RateLimit-Remaining-Second": "4",
            "X-RateLimit-Limit-Hour": "1000",
            "X-RateLimit-Remaining-Hour": "990",
        },
        NOW,
    )
    assert [(a.limit, a.window_s, a.remaining) for a in found] == [(5, 1, 4), (1000, 3600, 990)]


def test_announced_the_most_explicit_family_wins() -> None:
    """The example provider's ``--announce`` states one limit in three families."""
    found = parse_rate_limit_headers(
        {
            "RateLimit-Policy": '"requests-1s";q=50;w=1, "tokens-60s";q=20000;w=60;qu="tokens"',
            "RateLimit": '"requests-1s";r=9;t=1, "tokens-60s";r=19000;t=41',
            "X-RateLimit-Limit": "50",
            "X-RateLimit-Remaining": "9",
            "X-RateLimit-Reset": "1",
            "x-ratelimit-limit-tokens": "20000",
            "x-ratelimit-remaining-tokens": "19000",
            "x-ratelimit-reset-tokens": "41s",
        },
        NOW,
    )
    assert [a.name for a in found] == ["requests-1s", "tokens-60s"]
    # a limit only a less explicit family states is kept
    found = parse_rate_limit_headers({"RateLimit-Policy": '"r";q=50;w=1', "X-RateLimit-Limit": "1000"}, NOW)
    assert [a.limit for a in found] == [50, 1000]


MALFORMED = [
    {"RateLimit-Policy": '"a";q=abc;w=1'},
    {"RateLimit-Policy": '"a";w=1'},  # q is required
    {"RateLimit-Policy": '"a";q=10;w=1,'},
    {"RateLimit-Policy": '"a;q=10;w=1'},
    {"RateLimit-Policy": '"a";q=10;w=1 "b";q=5'},
    {"RateLimit-Policy": '"a\\x";q=10'},
    {"RateLimit-Policy": '("a" "b");q=10'},
    {"RateLimit-Policy": '"a";q=1e9'},
    {"RateLimit-Policy": '"a";q=-'},
    {"RateLimit-Policy": '"a";Q=10'},
    {"RateLimit-Policy": '"a";q=:not base64!:'},
    {"RateLimit": '"a";t=10'},  # r is required
    {"RateLimit": '"a";r=?2'},
    {"RateLimit": "limit=, remaining=5"},
    {"RateLimit-Limit": "lots"},
    {"RateLimit-Limit": ""},
    {"RateLimit-Remaining": "NaN"},
    {"RateLimit-Remaining": "inf"},
    {"X-RateLimit-Limit": "1e400"},
    {"X-RateLimit-Limit": "0x10"},
    {"X-RateLimit-Limit": "∞"},
    {"X-RateLimit-Limit": "\u0661\u0660\u0660"},  # Arabic-Indic digits: float() would take them
    {"x-ratelimit-limit-requests": "ten"},
    {"anthropic-ratelimit-requests-limit": "50 requests"},
    {"X-RateLimit": "100"},
    {"": ""},
]


@pytest.mark.parametrize("headers", MALFORMED)
def test_announced_garbage_is_ignored(headers: dict[str, str]) -> None:
    assert parse_rate_limit_headers(headers, NOW) == []


@pytest.mark.parametrize(
    "reset",
    [
        "soon",
        "-5",
        "2027-13-01T00:00:00Z",
        "2027-01-01T25:00:00Z",
        "2027-01-01",
        "1m1",
        "ms",
        "5 s",
        "nan",
        "1e999",
    ],
)
def test_announced_a_bad_reset_is_ignored_the_rest_kept(reset: str) -> None:
    for headers in (
        {"X-RateLimit-Limit": "60", "X-RateLimit-Reset": reset},
        {"anthropic-ratelimit-requests-limit": "60", "anthropic-ratelimit-requests-reset": reset},
        {"x-ratelimit-limit-requests": "60", "x-ratelimit-reset-requests": reset},
    ):
        found = _one(headers)
        assert found.limit == 60 and found.reset_s is None


@pytest.mark.parametrize(
    "headers", [None, 42, "RateLimit: x", [("only-a-name",)], {"a": 1}, {1: "2"}, [b"\xff"]]
)
def test_announced_headers_not_of_a_known_shape_give_nothing(headers: object) -> None:
    assert parse_rate_limit_headers(headers, NOW) == []


def test_announced_a_bad_clock_is_survived() -> None:
    found = _one({"X-RateLimit-Limit": "60", "X-RateLimit-Reset": str(int(NOW) + 30)}, now=math.nan)
    assert found.limit == 60


_NAMES = st.sampled_from(
    [
        "RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
        "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "x-ratelimit-limit-requests",
        "x-ratelimit-reset-tokens", "anthropic-ratelimit-tokens-reset", "anthropic-ratelimit-requests-limit",
        "X-RateLimit-Limit-Minute", "Retry-After",
    ]
)  # fmt: skip
_VALUES = st.one_of(
    st.text(),
    st.text(alphabet='"0123456789;=,.:qwrtu- abc?*()@%\\', max_size=40),
    st.builds(
        '"{}";q={};w={}{}'.format,
        st.text(alphabet="ab", max_size=2),
        st.one_of(st.integers(), st.floats()),
        st.integers(min_value=-5, max_value=10**6),
        st.text(max_size=5),
    ),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)


@given(st.dictionaries(_NAMES, _VALUES, max_size=6), st.floats(allow_nan=True, allow_infinity=True))
def test_announced_never_raises_and_states_only_sane_values(headers: dict[str, str], now: float) -> None:
    for found in parse_rate_limit_headers(headers, now):
        assert found.limit is not None or found.remaining is not None
        for value in (found.limit, found.remaining, found.reset_s):
            assert value is None or (math.isfinite(value) and value >= 0)
        assert found.window_s is None or (math.isfinite(found.window_s) and found.window_s > 0)


def test_announced_reads_a_real_answer_of_the_example_provider(example_provider: object) -> None:
    provider = example_provider("--limit", "50/s", "--limit", "1000/min", "--announce")  # type: ignore[operator]
    response = httpx.post(f"{provider.url}/v1/country", json={"code": "FR"})
    found = parse_rate_limit_headers(response.headers, time.time())
    assert [(a.unit, a.limit, a.window_s, a.remaining) for a in found] == [
        ("requests", 50, 1, 9),
        ("requests", 1000, 60, 999),
    ]
    assert 0 < found[1].reset_s <= 60  # type: ignore[operator]


def test_announced_docs_example_is_true() -> None:
    """docs/pacing.md, "Limits the provider announces": its example runs and its comment
    shows what the parse gives."""
    page = (Path(__file__).resolve().parents[3] / "docs" / "pacing.md").read_text(encoding="utf-8")
    section = page.split("## Limits the provider announces", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert block is not None
    code, shown = block.group(1).rsplit("\n# ", 1)
    *setup, last = code.strip().splitlines()
    scope: dict[str, object] = {}
    exec(compile("\n".join(setup), "docs/pacing.md", "exec"), scope)
    assert repr(eval(last, scope)) == shown.strip()


@pytest.mark.parametrize(("ietf", "gateway"), [(100, 5), (5, 100)])
def test_announced_families_that_disagree_give_one_limit_the_most_explicit(ietf: int, gateway: int) -> None:
    """The IETF fields and ``X-RateLimit-*`` (a gateway in front) state different quotas for
    the same unit and window: one answer, one reading of that limit, the IETF one."""
    found = parse_rate_limit_headers(
        {
            "RateLimit-Policy": f'"burst";q={ietf};w=1',
            "RateLimit": f'"burst";r={ietf - 1};t=1',
            "X-RateLimit-Limit": str(gateway),
            "X-RateLimit-Remaining": str(gateway - 1),
            "X-RateLimit-Reset": "1",
        },
        NOW,
    )
    assert found == [Announcement(limit=ietf, window_s=1, remaining=ietf - 1, reset_s=1, name="burst")]
