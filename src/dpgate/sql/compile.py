"""The compiler: one parsed statement → the frozen, canonical :class:`~dpgate.sql.plan.QueryPlan`.

The single entry point of planning (issue 20, "compile once"; DESIGN.md, section "Compile
once"), in the order the steps run::

    compile_statement(stmt, policy)
      = size check (allow_list.MAX_NODES)
      → rewrite rules (sql.rules: CTEs inlined; the unit-path hook; per-unit subqueries;
        derived tables merged, OR-chains → IN; protected semi-joins taken out of WHERE; joins →
        one joined table; the semi-joins back as its filter, sql.unit_semi_joins)
      → allow-list of the rewritten statement (sql.allow_list)
      → resolve: the scope from the policy (sql.resolve)
      → GROUP BY keys (sql.group_keys), SELECT items and aggregates (sql.outputs,
        sql.aggregates), WHERE bound by sql.bind, HAVING / ORDER BY / LIMIT
      → the released key domain (public keys, narrowed keys, computed keys' domains)
      → primitives, the policy digest, the plan and its canonical SQL.

:func:`dpgate.sql.parse.parse_query` is the text entry (it parses the analyst's SQL with
:func:`~dpgate.sql.parse.parse_statement` and calls :func:`compile_statement`); this module
imports nothing of :mod:`dpgate.sql.parse`, so imports flow one way: parse → compile →
the steps.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from typing import Mapping

import sqlglot
from sqlglot import exp

from dpgate.errors import InvalidSql, UnsupportedQuery
from dpgate.policy import ColumnPolicy, DatasetPolicy, TablePolicy, key_domain, quote_identifier
from dpgate.sql import partition_selection as selection
from dpgate.sql.aggregates import Agg, aggregate, aggregate_label, aggregate_sql, is_aggregate_call, unparen
from dpgate.sql.allow_list import check_size, check_structure
from dpgate.sql.bind import AGGREGATES, DIALECT, plan_where_tree, snippet, unsupported
from dpgate.sql.group_keys import Keys, free_prefix, plan_group_by
from dpgate.sql.joins import rewrite_joins
from dpgate.sql.narrow import narrow_keys
from dpgate.sql.outputs import (
    Outputs,
    default_label,
    finish_expression_tree,
    finish_having_tree,
    nondeterministic,
    plan_having,
    plan_limit,
    plan_offset,
    plan_order_by,
)
from dpgate.sql.node_types import annotate, column_types_of
from dpgate.sql.parsed_shape import shaped
from dpgate.sql.per_unit import rewrite_per_unit
from dpgate.sql.plan import (
    FUNCTION_PRIMITIVES,
    AggregateOutput,
    DerivedOutput,
    DerivedValue,
    KeyOutput,
    NarrowedKey,
    OrderItem,
    Output,
    PlanTrees,
    Primitive,
    QueryPlan,
)
from dpgate.sql.quantile import QUANTILE_FUNCTIONS
from dpgate.sql.selection_query import selection_shaped
from dpgate.sql.resolve import QueryScope, resolve_from
from dpgate.sql.sources import Source, TableSource
from dpgate.sql.unit_paths import rewrite_unit_paths
from dpgate.sql.unit_semi_joins import attach_semi_joins, extract_semi_joins
from dpgate.sql.rules import MAX_NESTING, apply_statement_rules, apply_syntax_rules

#: Most key combinations (public keys × computed-key domains) one query may release: the
#: same limit as one computed key's domain (``sql.keys.MAX_DOMAIN``), so that combining keys
#: cannot get around it. Checked before the charge: a release of millions of noisy cells
#: takes minutes of sampling and makes every page that shows it heavy.
MAX_GROUPS = 100_000


def compile_statement(stmt: exp.Select, policy: DatasetPolicy) -> QueryPlan:
    """Compile one parsed SELECT into its plan against a dataset's policy.

    Args:
        stmt: the analyst's statement (:func:`dpgate.sql.parse.parse_statement`); rewritten
            in place (the caller must not reuse it).
        policy: the dataset's policy (tables, privacy unit, bounds, public keys).

    Returns:
        The frozen, canonical :class:`QueryPlan` (nothing is executed).

    Raises:
        UnsupportedQuery: a construct outside the supported subset (the message quotes it),
            or a statement nested too deeply for Python's recursion limit.
        UnknownTable, UnknownColumn: an undeclared name.
        InvalidSql: an empty SELECT list or GROUP BY.
    """
    check_size(stmt)
    try:
        stmt, policy, source = rewrite(stmt, policy)
        return plan_statement(stmt, policy, source)
    except RecursionError:  # within the nesting limits: only from a caller already very deep
        raise UnsupportedQuery(
            "the query is nested too deeply to be planned from this caller (Python's recursion "
            f"limit); every query with at most {MAX_NESTING} levels of expressions is planned from "
            "a caller up to 300 frames deep", {"reason": "nesting", "kind": "recursion",
                                               "depth": None, "max": MAX_NESTING}) from None


def rewrite(stmt: exp.Select, policy: DatasetPolicy) -> tuple[exp.Select, DatasetPolicy, Source | None]:
    """The rewrite rules, in order: the statement in the flat one-table form, the policy that
    declares its table (a virtual source's view is added to it) and that source node (None: the
    statement reads a declared table; :mod:`dpgate.sql.sources`). At most one rewrite builds a
    source: each refuses the others' sources inside its own."""
    stmt = apply_syntax_rules(stmt)  # column lists, GROUP BY ALL, LEFT, CTEs inlined, SELECT * unwrapped
    # unit-path hook (dpgate.sql.unit_paths, issue 21): the unit attached along the foreign keys
    stmt, policy, path = rewrite_unit_paths(stmt, policy)
    # per-unit hook (dpgate.sql.per_unit): FROM (SELECT unit, aggregates … GROUP BY unit)
    stmt, policy, per_unit = rewrite_per_unit(stmt, policy)
    stmt = apply_statement_rules(stmt)
    # semi-join hook (dpgate.sql.unit_semi_joins, issue 21 item 5): protected EXISTS / IN out of WHERE …
    stmt, semi = extract_semi_joins(stmt, policy)
    stmt, policy, join = rewrite_joins(stmt, policy)  # joins hook (dpgate.sql.joins): one joined table
    # … and back as the outer source's filter, once the unit of an outer row is proven to bound them
    return attach_semi_joins(stmt, policy, join or per_unit or path, semi)


