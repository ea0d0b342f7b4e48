"""The unit-unique fast path: skipping the per-unit aggregation changes no bounded value.

When an engine's load establishes one row per privacy unit in a table
(``Engine.unit_is_unique``), :func:`dpgate.sql.bound.bounded_sql` with
``unit_unique=True`` renders the bounded query without step 2 (partials per unit and
group). Hand derivation of why the values cannot move: with one row per unit, a unit's
partial in its (single) group is that row — a count of 1 ≤ m, a fixed-point value already
clamped to [lo, hi] ⊆ [m·min(lo, 0), m·max(hi, 0)] (m ≥ 1), a square ≤ max(lo², hi²), one
group ≤ k — so every clip, the m-rows'-worth scaling and the k-group choice are the
identity, whatever the salt. The tests compare the exact pre-noise vectors of both forms,
element for element, on every engine available, on generated hostile data and on PUMS
(``PUMS_pid.csv``: one row per person), and check that one duplicated unit (at load, or
introduced by a reload, or a dropped PostgreSQL constraint) turns the fast path off.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _engines import as_query, PG_URL, pg_load, pg_schema, pg_unavailable, shared_data, spark_unavailable, write_policy
from dpgate.engines import EngineOptions, EngineSet
from dpgate.errors import Conflict, UnsupportedQuery
from dpgate.policy import load_policies
from dpgate.sql.bound import UNIQUE_ROWS_CTE, bounded_query, bounded_sql, bounded_sql_template
from dpgate.sql.parse import parse_query
from test_engine_parity import CORPUS, PUMS_QUERIES, PUMS_TABLES, TABLES, synthetic

SALTS = (0, 2**62 + 7)
#: Tighter limits than the parity policy: m = 1 and k = 1 make every clip bind on the
#: general form's duplicated data, and the fixed-point clamps still apply per row.
TIGHT = TABLES.replace("max_groups_per_unit = 2", "max_groups_per_unit = 1").replace(
    "max_rows_per_unit = 5", "max_rows_per_unit = 1")


def unique_units(seed: int = 11, rows: int = 2500) -> pa.Table:
    """The parity test's hostile rows with one distinct unit per row (some units NULL)."""
    t = synthetic(seed=seed, rows=rows, units=rows)
    ids = np.arange(1, rows + 1, dtype=np.int64).astype(object)
    ids[np.random.default_rng(seed).choice(rows, 25, replace=False)] = None  # rows without a unit
    return t.set_column(0, "user_id", pa.array(list(ids), pa.int64()))


def with_one_duplicate(t: pa.Table) -> pa.Table:
    """``t`` plus one copy of a row that has a unit: exactly one unit with two rows."""
    units = t.column("user_id").to_pylist()
    i = next(j for j, u in enumerate(units) if u is not None)
    return pa.concat_tables([t, t.slice(i, 1)])


def _open(tmp: Path, name: str, dataset_lines: str, tables: str, options: EngineOptions | None = None
          ) -> EngineSet:
    e = EngineSet(options=options or EngineOptions(timeout_s=300))
    e.load(load_policies(write_policy(tmp / name, "par", dataset_lines, tables)))
    return e


def _same(a: dict, b: dict, what: str) -> None:
    assert list(a) == list(b), what
    for name in a:
        assert a[name].tolist() == b[name].tolist(), f"{what}: column {name}"


