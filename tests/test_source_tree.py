"""The source tree (issue 20 step 2; dpgate.sql.sources): one planner test per node.

Each node checks its invariants in its constructor — a node that could not be valid cannot be
built — and the plan carries it (``QueryPlan.source``, outside the canonical form): consumers
read the node, never the marked name (``JOIN …``, ``PER UNIT …``, ``UNIT PATH …``).
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from dpgate.errors import Internal, UnsupportedQuery
from dpgate.policy import ColumnPolicy, DatasetPolicy, TablePolicy
from dpgate.sql.parse import parse_query
from dpgate.sql.plan import QueryPlan
from dpgate.sql.sources import (
    JoinColumn,
    JoinCondition,
    JoinSource,
    Occurrence,
    PathStep,
    PerUnitSource,
    SourceMissing,
    TableSource,
    UnitPathSource,
    VirtualTable,
    plan_policy,
    plan_source,
)


def _table(name: str, unit: str | None, columns: dict[str, ColumnPolicy], *, k: int = 1, m: int = 1,
           public: bool = False) -> TablePolicy:
    return TablePolicy(name=name, dataset="shop", source=f"{name}.csv", privacy_unit=unit, max_groups_per_unit=k,
                       max_rows_per_unit=m, columns=MappingProxyType(columns), public=public)


ORDERS = _table("orders", "cust", {"o_key": ColumnPolicy("o_key", "int", unique=True),
                                   "price": ColumnPolicy("price", "int", 0, 100, 1)}, k=2, m=3)
LINES = _table("lines", "cust", {"l_key": ColumnPolicy("l_key", "int"), "l_text": ColumnPolicy("l_text", "text"),
                                 "qty": ColumnPolicy("qty", "int", 1, 50, 1)}, k=1, m=5)
LOOSE = _table("loose", "cust", {"o_key": ColumnPolicy("o_key", "int"), "tag": ColumnPolicy("tag", "text")})


def _side(alias: str, table: TablePolicy, column: str) -> JoinColumn:
    unit = column == table.privacy_unit
    col = table.find_column(column)
    return JoinColumn(alias=alias, written=alias, table=table.name, column=column,
                      type=col.type if col is not None else "int", declared=True, unit=unit,
                      protected=not table.public)


def _view(name: str, *, k: int, m: int, unit: str | None = "cust", public: bool = False, per_unit: bool = False
          ) -> VirtualTable:
    return VirtualTable(name=name, dataset="shop", source="", privacy_unit=unit, max_groups_per_unit=k,
                        max_rows_per_unit=m, columns=MappingProxyType({}), public=public, join_sql="SELECT 1",
                        per_unit=per_unit)


def _join(conditions, view=None) -> JoinSource:
    return JoinSource(tables=(Occurrence("orders", "orders", TableSource(ORDERS)),
                              Occurrence("lines", "lines", TableSource(LINES))),
                      conditions=tuple(conditions), view=view or _view("JOIN orders JOIN lines ON …", k=2, m=5))


# --- JoinSource -------------------------------------------------------------------------------


def test_a_join_on_the_unit_builds_with_its_unit_graph():
    node = _join([JoinCondition(_side("orders", ORDERS, "cust"), _side("lines", LINES, "cust"))])
    assert node.unit_edges == (("orders", "lines"),) and node.unit_graph.unconnected() is None
    assert node.table.max_groups_per_unit == 2 and node.table.max_rows_per_unit == 5  # the largest caps


def test_a_join_source_with_a_disconnected_unit_graph_raises():
    """Two protected tables compared only on another key (an extra key, no unit edge): one joined
    row could mix two units — the node cannot be built."""
    extra_key = JoinCondition(_side("orders", ORDERS, "o_key"), _side("lines", LINES, "l_key"))
    assert not extra_key.unit_edge
    with pytest.raises(UnsupportedQuery, match="must be joined to the other protected tables on the privacy unit"):
        _join([extra_key])


def test_a_left_joined_edge_does_not_connect_an_earlier_table():
    """c INNER-joined, reached only through LEFT-joined b: b's edge holds only where b has a row."""
    third = _table("third", "cust", {"x": ColumnPolicy("x", "int")})
    tables = (Occurrence("orders", "orders", TableSource(ORDERS)),
              Occurrence("lines", "lines", TableSource(LINES), "LEFT"),
              Occurrence("third", "third", TableSource(third)))
    conds = (JoinCondition(_side("orders", ORDERS, "cust"), _side("lines", LINES, "cust")),
             JoinCondition(_side("lines", LINES, "l_key"), _side("third", third, "x")))
    with pytest.raises(UnsupportedQuery, match="on the privacy unit"):
        JoinSource(tables=tables, conditions=conds, view=_view("JOIN …", k=2, m=5))


