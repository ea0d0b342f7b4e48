"""The post-processing expression evaluator and the accuracy of derived cells
(dpgate.postprocess.expressions, dpgate.postprocess.accuracy).

Every expected value is derived by hand in a comment, or checked against DuckDB
(the engine whose semantics the evaluator follows) on the same values.
"""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.mechanisms import ci95_halfwidth, ci_halfwidth
from dpgate.postprocess import (
    CellNoise,
    ExpressionError,
    PrimitiveNoise,
    ReleasedCell,
    Vector,
    aggregate_cell,
    check_postprocess_expression,
    derived_cell,
    evaluate,
    evaluate_predicate,
    limit_rows,
    order_by,
    propagate_accuracy,
    sort_rows,
)

CELLS = {
    "c": np.array([10, 0, -3, 7], dtype=np.int64),  # a noisy count (unclamped)
    "s": np.array([5.0, np.nan, 2.5, -1.0]),  # a float cell with a NULL (suppressed)
    "k": np.array(["eu", None, "us", "apac"], dtype=object),  # a text key with a NULL
}


def ev(sql: str, cells=CELLS, dialect="duckdb"):
    return evaluate(sqlglot.parse_one(sql, read=dialect), cells).to_list()


# --- values and NULL semantics -------------------------------------------------------------------


