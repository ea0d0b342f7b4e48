"""Privacy units through foreign keys (issue 21 item 1): the policy syntax, its load-time checks,
``unique = true`` verified on the data by every engine, and the planner's answers and refusals
(the join along the path: tests/test_unit_path_queries.py).
"""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _engines import pg_load, pg_schema, pg_unavailable, spark_unavailable, write_policy
from dpgate.engine import Engine
from dpgate.errors import PolicyError, UnsupportedQuery
from dpgate.ledger import open_ledger
from dpgate.policy import ColumnPolicy, ForeignKeyHop, UnitPath, load_policies, parse_policy
from dpgate.service import Gateway, QueryBudget, open_release_store
from dpgate.tpch import generate_tpch, tpch_policy

HEAD = """
[dataset]
name = "shop"
population = "shoppers"

[budget]
epsilon = 1.0
delta = 1e-6
default_query_rho = 0.01
"""

# customer <- orders <- lineitem, plus a public table; {lineitem_unit} and {extra} vary per test
TABLES = """
[tables.customer]
source = "customer.parquet"
privacy_unit = "c_custkey"

[tables.customer.columns]
c_custkey = {{ type = "int", unique = {c_unique} }}
c_segment = {{ type = "text", public_keys = ["a", "b"] }}

[tables.orders]
source = "orders.parquet"
privacy_unit = "o_custkey"
max_groups_per_unit = 5
max_rows_per_unit = 5

[tables.orders.columns]
o_orderkey = {{ type = "{o_type}", unique = {o_unique} }}
o_custkey  = {{ type = "int" }}
o_price    = {{ type = "float", lower = 0, upper = 100 }}

[tables.lineitem]
source = "lineitem.parquet"
privacy_unit = {lineitem_unit}
max_groups_per_unit = 10
max_rows_per_unit = 10

[tables.lineitem.columns]
l_orderkey = {{ type = "int" }}
l_qty      = {{ type = "int", lower = 1, upper = 50 }}

[tables.part]
source = "part.parquet"
public = true

[tables.part.columns]
p_partkey = {{ type = "int", unique = true }}
p_custkey = {{ type = "int" }}
{extra}
"""
FK = '{ path = ["l_orderkey -> orders.o_orderkey", "o_custkey"] }'


def _parse(lineitem_unit: str = FK, *, c_unique: str = "true", o_unique: str = "true", o_type: str = "int",
           extra: str = "", head: str = HEAD):
    text = head + TABLES.format(lineitem_unit=lineitem_unit, c_unique=c_unique, o_unique=o_unique,
                                o_type=o_type, extra=textwrap.dedent(extra))
    return parse_policy(tomllib.loads(text), Path("/tmp/policies/shop.toml"))


def _refused(match: str, lineitem_unit: str = FK, **kw) -> PolicyError:
    with pytest.raises(PolicyError) as e:
        _parse(lineitem_unit, **kw)
    assert match in e.value.message, e.value.message
    assert "\n" not in e.value.message  # one clear line
    assert e.value.details["table"] == "lineitem"  # the table declaring the path
    return e.value


# --- the syntax -------------------------------------------------------------------------------


def test_path_parses_into_frozen_hops_and_is_not_record_level():
    table = _parse().tables["lineitem"]
    assert table.unit_path == UnitPath((ForeignKeyHop("l_orderkey", "orders", "o_orderkey"),), "o_custkey")
    assert table.privacy_unit is None and not table.public
    assert table.record_level is False  # before issue 21 a table without a unit column was record-level
    assert (table.max_groups_per_unit, table.max_rows_per_unit) == (10, 10)
    assert table.unit_path.to_list() == ["l_orderkey -> orders.o_orderkey", "o_custkey"]
    assert str(table.unit_path) == "l_orderkey -> orders.o_orderkey -> o_custkey"
    assert table.unit_path.unit_table == "orders"
    assert table.to_dict()["unit_path"] == ["l_orderkey -> orders.o_orderkey", "o_custkey"]
    assert table.to_dict()["record_level"] is False
    with pytest.raises(AttributeError):
        table.unit_path.unit = "x"  # frozen


