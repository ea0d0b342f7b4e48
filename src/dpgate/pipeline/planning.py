"""Planning one query in the gateway: the policy it is planned against, the plan, its checks and its
release strategy, once (issue 20, "Compile once"; split from :mod:`dpgate.service`).

:func:`compile_query` parses the analyst's text once, plans it, refuses what post-processing
could not evaluate, and chooses the strategy (:func:`dpgate.pipeline.strategy.choose`). Every
refusal here says that nothing was charged. :func:`with_public_table_keys` gives a public table's
columns their values as keys (read from the public data through the engine, cached per data version).
"""

from __future__ import annotations

import dataclasses
import re
from types import MappingProxyType
from typing import Any, Callable, Mapping, MutableMapping, Sequence

import numpy as np
from sqlglot import exp

from dpgate.engines.duckdb import evaluate_tableless
from dpgate.errors import DpgateError, InvalidSql, UnsupportedQuery
from dpgate.pipeline.documents import plain
from dpgate.pipeline.strategy import Part, Strategy, choose, free, union_of
from dpgate.policy import DatasetPolicy, KeyTuples
from dpgate.postprocess import check_postprocess_expression
from dpgate.sql import evaluation
from dpgate.sql.constant import refuse_constant_plan
from dpgate.sql.parse import nothing_charged, parse_query, parse_statement
from dpgate.sql.plan import AggregateOutput, DerivedOutput, KeyOutput, QueryPlan
from dpgate.sql.public import key_tuples_query, key_values_query
from dpgate.sql.selection_query import check_candidates
from dpgate.sql.semi_joins import resolve_semi_joins
from dpgate.sql.sources import plan_policy
from dpgate.sql.grouping_sets import GROUPING_SET_NAMES, grouping_set_branches, in_grouping_set
from dpgate.sql.union import UNION_NAMES, check_union_columns, in_part, union_branches, union_hash

# The planner evaluates computed keys' domains and WHERE narrowing of public keys on the policy's
# values (never on data) with the engine's semantics; it imports no engine, the pipeline passes
# DuckDB's table-less evaluator in (dpgate.sql.evaluation).
evaluation.install(evaluate_tableless)

__all__ = ["MAX_PUBLIC_TABLE_KEYS", "ValuesOf", "check_text", "compile_query", "public_values",
           "with_public_table_keys"]

#: The exact one-column answer of a public-only SELECT (:func:`public_values` bound to an engine).
ValuesOf = Callable[[exp.Select], Sequence[Any]]

#: Most distinct values of a public table's column used as its keys.
MAX_PUBLIC_TABLE_KEYS = 100_000


def compile_query(policy: DatasetPolicy, sql: str, dialect: str | None = None, *,
                  values_of: ValuesOf | None = None) -> tuple[DatasetPolicy, QueryPlan, Strategy]:
    """Plan ``sql`` once against ``policy`` (with its public tables' keys) and choose its strategy.

    A top-level ``UNION ALL`` is planned part by part (:mod:`dpgate.sql.union`): each part's
    refusal names its part; the strategy is :class:`~dpgate.pipeline.strategy.UnionAll`, the
    policy the dataset's and the plan the first part's.

    Args:
        values_of: the exact one-column answer of a public-only SELECT
            (:func:`public_values` bound to an engine): ``x IN (SELECT … FROM public_table)`` and
            ``EXISTS`` over public tables are replaced by their values (:mod:`dpgate.sql.semi_joins`);
            None leaves them to the planner's refusal.

    Returns:
        ``(policy, plan, strategy)``: the policy the plan reads (a joined table's for a join),
        the validated plan and its release strategy. Reads no protected data, charges nothing.
    Raises:
        InvalidSql, UnsupportedQuery, UnknownTable, UnknownColumn (each saying nothing was charged).
    """
    check_text(sql)
    try:
        statement = parse_statement(sql, dialect, allow_union=True)  # the analyst's text, parsed once
        branches = union_branches(statement) if isinstance(statement, exp.Union) else None
        sets = grouping_set_branches(statement)  # ROLLUP / CUBE / GROUPING SETS: one part per set
        branches = sets if sets is not None else branches
    except DpgateError as e:
        raise nothing_charged(e)
    if branches is None:
        return _compile_one(policy, sql, dialect, statement, values_of)
    parts = []
    for i, branch in enumerate(branches):  # issue 21 item 6: each part planned like a standalone query
        try:
            parts.append(Part(*_compile_one(policy, sql, dialect, branch, values_of)))
        except DpgateError as e:
            raise in_grouping_set(e, i, branch) if sets is not None else in_part(e, i, len(branches))
    try:
        names = GROUPING_SET_NAMES if sets is not None else UNION_NAMES
        check_union_columns([p.plan for p in parts], [p.policy for p in parts], names)
        union = union_of(tuple(parts), union_hash([p.plan for p in parts]), names)
    except DpgateError as e:
        raise nothing_charged(e)
    return policy, union.plan, union