@pytest.mark.parametrize("sql, expected", [
    ("c * 5", [50, 0, -15, 35]),  # int × int stays int
    ("c + s", [15.0, None, -0.5, 6.0]),  # NULL in, NULL out; int + float is float
    ("s / c", [0.5, None, -2.5 / 3, -1 / 7]),  # 0/0 → NULL (division by zero)
    ("c / 0", [None] * 4),  # division by zero → NULL, never inf
    ("c % 0", [None] * 4),
    ("c / 4", [2.5, 0.0, -0.75, 1.75]),  # DuckDB: / is real division
    ("c // 4", [2, 0, 0, 1]),  # integer division truncates toward zero (−3 // 4 = 0)
    ("-7 // 2", [-3] * 4),
    ("-7 % 3", [-1] * 4),  # % takes the dividend's sign
    ("-c", [-10, 0, 3, -7]),
    ("SQRT(c)", [math.sqrt(10), 0.0, None, math.sqrt(7)]),  # sqrt of a negative → NULL
    ("LN(c)", [math.log(10), None, None, math.log(7)]),  # ln of 0 or a negative → NULL
    ("LOG(100)", [2.0] * 4),  # LOG(x) is base 10 in DuckDB/PostgreSQL
    ("LOG(2, 8)", [3.0] * 4),
    ("LOG2(8) + LOG10(1000)", [6.0] * 4),
    ("EXP(1000)", [None] * 4),  # overflow → inf → NULL
    ("POWER(c, 2)", [100.0, 0.0, 9.0, 49.0]),
    ("POWER(-8, 1.0 / 3)", [None] * 4),  # NaN → NULL
    ("POWER(0, -1)", [None] * 4),  # inf → NULL
    ("ROUND(s)", [5.0, None, 3.0, -1.0]),  # half away from zero: 2.5 → 3
    ("ROUND(-2.5)", [-3.0] * 4),
    ("ROUND(s, 1)", [5.0, None, 2.5, -1.0]),
    ("ROUND(1234, -2)", [1200] * 4),
    ("ROUND(1250, -2)", [1300] * 4),
    ("FLOOR(s)", [5.0, None, 2.0, -1.0]),
    ("CEIL(s)", [5.0, None, 3.0, -1.0]),
    ("TRUNC(-2.7)", [-2.0] * 4),
    ("ABS(c)", [10, 0, 3, 7]),
    ("SIGN(c)", [1, 0, -1, 1]),
    ("GREATEST(c, s)", [10.0, 0.0, 2.5, 7.0]),  # DuckDB's GREATEST ignores NULLs
    ("LEAST(c, 3)", [3, 0, -3, 3]),
    ("COALESCE(s, 0)", [5.0, 0.0, 2.5, -1.0]),
    ("IFNULL(s, -1)", [5.0, -1.0, 2.5, -1.0]),
    ("NULLIF(c, 0)", [10, None, -3, 7]),
    ("CASE WHEN c > 5 THEN 'big' WHEN s IS NULL THEN 'none' END", ["big", "none", None, "big"]),
    ("CASE k WHEN 'eu' THEN 1 WHEN 'us' THEN 2 ELSE 0 END", [1, 0, 2, 0]),
    ("IIF(c > 0, 1, 0)", [1, 0, 0, 1]),
    ("IF(s > 0, s, 0)", [5.0, 0.0, 2.5, 0.0]),  # a NULL condition takes the ELSE branch
    ("TRY_CAST(s AS INT)", [5, None, 2, -1]),  # DuckDB: a double becomes the nearest integer, ties to even
    ("CAST(c AS DOUBLE) / 4", [2.5, 0.0, -0.75, 1.75]),
    ("CAST('12' AS INT) + c", [22, 12, 9, 19]),
    ("TRY_CAST('abc' AS INT)", [None] * 4),  # a failed cast is NULL (TRY semantics)
    ("CAST('abc' AS INT)", [None] * 4),  # … always: post-processing never fails on values
    ("CAST(3.14159 AS DECIMAL(10, 2))", [3.14] * 4),
    ("CAST(c AS VARCHAR)", ["10", "0", "-3", "7"]),
    ("CAST(c AS BOOLEAN)", [True, False, True, True]),
    ("k || '-' || CAST(c AS VARCHAR)", ["eu-10", None, "us--3", "apac-7"]),  # || propagates NULL
    ("CONCAT(k, '!')", ["eu!", "!", "us!", "apac!"]),  # DuckDB's CONCAT skips NULLs
    ("UPPER(k)", ["EU", None, "US", "APAC"]),
    ("LENGTH(k)", [2, None, 2, 4]),
    ("c IN (10, 0)", [True, True, False, False]),
    ("c NOT IN (10, 0)", [False, False, True, True]),
    ("s IN (5, 2.5)", [True, None, True, False]),  # NULL IN (…) is NULL
    ("c BETWEEN 0 AND 7", [False, True, False, True]),
    ("s > 0 AND c > 0", [True, False, False, False]),  # NULL AND FALSE = FALSE
    ("s > 0 OR c > 0", [True, None, True, True]),  # NULL OR FALSE = NULL
    ("NOT s > 0", [False, None, False, True]),
    ("k IS NULL", [False, True, False, False]),
    ("k IS NOT NULL", [True, False, True, True]),
    ("s > 0 IS TRUE", [True, False, True, False]),
    ("s IS DISTINCT FROM 5", [False, True, True, True]),
    ("c = '10'", [True, False, False, False]),  # a string literal is read as the other side's type
    ("k = 1", [None, None, None, None]),  # a text key against a number: read as a number (NULL if not)
    ("CAST(c AS VARCHAR) = 10", [True, False, False, False]),
    ("DATE '2024-01-02' > DATE '2024-01-01'", [True] * 4),
    ("PI() > 3.14", [True] * 4),
    ("9000000000000000000 + 9000000000000000000", [None] * 4),  # beyond int64 → NULL
])
def test_values_and_null_semantics(sql, expected):
    got = ev(sql)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if isinstance(e, float):
            assert g == pytest.approx(e, rel=1e-12), sql
        else:
            assert g == e and type(g) is type(e), (sql, got)


def test_types_of_results():
    assert evaluate("c * 5", CELLS).type == "int"  # COUNT(*) * 5 is released as an integer
    assert evaluate("c / 2", CELLS).type == "float"
    assert evaluate("3", {}, rows=2).to_list() == [3, 3]  # a constant column (SELECT 3 AS three)
    assert evaluate("'x'", {}, rows=0).to_list() == []


