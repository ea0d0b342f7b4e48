"""Neighbouring data through joins (issue 19, "close the classes"): for every join shape the
planner accepts, removing one unit's rows never moves an exact bounded aggregate by more than
the derived sensitivity; the shapes whose protected tables meet only through a public table
(or a LEFT JOIN that may leave the linking table out) are refused.

Hypothesis draws small datasets — two protected tables ``a`` and ``b`` sharing the unit ``uid``
(several rows per unit, in several groups) and a public table ``p`` (rows repeated: fan-out) —
and a query of each accepted shape: protected × protected on the unit (ON and USING), ×
public (inner and LEFT, the public table first or not), chains through a public table that
also carry a unit equality, self-joins, chains of three protected occurrences, a hub joined
INNER to two tables, several columns of the public table as keys (its tuples). The gateway's
own bounded SQL runs on DuckDB with the same salt with and without one unit's rows (every row
of ``a`` and ``b`` with its ``uid``); each primitive's change must stay within its L1, L2 and
L∞ sensitivity (:func:`dpgate.sensitivity.sensitivities`).

The refused shapes run through the same test: were one accepted, its bounded SQL would be
checked the same way. On the code before issue 19 the chain through a public table was accepted
and this test fails there (one unit's single row moved COUNT(*) by the number of other units'
rows of its genre).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

import duckdb
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.errors import UnsupportedQuery
from dpgate.policy import KeyTuples, load_policy
from dpgate.sensitivity import sensitivities
from dpgate.sql.bound import bounded_sql
from dpgate.sql.sources import plan_policy
from dpgate.sql.parse import parse_query

POLICY = """
[dataset]
name = "lib"
population = "people"

[budget]
epsilon = 1.0
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 1.0

[tables.a]
source = "a.csv"
privacy_unit = "uid"
max_groups_per_unit = 2
max_rows_per_unit = 3

[tables.a.columns]
uid = { type = "int" }
g = { type = "text", public_keys = ["x", "y", "z"] }
v = { type = "int", lower = 0, upper = 100 }
pk = { type = "int", public_keys = "range(0, 4)" }

[tables.b]
source = "b.csv"
privacy_unit = "uid"
max_groups_per_unit = 3
max_rows_per_unit = 2

[tables.b.columns]
uid = { type = "int" }
h = { type = "text", public_keys = ["p", "q"] }
w = { type = "int", lower = -50, upper = 50 }
pk = { type = "int", public_keys = "range(0, 4)" }

[tables.p]
source = "p.csv"
public = true

