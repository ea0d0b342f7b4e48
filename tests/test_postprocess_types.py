"""Post-processing honours SQL types and never fails after the charge (a hostile trial's findings).

1. ``CAST``/``TRY_CAST`` of a released value converts to the target's SQL type as DuckDB does
   (``CAST(AVG(income) AS TINYINT)`` released 1327): integer types round a double to the nearest
   integer, ties to even, and hold their range; ``DECIMAL(p, s)`` rounds to s digits and holds
   less than 10^(p − s); ``FLOAT`` rounds to float32; ``VARCHAR`` prints as DuckDB prints.
2. A plain ``CAST`` of a noisy value to a type that cannot hold every value of the operand's
   type is refused at planning time, before any charge, naming ``TRY_CAST`` (which gives NULL out
   of range); a ``CAST`` of a constant that does not convert is refused too.
3. ``ROUND``/``TRUNC`` take any integer constant as decimals (``ROUND(x, -400)`` is 0, as in
   DuckDB); a released value, a non-integer or text as decimals is refused before the charge.
4. Every function the evaluator accepts is total on hostile noisy values (±1e308, ±5e-324, 0,
   −0, ±9.3e18, NULL from a suppressed cell): no exception, no NaN/inf in the JSON document.

Expected values come from DuckDB itself (``duckdb.sql`` on the same literal values), never by hand;
where DuckDB returns NaN/±inf or raises, the evaluator's documented value is NULL.
"""

from __future__ import annotations

import json
import math

import duckdb
import numpy as np
import pytest
import sqlglot
from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.postprocess.expressions import INT_LIMIT
from dpgate.postprocess import SUPPORTED_NODES, Vector, check_postprocess_expression, evaluate
from dpgate.service import QueryBudget

# --- DuckDB parity on literal values --------------------------------------------------------------

_RNG = np.random.default_rng(20261204)
DOUBLES = [float(v) for v in np.concatenate([
    _RNG.normal(0, 300, 60), _RNG.normal(0, 1, 40), np.round(_RNG.normal(0, 100, 30)) + 0.5,
    10.0 ** _RNG.uniform(-30, 300, 30), -(10.0 ** _RNG.uniform(-10, 40, 30)),
    [127.5, -128.5, 255.5, -0.5, 0.49999999999999994, 2.5, 3.5, -2.5, 1.005, 2.675, 0.015, 999.995,
     0.0, -0.0, 1327.0, 1e308, -1e308, 5e-324, -5e-324, 9.3e18, -9.3e18, 9223372036854774784.0,
     9223372036854775808.0, -9223372036854775808.0, 3.4028235e38, 3.5e38, 1e15, 1e16, 1e-5],
])]
INTS = [0, 1, -1, 5, -5, 15, -15, 127, 128, -128, -129, 255, 256, 1350, -1350, 1327, 2 ** 31 - 1, 2 ** 31,
        -2 ** 31, -2 ** 31 - 1, 2 ** 63 - 1, -2 ** 63 + 1, 4 * 10 ** 18, 5 * 10 ** 18, -5 * 10 ** 18,
        6 * 10 ** 18, 9 * 10 ** 18, 123456789]

CASTS = ["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER",
         "UBIGINT", "UHUGEINT", "DECIMAL(5,2)", "DECIMAL(18,3)", "DECIMAL(9,4)", "DECIMAL(38,10)",
         "DECIMAL(4,0)", "DECIMAL(1,1)", "DECIMAL", "DECIMAL(10)", "DOUBLE", "FLOAT", "REAL", "VARCHAR",
         "BOOLEAN"]
FUNCTIONS = ["ROUND(x)", "ROUND(x, 2)", "ROUND(x, 5)", "ROUND(x, 17)", "ROUND(x, -1)", "ROUND(x, -3)",
             "ROUND(x, -19)", "ROUND(x, -20)", "ROUND(x, -308)", "ROUND(x, -400)", "ROUND(x, 400)",
             "TRUNC(x)", "TRUNC(x, 2)", "TRUNC(x, -2)", "TRUNC(x, -19)", "TRUNC(x, -400)", "TRUNC(x, 400)",
             "FLOOR(x)", "CEIL(x)", "ABS(x)", "SIGN(x)", "-x", "SQRT(x)", "CBRT(x)", "EXP(x)", "LN(x)",
             "LOG(x)", "LOG10(x)", "LOG2(x)", "LOG(3, x)", "LOG(x, 10)", "LOG(0, x)", "POWER(x, 2)",
             "POWER(x, 0.5)", "POWER(2, x)", "x + 1", "x - 1", "x * x", "x / 3", "x % 3", "1 / x",
             "GREATEST(x, 1)", "LEAST(x, 1)", "x > 1", "x = 2.5", "CAST(x AS VARCHAR) || '!'"]