def _both_forms(engines: EngineSet, policy, queries, salts, kind: str, dataset: str = "par",
                reference: EngineSet | None = None) -> int:
    """Exact vectors with and without the fast path agree (and agree with ``reference``'s
    general form). Returns the number of comparisons made."""
    table = next(iter(policy.tables))
    assert engines.unit_is_unique(dataset, table) is True
    n = 0
    for sql, refused in queries:
        plan = parse_query(sql, policy)
        for salt in salts:
            general = bounded_sql(plan, policy, salt=salt)
            fast = bounded_sql(plan, policy, salt=salt, unit_unique=True)
            assert UNIQUE_ROWS_CTE in fast and "__dpg_partials" not in fast
            general = bounded_query(plan, policy, salt=salt)  # the trees the gateway hands the engines
            fast = bounded_query(plan, policy, salt=salt, unit_unique=True)
            if kind in refused:
                with pytest.raises(UnsupportedQuery):
                    engines.check(fast)
                break
            engines.check(fast)
            want = (reference or engines).execute(general)
            _same(want, engines.execute(fast), f"{kind}: {sql!r} (salt {salt})")
            if reference is not None:
                _same(want, engines.execute(general), f"{kind} general form: {sql!r}")
            n += 1
    return n


# --- generated data --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    d = tmp_path_factory.mktemp("fast")
    pq.write_table(unique_units(), d / "unique.parquet")
    pq.write_table(with_one_duplicate(unique_units()), d / "dup.parquet")
    return d


@pytest.fixture(scope="module", params=["memory", "in_place"])
def duck(gen, request):
    e = _open(gen, f"duck_{request.param}", f'load = "{request.param}"\n',
              TABLES.format(source=gen / "unique.parquet"))
    yield e
    e.close()


def _policy(gen, tables=TABLES):
    return load_policies(write_policy(gen / "ref", "par", "", tables.format(source=gen / "unique.parquet")))["par"]


def test_fast_path_render_skips_only_the_per_unit_step(gen):
    policy = _policy(gen)
    plan = parse_query("SELECT region, week, COUNT(*), SUM(tokens) FROM prompts GROUP BY region, week", policy)
    general = bounded_sql(plan, policy, salt=3)
    fast = bounded_sql(plan, policy, salt=3, unit_unique=True)
    assert "QUALIFY" in general and "hash(" in general and "__dpg_partials" in general
    assert "QUALIFY" not in fast and "hash(" not in fast and "__dpg_partials" not in fast
    # clamps of the row values and the NULL-unit filter stay
    assert '"__dpg_src"."user_id" IS NOT NULL' in fast and "LEAST(GREATEST(" in fast
    # explain never shows the fast path (whether units are unique is a fact about the data)
    assert UNIQUE_ROWS_CTE not in bounded_sql_template(plan, policy)


@pytest.mark.parametrize("tables", [TABLES, TIGHT], ids=["k2m5", "k1m1"])
def test_duckdb_fast_path_equals_general_form(gen, duck, tables):
    policy = _policy(gen, tables)
    # the engine was loaded with TABLES; the rendered SQL only reads columns, so the
    # tighter policy's limits apply through the SQL text
    n = _both_forms(duck, policy, CORPUS, SALTS, "duckdb")
    assert n >= 2 * (len(CORPUS) - 2)


@pytest.mark.postgres
@pytest.mark.parametrize("tables", [TABLES, TIGHT], ids=["k2m5", "k1m1"])
def test_postgres_fast_path_equals_duckdb(gen, tables):
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    policy = _policy(gen, tables)
    with pg_schema() as schema:
        pg_load(schema, "prompts", unique_units())
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:  # UNIQUE allows the NULL units
            conn.execute(f'ALTER TABLE "{schema}"."prompts" ADD CONSTRAINT u UNIQUE ("user_id")')
        ref = _open(gen, "pg_ref", 'load = "memory"\n', tables.format(source=gen / "unique.parquet"))
        pg = _open(gen, "pg", f'engine = "postgres"\nconnection = "{PG_URL}"\n', tables.format(source=f"{schema}.prompts"))
        try:
            assert _both_forms(pg, policy, CORPUS, SALTS, "postgres", reference=ref) > 40
            # the constraint dropped after the load: a fast-path query is refused, not run
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'ALTER TABLE "{schema}"."prompts" DROP CONSTRAINT u')
            fast = bounded_sql(parse_query("SELECT COUNT(*) FROM prompts", policy), policy, salt=1, unit_unique=True)
            with pytest.raises(Conflict, match="reload"):
                pg.execute(as_query(fast))
        finally:
            pg.close()
            ref.close()
        # no unique index: no fast path
        pg2 = _open(gen, "pg2", f'engine = "postgres"\nconnection = "{PG_URL}"\n', tables.format(source=f"{schema}.prompts"))
        try:
            assert pg2.unit_is_unique("par", "prompts") is False
            with pytest.raises(Conflict):
                pg2.execute(as_query(fast))
        finally:
            pg2.close()


