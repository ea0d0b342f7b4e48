"""Parity: the same bounded query gives the same exact (pre-noise) answer on every engine.

A synthetic table with hostile values (NULLs, NaN, ±inf, 1e300, values near 2**62, text
with spaces, backslashes, ``_``/``%`` and non-ASCII) is written to Parquet and loaded into
DuckDB (in memory and in place), PostgreSQL (a fresh schema of the test database) and Spark
(``local[2]``, one session for the module: the JVM start is slow). Each query of the corpus
is planned once, its bounded SQL rendered with fixed salts, and every engine's columns must
equal DuckDB's exactly — or, for the few WHERE constructs an engine cannot run with DuckDB's
TRY semantics, the engine refuses the query in ``check()`` (before any charge).

The analyst-query corpus (``tests/corpus/queries.toml``, every answered query that is not
pending, whatever its dialect) runs the same way: each table typed once
to Parquet (DuckDB, Spark) and PostgreSQL, its bounded SQL with one salt in the general form
and, where the load found the unit unique, in the fast path; every engine's exact columns
equal DuckDB's. Float group keys with k below the key count check that the group-choosing
hash reads the key's ordinal (the text of a double differs between engines).

Also per engine: the k-groups and m-rows limits hold on neighbouring data (one unit with
many rows in many groups added), and the PUMS table (``../shared/data``) gives the same
pre-noise values through the gateway on PostgreSQL as on DuckDB over the CSV.
"""

from __future__ import annotations

import dataclasses

import os
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _engines import as_query, PG_URL, pg_load, pg_schema, pg_unavailable, shared_data, spark_unavailable, write_policy
from dpgate.engines import EngineOptions, EngineSet
from dpgate.errors import UnsupportedQuery
from dpgate.policy import load_policies
from dpgate.sql.bound import bounded_query
from dpgate.sql.parse import parse_query

TABLES = """
[tables.prompts]
source = "{source}"
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit = 5

[tables.prompts.columns]
user_id = {{ type = "int" }}
region = {{ type = "text", public_keys = ["eu", "us", "apac", "latam", "africa"] }}
week   = {{ type = "int", public_keys = "range(0, 52)" }}
tokens = {{ type = "float", lower = 0, upper = 8000, resolution = 1 }}
latency = {{ type = "float", lower = -10, upper = 100, resolution = 0.5 }}
age    = {{ type = "int", lower = 0, upper = 100 }}
model  = {{ type = "text" }}
flagged = {{ type = "bool", public_keys = [true, false] }}
"""