def _compile_one(policy: DatasetPolicy, sql: str, dialect: str | None, statement: exp.Select,
                 values_of: ValuesOf | None = None) -> tuple[DatasetPolicy, QueryPlan, Strategy]:
    """One SELECT (the statement, or a UNION ALL part): checks, plan, strategy."""
    try:
        resolve_semi_joins(statement, policy, values_of)  # issue 21 item 5: public IN / EXISTS → values
        check_candidates(statement, policy)  # selection hook (issue 15); reads the tree only
    except DpgateError as e:
        raise nothing_charged(e)
    plan = parse_query(sql, policy, dialect=dialect, statement=statement)
    planned = plan_policy(plan, policy)  # the policy declaring the plan's source view (sql.sources)
    try:
        refuse_constant_plan(plan)
        check_derived_outputs(plan, planned)
    except DpgateError as e:
        raise nothing_charged(e)
    strategy = choose(plan, planned)  # a top-k selection's own LIMIT refusal comes first
    if plan.limit == 0 and not free(strategy):
        raise nothing_charged(UnsupportedQuery(
            "LIMIT 0 releases no row on any data: there is nothing to release (nothing was charged)",
            {"construct": "LIMIT 0"}))
    return planned, plan, strategy


def public_values(engine: Any, policy: DatasetPolicy, select: exp.Select, dialect: str | None = None
                  ) -> list[Any]:
    """The exact answer of a one-column SELECT over public tables (an IN or EXISTS subquery).

    The subquery is planned like a standalone query (:func:`_compile_one`), must be an exact public
    answer (:class:`~dpgate.pipeline.strategy.ExactPublic`), and runs as SQL generated from its plan
    (:func:`dpgate.sql.public.exact_query`), so the analyst's text never reaches the engine.

    Returns:
        The first column's values as Python values (NULL as None), in the engine's order.
    Raises:
        UnsupportedQuery: the subquery does not plan as a public-only query; ExecutionError.
    """
    from dpgate.pipeline.strategy import ExactPublic
    from dpgate.sql.public import exact_query

    select = select.copy()
    if select.args.get("distinct") is not None or (select.args.get("group") is None and not any(
            isinstance(n, exp.AggFunc) for n in select.expressions[0].walk())):
        # its distinct values, whatever the table's size (a row read is cut at MAX_PUBLIC_ROWS)
        select.set("distinct", None)
        select.set("group", exp.Group(expressions=[exp.Literal.number(1)]))
    try:
        planned, plan, strategy = _compile_one(policy, select.sql(dialect="duckdb"), dialect, select)
    except DpgateError as e:
        e.message = f"in the IN/EXISTS subquery: {e.message}"
        e.args = (e.message,)
        raise
    if not isinstance(strategy, ExactPublic):
        raise UnsupportedQuery("an IN or EXISTS subquery must read public tables only",
                               {"reason": "semi_join", "construct": select.sql(dialect="duckdb")[:200]})
    values = engine.execute(exact_query(plan, planned))
    column = plan.visible_outputs[0].name
    return [plain(v) for v in np.asarray(values[column]).tolist()]


def check_text(sql: Any) -> None:
    """Refuse an empty SQL text (InvalidSql), before anything is read."""
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidSql("the SQL text is empty")