@pytest.mark.spark
@pytest.mark.slow
def test_spark_fast_path_equals_duckdb(gen):
    reason = spark_unavailable()
    if reason:
        pytest.skip(reason)
    policy = _policy(gen)
    ref = _open(gen, "sp_ref", 'load = "memory"\n', TABLES.format(source=gen / "unique.parquet"))
    sp = _open(gen, "sp", 'engine = "spark"\n', TABLES.format(source=gen / "unique.parquet"),
               EngineOptions(timeout_s=300, spark_master="local[2]"))
    try:
        queries = [CORPUS[i] for i in (0, 1, 3, 5, 6, 13, 16, 22, 27, 29)]
        assert _both_forms(sp, policy, queries, SALTS[1:], "spark", reference=ref) >= 8
    finally:
        sp.close()
        ref.close()
    dup = _open(gen, "sp_dup", 'engine = "spark"\n', TABLES.format(source=gen / "dup.parquet"),
                EngineOptions(timeout_s=300, spark_master="local[2]"))
    try:
        assert dup.unit_is_unique("par", "prompts") is False
    finally:
        dup.close()


@pytest.mark.parametrize("load", ["memory", "in_place"])
def test_one_duplicate_unit_turns_the_fast_path_off(gen, load):
    e = _open(gen, f"dup_{load}", f'load = "{load}"\n', TABLES.format(source=gen / "dup.parquet"))
    try:
        assert e.unit_is_unique("par", "prompts") is False
        policy = _policy(gen)
        fast = bounded_sql(parse_query("SELECT COUNT(*) FROM prompts", policy), policy, salt=1, unit_unique=True)
        with pytest.raises(Conflict):  # a query rendered for unique data is refused here
            e.check(as_query(fast))
        with pytest.raises(Conflict):
            e.execute(as_query(fast))
    finally:
        e.close()


def test_null_units_do_not_count_as_duplicates(tmp_path):
    t = unique_units()
    ids = t.column("user_id").to_pylist()
    assert ids.count(None) == 25  # several rows without a unit, each dropped by the rewrite
    pq.write_table(t, tmp_path / "u.parquet")
    e = _open(tmp_path, "n", 'load = "memory"\n', TABLES.format(source=tmp_path / "u.parquet"))
    try:
        assert e.unit_is_unique("par", "prompts") is True
    finally:
        e.close()


def _gateway(tmp_path, data: Path):
    from dpgate.service import Gateway
    from dpgate.settings import Settings

    pol = write_policy(tmp_path / "gw", "par", 'load = "memory"\n', TABLES.format(source=data))
    return Gateway.open(Settings(policies=pol, home=tmp_path / "gw" / "home"), salt_source=lambda: 99)


def _spy(gateway) -> list[str]:
    seen: list[str] = []
    real = gateway.engine.execute

    def execute(sql):
        seen.append(sql if isinstance(sql, str) else sql.sql(dialect="duckdb"))  # the gateway sends trees
        return real(sql)

    gateway.engine.execute = execute
    return seen


