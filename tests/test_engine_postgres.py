"""The PostgreSQL engine: schema checks at load, read-only sessions, timeouts, versions, the unit rule.

Needs the PostgreSQL server of ``DPGATE_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``); each test gets a fresh schema, dropped
afterwards; skipped with the reason when no server answers.
"""

from __future__ import annotations

import psycopg
import pyarrow as pa
import pytest

from _engines import as_query, PG_URL, pg_load, pg_schema, pg_unavailable, write_policy
from dpgate.engines import EngineOptions, EngineSet
from dpgate.engines.postgres import PostgresEngine
from dpgate.sql.node_types import annotate, column_types_of
from dpgate.errors import ExecutionError, PolicyError, QueryTimeout, UnsupportedQuery
from dpgate.policy import load_policies

pytestmark = [pytest.mark.postgres, pytest.mark.skipif(bool(pg_unavailable()), reason=pg_unavailable() or "")]

TABLES = """
[tables.t]
source = "{source}"
privacy_unit = "{unit}"
max_rows_per_unit = 2

[tables.t.columns]
x = {{ type = "float", lower = 0, upper = 10 }}
k = {{ type = "int", public_keys = [0, 1] }}
{extra}
"""


@pytest.fixture()
def schema():
    with pg_schema() as name:
        yield name


def _policies(tmp_path, source: str, *, unit: str = "uid", extra: str = "", dataset: str | None = None,
              connection: bool = True):
    lines = 'engine = "postgres"\n' + (f'connection = "{PG_URL}"\n' if connection else "") + (dataset or "")
    return load_policies(write_policy(tmp_path, "ds", lines, TABLES.format(source=source, unit=unit, extra=extra)))


def _data(**cols) -> pa.Table:
    base = {"uid": pa.array([1, 2, 3, 3], pa.int64()), "x": pa.array([1.5, 2.0, None, 4.0]),
            "k": pa.array([0, 1, 1, 0], pa.int64())}
    base.update(cols)
    return pa.table(base)


def _load(tmp_path, policies, options=None) -> EngineSet:
    e = EngineSet(options=options or EngineOptions(timeout_s=10))
    e.load(policies)
    return e


def test_load_checks_the_schema_and_copies_nothing(tmp_path, schema):
    pg_load(schema, "t", _data())
    with _load(tmp_path, _policies(tmp_path, f"{schema}.t")) as e:
        assert e.describe("ds") == {"engine": "postgres", "versioned_by": None, "tables": {"t": {"load": "live"}}}
        out = e.execute(as_query('SELECT count(*) AS n, sum(x) AS s FROM "ds"."t"'))
        assert out["n"].tolist() == [4] and out["s"].tolist() == [7.5]
        # live: a row added in PostgreSQL is seen by the next query, no reload
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'INSERT INTO "{schema}"."t" VALUES (9, 1.0, 1)')
        assert e.execute(as_query('SELECT count(*) AS n FROM "ds"."t"'))["n"].tolist() == [5]


@pytest.mark.parametrize("problem, data, source, unit, message", [
    ("missing table", None, "{schema}.absent", "uid", "not found"),
    ("missing unit", "plain", "{schema}.t", "nobody", "privacy unit column is missing"),
    ("incompatible", "text_x", "{schema}.t", "uid", "not compatible"),
    ("lossy unit", "float_unit", "{schema}.t", "uid", "stored as double precision"),
])
def test_schema_problems_are_policy_errors(tmp_path, schema, problem, data, source, unit, message):
    if data == "plain":
        pg_load(schema, "t", _data())
    elif data == "text_x":
        pg_load(schema, "t", _data(x=pa.array(["a", "b", "c", "d"])))
    elif data == "float_unit":
        pg_load(schema, "t", _data(uid=pa.array([1.0, 7.4, 6.6, 7.0])))
    with pytest.raises(PolicyError, match=message):
        _load(tmp_path, _policies(tmp_path, source.format(schema=schema), unit=unit))


def test_columns_differing_only_in_case_are_refused(tmp_path, schema):
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}"."t" ("UID" bigint, uid bigint, x float8, k bigint)')
    with pytest.raises(PolicyError, match="ambiguous"):
        _load(tmp_path, _policies(tmp_path, f"{schema}.t"))


def test_int_unit_stored_as_text_is_refused_and_text_unit_is_kept_as_stored(tmp_path, schema):
    pg_load(schema, "t", _data(uid=pa.array(["7", "07", " 7", "NULL"])))
    with pytest.raises(PolicyError, match="declared int but stored as text"):
        _load(tmp_path, _policies(tmp_path, f"{schema}.t", extra='uid = { type = "int" }'))
    with _load(tmp_path / "b", _policies(tmp_path / "b", f"{schema}.t", extra='uid = { type = "text" }')) as e:
        out = e.execute(as_query('SELECT uid FROM "ds"."t"'))
        assert out["uid"].tolist() == ["7", "07", " 7", None]  # never merged; NULL-like dropped