def _literal(v, sql_type: str) -> str:
    assert sql_type == "BIGINT" or math.isfinite(float(v))
    return f"'{float(v)!r}'::DOUBLE" if sql_type == "DOUBLE" else f"({int(v)})::BIGINT"  # exact, −0 kept


def duckdb_values(expr: str, values: list, sql_type: str) -> list:
    """DuckDB's result of ``expr`` over ``x`` = each value (of ``sql_type``), in order; an error (an
    overflow) is returned as the string ``"error"``."""
    rows = ", ".join(f"({_literal(v, sql_type)}, {i})" for i, v in enumerate(values))
    try:
        return [r[0] for r in duckdb.sql(f"SELECT {expr} FROM (VALUES {rows}) t(x, i) ORDER BY i").fetchall()]
    except duckdb.Error:  # one row raises: each row alone
        out = []
        for v in values:
            try:
                out.append(duckdb.sql(f"SELECT {expr} FROM (SELECT {_literal(v, sql_type)} AS x)").fetchall()[0][0])
            except duckdb.Error:
                out.append("error")
        return out


def _one(sql: str):
    return duckdb.sql(sql).fetchall()[0]


def _ours_for(expected):
    """The evaluator's documented value for a DuckDB result: NULL for an error, NaN/±inf, and an
    integer arithmetic result beyond ±9.2·10^18 (``INT_LIMIT``; a cast holds all of int64); the
    value otherwise."""
    if expected == "error" or expected is None:
        return None
    if isinstance(expected, float) and not math.isfinite(expected):
        return None
    if isinstance(expected, int) and not isinstance(expected, bool) and not -2 ** 63 <= expected < 2 ** 63:
        return None
    return expected


def _documented_int_limit(expr: str, expected) -> bool:
    """An integer arithmetic result beyond INT_LIMIT (NULL here by design, kept from before)."""
    return (not expr.startswith("TRY_CAST") and isinstance(expected, int) and not isinstance(expected, bool)
            and abs(expected) > INT_LIMIT)


def _same(got, expected) -> bool:
    want = _ours_for(expected)
    if want is None or got is None:
        return want is None and got is None
    if isinstance(want, (str, bool)):
        return got == want and type(got) is type(want)
    return float(got) == float(want)


@pytest.mark.parametrize("expr", [f"TRY_CAST(x AS {t})" for t in CASTS] + FUNCTIONS)
@pytest.mark.parametrize("sql_type", ["DOUBLE", "BIGINT"])
def test_each_function_gives_duckdbs_value(expr, sql_type):
    values = DOUBLES if sql_type == "DOUBLE" else INTS
    expected = duckdb_values(expr, values, sql_type)
    cell = np.array(values, dtype=np.float64 if sql_type == "DOUBLE" else np.int64)
    got = evaluate(expr, {"x": cell}).to_list()
    wrong = [(v, g, e) for v, g, e in zip(values, got, expected)
             if not _same(g, e) and not (g is None and _documented_int_limit(expr, e))]
    assert not wrong, f"{expr} over {sql_type}: (value, ours, DuckDB's) {wrong[:5]}"
    json.dumps(got, allow_nan=False)


def test_the_trial_cast_is_out_of_range_for_tinyint():
    # CAST(AVG(income) AS TINYINT) released 1327: TINYINT holds −128 … 127, DuckDB's TRY_CAST is NULL
    assert _one("SELECT TRY_CAST(1327.0::DOUBLE AS TINYINT)")[0] is None
    assert evaluate("TRY_CAST(a AS TINYINT)", {"a": np.array([1327.0, 126.6, -128.5])}).to_list() == \
        [None, 127, -128]


def test_a_cast_over_a_suppressed_cell_is_null():
    cells = {"a": Vector(np.array([3.5, 0.0]), np.array([True, False]), "float")}
    for t in CASTS:
        got = evaluate(f"TRY_CAST(a AS {t})", cells).to_list()
        assert got[1] is None, t


