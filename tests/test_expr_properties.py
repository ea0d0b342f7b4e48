"""Interval arithmetic of row expressions (dpgate.sql.expr / dpgate.sql.bind), checked in DuckDB.

Random expression trees over bounded columns are planned as ``SUM(<expr>)``; each row value
is drawn inside the declared bounds or from the hostile set (NULL, NaN, ±inf, values far
outside the bounds, 64-bit extremes). The executable per-row value that the bounding
rewrite aggregates (:func:`dpgate.sql.expr.value_sql`) is evaluated by DuckDB and must
(1) never raise, (2) be NULL or a finite number inside the derived interval and inside the
published clamp [lower, upper]. A neighbouring-data test checks that removing one unit moves
the exact bounded vector of an expression aggregate by at most the derived sensitivity.
"""

from __future__ import annotations

import math
from fractions import Fraction

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.sensitivity import sensitivities
from dpgate.sql.bind import bind_value
from dpgate.sql.bound import bounded_sql
from dpgate.sql.expr import value_sql
from dpgate.sql.parse import parse_query

POLICY = """
[dataset]
name = "ex"
population = "ex-people"
[budget]
epsilon = 1.0
delta = 1e-6
default_query_rho = 0.01
[tables.t]
source = "t.csv"
privacy_unit = "uid"
max_groups_per_unit = 2
max_rows_per_unit = 3
[tables.t.columns]
a = { type = "int", lower = -5, upper = 7 }
b = { type = "int", lower = 0, upper = 3 }
big = { type = "int", lower = -1000000000000000000, upper = 1000000000000000000 }
x = { type = "float", lower = -2.5, upper = 10, resolution = 0.5 }
y = { type = "float", lower = 0.5, upper = 4, resolution = 0.5 }
g = { type = "int", public_keys = [0, 1, 2] }
flag = { type = "bool" }
"""

BOUNDS = {"a": (-5, 7), "b": (0, 3), "big": (-10**18, 10**18), "x": (-2.5, 10.0), "y": (0.5, 4.0)}


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    d = tmp_path_factory.mktemp("p")
    (d / "t.csv").write_text("uid\n")
    (d / "ex.toml").write_text(POLICY)
    from dpgate.policy import load_policy

    return load_policy(d / "ex.toml")


# --- generators -------------------------------------------------------------------------------

_int_leaf = st.sampled_from(["a", "b", "1", "2", "-3", "0", "100"])
_float_leaf = st.sampled_from(["x", "y", "0.5", "2.25", "0.1", "1e3"])
_cond = st.sampled_from(["a > 2", "x <= 1.5", "flag", "b = 0", "y BETWEEN 1 AND 2", "a IS NULL",
                         "NOT flag", "a + b > 3"])