[tables.p.columns]
pk = { type = "int", public_keys = "range(0, 4)" }
cat = { type = "text", public_keys = ["c0", "c1", "c2"] }
grp = { type = "text", public_keys = ["u", "v"] }
"""

#: Accepted join shapes.
ACCEPTED = [
    "SELECT a.g, COUNT(*), SUM(b.w) FROM a JOIN b ON a.uid = b.uid GROUP BY a.g",
    "SELECT a.g, b.h, COUNT(*), SUM(a.v) FROM a JOIN b USING (uid) GROUP BY a.g, b.h",
    "SELECT p.cat, COUNT(*), SUM(a.v), COUNT(DISTINCT a.uid) FROM a JOIN p ON a.pk = p.pk GROUP BY p.cat",
    "SELECT p.cat, p.grp, COUNT(*), SUM(a.v) FROM a JOIN p ON a.pk = p.pk GROUP BY p.cat, p.grp",
    "SELECT p.grp, COUNT(*), SUM(b.w) FROM a JOIN p ON a.pk = p.pk JOIN b ON b.pk = p.pk AND b.uid = a.uid "
    "GROUP BY p.grp",
    "SELECT a1.g, COUNT(*), COUNT(DISTINCT a2.v) FROM a a1 JOIN a a2 ON a1.uid = a2.uid GROUP BY a1.g",
    "SELECT a.g, COUNT(*), COUNT(b.w), SUM(b.w) FROM a LEFT JOIN b ON b.uid = a.uid GROUP BY a.g",
    "SELECT p.cat, COUNT(a.v), SUM(a.v) FROM p LEFT JOIN a ON a.pk = p.pk GROUP BY p.cat",
    "SELECT b.h, COUNT(*), SUM(a2.v) FROM a a1 JOIN b ON b.uid = a1.uid JOIN a a2 ON a2.uid = b.uid GROUP BY b.h",
    # a hub: a1 and a2 meet through p, but b (INNER) is unit-equal to both on every joined row
    "SELECT COUNT(*), SUM(a2.v) FROM a a1 JOIN p ON a1.pk = p.pk JOIN a a2 ON a2.pk = p.pk "
    "JOIN b ON b.uid = a1.uid AND b.uid = a2.uid",
    "SELECT COUNT(*), COUNT(a2.v) FROM a a1 LEFT JOIN b ON b.uid = a1.uid LEFT JOIN a a2 ON a2.uid = b.uid",
    "SELECT p.cat, COUNT(*), SUM(b.w) FROM p JOIN a ON a.pk = p.pk LEFT JOIN b ON b.uid = a.uid GROUP BY p.cat",
    # comma joins listed out of order (p meets b only through the later a: reordered to b, a, p)
    "SELECT p.cat, COUNT(*), SUM(b.w) FROM b, p, a WHERE a.pk = p.pk AND a.uid = b.uid GROUP BY p.cat",
    "SELECT COUNT(*), SUM(a.v) FROM p, a a1, b, a WHERE a.pk = p.pk AND a.uid = b.uid AND a1.uid = b.uid",
    # the join equality in every branch of an OR (TPC-H Q19's form): factored out
    "SELECT COUNT(*), SUM(a.v) FROM a, b WHERE (a.uid = b.uid AND a.g = 'x') OR (b.uid = a.uid AND b.h = 'p')",
    "SELECT p.cat, COUNT(*), SUM(a.v) FROM a, p WHERE (a.pk = p.pk AND a.v > 10) OR (p.pk = a.pk AND p.grp = 'u') "
    "GROUP BY p.cat",
    # per-unit subqueries over a join (issue 21 item 4, TPC-H Q13's shape): one row per unit of the joined rows
    # (ungrouped: a key of a per-unit column is chosen by partition selection, whose released keys this test
    # does not compare; the whole q13 shape runs in tests/test_per_unit_joins.py and the corpus)
    "SELECT COUNT(*), SUM(n) FROM (SELECT a.uid, COUNT(b.w) AS n FROM a LEFT JOIN b ON b.uid = a.uid "
    "GROUP BY a.uid) AS t WHERE n < 3",
    "SELECT COUNT(*), SUM(s), SUM(n) FROM (SELECT a.uid, SUM(b.w) AS s, COUNT(*) AS n FROM a JOIN b ON a.uid = b.uid "
    "GROUP BY a.uid) AS t WHERE n > 1",
    "SELECT SUM(n), SUM(v) FROM (SELECT uid, COUNT(*) AS n, MAX(v) AS v FROM a, p WHERE a.pk = p.pk AND p.cat = 'c0' "
    "GROUP BY uid) AS t",
    # a LEFT JOIN whose ON also filters the LEFT-joined table's own rows (TPC-H Q13's o_comment NOT LIKE …)
    "SELECT COUNT(*), SUM(n) FROM (SELECT a.uid, COUNT(b.w) AS n FROM a LEFT JOIN b ON b.uid = a.uid AND b.w > 0 "
    "GROUP BY a.uid) AS t",
    "SELECT a.g, COUNT(*), COUNT(b.w), SUM(b.w) FROM a LEFT JOIN b ON b.uid = a.uid AND b.h = 'p' AND b.w < 30 "
    "GROUP BY a.g",
]

#: Shapes the unit graph refuses: protected occurrences that meet only through a public table,
#: or through a LEFT-joined hub (where it has no row, the two others are not compared).
REFUSED = [
    # the audit's query: other units' rows (a2, a3) credited to every a1 unit of the same pk
    "SELECT COUNT(*), COUNT(DISTINCT a1.uid) FROM a a1 JOIN p ON a1.pk = p.pk JOIN a a2 ON a2.pk = p.pk "
    "JOIN a a3 ON a3.uid = a2.uid WHERE a2.g = 'w'",
    "SELECT COUNT(*), COUNT(DISTINCT a1.uid) FROM a a1 JOIN p ON a1.pk = p.pk JOIN a a2 ON a2.pk = p.pk "
    "JOIN a a3 ON a3.uid = a2.uid",
    "SELECT COUNT(*), SUM(b.w) FROM a JOIN p ON a.pk = p.pk JOIN b ON b.pk = p.pk",
    "SELECT p.cat, COUNT(*) FROM p JOIN a a1 ON a1.pk = p.pk JOIN a a2 ON a2.pk = p.pk GROUP BY p.cat",
    "SELECT COUNT(*), SUM(a2.v) FROM a a1 JOIN p ON a1.pk = p.pk JOIN a a2 ON a2.pk = p.pk "
    "LEFT JOIN b ON b.uid = a1.uid AND b.uid = a2.uid",
    "SELECT COUNT(*), SUM(a2.v) FROM a a1 JOIN p ON a1.pk = p.pk LEFT JOIN a a2 ON a2.pk = p.pk WHERE a2.g = 'w'",
    # a comma join reordered through a public table only: still two units' rows meet
    "SELECT COUNT(*), SUM(b.w) FROM b, a, p WHERE a.pk = p.pk AND b.pk = p.pk",
    # per-unit subqueries whose inner join pairs two units (through a public table, on a non-unit key)
    "SELECT SUM(n) FROM (SELECT a.uid, COUNT(*) AS n FROM a JOIN p ON a.pk = p.pk JOIN b ON b.pk = p.pk "
    "GROUP BY a.uid) AS t",
    "SELECT n, COUNT(*) FROM (SELECT a.uid, COUNT(b.w) AS n FROM a JOIN b ON a.pk = b.pk GROUP BY a.uid) AS t GROUP BY n",
]

#: Comma joins refused as cross joins (branch tpch): the equality graph in two parts, and an OR
#: with one branch that lacks the join's equality (nothing to factor out: a cross join).
CROSS = [
    "SELECT COUNT(*), SUM(b.w) FROM a, p, b WHERE a.pk = p.pk",
    "SELECT COUNT(*), SUM(b.w) FROM a, b, p WHERE a.uid = b.uid AND a.g = 'x'",
    "SELECT COUNT(*), SUM(a.v) FROM a, b WHERE (a.uid = b.uid AND a.g = 'x') OR b.h = 'p'",
    "SELECT COUNT(*), SUM(a.v) FROM a, b WHERE (a.uid = b.uid AND a.g = 'x') OR (a.pk = b.pk AND b.h = 'p')",
]


def _refused_for_its_reason(sql: str, message: str) -> bool:
    """The refusal is the one the lists above expect for ``sql``."""
    if sql in CROSS:
        return "cross join" in message
    return sql in REFUSED and "must be joined to the other protected tables on the privacy unit" in message


@lru_cache(maxsize=1)
def _policy():
    folder = Path(tempfile.mkdtemp(prefix="dpgate_join_props_"))
    (folder / "lib.toml").write_text(POLICY)
    return load_policy(folder / "lib.toml")


def _with_public_rows(policy, p_rows):
    """The policy with ``p``'s key tuples read from its rows, as the gateway reads them."""
    p = policy.table("p")
    rows = tuple(dict.fromkeys(p_rows))
    tables = dict(policy.tables)
    tables["p"] = dataclasses.replace(p, key_tuples=(KeyTuples(("pk", "cat", "grp"), rows),))
    return dataclasses.replace(policy, tables=MappingProxyType(tables))


