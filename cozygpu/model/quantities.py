"""Kubernetes quantities, parsed exactly.

Why: budgets come from ResourceQuota ``spec.hard`` and pod requests from
container resources, both written as Kubernetes quantities ("2", "500m",
"1k", "80Gi", "1e3"). Floats would round; a budget must compare exactly, so
values are :class:`fractions.Fraction` and GPU counts are ``int``.

Contract: :func:`parse_quantity` accepts the Kubernetes grammar (sign,
digits with an optional decimal point, then a binary-SI suffix, a decimal-SI
suffix or a decimal exponent) and raises :class:`QuantityError` for
anything else. :func:`whole_units` turns a parsed quantity into a GPU count
and refuses fractions and negatives: an unreadable budget refuses (R-MOD-2).
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(r"([+-]?)(\d+(?:\.\d*)?|\.\d+)(.*)")
_EXPONENT = re.compile(r"[eE]([+-]?\d+)")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity, or not a whole number of units where one is needed."""


def parse_quantity(value: object) -> Fraction:
    """Parse a quantity as stored in JSON (a string, or an integer) into an exact Fraction."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    text = value.strip()
    if text.isdigit() and text.isascii():
        return Fraction(int(text))
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity")
    sign, number, suffix = match.groups()
    magnitude = Fraction(number)
    if suffix in _BINARY:
        magnitude *= _BINARY[suffix]
    elif suffix in _DECIMAL:
        magnitude *= _DECIMAL[suffix]
    else:
        exponent = _EXPONENT.fullmatch(suffix)
        if exponent is None:
            raise QuantityError(f"{value!r} has an unknown suffix {suffix!r}")
        power = int(exponent.group(1))
        if abs(power) > 64:
            raise QuantityError(f"{value!r} has an exponent out of range")
        magnitude *= Fraction(10) ** power
    return -magnitude if sign == "-" else magnitude


def whole_units(value: object) -> int:
    """A quantity that must be a whole, non-negative number of units (a GPU budget or request)."""
    amount = parse_quantity(value)
    if amount.denominator != 1:
        raise QuantityError(f"{value!r} is not a whole number of GPUs")
    if amount < 0:
        raise QuantityError(f"{value!r} is negative")
    return int(amount)
