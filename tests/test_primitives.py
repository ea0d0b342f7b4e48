"""The primitive kinds as classes (issue 20 step 7) and COUNT_IF, the aggregate added through them.

* the registry has exactly one class per :data:`PrimitiveKind`, and a kind that forgets a method
  cannot be built (abstract base);
* each class's Δ∞ is the formula of dpgate.sensitivity's table, computed here independently;
* COUNT_IF(cond) is COUNT(*) FILTER (WHERE cond): same plan hash, same sensitivity as COUNT(*)
  (Δ∞ = m, Δ1 = k_eff·m); it renders on DuckDB, PostgreSQL and Spark;
* neighbouring data (hypothesis): adding one unit's rows moves each group's bounded COUNT_IF by
  at most Δ∞ and the vector by at most Δ1 / Δ2;
* adversarial data: a NULL condition, a condition over NaN/±inf/huge values and hostile text
  is never counted as true by accident and never breaks the bound.
"""

from __future__ import annotations

import math
from typing import get_args

import pytest
from _golden_render import duckdb_engine, postgres_engine, spark_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sensitivity import _CON, PROP_POLICY, check_neighbours, extra_unit_rows, rows_strategy, run_primitives

from dpgate.errors import UnknownColumn, UnsupportedQuery
from dpgate.sensitivity import sensitivities
from dpgate.sql.bound import bounded_query
from dpgate.sql.parse import parse_query
from dpgate.sql.plan import PrimitiveKind
from dpgate.sql.primitives import PRIMITIVE_KINDS, PrimitiveKindBase, primitive_kind
from _engines import as_query

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


def test_monotone_and_unit_counting_kinds():
    # a selection utility is monotone for counts (adding a unit only adds rows); the threshold
    # mechanism's unit count is reusable for COUNT(DISTINCT unit), and for COUNT(*) with m = 1
    assert {k for k, c in PRIMITIVE_KINDS.items() if c.monotone} == {"count", "count_column", "count_distinct_unit"}
    assert {k for k, c in PRIMITIVE_KINDS.items() if c.counts_units(True)} == {"count", "count_distinct_unit"}
    assert {k for k, c in PRIMITIVE_KINDS.items() if c.counts_units(False)} == {"count_distinct_unit"}


def test_output_units():
    assert primitive_kind("count").output_unit(0.5) == 1.0
    assert primitive_kind("sum").output_unit(0.5) == 0.5
    assert primitive_kind("sum_squares").output_unit(0.5) == 0.25


# --- COUNT_IF ---------------------------------------------------------------------------------

COUNT_IF = "SELECT g, COUNT_IF(x > 2) AS big, COUNT(*) FROM t GROUP BY g"


def pid(plan, label):
    """The primitive id of the output titled ``label``."""
    return next(o for o in plan.outputs if o.label == label).primitives[0]


def test_count_if_is_count_star_filtered():
    a = parse_query("SELECT COUNT_IF(x > 2 AND g = 'a') FROM t", PROP_POLICY)
    b = parse_query("SELECT COUNT(*) FILTER (WHERE x > 2 AND g = 'a') FROM t", PROP_POLICY)
    assert a.plan_hash == b.plan_hash
    assert [p.kind for p in a.primitives] == ["count_column"]


def test_count_if_has_count_stars_sensitivity():
    plan = parse_query(COUNT_IF, PROP_POLICY)
    s = sensitivities(plan, PROP_POLICY)
    big = pid(plan, "big")
    star = pid(plan, "COUNT(*)")
    # m = 3, k_eff = min(k = 2, 3 keys) = 2: Δ∞ = 3, Δ1 = 6, Δ2 = √2·3
    assert (s[big].linf, s[big].l1, s[big].groups) == (3, 6, 2)
    assert s[big] == s[star]


@pytest.mark.parametrize("engine", [duckdb_engine, postgres_engine, spark_engine])
def test_count_if_renders_on_every_engine(engine):
    e = engine(PROP_POLICY)
    if e is None:
        pytest.skip("pyspark is not installed")
    plan = parse_query(COUNT_IF, PROP_POLICY)
    sql = e.render(as_query(bounded_query(plan, PROP_POLICY, salt=0)))
    assert "CASE WHEN" in sql and "COUNT_IF" not in sql.upper()


