"""Dates and timestamps (issue 10 item 5): ``date``/``timestamp`` policy columns with ISO
bounds, date literals and INTERVALs in WHERE, date parts as bounded integers, date keys
enumerated from the declared bounds, out-of-range and extreme values."""

from __future__ import annotations

import datetime as dt
import tomllib
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from sqlglot import parse_one

from dpgate.errors import PolicyError, UnsupportedQuery
from dpgate.policy import parse_policy as _parse_policy, quote_identifier as q
from dpgate.sensitivity import sensitivities
from dpgate.sql.bind import TableScope, bind_row_expression
from dpgate.sql.temporal import temporal_ordinal
from dpgate.sql.bound import bounded_sql
from dpgate.sql.parse import parse_query

POLICY = """
[dataset]
name = "lib"
population = "lib-members"
data_version = "v1"

[budget]
epsilon = 100
delta = 1e-6
default_query_rho = 0.1

[allocations]
analysts = 1.0

[tables.checkouts]
source = "{source}"
privacy_unit = "member_id"
max_groups_per_unit = 2
max_rows_per_unit = 3

[tables.checkouts.columns]
member_id = {{ type = "int" }}
day       = {{ type = "date", lower = "2022-01-01", upper = "2024-12-31" }}
at        = {{ type = "timestamp", lower = "2024-01-01 00:00:00", upper = "2024-03-31 23:59:59" }}
books     = {{ type = "int", lower = 0, upper = 10 }}
"""


def parse_policy(text: str, source: str = "/nonexistent.csv"):
    return _parse_policy(tomllib.loads(text.format(source=source)), Path("lib.toml"))


@pytest.fixture(scope="module")
def policy():
    return parse_policy(POLICY)


# --- policy validation ----------------------------------------------------------------------


def test_policy_reads_iso_bounds():
    pol = parse_policy(POLICY)
    t = pol.table("checkouts")
    assert t.column("day").time_lower == dt.date(2022, 1, 1)
    assert t.column("day").time_upper == dt.date(2024, 12, 31)
    assert t.column("at").time_upper == dt.datetime(2024, 3, 31, 23, 59, 59)
    assert t.column("day").duckdb_type == "DATE" and t.column("at").duckdb_type == "TIMESTAMP"
    assert not t.column("day").bounded  # no SUM/AVG of a date
    assert t.column("day").to_dict()["lower"] == "2022-01-01"


@pytest.mark.parametrize("decl, text", [
    ('{ type = "date", lower = "2022-13-01", upper = "2024-12-31" }', "not an ISO date"),
    ('{ type = "date", lower = "2024-01-01", upper = "2022-12-31" }', "lower (2024-01-01) > upper"),
    ('{ type = "date", lower = "2022-01-01" }', "given together"),
    ('{ type = "date", lower = 2022, upper = 2024 }', "ISO date string"),
    ('{ type = "date", lower = "2022-01-01 10:00:00", upper = "2024-12-31" }', "not an ISO date"),
    ('{ type = "timestamp", lower = "2022-01-01T00:00:00+02:00", upper = "2024-12-31" }', "time zone"),
    ('{ type = "date", lower = "2022-01-01", upper = "2024-12-31", resolution = 1 }', "resolution is not allowed"),
    ('{ type = "date", public_keys = ["2022-01-01"] }', "public_keys are not supported"),
])
def test_bad_date_columns_are_refused(decl, text):
    bad = POLICY.replace('{{ type = "date", lower = "2022-01-01", upper = "2024-12-31" }}',
                         decl.replace("{", "{{").replace("}", "}}"))
    with pytest.raises(PolicyError) as e:
        parse_policy(bad)
    assert text in str(e.value)


def test_unbounded_date_column_loads():
    pol = parse_policy(POLICY.replace(
        '{{ type = "date", lower = "2022-01-01", upper = "2024-12-31" }}', '{{ type = "date" }}'))
    assert not pol.table("checkouts").column("day").time_bounded


# --- binder ranges --------------------------------------------------------------------------


def _bind(sql, policy):
    return bind_row_expression(parse_one(sql, read="duckdb"), TableScope(policy.table("checkouts")))


@pytest.mark.parametrize("sql, lo, hi", [
    ("EXTRACT(year FROM day)", 2022, 2024),
    ("YEAR(day)", 2022, 2024),
    ("date_part('year', at)", 2024, 2024),
    ("EXTRACT(quarter FROM day)", 1, 4),
    ("MONTH(day)", 1, 12),
    ("EXTRACT(dow FROM day)", 0, 6),
    ("EXTRACT(hour FROM at)", 0, 23),
    ("EXTRACT(hour FROM day)", 0, 0),
    ("EXTRACT(year FROM day) - 2000 + books", 22, 34),
])
def test_date_parts_are_bounded_integers(policy, sql, lo, hi):
    e = _bind(sql, policy)
    assert e.type == "int"
    assert (e.range.lo, e.range.hi) == (lo, hi)


