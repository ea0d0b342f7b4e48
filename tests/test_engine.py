"""The DuckDB engine (dpgate.engines.duckdb, through EngineSet): loading with TRY_CAST, lock-down,
timeouts, results.

Real DuckDB, real files written to tmp_path (and the shared smartnoise CSVs when present).
"""

from __future__ import annotations

import hashlib
import textwrap
import threading
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpgate.engines import EngineOptions, EngineSet as Engine, source_fingerprint
from dpgate.errors import Conflict, ExecutionError, PolicyError, QueryTimeout
from dpgate.policy import load_policies, load_policy
from tests.shared_data import smartnoise_dir
from _engines import as_query

SHARED = smartnoise_dir()

HOSTILE_CSV = textwrap.dedent(
    """\
    uid,x,n,flag,name,extra
    007,1.5,3,true,a,ignored
    7,NaN,4.6,0,b,ignored
    3,1e300,abc,,c,ignored
    ,-inf,,yes,,ignored
    4,,9223372036854775808,x,d,ignored
    5,inf,-2,false,"e, with comma",ignored
    6,1e400,7,T,,ignored
    """
)


def write_policy(root: Path, tables: str, data_version: str | None = None) -> Path:
    folder = root / "policies"
    folder.mkdir(exist_ok=True)
    version = f'data_version = "{data_version}"\n' if data_version else ""
    path = folder / "ds.toml"
    path.write_text(
        textwrap.dedent(
            f"""\
            [dataset]
            name = "ds"
            population = "people"
            {version}
            [budget]
            epsilon = 1.0
            delta = 1e-6
            default_query_rho = 0.01
            """
        )
        + textwrap.dedent(tables)
    )
    return folder


HOSTILE_TABLE = """
[tables.h]
source = "data/h.csv"
privacy_unit = "UID"

[tables.h.columns]
x = { type = "float", lower = 0, upper = 10 }
N = { type = "int", lower = -5, upper = 5 }
flag = { type = "bool" }
name = { type = "text" }
"""


@pytest.fixture()
def hostile(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "h.csv").write_text(HOSTILE_CSV)
    return load_policies(write_policy(tmp_path, HOSTILE_TABLE))


@pytest.fixture()
def engine():
    e = Engine(timeout_s=5.0)
    yield e
    e.close()


# --- loading ----------------------------------------------------------------------------------


def test_csv_hostile_values_load_with_try_cast(hostile, engine):
    lines = []
    versions = engine.load(hostile, progress=lines.append)
    assert lines == [f"loading ds.h ({len(HOSTILE_CSV.encode())} B, in memory)…"]
    out = engine.execute(as_query('SELECT * FROM "ds"."h"'))
    # Only the declared columns (policy spelling) and the unit column; "extra" is not loaded.
    assert list(out) == ["x", "N", "flag", "name", "UID"]
    x = out["x"]
    assert x.dtype == np.float64
    assert x[0] == 1.5 and np.isnan(x[1]) and x[2] == 1e300 and x[3] == -np.inf
    assert np.isnan(x[4]) and x[5] == np.inf and x[6] == np.inf  # '1e400' overflows to inf
    # int column: '4.6' rounds (DuckDB's cast), 'abc', '' and 2^63 become NULL → object array.
    assert out["N"].tolist() == [3, 5, None, None, None, -2, 7]
    assert out["flag"].tolist() == [True, False, None, True, None, False, True]
    assert out["name"].tolist() == ["a", "b", "c", None, "d", "e, with comma", None]
    # The unit column keeps its text form: '007' and '7' are different units.
    assert out["UID"].tolist() == ["007", "7", "3", None, "4", "5", "6"]
    expected = "sha256:" + hashlib.sha256(
        len(HOSTILE_CSV).to_bytes(8, "big") + HOSTILE_CSV.encode()
    ).hexdigest()
    assert versions == {"ds": expected}