# --- planning time: a CAST that could fail is refused before the charge ---------------------------

def _check(sql, types, noisy=("a",)):
    check_postprocess_expression(sqlglot.parse_one(sql, read="duckdb"), types, noisy=set(noisy))


@pytest.mark.parametrize("target", ["TINYINT", "SMALLINT", "INTEGER", "UTINYINT",
                                    "UBIGINT", "DECIMAL(5,2)", "DECIMAL(38,2)", "FLOAT", "REAL"])
def test_a_cast_of_a_noisy_double_to_a_bounded_type_is_refused_naming_try_cast(target):
    # DuckDB raises on an out-of-range value; a noisy double can take any value, so the CAST
    # could fail after the charge depending on the noise: refused, TRY_CAST suggested
    for sql in (f"CAST(a AS {target})", f"a::{target}", f"CAST(a * 2 AS {target}) + 1"):
        with pytest.raises(UnsupportedQuery) as e:
            _check(sql, {"a": "float"})
        assert "TRY_CAST" in e.value.message and "could fail after the charge" in e.value.message
    _check(f"TRY_CAST(a AS {target})", {"a": "float"})  # NULL out of range: total


@pytest.mark.parametrize("target", ["BIGINT", "HUGEINT"])
def test_a_cast_of_a_noisy_double_to_a_64_bit_integer_is_kept_with_null_beyond(target):
    """CAST(COUNT(*) AS BIGINT) is an everyday idiom: a released integer is an int64, so it holds; a
    double beyond int64 is NULL there (TRY semantics, documented), never an error after the charge."""
    for sql in (f"CAST(a AS {target})", f"a::{target}"):
        _check(sql, {"a": "float"})
    tree = sqlglot.parse_one(f"CAST(a AS {target})", read="duckdb")
    out = evaluate(tree, {"a": Vector.of(np.array([2.5, -1e19, 1e300, 3.5]))})
    assert out.to_list() == [2, None, None, 4]  # ties to even, as DuckDB's double → BIGINT


@pytest.mark.parametrize("sql, refused", [
    ("CAST(a AS BIGINT)", False),  # a noisy count is an int64: BIGINT and HUGEINT hold it
    ("CAST(a AS HUGEINT)", False),
    ("CAST(a AS DOUBLE)", False),
    ("CAST(a AS VARCHAR)", False),
    ("CAST(a AS DECIMAL(38,0))", False),
    ("CAST(a AS INTEGER)", True),  # 2^31 and beyond: out of range
    ("CAST(a AS UBIGINT)", True),  # a noisy count can be negative
    ("CAST(a AS DECIMAL(18,3))", True),
])
def test_a_cast_of_a_noisy_integer_is_refused_only_where_int64_does_not_fit(sql, refused):
    if refused:
        with pytest.raises(UnsupportedQuery, match="TRY_CAST"):
            _check(sql, {"a": "int"})
    else:
        _check(sql, {"a": "int"})


def test_a_cast_of_a_public_key_keeps_try_semantics_and_a_bad_constant_is_refused():
    _check("CAST(k AS INTEGER) + CAST(a AS DOUBLE)", {"a": "float", "k": "text"})  # a key: NULL if not a number
    _check("CAST(100 AS TINYINT)", {"a": "float"})
    for sql in ("CAST(1327 AS TINYINT)", "CAST(-1 AS UINTEGER)", "CAST('abc' AS INTEGER)",
                "CAST(1000.0 AS DECIMAL(4,1))"):
        with pytest.raises(UnsupportedQuery, match="does not convert"):
            _check(sql, {"a": "float"})
        with pytest.raises(duckdb.Error):  # DuckDB refuses these constants as well
            duckdb.sql(f"SELECT {sql}").fetchall()


@pytest.mark.parametrize("sql", ["ROUND(a, a)", "ROUND(a, -a)", "ROUND(a, 2.5)", "ROUND(a, 'x')",
                                 "ROUND(a, 1e30)", "TRUNC(a, a)", "CAST(a AS DECIMAL(50,2))",
                                 "CAST(a AS DECIMAL(5,6))", "CAST(a AS MONEY)", "CAST(a AS BIT)"])
def test_hostile_decimals_and_types_are_refused_before_the_charge(sql):
    for t in ("int", "float"):
        with pytest.raises(UnsupportedQuery):
            _check(sql, {"a": t})


