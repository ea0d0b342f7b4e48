"""Types of join equalities (issue 19 item 2), on DuckDB, PostgreSQL and Spark.

Each equality of a join compares one type family (int/float as numbers; text; bool; date;
timestamp; never a date with a timestamp); two tables' privacy units join only with the same
declared type, an undeclared unit counting as text (kept as stored). Refusals happen while
planning, before the charge, whatever the engine; the ledger is unchanged.

Before the fix, DuckDB cast silently: a text column joined to an integer column raised
``ConversionException`` after the charge, and only when a protected row survived the WHERE; an
int unit joined to a text unit merged the text ids '7', '07', '+7', ' 7' into unit 7. A text
unit stored as integers in one source (Parquet) and as text in another now compares as text on
every engine: no error, no merged ids (the exact bounded counts are checked, with the same salt,
on each engine).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _engines import as_query, PG_URL, pg_load, pg_schema, pg_unavailable, spark_unavailable, write_policy
from dpgate.errors import UnsupportedQuery
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings
from dpgate.sql.bound import bounded_query, bounded_sql
from dpgate.sql.sources import plan_policy
from dpgate.sql.parse import parse_query

#: Text ids that are four units for a text unit and would all be 7 as integers.
SPELLINGS = ["7", "07", "+7", " 7"]

TABLES = """
[tables.ints]
source = "{ints}"
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.ints.columns]
uid = {{ type = "int" }}
name = {{ type = "text" }}
n = {{ type = "int", lower = 0, upper = 100 }}
flag = {{ type = "bool" }}

[tables.texts]
source = "{texts}"
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.texts.columns]
uid = {{ type = "text" }}
x = {{ type = "float", lower = 0, upper = 10 }}

[tables.numtext]
source = "{numtext}"
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.numtext.columns]
uid = {{ type = "text" }}
y = {{ type = "int", lower = 0, upper = 10 }}

[tables.loose]
source = "{loose}"
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.loose.columns]
z = {{ type = "int", lower = 0, upper = 10 }}

[tables.codes]
source = "{codes}"
public = true