def _extend(children):
    two = st.tuples(children, children)
    return st.one_of(
        two.map(lambda t: f"({t[0]} + {t[1]})"),
        two.map(lambda t: f"({t[0]} - {t[1]})"),
        two.map(lambda t: f"({t[0]} * {t[1]})"),
        two.map(lambda t: f"({t[0]} / {t[1]})"),
        children.map(lambda c: f"(-({c}))"),
        children.map(lambda c: f"ABS({c})"),
        children.map(lambda c: f"FLOOR({c})"),
        children.map(lambda c: f"CEIL({c})"),
        children.map(lambda c: f"ROUND({c})"),
        children.map(lambda c: f"CAST({c} AS BIGINT)"),
        children.map(lambda c: f"CAST({c} AS DOUBLE)"),
        two.map(lambda t: f"LEAST({t[0]}, {t[1]})"),
        two.map(lambda t: f"GREATEST({t[0]}, {t[1]})"),
        children.map(lambda c: f"COALESCE({c}, 4)"),
        st.tuples(_cond, children, children).map(
            lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"),
        st.tuples(_cond, children).map(lambda t: f"CASE WHEN {t[0]} THEN {t[1]} END"),
        st.tuples(_cond, children, children).map(lambda t: f"IF({t[0]}, {t[1]}, {t[2]})"),
        _cond.map(lambda c: f"({c})"),
    )


expressions = st.recursive(st.one_of(_int_leaf, _float_leaf, st.just("big")), _extend,
                           max_leaves=6)

_hostile_int = st.sampled_from([None, -2**63, 2**63 - 1, -10**12, 10**12, -1, 0])
_hostile_float = st.sampled_from([None, math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324,
                                  -0.0])


def _int_values(name):
    lo, hi = BOUNDS[name]
    return st.one_of(st.integers(lo, hi), _hostile_int)


def _float_values(name):
    lo, hi = BOUNDS[name]
    return st.one_of(st.floats(lo, hi), _hostile_float)


rows = st.lists(st.fixed_dictionaries({
    "a": _int_values("a"), "b": _int_values("b"), "big": _int_values("big"),
    "x": _float_values("x"), "y": _float_values("y"),
    "flag": st.sampled_from([None, True, False]),
}), min_size=1, max_size=12)


def _relation(con, data):
    arrow = pa.table({
        "a": pa.array([r["a"] for r in data], pa.int64()),
        "b": pa.array([r["b"] for r in data], pa.int64()),
        "big": pa.array([r["big"] for r in data], pa.int64()),
        "x": pa.array([r["x"] for r in data], pa.float64()),
        "y": pa.array([r["y"] for r in data], pa.float64()),
        "flag": pa.array([r["flag"] for r in data], pa.bool_()),
    })
    con.register("rows_in", arrow)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions, rows)
def test_every_row_value_lies_in_the_derived_interval(policy, text, data):
    try:
        plan = parse_query(f"SELECT SUM({text}) FROM t", policy)
    except UnsupportedQuery:
        return  # refused at planning (unbounded, division by a range holding 0, overflow)
    table = policy.table("t")
    p = plan.primitives[0]
    col = plan.column_policy(table, p.column)
    if not plan.values:  # a bare column after simplification: the policy clamp applies
        assert col.name in BOUNDS
        return
    e = bind_value(__import__("sqlglot").parse_one(p.column, read="duckdb"), table)
    v = value_sql(e, lambda n: exp.column(n, table="rows_in", quoted=True))
    con = duckdb.connect()
    try:
        _relation(con, data)
        got = [r[0] for r in con.execute(f"SELECT {v.sql(dialect='duckdb')} FROM rows_in").fetchall()]
    finally:
        con.close()
    for value in got:
        if value is None:
            continue
        assert math.isfinite(value), (text, value)
        exact = Fraction(value)
        assert e.range.lo <= exact <= e.range.hi, (text, value, str(e.range))
        assert col.lower <= value <= col.upper, (text, value, col.lower, col.upper)


def test_examples_of_derived_ranges(policy):
    def values(sql):
        return parse_query(sql, policy).values

    (v,) = values("SELECT SUM(CASE WHEN a > 2 THEN 1 ELSE 0 END) FROM t")
    assert (v.lower, v.upper, v.resolution, v.type) == (0, 1, 1, "int")
    (v,) = values("SELECT SUM(10.0 / (b + 1)) FROM t")  # b ∈ [0, 3]: 10/4 … 10/1
    assert v.lower <= 2.5 and v.upper >= 10 and v.upper - 10 < 1e-5 and 2.5 - v.lower < 1e-5
    (v,) = values("SELECT SUM(LEAST(a, 3)) FROM t")  # 3 is never NULL: the result is ≤ 3
    assert (v.lower, v.upper) == (-5, 3)
    (v,) = values("SELECT SUM(GREATEST(a, b)) FROM t")  # both nullable: either may be alone
    assert (v.lower, v.upper) == (-5, 7)
    (v,) = values("SELECT SUM(COALESCE(a, 100)) FROM t")
    assert (v.lower, v.upper) == (-5, 100)
    (v,) = values("SELECT SUM(ABS(a - 10)) FROM t")  # a − 10 ∈ [−15, −3]
    assert (v.lower, v.upper) == (3, 15)
    (v,) = values("SELECT SUM(a * b) FROM t")  # corners: −15, 21
    assert (v.lower, v.upper) == (-15, 21)