#: The corpus: (query, engines that refuse it before the charge).
CORPUS: list[tuple[str, set[str]]] = [
    ("SELECT COUNT(*) FROM prompts", set()),
    ("SELECT COUNT(*), COUNT(1), COUNT(user_id), COUNT(model), COUNT(DISTINCT user_id) FROM prompts", set()),
    ("SELECT SUM(tokens), AVG(tokens) FROM prompts", set()),
    ("SELECT VAR_POP(latency), VARIANCE(latency), STDDEV(latency) FROM prompts", set()),
    ("SELECT region, COUNT(*) AS n, AVG(tokens) FROM prompts GROUP BY region", set()),
    ("SELECT region, week, COUNT(*), SUM(tokens) FROM prompts GROUP BY region, week", set()),
    ("SELECT week, COUNT(DISTINCT user_id) FROM prompts GROUP BY 1", set()),
    ("SELECT flagged, COUNT(*), SUM(age) FROM prompts GROUP BY flagged", set()),
    ("SELECT COUNT(*) FROM prompts WHERE 30 < age AND region = 'eu'", set()),
    ("SELECT COUNT(*) FROM prompts WHERE region IN ('us', 'eu') OR (age BETWEEN 18 AND 65 AND NOT flagged)",
     set()),
    ("SELECT COUNT(*) FROM prompts WHERE lower(trim(model)) LIKE 'gpt%' AND length(model) > 3", set()),
    ("SELECT SUM(tokens) FROM prompts WHERE abs(age - 40) * 2 < latency", set()),
    ("SELECT COUNT(*) FROM prompts WHERE model IS NOT NULL AND latency IS NULL", set()),
    ("SELECT COUNT(*) FROM prompts WHERE age * 4611686018427387904 > 0", set()),  # BIGINT overflow → NULL
    ("SELECT COUNT(*) FROM prompts WHERE age + 9223372036854775000 > 0", set()),
    ("SELECT COUNT(*) FROM prompts WHERE -age < -50 AND abs(age) > 3", set()),
    ("SELECT COUNT(*) FROM prompts WHERE tokens * 1e300 > 1e307", set()),  # DOUBLE overflow → inf
    ("SELECT COUNT(*) FROM prompts WHERE latency * 1e-310 * 1e-15 = 0", set()),  # underflow → 0
    ("SELECT COUNT(*) FROM prompts WHERE tokens + 1.7e308 > 1.7e308 OR latency - 1e308 < -1e308", set()),
    ("SELECT COUNT(*) FROM prompts WHERE model > 'm'", set()),  # bytewise text order
    ("SELECT COUNT(*) FROM prompts WHERE model LIKE '%\\_%' OR model LIKE 'a\\b%'", set()),
    ("SELECT COUNT(*) FROM prompts WHERE ends_with(model, 'x') OR contains(model, 'pt') "
     "OR starts_with(model, 'g')", set()),
    ("SELECT COUNT(*) FROM prompts WHERE floor(latency) = 3 OR ceil(tokens) > 7000", set()),
    ("SELECT COUNT(*) FROM prompts WHERE coalesce(TRY_CAST(age AS DOUBLE), 0) > 50", set()),
    ("SELECT COUNT(*) FROM prompts WHERE TRY_CAST(latency AS BIGINT) = 3", set()),
    ("SELECT COUNT(*) FROM prompts WHERE concat(model, region) = 'gpt-4eu' OR model || region = 'claudeus'",
     set()),
    ("SELECT COUNT(*) FROM prompts WHERE greatest(age, 10) > least(week, 30) AND nullif(age, 3) IS NOT NULL",
     set()),
    ("SELECT COUNT(*) FROM prompts WHERE TRY_CAST(model AS BIGINT) = 7", {"postgres", "spark"}),
    ("SELECT COUNT(*) FROM prompts WHERE round(latency, 1) = 2.5", {"postgres", "spark"}),
    ("SELECT region, flagged, COUNT(*), SUM(latency), COUNT(latency) FROM prompts "
     "WHERE week < 26 GROUP BY region, flagged", set()),
    # computed keys made total on PostgreSQL and Spark (issue 19): CASE, /, //, % and casts to text
    ("SELECT CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'mid' ELSE 'old' END AS band, COUNT(*), "
     "SUM(tokens) FROM prompts GROUP BY band", set()),
    ("SELECT week // 13 AS q, age % 10 AS d, COUNT(*) FROM prompts GROUP BY q, d", set()),
    ("SELECT FLOOR(age / 10) AS decade, COUNT(*) FROM prompts GROUP BY decade", set()),
    ("SELECT CAST(age - age % 10 AS VARCHAR) AS label, COUNT(DISTINCT user_id) FROM prompts GROUP BY label",
     set()),
    # COUNT_IF (issue 20 step 7): a CASE inside the bounded COUNT on every engine; NULL conditions
    ("SELECT region, COUNT_IF(flagged OR age > 40), COUNT_IF(model LIKE 'gpt%' AND latency > 1) FROM prompts "
     "GROUP BY region", set()),
    # SUBSTRING / LEFT with literal bounds (issue 21 item 9): code points, NULL → NULL, past the end → ''
    ("SELECT LEFT(region, 1) AS r1, COUNT(*), SUM(tokens) FROM prompts GROUP BY r1", set()),
    ("SELECT SUBSTRING(region, 2, 3) AS r2, SUBSTRING(region, 5) AS r5, COUNT(*) FROM prompts GROUP BY r2, r5",
     set()),
    ("SELECT SUBSTRING(region, -2, 2) AS tail, COUNT(*) FROM prompts GROUP BY tail", {"postgres", "spark"}),
    # keys listed by the query (rule listed): a text key over a column without public keys, and
    # SUBSTRING/LEFT in WHERE (code points: 'éc', a leading space, NULL)
    ("SELECT SUBSTRING(model, 1, 3) AS p, COUNT(*), SUM(tokens) FROM prompts "
     "WHERE SUBSTRING(model, 1, 3) IN ('gpt', 'cla', ' gp', 'écl', 'GPT') GROUP BY p", set()),
    ("SELECT COUNT(*) FROM prompts WHERE LEFT(model, 2) = 'ma' OR LEFT(model, 1) = 'G' "
     "OR SUBSTRING(model, 2) = 'lama'", set()),
    # per-unit subqueries (issue 21 item 9): k·m = 10 rows per unit are kept and ~55 units have more,
    # so the rows each engine keeps must be the same ones: floats with NaN/±inf/1e300 (ranked, their
    # text differs between engines), text with spaces and backslashes, NULLs in every column
    ("SELECT AVG(s), COUNT(*) FROM (SELECT user_id, SUM(tokens) AS s, MAX(latency) AS ml, COUNT(model) AS nm "
     "FROM prompts GROUP BY user_id) AS u WHERE ml > 20", set()),
    ("SELECT n, COUNT(*), SUM(a) FROM (SELECT user_id, COUNT(DISTINCT model) AS n, SUM(age) AS a FROM prompts "
     "WHERE week < 40 GROUP BY user_id) AS u GROUP BY n", set()),
    ("SELECT SUM(f), AVG(t) FROM (SELECT user_id, COUNT(flagged) AS f, MIN(latency) AS t, SUM(tokens) AS s "
     "FROM prompts GROUP BY user_id) AS u WHERE s > 20000", set()),
    # NOT LIKE is Like(negate=True) in sqlglot: PostgreSQL and Spark once answered it as LIKE (TPC-H Q13)
    ("SELECT COUNT(*) FROM prompts WHERE model NOT LIKE '%pt%' AND NOT (region NOT LIKE 'e%')", set()),
]
SALTS = (0, 12345, 2**62 + 7)
MODELS = ["gpt-4", "GPT-4 ", " gpt-3.5", "claude", "a\\b", "x_y", "50%", "llama", "mistral", "éclair",
          "Zeta", "", None, "m", "ma"]


