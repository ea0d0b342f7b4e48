"""Recognise a private *selection query* (issue 15) in a validated plan.

A selection query releases keys, not values::

    SELECT key [, key2] FROM t [WHERE …] GROUP BY key [, key2]
    ORDER BY <aggregate> DESC|ASC LIMIT k

Its SELECT list holds group keys only, its one ORDER BY item is an aggregate (the *utility*),
it has a LIMIT k ≥ 1 and no HAVING. The candidates are the public key combinations of the GROUP
BY (the policy's ``public_keys``: a public candidate set, never taken from the data). The gateway
answers it with the exponential mechanism (:mod:`dpgate.selection`), releasing the k best keys
and never their scores.

Utilities: ``COUNT(*)``/``COUNT(col)``, ``COUNT(DISTINCT <unit>)`` and ``SUM(<bounded col>)``,
one noisy primitive each, whose per-candidate change by one unit is bounded by the contribution
bounds (:func:`dpgate.sensitivity.primitive_linf`). AVG, VAR and STDDEV are ratios of primitives
without a bounded sensitivity and are refused as utilities.

A query of this shape whose GROUP BY names a column *without* public keys is refused with
``details.reason = "no_public_candidates"`` (:func:`check_candidates`): selecting among keys
read from the data would release which keys exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.policy import DatasetPolicy
from dpgate.sql.plan import AggregateOutput, KeyOutput, Primitive, QueryPlan

__all__ = ["SelectionQuery", "UTILITY_FUNCTIONS", "check_candidates", "recognize"]

#: Aggregate functions accepted as a selection's utility (one noisy primitive each).
UTILITY_FUNCTIONS = ("count", "count_column", "count_distinct_unit", "sum")


@dataclass(frozen=True)
class SelectionQuery:
    """A selection query: the plan, its utility primitive, k and the direction.

    Attributes:
        plan: the validated plan (its hidden aggregate output is the utility).
        utility: the noisy primitive scored per candidate.
        function: the utility's aggregate function (``count``, ``count_column``,
            ``count_distinct_unit``, ``sum``).
        k: how many keys are released (LIMIT), 1 ≤ k ≤ number of candidates.
        descending: True for ``ORDER BY … DESC`` (the k largest), False for the k smallest.
    """

    plan: QueryPlan
    utility: Primitive
    function: str
    k: int
    descending: bool


def selection_shaped(plan: QueryPlan) -> bool:
    """True for a keys-only query ordered by an aggregate under LIMIT (a top-k selection)."""
    return _selection_shaped(plan)


def _selection_shaped(plan: QueryPlan) -> bool:
    visible = [o for o in plan.outputs if not o.hidden]
    if not visible or not all(isinstance(o, KeyOutput) for o in visible):
        return False
    if plan.limit is None or not plan.order_by:
        return False
    return any(isinstance(plan.output(o.output), AggregateOutput) for o in plan.order_by)


def recognize(plan: QueryPlan, policy: DatasetPolicy) -> SelectionQuery | None:
    """The selection query ``plan`` is, or None when it is an ordinary aggregate query.

    Args:
        plan: a validated plan (:func:`dpgate.sql.parse.parse_query`).
        policy: its dataset's policy.
    Returns:
        A :class:`SelectionQuery` when the SELECT list holds keys only and ORDER BY names an
        aggregate under a LIMIT; None otherwise.
    Raises:
        UnsupportedQuery: the shape is a selection but cannot be answered as one: HAVING,
            several ORDER BY items, a utility other than COUNT/COUNT DISTINCT unit/SUM,
            LIMIT 0 or a LIMIT above the number of candidates, or no GROUP BY.
    """
    if not _selection_shaped(plan):
        return None
    if not plan.group_by:
        raise UnsupportedQuery("a selection query needs a GROUP BY over a public candidate set",
                               {"reason": "no_public_candidates"})
    if plan.selected_keys:
        column = plan.selected_keys[0]
        raise UnsupportedQuery(
            f"a selection query picks among public candidates, and {column} has no public keys in the "
            "policy: keys read from the data would reveal which exist. Declare its public_keys (or "
            "select over a column that has them)",
            {"reason": "no_public_candidates", "column": column})
    if plan.having is not None:
        raise UnsupportedQuery("a selection query (keys only, ORDER BY an aggregate, LIMIT) takes no "
                               "HAVING: its scores are never released", {"reason": "selection_having"})
    if len(plan.order_by) != 1:
        raise UnsupportedQuery("a selection query orders by exactly one aggregate (its utility)",
                               {"reason": "selection_order_by"})
    item = plan.order_by[0]
    out = plan.output(item.output)
    assert isinstance(out, AggregateOutput)
    if out.function not in UTILITY_FUNCTIONS:
        raise UnsupportedQuery(
            f"a selection's utility must be COUNT, COUNT(DISTINCT <privacy unit>) or SUM of a bounded "
            f"column, not {out.function.upper()}: its sensitivity is not bounded by the contribution "
            "bounds (to rank averages over groups of equal size, order by SUM)",
            {"reason": "selection_utility", "function": out.function})
    candidates = plan.key_combinations(policy.table(plan.table))
    k = int(plan.limit)  # type: ignore[arg-type]
    if not 1 <= k <= candidates:
        raise UnsupportedQuery(
            f"a selection releases 1 to {candidates} keys (the candidates); LIMIT {k} is out of range",
            {"reason": "selection_limit", "limit": k, "candidates": candidates})
    return SelectionQuery(plan, plan.primitive(out.primitives[0]), out.function, k, item.descending)


def check_candidates(stmt: exp.Select, policy: DatasetPolicy) -> None:
    """Refuse a selection-shaped statement whose candidates are not public (before planning).

    Reads only the statement and the policy. A statement is selection-shaped when its SELECT
    list holds plain columns only, its ORDER BY holds an aggregate and it has a LIMIT. Each
    GROUP BY column of the FROM table must then have ``public_keys``.

    Raises:
        UnsupportedQuery: ``details = {"reason": "no_public_candidates", "column": …}``.
    """
    if stmt.args.get("limit") is None or stmt.args.get("order") is None:
        return
    if not stmt.expressions or not all(isinstance(e.unalias(), exp.Column) for e in stmt.expressions):
        return
    if not any(o.find(exp.AggFunc) is not None for o in stmt.args["order"].expressions):
        return
    source = stmt.args.get("from_") or stmt.args.get("from")
    group = stmt.args.get("group")
    if source is None or group is None or not isinstance(source.this, exp.Table) or stmt.args.get("joins"):
        return  # joins, CTEs and subqueries: the planner resolves the keys (and refuses what it must)
    table = policy.tables.get(source.this.name)
    if table is None or getattr(table, "public", False):
        return
    for item in group.expressions:
        if not isinstance(item, exp.Column):
            continue
        column = table.find_column(item.name)
        if column is None or item.name == table.privacy_unit:
            continue
        if column.public_keys is None:
            raise UnsupportedQuery(
                f"a selection query picks among public candidates, and {item.name} has no public keys "
                "in the policy: keys read from the data would reveal which exist. Declare its "
                "public_keys (or select over a column that has them)",
                {"reason": "no_public_candidates", "column": item.name},
            )