def plan_statement(stmt: exp.Select, policy: DatasetPolicy, source: Source | None = None) -> QueryPlan:
    """Plan a rewritten (flat, one-table) statement: the steps after the rules; ``source`` is the
    node :func:`rewrite` built (None: the declared table the statement reads)."""
    check_size(stmt)
    check_structure(stmt)
    table, qualifiers = resolve_from(stmt, policy)
    source = source if source is not None and source.table is table else TableSource(table)
    scope = QueryScope(policy, table, qualifiers)
    if not stmt.expressions:
        raise InvalidSql("the SELECT list is empty")
    refuse_raw_rows(stmt, table)
    keys = plan_group_by(stmt, scope)
    group_by = keys.names
    outputs = _select_outputs(stmt, scope, keys)

    where_node = stmt.args.get("where")
    where_tree = plan_where_tree(where_node.this if where_node is not None else None, scope)
    where = None if where_tree is None else where_tree.sql(dialect=DIALECT, comments=False)
    having_tree, having_refs = plan_having(
        stmt.args["having"].this if stmt.args.get("having") else None, outputs
    )
    order_refs = plan_order_by(stmt, outputs)
    limit, offset = plan_limit(stmt), plan_offset(stmt)
    # selection hook (issue 15): an aggregate named only in ORDER BY counts (a keys-only
    # selection query, dpgate.sql.selection_query); checked after ORDER BY is resolved.
    _keys_only(outputs, table, group_by, raw_rows=_raw_rows(stmt, table, group_by))

    selected_keys = selection.selected_columns(table, group_by)  # issue 11 hook
    _refuse_float_selected_keys(selected_keys, table)
    where_shaped = None if where_tree is None else shaped(where_tree)  # the text's own shape
    narrowed, tuples = _released_keys(where_shaped, table, keys, selected_keys)

    outputs.check_labels()
    outputs.assign_names()
    primitives, plan_outputs, derived_trees = _primitives_and_outputs(outputs, table)
    having = finish_having_tree(having_tree, having_refs)
    referenced, values = _referenced(keys, outputs, table, where_tree)
    plan = QueryPlan(
        dataset=policy.name,
        table=table.name,
        where=where,
        group_by=tuple(group_by),
        primitives=primitives,
        outputs=plan_outputs,
        having=None if having is None else having.sql(dialect=DIALECT, comments=False),
        order_by=tuple(OrderItem(o.name, desc, nf) for o, desc, nf in order_refs),
        limit=limit,
        policy_digest=policy_digest(table, referenced, tuples),
        values=values,
        selected_keys=selected_keys,
        computed_keys=tuple(keys.computed),
        narrowed_keys=narrowed,
        offset=offset,
        source=source,
        trees=_plan_trees(where_shaped, having, plan_outputs, derived_trees, keys, outputs, table),
    )
    if offset and (table.public or selection_shaped(plan)):
        what = "a public table's rows" if table.public else "a top-k selection (keys ordered by an aggregate)"
        raise unsupported(f"OFFSET on {what} is not supported yet: drop the OFFSET", stmt.args["offset"])
    if plan.computed_keys and any(p.kind == "quantile" for p in plan.primitives):
        raise UnsupportedQuery(
            "quantiles grouped by a computed key are not supported yet: group by declared "
            "columns with public keys, or release COUNT/SUM/AVG per computed key",
            {"construct": plan.computed_keys[0].expression},
        )
    return with_canonical_sql(plan, scope, _Fragments.of(keys, derived_trees, having))