def synthetic(seed: int = 7, rows: int = 3000, units: int = 400) -> pa.Table:
    """Hostile, deterministic data (a test fixture: numpy's generator is data, not noise)."""
    rng = np.random.default_rng(seed)
    user = rng.integers(1, units + 1, rows)
    region = rng.choice(["eu", "us", "apac", "latam", "africa", "mars", "EU"], rows).astype(object)
    week = rng.integers(-3, 56, rows).astype(object)
    tokens = rng.uniform(-100, 9000, rows)
    latency = np.round(rng.normal(20, 40, rows), 2)
    age = rng.integers(-5, 110, rows).astype(object)
    model = np.array([MODELS[i] for i in rng.integers(0, len(MODELS), rows)], dtype=object)
    flagged = rng.integers(0, 2, rows).astype(bool).astype(object)
    for col, bad in ((tokens, [np.nan, np.inf, -np.inf, 1e300, -1e300, 0.5, 2.5, -2.5, 7999.5]),
                     (latency, [np.nan, np.inf, 1e-300, 0.25, 0.75, -9.75, 100.25, 3.0])):
        idx = rng.choice(rows, 60, replace=False)
        col[idx] = rng.choice(bad, 60)
    for col in (region, week, age, model, flagged):
        col[rng.choice(rows, 40, replace=False)] = None
    age[rng.choice(rows, 5, replace=False)] = 2**62
    user_col = user.astype(object)
    user_col[rng.choice(rows, 30, replace=False)] = None
    lat = latency.astype(object)
    lat[rng.choice(rows, 40, replace=False)] = None
    return pa.table({
        "user_id": pa.array(list(user_col), pa.int64()),
        "region": pa.array(list(region), pa.string()),
        "week": pa.array(list(week), pa.int64()),
        "tokens": pa.array(tokens, pa.float64()),
        "latency": pa.array(list(lat), pa.float64()),
        "age": pa.array(list(age), pa.int64()),
        "model": pa.array(list(model), pa.string()),
        "flagged": pa.array(list(flagged), pa.bool_()),
    })


def _engine(tmp: Path, dataset_lines: str, source: str, options: EngineOptions | None = None) -> EngineSet:
    policies = load_policies(write_policy(tmp, "par", dataset_lines, TABLES.format(source=source)))
    engines = EngineSet(options=options or EngineOptions(timeout_s=120))
    engines.load(policies)
    return engines


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("parity")
    pq.write_table(synthetic(), d / "prompts.parquet")
    return d


@pytest.fixture(scope="module")
def policy(data_dir):
    return load_policies(write_policy(data_dir / "ref", "par", "", TABLES.format(
        source=data_dir / "prompts.parquet")))["par"]


@pytest.fixture(scope="module")
def reference(data_dir):
    e = _engine(data_dir / "duck", 'load = "memory"\n', str(data_dir / "prompts.parquet"))
    yield e
    e.close()


@pytest.fixture(scope="module")
def in_place(data_dir):
    e = _engine(data_dir / "inplace", 'load = "in_place"\n', str(data_dir / "prompts.parquet"))
    yield e
    e.close()


@pytest.fixture(scope="module")
def postgres(data_dir):
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    with pg_schema() as schema:
        pg_load(schema, "prompts", synthetic())
        e = _engine(data_dir / "pg", f'engine = "postgres"\nconnection = "{PG_URL}"\n', f"{schema}.prompts")
        yield e
        e.close()


@pytest.fixture(scope="module")
def spark(data_dir):
    reason = spark_unavailable()
    if reason:
        pytest.skip(reason)
    e = _engine(data_dir / "spark", 'engine = "spark"\n', str(data_dir / "prompts.parquet"),
                EngineOptions(timeout_s=300, spark_master="local[2]"))
    yield e
    e.close()


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].tolist() == b[name].tolist(), name


def _bounded(policy, sql: str, salt: int):
    return bounded_query(parse_query(sql, policy), policy, salt=salt)


def _check_engine(engines: EngineSet, kind: str, reference: EngineSet, policy, salts) -> None:
    for sql, refused in CORPUS:
        for salt in salts:
            bounded = _bounded(policy, sql, salt)
            if kind in refused:
                with pytest.raises(UnsupportedQuery):
                    engines.check(as_query(bounded))
                break
            engines.check(as_query(bounded))
            try:
                _same(reference.execute(as_query(bounded)), engines.execute(as_query(bounded)))
            except AssertionError as e:
                raise AssertionError(f"{kind} differs from DuckDB on {sql!r} (salt {salt}): {e}") from None


def test_the_corpus_exercises_what_it_should(reference, policy):
    # the hostile rows are there, the k < key-combination case uses the group hash, and
    # the overflow predicates hit rows (so the tests below compare something)
    bounded = _bounded(policy, "SELECT region, week, COUNT(*) FROM prompts GROUP BY region, week", 1)
    assert "HASH(" in bounded.sql(dialect="duckdb").upper()
    # a text key: md5 of the key text; integer unit and keys: the arithmetic hash (BIGINT)
    assert "MD5(" in reference.render(as_query(bounded)).upper()
    by_week = _bounded(policy, "SELECT week, COUNT(*) FROM prompts GROUP BY week", 1)
    rendered = reference.render(as_query(by_week))
    assert "MD5(" not in rendered.upper() and "2147483647" in rendered
    n = reference.execute(as_query('SELECT count(*) AS n FROM "par"."prompts" WHERE age = 4611686018427387904'))["n"]
    assert n.tolist() == [5]
    out = reference.execute(as_query(_bounded(policy, "SELECT COUNT(*) FROM prompts WHERE age * 4611686018427387904 > 0", 0)))
    assert 0 < out["p0"][0] < 3000


def test_per_unit_rows_are_chosen_by_portable_parts(reference, policy):
    # the per-unit corpus entries cut units above k·m = 10 rows (so the rows kept matter), and their
    # row-choosing hash reads no float's text: floats by their rank among the unit's rows, text and
    # ints by their text with NULL as 'n' (every engine gives these the same bytes)
    many = reference.execute(as_query('SELECT count(*) AS n FROM (SELECT user_id FROM "par"."prompts" '
                                      'GROUP BY user_id HAVING count(*) > 10)'))["n"]
    assert many.tolist()[0] >= 30
    sql = next(q for q, _ in CORPUS if q.startswith("SELECT AVG(s), COUNT(*) FROM (SELECT user_id, SUM(tokens)"))
    bounded = _bounded(policy, sql, 1)
    rendered = reference.render(as_query(bounded))
    assert 'DENSE_RANK() OVER (PARTITION BY "user_id" ORDER BY "tokens")' in rendered
    assert 'CAST("tokens" AS TEXT)' not in rendered and 'CAST("latency" AS TEXT)' not in rendered
    assert """COALESCE(CAST(LENGTH("model") AS TEXT) || '.' || "model", 'n')""" in rendered


