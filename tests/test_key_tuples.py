"""Group keys from several columns of one public table (issue 19 item 5): the released key
combinations are the distinct tuples of those columns as they occur together in the table
(public data), never the product of the columns' key lists.

Before the fix ``GROUP BY s.s_suppkey, s.s_name`` over a public ``supplier`` table joined to
protected rows released every (key, name) pair — 100 × 100 = 10,000 rows for 100 suppliers —
and the top-1 by noisy revenue was usually a pair that no supplier has. Also here: a selecting
query (private partition selection) whose public key comes first in the GROUP BY, whose rows were
not in candidate order (each candidate was judged by another candidate's unit count).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dpgate.errors import UnsupportedQuery
from dpgate.policy import ColumnPolicy, KeyTuples, load_policy
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings
from dpgate.sql.bound import bounded_query, bounded_sql
from dpgate.sql.sources import plan_policy
from dpgate.sql.parse import parse_query
from _engines import as_query

SUPPLIERS = 100
POLICY = """
[dataset]
name = "tpch"
population = "customers"
data_version = "v1"

[budget]
epsilon = 1000.0
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 1.0

[tables.lineitem]
source = "{root}/lineitem.csv"
privacy_unit = "l_custkey"
max_groups_per_unit = 5
max_rows_per_unit = 10

[tables.lineitem.columns]
l_custkey = {{ type = "int" }}
l_suppkey = {{ type = "int" }}
l_flag = {{ type = "text", public_keys = ["A", "N", "R"] }}
l_tag = {{ type = "text" }}
revenue = {{ type = "int", lower = 0, upper = 1000 }}

[tables.supplier]
source = "{root}/supplier.csv"
public = true

[tables.supplier.columns]
s_suppkey = {{ type = "int" }}
s_name = {{ type = "text" }}
s_nation = {{ type = "text" }}
s_region = {{ type = "text", public_keys = ["AMERICA", "EUROPE", "ASIA", "MARS"] }}
s_status = {{ type = "text", public_keys = ["closed"] }}
"""


def name(key: int) -> str:
    return f"Supplier#{key:09d}"


def nation(key: int) -> str:
    return f"N{key % 5}"


def region(key: int) -> str:
    return ("AMERICA", "EUROPE", "ASIA")[key % 5 % 3]  # each nation in one region; no supplier on MARS


def write(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "supplier.csv").write_text("s_suppkey,s_name,s_nation,s_region,s_status\n" + "".join(
        f"{k},{name(k)},{nation(k)},{region(k)},open\n" for k in range(1, SUPPLIERS + 1)))
    rng = random.Random(7)  # test data, not noise
    rows = [(rng.randrange(500), rng.randrange(1, SUPPLIERS + 1), rng.choice("ANR"), f"t{rng.randrange(3)}",
             rng.randrange(1000)) for _ in range(4000)]
    (root / "lineitem.csv").write_text("l_custkey,l_suppkey,l_flag,l_tag,revenue\n" + "".join(
        ",".join(map(str, r)) + "\n" for r in rows))
    (root / "policies").mkdir(exist_ok=True)
    (root / "policies" / "tpch.toml").write_text(POLICY.format(root=root))
    return root / "policies"


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch")
    with Gateway.open(Settings(policies=write(root), home=root / "home")) as g:
        g.root = root
        yield g


def bounded(gw, sql: str, salt: int = 3) -> dict[str, list]:
    """The gateway's own bounded SQL of ``sql`` on its engine: the exact, pre-noise columns."""
    policy = gw._with_public_table_keys(gw.policy("tpch"))
    plan = parse_query(sql, policy)
    return {k: v.tolist() for k, v in gw.engine.execute(as_query(bounded_query(plan, plan_policy(plan, policy),
                                                                   salt=salt))).items()}


JOIN = "FROM lineitem l JOIN supplier s ON l.l_suppkey = s.s_suppkey"