@pytest.mark.parametrize("sql, match", [
    ("SELECT COUNT_IF(g) FROM t", "not a boolean"),
    ("SELECT COUNT_IF(y) FROM t", "not a boolean"),
    ("SELECT COUNT_IF(u > 2) FROM t", "privacy unit"),
    ("SELECT COUNT_IF(NULL) FROM t", "a value of type null, not a boolean"),
    ("SELECT COUNT_IF(*) FROM t", "COUNT_IF"),
    ("SELECT COUNT_IF(DISTINCT x > 2) FROM t", "COUNT_IF"),
    ("SELECT COUNT_IF(nope > 2) FROM t", "nope"),
])
def test_count_if_refusals(sql, match):
    with pytest.raises((UnsupportedQuery, UnknownColumn), match=match):
        parse_query(sql, PROP_POLICY)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy(st.integers(0, 5) | st.none()), extra=extra_unit_rows(),
       sql=st.sampled_from([COUNT_IF, "SELECT h, COUNT_IF(g = 'b' OR y < 3) FROM t GROUP BY h",
                            "SELECT COUNT_IF(x IS NULL) FROM t"]),
       salt=st.integers(0, 2**63 - 1))
def test_adding_one_unit_moves_count_if_within_its_sensitivity(rows, extra, sql, salt):
    plan, before = run_primitives("t", rows, sql, salt)
    _, after = run_primitives("t", rows + extra, sql, salt)  # same salt for both neighbours
    check_neighbours(plan, before, after)


def test_the_count_if_bound_is_attained():
    # one unit, 4 rows with x > 2 in each of a, b, c: k = 2 groups kept, m = 3 rows each
    extra = [{"u": 99, "g": g, "h": 0, "x": 5.0, "y": 1} for g in "abc" for _ in range(4)]
    plan, before = run_primitives("t", [], COUNT_IF, 7)
    _, after = run_primitives("t", extra, COUNT_IF, 7)
    big = pid(plan, "big")
    assert sorted(int(b) - int(a) for a, b in zip(before[big], after[big])) == [0, 3, 3]


def test_count_if_on_adversarial_values():
    # NULL conditions (x NULL, NaN, ±inf, a huge y) and hostile text in g: only true conditions
    # count; a text value that looks like SQL is data, never code
    rows = [{"u": 1, "g": "a", "h": 0, "x": None, "y": 1},
            {"u": 2, "g": "a", "h": 0, "x": math.nan, "y": 1},
            {"u": 3, "g": "a", "h": 0, "x": math.inf, "y": 2**62},
            {"u": 4, "g": "a", "h": 0, "x": -math.inf, "y": None},
            {"u": 5, "g": "'); DROP TABLE t; --", "h": 1, "x": 3.0, "y": 1},
            {"u": 6, "g": "b", "h": 1, "x": 3.0, "y": 1}]
    plan, got = run_primitives("t", rows, "SELECT g, COUNT_IF(x > 2) AS big FROM t GROUP BY g", 3)
    big = pid(plan, "big")
    by_key = dict(zip(got["g"], got[big]))
    # one row per unit (≤ m, ≤ k groups): the bounded count is DuckDB's own COUNT_IF on the raw
    # rows, NaN and +inf comparing greater than 2 as in a WHERE; NULL and -inf are not counted;
    # the hostile key is not a public key, so its row is not released at all
    exact = dict(_CON.execute('SELECT g, COUNT_IF(x > 2) FROM "prop"."t" GROUP BY g').fetchall())
    assert by_key == {"a": exact["a"], "b": exact["b"], "c": 0} == {"a": 2, "b": 1, "c": 0}
    # a condition that is NULL on every row counts nothing
    plan, got = run_primitives("t", rows, "SELECT COUNT_IF(y > 2 AND x IS NULL) AS n FROM t", 3)
    assert got[pid(plan, "n")] == [0]