[tables.codes.columns]
code = {{ type = "int" }}
label = {{ type = "text" }}
ratio = {{ type = "float" }}
yes = {{ type = "bool" }}
"""


def tables() -> dict[str, pa.Table]:
    """ints: integer units 7, 8, 9 (and text that is not a number); texts: text units, the
    spellings of 7 among them and a non-numeric id; numtext: text units stored as integers
    (the Parquet column is int64); loose: an undeclared unit (text); codes: a public table."""
    return {
        "ints": pa.table({"uid": pa.array([7, 8, 9, 7], pa.int64()), "name": ["a", "b", "x", "c"],
                          "n": pa.array([1, 2, 3, 4], pa.int64()),
                          "flag": [True, False, True, False]}),
        "texts": pa.table({"uid": SPELLINGS + ["8", "x", "7"], "x": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]}),
        "numtext": pa.table({"uid": pa.array([7, 8, 12], pa.int64()), "y": pa.array([1, 2, 3], pa.int64())}),
        "loose": pa.table({"uid": ["7", "07", "8"], "z": pa.array([1, 2, 3], pa.int64())}),
        "codes": pa.table({"code": pa.array([1, 2, 3], pa.int64()), "label": ["a", "b", "zz"],
                           "ratio": [1.0, 2.0, 2.5],
                           "yes": [True, False, True]}),
    }


#: (query, words of the refusal): every direction of every mismatch.
REFUSED = [
    # units: int → text, text → int, int → undeclared (text as stored), undeclared → int
    ("SELECT COUNT(*) FROM ints i JOIN texts t ON i.uid = t.uid", "i.uid (the privacy unit of ints, int)"),
    ("SELECT COUNT(*) FROM texts t JOIN ints i ON t.uid = i.uid", "t.uid (the privacy unit of texts, text)"),
    ("SELECT COUNT(*) FROM ints i JOIN loose l USING (uid)", "type not declared"),
    ("SELECT COUNT(*) FROM loose l JOIN ints i ON i.uid = l.uid", "type not declared"),
    # protected × public: text → int, int → text (either table first)
    ("SELECT COUNT(*) FROM ints i JOIN codes c ON i.name = c.code", "i.name (text) with c.code (int)"),
    ("SELECT COUNT(*) FROM codes c JOIN ints i ON c.code = i.name", "c.code (int) with i.name (text)"),
    ("SELECT COUNT(*) FROM ints i JOIN codes c ON i.n = c.label", "i.n (int) with c.label (text)"),
    ("SELECT COUNT(*) FROM codes c JOIN ints i ON i.n = c.label WHERE i.n > 1000", "c.label (text) with i.n (int)"),
    ("SELECT COUNT(*) FROM ints i LEFT JOIN codes c ON c.label = i.n", "i.n (int) with c.label (text)"),
    # bool and int, bool and text (date and timestamp: test_date_is_never_joined_to_a_timestamp)
    ("SELECT COUNT(*) FROM ints i JOIN codes c ON i.flag = c.code", "i.flag (bool) with c.code (int)"),
    ("SELECT COUNT(*) FROM ints i JOIN codes c ON i.n = c.yes", "i.n (int) with c.yes (bool)"),
    ("SELECT COUNT(*) FROM ints i JOIN codes c ON i.name = c.yes", "i.name (text) with c.yes (bool)"),
    # public × public (answered for free, but with the same rule)
    ("SELECT COUNT(*) FROM codes a JOIN codes b ON a.label = b.code", "a.label (text) with b.code (int)"),
]

#: Accepted: the same family (int and float compare as numbers); text units, whatever is stored.
ACCEPTED = [
    "SELECT COUNT(*) FROM ints i JOIN codes c ON i.n = c.ratio",
    "SELECT COUNT(*) FROM ints i JOIN codes c ON i.n = c.code",
    "SELECT COUNT(*) FROM ints i JOIN codes c ON i.flag = c.yes",
    "SELECT COUNT(*) FROM texts t JOIN numtext u ON t.uid = u.uid",
    "SELECT COUNT(*) FROM numtext u JOIN texts t USING (uid)",
    "SELECT COUNT(*) FROM texts t JOIN loose l ON t.uid = l.uid",
]


def _write(root: Path, dataset_lines: str, sources: dict[str, str]) -> Path:
    return write_policy(root, "jt", dataset_lines + 'data_version = "v1"\n', TABLES.format(**sources))


def _parquet(root: Path) -> dict[str, str]:
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, table in tables().items():
        pq.write_table(table, root / f"{name}.parquet")
        out[name] = str(root / f"{name}.parquet")
    return out


@pytest.fixture(scope="module")
def duck(tmp_path_factory):
    root = tmp_path_factory.mktemp("jt_duck")
    with Gateway.open(Settings(policies=_write(root, "", _parquet(root / "data")), home=root / "home")) as gw:
        yield gw


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("jt_pg")
    with pg_schema() as schema:
        for name, table in tables().items():
            pg_load(schema, name, table)
        lines = f'engine = "postgres"\nconnection = "{PG_URL}"\n'
        with Gateway.open(Settings(policies=_write(root, lines, {n: f"{schema}.{n}" for n in tables()}),
                                   home=root / "home")) as gw:
            yield gw


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    reason = spark_unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("jt_spark")
    with Gateway.open(Settings(policies=_write(root, 'engine = "spark"\n', _parquet(root / "data")),
                               home=root / "home", spark_master="local[2]")) as gw:
        yield gw


ENGINES = ["duck", pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("spark", marks=pytest.mark.spark)]


@pytest.fixture(params=ENGINES)
def gw(request):
    return request.getfixturevalue(request.param)


def _charges(gw) -> int:
    return gw.ledger.spend(gw.population_of("jt")).charges


@pytest.mark.parametrize("sql, words", REFUSED)
def test_mismatched_join_types_are_refused_before_the_charge(gw, sql, words):
    before = _charges(gw)
    with pytest.raises(UnsupportedQuery) as e:
        gw.query("jt", sql, consumer="analysts", budget=QueryBudget(rho=0.001))
    assert words in e.value.message and "nothing was charged" in e.value.message
    assert e.value.details["charged"] is False and {"left", "right"} <= set(e.value.details)
    assert _charges(gw) == before


def _exact(gw, sql: str, salt: int = 11) -> list:
    """The gateway's own bounded SQL of ``sql`` run on the gateway's engine (exact, pre-noise)."""
    policy = gw._with_public_table_keys(gw.policy("jt"))
    plan = parse_query(sql, policy)
    values = gw.engine.execute(as_query(bounded_query(plan, plan_policy(plan, policy), salt=salt)))
    return [v.tolist() for v in values.values()]


@pytest.mark.parametrize("sql", ACCEPTED)
def test_same_family_joins_run_on_every_engine(gw, sql):
    before = _charges(gw)
    r = gw.query("jt", sql, consumer="analysts", budget=QueryBudget(rho=0.001))
    assert r["charge"] is not None and _charges(gw) == before + 1
    _exact(gw, sql)  # and the bounded SQL runs (no implicit cast that fails)


@pytest.mark.parametrize("sql, expected", [
    # numtext stores its text ids as integers: 7 meets only the text '7' (two rows), 8 meets '8'
    ("SELECT COUNT(*) FROM texts t JOIN numtext u ON t.uid = u.uid", 3),
    ("SELECT COUNT(*) FROM numtext u JOIN texts t USING (uid)", 3),
    # loose: an undeclared unit, text as stored: '7' (2 rows), '07' and '8' meet their own spelling
    ("SELECT COUNT(*) FROM texts t JOIN loose l ON t.uid = l.uid", 4),
    ("SELECT COUNT(DISTINCT t.uid) FROM texts t JOIN loose l ON t.uid = l.uid", 3),
])
def test_text_units_compare_as_text_without_merging_ids(gw, sql, expected):
    """'7', '07', '+7' and ' 7' stay four units: only '7' meets the integer-stored 7, and the
    non-numeric id 'x' raises nothing (before the fix DuckDB cast the text side to BIGINT: a
    ConversionException on 'x', and '07', '+7', ' 7' merged into 7)."""
    assert _exact(gw, sql) == [[expected]]


@pytest.mark.parametrize("removed, moves", [("07", 0), ("+7", 0), ("7", 2), ("8", 1)])
def test_removing_one_text_unit_moves_the_count_by_at_most_m(duck, removed, moves):
    """Neighbouring data: without one unit's rows (removed from both tables) the exact bounded
    count of the join of two text units — one stored as integers — moves by at most m = 3, and
    by exactly that unit's joined rows (the spellings of 7 are other units)."""
    sql = "SELECT COUNT(*) FROM texts t JOIN numtext u ON t.uid = u.uid"
    policy = duck._with_public_table_keys(duck.policy("jt"))
    plan = parse_query(sql, policy)
    bounded = bounded_sql(plan, plan_policy(plan, policy), salt=11)
    full = duck.engine.execute(as_query(bounded))["p0"].tolist()[0]
    text = removed.replace("'", "''")
    without = bounded
    for t in ("texts", "numtext"):
        without = without.replace(f'"jt"."{t}"', f'(SELECT * FROM "jt"."{t}" WHERE CAST(uid AS VARCHAR) <> \'{text}\')')
    assert without != bounded
    change = full - duck.engine.execute(as_query(without))["p0"].tolist()[0]
    assert change == moves and change <= 3


