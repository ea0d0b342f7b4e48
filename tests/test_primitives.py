"""The primitive kinds as classes (issue 20 step 7): one class per kind, abstract methods, Δ∞ formulas."""

from __future__ import annotations

import math
from typing import get_args

import pytest

from dpgate.sql.plan import PrimitiveKind
from dpgate.sql.primitives import PRIMITIVE_KINDS, PrimitiveKindBase, primitive_kind

# --- the classes ----------------------------------------------------------------------------


def test_one_class_per_primitive_kind():
    assert set(PRIMITIVE_KINDS) == set(get_args(PrimitiveKind))
    assert all(isinstance(k, PrimitiveKindBase) and k.kind == name for name, k in PRIMITIVE_KINDS.items())
    with pytest.raises(ValueError, match="unknown primitive kind 'median'"):
        primitive_kind("median")


def test_a_kind_that_forgets_a_method_cannot_be_built():
    class Half(PrimitiveKindBase):
        kind = "half"
        row_value = "none"

        def per_unit(self, value, m, lo, hi):
            return None

    with pytest.raises(TypeError, match="abstract"):
        Half()


@pytest.mark.parametrize("kind, m, lo, hi, expected", [
    ("count", 3, 0, 0, 3),                 # m
    ("count_column", 5, 0, 0, 5),          # m
    ("count_distinct_unit", 5, 0, 0, 1),   # one partial per unit and group
    ("count_distinct", 4, 0, 0, 4),        # ≤ m distinct values per unit and group
    ("sum", 3, -10, 20, 60),               # m·max(|lo|, |hi|) = 3·20
    ("sum", 3, -30, 20, 90),               # 3·30
    ("sum_squares", 3, -10, 20, 1200),     # m·max(lo², hi²) = 3·400
])
def test_linf_is_the_table_of_dpgate_sensitivity(kind, m, lo, hi, expected):
    k = primitive_kind(kind)
    assert k.linf(m, lo, hi) == expected
    l1, l2, linf = k.sensitivity(2, m, lo, hi)  # k_eff = 2: Δ1 = 2·Δ∞, Δ2 = √2·Δ∞
    assert (l1, linf) == (2 * expected, expected) and l2 == pytest.approx(math.sqrt(2) * expected)


def test_output_units():
    assert primitive_kind("count").output_unit(0.5) == 1.0
    assert primitive_kind("sum").output_unit(0.5) == 0.5
    assert primitive_kind("sum_squares").output_unit(0.5) == 0.25
