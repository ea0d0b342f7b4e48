"""Per-unit subqueries (two-level aggregation, issue 11 item 3; dpgate.sql.per_unit).

The inner query keeps at most k·m rows per unit before its aggregates, so (hand derivation,
c = k·m, amount ∈ [0, 10]): COUNT(*) ∈ [1, c], COUNT(DISTINCT kind) ∈ [0, c],
SUM(amount) ∈ [0, 10·c], AVG(amount) ∈ [0, 10]. Each unit is one outer row (k = m = 1), so an
outer COUNT has L1 sensitivity 1 and an outer SUM of a value in [a, b] has max(|a|, |b|)
(Wilson et al. 2020, PoPETs 2020(2), §3–4). The neighbouring-data test checks the exact
bounded outer vector against those numbers.
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.errors import DpgateError, UnsupportedQuery
from dpgate.policy import load_policies
from dpgate.sensitivity import sensitivities
from dpgate.service import Gateway
from dpgate.settings import Settings
from dpgate.sql.bound import bounded_sql
from dpgate.sql.sources import plan_policy
from dpgate.sql.parse import parse_query

POLICY = """
[dataset]
name = "visits"
population = "members"
data_version = "v1"

[budget]
epsilon = 4.0
delta = 1e-5
default_query_rho = 0.1

[tables.visits]
source = "{source}"
privacy_unit = "member"
max_groups_per_unit = {k}
max_rows_per_unit = {m}