def test_duckdb_in_place_equals_in_memory(reference, in_place, policy):
    _check_engine(in_place, "duckdb", reference, policy, SALTS[:1])


@pytest.mark.postgres
def test_postgres_equals_duckdb(reference, postgres, policy):
    _check_engine(postgres, "postgres", reference, policy, SALTS)


#: The corpus entries Spark runs by default (one per transform; a JVM query takes seconds);
#: ``DPGATE_TEST_SPARK_FULL=1`` runs the whole corpus (it passes: see the commit's run).
SPARK_DEFAULT = {0, 1, 3, 5, 6, 11, 13, 16, 19, 20, 22, 24, 27, 29, 31, 32, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43}


@pytest.mark.spark
@pytest.mark.slow
def test_spark_equals_duckdb(reference, spark, policy, monkeypatch):
    if os.environ.get("DPGATE_TEST_SPARK_FULL") != "1":
        monkeypatch.setattr(sys.modules[__name__], "CORPUS", [c for i, c in enumerate(CORPUS) if i in SPARK_DEFAULT])
    _check_engine(spark, "spark", reference, policy, SALTS[1:2])


#: Float group keys with k = 1 < 6 keys: the group-choosing hash must read the key's
#: ordinal, not its text (``1.0`` on DuckDB and Spark, ``1`` on PostgreSQL), or the engines
#: keep different groups of a unit with rows under several keys.
FLOAT_KEYS = """
[tables.f]
source = "{source}"
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.f.columns]
uid = {{ type = "int" }}
f = {{ type = "float", public_keys = [1.0, 2.0, 3.0, 4.0, 0.5, -7.0] }}
v = {{ type = "int", lower = 0, upper = 10 }}
"""


def float_key_rows(units: int = 300, per_unit: int = 8) -> pa.Table:
    """Each unit has rows under several float keys (a fixture: not noise)."""
    rng = np.random.default_rng(5)
    keys = np.array([1.0, 2.0, 3.0, 4.0, 0.5, -7.0])
    return pa.table({"uid": np.repeat(np.arange(units, dtype=np.int64), per_unit),
                     "f": keys[rng.integers(0, 6, units * per_unit)],
                     "v": rng.integers(0, 12, units * per_unit).astype(np.int64)})


def _float_key_check(tmp: Path, lines: str, source: str, options: EngineOptions | None = None) -> None:
    pq.write_table(float_key_rows(), tmp / "fk.parquet")
    ref = EngineSet()
    ref.load(load_policies(write_policy(tmp / "fk_ref", "fk", "", FLOAT_KEYS.format(source=tmp / "fk.parquet"))))
    other = EngineSet(options=options or EngineOptions(timeout_s=300))
    other.load(load_policies(write_policy(tmp / "fk_other", "fk", lines, FLOAT_KEYS.format(source=source))))
    policy = load_policies(write_policy(tmp / "fk_plan", "fk", "", FLOAT_KEYS.format(source=tmp / "fk.parquet")))["fk"]
    try:
        for salt in SALTS:
            bounded = _bounded(policy, "SELECT f, COUNT(DISTINCT uid), COUNT(*), SUM(v) FROM f GROUP BY f", salt)
            assert "HASH(" in bounded.sql(dialect="duckdb").upper()
            want = ref.execute(as_query(bounded))
            assert sum(want["p0"].tolist()) == 300  # k = 1: each unit counted in one group
            _same(want, other.execute(as_query(bounded)))
    finally:
        ref.close()
        other.close()


@pytest.mark.postgres
def test_float_group_keys_postgres_equals_duckdb(tmp_path):
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    with pg_schema() as schema:
        pg_load(schema, "f", float_key_rows())
        _float_key_check(tmp_path, f'engine = "postgres"\nconnection = "{PG_URL}"\n', f"{schema}.f")


@pytest.mark.spark
@pytest.mark.slow
def test_float_group_keys_spark_equals_duckdb(tmp_path):
    reason = spark_unavailable()
    if reason:
        pytest.skip(reason)
    pq.write_table(float_key_rows(), tmp_path / "fk_spark.parquet")
    _float_key_check(tmp_path, 'engine = "spark"\n', str(tmp_path / "fk_spark.parquet"),
                     EngineOptions(timeout_s=300, spark_master="local[2]"))


# --- neighbouring data: k and m hold on each engine -----------------------------------------------


def _heavy_unit(rows: int = 200) -> pa.Table:
    """One new unit (id 999999) with ``rows`` rows over every region and many weeks."""
    base = synthetic()
    regions = ["eu", "us", "apac", "latam", "africa"]
    extra = pa.table({
        "user_id": pa.array([999_999] * rows, pa.int64()),
        "region": pa.array([regions[i % 5] for i in range(rows)], pa.string()),
        "week": pa.array([i % 52 for i in range(rows)], pa.int64()),
        "tokens": pa.array([8000.0] * rows, pa.float64()),
        "latency": pa.array([100.0] * rows, pa.float64()),
        "age": pa.array([100] * rows, pa.int64()),
        "model": pa.array(["gpt-4"] * rows, pa.string()),
        "flagged": pa.array([True] * rows, pa.bool_()),
    })
    return pa.concat_tables([base, extra])


def _neighbour_diff(before: dict, after: dict, name: str) -> np.ndarray:
    return np.asarray(after[name], dtype=object) - np.asarray(before[name], dtype=object)