def with_public_table_keys(engine: Any, policy: DatasetPolicy, version: str | None,
                           cache: MutableMapping[tuple[str, str], DatasetPolicy]) -> DatasetPolicy:
    """The policy with each public table's key-less text/int/bool columns keyed by their
    values, and the combinations of its key columns that occur together (issue 19 item 5).

    A public table holds nothing to protect, so its distinct values (read from the
    policy's data source, NULLs left out, at most :data:`MAX_PUBLIC_TABLE_KEYS`) are
    public keys: grouping a protected aggregate by a joined public table's column
    releases every one of them (empty groups as noisy zeros). Its distinct rows over the
    columns with public keys (at most as many; NULLs kept) are its
    :class:`~dpgate.policy.KeyTuples`: grouping by several of its columns releases those
    combinations, never the product of the columns' keys. Cached per data version.
    """
    def keyed(c) -> bool:
        return c.public_keys is not None or c.type in ("text", "int", "bool")

    targets = [t for t in policy.tables.values() if t.public and (any(
        c.public_keys is None and c.type in ("text", "int", "bool") for c in t.columns.values())
        or sum(keyed(c) for c in t.columns.values()) > 1)]
    if not targets:
        return policy
    if version is not None and (policy.name, version) in cache:
        return cache[(policy.name, version)]
    tables = dict(policy.tables)
    for t in targets:
        cols = {}
        for name, col in t.columns.items():
            if col.public_keys is None and col.type in ("text", "int", "bool"):
                values = engine.execute(key_values_query(t, name, MAX_PUBLIC_TABLE_KEYS + 1))["v"]
                keys = tuple(plain(v) for v in np.asarray(values).tolist())
                if 0 < len(keys) <= MAX_PUBLIC_TABLE_KEYS:
                    col = dataclasses.replace(col, public_keys=keys)
            cols[name] = col
        key_tuples = ()
        keyed_names = [n for n, c in cols.items() if c.public_keys is not None]
        if len(keyed_names) > 1:
            values = engine.execute(key_tuples_query(t, keyed_names, MAX_PUBLIC_TABLE_KEYS + 1))
            columns = [[plain(v) for v in np.asarray(values[n]).tolist()] for n in keyed_names]
            rows = tuple(zip(*columns)) if columns else ()
            key_tuples = (KeyTuples(tuple(keyed_names), rows if len(rows) <= MAX_PUBLIC_TABLE_KEYS else None),)
        tables[t.name] = dataclasses.replace(t, columns=MappingProxyType(cols), key_tuples=key_tuples)
    out = dataclasses.replace(policy, tables=MappingProxyType(tables))
    if version is not None:
        cache[(policy.name, version)] = out
    return out


def check_derived_outputs(plan: QueryPlan, policy: DatasetPolicy) -> None:
    """Refuse, before the charge, a select-list expression or HAVING that post-processing cannot
    evaluate, or whose CAST could fail on a noisy value.

    Each :class:`~dpgate.sql.plan.DerivedOutput` (and the HAVING) is checked by
    :func:`dpgate.postprocess.check_postprocess_expression` on zero rows with the types its
    inputs can have (group keys: their type; aggregates: int and float), the aggregates and
    the outputs derived from them marked noisy, so that a charged release never fails in
    post-processing.

    Raises:
        UnsupportedQuery: an unsupported or non-deterministic construct, a type error, or a
            plain CAST of a noisy value to a type that cannot hold it (TRY_CAST suggested).
    """
    derived = [o for o in plan.outputs if isinstance(o, DerivedOutput)]
    having = plan.having_tree() if plan.having else None
    if not derived and not _has_cast(having):
        return
    table = policy.table(plan.table)
    keys: dict[str, str] = {}
    for o in plan.outputs:
        if isinstance(o, KeyOutput):
            computed = plan.computed_key(o.column)
            keys[o.name] = computed.type if computed is not None else table.column(o.column).type
    labels = {o.name: o.label or o.name for o in plan.outputs}
    noisy = {o.name for o in plan.outputs if isinstance(o, AggregateOutput)}
    noisy |= {o.name for o in derived if any(c.name in noisy for c in plan.derived_tree(o).find_all(exp.Column))}
    try:
        for value_type in ("int", "float"):
            types = {**{o.name: value_type for o in plan.outputs if isinstance(o, AggregateOutput)}, **keys}
            for o in derived:
                check_postprocess_expression(plan.derived_tree(o), types, noisy=noisy)
            if _has_cast(having):
                # HAVING reads outputs; a derived one is a number here (the binder typed HAVING)
                check_postprocess_expression(having, {**{o.name: value_type for o in derived}, **types},
                                             noisy=noisy)
    except UnsupportedQuery as e:
        raise in_analyst_terms(e, labels) from None


def _has_cast(tree: exp.Expression | None) -> bool:
    return tree is not None and tree.find(exp.Cast) is not None


def in_analyst_terms(e: UnsupportedQuery, labels: Mapping[str, str]) -> UnsupportedQuery:
    """``e`` with the plan's output names (``"g0"``, ``"count"``) replaced by the titles the
    analyst gave them (``bin``, ``COUNT(*)``): internal names never reach a message."""
    def title(m: re.Match) -> str:
        name = m.group(1).replace('""', '"')
        return labels.get(name, m.group(0))

    quoted = re.compile(r'"((?:[^"]|"")+)"')
    details = {k: quoted.sub(title, v) if isinstance(v, str) else v for k, v in e.details.items()}
    return UnsupportedQuery(quoted.sub(title, e.message), details)