[tables.visits.columns]
kind = {{ type = "text" }}
amount = {{ type = "int", lower = 0, upper = 10 }}
raw = {{ type = "int" }}
"""

INNER = ("(SELECT member, COUNT(*) AS n, SUM(amount) AS s, COUNT(DISTINCT kind) AS nd, "
         "AVG(amount) AS a, SUM(raw) AS r FROM visits WHERE amount >= 0 GROUP BY member) AS u")


def _write(folder, rows, k, m):
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "visits.csv"
    with src.open("w") as f:
        f.write("member,kind,amount,raw\n")
        for r in rows:
            f.write(",".join("" if v is None else str(v) for v in r) + "\n")
    (folder / "policies").mkdir(exist_ok=True)
    (folder / "policies" / "visits.toml").write_text(POLICY.format(source=src, k=k, m=m))
    return folder / "policies"


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    out = {}
    for k, m in ((1, 1), (1, 2), (2, 3)):
        out[(k, m)] = load_policies(_write(tmp_path_factory.mktemp(f"k{k}m{m}"), [], k, m))["visits"]
    return out


def _run(policy, sql, rows, salt=7) -> list[tuple]:
    plan = parse_query(sql, policy)
    con = duckdb.connect()
    try:
        con.execute('CREATE SCHEMA "visits"')
        con.execute('CREATE TABLE "visits"."visits" (member VARCHAR, kind VARCHAR, amount BIGINT, raw BIGINT)')
        if rows:
            con.executemany('INSERT INTO "visits"."visits" VALUES (?, ?, ?, ?)', rows)
        return con.execute(bounded_sql(plan, policy, salt=salt)).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("k, m", [(1, 1), (1, 2), (2, 3)])
def test_derived_ranges_and_outer_sensitivities(policies, k, m):
    p = policies[(k, m)]
    c = k * m
    plan = parse_query(f"SELECT COUNT(*) AS users, SUM(s) AS total, SUM(LEAST(n, 5)) AS capped FROM {INNER}", p)
    table = plan_policy(plan, p).table(plan.table)
    cols = {name: (col.type, col.lower, col.upper) for name, col in table.columns.items()}
    assert cols["n"] == ("int", 1, c)
    assert cols["nd"] == ("int", 0, c)
    assert cols["s"] == ("int", 0, 10 * c)
    assert cols["a"] == ("float", 0, 10)
    assert cols["r"][1:] == (None, None)  # raw has no declared bounds: neither has its sum
    assert (table.max_groups_per_unit, table.max_rows_per_unit) == (1, 1)
    sens = sensitivities(plan, plan_policy(plan, p))
    by_out = {o.label: [sens[i].l1 for i in o.primitives] for o in plan.outputs if hasattr(o, "primitives")}
    assert by_out["users"] == [1]
    assert by_out["total"] == [10 * c]
    # LEAST skips NULL arguments and the planner does not assume n non-NULL: LEAST(n, 5) ∈ [1, 5]
    assert by_out["capped"] == [5]


def test_inner_bounding_keeps_k_times_m_rows_per_unit(policies):
    rows = [("solo", f"g{j}", 10, 1) for j in range(10)] + [("other", "g0", 3, 1)]
    # k·m = 2: solo keeps 2 rows (n = 2, s = 20), other keeps its one row
    got = _run(policies[(1, 2)], f"SELECT SUM(n) AS n, SUM(s) AS s, SUM(nd) AS nd FROM {INNER}", rows)
    assert [tuple(int(v) for v in got[0])] == [(3, 23, 3)]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", "c", None]),
                               st.integers(-3, 15)), min_size=1, max_size=40),
       km=st.sampled_from([(1, 1), (1, 2), (2, 3)]), victim=st.integers(0, 5))
def test_neighbouring_data_moves_outer_aggregates_by_at_most_the_derived_sensitivity(policies, rows, km, victim):
    k, m = km
    c = k * m
    full = [(f"u{u}", g, a, 1) for u, g, a in rows]
    without = [r for r in full if r[0] != f"u{victim}"]
    p = policies[km]
    ungrouped = f"SELECT COUNT(*) AS big, SUM(s) AS s, SUM(LEAST(n, 3)) AS n3 FROM {INNER} WHERE n > 1"
    a, b = _run(p, ungrouped, full)[0], _run(p, ungrouped, without)[0]
    assert 0 <= int(a[0]) - int(b[0]) <= 1
    assert 0 <= int(a[1]) - int(b[1]) <= 10 * c  # s ∈ [0, 10·c]
    assert 0 <= int(a[2]) - int(b[2]) <= min(3, c)
    grouped = f"SELECT LEAST(n, 3) AS visits, COUNT(*) AS users FROM {INNER} GROUP BY visits"
    ga, gb = _run(p, grouped, full), _run(p, grouped, without)
    assert [r[0] for r in ga] == [r[0] for r in gb]
    assert sum(abs(int(x[1]) - int(y[1])) for x, y in zip(ga, gb)) <= 1  # one unit, one outer row


def test_pitfall_division_by_an_inner_count_distinct_is_refused_at_planning(policies):
    with pytest.raises(UnsupportedQuery):
        parse_query(f"SELECT SUM(6.0 / nd) AS x FROM {INNER}", policies[(1, 1)])


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM (SELECT kind, COUNT(*) AS n FROM visits GROUP BY kind) AS u",
    "SELECT COUNT(*) FROM (SELECT member, kind, COUNT(*) AS n FROM visits GROUP BY member, kind) AS u",
    f"SELECT COUNT(*) FROM {INNER} WHERE member = 'u1'",
    f"SELECT member, COUNT(*) FROM {INNER} GROUP BY member",
    f"SELECT SUM(r) FROM {INNER}",
    f"SELECT SUM(6.0 / nd) AS x FROM {INNER}",
    "SELECT SUM(amount) FROM (SELECT member, amount FROM visits GROUP BY member) AS u",
    "SELECT COUNT(*) FROM (SELECT member, COUNT(*) FROM visits GROUP BY member) AS u",
])
def test_refusals_charge_nothing(tmp_path, sql):
    gw = Gateway.open(Settings(policies=_write(tmp_path, [("u1", "a", 1, 1)], 1, 2), home=tmp_path / "home"))
    try:
        with pytest.raises(DpgateError) as e:
            gw.query("visits", sql, consumer="default")
        assert e.value.code in ("unsupported_query", "unknown_column")
        assert e.value.details.get("charged") is False
        assert gw.ledger.spend("members").charges == 0
    finally:
        gw.close()


def test_explain_shows_the_outer_rows_derived_ranges_and_query_answers(tmp_path):
    rows = [(f"u{i}", "a" if i % 2 else "b", i % 11, 1) for i in range(60) for _ in range(i % 4 + 1)]
    gw = Gateway.open(Settings(policies=_write(tmp_path, rows, 1, 2), home=tmp_path / "home"))
    try:
        sql = f"SELECT AVG(LEAST(n, 50)) AS a, COUNT(*) AS users FROM {INNER} WHERE n > 1"
        ex = gw.explain("visits", sql)
        pu = ex["per_unit"]
        assert pu["privacy_unit"] == "member" and pu["table"] == "visits"
        assert pu["columns"]["n"].endswith("[1, 2]")
        assert pu["columns"]["s"].endswith("[0, 20]")
        assert pu["columns"]["nd"].endswith("[0, 2]")
        assert "k·m = 2" in pu["bounding"]
        release = gw.query("visits", sql, consumer="default")
        assert gw.ledger.spend("members").charges == 1
        assert len(release["rows"]) == 1
    finally:
        gw.close()


def test_sum_of_a_float_column_keeps_bounds_on_its_resolution_grid(tmp_path):
    """SUM(x) with x ∈ [-0.3, 0.7] (step 0.1), k·m = 6: [-1.8, 4.2] exactly, i.e. steps [-18, 42]
    (a float product 6 · -0.3 = -1.7999999999999998 would not be a multiple of 0.1)."""
    folder = _write(tmp_path, [], 2, 3)
    text = (folder / "visits.toml").read_text() + 'x = { type = "float", lower = -0.3, upper = 0.7, resolution = 0.1 }\n'
    (folder / "visits.toml").write_text(text)
    p = load_policies(folder)["visits"]
    plan = parse_query("SELECT SUM(t) FROM (SELECT member, SUM(x) AS t FROM visits GROUP BY member) AS u", p)
    col = plan_policy(plan, p).table(plan.table).column("t")
    assert (col.lower, col.upper) == (-1.8, 4.2)
    assert col.fixed_point_bounds == (-18, 42)


def test_derived_ranges_are_checked_against_the_limits_before_the_charge(tmp_path):
    """Issue 19 item 4: a derived column must fit the limits of a declared one (dpgate.limits).

    wide ∈ [0, 2^61 / m] (policy load: m·max|bound| ≤ 2^62). k = m = 1: SUM(wide) ∈ [0, 2^61]
    fits; AVG(wide) keeps the column's step (resolution / 1000 would span 1000·2^61 > 2^62 steps).
    k = 4, m = 2: SUM(wide) ∈ [0, 8·2^60] = [0, 2^63], beyond 64 bits: refused, naming the inner
    aggregate and k·m, before any data is read.
    """
    from dpgate.representable import check_representable

    for (k, m), fits in (((1, 1), True), ((4, 2), False)):
        folder = _write(tmp_path / f"k{k}m{m}", [], k, m)
        text = (folder / "visits.toml").read_text()
        (folder / "visits.toml").write_text(text + f"wide = {{ type = \"int\", lower = 0, upper = {2**61 // m} }}\n")
        p = load_policies(folder)["visits"]
        sql = "SELECT COUNT(*) FROM (SELECT member, SUM(wide) AS s, AVG(wide) AS a FROM visits GROUP BY member) u WHERE a > 5"
        plan = parse_query(sql, p)
        full = plan_policy(plan, p)
        assert full.table(plan.table).column("a").fixed_point_bounds[1] <= 2**62
        if fits:
            check_representable(plan, full)
            continue
        with pytest.raises(UnsupportedQuery) as e:
            check_representable(plan, full)
        assert "per-unit column 's' = SUM(wide)" in e.value.message and "4 × 2 = 8" in e.value.message
        assert "64-bit" in e.value.message and e.value.details["inner_bound"] == 8 and e.value.details["charged"] is False