def _check_neighbours(engines_d, engines_d1, policy) -> None:
    k, m = 2, 5
    sql = "SELECT region, week, COUNT(*), SUM(tokens) FROM prompts GROUP BY region, week"
    for salt in SALTS[:2]:
        b = _bounded(policy, sql, salt)
        d, d1 = engines_d.execute(as_query(b)), engines_d1.execute(as_query(b))
        counts = _neighbour_diff(d, d1, "p0")
        sums = _neighbour_diff(d, d1, "p1")
        assert (counts >= 0).all() and (counts <= m).all()
        assert np.count_nonzero(counts) <= k and np.count_nonzero(counts) >= 1
        assert (sums <= m * 8000).all() and np.count_nonzero(sums) <= k


def test_neighbours_duckdb(data_dir, reference, policy):
    pq.write_table(_heavy_unit(), data_dir / "prompts_d1.parquet")
    d1 = _engine(data_dir / "duck_d1", 'load = "memory"\n', str(data_dir / "prompts_d1.parquet"))
    try:
        _check_neighbours(reference, d1, policy)
    finally:
        d1.close()


@pytest.mark.postgres
def test_neighbours_postgres(data_dir, postgres, policy):
    with pg_schema() as schema:
        pg_load(schema, "prompts", _heavy_unit())
        d1 = _engine(data_dir / "pg_d1", f'engine = "postgres"\nconnection = "{PG_URL}"\n', f"{schema}.prompts")
        try:
            _check_neighbours(postgres, d1, policy)
        finally:
            d1.close()


# --- PUMS through the gateway: PostgreSQL engine vs DuckDB over the CSV ------------------------------

PUMS_TABLES = """
[tables.persons]
source = "{source}"
privacy_unit = "pid"
max_groups_per_unit = 1
max_rows_per_unit = 4

[tables.persons.columns]
pid = {{ type = "int" }}
sex = {{ type = "int", public_keys = [0, 1] }}
educ = {{ type = "int", public_keys = "range(1, 17)" }}
race = {{ type = "int", public_keys = "range(1, 7)" }}
age = {{ type = "int", lower = 0, upper = 100 }}
income = {{ type = "int", lower = 0, upper = 500000 }}
married = {{ type = "int", public_keys = [0, 1] }}
"""
PUMS_QUERIES = [
    "SELECT COUNT(*), SUM(income), AVG(age), STDDEV(income) FROM persons",
    "SELECT sex, COUNT(*), AVG(income) FROM persons GROUP BY sex",
    "SELECT educ, COUNT(DISTINCT pid), SUM(age) FROM persons WHERE age >= 18 GROUP BY educ",
    "SELECT race, married, COUNT(*), VAR_POP(age) FROM persons WHERE income > 10000 GROUP BY race, married",
]


def _spy(gateway):
    """Record the exact (pre-noise) columns the gateway's engine returns."""
    seen: list[dict] = []
    real = gateway.engine.execute

    def execute(sql):
        out = real(sql)
        seen.append(out)
        return out

    gateway.engine.execute = execute
    return seen


@pytest.mark.postgres
@pytest.mark.shared_data
def test_pums_through_the_gateway_postgres_equals_duckdb(tmp_path):
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings

    data = shared_data()
    if data is None:
        pytest.skip("../shared/data not present")
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    csv = data / "PUMS_dup.csv"
    table = duckdb.sql(
        "SELECT " + ", ".join(f"TRY_CAST({c} AS BIGINT) AS {c}" for c in
                              ("age", "sex", "educ", "race", "income", "married", "pid"))
        + f" FROM read_csv('{csv}', all_varchar = true)").to_arrow_table()
    with pg_schema() as schema:
        pg_load(schema, "persons", table)
        duck = write_policy(tmp_path / "duck", "pums", 'data_version = "v1"\n', PUMS_TABLES.format(source=csv))
        pg = write_policy(tmp_path / "pg", "pums", 'data_version = "v1"\nengine = "postgres"\n',
                          PUMS_TABLES.format(source=f"{schema}.persons"))
        env_var = "DPGATE_CONNECTION_PUMS"
        import os

        os.environ[env_var] = PG_URL  # the connection from the environment, not the policy
        try:
            gws = [Gateway.open(Settings(policies=p, home=tmp_path / name / "home"), salt_source=lambda: 4242)
                   for name, p in (("duck", duck), ("pg", pg))]
        finally:
            del os.environ[env_var]
        try:
            assert gws[1].dataset("pums")["engine"] == "postgres"
            spies = [_spy(g) for g in gws]
            for sql in PUMS_QUERIES:
                releases = [g.query("pums", sql, consumer="analysts", budget=QueryBudget(rho=0.01)) for g in gws]
                assert all(r["cached"] is False and r["charge"] is not None for r in releases)
                assert releases[0]["columns"] == releases[1]["columns"]
            assert len(spies[0]) == len(spies[1]) == len(PUMS_QUERIES)
            for a, b in zip(*spies):
                _same(a, b)
            assert spies[0][0]["p0"][0] > 1000  # real rows were counted
        finally:
            for g in gws:
                g.close()


def test_pums_fast_path_fact_is_found():
    data = shared_data()
    if data is None:
        pytest.skip("../shared/data not present")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name, unique in (("PUMS_pid.csv", True), ("PUMS_dup.csv", False)):
            folder = write_policy(Path(tmp) / name, "pums", "", PUMS_TABLES.format(source=data / name))
            with EngineSet() as e:
                e.load(load_policies(folder))
                assert e.unit_is_unique("pums", "persons") is unique


