"""Money: exact amounts of one currency, their text form, sums and shares."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stores.money import Money, total

AMOUNTS = st.decimals(min_value=0, max_value=10**9, allow_nan=False, allow_infinity=False, places=8)


def test_text_form_is_plain_notation_and_parses_back() -> None:
    assert str(Money("0.0025", "USD")) == "0.0025 USD"
    assert str(Money(Decimal("1E-3"), "EUR")) == "0.001 EUR"
    assert Money.parse("25USD") == Money(25, "USD")
    assert Money.parse(" 0.002 usd ") == Money("0.002", "USD")
    assert Money.parse(str(Money("12.50", "GBP"))) == Money("12.5", "GBP")


@given(AMOUNTS)
def test_every_amount_survives_its_text(amount: Decimal) -> None:
    money = Money(amount, "USD")
    assert Money.parse(str(money)) == money


@pytest.mark.parametrize(
    ("amount", "currency"),
    [(0.1, "USD"), (True, "USD"), ("x", "USD"), ("-1", "USD"), ("NaN", "USD"), ("Infinity", "USD"),
     (1, "usd"), (1, "US"), (1, "USDT"), (1, None)],
)  # fmt: skip
def test_floats_negatives_and_bad_codes_are_refused(amount: object, currency: object) -> None:
    with pytest.raises(ValueError):
        Money(amount, currency)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "USD", "25", "25 US", "-1 USD", "1,5 EUR", "one USD", None])
def test_parse_refuses_what_is_not_an_amount_and_a_code(text: object) -> None:
    with pytest.raises(ValueError):
        Money.parse(text)  # type: ignore[arg-type]


def test_sums_stay_within_a_currency() -> None:
    assert Money("0.1", "USD") + Money("0.2", "USD") == Money("0.3", "USD")
    assert Money("0.1", "USD") * 3 == 3 * Money("0.1", "USD") == Money("0.3", "USD")
    with pytest.raises(ValueError, match="EUR"):
        Money(1, "USD") + Money(1, "EUR")
    assert total([Money(1, "USD"), Money(2, "EUR"), Money("0.5", "USD")]) == {
        "USD": Money("1.5", "USD"),
        "EUR": Money(2, "EUR"),
    }


@given(AMOUNTS, st.integers(min_value=1, max_value=500))
def test_shares_add_up_to_the_whole_exactly(amount: Decimal, n: int) -> None:
    shares = Money(amount, "USD").split(n)
    assert len(shares) == n
    assert sum((share.amount for share in shares), Decimal(0)) == amount
    assert max(s.amount for s in shares) - min(s.amount for s in shares) <= amount.max(Decimal("1e-12"))


def test_a_split_into_no_shares_is_refused() -> None:
    with pytest.raises(ValueError):
        Money(1, "USD").split(0)


@pytest.mark.parametrize("amount", ["9e999999", "1e15", "1e-19", "12345678901234567.999999999999"])
def test_amounts_past_the_bounds_are_refused(amount: str) -> None:
    with pytest.raises(ValueError, match="below"):
        Money(amount, "USD")


def test_minus_zero_is_zero_and_survives_its_text() -> None:
    assert str(Money("-0", "USD")) == "0 USD"
    assert Money.parse(str(Money("-0.000", "USD"))) == Money(0, "USD")


def test_sums_and_products_past_the_bound_are_refused_not_rounded() -> None:
    big = Money("999999999999999.999999999999999999", "USD")
    with pytest.raises(ValueError):
        big + big
    with pytest.raises(ValueError):
        Money("0.000000000000000001", "USD") * Decimal("0.5")


@given(
    st.decimals(min_value=0, max_value=Decimal("999999999999999.999999999999999999"), places=18),
    st.integers(1, 1000),
)
def test_shares_of_the_largest_amounts_add_up_exactly(amount: Decimal, n: int) -> None:
    import decimal

    shares = Money(amount, "USD").split(n)
    with decimal.localcontext(decimal.Context(prec=80)):
        assert sum((share.amount for share in shares), Decimal(0)) == amount
