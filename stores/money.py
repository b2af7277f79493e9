"""Money: an exact amount of one currency, for prices and what calls cost.

Amounts are :class:`decimal.Decimal` (never binary floats: 0.1 + 0.2 is not 0.3 in
them); a currency is an ISO 4217 alphabetic code (three letters, ``USD``, ``EUR``; its
shape is checked, not its presence in the standard's list, so a provider's own unit such
as ``CRD`` for credits works too). The text form, which receipts keep, is the amount in
plain notation, a space and the code: ``"0.0025 USD"``.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import attrs

__all__ = ["MAX_AMOUNT", "MAX_PLACES", "Money", "total"]

_CODE = re.compile(r"[A-Z]{3}")
_TEXT = re.compile(r"\s*([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]{3})\s*")
_SHARE_PLACES = Decimal("1e-12")
"""The finest unit a split share is rounded to (shares still add up to the whole)."""
MAX_AMOUNT = Decimal("1e15")
"""Amounts are below this (a quadrillion units)..."""
MAX_PLACES = 18
"""...with at most this many decimal places: so every sum and share here is exact."""
_EXACT = decimal.Context(prec=80, traps=[decimal.Inexact, decimal.Overflow, decimal.InvalidOperation])
"""The arithmetic of amounts: 80 digits hold a billion sums of the largest amount at the
finest places; anything inexact raises rather than rounds."""


def _amount(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (Decimal, int, str)):
        raise ValueError(
            f"a money amount must be a Decimal, an int or a decimal string, not {type(value).__name__} "
            f"{value!r} (binary floats are inexact: write Decimal('0.002') or '0.002')"
        )
    try:
        amount = Decimal(value.strip() if isinstance(value, str) else value)
    except decimal.InvalidOperation:
        raise ValueError(f"not a decimal amount: {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"a money amount must be finite and at least 0, not {value!r}")
    if amount >= MAX_AMOUNT or -int(amount.as_tuple().exponent) > MAX_PLACES:
        raise ValueError(
            f"a money amount must be below {MAX_AMOUNT:f} with at most {MAX_PLACES} decimal places, "
            f"not {value!r}"
        )
    return amount.copy_abs()  # (-0 is 0)


def _currency(value: Any) -> str:
    if not isinstance(value, str) or not _CODE.fullmatch(value):
        raise ValueError(f"a currency is an ISO 4217 code, three capital letters ('USD'), not {value!r}")
    return value


@attrs.frozen
class Money:
    """An amount (at least 0) of one currency.

    Args:
        amount: a :class:`~decimal.Decimal`, an int, or a decimal string (``"0.002"``).
        currency: an ISO 4217 alphabetic code (``"USD"``).

    Raises:
        ValueError: a float, NaN, infinity, a negative amount, one of
            :data:`MAX_AMOUNT` or more or with more than :data:`MAX_PLACES` decimal
            places, or a code that is not three capital letters.
    """

    amount: Decimal = attrs.field(converter=_amount)
    currency: str = attrs.field(validator=lambda _, __, value: _currency(value))

    @classmethod
    def parse(cls, text: str) -> Money:
        """``"25USD"``, ``"25 USD"``, ``"0.002 usd"`` (the code's case is ignored).

        Raises:
            ValueError: not an amount followed by a three-letter code.
        """
        match = _TEXT.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"not an amount of money (write it as '25USD' or '0.002 EUR'): {text!r}")
        return cls(match.group(1), match.group(2).upper())

    def __str__(self) -> str:
        """The text form: ``"0.0025 USD"`` (plain notation, no exponent)."""
        return f"{self.amount:f} {self.currency}"

    def __add__(self, other: Money) -> Money:
        """The sum of two amounts of one currency, exact.

        Raises:
            ValueError: the currencies differ, or the sum reaches :data:`MAX_AMOUNT`.
        """
        if not isinstance(other, Money):
            return NotImplemented
        if other.currency != self.currency:
            raise ValueError(f"cannot add {other.currency} to {self.currency}")
        return Money(_EXACT.add(self.amount, other.amount), self.currency)

    def __mul__(self, times: int | Decimal) -> Money:
        """This amount ``times`` times (an int or Decimal, at least 0), exact.

        Raises:
            ValueError: the product reaches :data:`MAX_AMOUNT` or has more than
                :data:`MAX_PLACES` decimal places.
        """
        if isinstance(times, bool) or not isinstance(times, (int, Decimal)):
            return NotImplemented
        try:
            product = _EXACT.multiply(self.amount, Decimal(times))
        except decimal.DecimalException:
            raise ValueError(f"{self} times {times} is not an amount of money") from None
        return Money(product, self.currency)

    __rmul__ = __mul__

    def split(self, n: int) -> list[Money]:
        """``n`` shares (``n`` >= 1) that add up to this amount exactly: equal, to
        :data:`_SHARE_PLACES` of the unit, the first shares one step more where it does
        not divide evenly (a batch request's price over its members).

        Raises:
            ValueError: ``n`` below 1.
        """
        if n < 1:
            raise ValueError(f"split into at least one share, not {n}")
        steps = int(_EXACT.divide(self.amount, _SHARE_PLACES).to_integral_value(decimal.ROUND_FLOOR))
        base, extra = divmod(steps, n)
        rest = _EXACT.subtract(self.amount, _EXACT.multiply(Decimal(steps), _SHARE_PLACES))
        shares = [_EXACT.multiply(Decimal(base + (1 if i < extra else 0)), _SHARE_PLACES) for i in range(n)]
        shares[0] = _EXACT.add(shares[0], rest)  # finer than a step: the first share's
        return [Money(_EXACT.normalize(share) if share else Decimal(0), self.currency) for share in shares]


def total(amounts: Iterable[Money]) -> dict[str, Money]:
    """The sum of ``amounts`` per currency: ``{"USD": Money(...), ...}``."""
    sums: dict[str, Money] = {}
    for money in amounts:
        sums[money.currency] = sums[money.currency] + money if money.currency in sums else money
    return sums