def test_declared_data_version_wins(tmp_path, engine):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "h.csv").write_text(HOSTILE_CSV)
    policies = load_policies(write_policy(tmp_path, HOSTILE_TABLE, data_version="2026-11"))
    assert engine.load(policies) == {"ds": "2026-11"}


def test_parquet_source_with_native_types(tmp_path, engine):
    (tmp_path / "data").mkdir()
    pq.write_table(
        pa.table({
            "user_id": pa.array([10, 11, 12], pa.int64()),
            "tokens": pa.array([1.5, None, float("nan")], pa.float64()),
            "week": pa.array(["1", "x", "3"], pa.string()),
            "secret": pa.array(["s1", "s2", "s3"]),
        }),
        tmp_path / "data" / "p.parquet",
    )
    folder = write_policy(tmp_path, """
        [tables.p]
        source = "data/p.parquet"
        privacy_unit = "user_id"
        [tables.p.columns]
        tokens = { type = "float", lower = 0, upper = 10 }
        week = { type = "int", public_keys = "range(0, 5)" }
        """)
    engine.load(load_policies(folder))
    out = engine.execute(as_query('SELECT * FROM "ds"."p" ORDER BY user_id'))
    assert list(out) == ["tokens", "week", "user_id"]
    assert out["user_id"].dtype == np.int64 and out["user_id"].tolist() == [10, 11, 12]
    assert out["week"].tolist() == [1, None, 3]
    assert out["tokens"][0] == 1.5 and np.isnan(out["tokens"][1]) and np.isnan(out["tokens"][2])


def test_duckdb_source_attached_read_only(tmp_path, engine):
    (tmp_path / "data").mkdir()
    db = tmp_path / "data" / "src.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE events AS SELECT range AS uid, range * 2 AS v FROM range(5)")
    folder = write_policy(tmp_path, """
        [tables.e]
        source = "duckdb:data/src.duckdb:events"
        privacy_unit = "uid"
        [tables.e.columns]
        v = { type = "int", lower = 0, upper = 100 }
        """)
    versions = engine.load(load_policies(folder))
    assert versions["ds"] == source_fingerprint([db])
    out = engine.execute(as_query('SELECT sum(v) AS s, count(*) AS c FROM "ds"."e"'))
    assert out["s"].tolist() == [20] and out["c"].tolist() == [5]
    # The source file was detached: it is not reachable from queries.
    with pytest.raises(ExecutionError):
        engine.execute(as_query("SELECT * FROM __dpgate_source.events"))


def test_shared_smartnoise_csv(engine, tmp_path):
    if not (SHARED / "d1.csv").exists():
        pytest.skip("../shared/data not present")
    folder = write_policy(tmp_path, f"""
        [tables.d1]
        source = "{SHARED / 'd1.csv'}"
        privacy_unit = "UserId"
        [tables.d1.columns]
        Usage = {{ type = "int", lower = 1, upper = 13 }}
        Segment = {{ type = "text", public_keys = ["A", "B", "C"] }}
        """)
    engine.load(load_policies(folder))
    out = engine.execute(as_query('SELECT count(*) AS n, count(DISTINCT "UserId") AS u FROM "ds"."d1"'))
    assert out["n"].tolist() == [1000] and out["u"].tolist() == [1000]


@pytest.mark.parametrize("missing", ["unit", "column"])
def test_missing_column_is_a_policy_error_naming_everything(tmp_path, engine, missing):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "h.csv").write_text(HOSTILE_CSV)
    unit, col = ("nobody", "x") if missing == "unit" else ("uid", "nothere")
    folder = write_policy(tmp_path, f"""
        [tables.h]
        source = "data/h.csv"
        privacy_unit = "{unit}"
        [tables.h.columns]
        {col} = {{ type = "float", lower = 0, upper = 1 }}
        """)
    with pytest.raises(PolicyError) as info:
        engine.load(load_policies(folder))
    err = info.value
    name = unit if missing == "unit" else col
    assert name in err.message and "'h'" in err.message and "ds.toml" in err.message
    assert "h.csv" in err.message
    assert err.details["column"] == name and err.details["table"] == "h"