def test_date_column_range_is_its_ordinal_bounds(policy):
    e = _bind("day", policy)
    assert e.type == "date"
    # 2022-01-01 is 18993 days after 1970-01-01 (date.toordinal difference)
    assert e.range.lo == Fraction(dt.date(2022, 1, 1).toordinal() - dt.date(1970, 1, 1).toordinal()) == 18993
    assert temporal_ordinal(dt.datetime(1970, 1, 2)) == 86_400 * 10**6


def test_date_part_of_unbounded_date_is_unbounded():
    pol = parse_policy(POLICY.replace(
        '{{ type = "date", lower = "2022-01-01", upper = "2024-12-31" }}', '{{ type = "date" }}'))
    assert _bind("EXTRACT(year FROM day)", pol).range is None
    with pytest.raises(UnsupportedQuery, match="unbounded"):
        parse_query("SELECT AVG(EXTRACT(year FROM day)) FROM checkouts", pol)


@pytest.mark.parametrize("where", [
    "day >= DATE '2024-01-01'",
    "day >= '2024-01-01'",
    "day BETWEEN DATE '2023-01-01' AND DATE '2023-12-31'",
    "day BETWEEN '2023-01-01' AND '2023-12-31'",
    "day IN ('2023-01-01', DATE '2023-01-02')",
    "at < TIMESTAMP '2024-02-01 12:00:00'",
    "day + INTERVAL 30 DAY < DATE '2024-06-01'",
    "day >= DATE '2024-06-01' - INTERVAL '1' MONTH",
    "EXTRACT(month FROM day) = 12",
])
def test_date_predicates_are_answered(policy, where):
    assert parse_query(f"SELECT COUNT(*) FROM checkouts WHERE {where}", policy).where


@pytest.mark.parametrize("where, text", [
    ("day >= CURRENT_DATE - INTERVAL 30 DAY", "not deterministic"),
    ("at < now()", "not deterministic"),
    ("at < CURRENT_TIMESTAMP", "not deterministic"),
    ("day >= '2024-13-01'", "not a valid date"),
    ("day >= DATE 'yesterday'", "not a valid date"),
    ("day + INTERVAL (books) DAY > DATE '2024-01-01'", "INTERVAL must be a constant"),
    ("day > 5", "incompatible types"),
])
def test_date_predicates_refused(policy, where, text):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(f"SELECT COUNT(*) FROM checkouts WHERE {where}", policy)
    assert text in str(e.value)


def test_sum_of_a_date_is_refused(policy):
    with pytest.raises(UnsupportedQuery):
        parse_query("SELECT SUM(day) FROM checkouts", policy)


# --- computed date keys ---------------------------------------------------------------------


@pytest.mark.parametrize("key, size, first, last", [
    ("date_trunc('year', day)", 3, "2022-01-01", "2024-01-01"),
    ("date_trunc('quarter', day)", 12, "2022-01-01", "2024-10-01"),
    ("date_trunc('month', day)", 36, "2022-01-01", "2024-12-01"),
    ("date_trunc('day', day)", 1096, "2022-01-01", "2024-12-31"),
    ("EXTRACT(year FROM day)", 3, 2022, 2024),
    ("EXTRACT(dow FROM day)", 7, 0, 6),
    ("date_part('quarter', day)", 4, 1, 4),
    ("date_trunc('month', at)", 3, "2024-01-01", "2024-03-01"),
    ("EXTRACT(hour FROM at)", 24, 0, 23),
    ("date_trunc('hour', at)", 91 * 24, "2024-01-01 00:00:00", "2024-03-31 23:00:00"),
])
def test_date_key_domains_follow_from_the_bounds(policy, key, size, first, last):
    plan = parse_query(f"SELECT {key} AS k, COUNT(*) FROM checkouts GROUP BY k", policy)
    (k,) = plan.computed_keys
    assert len(k.domain) == size
    assert (k.domain[0], k.domain[-1]) == (first, last)


