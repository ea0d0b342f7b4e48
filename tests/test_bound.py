"""The bounding rewrite, run for real in DuckDB (dpgate.sql.bound).

The engine loads each declared table as ``"<dataset>"."<table>"`` with declared columns
TRY_CAST to their type; :func:`load` builds the same relation directly. Expected values
are derived by hand in comments (pre-noise values of the bounded SQL).
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from dpgate.policy import parse_policy, quote_identifier as q
from dpgate.sql.bound import SALT_PLACEHOLDER, bounded_sql, bounded_sql_template
from dpgate.sql.parse import parse_query
from tests.shared_data import smartnoise_dir

SALT = 0x1234_5678_9ABC


@pytest.fixture()
def con():
    c = duckdb.connect()
    yield c
    c.close()


def table_columns(policy, table_name, unit_type="BIGINT"):
    """(name, DuckDB type) of the loaded relation: the unit column, then declared columns."""
    t = policy.table(table_name)
    cols = [(c.name, c.duckdb_type) for c in t.columns.values()]
    if t.privacy_unit and t.find_column(t.privacy_unit) is None:
        cols.insert(0, (t.privacy_unit, unit_type))
    return cols


def load(con, policy, table_name, rows, unit_type="BIGINT"):
    """(Re)create ``"<dataset>"."<table>"`` holding ``rows`` (dicts; missing keys are NULL)."""
    t = policy.table(table_name)
    cols = table_columns(policy, table_name, unit_type)
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {q(policy.name)}")
    con.execute(f"CREATE OR REPLACE TABLE {t.relation} "
                f"({', '.join(f'{q(n)} {ty}' for n, ty in cols)})")
    if rows:
        data = {n: [r.get(n) for r in rows] for n, _ in cols}
        arrow = pa.table({n: pa.array(v, type=_ARROW[ty]) for (n, ty), v in
                          zip(cols, data.values())})
        con.register("__test_rows", arrow)
        con.execute(f"INSERT INTO {t.relation} SELECT * FROM __test_rows")
        con.unregister("__test_rows")


_ARROW = {"BIGINT": pa.int64(), "DOUBLE": pa.float64(), "VARCHAR": pa.string(),
          "BOOLEAN": pa.bool_()}


def run(con, policy, sql, salt=SALT):
    """Execute the bounded SQL of ``sql``: (columns dict name → list, plan)."""
    plan = parse_query(sql, policy)
    res = con.execute(bounded_sql(plan, policy, salt=salt))
    names = [d[0] for d in res.description]
    rows = res.fetchall()
    return {n: [r[i] for r in rows] for i, n in enumerate(names)}, plan


def values(con, policy, sql, salt=SALT):
    """Result columns keyed by output name (aggregates → their primitives' values)."""
    cols, plan = run(con, policy, sql, salt)
    out = {}
    for o in plan.outputs:
        if hasattr(o, "function"):
            out[o.name] = [cols[p] for p in o.primitives]
        else:
            out[o.name] = cols[o.column]
    return out, cols, plan


# --- known failures of other tools ------------------------------------------------------------


def test_count_unit_and_count_distinct_unit_are_different_aggregates(con, policy):
    # units 1, 2, 3 hold 3, 2 and 1 rows; m = 3, so nothing is clipped:
    # COUNT(user_id) counts rows = 3 + 2 + 1 = 6; COUNT(DISTINCT user_id) counts units = 3.
    rows = [{"user_id": u, "kind": "a"} for u, n in ((1, 3), (2, 2), (3, 1)) for _ in range(n)]
    load(con, policy, "ev", rows)
    cols, plan = run(con, policy, "SELECT COUNT(user_id), COUNT(DISTINCT user_id) FROM ev")
    assert [p.kind for p in plan.primitives] == ["count", "count_distinct_unit"]
    assert cols == {"p0": [6], "p1": [3]}


def test_rows_beyond_m_are_clipped_per_unit(con, policy):
    # unit 1 has 7 rows, m = 3 → contributes 3; unit 2 has 2 rows → 2. COUNT(*) = 5.
    rows = [{"user_id": 1, "kind": "a"}] * 7 + [{"user_id": 2, "kind": "a"}] * 2
    load(con, policy, "ev", rows)
    cols, _ = run(con, policy, "SELECT COUNT(*), COUNT(DISTINCT user_id) FROM ev")
    assert cols == {"p0": [5], "p1": [2]}


@pytest.mark.parametrize("order", list(itertools.permutations(["COUNT(*)", "COUNT(a)", "COUNT(b)"])))
def test_count_star_and_count_columns_in_any_order(con, policy, order):
    # rows (id, a, b): (1, 5, NULL), (2, NULL, 3), (3, 7, 8), (4, NULL, NULL)
    # COUNT(*) = 4, COUNT(a) = 2 (5, 7), COUNT(b) = 2 (3, 8), whatever the SELECT order.
    rows = [{"id": 1, "a": 5}, {"id": 2, "b": 3}, {"id": 3, "a": 7, "b": 8}, {"id": 4}]
    load(con, policy, "sv", rows)
    out, _, _ = values(con, policy, f"SELECT {', '.join(order)} FROM sv")
    assert out == {"count": [[4]], "count_a": [[2]], "count_b": [[2]]}


def test_ungrouped_query_returns_exactly_one_row(con, policy):
    load(con, policy, "prompts", [])
    sql = ("SELECT COUNT(*), SUM(tokens), AVG(latency), VAR_POP(age), COUNT(DISTINCT user_id) "
           "FROM prompts")
    cols, plan = run(con, policy, sql)
    assert all(v == [0] for v in cols.values()) and len(cols) == len(plan.primitives)
    load(con, policy, "prompts", [{"user_id": 1, "region": "eu", "tokens": 3.0}])
    cols, _ = run(con, policy, sql + " WHERE FALSE")
    assert all(v == [0] for v in cols.values())
    cols, _ = run(con, policy, sql + " WHERE tokens > 1e300")
    assert all(v == [0] for v in cols.values())
    cols, _ = run(con, policy, sql)
    assert cols["p0"] == [1] and cols["p1"] == [3]


def test_empty_table_or_where_false_gives_one_zero_row_per_public_key(con, policy):
    keys = ["eu", "us", "apac", "latam", "africa"]
    load(con, policy, "prompts", [])
    cols, _ = run(con, policy, "SELECT region, COUNT(*), SUM(tokens) FROM prompts GROUP BY region")
    assert cols == {"region": keys, "p0": [0] * 5, "p1": [0] * 5}
    load(con, policy, "prompts", [{"user_id": 1, "region": "us", "tokens": 4.0}])
    cols, _ = run(con, policy, "SELECT region, COUNT(*) FROM prompts WHERE 1 = 0 GROUP BY region")
    assert cols == {"region": keys, "p0": [0] * 5}
    cols, _ = run(con, policy, "SELECT region, COUNT(*) FROM prompts GROUP BY region")
    assert cols == {"region": keys, "p0": [0, 1, 0, 0, 0]}


def test_two_keys_give_the_cross_product_in_public_key_order(con, policy):
    load(con, policy, "prompts", [{"user_id": 1, "region": "apac", "week": 3},
                                  {"user_id": 1, "region": "apac", "week": 3}])
    cols, _ = run(con, policy,
                  "SELECT week, region, COUNT(*) FROM prompts GROUP BY week, region")
    # rows in policy column order (region slowest, then week), public-key order within.
    expected_keys = [(r, w) for r in ["eu", "us", "apac", "latam", "africa"] for w in range(52)]
    assert list(zip(cols["region"], cols["week"])) == expected_keys
    counts = dict(zip(expected_keys, cols["p0"]))
    assert counts[("apac", 3)] == 2 and sum(counts.values()) == 2
    bools, _ = run(con, policy, "SELECT flagged, COUNT(*) FROM prompts GROUP BY flagged")
    assert bools == {"flagged": [True, False], "p0": [0, 0]}  # NULL flag is not a public key


def test_keys_outside_the_public_list_vanish(con, policy):
    rows = [{"user_id": 1, "region": "mars"}, {"user_id": 2, "region": None},
            {"user_id": 3, "region": "EU"}, {"user_id": 4, "region": "eu", "week": 60},
            {"user_id": 5, "region": "eu", "week": 0}]
    load(con, policy, "prompts", rows)
    cols, _ = run(con, policy, "SELECT region, COUNT(*) FROM prompts GROUP BY region")
    assert cols["p0"] == [2, 0, 0, 0, 0]  # units 4 and 5 ("eu"); the rest vanish
    cols, _ = run(con, policy, "SELECT region, week, COUNT(*) FROM prompts GROUP BY region, week")
    assert sum(cols["p0"]) == 1  # week 60 is outside range(0, 52)


def test_rows_with_null_unit_are_dropped(con, policy):
    load(con, policy, "ev", [{"user_id": None, "kind": "a"}] * 4 + [{"user_id": 1, "kind": "a"}])
    cols, _ = run(con, policy, "SELECT COUNT(*), COUNT(DISTINCT user_id) FROM ev")
    assert cols == {"p0": [1], "p1": [1]}


def test_generated_aliases_never_collide_with_data_columns(con, policy):
    # Every identifier the rewriter generates, plus the primitive ids, becomes a data column.
    template = bounded_sql_template(
        parse_query("SELECT region, week, COUNT(*), SUM(tokens), AVG(latency), STDDEV(age), "
                    "COUNT(model), COUNT(DISTINCT user_id) FROM prompts GROUP BY region, week",
                    policy),
        policy)
    generated = sorted(set(re.findall(r'"(__dpg_[a-z0-9]+)"', template)))
    assert {"__dpg_u", "__dpg_src", "__dpg_rows", "__dpg_partials", "__dpg_groups", "__dpg_k0",
            "__dpg_o0", "__dpg_g0", "__dpg_v0", "__dpg_p0"} <= set(generated)
    extra = generated + ["p0", "p1", "range", "hash"]
    names = ["__dpg_u", "__dpg_g0", "__dpg_v0"]  # unit, group key, summed column
    columns = {
        "__dpg_g0": {"type": "text", "public_keys": ["x", "y"]},
        "__dpg_v0": {"type": "float", "lower": 0, "upper": 10},
    }
    for n in extra:
        if n not in names:
            columns[n] = {"type": "int", "lower": -100, "upper": 100}
    raw = {
        "dataset": {"name": "d", "population": "p"},
        "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
        "tables": {"t": {"source": "t.csv", "privacy_unit": "__dpg_u", "max_groups_per_unit": 1,
                         "max_rows_per_unit": 2, "columns": columns}},
    }
    pol = parse_policy(raw, Path("x/policies/d.toml"))
    rows = []
    for u in range(1, 6):
        for j in range(3):  # 3 rows per unit; m = 2 keeps 2 per unit in counts
            r = {n: 50 for n in columns if columns[n]["type"] == "int"}
            r.update({"__dpg_u": u, "__dpg_g0": "x" if u % 2 else "y", "__dpg_v0": 4.0})
            rows.append(r)
    load(con, pol, "t", rows)
    out, cols, plan = values(
        con, pol,
        'SELECT "__dpg_g0", COUNT(*), SUM("__dpg_v0"), COUNT(DISTINCT "__dpg_u"), SUM("__dpg_p0"), '
        'SUM(p0) FROM t WHERE "__dpg_src" > 0 AND "__dpg_rows" = 50 GROUP BY "__dpg_g0"')
    ids = [x.id for x in plan.primitives]
    assert ids[0] == "_p0" and not set(ids) & set(columns)  # ids avoid the data columns p0, p1
    # units 1, 3, 5 → "x"; 2, 4 → "y". Counts clip 3 rows to m = 2 per unit.
    assert cols["__dpg_g0"] == ["x", "y"]
    assert out["count"] == [[6, 4]]
    # SUM(__dpg_v0): each unit has 3 rows of 4.0; m = 2 rows' worth = 2 × 4.0 = 8 per unit
    # (resolution 1e-5 → 800,000 units), within m × upper = 2 × 10 = 20.
    res = pol.table("t").column("__dpg_v0").resolution
    assert out["sum___dpg_v0"] == [[round(24 / res), round(16 / res)]]
    assert out["count_distinct___dpg_u"] == [[3, 2]]
    # SUM(__dpg_p0) and SUM(p0): each row 50, 3 rows per unit → m = 2 rows' worth = 100.
    assert out["sum___dpg_p0"] == [[300, 200]] and out["sum_p0"] == [[300, 200]]


def test_sum_of_doubles_is_exact_and_order_independent(con, policy):
    # x = 1e16, 1, -1e16 with bounds ±1e16 and resolution 1: fixed-point 10**16, 1, -10**16.
    # Floating-point summation gives 0 or 1 depending on the order; the exact sum is 1.
    for perm in itertools.permutations([1e16, 1.0, -1e16]):
        rows = [{"uid": 1, "x": perm[0]}, {"uid": 2, "x": perm[1]}, {"uid": 3, "x": perm[2]}]
        load(con, policy, "fx", rows)
        cols, _ = run(con, policy, "SELECT SUM(x) FROM fx")
        assert cols == {"p0": [1]}
        # one unit holding all three rows: the partial is exactly 1 as well
        load(con, policy, "fx", [{"uid": 7, "x": v} for v in perm])
        cols, _ = run(con, policy, "SELECT SUM(x), AVG(x) FROM fx")
        assert cols == {"p0": [1], "p1": [3]}  # AVG = (sum, count_column)


def test_nan_inf_null_and_huge_values(con, policy):
    # latency bounds [-10, 100], resolution 0.5 → fixed-point [-20, 200]; m = 5, k = 2.
    vals = [math.nan, math.inf, -math.inf, None, 1e300, -1e300, 3.26, -0.25]
    rows = [{"user_id": i, "region": "eu", "latency": v} for i, v in enumerate(vals)]
    load(con, policy, "prompts", rows)
    out, cols, _ = values(
        con, policy,
        "SELECT COUNT(*), COUNT(latency), SUM(latency), VAR_POP(latency) FROM prompts")
    # NaN, ±inf, NULL → NULL: not counted, not summed. 1e300 → 200, -1e300 → -20,
    # 3.26/0.5 = 6.52 → 7, -0.25/0.5 = -0.5 → -1 (DuckDB rounds half away from zero).
    assert out["count"] == [[8]]
    assert out["count_latency"] == [[4]]
    assert out["sum_latency"] == [[200 - 20 + 7 - 1]]
    assert out["var_pop_latency"] == [[200**2 + 20**2 + 7**2 + 1], [200 - 20 + 7 - 1], [4]]


def test_partial_sums_are_clipped_to_m_times_the_bounds(con, policy):
    # tokens in [0, 8000], resolution 1, m = 5: a unit with 9 rows of 8000 adds
    # min(9 × 8000, 5 × 8000) = 40000; COUNT(*) adds 5; COUNT(tokens) adds 5.
    load(con, policy, "prompts", [{"user_id": 1, "region": "eu", "tokens": 8000.0}] * 9)
    out, _, _ = values(con, policy, "SELECT COUNT(*), SUM(tokens), AVG(tokens) FROM prompts")
    assert out == {"count": [[5]], "sum_tokens": [[40000]], "avg_tokens": [[40000], [5]]}
    # latency in [-10, 100] / 0.5 = [-20, 200]: 9 rows at -10 → partial -180 clipped to
    # 5 × min(-20, 0) = -100.
    load(con, policy, "prompts", [{"user_id": 1, "region": "eu", "latency": -10.0}] * 9)
    out, _, _ = values(con, policy, "SELECT SUM(latency), STDDEV(latency) FROM prompts")
    # squares: 9 rows of 400 → m rows' worth 5 × 400 = 2000 (= 3600 · 5 // 9), within the
    # clip 5 × max(20², 200²) = 200000
    assert out == {"sum_latency": [[-100]], "stddev_pop_latency": [[2000], [-100], [5]]}


def test_each_unit_keeps_at_most_k_groups_chosen_by_the_salt(con, policy):
    # k = 2 for prompts: a unit with rows in all 5 regions contributes to exactly 2.
    rows = [{"user_id": u, "region": r} for u in range(1, 41)
            for r in ["eu", "us", "apac", "latam", "africa"]]
    load(con, policy, "prompts", rows)
    seen = set()
    for salt in (1, 2, 3, 99, 2**62):
        cols, _ = run(con, policy, "SELECT region, COUNT(DISTINCT user_id), COUNT(*) FROM prompts "
                      "GROUP BY region", salt=salt)
        assert sum(cols["p0"]) == 80 and sum(cols["p1"]) == 80  # 40 units × k
        again, _ = run(con, policy, "SELECT region, COUNT(DISTINCT user_id), COUNT(*) FROM "
                       "prompts GROUP BY region", salt=salt)
        assert again == cols  # deterministic given the salt
        seen.add(tuple(cols["p0"]))
    assert len(seen) > 1  # the choice depends on the salt
    # ungrouped: one group, so no unit loses rows to the k limit
    cols, _ = run(con, policy, "SELECT COUNT(DISTINCT user_id) FROM prompts")
    assert cols == {"p0": [40]}


def test_record_level_table_counts_every_row(con, policy):
    rows = [{"age": a, "sex": s, "income": i, "married": m}
            for a, s, i, m in [(30, "0", 1234, 1), (40, "1", 600000, 0), (50, "1", None, 1),
                               (200, "1", -5, 1), (20, "2", 1000, 1)]]
    load(con, policy, "pums", rows)
    out, cols, _ = values(con, policy, "SELECT sex, COUNT(*), SUM(income), AVG(age) FROM pums "
                          "GROUP BY sex")
    assert cols["sex"] == ["0", "1"]
    assert out["count"] == [[1, 3]]
    # income: resolution 100, bounds [0, 500000] → [0, 5000]: 1234 → 12; 600000 → 5000;
    # NULL skipped; -5 → 0 (round(-0.05) = 0, clamp 0).
    assert out["sum_income"] == [[12, 5000]]
    assert out["avg_age"] == [[30, 40 + 50 + 100], [1, 3]]


def test_where_arithmetic_overflow_is_null_not_an_error(con, policy):
    big = 2**63 - 1
    rows = [{"user_id": 1, "region": "eu", "age": big, "model": "gpt-4"},
            {"user_id": 2, "region": "eu", "age": -big - 1, "model": "GPT-3"},
            {"user_id": 3, "region": "eu", "age": 5, "model": None}]
    load(con, policy, "prompts", rows)
    with pytest.raises(duckdb.Error):  # what the TRY guards prevent (an error after the charge)
        con.execute('SELECT COUNT(*) FROM "planner"."prompts" WHERE abs(age) < 0').fetchall()
    # big·2, abs(-2**63), -(-2**63) overflow → NULL → the row does not match
    cols, _ = run(con, policy, "SELECT COUNT(*) FROM prompts WHERE age * 2 > 20 OR abs(age) < 0 "
                  "OR -age > 1e18")
    assert cols == {"p0": [0]}
    # integer arithmetic stays exact (no detour through DOUBLE): big - 1 < big
    cols, _ = run(con, policy, "SELECT COUNT(*) FROM prompts WHERE age - 1 < age")
    assert cols == {"p0": [2]}  # big and 5; (-2**63) - 1 overflows → NULL
    cols, _ = run(con, policy, "SELECT COUNT(*) FROM prompts WHERE lower(model) LIKE 'gpt%'")
    assert cols == {"p0": [2]}
    cols, _ = run(con, policy, "SELECT COUNT(*) FROM prompts WHERE model IS NULL")
    assert cols == {"p0": [1]}


def test_salt_is_validated_and_hidden_in_the_template(policy):
    plan = parse_query("SELECT region, COUNT(*) FROM prompts GROUP BY region", policy)
    for bad in (-1, 2**63, 1.5, True, "1"):
        with pytest.raises(ValueError):
            bounded_sql(plan, policy, salt=bad)  # type: ignore[arg-type]
    secret = 8_765_432_123_456_789
    sql = bounded_sql(plan, policy, salt=secret)
    template = bounded_sql_template(plan, policy)
    assert str(secret) in sql and str(secret) not in template
    assert SALT_PLACEHOLDER in template
    assert template.replace(SALT_PLACEHOLDER, str(secret)) == sql


def test_no_selection_when_k_covers_every_group(policy):
    # ungrouped or k ≥ number of key combinations: no window over the partials
    for sql in ("SELECT COUNT(*) FROM prompts", "SELECT flagged, COUNT(*) FROM prompts GROUP BY 1"):
        assert "QUALIFY" not in bounded_sql_template(parse_query(sql, policy), policy)
    sql = "SELECT region, COUNT(*) FROM prompts GROUP BY region"
    assert "QUALIFY" in bounded_sql_template(parse_query(sql, policy), policy)


def test_analyst_text_never_reaches_duckdb(policy):
    plan = parse_query("select count(*) AS secret_alias /* hello */ from Prompts p "
                       "where p.MODEL = 'x'", policy)
    sql = bounded_sql_template(plan, policy)
    for fragment in ("secret_alias", "hello", "Prompts", "MODEL", " p."):
        assert fragment not in sql
    assert '"__dpg_src"."model" = \'x\'' in sql


def test_text_keys_are_quoted(con):
    raw = {
        "dataset": {"name": "d", "population": "p"},
        "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
        "tables": {"t": {"source": "t.csv", "privacy_unit": "u", "columns": {
            "k": {"type": "text", "public_keys": ["it's", 'say "hi"', "a\\b", ""]},
            "f": {"type": "float", "public_keys": [0.1, 0.30000000000000004, -2.5]}}}},
    }
    pol = parse_policy(raw, Path("x/policies/d.toml"))
    load(con, pol, "t", [{"u": 1, "k": "it's", "f": 0.1 + 0.2}, {"u": 2, "k": "a\\b", "f": -2.5}])
    cols, _ = run(con, pol, "SELECT k, COUNT(*) FROM t GROUP BY k")
    assert cols == {"k": ["it's", 'say "hi"', "a\\b", ""], "p0": [1, 0, 1, 0]}
    cols, _ = run(con, pol, "SELECT f, COUNT(*) FROM t GROUP BY f")
    assert cols == {"f": [0.1, 0.30000000000000004, -2.5], "p0": [0, 1, 1]}


def test_text_units(con, policy):
    # The unit column keeps its native type (here VARCHAR); the salted hash accepts any type.
    rows = [{"user_id": u, "kind": k} for u, k in
            [("alice", "a"), ("alice", "b"), ("bob", "b"), ("bob", "b"), ("bob", "b"), ("bob", "b")]]
    load(con, policy, "ev", rows, unit_type="VARCHAR")
    cols, _ = run(con, policy, "SELECT kind, COUNT(*), COUNT(DISTINCT user_id) FROM ev GROUP BY kind")
    # k = 1: alice keeps one of her two groups; bob (4 rows in "b") is clipped to m = 3.
    assert sum(cols["p1"]) == 2 and cols["p0"][1] >= 3 and sum(cols["p0"]) == 4


SHARED = smartnoise_dir()


@pytest.mark.shared_data
def test_real_data_pums_dup(con):
    """PUMS_dup.csv: 1,948 rows of 1,000 pids (up to 4 rows each). With m = 2 and k = 1,
    COUNT(*) = Σ min(rows of pid, 2), COUNT(DISTINCT pid) = number of pids (hand reference
    computed with a plain GROUP BY)."""
    path = SHARED / "PUMS_dup.csv"
    if not path.exists():
        pytest.skip("../shared/data not present")
    raw = {
        "dataset": {"name": "pums", "population": "people"},
        "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
        "tables": {"dup": {"source": str(path), "privacy_unit": "pid", "max_groups_per_unit": 1,
                           "max_rows_per_unit": 2, "columns": {
                               "sex": {"type": "int", "public_keys": [0, 1]},
                               "age": {"type": "int", "lower": 0, "upper": 100},
                               "income": {"type": "int", "lower": 0, "upper": 500000,
                                          "resolution": 10}}}},
    }
    pol = parse_policy(raw, Path("x/policies/pums.toml"))
    con.execute("CREATE SCHEMA pums")
    con.execute(f"CREATE TABLE pums.dup AS SELECT pid, TRY_CAST(sex AS BIGINT) AS sex, "
                f"TRY_CAST(age AS BIGINT) AS age, TRY_CAST(income AS BIGINT) AS income "
                f"FROM read_csv('{path}')")
    expected_count, units = con.execute(
        "SELECT SUM(LEAST(n, 2)), COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM pums.dup "
        "GROUP BY pid)").fetchone()
    cols, _ = run(con, pol, "SELECT COUNT(*), COUNT(DISTINCT pid), SUM(age) FROM dup")
    assert cols["p0"] == [expected_count] and cols["p1"] == [units] == [1000]
    # age in [0, 100]: each pid adds m rows' worth, i.e. its clamped sum s if it has
    # c ≤ 2 ages, else trunc(2·s / c); then clipped to [0, 200]
    expected_age = con.execute(
        "SELECT SUM(LEAST(CASE WHEN c > 2 THEN (s * 2) // c ELSE s END, 200)) FROM "
        "(SELECT pid, SUM(LEAST(GREATEST(age, 0), 100)) AS s, COUNT(age) AS c "
        "FROM pums.dup GROUP BY pid)").fetchone()[0]
    assert cols["p2"] == [expected_age]
    by_sex, _ = run(con, pol, "SELECT sex, COUNT(DISTINCT pid) FROM dup GROUP BY sex")
    assert sum(by_sex["p0"]) == 1000  # k = 1: every pid counted in exactly one group


def test_avg_weighs_a_heavy_unit_by_m_rows_not_by_all_its_rows(con, policy):
    # m = 5: unit 1 has 10 rows of 100 tokens, unit 2 one row of 10 tokens. Unit 1 adds
    # m rows' worth = 5 × 100 = 500 and count 5; unit 2 adds 10 and 1 → AVG = 510 / 6 = 85.
    # Clipping the sum at m × U = 40000 alone would keep 1000 + 10 over a count of 6, i.e. an
    # "average" of 168.3 above every value in the data.
    rows = [{"user_id": 1, "region": "eu", "tokens": 100.0}] * 10 + [
        {"user_id": 2, "region": "eu", "tokens": 10.0}]
    load(con, policy, "prompts", rows)
    out, _, _ = values(con, policy, "SELECT AVG(tokens) FROM prompts")
    assert out == {"avg_tokens": [[510], [6]]}