DATES = """
[tables.visits]
source = "{visits}"
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.visits.columns]
uid = {{ type = "int" }}
day = {{ type = "date" }}

[tables.calendar]
source = "{calendar}"
public = true

[tables.calendar.columns]
day = {{ type = "date" }}
at = {{ type = "timestamp" }}
"""


def test_date_is_never_joined_to_a_timestamp(tmp_path):
    """DuckDB casts the date to a timestamp, which fails for a date beyond the timestamp range
    (year 294247; TRY_CAST loads '300000-01-01' as a DATE): refused in both directions, free.
    A date with a date joins."""
    (tmp_path / "visits.csv").write_text("uid,day\n1,2020-01-01\n2,300000-01-01\n")
    (tmp_path / "calendar.csv").write_text("day,at\n2020-01-01,2020-01-01 00:00:00\n")
    folder = write_policy(tmp_path, "jt", 'data_version = "v1"\n', DATES.format(
        visits=tmp_path / "visits.csv", calendar=tmp_path / "calendar.csv"))
    with Gateway.open(Settings(policies=folder, home=tmp_path / "home")) as gw:
        for sql in ("SELECT COUNT(*) FROM visits v JOIN calendar c ON v.day = c.at",
                    "SELECT COUNT(*) FROM calendar c JOIN visits v ON c.at = v.day"):
            with pytest.raises(UnsupportedQuery, match="a date is not compared with a timestamp"):
                gw.query("jt", sql, consumer="analysts", budget=QueryBudget(rho=0.001))
        assert _charges(gw) == 0
        r = gw.query("jt", "SELECT COUNT(*) FROM visits v JOIN calendar c ON v.day = c.day", consumer="analysts",
                     budget=QueryBudget(rho=0.001))
        assert r["charge"] is not None and _charges(gw) == 1


WIDE = """
[tables.wa]
source = "duckdb:{db}:wa"
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.wa.columns]
u = {{ type = "int" }}

[tables.wb]
source = "duckdb:{db}:wb"
privacy_unit = "u"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.wb.columns]
u = {{ type = "int" }}
"""