def test_two_columns_of_a_public_table_release_its_rows_not_their_product(gw):
    sql = f"SELECT s.s_suppkey, s.s_name, SUM(l.revenue) AS rev {JOIN} GROUP BY s.s_suppkey, s.s_name"
    r = gw.query("tpch", sql, consumer="analysts", budget=QueryBudget(rho=0.001))
    assert [(k, n) for k, n, _ in r["rows"]] == [(k, name(k)) for k in range(1, SUPPLIERS + 1)]
    assert gw.explain("tpch", sql)["sensitivity"]  # planned the same way
    # top-1 by noisy revenue: a supplier that exists (before the fix: one of 9,900 phantom pairs,
    # each a noisy zero, usually beat the real ones at this ρ)
    top = gw.query("tpch", sql + " ORDER BY rev DESC LIMIT 1", consumer="analysts", budget=QueryBudget(rho=0.0001))
    (key, supplier, _), = top["rows"]
    assert supplier == name(key)


def test_tuples_mix_with_other_public_keys_computed_keys_and_keys_only(gw):
    # three columns of the public table (one with declared keys: MARS is in no row), a protected
    # column's public keys and a computed key: tuples × keys × domain
    sql = (f"SELECT s.s_nation, s.s_region, l.l_flag, l.revenue > 500 AS big, COUNT(*) AS n {JOIN} "
           "GROUP BY s.s_nation, s.s_region, l.l_flag, big")
    r = gw.query("tpch", sql, consumer="analysts", budget=QueryBudget(rho=10.0))
    pairs = sorted({(nation(k), region(k)) for k in range(1, SUPPLIERS + 1)})
    assert len(r["rows"]) == len(pairs) * 3 * 2  # 5 (nation, region) pairs, not 5 × 4
    assert {(a, b) for a, b, *_ in r["rows"]} == set(pairs)
    b = bounded(gw, sql)
    truth = {(a, r_, f, g): n for f, a, r_, g, n in zip(b["l_flag"], b["s_nation"], b["s_region"], b["g0"], b["p0"])}
    # the bounded SQL enumerates the same cells and the joined rows reach them (values: the corpus,
    # tu-cat-06/08, where k does not truncate; here which k groups a unit keeps depends on the salt)
    assert set(truth) == {(a, r_, f, g) for a, r_, f, g, _ in r["rows"]} and sum(truth.values()) > 1000
    # keys only: the tuples themselves, free
    k = gw.query("tpch", f"SELECT s.s_region, s.s_nation {JOIN} GROUP BY s.s_nation, s.s_region",
                 consumer="analysts")
    assert k["charge"] is None and sorted((b, a) for a, b in k["rows"]) == pairs
    assert gw.explain("tpch", sql)["bounded_sql"].count("CROSS JOIN") == 2  # 3 blocks


def test_the_plan_and_the_bounded_sql_use_the_tuples(gw):
    policy = gw._with_public_table_keys(gw.policy("tpch"))
    plan = parse_query(f"SELECT s.s_suppkey, s.s_name, COUNT(*) {JOIN} GROUP BY s.s_suppkey, s.s_name", policy)
    joined = plan_policy(plan, policy).table(plan.table)
    assert plan.key_combinations(joined) == SUPPLIERS
    single = parse_query(f"SELECT s.s_suppkey, COUNT(*) {JOIN} GROUP BY s.s_suppkey", policy)
    assert single.key_combinations(plan_policy(single, policy).table(single.table)) == SUPPLIERS
    # the plan hash of a query with one public column does not depend on the tuples
    bare = load_policy(gw.root / "policies" / "tpch.toml")
    assert parse_query(f"SELECT l.l_flag, COUNT(*) {JOIN} GROUP BY l.l_flag", bare).plan_hash == \
        parse_query(f"SELECT l.l_flag, COUNT(*) {JOIN} GROUP BY l.l_flag", policy).plan_hash
    sql = bounded_sql(plan, plan_policy(plan, policy), salt=1)
    assert f"(99, 100, '{name(100)}')) AS \"__dpg_k0\"(\"__dpg_o0\", \"__dpg_g0\", \"__dpg_g1\")" in sql


