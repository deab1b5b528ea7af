from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cozygpu.model.quantities import QuantityError, parse_quantity, whole_units


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Fraction(2)),
        ("500m", Fraction(1, 2)),
        ("1k", Fraction(1000)),
        ("80Gi", Fraction(80 * 2**30)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("1E", Fraction(10**18)),
        ("-2", Fraction(-2)),
        ("+3", Fraction(3)),
        ("129e-2", Fraction(129, 100)),
        (4, Fraction(4)),
    ],
)
def test_quantities_parse_exactly(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "two", "1x", "1 Gi", "1.2.3", "Gi", "1KiB", True, 1.5, None])
def test_anything_but_a_quantity_is_refused(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_a_gpu_count_must_be_whole_and_not_negative() -> None:
    assert whole_units("4") == 4
    assert whole_units("4000m") == 4
    with pytest.raises(QuantityError, match="whole number"):
        whole_units("1500m")
    with pytest.raises(QuantityError, match="negative"):
        whole_units("-1")


@given(st.integers(min_value=0, max_value=10**12))
def test_an_integer_written_as_text_reads_back_as_itself(n: int) -> None:
    assert whole_units(str(n)) == n
    assert parse_quantity(f"{n}m") == Fraction(n, 1000)