def test_a_mistyped_join_condition_raises():
    with pytest.raises(UnsupportedQuery, match="must have the same type") as e:
        JoinCondition(_side("orders", ORDERS, "o_key"), _side("lines", LINES, "l_text"))
    assert (e.value.details["left_type"], e.value.details["right_type"]) == ("int", "text")


def test_a_join_source_rechecks_its_conditions_types():
    """A condition made mistyped after construction (frozen: only by force) is caught by the node."""
    cond = JoinCondition(_side("orders", ORDERS, "cust"), _side("lines", LINES, "cust"))
    object.__setattr__(cond, "right", dataclasses.replace(cond.right, type="text"))
    with pytest.raises(UnsupportedQuery, match="privacy units join only when"):
        _join([cond])


def test_a_table_compared_with_none_before_it_is_a_cross_join():
    with pytest.raises(UnsupportedQuery, match="cross join"):
        _join([])


def test_a_join_view_must_match_its_tables():
    cond = JoinCondition(_side("orders", ORDERS, "cust"), _side("lines", LINES, "cust"))
    with pytest.raises(Internal):
        _join([cond], view=_view("JOIN …", k=1, m=1))  # not the largest caps
    with pytest.raises(Internal):
        _join([cond], view=_view("orders", k=2, m=5))  # not a join's canonical name


def test_the_planner_carries_the_join_source():
    policy = _policy()
    plan = parse_query("SELECT COUNT(*) FROM orders o JOIN lines l ON o.cust = l.cust", policy)
    assert isinstance(plan.source, JoinSource) and plan.table == plan.source.name
    assert [o.source.table.name for o in plan.source.tables] == ["orders", "lines"]
    assert plan.canonical_sql.endswith("FROM " + plan.table[len("JOIN "):])
    assert plan_policy(plan, policy).table(plan.table) is plan.source.table
    with pytest.raises(UnsupportedQuery, match="on the privacy unit"):  # the node's check, from SQL
        parse_query("SELECT COUNT(*) FROM orders o JOIN lines l ON o.o_key = l.l_key", policy)


# --- PerUnitSource ----------------------------------------------------------------------------


def test_a_per_unit_source_exposes_its_ranges():
    policy = _policy()
    plan = parse_query("SELECT COUNT(*), SUM(s) FROM (SELECT cust, COUNT(*) AS n, SUM(price) AS s FROM orders "
                       "GROUP BY cust) AS u WHERE n > 1", policy)
    node = plan.source
    assert isinstance(node, PerUnitSource) and node.inner.table is policy.table("orders")
    # k·m = 2·3 = 6 rows kept per unit: COUNT(*) in [1, 6], SUM(price) in [0, 6·100]
    assert node.inner_bound == 6
    assert dict(node.ranges) == {"n": "COUNT(*): [1, 6]", "s": "SUM(price): [0, 600]"}
    view = node.table
    assert (view.max_groups_per_unit, view.max_rows_per_unit, view.per_unit) == (1, 1, True)
    assert (view.column("s").lower, view.column("s").upper) == (0, 600)
    assert node.describe()["per_unit"]["columns"] == dict(node.ranges)