def test_key_tuples_project_in_public_key_order():
    kt = KeyTuples(("a", "b", "c"), ((2, "y", None), (1, "x", 5), (1, "x", 6), (2, "z", 1), (3, "w", 1), (1, None, 1)))
    a = ColumnPolicy("a", "int", public_keys=range(1, 3))
    b = ColumnPolicy("b", "text", public_keys=("z", "y", "x"))
    c = ColumnPolicy("c", "int", public_keys=(6, 5, 1))
    assert kt.project((a, b)) == ((1, "x"), (2, "z"), (2, "y"))  # 3 is outside a's keys, NULL left out
    assert kt.project((b, c)) == (("z", 1), ("x", 6), ("x", 5))
    assert KeyTuples(("a", "b"), ((True, 1),)).project((ColumnPolicy("a", "bool", public_keys=(True,)),
                                                       ColumnPolicy("b", "int", public_keys=(1,)))) == ((True, 1),)
    assert KeyTuples(("a", "b"), ((1, 1),)).project((ColumnPolicy("a", "bool", public_keys=(True,)),
                                                    ColumnPolicy("b", "int", public_keys=(1,)))) == ()  # 1 is not True
    with pytest.raises(UnsupportedQuery, match="more distinct rows"):
        KeyTuples(("a", "b"), None).project((a, b))


def test_no_tuple_within_the_keys_is_refused_before_the_charge(gw):
    before = gw.ledger.spend("customers").charges
    with pytest.raises(UnsupportedQuery, match="would release nothing"):
        gw.query("tpch", f"SELECT s.s_status, s.s_name, COUNT(*) {JOIN} GROUP BY s.s_status, s.s_name",
                 consumer="analysts")
    assert gw.ledger.spend("customers").charges == before


def test_selection_with_a_public_key_first_keeps_candidates_in_order(gw):
    """GROUP BY a public key declared before a selected one (supplier's nation, then lineitem's
    l_tag): the bounded rows must come candidate by candidate, or each candidate is judged by
    another's unit count. Checked on the gateway's own bounded SQL: every candidate's rows
    repeat its own unit count, and the release keeps exactly the candidates present."""
    policy = gw._with_public_table_keys(gw.policy("tpch"))
    sql = "SELECT s.s_nation, l.l_tag, COUNT(*) AS n FROM supplier s JOIN lineitem l ON l.l_suppkey = s.s_suppkey " \
          "GROUP BY s.s_nation, l.l_tag"
    plan = parse_query(sql, policy)
    assert plan.group_by == ("s_nation", "l_tag") and plan.selected_keys == ("l_tag",)
    values = gw.engine.execute(as_query(bounded_query(plan, plan_policy(plan, policy), salt=5)))
    tags, units = values["l_tag"].tolist(), values["__dpg_units"].tolist()
    assert tags == sorted(tags) and len(tags) == 3 * 5  # 3 candidates × 5 nations, candidate-major
    for i in range(0, 15, 5):
        assert len(set(tags[i:i + 5])) == 1 and len(set(units[i:i + 5])) == 1
    r = gw.query("tpch", sql, consumer="analysts", budget=QueryBudget(rho=10.0))
    assert sorted({t for _, t, _ in r["rows"]}) == ["t0", "t1", "t2"]


def test_quantiles_and_public_only_queries_release_the_tuples(gw):
    pairs = sorted({(nation(k), region(k)) for k in range(1, SUPPLIERS + 1)})
    r = gw.query("tpch", f"SELECT s.s_nation, s.s_region, MEDIAN(l.revenue) AS med {JOIN} "
                 "GROUP BY s.s_nation, s.s_region", consumer="analysts", budget=QueryBudget(rho=1.0))
    assert sorted((a, b) for a, b, _ in r["rows"]) == pairs and all(0 <= m <= 1000 for *_, m in r["rows"])
    # no join: a public table alone is answered exactly from its own rows, free
    for sql in ("SELECT s_nation, s_region, COUNT(*) FROM supplier GROUP BY s_nation, s_region",
                "SELECT s_nation, s_region FROM supplier GROUP BY s_nation, s_region"):
        p = gw.query("tpch", sql, consumer="analysts")
        assert p["charge"] is None and sorted((row[0], row[1]) for row in p["rows"]) == pairs