def test_a_chain_of_three_tables_and_spaces_around_the_arrow():
    unit = '{ path = ["l_orderkey->orders.o_orderkey", "  o_custkey ->  customer . c_custkey ", "c_custkey"] }'
    table = _parse(unit).tables["lineitem"]
    assert table.unit_path.tables == ("orders", "customer")
    assert table.unit_path.unit == "c_custkey"


def test_tables_without_a_path_describe_themselves_as_before():
    policy = _parse()
    assert "unit_path" not in policy.tables["orders"].to_dict()
    assert policy.tables["customer"].record_level is False and policy.tables["orders"].unit_path is None
    # `unique` enters a column's description only when declared: the policy digests (plan hashes)
    # of every existing policy stay byte-identical
    assert "unique" not in ColumnPolicy("x", "int").to_dict()
    assert policy.tables["orders"].column("o_orderkey").to_dict()["unique"] is True


@pytest.mark.parametrize("unit, match", [
    ('{ path = ["l_orderkey -> orders.o_orderkey"] }', "needs at least one hop"),
    ('{ path = [] }', "needs at least one hop"),
    ('{ path = "l_orderkey -> orders.o_orderkey" }', "must be a list of strings"),
    ('{ path = ["l_orderkey -> orders.o_orderkey", 3] }', "must be a list of strings"),
    ('{ paths = ["l_orderkey -> orders.o_orderkey", "o_custkey"] }', "unknown key(s) 'paths'"),
    ('{ path = ["l_orderkey => orders.o_orderkey", "o_custkey"] }', "must read \"<column> -> <table>.<key>\""),
    ('{ path = ["l_orderkey -> o_orderkey", "o_custkey"] }', "step 1"),
    ('{ path = ["l_orderkey -> orders.o_orderkey", "orders.o_custkey"] }', "a plain column name"),
    ('{ path = ["l_orderkey -> shipments.s_orderkey", "o_custkey"] }', "no table 'shipments' is declared"),
    ('{ path = ["l_ordrkey -> orders.o_orderkey", "o_custkey"] }', "declares no column 'l_ordrkey'"),
    ('{ path = ["l_orderkey -> orders.o_key", "o_custkey"] }', "table 'orders' declares no column 'o_key'"),
    ('{ path = ["l_orderkey -> orders.o_orderkey", "o_price"] }', "not the privacy unit of 'orders' (o_custkey)"),
    ('{ path = ["l_orderkey -> part.p_partkey", "p_custkey"] }', "ends at public table 'part'"),
    ('{ path = ["l_orderkey -> orders.o_orderkey", "o_custkey -> customer.c_custkey", '
     '"c_custkey -> orders.o_orderkey", "o_custkey"] }', "returns to table 'orders'; cycles are refused"),
    ('{ path = ["l_orderkey -> orders.o_orderkey", "o_custkey -> lineitem.l_orderkey", "x"] }',
     "returns to table 'lineitem'"),
])
def test_each_problem_is_one_clear_line(unit, match):
    _refused(match, unit)


def test_the_referenced_key_must_be_declared_unique():
    e = _refused("orders.o_orderkey is not declared unique (unique = true)", o_unique="false")
    assert "several units" in e.message
    _refused("customer.c_custkey is not declared unique", c_unique="false", lineitem_unit=(
        '{ path = ["l_orderkey -> orders.o_orderkey", "o_custkey -> customer.c_custkey", "c_custkey"] }'))


def test_a_foreign_key_and_its_key_have_one_type():
    _refused("lineitem.l_orderkey (int) and orders.o_orderkey (text) must both be int or both text",
             o_type="text")


def test_a_path_ends_at_a_table_that_carries_its_unit_column():
    extra = """
    [tables.returns]
    source = "returns.parquet"
    privacy_unit = { path = ["r_line -> lineitem.l_orderkey", "l_orderkey"] }

    [tables.returns.columns]
    r_line = { type = "int" }

    [tables.events]
    source = "events.parquet"

    [tables.events.columns]
    e_id = { type = "int", unique = true }
    """
    with pytest.raises(PolicyError, match="not declared unique"):
        _parse(extra=extra)  # lineitem.l_orderkey is not unique (a line is not an order)
    with pytest.raises(PolicyError, match="record-level"):
        _parse(extra=extra.replace('["r_line -> lineitem.l_orderkey", "l_orderkey"]',
                                   '["r_line -> events.e_id", "e_id"]'))