def test_typed_division_follows_the_dialect():
    # PostgreSQL and T-SQL divide integers as integers (sqlglot marks the Div "typed").
    assert ev("7 / 2", dialect="postgres") == [3] * 4
    assert ev("-7 / 2", dialect="postgres") == [-3] * 4  # toward zero
    assert ev("7 / 2", dialect="duckdb") == [3.5] * 4
    assert ev("7.0 / 2", dialect="postgres") == [3.5] * 4
    # MySQL/BigQuery GREATEST returns NULL if any argument is NULL
    assert ev("GREATEST(c, s)", dialect="bigquery") == [10.0, None, 2.5, 7.0]
    # LOG(x) is the natural logarithm in MySQL and T-SQL (sqlglot parses it as LN)
    assert ev("LOG(100)", dialect="mysql")[0] == pytest.approx(math.log(100))


def test_nothing_non_finite_reaches_a_release():
    cells = {"x": np.array([1e308, -1e308, 0.0, np.inf, -np.inf, np.nan])}
    for sql in ("x * 10", "x / 0", "EXP(x)", "POWER(x, 3)", "x - x", "SQRT(x)", "LN(x)", "1 / x"):
        v = evaluate(sql, cells)
        assert all(val is None or math.isfinite(val) for val in v.to_list()), sql
        assert not np.any(v.valid & ~np.isfinite(v.values))


def test_vector_of_accepts_numpy_and_objects():
    assert Vector.of(np.array([1, 2])).type == "int"
    assert Vector.of([1, None, 3]).to_list() == [1, None, 3]
    assert Vector.of([1, 2.5]).type == "float"
    assert Vector.of(np.array(["2024-01-01", "NaT"], dtype="datetime64[D]")).to_list() == ["2024-01-01", None]
    assert Vector.of(np.array([np.nan, 1.0])).to_list() == [None, 1.0]
    with pytest.raises(ExpressionError):
        Vector.of([1, "a"])


# --- DuckDB as the oracle on random expressions ----------------------------------------------------

# Each strategy draws (our SQL, DuckDB SQL). The DuckDB side makes explicit what the evaluator
# does by design: a non-finite result (fin) and a division by zero are NULL at that step.
_NUM_LEAVES = st.sampled_from(["a", "b", "a2", "3", "0", "2.5", "-1", "NULL"]).map(lambda x: (x, x))


def _numeric(children):
    def binary(t):
        op, (a, da), (b, db) = t
        ours = f"({a} {op} {b})"
        if op == "//":  # integer division truncates toward zero (DuckDB divides DOUBLEs exactly)
            return ours, f"fin(CASE WHEN ({db}) = 0 THEN NULL ELSE trunc(({da}) / ({db})) END)"
        if op in ("/", "%"):
            return ours, f"fin(CASE WHEN ({db}) = 0 THEN NULL ELSE ({da} {op} {db}) END)"
        return ours, f"({da} {op} {db})"

    def fn(name, guard=False):
        def make(t):
            args, dargs = ", ".join(x[0] for x in t), ", ".join(x[1] for x in t)
            theirs = f"{name}({dargs})"
            return f"{name}({args})", (f"fin({theirs})" if guard else theirs)
        return make

    ops = st.sampled_from(["+", "-", "*", "/", "//", "%"])
    return st.one_of(
        st.tuples(ops, children, children).map(binary),
        st.tuples(st.sampled_from(["ABS", "ROUND", "FLOOR", "CEIL", "SIGN", "-"]), children).map(
            lambda t: fn(t[0])([t[1]])),
        children.map(lambda c: fn("SQRT", guard=True)([c])),
        st.tuples(st.sampled_from(["GREATEST", "LEAST", "COALESCE", "NULLIF"]), children, children).map(
            lambda t: fn(t[0])([t[1], t[2]])),
        st.tuples(children, st.sampled_from(["2", "3", "0.5", "-1", "0"])).map(
            lambda t: fn("POWER", guard=True)([t[0], (t[1], t[1])])),
        st.tuples(children, children, children).map(lambda t: (
            f"CASE WHEN {t[0][0]} > 0 THEN {t[1][0]} ELSE {t[2][0]} END",
            f"CASE WHEN {t[0][1]} > 0 THEN {t[1][1]} ELSE {t[2][1]} END")),
        st.tuples(children, st.integers(-2, 3)).map(lambda t: fn("ROUND")([t[0], (str(t[1]), str(t[1]))])),
    )