def _run(sql_text: str, units, p_rows) -> dict[str, list[int]]:
    con = duckdb.connect()
    try:
        con.execute("CREATE SCHEMA lib")
        con.execute("CREATE TABLE lib.a (uid BIGINT, g VARCHAR, v BIGINT, pk BIGINT)")
        con.execute("CREATE TABLE lib.b (uid BIGINT, h VARCHAR, w BIGINT, pk BIGINT)")
        con.execute("CREATE TABLE lib.p (pk BIGINT, cat VARCHAR, grp VARCHAR)")
        for uid, (a_rows, b_rows) in units:
            for r in a_rows:
                con.execute("INSERT INTO lib.a VALUES (?, ?, ?, ?)", [uid, *r])
            for r in b_rows:
                con.execute("INSERT INTO lib.b VALUES (?, ?, ?, ?)", [uid, *r])
        for r in p_rows:
            con.execute("INSERT INTO lib.p VALUES (?, ?, ?)", list(r))
        res = con.execute(sql_text)
        names = [d[0] for d in res.description]
        out = res.fetchall()
    finally:
        con.close()
    return {n: [int(row[i]) for row in out] for i, n in enumerate(names) if n.startswith("p")}


_a_row = st.tuples(st.sampled_from(["x", "y", "z", "w"]), st.integers(-20, 150), st.integers(0, 4))
_b_row = st.tuples(st.sampled_from(["p", "q"]), st.integers(-80, 80), st.integers(0, 3))
_units = st.lists(st.tuples(st.lists(_a_row, max_size=5), st.lists(_b_row, max_size=4)), min_size=1, max_size=7)
_p_rows = st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["c0", "c1", "c2"]), st.sampled_from(["u", "v"])),
                   min_size=1, max_size=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(units=_units, p_rows=_p_rows, sql=st.sampled_from(ACCEPTED + REFUSED + REFUSED + CROSS), data=st.data())