def _plan_trees(where: exp.Expression | None, having: exp.Expression | None, plan_outputs: tuple[Output, ...],
                derived: dict[str, exp.Expression], keys: Keys, outputs: Outputs, table: TablePolicy) -> PlanTrees:
    """The trees the plan's texts were generated from, in the shape DuckDB's parser gives those
    texts (:class:`~dpgate.sql.plan.PlanTrees`, :func:`~dpgate.sql.parsed_shape.parsed_shape`;
    ``where`` is shaped already). The row expressions (WHERE, computed keys, aggregated values)
    carry the static type of each node (:func:`~dpgate.sql.node_types.annotate`), which the
    renderer hands on to the engines."""
    column_type = column_types_of(table.columns)
    values = {o.derived.expression: annotate(shaped(o.derived_tree), column_type) for o in outputs.items
              if o.derived is not None and o.derived_tree is not None}
    if where is not None:
        annotate(where, column_type)
    return PlanTrees(where=where, having=None if having is None else shaped(having), values=values,
                     keys={name: annotate(shaped(tree), column_type) for name, tree in keys.trees.items()},
                     derived={o.name: shaped(derived[o.name]) for o in plan_outputs
                              if isinstance(o, DerivedOutput)})


def _raw_rows(stmt: exp.Select, table: TablePolicy, group_by: list[str]) -> bool:
    """True when the query reads a public table's rows (no GROUP BY, no aggregate)."""
    return table.public and not group_by and not has_aggregate(stmt)


def _select_outputs(stmt: exp.Select, scope: QueryScope, keys: Keys) -> Outputs:
    """The SELECT list's outputs (keys, aggregates, post-processing items), then every group
    key not selected as a hidden key output."""
    group_by = keys.names
    outputs = Outputs(scope, group_by, keys)
    raw_rows = _raw_rows(stmt, scope.table, group_by)
    for item in stmt.expressions:
        label = item.alias if isinstance(item, exp.Alias) else None
        _select_item(unparen(item.unalias()), label, scope, keys, outputs, raw_rows)
    for name in group_by:
        if not any(o.kind == "key" and o.column == name for o in outputs.items):
            outputs.add_key(name, name, hidden=True)
    return outputs