NUMERIC = st.recursive(_NUM_LEAVES, _numeric, max_leaves=6)
PREDICATE = st.tuples(NUMERIC, st.sampled_from(["<", "<=", "=", "<>", ">", ">="]), NUMERIC,
                      st.sampled_from(["AND", "OR"]), NUMERIC).map(lambda t: tuple(
                          f"({t[0][i]} {t[1]} {t[2][i]}) {t[3]} NOT ({t[4][i]} IS NULL)" for i in (0, 1)))
VALUES = st.lists(st.tuples(st.one_of(st.none(), st.integers(-50, 50)),
                            st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False).map(lambda x: round(x, 3))),
                            st.one_of(st.none(), st.integers(-3, 3))),
                  min_size=1, max_size=6)


def _duckdb_values(sql: str, rows) -> list:
    con = duckdb.connect()
    con.execute("CREATE MACRO fin(x) AS CASE WHEN isfinite(x) THEN x END")
    con.execute("CREATE TABLE t (i INTEGER, a BIGINT, b DOUBLE, a2 BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", [(i, *r) for i, r in enumerate(rows)])
    out = con.execute(f"SELECT {sql} FROM t ORDER BY i").fetchall()
    con.close()
    return [v for (v,) in out]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=st.one_of(NUMERIC, PREDICATE), rows=VALUES)
def test_matches_duckdb_on_random_expressions(expr, rows):
    """Our vectorised evaluation equals DuckDB's on the same values."""
    ours, theirs = expr
    cells = {"a": [r[0] for r in rows], "b": [r[1] for r in rows], "a2": [r[2] for r in rows]}
    cells = {k: Vector(np.array([x if x is not None else 0 for x in v],
                                dtype=np.int64 if k != "b" else np.float64),
                       np.array([x is not None for x in v]), "float" if k == "b" else "int")
             for k, v in cells.items()}
    try:
        expected = _duckdb_values(theirs, rows)
    except duckdb.Error:  # DuckDB cannot bind the types (e.g. ROUND of a bare NULL): nothing to compare
        return
    got = evaluate(ours, cells).to_list()
    for g, e in zip(got, expected):
        if e is None or g is None:
            assert e is None and g is None, (ours, rows, got, expected)
        elif isinstance(e, bool) or isinstance(g, bool):
            assert g is e, (ours, rows)
        else:
            assert float(g) == pytest.approx(float(e), rel=1e-9, abs=1e-9), (ours, rows, got, expected)


# --- HAVING, ORDER BY, LIMIT ------------------------------------------------------------------------


def test_evaluate_predicate_keeps_only_true_rows():
    assert evaluate_predicate("c > 0 AND s > 0", CELLS).tolist() == [True, False, False, False]
    assert evaluate_predicate("s > 0 OR k = 'apac'", CELLS).tolist() == [True, False, True, True]
    assert evaluate_predicate(sqlglot.parse_one("c"), CELLS).tolist() == [True, False, True, True]


