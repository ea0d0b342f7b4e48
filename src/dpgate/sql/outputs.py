"""The query's outputs: SELECT items, hidden keys and aggregates, post-processing items, and
the HAVING / ORDER BY / LIMIT over them.

:class:`Outputs` keeps the outputs in SELECT order, then hidden ones, resolves the
references of HAVING and ORDER BY (aliases, positions, group keys, aggregates spelt again)
and gives every output its canonical name. HAVING is type-checked by the binder
(:mod:`dpgate.sql.bind`) over the outputs' types and canonicalised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from dpgate.errors import UnknownColumn, UnknownTable, UnsupportedQuery
from dpgate.sql.aggregates import NUMERIC, Agg, aggregate, aggregate_label, is_aggregate_call, unparen
from dpgate.sql.bind import (
    DIALECT,
    Binder,
    canonicalize_literals,
    number,
    only_args,
    simplify_tree,
    snippet,
    unsupported,
)
from dpgate.sql.group_keys import Keys
from dpgate.sql.nondeterministic import NONDETERMINISTIC_FUNCTIONS
from dpgate.sql.plan import DerivedValue
from dpgate.sql.quantile import QUANTILE_FUNCTIONS, quantile_name
from dpgate.sql.resolve import QueryScope

_INT_RE = re.compile(r"^\d+$")

def default_label(node: exp.Expression) -> str:
    """A released column's default title: the item in DuckDB's spelling (as before)."""
    text = " ".join(node.sql(dialect=DIALECT, comments=False).split())
    return text if len(text) <= 200 else text[:199] + "…"


@dataclass
class Out:
    """One output column as planned: a key or an aggregate, with its column, function and label."""
    kind: str  # "key" | "agg"
    column: str | None
    function: str | None
    label: str
    hidden: bool
    name: str = ""
    alpha: float | None = None  # quantiles only
    derived: DerivedValue | None = None
    derived_columns: frozenset[str] = frozenset()  # the columns ``derived`` reads
    derived_tree: exp.Expression | None = None  # its canonical tree
    tree: exp.Expression | None = None  # kind "expr": the item over placeholder columns
    refs: dict[str, "Out"] | None = None  # kind "expr": placeholder → output


class Outputs:
    """Outputs in SELECT order, then hidden ones; resolves references from HAVING/ORDER BY."""

    def __init__(self, scope: QueryScope, group_by: list[str], keys: "Keys | None" = None) -> None:
        self.scope = scope
        self.group_by = group_by
        self.keys = keys if keys is not None else Keys(list(group_by), [])
        self.items: list[Out] = []

    def key_type(self, name: str) -> str:
        """The type of group key ``name`` (a declared column or a computed key)."""
        return self.keys.column(name, self.scope.table).type

    def add_key(self, column: str, label: str, hidden: bool = False) -> Out:
        """Append a group-key output."""
        out = Out("key", column, None, label, hidden)
        self.items.append(out)
        return out

    def add_agg(self, agg: Agg, label: str, hidden: bool = False) -> Out:
        """Append an aggregate output."""
        out = Out("agg", agg.column, agg.function, label, hidden, alpha=agg.alpha,
                   derived=agg.derived, derived_columns=agg.derived_columns, derived_tree=agg.derived_tree)
        self.items.append(out)
        return out

    def add_expression(self, node: exp.Expression, label: str, *, hidden: bool = False,
                       clause: str = "SELECT") -> Out:
        """Append a post-processing item: an expression over aggregates, group keys and
        constants (``SUM(age) * 1``, ``3``), evaluated on the released values. A hidden one
        is what an ``ORDER BY`` expression sorts by (``clause`` decides how names resolve:
        in ORDER BY, output titles first)."""
        refs: dict[str, Out] = {}

        def resolve(n: exp.Expression) -> exp.Expression:
            if is_aggregate_call(n) or isinstance(n, exp.Column):
                key = f"__out{len(refs)}"
                refs[key] = self.reference(n, clause)
                return exp.column(key, quoted=True)
            return n

        tree = node.copy().transform(resolve, copy=False)
        out = Out("expr", None, None, label, hidden, tree=tree, refs=refs)
        self.items.append(out)
        return out

    def find_agg(self, agg: Agg) -> Out:
        """The first output computing ``agg``, else a new hidden one."""
        for out in self.items:
            if (out.kind == "agg" and out.function == agg.function and out.column == agg.column
                    and out.alpha == agg.alpha):
                return out
        return self.add_agg(agg, aggregate_label(agg, self.scope), hidden=True)

    def find_key(self, column: str) -> Out:
        """The output of group key ``column``, else a new hidden one (a SELECT expression such as
        ``week + COUNT(*)`` may name a key before, or without, the key's own output; a trial found
        that this raised a KeyError, an HTTP 500)."""
        for out in self.items:
            if out.kind == "key" and out.column == column:
                return out
        return self.add_key(column, column, hidden=True)

    def by_label(self, name: str, node: exp.Expression) -> Out | None:
        """The visible output labelled ``name`` (UnsupportedQuery if ambiguous), or None."""
        hits = [o for o in self.items if not o.hidden and o.label.casefold() == name.casefold()]
        distinct = {id(o) for o in hits}
        if len(distinct) > 1:
            raise unsupported(f"output name {name!r} is ambiguous", node)
        return hits[0] if hits else None

    def reference(self, node: exp.Expression, clause: str) -> Out:
        """The output a HAVING/ORDER BY operand refers to."""
        if is_aggregate_call(node):
            return self.find_agg(aggregate(node, self.scope))
        if isinstance(node, exp.Column):
            if node.args.get("table") is None and node.args.get("db") is None:
                if clause == "ORDER BY":
                    out = self.by_label(node.name, node)
                    if out is not None:
                        return out
                col = self.scope.table.find_column(node.name)
                if col is not None and col.name in self.group_by:
                    return self.find_key(col.name)
                out = self.by_label(node.name, node)
                if out is not None:
                    return out
            name = self.scope.resolve(node)
            if name in self.group_by:
                return self.find_key(name)
            raise unsupported(
                f"{clause} can only refer to group keys and aggregates; {snippet(node)} is "
                "a raw column",
                node,
            )
        key = self.keys.match(node, self.scope)
        if key is not None:
            return self.find_key(key.name)
        raise unsupported(f"{snippet(node)} is not supported in {clause}", node)

    def check_labels(self) -> None:
        """Refuse two released columns with the same title (case-insensitive).

        A release is a table whose columns (and their accuracy entries) are keyed by
        title: two columns titled ``v`` would leave one column's accuracy reported for
        both, and a client reading the release by column title sees one of them. The same
        computation repeated under one title (``SELECT COUNT(*), COUNT(*)``,
        ``COUNT(*) AS n, COUNT(*) AS n``) is refused too (before any charge). Raises
        UnsupportedQuery naming the title.
        """
        seen: dict[str, Out] = {}
        for out in self.items:
            if out.hidden:
                continue
            if seen.setdefault(out.label.casefold(), out) is not out:
                raise UnsupportedQuery(
                    f"two output columns are named {out.label!r}: give each column of the "
                    "SELECT list its own name (an alias, AS …)",
                    {"construct": out.label},
                )

    def assign_names(self) -> None:
        """Give every output its canonical name (``count``, ``sum_x``…; ``_2``… on a clash)."""
        taken: set[str] = set()
        for out in self.items:
            if out.kind == "key":
                base = out.column
            elif out.kind == "expr":
                base = "expr"
            elif out.function in ("count",):
                base = "count"
            elif out.function == "count_distinct_unit":
                base = f"count_distinct_{self.scope.table.privacy_unit}"
            elif out.derived is not None:
                base = f"{'count' if out.function == 'count_column' else out.function}_expr"
            elif out.function == "count_column":
                base = f"count_{out.column}"
            elif out.function in QUANTILE_FUNCTIONS:
                base = quantile_name(out.function, out.alpha, out.column)
            else:
                base = f"{out.function}_{out.column}"
            name, i = base, 2
            while name.casefold() in taken:
                name = f"{base}_{i}"
                i += 1
            taken.add(name.casefold())
            out.name = name


def plan_having(
    node: exp.Expression | None, outputs: Outputs
) -> tuple[exp.Expression | None, dict[str, Out]]:
    """Type-check HAVING and resolve its operands to outputs.

    Returns a copy over Column(<placeholder>) nodes and the placeholder → output map.
    """
    if node is None:
        return None, {}
    refs: dict[str, Out] = {}

    def reference_type(n: exp.Expression) -> str:
        out = outputs.reference(n, "HAVING")
        if out.kind == "key":
            return outputs.key_type(out.column)
        return "float"

    binder = Binder(reference_type, "HAVING", is_aggregate=is_aggregate_call)
    node = as_condition(node, binder)
    binder.check_predicate(node)

    def resolve(n: exp.Expression) -> exp.Expression:
        if is_aggregate_call(n) or isinstance(n, exp.Column):
            key = f"__out{len(refs)}"
            refs[key] = outputs.reference(n, "HAVING")
            return exp.column(key, quoted=True)
        return n

    return node.copy().transform(resolve, copy=False), refs


def as_condition(node: exp.Expression, binder: Binder) -> exp.Expression:
    """``node`` with each number used as a condition spelled ``(x) <> 0``.

    SQL engines read a number in a condition as true when it is not 0 (DuckDB's
    ``HAVING married`` for an integer key ``married``, SmartNoise's test suite); the
    binder wants booleans, so an operand of AND/OR/NOT (or the whole HAVING) whose type
    is int or float is compared with 0. Same rows, one canonical form.
    """

    def fix(n: exp.Expression) -> exp.Expression:
        inner = unparen(n)
        if isinstance(inner, (exp.And, exp.Or)):
            out = inner.copy()
            out.set("this", fix(inner.this))
            out.set("expression", fix(inner.expression))
            return out
        if isinstance(inner, exp.Not):
            return exp.Not(this=fix(inner.this))
        try:
            numeric = binder.type(n) in NUMERIC
        except (UnsupportedQuery, UnknownColumn, UnknownTable):
            return n  # the binder's own check names the problem
        if numeric:
            return exp.NEQ(this=exp.Paren(this=n.copy()), expression=exp.Literal.number(0))
        return n

    return fix(node)


def nondeterministic(node: exp.Expression) -> bool:
    """True when ``node`` calls a function whose value is not a function of the release
    (random numbers, the clock: :data:`dpgate.sql.nondeterministic.NONDETERMINISTIC_FUNCTIONS`)."""
    return any(isinstance(n, exp.Func) and (n.sql_name().upper() in NONDETERMINISTIC_FUNCTIONS
                                            or str(n.name).upper() in NONDETERMINISTIC_FUNCTIONS)
               for n in node.walk())


def finish_expression(tree: exp.Expression, refs: dict[str, Out]) -> str:
    """Canonical SQL of a select-list post-processing item over output names."""
    return finish_expression_tree(tree, refs).sql(dialect=DIALECT, comments=False)


#: Aggregates whose released value is never an integer (a typed division by them is a fraction).
_FRACTION_FUNCTIONS = frozenset({"avg", "var_pop", "var_samp", "stddev_pop", "stddev_samp"}) | frozenset(
    QUANTILE_FUNCTIONS)


def _may_be_int(node: exp.Expression, refs: dict[str, Out]) -> bool:
    """Whether a post-processing operand may be an integer (conservatively: unless it is a
    fraction-valued aggregate, a decimal literal or a cast to a non-integer type)."""
    node = unparen(node)
    if isinstance(node, exp.Column) and node.name in refs:
        out = refs[node.name]
        return not (out.kind == "agg" and out.function in _FRACTION_FUNCTIONS)
    if isinstance(node, exp.Literal):
        return not node.is_string and node.this.lstrip("-").isdigit()
    if isinstance(node, exp.Cast):
        return node.to.is_type(*exp.DataType.INTEGER_TYPES)
    if isinstance(node, (exp.Div, exp.Avg)):
        return False
    return True


def refuse_typed_division(tree: exp.Expression, refs: dict[str, Out]) -> None:
    """Refuse ``a / b`` in a select-list expression when the analyst's dialect divides two
    integers as integers (sqlglot marks the ``/`` as ``typed``: PostgreSQL, T-SQL, Trino) and both
    operands may be integers (``COUNT(*) / 7`` is 144 there, not 144.86). Post-processing divides
    as DuckDB does, and the plan (its hash, its cached release) does not record the dialect, so
    such a query would be answered — and served to other dialects — as a fraction. As in WHERE and
    HAVING (:func:`dpgate.sql.bind._check_typed_division`).

    Raises:
        UnsupportedQuery: such a division, with the spellings that say what is meant.
    """
    for node in tree.find_all(exp.Div):
        if node.args.get("typed") and _may_be_int(node.this, refs) and _may_be_int(node.expression, refs):
            raise UnsupportedQuery(
                "in this dialect an integer divided by an integer is an integer (truncated), which "
                "dpgate does not compute after the release; write CAST(COUNT(*) AS DOUBLE) / 7 (or / 7.0) "
                "for a fraction, or FLOOR(CAST(… AS DOUBLE) / 7) for the integer part "
                "(nothing was charged)", {"construct": "/", "reason": "typed_division"})


def _literal_zero(node: exp.Expression) -> bool:
    """``0``, ``0.0``, ``-0``, ``(0)``, ``CAST(0 AS …)``: a divisor that is zero whatever the data."""
    while isinstance(node, (exp.Paren, exp.Neg, exp.Cast, exp.TryCast)):
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return float(node.this) == 0.0
        except ValueError:
            return False
    return False


def refuse_division_by_zero(tree: exp.Expression) -> None:
    """Refuse ``x / 0`` (and ``//``, ``%``) in a select-list expression: its value is NULL on any
    data, so paying for it buys nothing (as ``COUNT(NULL)`` and ``WHERE 1 = 0`` are refused).

    Raises:
        UnsupportedQuery: naming the division (nothing charged).
    """
    for node in tree.find_all(exp.Div, exp.IntDiv, exp.Mod):
        if _literal_zero(node.expression):
            raise UnsupportedQuery(
                f"a division by zero ({_OPERATOR[type(node)]} 0) in SELECT is NULL on any data, so there is "
                "nothing to release (nothing was charged)",
                {"construct": _OPERATOR[type(node)], "reason": "division_by_zero"})


_OPERATOR = {exp.Div: "/", exp.IntDiv: "//", exp.Mod: "%"}


def finish_expression_tree(tree: exp.Expression, refs: dict[str, Out]) -> exp.Expression:
    """The canonical tree of a select-list post-processing item over output names.

    Raises:
        UnsupportedQuery: an integer division of the analyst's dialect (:func:`refuse_typed_division`).
    """
    refuse_typed_division(tree, refs)
    refuse_division_by_zero(tree)

    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in refs:
            return exp.column(refs[node.name].name, quoted=True)
        return node

    return canonicalize_literals(tree.transform(rename, copy=True))


def finish_having(tree: exp.Expression | None, refs: dict[str, Out]) -> str | None:
    """Canonical SQL of HAVING over output names, or None (always true)."""
    tree = finish_having_tree(tree, refs)
    return None if tree is None else tree.sql(dialect=DIALECT, comments=False)


def finish_having_tree(tree: exp.Expression | None, refs: dict[str, Out]) -> exp.Expression | None:
    """The canonical tree of HAVING over output names (simplified), or None (always true)."""
    if tree is None:
        return None

    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in refs:
            return exp.column(refs[node.name].name, quoted=True)
        return node

    tree = tree.transform(rename, copy=True).transform(_grouped, copy=False)
    tree = canonicalize_literals(tree)
    tree = simplify_tree(tree)
    tree = canonicalize_literals(tree)
    if isinstance(tree, exp.Boolean) and tree.this:
        return None
    return tree


def _grouped(node: exp.Expression) -> exp.Expression:
    """An OR under an AND, or an AND/OR under a NOT, in parentheses: the analyst's grouping. The
    HAVING's resolution replaces parenthesised references by their outputs and can drop a
    ``Paren``; the canonical text (and the release, which evaluates it) must keep the meaning
    (a third session's finding: ``(n < 3 OR n > 60) AND s > 10`` read as ``n < 3 OR (…)``)."""
    if isinstance(node, exp.And):
        for key in ("this", "expression"):
            if isinstance(node.args.get(key), exp.Or):
                node.set(key, exp.Paren(this=node.args[key]))
    if isinstance(node, exp.Not) and isinstance(node.this, exp.Connector):
        node.set("this", exp.Paren(this=node.this))
    return node


def plan_order_by(stmt: exp.Select, outputs: Outputs) -> list[tuple[Out, bool, bool]]:
    """ORDER BY as post-processing: (output, descending, nulls first) per item, over the released outputs.

    Raises: UnsupportedQuery (an item that is not an output, a position out of range).
    """
    order = stmt.args.get("order")
    if order is None:
        return []
    only_args(order, {"expressions"})
    visible = [o for o in outputs.items if not o.hidden]
    items = []
    for ordered in order.expressions:
        only_args(ordered, {"this", "desc", "nulls_first"})
        node = ordered.this
        if isinstance(node, exp.Literal) and not node.is_string:
            pos = number(node)
            if not isinstance(pos, int) or not 1 <= pos <= len(visible):
                raise unsupported(f"ORDER BY position {node.this} is not in the SELECT list", node)
            out = visible[pos - 1]
        else:
            try:
                out = outputs.reference(node, "ORDER BY")
            except UnsupportedQuery:
                # an expression over outputs (CAST(educ AS INTEGER), 2 * s / n): a hidden
                # post-processing output to sort by (free; checked before the charge)
                if (isinstance(node, exp.Column) or is_aggregate_call(node) or nondeterministic(node)
                        or not isinstance(node, (exp.Binary, exp.Unary, exp.Func, exp.Paren, exp.Case))):
                    raise
                out = outputs.add_expression(node, default_label(node), hidden=True, clause="ORDER BY")
        items.append((out, bool(ordered.args.get("desc")), bool(ordered.args.get("nulls_first"))))
    return items


def plan_offset(stmt: exp.Select) -> int:
    """OFFSET's row count (0 without OFFSET): a non-negative integer literal, as LIMIT."""
    offset = stmt.args.get("offset")
    if offset is None:
        return 0
    only_args(offset, {"expression"})
    node = offset.expression
    if not (isinstance(node, exp.Literal) and not node.is_string and _INT_RE.match(str(node.this))):
        raise unsupported(f"OFFSET must be a non-negative integer literal, not {snippet(node)}", node)
    value = int(node.this)
    if value >= 2**63:
        raise unsupported("OFFSET is outside the 64-bit range", node)
    return value


def plan_limit(stmt: exp.Select) -> int | None:
    """LIMIT as post-processing: a non-negative integer literal, or None.

    Raises: UnsupportedQuery (anything else).
    """
    limit = stmt.args.get("limit")
    if limit is None:
        return None
    only_args(limit, {"expression"})
    node = limit.expression
    if not (isinstance(node, exp.Literal) and not node.is_string and _INT_RE.match(str(node.this))):
        raise unsupported(f"LIMIT must be a non-negative integer literal, not {snippet(node)}",
                           node)
    value = int(node.this)
    if value >= 2**63:
        raise unsupported("LIMIT is outside the 64-bit range", node)
    return value