def test_missing_file_and_unknown_kind(tmp_path, engine):
    folder = write_policy(tmp_path, """
        [tables.h]
        source = "data/absent.csv"
        privacy_unit = "uid"
        """)
    with pytest.raises(PolicyError, match="not found"):
        engine.load(load_policies(folder))
    with pytest.raises(ExecutionError, match="closed"):  # a failed load closes the engine
        engine.execute(as_query("SELECT 1"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "h.json").write_text("{}")
    folder = write_policy(tmp_path, """
        [tables.h]
        source = "data/h.json"
        privacy_unit = "uid"
        """)
    with pytest.raises(PolicyError, match="unknown source kind"):
        Engine().load(load_policies(folder))


def test_malformed_csv_error_carries_no_data(tmp_path, engine):
    (tmp_path / "data").mkdir()
    # A ragged row after the sniffer's sample: DuckDB's own message quotes the line.
    good = "".join(f"{i},{i}\n" for i in range(30_000))
    (tmp_path / "data" / "h.csv").write_text("uid,x\n" + good + "3,secret-value,3\n")
    folder = write_policy(tmp_path, """
        [tables.h]
        source = "data/h.csv"
        privacy_unit = "uid"
        [tables.h.columns]
        x = { type = "text" }
        """)
    with pytest.raises(PolicyError) as info:
        engine.load(load_policies(folder))
    assert "secret" not in info.value.message and "secret" not in str(info.value.details)
    assert info.value.__cause__ is None and info.value.__suppress_context__


# --- lock-down ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM read_parquet('/tmp/x.parquet')",
    ],
)
def test_no_file_access_after_load(hostile, engine, sql):
    engine.load(hostile)
    with pytest.raises(ExecutionError) as info:
        engine.execute(as_query(sql))
    assert "passwd" not in info.value.message


@pytest.mark.parametrize(
    "statement",
    [
        "ATTACH '/tmp/dpgate-test.db' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "RESET enable_external_access",
        "SET threads = 1",
        "PRAGMA enable_profiling",
        "COPY (SELECT 1) TO '/tmp/dpgate-out.csv'",
        "CREATE SECRET (TYPE s3)",
    ],
)
def test_locked_configuration(hostile, engine, statement):
    engine.load(hostile)
    # execute() runs only SELECTs …
    with pytest.raises(ExecutionError):
        engine.execute(as_query(statement))
    # … and DuckDB itself refuses each of these on the locked connection.
    cursor = engine.engine("ds")._con.cursor()
    with pytest.raises(duckdb.Error):
        cursor.execute(statement)
    cursor.close()
    settings = dict(engine.engine("ds")._con.execute(
        "SELECT name, value FROM duckdb_settings() WHERE name IN ('enable_external_access', "
        "'lock_configuration', 'autoload_known_extensions', 'autoinstall_known_extensions')"
    ).fetchall())
    assert settings == {"enable_external_access": "false", "lock_configuration": "true",
                        "autoload_known_extensions": "false", "autoinstall_known_extensions": "false"}


def test_load_once_and_execute_only_after_load(hostile):
    e = Engine()
    with pytest.raises(ExecutionError, match="load"):
        e.execute(as_query("SELECT 1"))
    e.load(hostile)
    with pytest.raises(ExecutionError, match="already loaded"):
        e.load(hostile)
    e.close()
    e.close()  # idempotent
    with pytest.raises(ExecutionError, match="closed"):
        e.execute(as_query("SELECT 1"))


@pytest.mark.parametrize("sql", ["SELECT 1; SELECT 2", "DROP TABLE \"ds\".\"h\"",
                                 "INSERT INTO \"ds\".\"h\" (x) VALUES (1)", "SELEC 1"])