def _select_item(node: exp.Expression, label: str | None, scope: QueryScope, keys: Keys,
                 outputs: Outputs, raw_rows: bool) -> None:
    """Add one SELECT item to ``outputs`` (or refuse it)."""
    group_by = keys.names
    if isinstance(node, exp.Star) or (
        isinstance(node, exp.Column) and isinstance(node.this, exp.Star)
    ):
        raise unsupported("SELECT * is not supported: name group keys and aggregates", node)
    if isinstance(node, exp.Column):
        name = scope.resolve(node)
        if scope.is_unit(name):
            raise unsupported(
                f"selecting the privacy unit column ({name}) is never allowed", node
            )
        if name not in group_by and not raw_rows:
            raise unsupported(
                f"raw column {node.name!r} in SELECT: every non-aggregate item must be a "
                "GROUP BY key (with public keys)",
                node,
            )
        outputs.add_key(name, label or node.name)
    elif keys.match(node, scope) is not None:
        outputs.add_key(keys.match(node, scope).name, label or default_label(node))
    elif is_aggregate_call(node):
        outputs.add_agg(aggregate(node, scope), label or default_label(node))
    elif isinstance(node, exp.AggFunc):
        raise unsupported(
            f"aggregate {snippet(node)} is not supported (COUNT, SUM, AVG, VAR_POP, "
            "STDDEV_POP and their aliases are)",
            node,
        )
    elif (any(is_aggregate_call(n) for n in node.walk()) or not any(
            isinstance(n, exp.Column) for n in node.walk())) and not nondeterministic(node):
        # post-processing over released values (sql.plan.DerivedOutput), checked before the
        # charge by the gateway (dpgate.postprocess.check_postprocess_expression)
        outputs.add_expression(node, label or default_label(node))
    elif isinstance(node, exp.Func) and not node.find(*AGGREGATES):
        raise unsupported(f"function {snippet(node)} is not allowed in SELECT", node)
    else:
        raise unsupported(
            f"{snippet(node)} in SELECT: items must be group keys or aggregates (arithmetic "
            "on released values can be done after the release)",
            node,
        )


def _keys_only(outputs: Outputs, table: TablePolicy, group_by: list[str], *, raw_rows: bool) -> None:
    """A query without an aggregate: refused without GROUP BY (unless it reads a public table's
    rows); over keys without public keys, a hidden count drives partition selection."""
    if any(o.kind == "agg" for o in outputs.items):
        return
    if not selection.selected_columns(table, group_by):
        # keys only: the key combinations are public (the policy's public keys, computed keys'
        # domains, a public table's values), so the plan has no primitive and its release
        # costs nothing (service.Gateway._public_keys_release); a public table alone may also
        # be read row by row (sql/public.py). Without GROUP BY there is nothing to release.
        if not group_by and not raw_rows:
            raise UnsupportedQuery("the query computes no aggregate (COUNT, SUM, AVG, …)")
        return
    # issue 11 hook: keys only, selected privately — a hidden count of units is the
    # selection's own noisy count (no charge of its own; sql/partition_selection.py)
    agg = Agg("count", None) if table.record_level else Agg("count_distinct_unit", None)
    outputs.add_agg(agg, aggregate_label(agg, outputs.scope), hidden=True)


def _refuse_float_selected_keys(selected_keys: tuple[str, ...], table: TablePolicy) -> None:
    for n in selected_keys:
        if (col := table.find_column(n)) is not None and col.type == "float":
            # the group-choosing hash reads a float key's ordinal among its public keys
            # (sql/bound.py): without them there is none, and an exact double is a poor key
            raise UnsupportedQuery(
                f"GROUP BY {n}: a float column without public keys cannot be a group key (private "
                "partition selection takes int, text, bool and date keys); declare its public_keys, "
                "or group by a condition or a CASE with literal results over it")


