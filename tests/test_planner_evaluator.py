"""The planner's table-less evaluator is passed in (issue 20 step 6: ``dpgate.sql`` imports no
engine; :mod:`dpgate.sql.evaluation`), and what it computes is DuckDB's answer.

* Computed keys' domains (rule ``enumerated``) and WHERE narrowing of public keys equal an
  independent DuckDB oracle: the inputs' admitted values (and NULL) built *in Python* from the
  policy, loaded into a typed table, the key expression / conjunct evaluated over its rows — not
  the planner's own ``range``/``unnest`` relations. The corpus: CASE with computed results, bins,
  ``//``, ``%``, LEAST/COALESCE/NULLIF, SUBSTRING/LEFT/UPPER/LENGTH/``||``, arithmetic over two
  inputs, float division, dates (``date_trunc``, EXTRACT), hostile values (±1e308 and -0.0 keys,
  ints near 2**62, text keys ``''``, ``a'b``, ``'NULL'``), NULL keys; and the refusals (overflow,
  a non-finite key) exactly where DuckDB fails.
* Without an installed evaluator, planning an enumerated key or a narrowing WHERE raises
  :class:`~dpgate.sql.evaluation.NoEvaluator` (never a silently different plan); queries that
  need no evaluation plan without one; the installed evaluator is the one called.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
import tomllib
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from dpgate.engines.duckdb import evaluate_tableless
from dpgate.errors import UnsupportedQuery
from dpgate.policy import ColumnPolicy, DatasetPolicy, parse_policy
from dpgate.sql import evaluation
from dpgate.sql.parse import parse_query

HERE = Path(__file__).resolve().parent

_BASE = """[dataset]
name = "h"
population = "p"
data_version = "1"
[budget]
epsilon = 1.0
delta = 1e-6
default_query_rho = 0.001
[allocations]
analysts = 1.0
[tables.t]
source = "x.csv"
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.t.columns]
uid = { type = "int" }
age = { type = "int", lower = 0, upper = 100 }
week = { type = "int", public_keys = "range(0, 52)" }
region = { type = "text", public_keys = ["eu", "us", "apac", "latam", "africa"] }
f = { type = "float", public_keys = [1.5, -0.0, 1e308, -1e308, 2.5e-308] }
big = { type = "int", public_keys = [4611686018427387904, -4611686018427387904, 0, 1] }
txt = { type = "text", public_keys = ["", "a'b", "é", "NULL", " x "] }
flag = { type = "bool", public_keys = [true, false] }
d = { type = "date", lower = "2023-12-25", upper = "2024-03-05" }
ts = { type = "timestamp", lower = "2024-02-28 22:00:00", upper = "2024-03-01 02:30:00" }
"""


@pytest.fixture(scope="module")
def hostile() -> DatasetPolicy:
    return parse_policy(tomllib.loads(_BASE), HERE / "h.toml")


_DUCK_TYPES = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN", "date": "DATE",
               "timestamp": "TIMESTAMP"}


def _admitted(col: ColumnPolicy) -> list:
    """Every value the policy admits for ``col`` (and NULL), built in Python."""
    if col.public_keys is not None:
        values = list(col.public_keys)
    elif col.type == "int":
        values = list(range(int(col.lower), int(col.upper) + 1))
    elif col.type == "date":
        lo, hi = col.time_lower, col.time_upper
        values = [lo + dt.timedelta(days=i) for i in range((hi - lo).days + 1)]
    elif col.type == "timestamp":
        lo = col.time_lower.replace(minute=0, second=0, microsecond=0)
        values = []
        while lo <= col.time_upper:
            values.append(lo)
            lo += dt.timedelta(hours=1)
    else:
        raise AssertionError(col)
    return values + [None]


def _oracle_table(con: duckdb.DuckDBPyConnection, cols: list[ColumnPolicy], name: str = "i") -> None:
    con.execute(f"CREATE OR REPLACE TABLE {name} ("
                + ", ".join(f'"{c.name}" {_DUCK_TYPES[c.type]}' for c in cols) + ")")
    rows = list(itertools.product(*[_admitted(c) for c in cols]))
    if rows:
        con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' for _ in cols)})", rows)


def _value(v):
    return float(v) if isinstance(v, Decimal) else v


#: (policy, SELECT key expression): every key whose domain rule is ``enumerated``.
KEYS = [
    ("hostile", "CASE WHEN age > 50 THEN age / 10 ELSE NULL END"),
    ("hostile", "CASE WHEN age > 50 THEN age // 10 WHEN age < 5 THEN -age END"),
    ("hostile", "FLOOR(age / 10) * 10"),
    ("hostile", "age // 7"),
    ("hostile", "age % 3 - 1"),
    ("hostile", "CEIL(age / 3.0)"),
    ("hostile", "ROUND(age / 7, 1)"),
    ("hostile", "CAST(age AS DOUBLE) / 3"),
    ("hostile", "LEAST(week, 10)"),
    ("hostile", "COALESCE(NULLIF(week, 3), -1)"),
    ("hostile", "week + age"),
    ("hostile", "ABS(week - 26) * SIGN(week - 26)"),
    ("hostile", "SUBSTRING(region, 1, 2)"),
    ("hostile", "LEFT(region, 1)"),
    ("hostile", "UPPER(region) || '-'"),
    ("hostile", "LENGTH(region)"),
    ("hostile", "NULLIF(region, 'eu')"),
    ("hostile", "LOWER(txt)"),
    ("hostile", "txt || '!'"),
    ("hostile", "LENGTH(txt)"),
    ("hostile", "TRIM(txt)"),
    ("hostile", "f * 0.5"),
    ("hostile", "-f"),
    ("hostile", "big + 1"),
    ("hostile", "big // 3"),
    ("hostile", "CASE WHEN flag THEN week ELSE -week END"),
    ("hostile", "date_trunc('month', d)"),
    ("hostile", "date_trunc('week', d)"),
    ("hostile", "EXTRACT(year FROM d)"),
    ("hostile", "EXTRACT(dow FROM d)"),
    ("hostile", "EXTRACT(doy FROM d) // 7"),
    ("hostile", "date_trunc('day', ts)"),
    ("hostile", "EXTRACT(hour FROM ts)"),
]

#: Keys DuckDB fails on (or takes non-finite values) for some admitted value: refused.
REFUSED_KEYS = [
    ("hostile", "big * 4"),  # INT64 overflow
    ("hostile", "f * 10"),  # 1e308 * 10: DuckDB raises (overflow of DOUBLE)
    ("hostile", "CAST(txt AS INTEGER)"),  # '' and 'a''b' do not convert
]


def _plan_key(policy: DatasetPolicy, expression: str):
    plan = parse_query(f"SELECT {expression} AS k, COUNT(*) FROM t GROUP BY k", policy)
    (key,) = plan.computed_keys
    return key


@pytest.mark.parametrize("name,expression", KEYS)
def test_enumerated_domain_is_duckdbs(hostile, name, expression):
    key = _plan_key(hostile, expression)
    assert key.rule == "enumerated", key
    table = hostile.table("t")
    cols = [table.column(n) for n in key.inputs]
    con = duckdb.connect()
    _oracle_table(con, cols)
    rows = con.execute(f"SELECT DISTINCT {key.expression} AS v FROM i WHERE v IS NOT NULL ORDER BY v").fetchall()
    expected = [_value(r[0]) for r in rows]
    got = [v for v in key.domain if v is not None]
    assert got == expected, (key.expression, got[:10], expected[:10])
    assert all(type(a) is type(b) for a, b in zip(got, expected)) or key.type == "float"


@pytest.mark.parametrize("name,expression", REFUSED_KEYS)
def test_a_key_duckdb_fails_on_is_refused(hostile, name, expression):
    with pytest.raises(UnsupportedQuery):
        _plan_key(hostile, expression)
    # the oracle agrees that some admitted value fails, or gives a non-finite key
    table = hostile.table("t")
    cols = [c for c in table.columns.values() if re.search(rf"\b{c.name}\b", expression)]
    con = duckdb.connect()
    _oracle_table(con, cols)
    try:
        rows = con.execute(f"SELECT DISTINCT {expression} FROM i").fetchall()
    except duckdb.Error:
        return
    assert any(isinstance(r[0], float) and not math.isfinite(r[0]) for r in rows), rows


#: (declared key column, WHERE conjunct over key columns only).
NARROWING = [
    ("week", "week IN (0, 5, 10, 51, 52, 99)"),
    ("week", "NOT (week BETWEEN 3 AND 40)"),
    ("week", "week * week < 100"),
    ("region", "region LIKE '%a%'"),
    ("region", "COALESCE(NULLIF(region, 'eu'), 'x') <> 'x'"),
    ("region", "LENGTH(region) > 2 OR region = 'eu'"),
    ("f", "f > 1e300 OR f < 0"),
    ("f", "f = 0"),
    ("big", "big + 1 > 1"),
    ("txt", "txt = 'a''b' OR txt = '' OR txt IS NULL"),
    ("txt", "UPPER(txt) = 'NULL'"),
    ("flag", "NOT flag"),
]


@pytest.mark.parametrize("column,conjunct", NARROWING)
def test_narrowing_is_duckdbs(hostile, column, conjunct):
    plan = parse_query(f"SELECT {column}, COUNT(*) FROM t WHERE {conjunct} GROUP BY {column}", hostile)
    col = hostile.table("t").column(column)
    con = duckdb.connect()
    keys = list(col.public_keys)
    con.execute(f'CREATE TABLE k (o BIGINT, "{column}" {_DUCK_TYPES[col.type]})')
    con.executemany("INSERT INTO k VALUES (?, ?)", list(enumerate(keys)))
    kept = [keys[r[0]] for r in con.execute(f"SELECT o FROM k WHERE {conjunct} ORDER BY o").fetchall()]
    narrowed = plan.narrowed_key(column)
    got = list(col.public_keys) if narrowed is None else list(narrowed.public_keys)
    assert got == kept, (plan.where, got, kept)


@pytest.fixture
def no_evaluator():
    before = evaluation.installed()
    evaluation._EVALUATOR.clear()
    yield
    evaluation.install(before or evaluate_tableless)


def test_without_an_evaluator_planning_that_needs_one_fails_loudly(hostile, no_evaluator):
    with pytest.raises(evaluation.NoEvaluator):
        _plan_key(hostile, "age // 11")  # a key not enumerated before in this process (no cache hit)
    with pytest.raises(evaluation.NoEvaluator):
        parse_query("SELECT week, COUNT(*) FROM t WHERE week * 13 < 30 GROUP BY week", hostile)
    # a CASE with literal results, a predicate key and a WHERE over non-key columns need none
    assert parse_query("SELECT CASE WHEN age > 3 THEN 'a' ELSE 'b' END AS k, COUNT(*) FROM t "
                       "WHERE age > 3 GROUP BY k", hostile).computed_keys[0].rule == "case_literals"
    assert parse_query("SELECT age > 30 AS k, COUNT(*) FROM t GROUP BY k", hostile).computed_keys[0].rule \
        == "predicate"


def test_the_installed_evaluator_is_the_one_called(hostile):
    before = evaluation.installed()
    seen: list[str] = []

    def recording(sql: str):
        seen.append(sql)
        return evaluate_tableless(sql)

    evaluation.install(recording)
    try:
        key = _plan_key(hostile, "age // 9")
        plan = parse_query("SELECT week, COUNT(*) FROM t WHERE week * 9 > 400 GROUP BY week", hostile)
    finally:
        evaluation.install(before or evaluate_tableless)
    assert key.domain[:3] == (0, 1, 2) and plan.narrowed_key("week") is not None
    assert len(seen) == 2
    assert all('"t"' not in sql and "x.csv" not in sql for sql in seen)  # no table, no source is read