def test_only_one_select(hostile, engine, sql):
    engine.load(hostile)
    with pytest.raises(ExecutionError):
        engine.execute(as_query(sql))
    assert len(engine.execute(as_query('SELECT * FROM "ds"."h"'))["x"]) == 7  # untouched


# --- execution ----------------------------------------------------------------------------------


def test_timeout_interrupts_a_slow_query(hostile):
    e = Engine(timeout_s=0.2)
    e.load(hostile)
    slow = "SELECT count(*) AS c FROM range(100000000000) t(i) WHERE i % 7 = 3"
    with pytest.raises(QueryTimeout) as info:
        e.execute(as_query(slow))
    assert info.value.details == {"timeout_s": 0.2}
    assert e.execute(as_query("SELECT 42 AS v"))["v"].tolist() == [42]  # the engine is still usable
    e.close()


def test_result_types_are_lossless(hostile, engine):
    engine.load(hostile)
    out = engine.execute(as_query(
        "SELECT 5::HUGEINT AS h, (2::HUGEINT ** 100)::HUGEINT AS big, 3::BIGINT AS b, "
        "2.5::DOUBLE AS d, 1.25::DECIMAL(5, 2) AS dec, true AS t, 'eu' AS s, NULL::BIGINT AS n, "
        "18446744073709551615::UBIGINT AS u"
    ))
    assert out["h"].dtype == np.int64 and out["h"].tolist() == [5]
    assert out["big"].dtype == object and out["big"].tolist() == [2**100]  # exact
    assert out["b"].dtype == np.int64
    assert out["d"].dtype == np.float64 and out["dec"].tolist() == [1.25]
    assert out["t"].dtype == bool and out["s"].tolist() == ["eu"]
    assert out["n"].tolist() == [None]
    assert out["u"].tolist() == [2**64 - 1]


def test_sum_of_bigint_is_hugeint_and_returned_as_int64(hostile, engine):
    engine.load(hostile)
    out = engine.execute(as_query("SELECT sum(i) AS s FROM range(1000) t(i)"))
    assert out["s"].dtype == np.int64 and out["s"].tolist() == [499500]


def test_duckdb_errors_carry_no_data(hostile, engine):
    engine.load(hostile)
    with pytest.raises(ExecutionError) as info:
        engine.execute(as_query("SELECT CAST(name AS INTEGER) AS v FROM \"ds\".\"h\""))  # 'a' → error
    assert "'a'" not in info.value.message and "Conversion" in info.value.message


def test_concurrent_queries_from_threads(hostile, engine):
    engine.load(hostile)
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(engine.execute(as_query("SELECT sum(i) AS s FROM range(10000) t(i)"))["s"][0])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [49995000] * 80


def test_source_fingerprint(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"ab")
    b.write_bytes(b"c")
    fp = source_fingerprint([a, b])
    expected = hashlib.sha256((2).to_bytes(8, "big") + b"ab" + (1).to_bytes(8, "big") + b"c")
    assert fp == "sha256:" + expected.hexdigest()
    b.write_bytes(b"a")
    a.write_bytes(b"bc")
    assert source_fingerprint([b, a]) != fp  # same bytes, other boundaries
    with pytest.raises(PolicyError, match="absent"):
        source_fingerprint([tmp_path / "absent"])


def test_engine_arguments(tmp_path):
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            Engine(timeout_s=bad)
    with pytest.raises(ValueError):
        Engine(threads=0)
    e = Engine(memory_limit="256MB", threads=1)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "h.csv").write_text(HOSTILE_CSV)
    e.load(load_policies(write_policy(tmp_path, HOSTILE_TABLE)))
    assert e.engine("ds")._con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
    e.close()