@pytest.mark.parametrize("sql, text", [
    ("SELECT SUM(10.0 / b) FROM t", "contains 0"),
    ("SELECT SUM(10.0 / (a + 1)) FROM t", "contains 0"),
    ("SELECT SUM(big * big) FROM t", "overflow"),
    ("SELECT SUM(big * 10) FROM t", "overflow"),
    ("SELECT SUM(g) FROM t", "no bounds"),
    ("SELECT SUM(a + g) FROM t", "'g' has no bounds"),
    ("SELECT SUM(CASE WHEN uid = 42 THEN a * 1000000 ELSE 0 END) FROM t", "privacy unit"),
    ("SELECT SUM(a) FROM t WHERE uid = 42", "privacy unit"),
    ("SELECT COUNT(*) FILTER (WHERE uid > 3) FROM t", "privacy unit"),
    ("SELECT SUM(a % 2) FROM t", "modulo"),
    ("SELECT SUM(CAST(flag AS VARCHAR)) FROM t", "CAST to"),
    ("SELECT AVG(SUM(a)) FROM t", "nested"),
])
def test_refusals_name_the_sub_expression(policy, sql, text):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(sql, policy)
    assert text.lower() in e.value.message.lower(), e.value.message


def test_spellings_share_one_plan(policy):
    same = [
        "SELECT SUM(CASE WHEN a > 2 THEN 1 ELSE 0 END) FROM t",
        "select sum(if(a > 2, 1, 0)) from t",
        "SELECT SUM(CASE WHEN (a > 2.0) THEN 1.0 ELSE 0 END) AS s FROM t",
    ]
    hashes = {parse_query(s, policy).plan_hash for s in same}
    assert len(hashes) == 1
    f1 = parse_query("SELECT COUNT(*) FILTER (WHERE a > 2) FROM t", policy)
    f2 = parse_query("SELECT COUNT(CASE WHEN a > 2 THEN 1 END) FROM t", policy)
    assert f1.plan_hash == f2.plan_hash
    s1 = parse_query("SELECT SUM(x) FILTER (WHERE flag) FROM t", policy)
    s2 = parse_query("SELECT SUM(CASE WHEN flag THEN x END) FROM t", policy)
    assert s1.plan_hash == s2.plan_hash


def test_explain_shows_the_derived_range(policy):
    from dpgate.sql.explain import explain_query

    out = explain_query("SELECT AVG(LEAST(x, 3)) FROM t", policy)
    (v,) = out["plan"]["values"]
    assert v["range"] == "[-2.5, 3]" and v["lower"] == -2.5 and v["upper"] == 3


# --- neighbouring data ---------------------------------------------------------------------------

_units = st.lists(st.lists(st.fixed_dictionaries({
    "a": st.one_of(st.integers(-20, 20), st.none()),
    "b": st.integers(0, 3),
    "x": st.one_of(st.floats(-50, 50), st.sampled_from([math.nan, math.inf, None])),
    "y": st.floats(0.5, 4),
    "g": st.integers(0, 2),
    "flag": st.booleans(),
}), min_size=1, max_size=6), min_size=2, max_size=6)

NEIGHBOUR_QUERIES = [
    "SELECT g, SUM(CASE WHEN a > 2 THEN x * 2 ELSE 1 END) FROM t GROUP BY g",
    "SELECT g, COUNT(*) FILTER (WHERE flag), SUM(10.0 / (b + 1)) FROM t GROUP BY g",
    "SELECT g, AVG(LEAST(ABS(x), 3) - a) FROM t GROUP BY g",
]