def test_week_key_domain(policy):
    plan = parse_query("SELECT date_trunc('week', day) AS k, COUNT(*) FROM checkouts GROUP BY k", policy)
    (k,) = plan.computed_keys
    # ISO weeks start on Monday: 2021-12-27 holds 2022-01-01; 2024-12-30 holds 2024-12-31
    assert k.domain[0] == "2021-12-27" and k.domain[-1] == "2024-12-30"
    assert len(k.domain) == (dt.date(2024, 12, 30) - dt.date(2021, 12, 27)).days // 7 + 1


def test_minute_of_a_timestamp_is_not_a_key(policy):
    with pytest.raises(UnsupportedQuery, match="timestamp column may appear in a group key only"):
        parse_query("SELECT EXTRACT(minute FROM at) AS k, COUNT(*) FROM checkouts GROUP BY k", policy)


def test_date_key_spellings_share_a_plan(policy):
    a = parse_query("SELECT date_part('year', day) AS y, COUNT(*) FROM checkouts GROUP BY y", policy)
    b = parse_query("select extract(YEAR from day), count(*) from checkouts group by 1", policy)
    assert a.plan_hash == b.plan_hash


def _load(con, policy, rows):
    t = policy.table("checkouts")
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {q(policy.name)}")
    con.execute(f"CREATE OR REPLACE TABLE {t.relation} (member_id BIGINT, \"day\" DATE, \"at\" TIMESTAMP, "
                "books BIGINT)")
    for r in rows:
        con.execute(f"INSERT INTO {t.relation} VALUES (?, TRY_CAST(? AS DATE), TRY_CAST(? AS TIMESTAMP), ?)",
                    [r["member_id"], r.get("day"), r.get("at"), r.get("books")])


def _run(con, plan, policy, salt=7):
    res = con.execute(bounded_sql(plan, policy, salt=salt))
    names = [d[0] for d in res.description]
    return [dict(zip(names, r)) for r in res.fetchall()]


def test_out_of_range_dates_are_dropped_from_date_keys_and_clamped_in_values(policy):
    con = duckdb.connect()
    _load(con, policy, [
        {"member_id": 1, "day": "2023-05-05", "books": 1},
        {"member_id": 2, "day": "2030-01-01", "books": 1},     # after upper: dropped from keys
        {"member_id": 3, "day": "290000-01-01", "books": 1},   # a DuckDB DATE, far outside
        {"member_id": 4, "day": "not a date", "books": 1},     # NULL at load (TRY_CAST)
    ])
    plan = parse_query("SELECT EXTRACT(year FROM day) AS y, COUNT(*) FROM checkouts GROUP BY y", policy)
    rows = _run(con, plan, policy)
    assert [(r["g0"], r["p0"]) for r in rows] == [(2022, 0), (2023, 1), (2024, 0)]
    # in a value, a date is clamped to [lower, upper] first: 2030 and 290000 count as 2024
    plan = parse_query("SELECT SUM(EXTRACT(year FROM day) - 2000) FROM checkouts", policy)
    (row,) = _run(con, plan, policy)
    assert row["p0"] == 23 + 24 + 24
    con.close()


_DAYS = st.dates(dt.date(2021, 6, 1), dt.date(2025, 6, 30))


@st.composite
def _datasets(draw):
    units = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5, unique=True))
    rows = [{"member_id": u, "day": str(draw(st.none() | _DAYS)),
             "at": str(draw(st.datetimes(dt.datetime(2023, 12, 30), dt.datetime(2024, 4, 2)))),
             "books": draw(st.integers(-2, 12))}
            for u in units for _ in range(draw(st.integers(1, 6)))]
    for r in rows:
        if r["day"] == "None":
            r["day"] = None
    return rows, draw(st.sampled_from(units))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=_datasets(), key=st.sampled_from([
    "date_trunc('quarter', day)", "EXTRACT(month FROM day)", "EXTRACT(year FROM day)",
    "date_trunc('month', at)", "EXTRACT(dow FROM at)"]))
def test_neighbouring_data_date_keys(policy, data, key):
    """Removing one unit moves each primitive's exact bounded vector over a date key by at
    most its derived Δ1, Δ2, Δ∞ (k = 2, m = 3)."""
    rows, victim = data
    plan = parse_query(f"SELECT {key} AS k, COUNT(*), SUM(books), AVG(EXTRACT(day FROM day)) "
                       "FROM checkouts GROUP BY k", policy)
    con = duckdb.connect()
    _load(con, policy, rows)
    full = _run(con, plan, policy)
    _load(con, policy, [r for r in rows if r["member_id"] != victim])
    less = _run(con, plan, policy)
    con.close()
    assert len(full) == len(less) == len(plan.computed_keys[0].domain)
    sens = sensitivities(plan, policy)
    for p in plan.primitives:
        diffs = [abs((a[p.id] or 0) - (b[p.id] or 0)) for a, b in zip(full, less)]
        s = sens[p.id]
        assert max(diffs) <= s.linf
        assert sum(diffs) <= s.l1
        assert sum(d * d for d in diffs) ** 0.5 <= s.l2 + 1e-9