def test_rounding_digits_of_any_size_are_total():
    x = np.array([1327.5, -0.4, 5e-324, 1e308])
    for d in (-10 ** 18, -400, -309, -19, 0, 19, 309, 400, 10 ** 18):
        for fn in ("ROUND", "TRUNC"):
            got = evaluate(f"{fn}(a, {d})", {"a": x}).to_list()
            json.dumps(got, allow_nan=False)
            got_int = evaluate(f"{fn}(a, {d})", {"a": np.array([2 ** 63 - 1, -2 ** 63, 7], dtype=np.int64)})
            json.dumps(got_int.to_list(), allow_nan=False)
    assert evaluate("ROUND(a, NULL)", {"a": x}).to_list() == [None] * 4  # as DuckDB: NULL
    assert evaluate("ROUND(a, -400)", {"a": x}).to_list() == \
        [_one(f"SELECT ROUND({v!r}::DOUBLE, -400)")[0] for v in x.tolist()]


# --- every function is total on hostile noisy values ----------------------------------------------

HOSTILE = [1e308, -1e308, 5e-324, -5e-324, 0.0, -0.0, 9.3e18, -9.3e18, 1.0, -1.0, 0.5, None]
HOSTILE_INTS = [2 ** 63 - 1, -2 ** 63, 0, 1, -1, 9 * 10 ** 18, None]

#: one expression per node type the evaluator accepts (a node added without a case here fails below)
EXPRESSIONS = {
    exp.Column: "a", exp.Literal: "a + 1", exp.Boolean: "a > 0 OR TRUE", exp.Null: "COALESCE(NULL, a)",
    exp.Paren: "(a)", exp.Pi: "a * PI()", exp.Neg: "-a", exp.Add: "a + b", exp.Sub: "a - b",
    exp.Mul: "a * b", exp.Div: "a / b", exp.IntDiv: "a // b", exp.Mod: "a % b", exp.Pow: "POWER(a, b)",
    exp.Sqrt: "SQRT(a)", exp.Cbrt: "CBRT(a)", exp.Exp: "EXP(a)", exp.Ln: "LN(a)", exp.Log: "LOG(b, a)",
    exp.Round: "ROUND(a, -400) + ROUND(a, 400) + ROUND(a, -19)", exp.Trunc: "TRUNC(a, -19) + TRUNC(a, 400)",
    exp.Floor: "FLOOR(a)", exp.Ceil: "CEIL(a)", exp.Abs: "ABS(a)", exp.Sign: "SIGN(a)",
    exp.Greatest: "GREATEST(a, b)", exp.Least: "LEAST(a, b)", exp.Case: "CASE WHEN a > b THEN a / b END",
    exp.If: "IF(a > 0, a, b)", exp.Coalesce: "COALESCE(a, b)", exp.Nullif: "NULLIF(a, b)",
    exp.Cast: "CAST(a AS VARCHAR)", exp.TryCast: "TRY_CAST(a * b AS TINYINT)", exp.EQ: "a = b",
    exp.NEQ: "a <> b", exp.GT: "a > b", exp.GTE: "a >= b", exp.LT: "a < b", exp.LTE: "a <= b",
    exp.NullSafeEQ: "a IS NOT DISTINCT FROM b", exp.NullSafeNEQ: "a IS DISTINCT FROM b",
    exp.Not: "NOT a > b", exp.And: "a > 0 AND b > 0", exp.Or: "a > 0 OR b > 0", exp.In: "a IN (b, 0)",
    exp.Between: "a BETWEEN b AND 1", exp.Is: "a IS NULL", exp.DPipe: "CAST(a AS VARCHAR) || 'x'",
    exp.Concat: "CONCAT(a, b)", exp.Upper: "UPPER(CAST(a AS VARCHAR))", exp.Lower: "LOWER(CAST(a AS VARCHAR))",
    exp.Length: "LENGTH(CAST(a AS VARCHAR))",
}


def test_every_supported_function_has_a_hostile_case():
    assert set(EXPRESSIONS) == set(SUPPORTED_NODES)


def _pairs(xs, ys, dtype):
    pairs = [(x, y) for x in xs for y in ys]

    def vec(vals):
        valid = np.array([v is not None for v in vals])
        return Vector(np.array([v if v is not None else 0 for v in vals], dtype=dtype), valid,
                      "float" if dtype == np.float64 else "int")
    return {"a": vec([p[0] for p in pairs]), "b": vec([p[1] for p in pairs])}