def _released_keys(where: exp.Expression | None, table: TablePolicy, keys: Keys, selected_keys: tuple[str, ...]
                   ) -> tuple[tuple[NarrowedKey, ...], dict[str, tuple]]:
    """The keys narrowed by WHERE and the key tuples of several columns of one public table;
    refuses more than :data:`MAX_GROUPS` key combinations and an empty tuple set."""
    group_by = keys.names
    public_keys = [n for n in group_by if n not in selected_keys]
    # a WHERE on a key column narrows its released keys, evaluated on the public key list
    # alone (issue 24; sql/narrow.py); several columns of one public table then release the
    # table's tuples among the narrowed keys (issue 19 item 5)
    narrowed = () if table.public else narrow_keys(
        where, table, [n for n in keys.columns if n not in selected_keys])
    narrowed_of = {k.column: k for k in narrowed}

    def key_column(n: str) -> ColumnPolicy:
        col = keys.column(n, table)
        return col if n not in narrowed_of else replace(col, public_keys=narrowed_of[n].public_keys)

    domain = [] if table.public else key_domain(table, public_keys, [key_column(n) for n in public_keys])
    n_groups = math.prod(len(values) for _, values in domain)
    if n_groups > MAX_GROUPS:
        raise UnsupportedQuery(
            f"the GROUP BY releases {n_groups:,} key combinations (the product of its keys' "
            f"domains), more than {MAX_GROUPS:,}; group by fewer or coarser keys "
            "(nothing was charged)",
            {"groups": n_groups},
        )
    # several columns of one public table (issue 19 item 5): the tuples that occur in it
    tuples = {",".join(public_keys[i] for i in block): values for block, values in domain if len(block) > 1}
    for names, values in tuples.items():
        if not values:
            raise UnsupportedQuery(
                f"no row of the public table has values of {names} among their public keys: the GROUP "
                "BY would release nothing (nothing was charged)", {"columns": names.split(",")})
    return narrowed, tuples


def _primitives_and_outputs(outputs: Outputs, table: TablePolicy
                            ) -> tuple[tuple[Primitive, ...], tuple[Output, ...], dict[str, exp.Expression]]:
    """The plan's primitives (shared by the outputs that need them) and outputs, in order, and
    the canonical tree of each derived output (by name)."""
    prefix = primitive_prefix(table)
    primitives: dict[tuple[str, str | None, float | None], Primitive] = {}
    plan_outputs: list[Output] = []
    derived_trees: dict[str, exp.Expression] = {}  # derived outputs; aggregates of an expression
    for out in outputs.items:
        if out.kind == "key":
            plan_outputs.append(KeyOutput(out.name, out.column, out.hidden, out.label))
            continue
        if out.kind == "expr":
            tree = derived_trees[out.name] = finish_expression_tree(out.tree, out.refs or {})
            plan_outputs.append(DerivedOutput(out.name, tree.sql(dialect=DIALECT, comments=False),
                                              out.hidden, out.label))
            continue
        node = _AGGREGATE_NODES.get(out.function)
        if out.derived_tree is not None and node is not None:
            derived_trees[out.name] = node(this=out.derived_tree.copy())
        ids = []
        for kind in FUNCTION_PRIMITIVES[out.function]:
            column = out.column if kind not in ("count", "count_distinct_unit") else None
            alpha = out.alpha if kind == "quantile" else None
            key = (kind, column, alpha)
            if key not in primitives:
                primitives[key] = Primitive(f"{prefix}{len(primitives)}", kind, column, alpha)
            ids.append(primitives[key].id)
        plan_outputs.append(
            AggregateOutput(out.name, out.function, out.column, tuple(ids), out.hidden, out.label)
        )
    return tuple(primitives.values()), tuple(plan_outputs), derived_trees


def _referenced(keys: Keys, outputs: Outputs, table: TablePolicy, where: exp.Expression | None
                ) -> tuple[set[str], tuple[DerivedValue, ...]]:
    """Policy settings the plan depends on: columns of the final (simplified) predicate, group
    keys and aggregated columns; and the derived values the aggregates read. Read from the
    bound trees (no SQL text is parsed again)."""
    referenced = set(keys.columns) | {o.column for o in outputs.items if o.column in table.columns}
    for key in keys.computed:
        referenced.update(key.inputs)
    values: dict[str, DerivedValue] = {}
    for o in outputs.items:
        if o.derived is not None:
            values.setdefault(o.derived.expression, o.derived)
            referenced.update(o.derived_columns)
    if where is not None:
        referenced.update(c.name for c in where.find_all(exp.Column))
    return referenced, tuple(values.values())


def primitive_prefix(table: TablePolicy) -> str:
    """The prefix of the primitive ids of a plan over ``table`` (``p0``, ``p1``, …; see
    :func:`dpgate.sql.group_keys.free_prefix`)."""
    return free_prefix(table, "p")


