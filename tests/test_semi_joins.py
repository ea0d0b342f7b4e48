"""Semi-joins with public tables: ``IN (SELECT … FROM public_table)`` and ``[NOT] EXISTS`` correlated
on a public table (issue 21 item 5).

The rewrite is checked against DuckDB running the original subqueries (NULLs on both sides, under
NOT and OR), the plan against the query written with the literal list (the same plan hash, so the
sensitivity and every guarantee are that query's), and every refusal charges and reads nothing.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import sqlglot
import _runner_spies
from _runner_spies import POLICY
from test_pipeline_runners import _kinds

from dpgate.errors import UnsupportedQuery
from dpgate.pipeline.budget import QueryBudget
from dpgate.policy import load_policy
from dpgate.service import Gateway
from dpgate.settings import Settings
from dpgate.sql.semi_joins import MAX_VALUES, inline_values, public_subqueries, resolve_semi_joins

gw, events = _runner_spies.gw, _runner_spies.events  # the shop gateway and its event spy (fixtures)


def _shop_policy(tmp_path: Path):
    (tmp_path / "o.csv").write_text("user_id,region,model,amount\n1,eu,m1,1\n")
    (tmp_path / "r.csv").write_text("region,zone\neu,north\n")
    path = tmp_path / "shop.toml"
    path.write_text(POLICY.format(orders=(tmp_path / "o.csv").as_posix(), regions=(tmp_path / "r.csv").as_posix()))
    return load_policy(path)


# -- the rewrite against DuckDB's own subqueries ---------------------------------------------

ORACLE = [
    "SELECT COUNT(*) FROM orders WHERE region IN (SELECT region FROM regions WHERE zone = 'north')",
    "SELECT COUNT(*) FROM orders WHERE region NOT IN (SELECT region FROM regions WHERE zone <> 'west')",
    "SELECT COUNT(*) FROM orders WHERE NOT (region IN (SELECT region FROM regions) OR amount > 5)",
    "SELECT COUNT(*) FROM orders o WHERE EXISTS (SELECT 1 FROM regions r WHERE r.region = o.region)",
    "SELECT COUNT(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM regions r WHERE r.region = o.region AND r.zone = 'west')",
    "SELECT COUNT(*) FROM orders o WHERE NOT (EXISTS (SELECT 1 FROM regions r WHERE o.region = r.region) OR o.amount > 5)",
    "SELECT COUNT(*) FROM orders o WHERE EXISTS (SELECT 1 FROM regions r WHERE r.region = o.region AND zone LIKE 'n%')",
]


@pytest.mark.parametrize("sql", ORACLE)
def test_the_rewrite_keeps_duckdbs_answer_with_nulls_on_both_sides(sql, tmp_path):
    policy = _shop_policy(tmp_path)
    con = duckdb.connect()
    # adversarial: NULL regions among the orders and in the public table, a region of no order
    con.execute("CREATE TABLE orders AS SELECT * FROM (VALUES (1, 'eu', 'm1', 1), (2, NULL, 'm1', 2), (3, 'us', 'm2', 9), "
                "(4, 'apac', 'm2', 3), (5, 'mars', 'm1', 4), (6, NULL, 'm2', 8)) v(user_id, region, model, amount)")
    con.execute("CREATE TABLE regions AS SELECT * FROM (VALUES ('eu', 'north'), ('us', 'west'), (NULL, 'west'), "
                "('apac', 'east'), ('moon', 'north')) v(region, zone)")
    tree = sqlglot.parse_one(sql, read="duckdb")
    rewritten = resolve_semi_joins(tree.copy(), policy,
                                   lambda sel: [r[0] for r in con.execute(sel.sql(dialect="duckdb")).fetchall()])
    text = rewritten.sql(dialect="duckdb")
    assert "SELECT" not in text.upper()[6:]  # every subquery replaced by its values
    assert con.execute(text).fetchall() == con.execute(sql).fetchall()


def test_values_are_distinct_sorted_and_an_empty_answer_is_false(tmp_path):
    tree = sqlglot.parse_one("SELECT COUNT(*) FROM orders WHERE region IN (SELECT zone FROM regions)")
    (node,) = public_subqueries(tree, _shop_policy(tmp_path))
    inline_values(node, ["west", None, "east", "west", float("nan")])
    assert tree.sql() == "SELECT COUNT(*) FROM orders WHERE region IN (NULL, 'east', 'west')"
    tree = sqlglot.parse_one("SELECT COUNT(*) FROM orders WHERE NOT region IN (SELECT zone FROM regions)")
    inline_values(public_subqueries(tree, _shop_policy(tmp_path))[0], [])
    assert tree.sql() == "SELECT COUNT(*) FROM orders WHERE NOT FALSE"
    with pytest.raises(UnsupportedQuery, match=f"more than {MAX_VALUES} distinct values"):
        inline_values(public_subqueries(sqlglot.parse_one("SELECT 1 FROM orders WHERE region IN (SELECT zone FROM regions)"),
                                        _shop_policy(tmp_path))[0], list(range(MAX_VALUES + 1)))


# -- through the gateway ----------------------------------------------------------------------

@pytest.mark.parametrize("sql,literal", [
    ("SELECT region, COUNT(*) AS n FROM orders WHERE region IN (SELECT region FROM regions WHERE zone = 'north') "
     "GROUP BY region", "SELECT region, COUNT(*) AS n FROM orders WHERE region IN ('eu') GROUP BY region"),
    ("SELECT SUM(amount) FROM orders WHERE region NOT IN (SELECT region FROM regions WHERE zone <> 'north')",
     "SELECT SUM(amount) FROM orders WHERE region NOT IN ('apac', 'us')"),
    ("SELECT COUNT(*) FROM orders o WHERE EXISTS (SELECT 1 FROM regions r WHERE r.region = o.region AND r.zone = 'west')",
     "SELECT COUNT(*) FROM orders o WHERE (o.region IS NOT NULL AND o.region IN ('us'))"),
])
def test_the_plan_is_the_plan_of_the_literal_list(gw, sql, literal):
    # the same plan hash: the same bounded query, sensitivity and release (a repeat is free)
    assert gw.compile("shop", sql)[1].plan_hash == gw.compile("shop", literal)[1].plan_hash
    first = gw.query("shop", sql, consumer="default", budget=QueryBudget(rho=0.02))
    again = gw.query("shop", literal, consumer="default", budget=QueryBudget(rho=0.02))
    assert again["cached"] is True and again["rows"] == first["rows"] and len(gw.ledger_entries()) == 1


@pytest.mark.parametrize("sql,match", [
    # over the protected table, correlated on other than the unit (correlated on the unit they are
    # answered: tests/test_unit_semi_joins.py)
    ("SELECT COUNT(*) FROM orders WHERE region IN (SELECT region FROM orders WHERE amount > 50)", "does not prove"),
    ("SELECT COUNT(*) FROM orders o WHERE EXISTS (SELECT 1 FROM orders p WHERE p.region = o.region AND p.amount > 9)",
     "does not prove"),
    ("SELECT COUNT(*) FROM orders WHERE region IN (SELECT * FROM regions)", "exactly one column"),
    # a CTE named like the public table shadows it (a trial: the public table was read instead)
    ("WITH regions AS (SELECT region FROM orders WHERE amount > 9) SELECT COUNT(*) FROM orders "
     "WHERE region IN (SELECT region FROM regions)", "cannot contain another subquery"),
    ("SELECT COUNT(*) FROM orders o WHERE EXISTS (SELECT 1 FROM regions r WHERE r.zone = 'west')", "exactly one equality"),
    ("SELECT COUNT(*) FROM orders o WHERE EXISTS (SELECT 1 FROM regions r WHERE r.region = o.region AND r.zone = o.model)",
     "exactly one equality"),
    ("SELECT COUNT(*) FROM orders o WHERE EXISTS (SELECT 1 FROM regions r WHERE r.region = o.region AND amount > 1)",
     "qualify a correlated column"),
    ("SELECT COUNT(*) FROM orders WHERE region IN (SELECT region FROM regions WHERE nope = 1)", "in the IN/EXISTS subquery"),
    ("SELECT COUNT(*) FROM orders WHERE amount IN (SELECT zone FROM regions)", "not an int literal"),
])
def test_refusals_charge_and_read_nothing_protected(gw, events, sql, match):
    with pytest.raises(Exception) as info:
        gw.query("shop", sql, consumer="default", budget=QueryBudget(rho=0.02))
    err = info.value
    assert match in err.message and err.details.get("charged") is False, err.message
    assert "charge" not in _kinds(events)
    # only the public subquery may have run (exact, on the public table); no protected statement did
    for kind, args, _, _ in events:
        if kind == "execute":
            assert "orders" not in args[0].sql(dialect="duckdb"), args[0].sql(dialect="duckdb")
    assert gw.ledger_entries() == []


def test_the_public_answer_follows_the_data_version(tmp_path):
    # the values are public data read at planning: a new version of the public table is a new plan
    folder = tmp_path / "v"
    (folder / "policies").mkdir(parents=True)
    (folder / "orders.csv").write_text("user_id,region,model,amount\n" + "".join(
        f"{u},{['eu', 'us', 'apac'][u % 3]},m1,{u % 10}\n" for u in range(60)))
    (folder / "regions.csv").write_text("region,zone\neu,north\n")
    policy = POLICY.format(orders=(folder / "orders.csv").as_posix(), regions=(folder / "regions.csv").as_posix())
    (folder / "policies" / "shop.toml").write_text(policy)
    sql = "SELECT COUNT(*) FROM orders WHERE region IN (SELECT region FROM regions WHERE zone = 'north')"
    with Gateway.open(Settings(policies=folder / "policies", home=folder / "home"), salt_source=lambda: 1) as g:
        before = g.compile("shop", sql)[1].plan_hash
    (folder / "regions.csv").write_text("region,zone\neu,north\nus,north\n")
    (folder / "policies" / "shop.toml").write_text(policy.replace('data_version = "v1"', 'data_version = "v2"'))
    with Gateway.open(Settings(policies=folder / "policies", home=folder / "home"), salt_source=lambda: 1) as g:
        after = g.compile("shop", sql)[1]
    assert after.plan_hash != before and "'us'" in after.canonical_sql