def test_order_by_expressions_with_null_placement():
    def order(sql: str):
        q = sqlglot.parse_one(f"SELECT 1 ORDER BY {sql}", read="duckdb")
        return order_by(q.args["order"].expressions, CELLS).tolist()

    assert order("s") == [3, 2, 0, 1]  # −1, 2.5, 5, NULL (NULLS LAST)
    assert order("s DESC") == [0, 2, 3, 1]
    assert order("s DESC NULLS FIRST") == [1, 0, 2, 3]
    assert order("ABS(c - 5)") == [3, 0, 1, 2]  # |2|, |5|, |−5|, |−8|: ties keep row order
    assert order("k") == [3, 0, 2, 1]  # apac, eu, us, NULL
    assert order("c > 0, c DESC") == [1, 2, 0, 3]  # false first (0 then −3 by c DESC), then 10, 7
    # sqlglot reads the dialect's default NULL ordering (PostgreSQL: NULLs are largest)
    q = sqlglot.parse_one("SELECT 1 ORDER BY s DESC", read="postgres")
    assert order_by(q.args["order"].expressions, CELLS).tolist() == [1, 0, 2, 3]


def test_sort_rows_subset_and_limit():
    order = np.array([3, 1, 0])  # the rows HAVING kept, in key order
    assert sort_rows([(CELLS["c"], True, False)], order).tolist() == [0, 3, 1]
    assert limit_rows(np.arange(5), 2).tolist() == [0, 1]
    assert limit_rows(np.arange(5), 2, offset=3).tolist() == [3, 4]
    assert limit_rows(np.arange(5), None).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        limit_rows(np.arange(5), -1)


# --- planning-time check -------------------------------------------------------------------------


@pytest.mark.parametrize("sql, dialect", [
    ("RANDOM()", "duckdb"), ("c * RAND()", "duckdb"), ("random() > 0.5", "postgres"),
    ("NOW()", "postgres"), ("NOW()", "duckdb"), ("CURRENT_DATE", "duckdb"), ("CURRENT_TIMESTAMP", "duckdb"),
    ("GETDATE()", "tsql"), ("UUID()", "duckdb"), ("SETSEED(0.5)", "duckdb"), ("TODAY()", "duckdb"),
])
def test_non_deterministic_functions_are_refused(sql, dialect):
    tree = sqlglot.parse_one(sql, read=dialect)
    with pytest.raises(UnsupportedQuery) as e:
        check_postprocess_expression(tree, ["c"])
    assert "non-deterministic" in e.value.message
    assert e.value.details["construct"]


@pytest.mark.parametrize("sql, words", [
    ("SUM(c)", "aggregate"),
    ("SUM(c) OVER ()", "window"),
    ("(SELECT 1)", "subquer"),
    ("x + 1", "'x' is not a released cell"),
    ("t.c + 1", "by name only"),
    ("c LIKE 'a%'", "not supported"),
    ("REGEXP_MATCHES(k, 'a')", "not supported"),
])
def test_unsupported_constructs_are_refused_with_the_construct(sql, words):
    with pytest.raises(UnsupportedQuery) as e:
        check_postprocess_expression(sqlglot.parse_one(sql), ["c", "k"])
    assert words in e.value.message
    assert e.value.details.get("construct")


def test_typed_check_finds_type_errors_before_any_data():
    types = {"c": "int", "s": "float", "k": "text"}
    check_postprocess_expression(sqlglot.parse_one("ROUND(c * 1.5 / s, 2) > 3 AND k IN ('eu')"), types)
    check_postprocess_expression(sqlglot.parse_one("k || CAST(c AS VARCHAR)"), types)
    for bad in ("k + 1", "SQRT(k)", "CASE WHEN c > 1 THEN k ELSE c END", "k > c", "k AND c > 1"):
        with pytest.raises(UnsupportedQuery):
            check_postprocess_expression(sqlglot.parse_one(bad), types)
    # names only: a structural check (no types known)
    check_postprocess_expression(sqlglot.parse_one("k + 1"), ["k"])


def test_evaluation_errors_are_value_errors():
    with pytest.raises(ValueError):
        evaluate("nope + 1", CELLS)
    with pytest.raises(ExpressionError):
        evaluate("c + k", CELLS)
    with pytest.raises(ExpressionError):
        evaluate("c", {"c": [1, 2], "d": [1, 2, 3]})


# --- accuracy of derived cells -------------------------------------------------------------------