def policy_digest(table: TablePolicy, columns: set[str], tuples: Mapping[str, tuple] | None = None) -> str:
    """A digest (SHA-256 hex) of the parts of ``table``'s policy a plan depends on: unit, k, m, a chosen per-unit sum clamp and the referenced columns' declarations (and key tuples); part of the plan hash."""
    payload = {
        "privacy_unit": table.privacy_unit,
        "max_groups_per_unit": table.max_groups_per_unit,
        "max_rows_per_unit": table.max_rows_per_unit,
        "columns": {n: table.columns[n].to_dict() for n in sorted(columns)},
    }
    if table.public:
        payload["public"] = True
    pt = getattr(table, "private_truncation", None)
    if pt is not None and pt.sum_clamps:  # issue 22 item 4: a chosen per-unit sum clamp is a bound
        payload["sum_clamps"] = [[c, t] for c, t, _ in pt.sum_clamps]
    if tuples:  # keys from several columns of one public table: the tuples released (issue 19)
        payload["key_tuples"] = {
            names: hashlib.sha256(json.dumps(values, default=str).encode()).hexdigest()
            for names, values in tuples.items()}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def has_aggregate(stmt: exp.Select) -> bool:
    """True when the SELECT list, HAVING or ORDER BY calls an aggregate."""
    parts = list(stmt.expressions) + [stmt.args.get(k) for k in ("having", "order")]
    return any(is_aggregate_call(n) or isinstance(n, exp.AggFunc)
               for part in parts if part is not None for n in part.walk())


def refuse_raw_rows(stmt: exp.Select, table: TablePolicy) -> None:
    """Refuse, before any column is resolved, a query over a protected table that has
    neither GROUP BY nor an aggregate but selects a column: it asks for rows, and rows are
    never released (a misspelt column there is still a request for rows).

    Raises:
        UnsupportedQuery: naming the first selected column.
    """
    if table.public or stmt.args.get("group") is not None or has_aggregate(stmt):
        return
    for item in stmt.expressions:
        for col in item.find_all(exp.Column):
            if isinstance(col.this, exp.Star):
                return  # SELECT t.*: its own message
            raise unsupported(
                f"raw column {col.name!r} in SELECT: the query computes no aggregate, and rows of a "
                "protected table are never released; aggregate it (COUNT, SUM, AVG, …) or GROUP BY "
                "a key with public keys",
                col,
            )


@dataclass
class _Fragments:
    """The canonical trees the canonical SQL is assembled from, so that it is not parsed back:
    computed keys and derived outputs by name, HAVING. A fragment without a tree (a quantile or
    an aggregated expression's SQL) is parsed from its text, as before."""

    trees: dict[str, exp.Expression] = field(default_factory=dict)
    having: exp.Expression | None = None

    @classmethod
    def of(cls, keys: Keys, derived: dict[str, exp.Expression], having: exp.Expression | None) -> "_Fragments":
        """The canonical-form fragments of one plan: the keys' trees, the derived outputs' trees and HAVING."""
        return cls({**keys.trees, **derived}, having)


_AGGREGATE_NODES = {"count_column": exp.Count, "sum": exp.Sum, "avg": exp.Avg,
                    "var_pop": exp.VariancePop, "stddev_pop": exp.StddevPop}


def _aggregate_tree(function: str, column: str | None, scope: QueryScope) -> exp.Expression | None:
    """The tree of :func:`~dpgate.sql.aggregates.aggregate_sql` over a declared column (None for a
    quantile or an aggregated expression: those are parsed from their text)."""
    if function == "count":
        return exp.Count(this=exp.Star())
    if function == "count_distinct_unit":
        column = scope.table.privacy_unit
    if column is None or (column not in scope.table.columns and column != scope.table.privacy_unit):
        return None
    col = exp.column(column, quoted=True)
    if function in ("count_distinct_unit", "count_distinct"):
        return exp.Count(this=exp.Distinct(expressions=[col]))
    node = _AGGREGATE_NODES.get(function)
    return None if node is None else node(this=col)