def test_loaded_like_the_planner_fixture(tmp_path):
    # The engine's relation names match TablePolicy.relation (what bounded SQL reads).
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "h.csv").write_text(HOSTILE_CSV)
    policy = load_policy(write_policy(tmp_path, HOSTILE_TABLE) / "ds.toml")
    with Engine() as e:
        e.load({"ds": policy})
        assert len(e.execute(as_query(f"SELECT * FROM {policy.table('h').relation}"))["x"]) == 7


# --- the privacy unit is kept as stored (issue 9, item 2) --------------------------------------

UNIT_CSV = "uid,k\n7,1\n07,1\n7.4,1\n6.6,1\n 7,1\n+7,1\n"


def _unit_policy(tmp_path, unit_decl: str, csv: str = UNIT_CSV, extra: str = "") -> dict:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "u.csv").write_text(csv)
    decl = f"uid = {unit_decl}\n" if unit_decl else ""
    return load_policies(write_policy(tmp_path, f"""
        [tables.u]
        source = "data/u.csv"
        privacy_unit = "uid"
        max_rows_per_unit = 5
        [tables.u.columns]
        {decl}k = {{ type = "int", lower = 0, upper = 1 }}
        {extra}
        """))


def test_int_unit_over_non_canonical_text_is_refused_not_merged(tmp_path):
    # Before: TRY_CAST merged 7, 07, 7.4, 6.6, ' 7' and +7 into one unit (six people, one unit).
    with pytest.raises(PolicyError) as info:
        Engine().load(_unit_policy(tmp_path, '{ type = "int" }'))
    assert "not canonical integers" in info.value.message and "uid" in info.value.message
    assert info.value.details["non_canonical_values"] == 5  # all but the first '7'


def test_text_unit_keeps_every_id_as_stored(tmp_path):
    with Engine() as e:
        e.load(_unit_policy(tmp_path, '{ type = "text" }'))
        out = e.execute(as_query('SELECT uid FROM "ds"."u"'))
        assert out["uid"].tolist() == ["7", "07", "7.4", "6.6", " 7", "+7"]
        n = e.execute(as_query('SELECT count(DISTINCT uid) AS n FROM "ds"."u"'))["n"].tolist()
        assert n == [6]


def test_canonical_int_unit_is_cast_losslessly(tmp_path):
    csv = "uid,k\n7,1\n-12,0\n0,1\n9223372036854775807,1\n,1\nNULL,0\n"
    with Engine() as e:
        e.load(_unit_policy(tmp_path, '{ type = "int" }', csv))
        out = e.execute(as_query('SELECT uid FROM "ds"."u"'))
        assert out["uid"].tolist() == [7, -12, 0, 2**63 - 1, None, None]


@pytest.mark.parametrize("token", ["", "NULL", "null", "nan", "NaN", " None ", "n/a", "#N/A"])
def test_null_like_units_are_dropped_never_merged(tmp_path, token):
    csv = f'uid,k\na,1\n"{token}",1\n"{token}",1\nb,1\n'
    with Engine() as e:
        e.load(_unit_policy(tmp_path, "", csv))
        out = e.execute(as_query('SELECT uid FROM "ds"."u"'))
        assert out["uid"].tolist() == ["a", None, None, "b"]


@pytest.mark.parametrize("decl", ['{ type = "float" }', '{ type = "bool" }'])
def test_float_or_bool_unit_declaration_is_refused(tmp_path, decl):
    with pytest.raises(PolicyError, match="ids must be integers or text"):
        Engine().load(_unit_policy(tmp_path, decl, "uid,k\n1,1\n"))


def test_float_unit_column_in_parquet_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"uid": [7.0, 7.4, 6.6], "k": [1, 1, 1]}), tmp_path / "data" / "u.parquet")
    folder = write_policy(tmp_path, """
        [tables.u]
        source = "data/u.parquet"
        privacy_unit = "uid"
        [tables.u.columns]
        k = { type = "int", lower = 0, upper = 1 }
        """)
    with pytest.raises(PolicyError, match="stored as DOUBLE"):
        Engine().load(load_policies(folder))