def test_a_path_ending_at_a_path_table_is_refused():
    text = HEAD + TABLES.format(lineitem_unit=FK, c_unique="true", o_unique="true", o_type="int", extra="")
    raw = tomllib.loads(text)
    raw["tables"]["lineitem"]["columns"]["l_linekey"] = {"type": "int", "unique": True}
    raw["tables"]["returns"] = {"source": "r.parquet", "privacy_unit": {"path": ["r_line -> lineitem.l_linekey",
                                                                              "l_orderkey"]},
                                "columns": {"r_line": {"type": "int"}}}
    with pytest.raises(PolicyError, match="whose unit is itself a path: spell the whole chain"):
        parse_policy(raw, Path("/tmp/policies/shop.toml"))


def test_a_public_table_has_no_path_and_unique_is_a_boolean():
    raw = tomllib.loads(HEAD + TABLES.format(lineitem_unit=FK, c_unique="true", o_unique="true", o_type="int",
                                             extra=""))
    raw["tables"]["part"]["privacy_unit"] = {"path": ["p_partkey -> orders.o_orderkey", "o_custkey"]}
    with pytest.raises(PolicyError, match="a public table has no privacy_unit"):
        parse_policy(raw, Path("/tmp/policies/shop.toml"))
    with pytest.raises(PolicyError, match="unique must be true or false"):
        _parse(o_unique='"yes"')


def test_cohorts_with_a_path_table_are_refused_for_now():
    head = HEAD + '\n[population]\ncohort_column = "c_segment"\n'
    with pytest.raises(PolicyError, match="foreign-key path is not supported with cohorts yet"):
        _parse(head=head)


# --- uniqueness verified on the data at load (DuckDB; PostgreSQL by an index; Spark) -----------


def _write_shop(folder: Path, order_keys: list) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    n = len(order_keys)
    pq.write_table(pa.table({"c_custkey": [1, 2, 3], "c_segment": ["a", "b", "a"]}), folder / "customer.parquet")
    pq.write_table(pa.table({"o_orderkey": order_keys, "o_custkey": [1 + i % 3 for i in range(n)],
                             "o_price": [10.0] * n}), folder / "orders.parquet")
    pq.write_table(pa.table({"l_orderkey": [order_keys[0]] * 4, "l_qty": [1, 2, 3, 4]}), folder / "lineitem.parquet")
    pq.write_table(pa.table({"p_partkey": [1, 2], "p_custkey": [1, 2]}), folder / "part.parquet")
    text = HEAD + TABLES.format(lineitem_unit=FK, c_unique="true", o_unique="true", o_type="int", extra="")
    text = text.replace('source = "', f'source = "{folder}/')
    pol = folder / "policies"
    pol.mkdir(exist_ok=True)
    (pol / "shop.toml").write_text(text)
    return pol


def test_duckdb_refuses_a_unique_key_that_repeats_with_counts_only(tmp_path):
    pol = _write_shop(tmp_path, [424242, 424242, 7, None])
    with pytest.raises(PolicyError) as e:
        Engine(timeout_s=10).load(load_policies(pol))
    assert "'o_orderkey' is declared unique (unique = true) but its 3 non-NULL values hold only 2 distinct" \
        in e.value.message
    assert "424242" not in e.value.message and "424242" not in str(e.value.details)  # counts, never ids
    assert (e.value.details["values"], e.value.details["distinct"], e.value.details["column"]) == (3, 2, "o_orderkey")


def test_duckdb_loads_unique_keys_nulls_allowed(tmp_path):
    pol = _write_shop(tmp_path, [1, 2, None, None])
    engine = Engine(timeout_s=10)
    engine.load(load_policies(pol))
    engine.close()