def _bounded(policy, plan, units):
    con = duckdb.connect()
    try:
        con.execute("CREATE SCHEMA ex")
        con.execute("CREATE TABLE ex.t (uid BIGINT, a BIGINT, b BIGINT, big BIGINT, x DOUBLE, "
                    "y DOUBLE, g BIGINT, flag BOOLEAN)")
        for uid, rs in units:
            for r in rs:
                con.execute("INSERT INTO ex.t VALUES (?, ?, ?, 0, ?, ?, ?, ?)",
                            [uid, r["a"], r["b"], r["x"], r["y"], r["g"], r["flag"]])
        res = con.execute(bounded_sql(plan, policy, salt=7))
        names = [d[0] for d in res.description]
        out = res.fetchall()
    finally:
        con.close()
    return {n: [int(row[i]) for row in out] for i, n in enumerate(names) if n.startswith("p")}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_units, st.sampled_from(NEIGHBOUR_QUERIES), st.data())
def test_removing_one_unit_moves_the_bounded_vector_by_at_most_the_sensitivity(
        policy, units, sql, data):
    plan = parse_query(sql, policy)
    sens = sensitivities(plan, policy)
    full = list(enumerate(units))
    drop = data.draw(st.integers(0, len(full) - 1))
    a = _bounded(policy, plan, full)
    b = _bounded(policy, plan, [u for u in full if u[0] != drop])
    for pid, va in a.items():
        diff = [abs(x - y) for x, y in zip(va, b[pid])]
        assert sum(diff) <= sens[pid].l1, (pid, diff, sens[pid])
        assert max(diff) <= sens[pid].linf
        assert math.sqrt(sum(d * d for d in diff)) <= sens[pid].l2 + 1e-9


# --- exact literals (issue 9 item 3) -------------------------------------------------------------


def test_integer_literals_keep_their_exact_value(policy):
    plan = parse_query("SELECT COUNT(*) FROM t WHERE big = 9007199254740993", policy)
    assert plan.where == '"big" = 9007199254740993'
    other = parse_query("SELECT COUNT(*) FROM t WHERE big = 9007199254740992", policy)
    assert plan.plan_hash != other.plan_hash
    con = duckdb.connect()
    try:
        con.execute("CREATE SCHEMA ex")
        con.execute("CREATE TABLE ex.t (uid BIGINT, a BIGINT, b BIGINT, big BIGINT, x DOUBLE, "
                    "y DOUBLE, g BIGINT, flag BOOLEAN)")
        con.execute("INSERT INTO ex.t (uid, big) VALUES (1, 9007199254740993), (2, 9007199254740992)")
        (n,) = con.execute(bounded_sql(plan, policy, salt=1)).fetchone()
    finally:
        con.close()
    assert n == 1  # only the row whose value is exactly the literal


def test_decimal_literals_keep_their_text(policy):
    plan = parse_query("SELECT COUNT(*) FROM t WHERE x = 0.1000000000000000000001", policy)
    assert plan.where == '"x" = 0.1000000000000000000001'
    assert parse_query("SELECT COUNT(*) FROM t WHERE x = 1.50", policy).where == '"x" = 1.5'
    assert parse_query("SELECT COUNT(*) FROM t WHERE x = 2.0", policy).where == '"x" = 2'


_decimal_texts = st.one_of(
    st.integers(0, 2**63 - 1).map(str),
    st.decimals(allow_nan=False, allow_infinity=False).filter(lambda d: d >= 0 and abs(d.adjusted()) < 200).map(
        lambda d: format(d, "f")),
    st.tuples(st.integers(1, 10**20), st.integers(-300, 300)).map(lambda t: f"{t[0]}e{t[1]}"),
)


@settings(max_examples=300, deadline=None)
@given(_decimal_texts)
def test_canonicalisation_never_changes_a_literals_value(text):
    from decimal import Decimal

    from dpgate.sql.bind import canonical_number_text, canonicalize_literals

    lit = exp.Literal.number(text)
    try:
        out = canonicalize_literals(exp.EQ(this=exp.column("x"), expression=lit))
    except UnsupportedQuery:
        return  # out of range (an integer ≥ 2**63, a double overflow): refused, never altered
    got = out.expression.this
    assert Decimal(got) == Decimal(text), (text, got)
    assert canonical_number_text(got) == got  # a fixed point
