"""Post-processing (dpgate.postprocess.finalize): scaling, derived outputs, clamps, accuracy,
suppression, HAVING / ORDER BY / LIMIT on noisy values.

Plans come from the real parser over tests/fixtures/policies/planner.toml; the noisy
primitive vectors are given by hand so every expected value is derived in a comment.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpgate.errors import Internal
from dpgate.postprocess import ReleasedTable, finalize
from dpgate.sql.parse import parse_query

REGIONS = ["eu", "us", "apac", "latam", "africa"]


def with_budget(policy, **changes):
    return dataclasses.replace(policy, budget=dataclasses.replace(policy.budget, **changes))


def pid(plan, kind, column=None):
    return next(p.id for p in plan.primitives if p.kind == kind and p.column == column)


def run(policy, sql, values, *, keys=None, scale=1.0, halfwidth=2.0, mechanism="discrete_gaussian",
        scales=None, halfwidths=None) -> ReleasedTable:
    """values: (kind, column) → noisy vector."""
    plan = parse_query(sql, policy)
    noisy = {pid(plan, k, c): np.asarray(v, dtype=np.int64) for (k, c), v in values.items()}
    assert set(noisy) == {p.id for p in plan.primitives}
    sc = {p: scale for p in noisy} | (scales or {})
    hw = {p: halfwidth for p in noisy} | (halfwidths or {})
    table = finalize(plan, policy, keys or {}, noisy, sc, hw, mechanism=mechanism)
    json.dumps({"rows": table.rows, "accuracy": table.accuracy})  # JSON-ready Python values
    return table


def col(table: ReleasedTable, name: str) -> list:
    i = table.columns.index(name)
    return [r[i] for r in table.rows]


# --- counts and sums ----------------------------------------------------------------------------


def test_counts_clamped_at_zero_and_int(policy):
    keys = {"region": np.array(REGIONS, dtype=object)}
    t = run(policy, "SELECT region, COUNT(*) FROM prompts GROUP BY region",
            {("count", None): [-3, 0, 5, 1, -1]}, keys=keys)
    assert t.columns == ["region", "count"]
    assert t.rows == [["eu", 0], ["us", 0], ["apac", 5], ["latam", 1], ["africa", 0]]
    assert all(type(r[1]) is int for r in t.rows)
    assert t.accuracy == {"count": {"mechanism": "discrete_gaussian", "sigma": 1.0, "ci95": 2.0,
                                    "approximate": False, "suppressed": 0}}
    unclamped = run(with_budget(policy, clamp_counts=False),
                    "SELECT region, COUNT(*) FROM prompts GROUP BY region",
                    {("count", None): [-3, 0, 5, 1, -1]}, keys=keys)
    assert col(unclamped, "count") == [-3, 0, 5, 1, -1]


def test_sum_scaled_by_resolution(policy):
    # latency: resolution 0.5 → noisy fixed-point 3 → 1.5; σ and ci95 scale by 0.5 too.
    t = run(policy, "SELECT SUM(latency), SUM(age) FROM prompts",
            {("sum", "latency"): [3], ("sum", "age"): [-7]}, scale=4.0, halfwidth=8.0,
            mechanism="discrete_laplace")
    assert t.rows == [[1.5, -7]]
    assert type(t.rows[0][1]) is int  # int column, resolution 1
    assert t.accuracy["sum_latency"] == {"mechanism": "discrete_laplace", "scale": 2.0, "ci95": 4.0,
                                         "approximate": False, "suppressed": 0}
    assert t.accuracy["sum_age"]["scale"] == 4.0


def test_sum_of_int_column_with_coarse_resolution(policy):
    # pums.income: int, resolution 100 → 123 units = 12,300.
    t = run(policy, "SELECT SUM(income) FROM pums", {("sum", "income"): [123]})
    assert t.rows == [[12300]] and type(t.rows[0][0]) is int


# --- AVG ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "s, c, expected",
    [
        (500, 10, 50.0),  # plain ratio
        (500, 2, 100.0),  # 250 clamped to upper = 100
        (-10, 5, 0.0),  # −2 clamped to lower = 0
        (40, 0, 40.0),  # denominator floored at 1: 40/1
        (40, -3, 40.0),  # negative noisy count: floored at 1
        (4000, -3, 100.0),  # … then clamped
    ],
)
def test_avg_clamp_and_denominator_floor(policy, s, c, expected):
    t = run(policy, "SELECT AVG(age) FROM prompts", {("sum", "age"): [s], ("count_column", "age"): [c]})
    assert t.rows == [[pytest.approx(expected)]]


def test_avg_interval_is_interval_arithmetic(policy):
    # Each part's interval at 97.5 % (0.05/2 each: the box covers both with probability ≥ 95 %
    # by the union bound). σ_S = 4.5 → 97.5 % half-width 10 (95 %: 9); σ_C = 1 → 2 (both levels):
    # S = 500 ± 10, C = 10 ± 2: S/C ranges over {490/8, 490/12, 510/8, 510/12} →
    # [40.83, 63.75]; AVG = 50 → half-width max(63.75 − 50, 50 − 40.83) = 13.75.
    plan = parse_query("SELECT AVG(age) FROM prompts", policy)
    s_id, c_id = pid(plan, "sum", "age"), pid(plan, "count_column", "age")
    t = finalize(plan, policy, {}, {p.id: np.array([500 if p.kind == "sum" else 10]) for p in plan.primitives},
                 {s_id: 4.5, c_id: 1.0}, {s_id: 9.0, c_id: 2.0}, mechanism="discrete_gaussian")
    acc = t.accuracy["avg_age"]
    assert acc["approximate"] is True
    assert acc["coverage"] == 0.95 and acc["part_coverage"] == 0.975
    assert acc["ci95"] == pytest.approx(13.75) and acc["ci95_rows"] == [pytest.approx(13.75)]
    assert acc["inputs"]["sum"] == {"mechanism": "discrete_gaussian", "sigma": 4.5, "ci95": 9.0,
                                    "approximate": False}
    assert acc["inputs"]["count"]["ci95"] == 2.0


def test_avg_interval_is_capped_by_the_bounds(policy):
    # σ = 2.2 → 97.5 % half-width 5 (95 %: 4). C = 1 ± 5: the count may be ≤ 1, so the ratio
    # can reach both bounds → whole range.
    plan = parse_query("SELECT AVG(age) FROM prompts", policy)
    t = finalize(plan, policy, {}, {p.id: np.array([30 if p.kind == "sum" else 1]) for p in plan.primitives},
                 {p.id: 2.2 for p in plan.primitives}, {p.id: 4.0 for p in plan.primitives},
                 mechanism="discrete_gaussian")
    # AVG = 30; S/C ∈ [25/6, 35] → interval [4.17, 35]; half-width 30 − 4.17 = 25.83.
    assert t.rows == [[30.0]]
    assert t.accuracy["avg_age"]["ci95"] == pytest.approx(30 - 25 / 6)


# --- VAR_POP / STDDEV_POP --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "q, s, c, var",
    [
        (26_000, 500, 10, 100.0),  # E[x²] = 2600, E[x] = 50 → 2600 − 2500
        (10**9, 500, 10, 2500.0),  # E[x²] clamped to 100² = 10⁴ → 10⁴ − 2500 = 7500 → cap (100−0)²/4
        (-500, 500, 10, 0.0),  # E[x²] clamped to 0 → 0 − 2500 → clamped at 0
        (900, 90, 0, 0.0),  # C floored at 1: E[x²] = 900, E[x] = 90 → 900 − 8100 < 0 → 0
        (5_000, 0, 1, 2500.0),  # E[x] = 0, E[x²] = 5000 → 5000 > 2500 → cap
    ],
)
def test_var_and_stddev_clamps(policy, q, s, c, var):
    t = run(policy, "SELECT VAR_POP(age), STDDEV(age), VARIANCE(age) FROM prompts",
            {("sum_squares", "age"): [q], ("sum", "age"): [s], ("count_column", "age"): [c]})
    v, sd, v2 = t.rows[0]
    assert v == pytest.approx(var) and v2 == pytest.approx(var)
    assert sd == pytest.approx(math.sqrt(var))
    assert 0 <= sd <= 50  # (upper − lower)/2
    assert t.accuracy["var_pop_age"]["approximate"] is True
    assert t.accuracy["stddev_pop_age"]["approximate"] is True


def test_var_with_negative_lower_bound(policy):
    # latency ∈ [−10, 100], resolution 0.5: squares in units of 0.25.
    # n = 4 values {−10, 0, 10, 20}: Σx = 20 → 40 units; Σx² = 600 → 2400 units.
    # E[x] = 5, E[x²] = 150 → var = 125.
    t = run(policy, "SELECT VAR_POP(latency), AVG(latency) FROM prompts",
            {("sum_squares", "latency"): [2400], ("sum", "latency"): [40],
             ("count_column", "latency"): [4]})
    assert t.rows == [[pytest.approx(125.0), pytest.approx(5.0)]]


def test_var_interval_hand_value(policy):
    # Q = 26000 ± 0, S = 500 ± 0, C = 10 ± 0: no noise (scales 0) → interval of width 0.
    plan = parse_query("SELECT VAR_POP(age), STDDEV_POP(age) FROM prompts", policy)
    vals = {"sum_squares": 26_000, "sum": 500, "count_column": 10}
    noisy = {p.id: np.array([vals[p.kind]]) for p in plan.primitives}
    zero = {p.id: 0.0 for p in plan.primitives}
    t = finalize(plan, policy, {}, noisy, zero, zero, mechanism="discrete_gaussian")
    assert t.accuracy["var_pop_age"]["ci95"] == pytest.approx(0.0, abs=1e-9)
    # With C ± 1 (σ_C = 0.5: its 98.33 % half-width, 0.05/3 per part, is 1):
    # E[x] ∈ [500/11, 500/9] = [45.45, 55.56], E[x²] ∈ [2363.6, 2888.9];
    # var ∈ [2363.6 − 55.56², 2888.9 − 45.45²] = [−723.0 → 0, 822.3]; half-width from 100: 722.3.
    c_id = pid(plan, "count_column", "age")
    t = finalize(plan, policy, {}, noisy, dict(zero) | {c_id: 0.5}, dict(zero) | {c_id: 1.0},
                 mechanism="discrete_gaussian")
    assert t.accuracy["var_pop_age"]["part_coverage"] == pytest.approx(1 - 0.05 / 3)
    expected = 26_000 / 9 - (500 / 11) ** 2 - 100
    assert t.accuracy["var_pop_age"]["ci95"] == pytest.approx(expected)
    # STDDEV: √822.3 − 10 = 18.68 vs 10 − 0 = 10 → 18.68.
    assert t.accuracy["stddev_pop_age"]["ci95"] == pytest.approx(math.sqrt(100 + expected) - 10)


@settings(max_examples=200, deadline=None)
@given(
    q=st.integers(-(10**9), 10**9),
    s=st.integers(-(10**7), 10**7),
    c=st.integers(-1000, 10**6),
)
def test_derived_outputs_always_within_bounds(policy, q, s, c):
    t = run(policy, "SELECT AVG(latency), VAR_POP(latency), STDDEV_POP(latency) FROM prompts",
            {("sum_squares", "latency"): [q], ("sum", "latency"): [s], ("count_column", "latency"): [c]})
    avg, var, sd = t.rows[0]
    assert -10 <= avg <= 100
    assert 0 <= var <= 110**2 / 4
    assert 0 <= sd <= 55
    for name in ("avg_latency", "var_pop_latency", "stddev_pop_latency"):
        assert 0 <= t.accuracy[name]["ci95"] <= 110**2 / 4


# --- HAVING / ORDER BY / LIMIT ------------------------------------------------------------------


SQL_HAVING = ("SELECT region, COUNT(*) AS n FROM prompts GROUP BY region "
              "HAVING n > 3 AND SUM(tokens) > 10 ORDER BY n DESC LIMIT 2")


def test_having_order_by_limit_on_noisy_values(policy):
    keys = {"region": np.array(REGIONS, dtype=object)}
    #            eu  us  apac latam africa
    counts = [10, 2, 7, 30, 5]
    tokens = [50, 99, 5, 20, 60]  # apac fails SUM(tokens) > 10; us fails n > 3
    t = run(policy, SQL_HAVING, {("count", None): counts, ("sum", "tokens"): tokens}, keys=keys)
    # Kept: eu (10), latam (30), africa (5); by n DESC: latam, eu, africa; LIMIT 2.
    assert t.columns == ["region", "count"]  # the hidden SUM(tokens) is not released
    assert t.rows == [["latam", 30], ["eu", 10]]
    assert set(t.accuracy) == {"count"}


def test_order_by_key_and_ties_are_stable(policy):
    keys = {"region": np.array(REGIONS, dtype=object)}
    t = run(policy, "SELECT region, COUNT(*) FROM prompts GROUP BY region ORDER BY COUNT(*), region DESC",
            {("count", None): [1, 2, 1, 2, 1]}, keys=keys)
    assert [r[0] for r in t.rows] == ["eu", "apac", "africa", "us", "latam"]


def test_no_order_by_keeps_public_key_order(policy):
    keys = {"week": np.arange(52)}
    t = run(policy, "SELECT week, COUNT(*) FROM prompts GROUP BY week",
            {("count", None): np.arange(52)[::-1]}, keys=keys)
    assert [r[0] for r in t.rows] == list(range(52))
    assert all(type(r[0]) is int for r in t.rows)


def test_having_on_key_and_is_null(policy):
    keys = {"region": np.array(REGIONS, dtype=object)}
    t = run(policy, "SELECT region, COUNT(*) FROM prompts GROUP BY region "
                    "HAVING region IN ('eu', 'apac') OR COUNT(*) IS NULL",
            {("count", None): [1, 2, 3, 4, 5]}, keys=keys)
    assert [r[0] for r in t.rows] == ["eu", "apac"]


def test_limit_zero(policy):
    t = run(policy, "SELECT COUNT(*) FROM prompts LIMIT 0", {("count", None): [3]})
    assert t.rows == [] and t.accuracy["count"]["ci95"] == 2.0


# --- suppression -----------------------------------------------------------------------------------


def test_suppression_of_wide_cells(policy):
    strict = with_budget(policy, suppress_ci95_above=5.0)
    keys = {"region": np.array(REGIONS, dtype=object)}
    plan = parse_query("SELECT region, COUNT(*), SUM(tokens), AVG(age) FROM prompts GROUP BY region", strict)
    noisy = {p.id: np.array([100, 3, 50, 0, 20]) for p in plan.primitives}
    sc = {p.id: 1.0 for p in plan.primitives}
    hw = {p.id: 2.0 for p in plan.primitives} | {pid(plan, "sum", "tokens"): 6.0}
    t = finalize(plan, strict, keys, noisy, sc, hw, mechanism="discrete_gaussian")
    # COUNT: ci95 2 ≤ 5 → kept. SUM(tokens): ci95 6 > 5 → every cell suppressed.
    assert col(t, "count") == [100, 3, 50, 0, 20]
    assert col(t, "sum_tokens") == [None] * 5
    assert t.accuracy["sum_tokens"]["suppressed"] == 5 and t.accuracy["count"]["suppressed"] == 0
    # AVG(age) = S/C with S = C (same vector), both ± 2: interval arithmetic per row:
    # C = 100 → [98/102, 102/98], narrow; C = 3 → S/C ∈ [1/5, 5/1], AVG 1, half-width 4 ≤ 5;
    # C = 0 → AVG = 0/1 = 0, S/C ∈ [−2, 2] clipped to [0, 2], half-width 2; C = 20: narrow.
    avg = col(t, "avg_age")
    assert None not in avg
    wide = run(strict, "SELECT AVG(age) FROM prompts", {("sum", "age"): [30], ("count_column", "age"): [1]},
               halfwidth=5.0)
    assert wide.rows == [[None]] and wide.accuracy["avg_age"]["suppressed"] == 1


def test_suppressed_cells_are_null_in_having_and_order_by(policy):
    strict = with_budget(policy, suppress_ci95_above=5.0)
    keys = {"region": np.array(REGIONS, dtype=object)}
    sql = ("SELECT region, AVG(age) AS a FROM prompts GROUP BY region HAVING a > 1 OR a IS NULL "
           "ORDER BY a")
    # counts per region: eu 100, us 1 (wide → NULL), apac 50, latam 1 (NULL), africa 20
    t = run(strict, sql, {("sum", "age"): [300, 30, 500, 40, 400],
                          ("count_column", "age"): [100, 1, 50, 1, 20]}, keys=keys, halfwidth=3.0)
    # a: eu 3, apac 10, africa 20; us/latam NULL (kept by IS NULL), NULLS LAST in ascending order.
    assert t.rows == [["eu", pytest.approx(3.0)], ["apac", pytest.approx(10.0)],
                      ["africa", pytest.approx(20.0)], ["us", None], ["latam", None]]
    desc = run(strict, sql.replace("ORDER BY a", "ORDER BY a DESC NULLS FIRST"),
               {("sum", "age"): [300, 30, 500, 40, 400],
                ("count_column", "age"): [100, 1, 50, 1, 20]}, keys=keys, halfwidth=3.0)
    assert [r[0] for r in desc.rows] == ["us", "latam", "africa", "apac", "eu"]


# --- input checks -----------------------------------------------------------------------------------


def test_mismatched_inputs_are_internal_errors(policy):
    plan = parse_query("SELECT region, COUNT(*) FROM prompts GROUP BY region", policy)
    keys = {"region": np.array(REGIONS, dtype=object)}
    good = {"p0": np.zeros(5, dtype=np.int64)}
    one = {"p0": 1.0}
    with pytest.raises(Internal):
        finalize(plan, policy, keys, {}, one, one, mechanism="discrete_gaussian")
    with pytest.raises(Internal):
        finalize(plan, policy, keys, {"p0": np.zeros(4, dtype=np.int64)}, one, one, mechanism="discrete_gaussian")
    with pytest.raises(Internal):
        finalize(plan, policy, {}, good, one, one, mechanism="discrete_gaussian")
    ungrouped = parse_query("SELECT COUNT(*) FROM prompts", policy)
    with pytest.raises(Internal):
        finalize(ungrouped, policy, {}, {"p0": np.zeros(2, dtype=np.int64)}, one, one,
                 mechanism="discrete_gaussian")


def test_resolution_override(policy):
    plan = parse_query("SELECT SUM(tokens) FROM prompts", policy)
    t = finalize(plan, policy, {}, {"p0": np.array([7])}, {"p0": 1.0}, {"p0": 2.0},
                 mechanism="discrete_gaussian", resolution_of=lambda c: 0.01)
    assert t.rows == [[0.07]]  # rounded to the resolution's decimals


def test_non_finite_numbers_never_reach_the_release(policy):
    # Issue 9 item 1 (defence in depth): the policy limits make every released double finite;
    # if one were not (here forced with a resolution of 1e300, beyond the loader's 1e100), the
    # cell and its accuracy are released as null, never as NaN/inf that no JSON reader accepts.
    plan = parse_query("SELECT SUM(tokens), AVG(tokens), COUNT(*) FROM prompts", policy)
    ids = {(p.kind, p.column): p.id for p in plan.primitives}
    noisy = {ids[("sum", "tokens")]: np.array([2**62]), ids[("count_column", "tokens")]: np.array([3]),
             ids[("count", None)]: np.array([3])}
    one = {pid: 1.0 for pid in noisy}
    t = finalize(plan, policy, {}, noisy, one, one, mechanism="discrete_gaussian",
                 resolution_of=lambda c: 1e300)
    json.dumps({"rows": t.rows, "accuracy": t.accuracy}, allow_nan=False)  # strict JSON
    assert t.rows[0][0] is None  # 2^62 · 1e300 = inf
    assert t.rows[0][2] == 3
    assert t.accuracy["sum_tokens"]["sigma"] == 1e300


def test_an_exact_primitive_has_zero_sigma_and_ci95(policy):
    plan = parse_query("SELECT SUM(tokens) FROM prompts", policy)
    t = finalize(plan, policy, {}, {"p0": np.array([0])}, {"p0": 0.0}, {"p0": 0.0},
                 mechanism="discrete_gaussian")
    assert t.rows == [[0.0]] and t.accuracy["sum_tokens"]["sigma"] == 0.0
    assert t.accuracy["sum_tokens"]["ci95"] == 0.0
