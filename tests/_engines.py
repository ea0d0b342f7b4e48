"""Helpers shared by the engine tests: shared data, a PostgreSQL schema per test, Spark.

PostgreSQL: ``DPGATE_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``);
each use gets a fresh randomly named schema, dropped afterwards. Tests skip with a reason when
no server answers. Spark: skipped when pyspark or Java is absent.
"""

from __future__ import annotations

import os
import shutil
import textwrap
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pyarrow as pa

HERE = Path(__file__).resolve().parent
PG_URL = os.environ.get("DPGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def shared_data() -> Path | None:
    """``../shared/data/smartnoise`` beside the repository, or ``/work/shared/…`` (worktrees)."""
    for p in (HERE.parents[1] / "shared" / "data" / "smartnoise", Path("/work/shared/data/smartnoise")):
        if p.is_dir():
            return p
    return None


def pg_unavailable() -> str | None:
    """None when PostgreSQL answers at ``PG_URL``, else the reason to skip."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover
        return "psycopg not installed"
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as e:  # noqa: BLE001
        return f"no PostgreSQL server at {PG_URL} ({type(e).__name__})"
    return None


@contextmanager
def pg_schema() -> Iterator[str]:
    """A fresh schema ``dpgate_eng_<hex>`` in the test database, dropped afterwards."""
    import psycopg

    name = f"dpgate_eng_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


_PG_TYPES = {
    pa.int64(): "bigint", pa.int32(): "integer", pa.float64(): "double precision",
    pa.string(): "text", pa.large_string(): "text", pa.bool_(): "boolean",
    pa.date32(): "date", pa.timestamp("us"): "timestamp",
}


def pg_load(schema: str, table: str, data: pa.Table, *, primary_key: str | None = None,
            types: dict[str, str] | None = None) -> None:
    """Create ``schema.table`` with the Arrow table's columns and copy its rows (NULLs kept)."""
    import psycopg

    types = types or {}
    cols = ", ".join(f'"{f.name}" {types.get(f.name) or _PG_TYPES[f.type]}' for f in data.schema)
    pk = f', PRIMARY KEY ("{primary_key}")' if primary_key else ""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}"."{table}" ({cols}{pk})')
        names = ", ".join(f'"{n}"' for n in data.column_names)
        with conn.cursor() as cur:
            with cur.copy(f'COPY "{schema}"."{table}" ({names}) FROM STDIN') as copy:
                for row in data.to_pylist():
                    copy.write_row([row[n] for n in data.column_names])


def spark_unavailable() -> str | None:
    """None when pyspark imports and Java is on the PATH (or JAVA_HOME), else the reason."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark not installed (pip install 'dpgate[spark]')"
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        return "no Java runtime for Spark"
    return None


def write_policy(folder: Path, name: str, dataset_lines: str, tables: str) -> Path:
    """Write ``folder/policies/<name>.toml`` with a standard budget; returns the policies folder."""
    pol = folder / "policies"
    pol.mkdir(parents=True, exist_ok=True)
    (pol / f"{name}.toml").write_text(
        textwrap.dedent(f"""\
        [dataset]
        name = "{name}"
        population = "people-{name}"
        """) + textwrap.dedent(dataset_lines) + textwrap.dedent("""
        [budget]
        epsilon = 4.0
        delta = 1e-6
        default_query_rho = 0.01

        [allocations]
        analysts = 0.5
        dashboard = 0.5
        """) + textwrap.dedent(tables)
    )
    return pol


def as_query(query):
    """What the engines run, for tests: a query tree as it is; DuckDB text (hand-written, or one of
    the planner's text builders: ``bounded_sql``, ``histogram_sql``) parsed by
    :func:`dpgate.rendered.parse_generated`, with the renderer's flags read from the text builders'
    generated names (``__dpg_unique_rows``: the per-unit step skipped; ``__dpg_rn``: a per-unit
    subquery). Text carries no planner types: engines that rewrite ``TRY`` (PostgreSQL, Spark)
    need the planner's trees (``bounded_query``, ``histogram_query``) for those."""
    from sqlglot import exp

    from dpgate.rendered import parse_generated

    if isinstance(query, exp.Expression):
        return query
    return parse_generated(query, unit_unique='"__dpg_unique_rows"' in query, per_unit='"__dpg_rn"' in query)