G3 = PrimitiveNoise("discrete_gaussian", 3.0, ci95_halfwidth("gaussian", 3.0))  # t = 5 (OpenDP exact)
G4 = PrimitiveNoise("discrete_gaussian", 4.0, ci95_halfwidth("gaussian", 4.0))
L2 = PrimitiveNoise("discrete_laplace", 2.0, ci95_halfwidth("laplace", 2.0))
L3 = PrimitiveNoise("discrete_laplace", 3.0, ci95_halfwidth("laplace", 3.0))


def _laplace_halfwidth(b: float, alpha: float) -> int:
    """Smallest integer t with P(|Z| ≤ t) ≥ 1 − α, by summing the discrete Laplace pmf
    (1 − q)/(1 + q)·q^|x|, q = e^{−1/b} (independent of the closed form in mechanisms.py)."""
    q = math.exp(-1 / b)
    p = lambda x: (1 - q) / (1 + q) * q ** abs(x)  # noqa: E731
    t, mass = 0, p(0)
    while mass < 1 - alpha:
        t += 1
        mass += 2 * p(t)
    return t


def acc(sql, cells, noise, prims):
    return propagate_accuracy(sql, cells, noise, prims)


def test_linear_map_of_one_primitive_is_exact():
    cells = {"s": np.array([100.0, 40.0]), "k": np.array([2, -3])}
    noise = {"s": CellNoise.of_primitive("p0")}
    prims = {"p0": G3}
    t = G3.ci95
    a = acc("s * 2 + 1", cells, noise, prims)
    # a·X + b: [v − |a|t, v + |a|t] is exactly the image of X's interval → same coverage
    assert a.entry == {"mechanism": "discrete_gaussian", "sigma": 6.0, "approximate": False,
                       "method": "exact", "coverage": 0.95}
    assert a.to_dict()["ci95"] == 2 * t and "ci95_rows" not in a.to_dict()
    assert acc("-s / 4", cells, noise, prims).to_dict()["ci95"] == t / 4
    assert acc("s + s", cells, noise, prims).to_dict()["ci95"] == 2 * t  # one primitive, coefficient 2
    assert acc("s - s", cells, noise, prims).to_dict()["ci95"] == 0.0  # the noise cancels
    # a key-dependent coefficient: per row |k|·t
    d = acc("s * k", cells, noise, prims).to_dict()
    assert d["ci95_rows"] == [2 * t, 3 * t] and d["ci95"] == 3 * t and d["approximate"] is False
    assert acc("k * 2", cells, noise, prims) is None  # no noisy cell: exact, no entry


def test_sum_of_independent_gaussians_adds_variances():
    cells = {"x": np.array([10.0]), "y": np.array([20.0])}
    noise = {"x": CellNoise.of_primitive("p0"), "y": CellNoise.of_primitive("p1")}
    prims = {"p0": G3, "p1": G4}
    d = acc("x + y", cells, noise, prims).to_dict()
    # σ² = 3² + 4² = 25 → σ = 5; normal 97.5 % quantile 1.959964 → 9.79982
    assert d["sigma"] == pytest.approx(5.0)
    assert d["ci95"] == pytest.approx(1.959963984540054 * 5.0)
    assert d["method"] == "normal" and d["approximate"] is True
    d = acc("2 * x - y / 2", cells, noise, prims).to_dict()
    assert d["sigma"] == pytest.approx(math.sqrt(36 + 4))  # (2·3)² + (4/2)²


def test_clamped_counts_fall_back_to_the_union_bound():
    cells = {"x": np.array([0.0, 10.0]), "y": np.array([20.0, 20.0])}
    noise = {"x": CellNoise.of_primitive("p0", clamped=np.array([True, False])),
             "y": CellNoise.of_primitive("p1")}
    prims = {"p0": G3, "p1": G4}
    d = acc("x + y", cells, noise, prims).to_dict()
    union = ci_halfwidth("gaussian", 3.0, 0.025) + ci_halfwidth("gaussian", 4.0, 0.025)
    assert d["ci95_rows"] == [pytest.approx(union), pytest.approx(1.959963984540054 * 5)]