def test_gateway_uses_the_fast_path_and_a_reload_with_a_duplicate_switches_it_off(tmp_path):
    from dpgate.service import QueryBudget

    data = tmp_path / "live.parquet"
    pq.write_table(unique_units(), data)
    gw = _gateway(tmp_path, data)
    try:
        seen = _spy(gw)
        q = "SELECT region, COUNT(*), SUM(tokens) FROM prompts GROUP BY region"
        gw.query("par", q, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert UNIQUE_ROWS_CTE in seen[-1]
        pq.write_table(with_one_duplicate(unique_units()), data)
        gw.reload("par")
        assert gw.engine.unit_is_unique("par", "prompts") is False
        gw.query("par", q, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert UNIQUE_ROWS_CTE not in seen[-1] and "__dpg_partials" in seen[-1]
    finally:
        gw.close()


def test_gateway_falls_back_when_a_reload_races_the_render(tmp_path, monkeypatch):
    """The render asked the old engine (unique) but the new one (a duplicate) runs the query:
    the engine refuses the fast-path SQL and the gateway runs the general form instead."""
    from dpgate.service import QueryBudget

    data = tmp_path / "race.parquet"
    pq.write_table(with_one_duplicate(unique_units()), data)
    gw = _gateway(tmp_path, data)
    try:
        seen = _spy(gw)
        monkeypatch.setattr(gw.engine, "unit_is_unique", lambda dataset, table: True)  # a stale answer
        r = gw.query("par", "SELECT COUNT(*) FROM prompts", consumer="analysts", budget=QueryBudget(rho=0.01))
        assert r["charge"] is not None and len(r["rows"]) == 1
        assert UNIQUE_ROWS_CTE in seen[0] and "__dpg_partials" in seen[-1]
        assert len(gw.ledger_entries()) == 1  # one charge for the one release
    finally:
        gw.close()


# --- PUMS (one row per person) ----------------------------------------------------------------------


def _pums_table(csv: Path) -> pa.Table:
    import duckdb

    return duckdb.sql(
        "SELECT " + ", ".join(f"TRY_CAST({c} AS BIGINT) AS {c}" for c in
                              ("age", "sex", "educ", "race", "income", "married", "pid"))
        + f" FROM read_csv('{csv}', all_varchar = true)").to_arrow_table()


PUMS_FAST = [(q, set()) for q in PUMS_QUERIES] + [
    ("SELECT educ, sex, COUNT(*), AVG(income) FROM persons GROUP BY educ, sex", set()),  # k = 1 < 32 groups
]


@pytest.mark.shared_data
def test_pums_fast_path_equals_general_form_duckdb(tmp_path):
    data = shared_data()
    if data is None or not (data / "PUMS_pid.csv").exists():
        pytest.skip("../shared/data/smartnoise/PUMS_pid.csv not present")
    tables = PUMS_TABLES.format(source=data / "PUMS_pid.csv")
    policy = load_policies(write_policy(tmp_path / "ref", "pums", "", tables))["pums"]
    e = EngineSet()
    e.load(load_policies(write_policy(tmp_path / "d", "pums", "", tables)))
    try:
        assert _both_forms(e, policy, PUMS_FAST, SALTS, "duckdb", dataset="pums") == 2 * len(PUMS_FAST)
    finally:
        e.close()


@pytest.mark.shared_data
@pytest.mark.postgres
def test_pums_fast_path_postgres_equals_duckdb(tmp_path):
    data = shared_data()
    if data is None or not (data / "PUMS_pid.csv").exists():
        pytest.skip("../shared/data/smartnoise/PUMS_pid.csv not present")
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    csv = data / "PUMS_pid.csv"
    policy = load_policies(write_policy(tmp_path / "ref", "pums", "", PUMS_TABLES.format(source=csv)))["pums"]
    ref = EngineSet()
    ref.load(load_policies(write_policy(tmp_path / "d", "pums", "", PUMS_TABLES.format(source=csv))))
    with pg_schema() as schema:
        pg_load(schema, "persons", _pums_table(csv), primary_key="pid")
        pg = EngineSet(options=EngineOptions(timeout_s=300))
        pg.load(load_policies(write_policy(tmp_path / "pg", "pums", f'engine = "postgres"\nconnection = "{PG_URL}"\n',
                                           PUMS_TABLES.format(source=f"{schema}.persons"))))
        try:
            assert _both_forms(pg, policy, PUMS_FAST, SALTS, "postgres", dataset="pums",
                               reference=ref) == 2 * len(PUMS_FAST)
        finally:
            pg.close()
            ref.close()


@pytest.mark.shared_data
@pytest.mark.spark
@pytest.mark.slow
def test_pums_fast_path_spark_equals_duckdb(tmp_path):
    data = shared_data()
    if data is None or not (data / "PUMS_pid.csv").exists():
        pytest.skip("../shared/data/smartnoise/PUMS_pid.csv not present")
    reason = spark_unavailable()
    if reason:
        pytest.skip(reason)
    csv = data / "PUMS_pid.csv"
    pq.write_table(_pums_table(csv), tmp_path / "pums.parquet")
    policy = load_policies(write_policy(tmp_path / "ref", "pums", "", PUMS_TABLES.format(source=csv)))["pums"]
    ref = EngineSet()
    ref.load(load_policies(write_policy(tmp_path / "d", "pums", "", PUMS_TABLES.format(source=csv))))
    sp = EngineSet(options=EngineOptions(timeout_s=300, spark_master="local[2]"))
    sp.load(load_policies(write_policy(tmp_path / "s", "pums", 'engine = "spark"\n',
                                       PUMS_TABLES.format(source=tmp_path / "pums.parquet"))))
    try:
        assert _both_forms(sp, policy, PUMS_FAST, SALTS[1:], "spark", dataset="pums",
                           reference=ref) == len(PUMS_FAST)
    finally:
        sp.close()
        ref.close()


# --- property: any table with unique units, any salt ------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_PROP_QUERIES = [
    "SELECT COUNT(*), COUNT(DISTINCT user_id), SUM(tokens), AVG(latency) FROM prompts",
    "SELECT region, week, COUNT(*), SUM(age), VAR_POP(latency) FROM prompts GROUP BY region, week",
    "SELECT flagged, COUNT(model), SUM(tokens) FROM prompts WHERE age > 20 OR tokens < 0 GROUP BY flagged",
]
_ROW = st.fixed_dictionaries({
    "region": st.sampled_from(["eu", "us", "apac", "mars", None]),
    "week": st.one_of(st.none(), st.integers(-2, 54)),
    "tokens": st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=64),
                        st.floats(-200, 9000)),
    "latency": st.one_of(st.none(), st.sampled_from([-11.0, -10.0, 0.25, 0.75, 99.75, 100.0, 1e300, float("nan")]),
                         st.floats(-20, 120)),
    "age": st.one_of(st.none(), st.integers(-(2**62), 2**62), st.integers(-5, 120)),
    "model": st.sampled_from(["gpt", "", None]),
    "flagged": st.sampled_from([True, False, None]),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(_ROW, min_size=0, max_size=25), nulls=st.sets(st.integers(0, 24), max_size=4),
       salt=st.integers(0, 2**63 - 1), tight=st.booleans())