@pytest.mark.parametrize("a_type, b_type", [("HUGEINT", "UHUGEINT"), ("DECIMAL(38, 0)", "HUGEINT"),
                                            ("UBIGINT", "DECIMAL(20, 0)")])
def test_int_units_stored_as_wide_integers_join_exactly(tmp_path, a_type, b_type):
    """DuckDB compares HUGEINT with UHUGEINT as doubles (2**60 and 2**60 + 1 become one unit) and
    DECIMAL(38, 0) with HUGEINT through a cast that can fail: a unit declared int is loaded as
    BIGINT (every id checked to fit), so two tables' int units compare exactly."""
    import duckdb

    db = tmp_path / "wide.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(f"CREATE TABLE wa AS SELECT CAST(u AS {a_type}) AS u FROM (VALUES (1152921504606846976), (5)) t(u)")
        con.execute(f"CREATE TABLE wb AS SELECT CAST(u AS {b_type}) AS u FROM (VALUES (1152921504606846977), (5)) t(u)")
    folder = write_policy(tmp_path, "jt", 'data_version = "v1"\n', WIDE.format(db=db))
    with Gateway.open(Settings(policies=folder, home=tmp_path / "home")) as gw:
        assert _exact(gw, "SELECT COUNT(*) FROM wa JOIN wb ON wa.u = wb.u") == [[1]]  # only 5 = 5


@pytest.mark.parametrize("create, words", [
    ("CREATE TABLE wa AS SELECT CAST(1180591620717411303424 AS HUGEINT) AS u", "not canonical integers"),
    ("CREATE TYPE ids AS ENUM ('7', '07'); CREATE TABLE wa AS SELECT CAST('07' AS ids) AS u",
     "declared int but stored as ENUM"),
    ("CREATE TABLE wa AS SELECT DATE '2020-01-01' AS u", "declared int but stored as DATE"),
])
def test_int_units_stored_otherwise_are_refused_at_load(tmp_path, create, words):
    import duckdb

    from dpgate.errors import PolicyError

    db = tmp_path / "wide.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(create)
        con.execute("CREATE TABLE wb AS SELECT 1::BIGINT AS u")
    folder = write_policy(tmp_path, "jt", 'data_version = "v1"\n', WIDE.format(db=db))
    with pytest.raises(PolicyError, match=words):
        Gateway.open(Settings(policies=folder, home=tmp_path / "home"))


@pytest.mark.parametrize("sql, expected", [
    # issue 21 item 2: the unit plus an extra key. ints' unit 7 has rows 'a' and 'c': on the unit
    # alone 4 joined rows (capped to m = 3), with the name as an extra key 2 (each row with itself)
    ("SELECT COUNT(*) FROM ints a JOIN ints b ON a.uid = b.uid", 5),
    ("SELECT COUNT(*) FROM ints a JOIN ints b ON a.uid = b.uid AND a.name = b.name", 4),
    # text units (one stored as integers) plus a float = int extra key, as a comma join (item 3):
    # '7' meets 7 on the unit twice (x = 1.0 and 7.0), the extra key keeps x = 1.0 = y only
    ("SELECT COUNT(*) FROM texts t, numtext u WHERE t.uid = u.uid", 3),
    ("SELECT COUNT(*) FROM texts t, numtext u WHERE t.uid = u.uid AND t.x = u.y", 1),
    # a filter in the INNER JOIN's ON (moved to WHERE) and the same filter in WHERE: '7' with 7
    # keeps x = 7.0 > 1, '8' with 8 keeps 5.0 > 2
    ("SELECT COUNT(*) FROM texts t JOIN numtext u ON t.uid = u.uid AND t.x > u.y", 2),
    ("SELECT COUNT(*) FROM texts t JOIN numtext u ON t.uid = u.uid WHERE t.x > u.y", 2),
])
def test_extra_keys_and_comma_joins_run_on_every_engine(gw, sql, expected):
    """The bounded SQL of joins on the unit plus extra keys runs on each engine with the exact
    bounded count computed by hand (the comments), and the query is answered with one charge — or
    none, served from the release cache, when an earlier spelling had its plan (the comma join of
    ``texts t JOIN numtext u ON t.uid = u.uid`` above; the ON filter of the WHERE one)."""
    assert _exact(gw, sql) == [[expected]]
    before = _charges(gw)
    r = gw.query("jt", sql, consumer="analysts", budget=QueryBudget(rho=0.001))
    assert _charges(gw) == before + (0 if r["cached"] else 1)