def test_sum_of_independent_laplaces_uses_the_union_bound():
    cells = {"x": np.array([10.0]), "y": np.array([20.0])}
    noise = {"x": CellNoise.of_primitive("p0"), "y": CellNoise.of_primitive("p1")}
    d = acc("x - y", cells, noise, {"p0": L2, "p1": L3}).to_dict()
    # Bonferroni: each part at 97.5 %, so both hold with probability ≥ 95 %
    assert d["ci95"] == _laplace_halfwidth(2, 0.025) + _laplace_halfwidth(3, 0.025)
    assert d["method"] == "union_bound" and d["approximate"] is False
    # sd: Var = 2q/(1 − q)² per part, q = e^{−1/b}
    var = sum(2 * math.exp(-1 / b) / (1 - math.exp(-1 / b)) ** 2 for b in (2, 3))
    assert d["sd"] == pytest.approx(math.sqrt(var))


def test_primitive_noise_variances_match_the_pmf():
    # discrete Gaussian: Var ≤ σ² (summing the pmf ∝ e^{−x²/2σ²}); discrete Laplace: 2q/(1 − q)²
    for sigma in (0.5, 1.0, 3.0):
        xs = np.arange(-200, 201)
        w = np.exp(-(xs**2) / (2 * sigma**2))
        var = float((w * xs**2).sum() / w.sum())
        assert var <= PrimitiveNoise("discrete_gaussian", sigma, 1.0).variance() + 1e-12
    for b in (0.7, 2.0):
        q = math.exp(-1 / b)
        xs = np.arange(-400, 401)
        pmf = (1 - q) / (1 + q) * q ** np.abs(xs)
        assert PrimitiveNoise("discrete_laplace", b, 1.0).variance() == pytest.approx(float((pmf * xs**2).sum()))


def test_nonlinear_expressions_use_interval_arithmetic():
    # AVG = 50 with interval [40, 60] over 2 primitives (sum, count): POWER(avg, 2) ∈ [1600, 3600]
    cells = {"avg": np.array([50.0]), "s": np.array([100.0]), "c": np.array([20.0])}
    noise = {"avg": CellNoise.of_interval([40.0], [60.0], ["p0", "p1"]),
             "s": CellNoise.of_primitive("p0"), "c": CellNoise.of_primitive("p1")}
    prims = {"p0": PrimitiveNoise("discrete_gaussian", 5.0, 10.0), "p1": PrimitiveNoise("discrete_gaussian", 1.0, 2.0)}
    d = acc("POWER(avg, 2)", cells, noise, prims).to_dict()
    assert d["ci95"] == pytest.approx(max(3600 - 2500, 2500 - 1600))
    assert d["coverage"] == 0.9 and d["approximate"] is True and d["method"] == "interval"
    # s/c: s ∈ [90, 110], c ∈ [18, 22] → [90/22, 110/18]; value 5 → half-width 110/18 − 5
    d = acc("s / c", cells, noise, prims).to_dict()
    assert d["ci95"] == pytest.approx(110 / 18 - 5) and d["coverage"] == 0.9
    # SQRT(s): [√90, √110]; value 10 → max(√110 − 10, 10 − √90); one primitive → coverage 0.95
    d = acc("SQRT(s)", cells, noise, prims).to_dict()
    assert d["ci95"] == pytest.approx(max(math.sqrt(110) - 10, 10 - math.sqrt(90))) and d["coverage"] == 0.95
    d = acc("ROUND(avg * 2)", cells, noise, prims).to_dict()
    assert d["ci95"] == pytest.approx(20.0)  # [80, 120] around 100
    d = acc("GREATEST(s, 95) - ABS(c - 21)", cells, noise, prims).to_dict()
    # GREATEST(s, 95) ∈ [95, 110]; |c − 21| ∈ [0, 3] → [92, 110], value 100 − 1 = 99 → 11
    assert d["ci95"] == pytest.approx(11.0)