# --- through the gateway: extreme values never fail a release ------------------------------


def test_extreme_dates_release_through_the_gateway(tmp_path):
    from dpgate.service import Gateway
    from dpgate.settings import Settings

    csv = tmp_path / "checkouts.csv"
    lines = ["member_id,day,at,books"]
    extremes = ["2023-03-03", "9999-12-31", "290000-01-01", "0001-01-01", "garbage", "", "2023-02-30",
                "-5000-01-01"]
    stamps = ["2024-02-02 10:00:00", "9999-12-31 23:59:59", "290000-01-01 00:00:00", "x",
              "2024-01-01T25:00:00", "", "1677-09-21 00:12:43", "2024-03-31 23:59:59.999999"]
    for i in range(40):
        lines.append(f"{i},{extremes[i % len(extremes)]},{stamps[i % len(stamps)]},{i % 12}")
    csv.write_text("\n".join(lines) + "\n")
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "lib.toml").write_text(POLICY.format(source=csv))
    settings_ = Settings(policies=policies, home=tmp_path / "home")
    with Gateway.open(settings_) as gw:
        for sql in [
            "SELECT date_trunc('year', day) AS y, COUNT(*) FROM checkouts GROUP BY y",
            "SELECT EXTRACT(year FROM day) AS y, AVG(books) FROM checkouts GROUP BY y",
            "SELECT date_trunc('hour', at) AS h, COUNT(*) FROM checkouts GROUP BY h",
            "SELECT SUM(EXTRACT(year FROM at) - 2000), AVG(EXTRACT(month FROM day)) FROM checkouts",
            "SELECT COUNT(*) FROM checkouts WHERE day > DATE '2023-01-01' + INTERVAL 1 DAY",
            "SELECT COUNT(*) FROM checkouts WHERE at BETWEEN '2024-01-01' AND '2024-02-01'",
        ]:
            doc = gw.query("lib", sql, consumer="analysts")
            assert doc["rows"], sql
        doc = gw.query("lib", "SELECT date_trunc('year', day) AS y, COUNT(*) FROM checkouts GROUP BY y",
                       consumer="analysts")
        assert [r[0] for r in doc["rows"]] == ["2022-01-01", "2023-01-01", "2024-01-01"]


def test_dataset_description_with_date_bounds_validates(tmp_path):
    """A trial (2026-12-01) found GET /v1/datasets answering 500 for any policy with a date or timestamp
    column: the response model typed the bounds as numbers. They are ISO text there."""
    from dpgate.api.schemas import DatasetInfo
    from dpgate.service import Gateway
    from dpgate.settings import Settings

    csv = tmp_path / "checkouts.csv"
    csv.write_text("member_id,day,at,books\n1,2023-03-03,2024-02-02 10:00:00,3\n")
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "lib.toml").write_text(POLICY.format(source=csv))
    with Gateway.open(Settings(policies=policies, home=tmp_path / "home")) as gw:
        (info,) = [DatasetInfo.model_validate(d) for d in gw.datasets()]
    cols = info.tables["checkouts"].columns
    assert (cols["day"].lower, cols["day"].upper) == ("2022-01-01", "2024-12-31")
    assert cols["at"].upper == "2024-03-31 23:59:59" or cols["at"].upper == "2024-03-31T23:59:59"
    assert cols["books"].lower == 0 and cols["books"].upper == 10


@pytest.mark.parametrize("sql, text", [
    # a trial found the refusal calling 'epoch' "the date part 'given'"
    ("SELECT SUM(EXTRACT(epoch FROM at)) FROM checkouts", "the date part 'epoch' is not supported"),
    ("SELECT COUNT(*) FROM checkouts WHERE date_part('yearofweek', day) = 2023",
     "the date part 'yearofweek' is not supported"),
])
def test_unsupported_date_parts_are_named_as_written(policy, sql, text):
    with pytest.raises(UnsupportedQuery, match=text):
        parse_query(sql, policy)


def test_collate_is_refused_as_collate_not_as_a_function(policy):
    with pytest.raises(UnsupportedQuery, match="COLLATE is not supported") as info:
        parse_query("SELECT COUNT(*) FROM checkouts WHERE 'a' COLLATE NOCASE = 'b'", policy)
    assert "function" not in info.value.message