def test_removing_one_unit_moves_each_bounded_join_aggregate_by_at_most_the_sensitivity(units, p_rows, sql, data):
    policy = _with_public_rows(_policy(), p_rows)
    try:
        plan = parse_query(sql, policy)
    except UnsupportedQuery as e:
        assert _refused_for_its_reason(sql, e.message), (sql, e.message)
        return
    full = plan_policy(plan, policy)
    sens = sensitivities(plan, full)
    bounded = bounded_sql(plan, full, salt=7)
    everyone = list(enumerate(units))
    victim = data.draw(st.integers(0, len(everyone) - 1), label="victim")
    before = _run(bounded, everyone, p_rows)
    after = _run(bounded, [u for u in everyone if u[0] != victim], p_rows)
    for pid, va in before.items():
        diff = [abs(x - y) for x, y in zip(va, after[pid])]
        assert len(va) == len(after[pid])
        assert sum(diff) <= sens[pid].l1, (sql, pid, diff, sens[pid])
        assert max(diff, default=0) <= sens[pid].linf, (sql, pid, diff, sens[pid])
        assert math.sqrt(sum(d * d for d in diff)) <= sens[pid].l2 + 1e-9, (sql, pid, diff, sens[pid])
    assert sql not in REFUSED + CROSS, f"accepted a join the unit graph refuses: {sql}"


def test_every_accepted_shape_is_planned_and_every_refused_one_refused():
    """The lists above are what the planner does (so the property test covers each shape)."""
    policy = _with_public_rows(_policy(), [(0, "c0", "u"), (1, "c1", "v")])
    for sql in ACCEPTED:
        parse_query(sql, policy)
    for sql in REFUSED + CROSS:
        try:
            parse_query(sql, policy)
        except UnsupportedQuery as e:
            assert _refused_for_its_reason(sql, e.message), (sql, e.message)
        else:
            raise AssertionError(f"accepted: {sql}")
