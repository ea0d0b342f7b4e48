"""A path table joined by the analyst (issue 21 item 1's last piece; dpgate.sql.joins + sql.sources).

``lineitem ⋈ orders ON l_orderkey = o_orderkey`` follows lineitem's unit path's first hop: each line
reaches exactly one order (``o_orderkey`` is declared unique), the order its unit is attached
through, so the two rows of a joined row have one unit. The join is a
:class:`~dpgate.sql.sources.JoinSource` whose lineitem occurrence is a
:class:`~dpgate.sql.sources.UnitPathSource` and whose hop condition is an edge of the unit graph
(checked against the path when the node is built). A join not on the path is refused before the
charge (``reason = "unit_path_join"``). Same policy and data as tests/test_unit_path_queries.py.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.errors import UnsupportedQuery
from dpgate.sensitivity import sensitivities
from dpgate.sql.bound import bounded_sql
from dpgate.sql.parse import parse_query
from dpgate.sql.sources import JoinSource, UnitPathSource, plan_policy
from test_unit_path_queries import _policy, _run

#: Customers as in tests/test_unit_path_queries.py, with prices and quantities in small ranges so
#: that values of different customers often coincide (a join on them would pair two units' rows:
#: the property below then fails, as checked with the hop check disabled).
_ship = st.tuples(st.sampled_from(["AIR", "RAIL"]), st.integers(-3, 6))
_line = st.tuples(st.sampled_from(["A", "N", "R"]), st.integers(0, 6), st.lists(_ship, max_size=2))
_order = st.tuples(st.integers(0, 6), st.lists(_line, max_size=4))
_units = st.lists(st.lists(_order, max_size=3), min_size=1, max_size=5)

#: Joins of a path table on its path's first hop (one hop: lineitem → orders; two: shipments →
#: lineitem, itself a path table), INNER, comma and LEFT, with another path table, and with a filter.
JOINS = [
    "SELECT COUNT(*), SUM(o_price) FROM lineitem JOIN orders ON l_orderkey = o_orderkey",
    "SELECT COUNT(*), SUM(l_qty) FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey",
    "SELECT l_flag, COUNT(*), SUM(o_price) FROM lineitem, orders WHERE l_orderkey = o_orderkey GROUP BY l_flag",
    "SELECT COUNT(*), SUM(l_qty) FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey WHERE o.o_price > 3",
    "SELECT COUNT(*), COUNT(o_price) FROM lineitem l LEFT JOIN orders o ON l.l_orderkey = o.o_orderkey",
    "SELECT s_mode, COUNT(*), SUM(l_qty) FROM shipments s JOIN lineitem l ON s.s_linekey = l.l_linekey GROUP BY s_mode",
    # branch tpch: a comma join listed out of order (orders meets shipments only through the later
    # lineitem: reordered to a spanning order), and the hop repeated in every branch of an OR
    # (factored out, TPC-H Q19's form)
    "SELECT s_mode, COUNT(*), SUM(o_price) FROM shipments, orders, lineitem "
    "WHERE s_linekey = l_linekey AND l_orderkey = o_orderkey GROUP BY s_mode",
    "SELECT COUNT(*), SUM(l_qty) FROM lineitem, orders "
    "WHERE (l_orderkey = o_orderkey AND l_flag = 'A') OR (o_orderkey = l_orderkey AND o_price > 3)",
    # a FROM subquery that only filters and projects the join (TPC-H Q7–Q9's shape): merged first
    "SELECT flag, COUNT(*), SUM(amount) FROM (SELECT l_flag AS flag, l_qty * o_price AS amount FROM orders, lineitem "
    "WHERE o_orderkey = l_orderkey AND o_price > 2) AS shipping GROUP BY flag",
]


def test_a_join_on_the_first_hop_is_a_join_source_over_the_path():
    plan = parse_query(JOINS[0], _policy())
    node = plan.source
    assert isinstance(node, JoinSource) and plan.table == "JOIN lineitem JOIN orders ON lineitem.l_orderkey = " \
                                                         "orders.o_orderkey"
    lineitem, orders = node.tables
    assert isinstance(lineitem.source, UnitPathSource) and lineitem.source.steps[0].key == "o_orderkey"
    (cond,) = node.conditions
    assert cond.hop and cond.unit_edge and node.unit_edges == (("lineitem", "orders"),)
    view = node.table
    # the joined rows' unit is the path's; k, m the largest of lineitem's (2, 3) and orders' (3, 3)
    assert (view.privacy_unit, view.max_groups_per_unit, view.max_rows_per_unit) == ("o_custkey", 3, 3)
    assert node.describe()["join"]["tables"] == ["lineitem", "orders"]


def test_the_joined_rows_are_each_line_with_its_order():
    # customer 0: order (price 10) with lines qty 5, 6; customer 1: order (price 20) with line qty 7.
    # Exact: 3 joined rows, SUM(o_price) = 10 + 10 + 20 = 40; the orphan lines (no order, NULL
    # order key, an order without customer) meet no order of a unit and are dropped.
    units = [(0, [(10, [("A", 5, []), ("N", 6, [])])]), (1, [(20, [("A", 7, [])])])]
    policy = _policy()
    plan = parse_query(JOINS[0], policy)
    out = _run(bounded_sql(plan, plan_policy(plan, policy), salt=3), units)
    assert sorted(v[0] for v in out.values()) == [3, 40]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(units=_units, sql=st.sampled_from(JOINS), data=st.data())
def test_removing_one_customer_with_their_orders_and_lines_moves_a_joined_aggregate_by_at_most_the_sensitivity(
        units, sql, data):
    policy = _policy()
    plan = parse_query(sql, policy)
    full = plan_policy(plan, policy)
    sens = sensitivities(plan, full)
    bounded = bounded_sql(plan, full, salt=11)
    everyone = list(enumerate(units))
    victim = data.draw(st.integers(0, len(everyone) - 1), label="victim")
    before = _run(bounded, everyone)
    after = _run(bounded, [u for u in everyone if u[0] != victim])
    assert before, sql
    for pid, va in before.items():
        diff = [abs(x - y) for x, y in zip(va, after[pid])]
        assert len(va) == len(after[pid])
        assert sum(diff) <= sens[pid].l1, (sql, pid, diff, sens[pid])
        assert max(diff, default=0) <= sens[pid].linf, (sql, pid, diff, sens[pid])
        assert math.sqrt(sum(d * d for d in diff)) <= sens[pid].l2 + 1e-9, (sql, pid, diff, sens[pid])


def test_a_comma_join_out_of_order_is_planned_as_its_spanning_order():
    written = parse_query("SELECT s_mode, COUNT(*), SUM(o_price) FROM shipments, orders, lineitem "
                          "WHERE s_linekey = l_linekey AND l_orderkey = o_orderkey GROUP BY s_mode", _policy())
    spanning = parse_query("SELECT s_mode, COUNT(*), SUM(o_price) FROM shipments, lineitem, orders "
                           "WHERE s_linekey = l_linekey AND l_orderkey = o_orderkey GROUP BY s_mode", _policy())
    assert written.table == spanning.table and written.plan_hash == spanning.plan_hash
    assert [o.alias for o in written.source.tables] == ["shipments", "lineitem", "orders"]


@pytest.mark.parametrize("sql", [
    # one OR branch lacks the hop: the comma join stays a cross join
    "SELECT COUNT(*) FROM lineitem, orders WHERE (l_orderkey = o_orderkey AND l_flag = 'A') OR o_price > 3",
    # the graph in two parts: orders meets nothing
    "SELECT COUNT(*) FROM shipments, orders, lineitem WHERE s_linekey = l_linekey",
    # the same inside a FROM subquery that is merged
    "SELECT COUNT(*) FROM (SELECT l_qty FROM lineitem, orders WHERE l_qty > 1) AS t",
])
def test_comma_joins_without_an_equality_for_every_table_are_refused(sql):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(sql, _policy())
    assert "cross join" in e.value.message


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM lineitem JOIN orders ON l_qty = o_price",  # an extra key only: two units could meet
    "SELECT COUNT(*) FROM lineitem JOIN orders ON l_linekey = o_orderkey",  # a key, not the path's
    "SELECT COUNT(*) FROM lineitem a JOIN lineitem b ON a.l_orderkey = b.l_orderkey",  # not a hop: two lines
    "SELECT COUNT(*) FROM shipments s JOIN orders o ON s.s_linekey = o.o_orderkey",  # skips lineitem
    "SELECT COUNT(*) FROM orders o LEFT JOIN lineitem l ON o.o_orderkey = l.l_linekey",
])
def test_joins_not_on_the_path_are_refused_with_the_reason(sql):
    _refused_off_the_path(sql)


def test_a_merged_from_subquery_joined_off_the_path_is_refused_with_the_reason():
    _refused_off_the_path("SELECT COUNT(*) FROM (SELECT l_qty FROM lineitem JOIN orders ON l_qty = o_price) AS t")


def _refused_off_the_path(sql):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(sql, _policy())
    assert e.value.details["reason"] == "unit_path_join", e.value.details
    assert "first hop of its unit path" in e.value.message


def test_a_path_table_in_a_subquery_of_a_join_is_still_refused_off_its_path():
    # on its path's first hop (l_orderkey) the IN is answered (tests/test_unit_semi_joins.py); on
    # another column its lines may belong to any customer
    sql = "SELECT COUNT(*) FROM orders JOIN customer ON o_custkey = c_custkey WHERE o_orderkey IN " \
          "(SELECT l_qty FROM lineitem)"
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(sql, _policy())
    assert e.value.details["reason"] == "semi_join" and "does not prove" in e.value.message


# --- every engine: the same plan, the answer within noise ------------------------------------------

#: tests/test_unit_path_queries.py's engine rows: customer 1's order 1 (price 10) has 3 lines,
#: customer 2's order 2 (price 20) one; an orphan line, a NULL order key and order 3 (no customer)
#: are dropped. Exact: 4 joined rows, SUM(o_price) = 3·10 + 20 = 50.
JOIN_SQL = "SELECT COUNT(*) AS n, SUM(o_price) AS p FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey"


def _answer_join(pol, tmp_path, timeout: float = 60):
    from dpgate.engine import Engine
    from dpgate.ledger import open_ledger
    from dpgate.policy import load_policies
    from dpgate.service import Gateway, QueryBudget, open_release_store

    policies = load_policies(pol)
    engine = Engine(timeout_s=timeout)
    versions = engine.load(policies)
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    gw = Gateway(policies, engine, versions, ledger, open_release_store(ledger))
    try:
        doc = gw.explain("shop", JOIN_SQL)
        rows = gw.query("shop", JOIN_SQL, consumer="analysts", budget=QueryBudget(rho=10000))["rows"]
    finally:
        gw.close()
    return doc, rows


def _check_join(doc, rows):
    assert doc["plan"]["table"] == "JOIN lineitem JOIN orders ON lineitem.l_orderkey = orders.o_orderkey"
    assert doc["join"]["tables"] == ["lineitem", "orders"]
    ((n, p),) = rows
    # ρ = 10000: σ = Δ2/√(2ρ) (Bun & Steinke 2016, Prop. 1.6): COUNT Δ2 = m·√k = 3√3 → σ ≈ 0.04;
    # SUM(o_price) Δ2 = 1000·3·√3 ≈ 5196 → σ ≈ 37, so 200 is > 5σ
    assert abs(n - 4) < 1 and abs(p - 50) < 200, rows


def test_duckdb_answers_the_join_on_the_first_hop(tmp_path):
    from test_unit_path_queries import _engine_policy, _parquet

    data = _parquet(tmp_path / "data")
    _check_join(*_answer_join(_engine_policy(tmp_path, "", lambda t: f"{data}/{t}.parquet"), tmp_path))


@pytest.mark.postgres
def test_postgres_answers_the_join_on_the_first_hop(tmp_path):
    from _engines import PG_URL, pg_load, pg_schema, pg_unavailable
    from test_unit_path_queries import _engine_policy, _engine_rows

    if pg_unavailable():
        pytest.skip(pg_unavailable())
    keys = {"customer": "c_custkey", "orders": "o_orderkey", "lineitem": "l_linekey"}
    with pg_schema() as schema:
        for name, table in _engine_rows().items():
            pg_load(schema, name, table, primary_key=keys.get(name))
        pol = _engine_policy(tmp_path, f'engine = "postgres"\nconnection = "{PG_URL}"', lambda t: f"{schema}.{t}")
        _check_join(*_answer_join(pol, tmp_path))


@pytest.mark.spark
def test_spark_answers_the_join_on_the_first_hop(tmp_path):
    from _engines import spark_unavailable
    from test_unit_path_queries import _engine_policy, _parquet

    if spark_unavailable():
        pytest.skip(spark_unavailable())
    data = _parquet(tmp_path / "data")
    _check_join(*_answer_join(_engine_policy(tmp_path, 'engine = "spark"', lambda t: f"{data}/{t}.parquet"),
                              tmp_path, timeout=180))