@pytest.mark.spark
def test_spark_schema_checks_catalog_tables_and_timeout(spark, data_dir):
    from dpgate.engines.spark import spark_session
    from dpgate.errors import PolicyError

    session = spark_session("local[2]")
    opts = EngineOptions(timeout_s=300, spark_master="local[2]")
    # a floating-point unit in Parquet is refused at load
    bad = synthetic()
    bad = bad.set_column(0, "user_id", pa.array(np.arange(bad.num_rows) / 3.0))
    pq.write_table(bad, data_dir / "float_unit.parquet")
    with pytest.raises(PolicyError, match="stored as double"):
        _engine(data_dir / "s_bad", 'engine = "spark"\n', str(data_dir / "float_unit.parquet"), opts)
    # a catalog table (here a temporary view of the session): live, no data version → cache off
    session.read.parquet(str(data_dir / "prompts.parquet")).createOrReplaceTempView("cat_prompts")
    e = _engine(data_dir / "s_cat", 'engine = "spark"\n', "cat_prompts", opts)
    try:
        assert e.describe("par") == {"engine": "spark", "versioned_by": None, "tables": {"prompts": {"load": "live"}}}
        assert e.unit_is_unique("par", "prompts") is False
        assert e.execute(as_query('SELECT count(*) AS n FROM "par"."prompts"'))["n"].tolist() == [3000]
    finally:
        e.close()
    # the Parquet dataset is fingerprinted like DuckDB's files; a slow query is interrupted
    assert spark.describe("par")["versioned_by"] == "fingerprint"
    # (the 1-second interruption of a slow cross join was checked here; with today's fixture data
    # Spark either overflows under ANSI mode or prunes the join, so the check is left out until it
    # has a data-independent slow query: noted on issue 14)


# --- the analyst-query corpus on every engine ---------------------------------------------------------
#
# Every answered query of tests/corpus/queries.toml (not pending) is planned once against its
# fixture policy; its bounded SQL, rendered with one salt (and in the unit-unique fast path
# where the load found the unit unique), must give the same exact columns on PostgreSQL and
# Spark local[2] as on DuckDB. Each table is first written once, typed as the policy declares,
# to Parquet (read by DuckDB and Spark) and to a PostgreSQL schema (with a UNIQUE constraint
# on the unit where DuckDB's load found it unique), so the engines read the same values.

#: The library datasets (date columns, joins with protected and public tables, per-unit
#: subqueries) run on PostgreSQL and Spark since their date columns load there (issue 19); TPC-H
#: at SF 0.01 (the denormalised layout and the spec's, lineitem reaching the customer through
#: foreign-key paths) since issue 21 item 9.
CORPUS_DATASETS = ("pums", "pums_dup", "pums_null", "d1", "reddit", "usage", "library", "library_catalog",
                   "tpch", "tpch_fk")
_ARROW_OF = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN", "date": "DATE",
             "timestamp": "TIMESTAMP"}
CORPUS_SALT = 2**61 + 12345


#: The datasets PostgreSQL's corpus parity leaves out for now: TPC-H joined the parity corpus with
#: issue 21 item 9; its first PostgreSQL run differed only on the three Q13 shapes (tpch-q13,
#: tpch-q13-orders, tpch-fk-q13), whose ``NOT LIKE`` the predicate rewriter answered as ``LIKE`` (fixed:
#: ``PredicateRewriter.safe`` keeps sqlglot's ``negate``; the synthetic corpus above checks it on every
#: engine). Since 2026-12-04 none: the run with TPC-H after the fix passed
#: (``pytest --all tests/test_engine_parity.py -k corpus_postgres``, ~10 min on a loaded machine).
POSTGRES_SKIPS: tuple[str, ...] = ()


def _answered_corpus(skip: tuple[str, ...] = ()):
    from tests.corpus.harness import load_corpus

    return [q for q in load_corpus() if q.label == "answer" and not q.pending and q.dataset in CORPUS_DATASETS
            and q.dataset not in skip]


class CorpusData:
    """The corpus datasets typed once, as Parquet files plus policies per engine."""

    def __init__(self, root: Path, smartnoise: Path) -> None:
        import tomllib

        from dpgate.sample_data import usage_tables, write_parquet
        from dpgate.tpch import generate_tpch
        from tests.corpus.harness import POLICY_DIR, TPCH_SF
        from tests.corpus.library import write_library

        self.root = root
        usage = root / "usage"
        usage.mkdir(parents=True, exist_ok=True)
        for name, table in usage_tables(users=2000).items():
            write_parquet(table, usage / f"{name}.parquet")
        library = root / "library"
        write_library(library)
        tpch = root / "tpch"
        generate_tpch(tpch, TPCH_SF, denormalised=True)
        self.texts: dict[str, str] = {}
        self.tables: dict[str, dict[str, pa.Table]] = {}
        for name in CORPUS_DATASETS:
            text = (POLICY_DIR / f"{name}.toml").read_text()
            text = (text.replace("{smartnoise}", str(smartnoise)).replace("{usage}", str(usage))
                    .replace("{library}", str(library)).replace("{tpch}", str(tpch)))
            spec = tomllib.loads(text)
            self.tables[name] = {}
            for tname, t in spec["tables"].items():
                src = t["source"]
                reader = f"read_parquet('{src}')" if src.endswith(".parquet") else f"read_csv('{src}', header = true)"
                cols = [f'TRY_CAST("{c}" AS {_ARROW_OF[col["type"]]}) AS "{c}"' for c, col in t.get("columns", {}).items()]
                unit = t.get("privacy_unit")
                if isinstance(unit, str) and unit not in t.get("columns", {}):  # (a path unit is attached)
                    cols.append(f'"{unit}"')
                data = duckdb.sql(f"SELECT {', '.join(cols)} FROM {reader}").to_arrow_table()
                path = root / "parquet" / name / f"{tname}.parquet"
                path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(data, path)
                self.tables[name][tname] = data
                text = text.replace(f'source = "{src}"', f'source = "{{{tname}}}"')
            self.texts[name] = text

    def policy_dir(self, engine: str, sources: dict[str, dict[str, str]], extra: str = "") -> Path:
        """Policies of every corpus dataset for one engine (``sources``: dataset → table → source)."""
        folder = self.root / "policies" / engine
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in self.texts.items():
            for tname, src in sources[name].items():
                text = text.replace(f'source = "{{{tname}}}"', f'source = "{src}"')
            text = text.replace("[budget]", extra + "\n[budget]", 1) if extra else text
            (folder / f"{name}.toml").write_text(text)
        return folder

    def parquet_sources(self) -> dict[str, dict[str, str]]:
        return {n: {t: str(self.root / "parquet" / n / f"{t}.parquet") for t in ts} for n, ts in self.tables.items()}