@pytest.mark.parametrize("sql, reason", [
    ("s / c", "denominator"),  # c ∈ [−1, 3] contains 0
    ("LN(c)", "reaches 0"),
    ("CASE WHEN s > 50 THEN 1 ELSE 0 END", "no 95 % interval"),
    ("s > c", "no 95 % interval"),
])
def test_accuracy_is_omitted_with_a_reason(sql, reason):
    cells = {"s": np.array([100.0]), "c": np.array([1.0])}
    noise = {"s": CellNoise.of_primitive("p0"), "c": CellNoise.of_primitive("p1")}
    prims = {"p0": PrimitiveNoise("discrete_gaussian", 5.0, 10.0), "p1": PrimitiveNoise("discrete_gaussian", 1.0, 2.0)}
    d = acc(sql, cells, noise, prims).to_dict()
    assert d["ci95"] is None and d["method"] == "omitted" and reason in d["reason"]


def test_null_rows_have_no_half_width():
    cells = {"s": np.array([100.0, 5.0]), "c": np.array([20.0, 0.0])}
    noise = {"s": CellNoise.of_primitive("p0"), "c": CellNoise.of_primitive("p1")}
    prims = {"p0": PrimitiveNoise("discrete_gaussian", 0.5, 1.0), "p1": PrimitiveNoise("discrete_gaussian", 0.5, 1.0)}
    # row 2: c = 0 → s / c is NULL; its interval [−1, 1] contains 0 → omitted for the column
    assert acc("s / c", cells, noise, prims).to_dict()["ci95"] is None
    d = acc("s / NULLIF(k, 0)", {**cells, "k": np.array([2.0, 0.0])}, noise, prims).to_dict()
    assert d["ci95_rows"] == [0.5, None]  # linear in s with coefficient 1/2 on row 1


def test_derived_cell_from_aggregate_cells():
    prims = {"p0": PrimitiveNoise("discrete_gaussian", 2.0, ci95_halfwidth("gaussian", 2.0)),
             "p1": PrimitiveNoise("discrete_gaussian", 1.0, ci95_halfwidth("gaussian", 1.0))}
    cells = {
        "sum_age": aggregate_cell("sum", [("p0", np.array([500.0, 300.0]))], prims, integer=True),
        "count": aggregate_cell("count", [("p1", np.array([10.0, -2.0]))], prims),
        "band": ReleasedCell(Vector.of(np.array(["young", "old"], dtype=object))),
    }
    # COUNT(*) * 5: count clamped at 0 on row 2; int; exact half-width 5·t
    d = derived_cell("count * 5", cells, prims)
    assert d.vector.to_list() == [50, 0] and d.vector.type == "int"
    assert d.accuracy_for(np.arange(2))["ci95"] == 5 * prims["p1"].ci95
    d = derived_cell("band || ':' || CAST(count AS VARCHAR)", cells, prims)
    assert d.vector.to_list() == ["young:10", "old:0"] and d.accuracy is not None  # CAST to text: omitted
    assert d.accuracy_for(np.arange(2))["ci95"] is None
    k = derived_cell("UPPER(band)", cells, prims)
    assert k.accuracy is None and k.vector.to_list() == ["YOUNG", "OLD"]
    three = derived_cell("3", cells, prims, rows=2)
    assert three.vector.to_list() == [3, 3] and three.accuracy is None


def test_the_planner_keeps_no_postprocessing_alias():
    """``dpgate.sql.plan.evaluate_predicate`` (an alias that imported post-processing into the
    planner) is gone: the planner imports no post-processing (pyproject's first contract)."""
    import dpgate.sql.plan as plan_module

    assert not hasattr(plan_module, "evaluate_predicate")
    assert isinstance(sqlglot.parse_one("RANDOM()"), exp.Rand)