@pytest.mark.parametrize("node", sorted(EXPRESSIONS, key=lambda t: t.__name__), ids=lambda t: t.__name__)
def test_every_function_is_total_on_hostile_noisy_values(node):
    sql = EXPRESSIONS[node]
    for cells in (_pairs(HOSTILE, HOSTILE, np.float64), _pairs(HOSTILE_INTS, HOSTILE_INTS, np.int64)):
        for types in ({"a": "float", "b": "float"}, {"a": "int", "b": "int"}):
            check_postprocess_expression(sqlglot.parse_one(sql, read="duckdb"), types)  # planned
        got = evaluate(sql, cells).to_list()
        assert len(got) == len(cells["a"])
        json.dumps(got, allow_nan=False)  # valid JSON: no NaN, no inf
        assert all(not (isinstance(v, float) and not math.isfinite(v)) for v in got)


# --- through the service: refused before the charge, answered after it ----------------------------

try:
    from test_service import DATA, make_gateway
except ImportError:  # pragma: no cover
    DATA = None

needs_data = pytest.mark.skipif(DATA is None or not (DATA / "PUMS_dup.csv").exists(),
                                reason="../shared/data not present")


@pytest.fixture
def gw(tmp_path):
    g = make_gateway(tmp_path)
    yield g
    g.close()


def _spent(gw):
    return gw.budget("pums")["spent"]["rho"], len(gw.ledger_entries())


@needs_data
@pytest.mark.parametrize("sql", [
    "SELECT CAST(AVG(income) AS TINYINT) FROM persons",
    "SELECT sex, AVG(income)::INTEGER AS a FROM persons GROUP BY sex",
    "SELECT CAST(COUNT(*) AS INTEGER) FROM persons",
    "SELECT CAST(SUM(age) / 3 AS DECIMAL(10,2)) FROM persons",
    "SELECT sex, COUNT(*) FROM persons GROUP BY sex ORDER BY CAST(AVG(age) AS SMALLINT)",
    "SELECT sex, COUNT(*) AS n FROM persons GROUP BY sex HAVING CAST(SUM(income) AS INTEGER) > 0",
    "SELECT ROUND(AVG(income), COUNT(*)) FROM persons",
    "SELECT ROUND(AVG(income), 2.5) FROM persons",
    "SELECT CAST(AVG(income) AS DECIMAL(40,2)) FROM persons",
])
def test_a_cast_that_could_fail_is_refused_with_no_charge(gw, sql):
    before = _spent(gw)
    with pytest.raises(UnsupportedQuery) as e:
        gw.query("pums", sql, consumer="analysts", budget=QueryBudget(rho=0.01))
    assert _spent(gw) == before  # nothing charged
    assert "agg" not in e.value.message.lower() or "AVG" in e.value.message  # analyst's terms


@needs_data
def test_try_cast_and_extreme_rounding_are_answered_as_duckdb_would(gw):
    r = gw.query("pums", "SELECT AVG(income) AS a, TRY_CAST(AVG(income) AS TINYINT) AS t, "
                 "TRY_CAST(AVG(income) AS DECIMAL(12,2)) AS d, ROUND(AVG(income), -400) AS r, "
                 "TRUNC(AVG(income), -400) AS u, TRY_CAST(COUNT(*) AS BIGINT) AS n, "
                 "LN(SUM(age) - SUM(age)) AS l FROM persons", consumer="analysts",
                 budget=QueryBudget(rho=0.05))
    (a, t, d, rr, u, n, ln), = r["rows"]
    json.dumps(r, allow_nan=False, default=str)
    expect = _one(f"SELECT TRY_CAST({a!r}::DOUBLE AS TINYINT), TRY_CAST({a!r}::DOUBLE AS DECIMAL(12,2)), "
                  f"ROUND({a!r}::DOUBLE, -400), TRUNC({a!r}::DOUBLE, -400)")
    assert t == expect[0]  # an income average ≫ 127: NULL, as DuckDB's TRY_CAST
    assert d == float(expect[1]) and rr == expect[2] and u == expect[3]
    assert isinstance(n, int) and ln is None  # LN of a value that may be ≤ 0: NULL, never NaN/−inf