def test_columns_differing_only_in_case_are_refused(tmp_path):
    # CSV header USER_ID,user_id,k: the unit could bind to either column.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "c.csv").write_text("USER_ID,user_id,k\n1,2,1\n1,3,1\n")
    folder = write_policy(tmp_path, """
        [tables.c]
        source = "data/c.csv"
        privacy_unit = "user_id"
        [tables.c.columns]
        k = { type = "int", lower = 0, upper = 1 }
        """)
    with pytest.raises(PolicyError) as info:
        Engine().load(load_policies(folder))
    assert "ambiguous" in info.value.message and "'USER_ID'" in info.value.message
    assert info.value.details["column"] == "user_id"


def test_ambiguous_columns_the_policy_does_not_use_are_allowed(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "c.csv").write_text("uid,X,x,k\n1,2,3,1\n")
    folder = write_policy(tmp_path, """
        [tables.c]
        source = "data/c.csv"
        privacy_unit = "uid"
        [tables.c.columns]
        k = { type = "int", lower = 0, upper = 1 }
        """)
    with Engine() as e:
        e.load(load_policies(folder))


# --- in place, uniqueness, reload ------------------------------------------------------------


def _parquet_policy(tmp_path, load: str, rows: int = 1000, unique: bool = True) -> dict:
    (tmp_path / "data").mkdir(parents=True, exist_ok=True)
    uid = np.arange(rows) if unique else np.arange(rows) // 2
    pq.write_table(pa.table({"uid": uid, "x": np.arange(rows) % 7, "extra": np.zeros(rows)}),
                   tmp_path / "data" / "p.parquet")
    folder = write_policy(tmp_path, """
        [tables.p]
        source = "data/p.parquet"
        privacy_unit = "uid"
        [tables.p.columns]
        x = { type = "int", lower = 0, upper = 10 }
        """)
    text = (folder / "ds.toml").read_text().replace('population = "people"\n',
                                                   f'population = "people"\nload = "{load}"\n')
    (folder / "ds.toml").write_text(text)
    return load_policies(folder)


@pytest.mark.parametrize("load", ["memory", "in_place"])
def test_memory_and_in_place_give_the_same_table(tmp_path, load):
    with Engine() as e:
        lines = []
        e.load(_parquet_policy(tmp_path, load), progress=lines.append)
        assert ("in place" in lines[0]) == (load == "in_place")
        out = e.execute(as_query('SELECT count(*) AS n, sum(x) AS s, count(DISTINCT uid) AS u FROM "ds"."p"'))
        assert out["n"].tolist() == [1000] and out["s"].tolist() == [sum(i % 7 for i in range(1000))]
        assert e.describe("ds")["tables"] == {"p": {"load": load}}
        assert e.unit_is_unique("ds", "p") is True


def test_auto_load_mode_by_size(tmp_path):
    policies = _parquet_policy(tmp_path, "auto")
    with Engine(options=EngineOptions(in_place_above_bytes=10)) as e:
        e.load(policies)
        assert e.describe("ds")["tables"]["p"]["load"] == "in_place"
    with Engine(options=EngineOptions(in_place_above_bytes=10**9)) as e:
        e.load(policies)
        assert e.describe("ds")["tables"]["p"]["load"] == "memory"


def test_unit_uniqueness_is_found_at_load(tmp_path):
    with Engine() as e:
        e.load(_parquet_policy(tmp_path, "memory", unique=False))
        assert e.unit_is_unique("ds", "p") is False


def test_in_place_database_reads_only_its_own_files(tmp_path):
    policies = _parquet_policy(tmp_path, "in_place")
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"secret": [1]}), other)
    with Engine() as e:
        e.load(policies)
        with pytest.raises(ExecutionError):
            e.execute(as_query(f"SELECT * FROM read_parquet('{other}')"))
        with pytest.raises(ExecutionError):
            e.execute(as_query("SELECT * FROM read_csv('/etc/passwd')"))
        assert e.execute(as_query('SELECT count(*) AS n FROM "ds"."p"'))["n"].tolist() == [1000]