@pytest.fixture(scope="module")
def corpus_data(tmp_path_factory):
    data = shared_data()
    if data is None:
        pytest.skip("../shared/data/smartnoise not present (the corpus reads PUMS, d1 and reddit)")
    return CorpusData(tmp_path_factory.mktemp("corpus_parity"), data)


@pytest.fixture(scope="module")
def corpus_duckdb(corpus_data):
    e = EngineSet(options=EngineOptions(timeout_s=300))
    e.load(load_policies(corpus_data.policy_dir("duckdb", corpus_data.parquet_sources(), 'load = "memory"\n')))
    yield e
    e.close()


@pytest.fixture(scope="module")
def corpus_policies(corpus_data):
    return load_policies(corpus_data.policy_dir("plan", corpus_data.parquet_sources()))


def _corpus_bounded(policies, engines_ref: EngineSet, q) -> list[tuple[str, object]]:
    """(label, bounded query tree) of one corpus query: the general form, and the fast path where
    the reference load found the unit unique."""
    from dpgate.quantile_release import has_quantiles, without_quantiles
    from dpgate.sql.sources import TableSource, plan_policy
    from dpgate.sql.public import reads_public_only, releases_public_keys_only
    from dpgate.sql.quantile import histogram_query

    from sqlglot import exp

    from dpgate.sql.grouping_sets import grouping_set_branches
    from dpgate.sql.parse import parse_statement
    from dpgate.sql.union import union_branches

    dialect = None if q.dialect == "duckdb" else q.dialect
    tree = parse_statement(q.sql, dialect, allow_union=True)
    sets = grouping_set_branches(tree)  # ROLLUP / CUBE / GROUPING SETS: one part per set, as the gateway plans
    if isinstance(tree, exp.Union) or sets is not None:  # UNION ALL (issue 21 item 6): every part's statements
        return [(f"part {i + 1}: {label}", bounded)
                for i, branch in enumerate(sets if sets is not None else union_branches(tree))
                for label, bounded in _corpus_bounded(policies, engines_ref, dataclasses.replace(
                    q, sql=branch.sql(dialect="duckdb"), dialect="duckdb"))]
    policy = policies[q.dataset]
    from dpgate.pipeline.planning import public_values
    from dpgate.sql.semi_joins import resolve_semi_joins
    if isinstance(tree, exp.Select):  # issue 21 item 5: public IN/EXISTS subqueries → their values, as the gateway does
        tree = resolve_semi_joins(tree, policy, lambda sel: public_values(engines_ref, policy, sel))
    plan = parse_query(q.sql, policy, dialect=dialect, statement=tree)
    policy = plan_policy(plan, policy)  # a join: the joined table, as the service does
    if reads_public_only(plan, policy) or releases_public_keys_only(plan, policy):
        return []  # answered without a bounded query (exact public data, or the policy's key list)
    if has_quantiles(plan):  # what the service runs: counts/sums, then one histogram per column
        base = without_quantiles(plan)
        out = [("general", bounded_query(base, policy, salt=CORPUS_SALT))] \
            if base.primitives or plan.selected_keys else []  # selected keys: the selection's statement too
        columns = dict.fromkeys(p.column for p in plan.primitives if p.kind == "quantile")
        return out + [(f"quantile histogram of {c}", histogram_query(plan, policy, c, salt=CORPUS_SALT))
                      for c in columns]
    out = [("general", bounded_query(plan, policy, salt=CORPUS_SALT))]
    if isinstance(plan.source, TableSource) and engines_ref.unit_is_unique(q.dataset, plan.table):
        out.append(("fast path", bounded_query(plan, policy, salt=CORPUS_SALT, unit_unique=True)))
    return out


_NOT_TRY = "is not supported in WHERE or a computed group key on the {engine} engine yet"