def test_sessions_are_read_only(tmp_path, schema):
    pg_load(schema, "t", _data())
    with _load(tmp_path, _policies(tmp_path, f"{schema}.t")) as e:
        engine = e.engine("ds")
        with engine._conn() as conn:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                conn.execute(f'DELETE FROM "{schema}"."t"')
        with pytest.raises(ExecutionError):
            e.execute(as_query(f'SELECT 1 AS a; DELETE FROM "{schema}"."t"'))
        with pytest.raises(ExecutionError):
            e.execute(as_query(f'DELETE FROM "{schema}"."t"'))
        assert e.execute(as_query('SELECT count(*) AS n FROM "ds"."t"'))["n"].tolist() == [4]


def test_statement_timeout(tmp_path, schema):
    pg_load(schema, "t", _data())
    with _load(tmp_path, _policies(tmp_path, f"{schema}.t"), EngineOptions(timeout_s=0.3)) as e:
        with pytest.raises(QueryTimeout):
            e.execute(as_query('SELECT count(*) AS n FROM "ds"."t" AS a, generate_series(1, 100000000) AS g'))
        assert e.execute(as_query('SELECT count(*) AS n FROM "ds"."t"'))["n"].tolist() == [4]


def test_connection_from_the_environment(tmp_path, schema):
    pg_load(schema, "t", _data())
    policies = _policies(tmp_path, f"{schema}.t", connection=False)
    with pytest.raises(PolicyError, match="DPGATE_CONNECTION_DS"):
        PostgresEngine(policies["ds"], EngineOptions(environ={}))
    with _load(tmp_path, policies, EngineOptions(environ={"DPGATE_CONNECTION_DS": PG_URL})) as e:
        assert e.execute(as_query('SELECT count(*) AS n FROM "ds"."t"'))["n"].tolist() == [4]


def test_unit_uniqueness_comes_from_a_constraint(tmp_path, schema):
    pg_load(schema, "u", _data(uid=pa.array([1, 2, 3, 4], pa.int64())), primary_key="uid")
    pg_load(schema, "t", _data(uid=pa.array([1, 2, 3, 4], pa.int64())))  # unique data, no constraint
    with _load(tmp_path / "a", _policies(tmp_path / "a", f"{schema}.u")) as e:
        assert e.unit_is_unique("ds", "t") is True
    with _load(tmp_path / "b", _policies(tmp_path / "b", f"{schema}.t")) as e:
        assert e.unit_is_unique("ds", "t") is False  # live data may change: not assumed


def test_version_sql_is_evaluated_per_query(tmp_path, schema):
    pg_load(schema, "t", _data())
    sql = f'SELECT count(*), max(x) FROM "{schema}"."t"'
    policies = _policies(tmp_path, f"{schema}.t", dataset=f"version_sql = '{sql}'\n")
    with _load(tmp_path, policies) as e:
        assert e.describe("ds")["versioned_by"] == "version_sql"
        v1 = e.current_version("ds")
        assert v1.startswith("sha256:") and e.current_version("ds") == v1
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'INSERT INTO "{schema}"."t" VALUES (9, 1.0, 1)')
        assert e.current_version("ds") != v1


def test_version_sql_must_be_one_select(tmp_path, schema):
    pg_load(schema, "t", _data())
    policies = _policies(tmp_path, f"{schema}.t", dataset=f"version_sql = 'DELETE FROM {schema}.t'\n")
    with pytest.raises(PolicyError, match="exactly one SELECT"):
        _load(tmp_path, policies)


def test_unsupported_where_construct_is_refused_in_check(tmp_path, schema):
    pg_load(schema, "t", _data())
    policies = _policies(tmp_path, f"{schema}.t")
    tree = as_query('SELECT count(*) AS n FROM "ds"."t" AS s WHERE TRY(TRY_CAST(s.k AS BOOLEAN))')
    annotate(tree, column_types_of(policies["ds"].table("t").columns))  # the planner's types, as a plan's trees carry
    with _load(tmp_path, policies) as e:
        with pytest.raises(UnsupportedQuery, match="postgres engine"):
            e.check(tree)


def test_policy_keys_are_validated(tmp_path):
    from dpgate.policy import load_policies as lp

    bad = [
        ('engine = "oracle"\n', "engine must be one of"),
        ('connection = "postgresql://x"\n', "only for engine"),
        ('engine = "postgres"\nload = "memory"\n', "load is for engine"),
        ('version_sql = "SELECT 1"\n', "live engines"),
        ('engine = "postgres"\ndata_version = "1"\nversion_sql = "SELECT 1"\n', "not both"),
    ]
    for i, (lines, message) in enumerate(bad):
        folder = write_policy(tmp_path / str(i), "ds", lines, TABLES.format(source="public.t", unit="uid", extra=""))
        with pytest.raises(PolicyError, match=message):
            lp(folder)
    folder = write_policy(tmp_path / "src", "ds", 'engine = "postgres"\n',
                          TABLES.format(source="public.t; DROP TABLE x", unit="uid", extra=""))
    with pytest.raises(PolicyError, match="table or view name"):
        lp(folder)
