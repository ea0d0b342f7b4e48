"""Sensitivity of the noisy primitives (dpgate.sensitivity), checked by hand and against
the bounded SQL run in DuckDB on neighbouring datasets (hypothesis property tests).
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpgate.policy import parse_policy
from dpgate.sensitivity import Sensitivity, max_groups_changed, sensitivities
from dpgate.sql.bound import bounded_sql
from dpgate.sql.parse import parse_query
from test_bound import load



def sens(sql, policy):
    plan = parse_query(sql, policy)
    return {plan.primitive(pid).kind + (f":{plan.primitive(pid).column}" if
            plan.primitive(pid).column else ""): s for pid, s in
            sensitivities(plan, policy).items()}


# --- hand-derived values ----------------------------------------------------------------------


def test_grouped_user_level_sensitivities(policy):
    # prompts: k = 2, m = 5; GROUP BY region has 5 public keys → k_eff = min(2, 5) = 2.
    s = sens("SELECT region, COUNT(*), COUNT(DISTINCT user_id), AVG(tokens), VAR_POP(latency) "
             "FROM prompts GROUP BY region", policy)
    r2 = math.sqrt(2)
    # count: linf = m = 5, l1 = k·m = 10, l2 = √k·m
    assert s["count"] == Sensitivity(l1=10, l2=pytest.approx(5 * r2), linf=5, groups=2)
    assert s["count_distinct_unit"].linf == 1 and s["count_distinct_unit"].l1 == 2
    assert s["count_distinct_unit"].l2 == pytest.approx(r2)
    # tokens [0, 8000], resolution 1 → linf = 5 · 8000 = 40000
    assert (s["sum:tokens"].linf, s["sum:tokens"].l1) == (40000, 80000)
    assert s["sum:tokens"].l2 == pytest.approx(40000 * r2)
    assert (s["count_column:tokens"].linf, s["count_column:tokens"].l1) == (5, 10)
    # latency [-10, 100] / 0.5 = [-20, 200] → sum linf = 5 · 200 = 1000,
    # sum of squares linf = 5 · max(20², 200²) = 200000 (units of 0.25)
    assert s["sum:latency"].linf == 1000 and s["sum:latency"].l1 == 2000
    assert s["sum_squares:latency"].linf == 200000 and s["sum_squares:latency"].l1 == 400000
    assert s["sum_squares:latency"].l2 == pytest.approx(200000 * r2)


def test_ungrouped_or_k1_is_one_group(policy):
    # Ungrouped: one group, so k_eff = 1 even though k = 2: l1 = l2 = linf.
    s = sens("SELECT COUNT(*), SUM(age) FROM prompts", policy)
    assert s["count"] == Sensitivity(5, 5, 5, 1)
    assert s["sum:age"] == Sensitivity(500, 500, 500, 1)  # 5 · 100
    # ev: k = 1 → parallel composition across groups: l1 = l2 = linf = m = 3.
    s = sens("SELECT kind, COUNT(*), COUNT(DISTINCT user_id) FROM ev GROUP BY kind", policy)
    assert s["count"] == Sensitivity(3, 3, 3, 1)
    assert s["count_distinct_unit"] == Sensitivity(1, 1, 1, 1)


def test_k_eff_is_capped_by_the_number_of_groups(policy):
    plan = parse_query("SELECT flagged, COUNT(*) FROM prompts GROUP BY flagged", policy)
    assert max_groups_changed(plan, policy) == 2  # min(k = 2, 2 keys)
    plan = parse_query("SELECT region, week, COUNT(*) FROM prompts GROUP BY region, week", policy)
    assert max_groups_changed(plan, policy) == 2  # min(2, 5 · 52)


def test_record_level_sensitivities(policy):
    # pums: no unit → k = m = 1. income [0, 500000] / 100 → [0, 5000]; age [0, 100].
    s = sens("SELECT sex, COUNT(*), SUM(income), STDDEV(age) FROM pums GROUP BY sex", policy)
    assert s["count"] == Sensitivity(1, 1, 1, 1)
    assert s["sum:income"] == Sensitivity(5000, 5000, 5000, 1)
    assert s["sum_squares:age"] == Sensitivity(10000, 10000, 10000, 1)
    assert s["count_column:age"] == Sensitivity(1, 1, 1, 1)


def test_negative_only_bounds_use_the_largest_magnitude():
    raw = {
        "dataset": {"name": "d", "population": "p"},
        "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
        "tables": {"t": {"source": "t.csv", "privacy_unit": "u", "max_groups_per_unit": 3,
                         "max_rows_per_unit": 7, "columns": {
                             "x": {"type": "float", "lower": -30, "upper": -10, "resolution": 2},
                             "g": {"type": "int", "public_keys": "range(0, 10)"}}}},
    }
    pol = parse_policy(raw, Path("x/policies/d.toml"))
    plan = parse_query("SELECT g, SUM(x), VAR_POP(x) FROM t GROUP BY g", pol)
    s = {plan.primitive(k).kind: v for k, v in sensitivities(plan, pol).items()}
    # fixed point [-15, -5]; linf sum = 7 · 15 = 105; squares: 7 · 225 = 1575; k_eff = 3
    assert (s["sum"].linf, s["sum"].l1) == (105, 315)
    assert (s["sum_squares"].linf, s["sum_squares"].l1) == (1575, 4725)
    # l2 = √3 · 105 rounded up: its square is ≥ 3 · 105² exactly
    assert Fraction(s["sum"].l2) ** 2 >= 3 * 105**2
    assert s["sum"].l2 == pytest.approx(math.sqrt(3) * 105, rel=1e-15)
    assert s["sum"].to_dict() == {"l1": 315.0, "l2": s["sum"].l2, "linf": 105.0, "groups": 3}


def test_huge_bounds_round_up(policy):
    # fx: x in ±1e16, resolution 1, m = 3 → linf = 3e16 exactly representable.
    s = sens("SELECT SUM(x) FROM fx", policy)
    assert s["sum:x"].linf == 3e16 and Fraction(s["sum:x"].l1) >= 3 * 10**16


# --- property: neighbouring datasets, run in DuckDB ----------------------------------------------

PROP_POLICY = parse_policy(
    {
        "dataset": {"name": "prop", "population": "p"},
        "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
        "tables": {
            "t": {
                "source": "t.csv", "privacy_unit": "u", "max_groups_per_unit": 2,
                "max_rows_per_unit": 3,
                "columns": {
                    "g": {"type": "text", "public_keys": ["a", "b", "c"]},
                    "h": {"type": "int", "public_keys": [0, 1]},
                    "x": {"type": "float", "lower": -5, "upper": 10, "resolution": 0.5},
                    "y": {"type": "int", "lower": 0, "upper": 7},
                },
            },
            "r": {
                "source": "r.csv",
                "columns": {
                    "g": {"type": "text", "public_keys": ["a", "b", "c"]},
                    "x": {"type": "float", "lower": -5, "upper": 10, "resolution": 0.5},
                    "y": {"type": "int", "lower": 0, "upper": 7},
                },
            },
        },
    },
    Path("prop/policies/prop.toml"),
)

USER_QUERIES = [
    "SELECT g, COUNT(*), COUNT(x), COUNT(DISTINCT u), SUM(x), AVG(y), VAR_POP(x) FROM t GROUP BY g",
    "SELECT g, h, COUNT(*), SUM(y), STDDEV(x), COUNT(y) FROM t GROUP BY g, h",
    "SELECT COUNT(*), SUM(x), SUM(y), COUNT(DISTINCT u), VAR_POP(y) FROM t",
    "SELECT h, COUNT(*), SUM(x), COUNT(DISTINCT u) FROM t WHERE x > 0 OR g = 'b' GROUP BY h",
]
RECORD_QUERIES = [
    "SELECT g, COUNT(*), COUNT(x), SUM(x), VAR_POP(y) FROM r GROUP BY g",
    "SELECT COUNT(*), SUM(y), AVG(x) FROM r WHERE y < 5",
]

x_values = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, None, 1e300, -1e300, 0.0, -0.0, 1e-300]),
    st.integers(-120, 120).map(lambda i: i / 4),
)
y_values = st.one_of(st.sampled_from([None, 2**62, -(2**62), 0, 7]), st.integers(-10, 20))
g_values = st.sampled_from(["a", "b", "c", "z", None])
h_values = st.sampled_from([0, 1, 2, None])


def rows_strategy(units):
    return st.lists(
        st.fixed_dictionaries({"u": units, "g": g_values, "h": h_values, "x": x_values,
                               "y": y_values}),
        max_size=25,
    )


def extra_unit_rows():
    return st.lists(
        st.fixed_dictionaries({"u": st.just(99), "g": g_values, "h": h_values, "x": x_values,
                               "y": y_values}),
        min_size=0,
        max_size=14,
    )


_CON = duckdb.connect()


def run_primitives(table, rows, sql, salt):
    load(_CON, PROP_POLICY, table, rows)
    plan = parse_query(sql, PROP_POLICY)
    res = _CON.execute(bounded_sql(plan, PROP_POLICY, salt=salt))
    names = [d[0] for d in res.description]
    out = res.fetchall()
    return plan, {n: [r[i] for r in out] for i, n in enumerate(names)}


def check_neighbours(plan, before, after):
    """Every primitive moves by ≤ linf per group, ≤ l1 in L1 and ≤ l2 in L2 across groups."""
    for key in plan.group_by:  # same rows, same order: one row per public key
        assert before[key] == after[key]
    for pid, s in sensitivities(plan, PROP_POLICY).items():
        diff = [int(b) - int(a) for a, b in zip(before[pid], after[pid])]
        assert max((abs(d) for d in diff), default=0) <= s.linf, (pid, diff, s)
        assert sum(abs(d) for d in diff) <= s.l1, (pid, diff, s)
        assert Fraction(sum(d * d for d in diff)) <= Fraction(s.l2) ** 2, (pid, diff, s)
        assert sum(1 for d in diff if d) <= s.groups


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=rows_strategy(st.integers(0, 5) | st.none()),
    extra=extra_unit_rows(),
    sql=st.sampled_from(USER_QUERIES),
    salt=st.integers(0, 2**63 - 1),
)
def test_adding_one_unit_moves_each_primitive_within_its_sensitivity(rows, extra, sql, salt):
    plan, before = run_primitives("t", rows, sql, salt)
    _, after = run_primitives("t", rows + extra, sql, salt)  # same salt for both neighbours
    check_neighbours(plan, before, after)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.fixed_dictionaries({"g": g_values, "x": x_values, "y": y_values}),
                  max_size=25),
    extra=st.fixed_dictionaries({"g": g_values, "x": x_values, "y": y_values}),
    position=st.integers(0, 25),
    sql=st.sampled_from(RECORD_QUERIES),
)
def test_adding_one_row_moves_record_level_primitives_within_sensitivity(rows, extra, position,
                                                                           sql):
    plan, before = run_primitives("r", rows, sql, 1)
    _, after = run_primitives("r", rows[:position] + [extra] + rows[position:], sql, 1)
    check_neighbours(plan, before, after)


def test_the_bound_is_attained_so_the_property_test_can_fail():
    # One unit with m = 3 rows at the upper bound in every key adds exactly linf to k_eff = 2
    # groups: the checks above are tight, not vacuous.
    sql = USER_QUERIES[0]
    extra = [{"u": 99, "g": g, "h": 0, "x": 10.0, "y": 7} for g in "abc" for _ in range(4)]
    plan, before = run_primitives("t", [], sql, 7)
    _, after = run_primitives("t", extra, sql, 7)
    check_neighbours(plan, before, after)
    s = sensitivities(plan, PROP_POLICY)
    sum_x = next(p.id for p in plan.primitives if p.kind == "sum" and p.column == "x")
    diff = [b - a for a, b in zip(before[sum_x], after[sum_x])]
    assert sorted(diff) == [0, 60, 60]  # 3 rows · 10 / 0.5 = 60 = linf, in 2 of 3 groups
    assert sum(diff) == s[sum_x].l1 and max(diff) == s[sum_x].linf
    # and a deliberately too small bound is caught
    too_small = {sum_x: Sensitivity(l1=119, l2=84, linf=59, groups=2)}
    with pytest.raises(AssertionError):
        for pid, sv in too_small.items():
            d = [int(b) - int(a) for a, b in zip(before[pid], after[pid])]
            assert max(abs(v) for v in d) <= sv.linf


# --- correctness against a reference implementation (no k-selection involved) --------------------


def _round_half_away(v: float) -> int:
    return int(math.copysign(math.floor(abs(v) + 0.5), v))


def reference(rows, table, group_by, m, kind, column):
    """Per-group value of one primitive, by the bounding rules, in plain Python."""
    t = PROP_POLICY.table(table)
    keys = [t.column(c).public_keys for c in group_by]
    combos = [()] if not group_by else [(a,) for a in keys[0]] if len(keys) == 1 else [
        (a, b) for a in keys[0] for b in keys[1]]
    lo, hi = t.column(column).fixed_point_bounds if column and kind.startswith("sum") else (0, 0)
    parts: dict = {}
    for i, r in enumerate(rows):
        unit = r.get("u", i) if not t.record_level else i
        if unit is None:
            continue
        key = tuple(r.get(c) for c in group_by)
        if key not in combos:
            continue
        v = r.get(column) if column else None
        if column and isinstance(v, float) and not math.isfinite(v):
            v = None
        p = parts.setdefault((unit, key), {"n": 0, "nn": 0, "s": 0, "ss": 0})
        p["n"] += 1
        if v is not None:
            p["nn"] += 1
            if kind.startswith("sum"):
                f = min(max(_round_half_away(v / t.column(column).resolution), lo), hi)
                p["s"] += f
                p["ss"] += f * f
    def m_rows_worth(total: int, count: int) -> int:
        # A unit with count > m values in a group adds m rows' worth, total·m/count rounded to the
        # nearest integer, halves away from zero (sql.primitives.m_rows_worth), so that AVG weighs
        # every unit alike.
        if count <= m:
            return total
        q = Fraction(total * m, count)
        r = int(abs(q) + Fraction(1, 2))
        return r if q >= 0 else -r

    out = {c: 0 for c in combos}
    for (unit, key), p in parts.items():
        out[key] += {
            "count": min(p["n"], m),
            "count_column": min(p["nn"], m),
            "count_distinct_unit": 1,
            "sum": min(max(m_rows_worth(p["s"], p["nn"]), m * min(lo, 0)), m * max(hi, 0)),
            "sum_squares": min(m_rows_worth(p["ss"], p["nn"]), m * max(lo * lo, hi * hi)),
        }[kind]
    return [out[c] for c in combos]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy(st.integers(0, 4) | st.none()), which=st.integers(0, 1))
def test_bounded_sql_matches_the_reference(rows, which):
    # h has 2 public keys and k = 2, and the second query is ungrouped: no unit loses groups.
    sql = ["SELECT h, COUNT(*), COUNT(x), COUNT(DISTINCT u), SUM(x), VAR_POP(y), COUNT(g) "
           "FROM t GROUP BY h",
           "SELECT COUNT(*), SUM(y), STDDEV(x), COUNT(DISTINCT u) FROM t"][which]
    plan, got = run_primitives("t", rows, sql, 3)
    for p in plan.primitives:
        assert got[p.id] == reference(rows, "t", plan.group_by, 3, p.kind, p.column), p


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.fixed_dictionaries({"g": g_values, "x": x_values, "y": y_values}),
                     max_size=25))
def test_record_level_bounded_sql_matches_the_reference(rows):
    plan, got = run_primitives("r", rows, "SELECT g, COUNT(*), SUM(x), VAR_POP(y), COUNT(x) "
                               "FROM r GROUP BY g", 3)
    for p in plan.primitives:
        assert got[p.id] == reference(rows, "r", plan.group_by, 1, p.kind, p.column), p