def test_fast_path_equals_general_form_on_any_unique_table(rows, nulls, salt, tight):
    """Hand derivation in the module docstring: with one row per unit the per-unit step is
    the identity, so for any data (NULLs, NaN, ±inf, values beyond the clamps), any salt
    and k, m ≥ 1 the two forms give the same exact vectors."""
    import duckdb

    from dpgate.policy import parse_policy

    text = (TIGHT if tight else TABLES).format(source="/nonexistent.parquet")
    import tomllib

    spec = tomllib.loads('[dataset]\nname = "par"\npopulation = "p"\n[budget]\nepsilon = 1.0\ndelta = 1e-6\n'
                         'default_query_rho = 0.01\n[allocations]\nanalysts = 1.0\n' + text)
    policy = parse_policy(spec, Path("par.toml"))
    con = duckdb.connect()
    try:
        con.execute('CREATE SCHEMA "par"')
        con.execute('CREATE TABLE "par"."prompts" (user_id BIGINT, region VARCHAR, week BIGINT, tokens DOUBLE, '
                    'latency DOUBLE, age BIGINT, model VARCHAR, flagged BOOLEAN)')
        for i, r in enumerate(rows):
            con.execute('INSERT INTO "par"."prompts" VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
                        [None if i in nulls else i + 1, r["region"], r["week"], r["tokens"], r["latency"],
                         r["age"], r["model"], r["flagged"]])
        for sql in _PROP_QUERIES:
            plan = parse_query(sql, policy)
            general = con.execute(bounded_sql(plan, policy, salt=salt)).fetchall()
            fast = con.execute(bounded_sql(plan, policy, salt=salt, unit_unique=True)).fetchall()
            assert general == fast, sql
    finally:
        con.close()