def test_in_place_file_changed_is_refused_until_reload(tmp_path):
    policies = _parquet_policy(tmp_path, "in_place")
    with Engine() as e:
        v1 = e.load(policies)["ds"]
        pq.write_table(pa.table({"uid": np.arange(5), "x": np.ones(5, dtype=np.int64)}),
                       tmp_path / "data" / "p.parquet")
        with pytest.raises(Conflict, match="reload"):
            e.execute(as_query('SELECT count(*) AS n FROM "ds"."p"'))
        with pytest.raises(Conflict):
            e.check(as_query('SELECT count(*) AS n FROM "ds"."p"'))
        report = e.reload("ds")
        assert report.data_version != v1
        assert e.execute(as_query('SELECT count(*) AS n FROM "ds"."p"'))["n"].tolist() == [5]


def test_reload_swaps_memory_data_and_keeps_old_engine_for_running_queries(tmp_path):
    policies = _parquet_policy(tmp_path, "memory")
    with Engine() as e:
        v1 = e.load(policies)["ds"]
        old = e.engine("ds")
        pq.write_table(pa.table({"uid": np.arange(3), "x": np.ones(3, dtype=np.int64)}),
                       tmp_path / "data" / "p.parquet")
        # memory mode copied the data: still the old rows until the reload
        assert e.execute(as_query('SELECT count(*) AS n FROM "ds"."p"'))["n"].tolist() == [1000]
        started, release = threading.Event(), threading.Event()
        result = {}

        def slow(engine):
            started.set()
            release.wait(10)
            return engine.execute(as_query('SELECT count(*) AS n FROM "ds"."p"'))

        t = threading.Thread(target=lambda: result.update(n=e._run("ds", slow)))
        t.start()
        started.wait(10)
        report = e.reload("ds")
        assert report.data_version != v1 and e.engine("ds") is not old
        release.set()
        t.join(10)
        assert result["n"]["n"].tolist() == [1000]  # finished on the old data
        assert e.execute(as_query('SELECT count(*) AS n FROM "ds"."p"'))["n"].tolist() == [3]
        with pytest.raises(ExecutionError, match="closed"):  # the old engine was closed afterwards
            old.execute(as_query("SELECT 1"))


def test_failed_reload_keeps_serving_old_data(tmp_path):
    policies = _parquet_policy(tmp_path, "memory")
    with Engine() as e:
        e.load(policies)
        (tmp_path / "data" / "p.parquet").write_text("not parquet")
        with pytest.raises(PolicyError):
            e.reload("ds")
        assert e.execute(as_query('SELECT count(*) AS n FROM "ds"."p"'))["n"].tolist() == [1000]


def test_routing_by_dataset(tmp_path):
    a = _parquet_policy(tmp_path / "a", "memory")
    (tmp_path / "b" / "data").mkdir(parents=True)
    (tmp_path / "b" / "data" / "h.csv").write_text(HOSTILE_CSV)
    folder = write_policy(tmp_path / "b", HOSTILE_TABLE)
    text = (folder / "ds.toml").read_text().replace('name = "ds"', 'name = "other"')
    (folder / "ds.toml").write_text(text)
    b = load_policies(folder)
    with Engine() as e:
        e.load({**a, **b})
        assert e.execute(as_query('SELECT count(*) AS n FROM "ds"."p"'))["n"].tolist() == [1000]
        assert e.execute(as_query('SELECT count(*) AS n FROM "other"."h"'))["n"].tolist() == [7]
        with pytest.raises(ExecutionError, match="exactly one dataset"):
            e.execute(as_query('SELECT count(*) AS n FROM "ds"."p", "other"."h"'))
        with pytest.raises(ExecutionError):
            e.execute(as_query("SELECT 1 AS x"))  # no dataset named, several loaded