@pytest.mark.postgres
@pytest.mark.skipif(bool(pg_unavailable()), reason=pg_unavailable() or "")
def test_postgres_needs_a_unique_index_for_a_unique_key(tmp_path):
    def policy(folder: Path, schema: str) -> dict:
        text = TABLES.format(lineitem_unit=FK, c_unique="true", o_unique="true", o_type="int", extra="")
        for t in ("customer", "orders", "lineitem", "part"):
            text = text.replace(f'source = "{t}.parquet"', f'source = "{schema}.{t}"')
        from _engines import PG_URL
        return load_policies(write_policy(folder, "shop", f'engine = "postgres"\nconnection = "{PG_URL}"\n', text))

    with pg_schema() as schema:
        pg_load(schema, "customer", pa.table({"c_custkey": [1, 2], "c_segment": ["a", "b"]}), primary_key="c_custkey")
        pg_load(schema, "orders", pa.table({"o_orderkey": [1, 2], "o_custkey": [1, 2], "o_price": [1.0, 2.0]}))
        pg_load(schema, "lineitem", pa.table({"l_orderkey": [1, 1], "l_qty": [1, 2]}))
        pg_load(schema, "part", pa.table({"p_partkey": [1], "p_custkey": [1]}), primary_key="p_partkey")
        with pytest.raises(PolicyError, match="'o_orderkey' is declared unique .* no valid UNIQUE or PRIMARY KEY"):
            Engine(timeout_s=10).load(policy(tmp_path / "a", schema))  # unique data, but no index
        import psycopg
        from _engines import PG_URL
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'CREATE UNIQUE INDEX ON "{schema}"."orders" ("o_orderkey")')
        engine = Engine(timeout_s=10)
        engine.load(policy(tmp_path / "b", schema))
        engine.close()


@pytest.mark.spark
@pytest.mark.skipif(bool(spark_unavailable()), reason=spark_unavailable() or "")
def test_spark_refuses_a_unique_key_that_repeats(tmp_path):
    pol = _write_shop(tmp_path / "dup", [5, 5, 6])
    text = (pol / "shop.toml").read_text().replace('population = "shoppers"', 'population = "shoppers"\nengine = "spark"')
    (pol / "shop.toml").write_text(text)
    with pytest.raises(PolicyError, match="its 3 non-NULL values hold only 2 distinct"):
        Engine(timeout_s=60).load(load_policies(pol))


# --- the planner: refused before any charge until it joins along the path -----------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpch_fk")
    generate_tpch(root / "data", 0.002)
    pol = root / "policies"
    pol.mkdir()
    (pol / "tpch_fk.toml").write_text(tpch_policy(root / "data", 0.002, variant="fk"))
    policies = load_policies(pol)
    engine = Engine(timeout_s=30)
    versions = engine.load(policies)
    ledger = open_ledger(f"sqlite:///{root / 'ledger.sqlite'}")
    gw = Gateway(policies, engine, versions, ledger, open_release_store(ledger))
    yield gw
    gw.close()


def test_a_join_on_the_paths_first_hop_is_answered_and_one_off_the_path_refused_before_the_charge(gateway):
    """Issue 21 item 1's last piece (tests/test_unit_path_joins.py has the planner and neighbour tests)."""
    before = gateway.ledger.spend("tpch-customers").charges
    gateway.query("tpch_fk", "SELECT COUNT(*) FROM orders JOIN lineitem ON o_orderkey = l_orderkey",
                  consumer="analysts", budget=QueryBudget(rho=0.01))
    gateway.query("tpch_fk", "SELECT COUNT(*) FROM part JOIN lineitem ON p_partkey = l_partkey",  # a public table
                  consumer="analysts", budget=QueryBudget(rho=0.01))
    assert gateway.ledger.spend("tpch-customers").charges == before + 2
    with pytest.raises(UnsupportedQuery) as e:
        gateway.query("tpch_fk", "SELECT COUNT(*) FROM orders JOIN lineitem ON o_orderkey = l_partkey",
                      consumer="analysts", budget=QueryBudget(rho=0.01))
    assert e.value.details["reason"] == "unit_path_join" and "nothing was charged" in e.value.message
    assert "lineitem.l_orderkey = orders.o_orderkey" in e.value.message
    assert gateway.ledger.spend("tpch-customers").charges == before + 2