def _quantile_tree(function: str, alpha: float, column: str | None, text: str) -> exp.Expression | None:
    """The tree of :func:`~dpgate.sql.quantile.quantile_sql` (what DuckDB's parser reads from
    ``text``), or None when it would not print as ``text`` (then the text is parsed)."""
    if column is None:
        return None
    col = exp.column(column, quoted=True)
    if function in ("min", "max"):
        tree: exp.Expression = (exp.Min if function == "min" else exp.Max)(this=col)
    elif alpha == 0.5:
        tree = exp.Median(this=col)
    else:
        tree = exp.PercentileCont(this=col, expression=exp.Literal.number(repr(alpha)))
    return tree if tree.sql(dialect=DIALECT) == text else None


def with_canonical_sql(plan: QueryPlan, scope: QueryScope, fragments: _Fragments | None = None) -> QueryPlan:
    """``plan`` with its canonical SQL: a SELECT of the outputs over the table, WHERE, GROUP BY,
    HAVING (over the outputs' SQL), ORDER BY and LIMIT; assembled from ``fragments``' trees (no
    SQL text of the plan is parsed where a tree is known)."""
    fragments = fragments or _Fragments()
    exprs: dict[str, str] = {}
    trees: dict[str, exp.Expression] = {}
    key_sql = {k.name: k.expression for k in plan.computed_keys}
    for out in plan.outputs:
        if isinstance(out, KeyOutput):
            exprs[out.name] = key_sql.get(out.column) or quote_identifier(out.column)
            tree = (fragments.trees.get(out.column) if out.column in key_sql
                    else exp.column(out.column, quoted=True))
        elif isinstance(out, AggregateOutput):
            alpha = plan.primitive(out.primitives[0]).alpha if out.function in QUANTILE_FUNCTIONS else None
            exprs[out.name] = aggregate_sql(out.function, out.column, scope, alpha)
            tree = fragments.trees.get(out.name) if alpha is None else None
            if tree is None and alpha is None:
                tree = _aggregate_tree(out.function, out.column, scope)
            elif alpha is not None:
                tree = _quantile_tree(out.function, alpha, out.column, exprs[out.name])
        else:
            continue
        if tree is not None:
            trees[out.name] = tree

    def fragment(name: str) -> exp.Expression:
        tree = trees.get(name)
        return tree.copy() if tree is not None else sqlglot.parse_one(exprs[name], read=DIALECT)

    def expand(node: exp.Expression) -> exp.Expression:
        return fragment(node.name) if isinstance(node, exp.Column) and node.name in exprs else node

    for out in plan.outputs:  # post-processing items, over the others' SQL
        if isinstance(out, DerivedOutput):
            own = fragments.trees.get(out.name)
            own = own.copy() if own is not None else sqlglot.parse_one(out.expression, read=DIALECT)
            tree = own.transform(expand)
            exprs[out.name] = tree.sql(dialect=DIALECT)
            trees[out.name] = tree
    items = []
    for out in plan.visible_outputs:
        text = exprs[out.name]
        if not (isinstance(out, KeyOutput) and out.name == out.column
                and out.column not in key_sql):
            text += f" AS {quote_identifier(out.name)}"
        items.append(text)
    sql = f"SELECT {', '.join(items)} FROM {plan.source.canonical_from}"
    if plan.where:
        sql += f" WHERE {plan.where}"
    if plan.group_by:
        sql += " GROUP BY " + ", ".join(key_sql.get(c) or quote_identifier(c) for c in plan.group_by)
    if plan.having:
        tree = (fragments.having.copy() if fragments.having is not None
                else sqlglot.parse_one(plan.having, read=DIALECT))
        sql += " HAVING " + tree.transform(expand).sql(dialect=DIALECT)
    if plan.order_by:
        parts = []
        for item in plan.order_by:
            out = plan.output(item.output)
            text = quote_identifier(out.name) if not out.hidden else exprs[out.name]
            text += " DESC" if item.descending else ""
            text += " NULLS FIRST" if item.nulls_first else ""
            parts.append(text)
        sql += " ORDER BY " + ", ".join(parts)
    if plan.limit is not None:
        sql += f" LIMIT {plan.limit}"
    if plan.offset:
        sql += f" OFFSET {plan.offset}"
    return replace(plan, canonical_sql=sql)