#: Every corpus statement an engine refuses before the charge (``UnsupportedQuery`` from ``check``),
#: ``"<query id> (<form>)"`` → the start of its message, which names the engine. Refusing is safe
#: (nothing is charged, nothing runs); every statement an engine does run must give DuckDB's exact
#: vectors, and a statement that starts running must leave this list (the test compares sets).
#: What remains: ``TRY_CAST`` of text to an integer (DuckDB's cast rules for text — spaces, signs,
#: decimals — are not reproduced on PostgreSQL or Spark), ``ROUND(x, -2)`` on PostgreSQL (its
#: ``round(numeric, int)`` answers in NUMERIC, DuckDB's TRY rounding of doubles is not reproduced),
#: and ``ROUND(x, -2)`` on Spark too. History: 25
#: refusals on PostgreSQL before issue 19 (CASE keys, ``/``, ``//``, ``%``, dates), 2 after it, 3
#: with dg-pu-07, 5 with dd-left-01 (issue 21 item 7: ``LEFT`` is ``SUBSTRING``) and Spark 11; since
#: issue 21 item 9 ``SUBSTRING(s, start, length)`` with literal bounds runs on both
#: (:meth:`dpgate.engines.predicates.PredicateRewriter._substring`): PostgreSQL 3, Spark 9; then
#: per-unit subqueries and joins on Spark (a row-choosing hash with the same bytes on every engine,
#: :func:`dpgate.sql.per_unit._hash_parts`), and TPC-H on both: Spark 3 (dg-pu-07 now meets the
#: ``ROUND`` refusal PostgreSQL gives, seven per-unit statements run).
CORPUS_REFUSALS = {
    "postgres": {
        "sn-th-02 (general)": 'TRY_CAST("__dpg_src"."educ" AS INT) ' + _NOT_TRY.format(engine="postgres"),
        "sn-th-02 (fast path)": 'TRY_CAST("__dpg_src"."educ" AS INT) ' + _NOT_TRY.format(engine="postgres"),
        "dg-pu-07 (general)": 'ROUND("tokens", -2) ' + _NOT_TRY.format(engine="postgres"),
    },
    "spark": {
        "sn-th-02 (general)": 'TRY_CAST("__dpg_src"."educ" AS INT) ' + _NOT_TRY.format(engine="spark"),
        "sn-th-02 (fast path)": 'TRY_CAST("__dpg_src"."educ" AS INT) ' + _NOT_TRY.format(engine="spark"),
        "dg-pu-07 (general)": 'ROUND("tokens", -2) ' + _NOT_TRY.format(engine="spark"),
    },
}


def _corpus_parity(engines: EngineSet, kind: str, reference: EngineSet, policies, queries) -> int:
    n = 0
    problems: list[str] = []
    refused: dict[str, str] = {}
    for q in queries:
        for label, bounded in _corpus_bounded(policies, reference, q):
            try:
                engines.check(as_query(bounded))
            except UnsupportedQuery as e:
                refused[f"{q.id} ({label})"] = e.message
                continue
            except Exception as e:  # noqa: BLE001 - collected, reported together
                problems.append(f"{q.id} ({label}) check: {type(e).__name__}: {str(e)[:300]}")
                continue
            try:
                _same(reference.execute(as_query(bounded)), engines.execute(as_query(bounded)))
                n += 1
            except Exception as e:  # noqa: BLE001 - collected, reported together
                problems.append(f"{q.id} ({label}): {type(e).__name__}: {str(e)[:300]}")
    assert not problems, f"{kind} differs from DuckDB on {len(problems)} corpus queries:\n" + "\n".join(problems)
    listed = CORPUS_REFUSALS[kind]
    assert set(refused) == set(listed), (f"{kind} refuses {len(refused)} statements (listed: {len(listed)}):\n"
                                         + "\n".join(f"{k}: {v[:120]}" for k, v in refused.items()))
    for key, message in refused.items():
        assert message.startswith(listed[key]) and kind in message.lower(), (key, message)
    return n


def test_corpus_parity_covers_the_answered_queries(corpus_duckdb, corpus_policies):
    queries = _answered_corpus()
    assert len(queries) >= 85
    forms = [label for q in queries for label, _ in _corpus_bounded(corpus_policies, corpus_duckdb, q)]
    assert forms.count("fast path") >= 50  # PUMS (one row per person) takes the fast path


@pytest.mark.postgres
@pytest.mark.shared_data
def test_corpus_postgres_equals_duckdb(corpus_data, corpus_duckdb, corpus_policies):
    import psycopg

    from dpgate.engines.base import unique_columns

    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    with pg_schema() as schema:
        sources: dict[str, dict[str, str]] = {}
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            for name, tables in corpus_data.tables.items():
                sources[name] = {}
                for tname, data in tables.items():
                    pg_name = f"{name}__{tname}"
                    pg_load(schema, pg_name, data)
                    declared = corpus_policies[name].table(tname)
                    unit = declared.privacy_unit
                    if unit and corpus_duckdb.unit_is_unique(name, tname):
                        conn.execute(f'ALTER TABLE "{schema}"."{pg_name}" ADD UNIQUE ("{unit}")')
                    for column in unique_columns(declared):  # a foreign-key path's target (TPC-H)
                        if column != unit:
                            conn.execute(f'ALTER TABLE "{schema}"."{pg_name}" ADD UNIQUE ("{column}")')
                    sources[name][tname] = f"{schema}.{pg_name}"
        folder = corpus_data.policy_dir("postgres", sources, f'engine = "postgres"\nconnection = "{PG_URL}"\n')
        pg = EngineSet(options=EngineOptions(timeout_s=300))
        pg.load(load_policies(folder))
        try:
            assert pg.unit_is_unique("pums", "pums") is True
            assert _corpus_parity(pg, "postgres", corpus_duckdb, corpus_policies,
                                  _answered_corpus(POSTGRES_SKIPS)) >= 120
        finally:
            pg.close()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.shared_data
def test_corpus_spark_equals_duckdb(corpus_data, corpus_duckdb, corpus_policies):
    reason = spark_unavailable()
    if reason:
        pytest.skip(reason)
    folder = corpus_data.policy_dir("spark", corpus_data.parquet_sources(), 'engine = "spark"\n')
    sp = EngineSet(options=EngineOptions(timeout_s=600, spark_master="local[2]"))
    sp.load(load_policies(folder))
    try:
        assert _corpus_parity(sp, "spark", corpus_duckdb, corpus_policies, _answered_corpus()) >= 120
    finally:
        sp.close()