@pytest.mark.parametrize("sql, reason", [
    # (o_orderkey IN (SELECT l_orderkey FROM lineitem) is answered since issue 21 item 5: the IN is
    # correlated on the path's first hop, tests/test_unit_semi_joins.py)
    ("SELECT AVG(n) FROM (SELECT l_orderkey, COUNT(*) AS n FROM lineitem GROUP BY l_orderkey) AS t", "unit_path"),
    ("WITH big AS (SELECT l_orderkey FROM lineitem WHERE l_quantity > 40 LIMIT 10) SELECT COUNT(*) FROM big",
     "unit_path"),
])
def test_path_tables_in_subqueries_are_refused_before_the_charge(gateway, sql, reason):
    before = gateway.ledger.spend("tpch-customers").charges
    with pytest.raises(UnsupportedQuery) as e:
        gateway.query("tpch_fk", sql, consumer="analysts", budget=QueryBudget(rho=0.01))
    assert e.value.details["reason"] == reason and e.value.details["table"] == "lineitem"
    assert e.value.details["unit_path"] == ["l_orderkey -> orders.o_orderkey", "o_custkey"]
    assert "issue 21" in e.value.message and "nothing was charged" in e.value.message
    assert gateway.ledger.spend("tpch-customers").charges == before
    with pytest.raises(UnsupportedQuery, match="through foreign keys"):
        gateway.explain("tpch_fk", sql)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM lineitem",
    "SELECT l_returnflag, SUM(l_extendedprice) FROM lineitem GROUP BY l_returnflag",
    "SELECT COUNT(*) FROM tpch_fk.LineItem",
])
def test_queries_over_a_path_table_alone_are_answered_with_the_unit_attached(gateway, sql):
    plan = gateway.explain("tpch_fk", sql)
    assert plan["plan"]["table"] == "UNIT PATH lineitem" and plan["contribution"]["privacy_unit"] == "o_custkey"
    assert '"tpch_fk"."orders"' in plan["bounded_sql"]  # joined along l_orderkey -> orders.o_orderkey
    r = gateway.query("tpch_fk", sql, consumer="analysts", budget=QueryBudget(rho=0.01))
    assert r["rows"]


def test_tables_carrying_the_unit_are_answered_beside_a_path_table(gateway):
    r = gateway.query("tpch_fk", "SELECT o_orderpriority, COUNT(*) AS n FROM orders GROUP BY o_orderpriority",
                      consumer="analysts", budget=QueryBudget(rho=0.01))
    assert len(r["rows"]) == 5
    r = gateway.query("tpch_fk", "SELECT c_mktsegment, COUNT(*) FROM customer JOIN orders ON c_custkey = o_custkey "
                      "GROUP BY c_mktsegment", consumer="analysts", budget=QueryBudget(rho=0.01))
    assert len(r["rows"]) == 5


def test_the_dataset_description_shows_the_path(gateway):
    table = gateway.dataset("tpch_fk")["tables"]["lineitem"]
    assert table["unit_path"] == ["l_orderkey -> orders.o_orderkey", "o_custkey"]
    assert table["privacy_unit"] is None and table["record_level"] is False
    from dpgate.api.schemas import TableInfo
    from dpgate.ui.data import _unit_label

    shown = TableInfo.model_validate(table).model_dump()
    assert shown["unit_path"] == ["l_orderkey -> orders.o_orderkey", "o_custkey"]
    assert shown["columns"]["l_orderkey"]["unique"] is False
    assert TableInfo.model_validate(gateway.dataset("tpch_fk")["tables"]["orders"]).model_dump()["columns"][
        "o_orderkey"]["unique"] is True
    # the admin pages name what protects the rows (not "record", which a path table is not)
    assert _unit_label(table) == "o_custkey via l_orderkey -> orders.o_orderkey"


def test_a_cte_that_only_filters_a_path_table_is_the_flat_query(gateway):
    """Branch tpch: a derived table (or CTE) that only filters and projects is merged before the
    unit-path hook, so it is planned as the flat query (one plan, one plan hash)."""
    from dpgate.sql.parse import parse_query

    policy = gateway.policies["tpch_fk"]
    cte = parse_query("WITH big AS (SELECT * FROM lineitem WHERE l_quantity > 40) SELECT COUNT(*) FROM big", policy)
    flat = parse_query("SELECT COUNT(*) FROM lineitem WHERE l_quantity > 40", policy)
    assert cte.plan_hash == flat.plan_hash and cte.table == flat.table