def test_a_per_unit_source_over_a_public_table_cannot_be_built():
    public = _table("genres", None, {"g": ColumnPolicy("g", "text")}, public=True)
    with pytest.raises(Internal):
        PerUnitSource(inner=TableSource(public), ranges=(), view=_view("PER UNIT …", k=1, m=1, unit=None,
                                                                         per_unit=True))
    with pytest.raises(Internal):  # a view of more than one row per unit
        PerUnitSource(inner=TableSource(ORDERS), ranges=(), view=_view("PER UNIT …", k=2, m=1, per_unit=True))


# --- UnitPathSource ---------------------------------------------------------------------------


ITEMS = TablePolicy(name="items", dataset="shop", source="items.csv", privacy_unit=None, max_groups_per_unit=1,
                    max_rows_per_unit=2, columns=MappingProxyType({"i_order": ColumnPolicy("i_order", "int")}))


def test_a_unit_path_source_over_a_non_unique_key_raises():
    with pytest.raises(UnsupportedQuery, match="not declared unique") as e:
        PathStep(ITEMS, "i_order", LOOSE, "o_key")
    assert e.value.details["reason"] == "unit_path"


def test_a_unit_path_source_checks_its_chain():
    step = PathStep(ITEMS, "i_order", ORDERS, "o_key")
    view = _view("UNIT PATH items", k=1, m=2)
    node = UnitPathSource(path_table=TableSource(ITEMS), steps=(step,), view=view)
    assert node.tables == ("items", "orders") and node.describe()["join"]["tables"] == ["items", "orders"]
    with pytest.raises(UnsupportedQuery, match="at least one hop"):
        UnitPathSource(path_table=TableSource(ITEMS), steps=(), view=view)
    with pytest.raises(UnsupportedQuery, match="first hop"):
        UnitPathSource(path_table=TableSource(LINES), steps=(step,), view=view)
    with pytest.raises(Internal):  # the view must keep the path table's k and m
        UnitPathSource(path_table=TableSource(ITEMS), steps=(step,), view=_view("UNIT PATH items", k=5, m=5))


# --- the plan carries its source --------------------------------------------------------------


def test_the_source_is_outside_the_plan_hash_and_documents():
    policy = _policy()
    plan = parse_query("SELECT COUNT(*) FROM orders", policy)
    assert isinstance(plan.source, TableSource) and plan.source.table is policy.table("orders")
    bare = dataclasses.replace(plan, source=None)
    assert bare == plan and bare.plan_hash == plan.plan_hash and "source" not in plan.to_dict()
    assert plan_policy(plan, policy) is policy


def test_a_deserialised_plan_gets_its_declared_tables_source_and_refuses_a_virtual_one():
    policy = _policy()
    declared = QueryPlan.from_dict(parse_query("SELECT COUNT(*) FROM orders", policy).to_dict())
    assert declared.source is None and plan_source(declared, policy) == TableSource(policy.table("orders"))
    joined = QueryPlan.from_dict(parse_query("SELECT COUNT(*) FROM orders o JOIN lines l ON o.cust = l.cust",
                                             policy).to_dict())
    with pytest.raises(SourceMissing, match="compile its SQL again"):
        plan_source(joined, policy)


POLICY = """
[dataset]
name = "shop"
population = "shoppers"

[budget]
epsilon = 1.0
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 1.0

[tables.orders]
source = "orders.csv"
privacy_unit = "cust"
max_groups_per_unit = 2
max_rows_per_unit = 3

[tables.orders.columns]
cust  = { type = "int" }
o_key = { type = "int", unique = true }
price = { type = "int", lower = 0, upper = 100 }

[tables.lines]
source = "lines.csv"
privacy_unit = "cust"
max_groups_per_unit = 1
max_rows_per_unit = 5

[tables.lines.columns]
cust  = { type = "int" }
l_key = { type = "int" }
qty   = { type = "int", lower = 1, upper = 50 }
"""


def _policy() -> DatasetPolicy:
    import tempfile
    from pathlib import Path

    from dpgate.policy import load_policy

    folder = Path(tempfile.mkdtemp(prefix="dpgate_source_tree_"))
    (folder / "shop.toml").write_text(POLICY)
    return load_policy(folder / "shop.toml")
