"""Render the SQL an engine would run, per engine, with no server (tests/test_compile_golden.py).

Each engine's ``render`` reads only what its load found: which tables have one row per unit
and an integer unit (``TableInfo``), and, on PostgreSQL, the typed projection of each source
(built by :meth:`PostgresEngine._check_table` from the catalogue's column types), on Spark, the
name of each table's typed temporary view. This module builds those from the policy alone:

* DuckDB: a :class:`DuckDBEngine` (in-memory, never loaded) with its ``TableInfo``;
* PostgreSQL: :meth:`PostgresEngine._check_table` itself, fed by a fake connection that answers
  the catalogue queries with the canonical PostgreSQL type of each declared column (the unit
  column, when undeclared, ``bigint``) — so the projection is the engine's own code;
* Spark: a :class:`SparkEngine` (no session: ``render`` never touches it) with its view names
  (``__dpg_<dataset>__<table>__golden``) and ``TableInfo``.

No socket is opened, no JVM starts. The unit is an integer and, for tables listed in
``unique``, unique (the fast path); everything else is what a real load of the sample data finds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from dpgate.engines.base import TableInfo, needed_columns
from dpgate.policy import DatasetPolicy, TablePolicy

#: The PostgreSQL type a real load would find for each declared type.
PG_TYPES = {"int": "bigint", "float": "double precision", "text": "text", "bool": "boolean",
            "date": "date", "timestamp": "timestamp without time zone"}
#: Spark's view names carry a per-engine random tag; the golden files use this one.
SPARK_TAG = "golden"


class _Result:
    def __init__(self, rows: list[tuple]) -> None:
        self.rows = rows

    def fetchone(self):
        return self.rows[0] if self.rows else None

    def fetchall(self):
        return self.rows


class _CatalogueConnection:
    """Answers exactly the statements of :meth:`PostgresEngine._check_table`, for one table."""

    connection = None  # psycopg's Composable.as_string(context) reads context.connection
    adapters = None

    def __init__(self, table: TablePolicy, unique: bool) -> None:
        self.table, self.unique = table, unique

    def execute(self, query: Any, params: Any = None) -> _Result:
        text = query if isinstance(query, str) else ""
        if "FROM pg_class" in text:
            return _Result([(1, "r")])
        if "FROM pg_attribute a WHERE" in text:
            cols = needed_columns(self.table)
            return _Result([(n, PG_TYPES[self.table.columns[n].type] if n in self.table.columns else "bigint", i + 1)
                            for i, n in enumerate(cols)])
        if "FROM pg_index" in text:
            return _Result([(self.unique,)])
        return _Result([])  # SELECT * … LIMIT 0


def _infos(policy: DatasetPolicy, unique: Iterable[str], mode: str) -> dict[str, TableInfo]:
    unique = set(unique)
    return {n: TableInfo(n, mode, n in unique and t.privacy_unit is not None, t.privacy_unit is not None)
            for n, t in policy.tables.items()}


def duckdb_engine(policy: DatasetPolicy, unique: Iterable[str] = ()):
    from dpgate.engines.duckdb import DuckDBEngine

    engine = DuckDBEngine(policy)
    engine._tables = _infos(policy, unique, "memory")
    return engine


def postgres_engine(policy: DatasetPolicy, unique: Iterable[str] = ()):
    from dpgate.engines.postgres import PostgresEngine

    tables = {n: dataclasses.replace(t, source=f"golden.{n}") for n, t in policy.tables.items()}
    pg_policy = dataclasses.replace(policy, engine="postgres", tables=tables,
                                    connection="postgresql://golden.invalid/golden")
    engine = PostgresEngine(pg_policy)
    unique = set(unique)
    for name, table in tables.items():
        engine._check_table(_CatalogueConnection(table, name in unique), table)
    return engine


def spark_engine(policy: DatasetPolicy, unique: Iterable[str] = ()):
    """None when pyspark is not installed (importing it starts no JVM)."""
    try:
        from dpgate.engines.spark import SparkEngine
    except ImportError:
        return None
    engine = SparkEngine(policy)
    engine._tag = SPARK_TAG
    engine._views = {(policy.name, n): f"__dpg_{policy.name}__{n}__{SPARK_TAG}" for n in policy.tables}
    engine._tables = _infos(policy, unique, "in_place")
    return engine