@pytest.mark.postgres
def test_postgres_views_and_materialized_views_never_take_the_fast_path(tmp_path):
    """A view has no index; a materialized view's unique index cannot be held by LOCK TABLE
    for the per-query re-check, so neither is treated as unique (a table with the same
    unique index is)."""
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    import psycopg

    with pg_schema() as schema:
        pg_load(schema, "prompts", unique_units())
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'ALTER TABLE "{schema}"."prompts" ADD UNIQUE ("user_id")')
            conn.execute(f'CREATE VIEW "{schema}"."v" AS SELECT * FROM "{schema}"."prompts"')
            conn.execute(f'CREATE MATERIALIZED VIEW "{schema}"."mv" AS SELECT * FROM "{schema}"."prompts"')
            conn.execute(f'CREATE UNIQUE INDEX ON "{schema}"."mv" ("user_id")')
        for rel, unique in (("prompts", True), ("v", False), ("mv", False)):
            e = _open(tmp_path, f"pg_{rel}", f'engine = "postgres"\nconnection = "{PG_URL}"\n',
                      TABLES.format(source=f"{schema}.{rel}"))
            try:
                assert e.unit_is_unique("par", "prompts") is unique, rel
            finally:
                e.close()


def test_a_join_never_takes_the_fast_path(tmp_path):
    """people has one row per unit, events many: their join on the unit gives a unit several
    rows, so the gateway runs the general form (the caps apply after the join)."""
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings

    n = 200
    pq.write_table(pa.table({"uid": np.arange(n, dtype=np.int64),
                             "region": np.array(["eu", "us"] * (n // 2), dtype=object)}), tmp_path / "people.parquet")
    pq.write_table(pa.table({"uid": np.repeat(np.arange(n, dtype=np.int64), 5),
                             "x": np.arange(5 * n, dtype=np.int64) % 7}), tmp_path / "events.parquet")
    pol = write_policy(tmp_path / "gw", "jn", 'load = "memory"\n', f"""
[tables.people]
source = "{tmp_path / 'people.parquet'}"
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 1
[tables.people.columns]
uid = {{ type = "int" }}
region = {{ type = "text", public_keys = ["eu", "us"] }}

[tables.events]
source = "{tmp_path / 'events.parquet'}"
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 5
[tables.events.columns]
uid = {{ type = "int" }}
x = {{ type = "int", lower = 0, upper = 10 }}
""")
    gw = Gateway.open(Settings(policies=pol, home=tmp_path / "gw" / "home"), salt_source=lambda: 5)
    try:
        assert gw.engine.unit_is_unique("jn", "people") is True
        seen = _spy(gw)
        gw.query("jn", "SELECT p.region, COUNT(*) FROM people p JOIN events e ON p.uid = e.uid GROUP BY p.region",
                 consumer="analysts", budget=QueryBudget(rho=0.01))
        assert seen and UNIQUE_ROWS_CTE not in seen[-1] and "__dpg_partials" in seen[-1]
        out = gw.engine.execute(as_query(seen[-1]))
        assert sorted(out["p0"].tolist()) == [500, 500]  # 5 joined rows per unit, m = 5
        gw.query("jn", "SELECT region, COUNT(*) FROM people GROUP BY region",
                 consumer="analysts", budget=QueryBudget(rho=0.01))
        assert UNIQUE_ROWS_CTE in seen[-1]  # the table alone does
    finally:
        gw.close()
