"""``SUBSTRING(s, start, length)`` on PostgreSQL as DuckDB computes it (issue 21 item 9): the rewrite
of :meth:`dpgate.engines.predicates.PredicateRewriter._substring` evaluated on PostgreSQL over
hostile text (empty, non-ASCII, NULL, past the end) equals DuckDB's own ``substring``; the
constructs whose semantics differ between the engines are refused, naming the engine, before the
charge. ``ROUND(x, d)`` stays refused: DuckDB 2.0's ``round(2.675, 2)`` is 2.67 (the exact decimal
value of the double), while ``round(x·100)/100`` in IEEE doubles — all PostgreSQL and Spark offer
without NUMERIC — gives 2.68 (x·100 = 267.5).
"""

from __future__ import annotations

import duckdb
import pytest
from sqlglot import exp

from dpgate.engines.postgres import _PgPredicates
from dpgate.errors import UnsupportedQuery
from dpgate.sql.node_types import annotate
from _engines import PG_URL, pg_unavailable


#: The declared types of the test's columns (the planner types each node from them: sql.node_types).
TYPES = {"v": "text", "x": "float", "n": "int"}


def _rewriter(engine: str):
    if engine == "postgres":
        return _PgPredicates("postgres")
    # the Spark engine module imports pyspark (the optional dpgate[spark] extra); the README's
    # test command installs only dpgate[test], so the Spark case skips there
    pytest.importorskip("pyspark", reason="the Spark engine needs the dpgate[spark] extra")
    from dpgate.engines.spark import _SparkPredicates

    return _SparkPredicates("spark")

TEXTS = ["eu", "", "éclair", "a\\b", " x ", "日本語テキスト", None]


def _rewrite(rewriter, node: exp.Expression) -> exp.Expression:
    return rewriter.safe(annotate(node, lambda name: TYPES.get(name, "?")))


@pytest.fixture(scope="module")
def pg():
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        yield conn


def _pg_values(conn, sql: str, column: str, values: list) -> list:
    # one row per value, in order (a VALUES list with explicit types: NULL, NaN and ±inf kept)
    rows = conn.execute(f"SELECT {sql} FROM unnest(%s::{column}[]) WITH ORDINALITY AS t(v, i) ORDER BY i",
                        [values]).fetchall()
    return [r[0] for r in rows]


@pytest.mark.postgres
@pytest.mark.parametrize("start,length", [(1, 1), (1, 0), (2, 3), (5, None), (40, 2), (1, 2**31 - 1)])
def test_substring_on_postgres_is_duckdbs(pg, start, length):
    node = exp.Substring(this=exp.column("v"), start=exp.Literal.number(start),
                         **({"length": exp.Literal.number(length)} if length is not None else {}))
    sql = _rewrite(_PgPredicates("postgres"), node).sql(dialect="postgres")
    got = _pg_values(pg, sql, "text", TEXTS)
    args = f"{start}" + (f", {length}" if length is not None else "")
    want = [r[0] for r in duckdb.execute(f"SELECT substring(v, {args}) FROM unnest(?::VARCHAR[]) WITH ORDINALITY "
                                         "AS t(v, i) ORDER BY i", [TEXTS]).fetchall()]
    assert got == want


@pytest.mark.parametrize("engine", ["postgres", "spark"])
@pytest.mark.parametrize("node", [
    exp.Substring(this=exp.column("v"), start=exp.Neg(this=exp.Literal.number(2)), length=exp.Literal.number(2)),
    exp.Substring(this=exp.column("v"), start=exp.Literal.number(0), length=exp.Literal.number(2)),
    exp.Substring(this=exp.column("v"), start=exp.column("n")),
    exp.Substring(this=exp.column("v"), start=exp.Literal.number(1), length=exp.Literal.number(2**31)),
    exp.Round(this=exp.column("x"), decimals=exp.Literal.number(16)),
    exp.Round(this=exp.column("x"), decimals=exp.column("n")),
    exp.Round(this=exp.column("n"), decimals=exp.Literal.number(1)),  # an integer: DuckDB's own rule
], ids=["negative start", "zero start", "computed start", "length 2^31", "16 digits", "computed digits", "integer"])
def test_what_differs_between_engines_is_refused_naming_the_engine(engine, node):
    rewriter = _rewriter(engine)
    with pytest.raises(UnsupportedQuery, match=f"on the {rewriter.engine} engine") as e:
        _rewrite(rewriter, node.copy())
    assert e.value.details["engine"] == rewriter.engine
