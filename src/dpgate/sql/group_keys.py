"""GROUP BY → :class:`Keys`: declared columns (policy order) and computed keys (canonical order).

A key is a declared column (by name, SELECT alias or position) or a row expression over
declared columns whose values form a public domain (:mod:`dpgate.sql.keys`: CASE, bins,
``date_trunc``, EXTRACT…), named ``g0``, ``g1``… The privacy unit is never a key; ROLLUP, CUBE,
GROUPING SETS and GROUP BY ALL are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlglot import exp

from dpgate.errors import InvalidSql, UnknownColumn, UnknownTable, UnsupportedQuery
from dpgate.policy import ColumnPolicy, TablePolicy
from dpgate.sql.aggregates import AGGREGATES, is_aggregate_call, unparen
from dpgate.sql.bind import (
    DIALECT,
    Binder,
    canonical_columns,
    canonicalize_literals,
    number,
    real_args,
    simplify_tree,
    snippet,
    unsupported,
)
from dpgate.sql.literals import quoted_numbers
from dpgate.sql.keys import KeyDomain, canonical_date_key, derive_key_domain, width_bucket_to_case
from dpgate.sql.plan import ComputedKey
from dpgate.sql.resolve import QueryScope

@dataclass
class Keys:
    """The GROUP BY keys: declared columns (policy order), then computed keys (canonical order)."""

    columns: list[str]
    computed: list[ComputedKey]
    #: computed key name → its canonical tree (``ComputedKey.expression`` is its text)
    trees: dict[str, exp.Expression] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Every group key's name, in release order."""
        return self.columns + [k.name for k in self.computed]

    def match(self, node: exp.Expression, scope: QueryScope) -> ComputedKey | None:
        """The computed key whose expression ``node`` spells, or None."""
        if not self.computed or is_aggregate_call(node) or node.find(*AGGREGATES):
            return None
        try:
            text = key_tree(node, scope).sql(dialect=DIALECT, comments=False)
        except (UnsupportedQuery, UnknownColumn, UnknownTable):
            return None
        return next((k for k in self.computed if k.expression == text), None)

    def column(self, name: str, table: TablePolicy) -> ColumnPolicy:
        """The group key ``name`` as a column (a computed key's domain as its public keys)."""
        for k in self.computed:
            if k.name == name:
                return k.as_column()
        return table.column(name)


def refuse_key_without_public_keys(name: str, item: exp.Expression) -> None:
    """The refusal of a GROUP BY on a declared column without public keys.

    The one place where keys that the policy does not list are refused; private partition
    selection (issue 11) replaces it.

    Raises:
        UnsupportedQuery: always.
    """
    raise unsupported(
        f"GROUP BY {name} needs public keys in the policy (private partition selection "
        "is not supported yet)",
        item,
    )


def key_tree(node: exp.Expression, scope: QueryScope) -> exp.Expression:
    """A computed key's canonical tree: declared names, canonical literals, simplified.

    Raises:
        UnsupportedQuery: the expression reads the privacy unit.
        UnknownColumn, UnknownTable: an undeclared name.
    """
    for col in node.find_all(exp.Column):
        if isinstance(col.this, exp.Star):
            raise unsupported(f"{snippet(node)} is not a group key", node)
        if scope.is_unit(scope.resolve(col)):
            raise unsupported(
                f"GROUP BY {snippet(node)}: the privacy unit ({scope.resolve(col)}) may not "
                "appear in a group key",
                node,
            )
    tree = canonical_columns(width_bucket_to_case(unparen(node)), scope.resolve)
    # int_col > '40' as int_col > 40 (issue 21 item 7; sql.literals.quoted_numbers)
    tree = quoted_numbers(tree, Binder(lambda c: scope.declared(c).type).type)
    tree = canonicalize_literals(tree)
    tree = simplify_tree(tree)
    tree = canonicalize_literals(tree)
    return unparen(canonical_date_key(unparen(tree)))


def free_prefix(table: TablePolicy, letter: str) -> str:
    """The shortest ``_…_<letter>`` such that no column (nor the unit) of ``table`` is named
    ``<prefix><digits>``: generated names (``g0``, ``p1``) then never shadow a declared column."""
    names = {c.casefold() for c in table.columns}
    if table.privacy_unit:
        names.add(table.privacy_unit.casefold())
    prefix = letter
    while any(re.fullmatch(re.escape(prefix) + r"\d+", n) for n in names):
        prefix = "_" + prefix
    return prefix


def key_prefix(table: TablePolicy) -> str:
    """The prefix of the group-key output names of a plan over ``table`` (``g0``, ``g1``, …)."""
    return free_prefix(table, "g")


def listed_literals(stmt: exp.Select, tree: exp.Expression, scope: QueryScope
                    ) -> tuple[exp.Expression, ...] | None:
    """The literals a top-level WHERE conjunct of ``stmt`` restricts the computed key ``tree`` to
    (``<key> IN (lit, …)``, ``<key> = lit`` or an OR of those; the key spelled as in GROUP BY), or None.

    Several such conjuncts: their intersection (every one holds on a kept row). Only literal
    lists count: a subquery or a column on the right is not a key list (:mod:`dpgate.sql.keys`,
    rule ``listed``).
    """
    where = stmt.args.get("where")
    if where is None:
        return None
    text = tree.sql(dialect=DIALECT, comments=False)

    def conjuncts(node: exp.Expression) -> list[exp.Expression]:
        node = unparen(node)
        return [c for part in node.flatten() for c in conjuncts(part)] if isinstance(node, exp.And) else [node]

    def is_key(left: exp.Expression) -> bool:
        try:
            return key_tree(left, scope).sql(dialect=DIALECT, comments=False) == text
        except (UnsupportedQuery, UnknownColumn, UnknownTable):
            return False

    def literals(conj: exp.Expression) -> tuple[exp.Expression, ...] | None:
        """The literals ``conj`` restricts the key to: ``key IN (…)``, ``key = lit``, or an OR of those."""
        conj = unparen(conj)
        if isinstance(conj, exp.Or):
            parts = [literals(p) for p in conj.flatten()]
            return None if any(p is None for p in parts) else tuple(i for p in parts for i in p)
        if isinstance(conj, exp.In) and not conj.args.get("query") and not conj.args.get("unnest"):
            left, items = conj.this, tuple(unparen(e) for e in conj.expressions)
        elif isinstance(conj, exp.EQ):
            left, items = conj.this, (unparen(conj.expression),)
        else:
            return None
        if not items or not all(isinstance(i, (exp.Literal, exp.Null)) for i in items) or not is_key(left):
            return None
        return items

    found = [items for items in map(literals, conjuncts(where.this)) if items is not None]
    if not found:
        return None
    kept = [i for i in found[0] if all(any(i == j for j in other) for other in found[1:])]
    return tuple(kept)


def plan_group_by(stmt: exp.Select, scope: QueryScope) -> Keys:
    """The plan's GROUP BY keys (declared or computed) resolved in ``scope``; empty without GROUP BY.

    Raises: UnsupportedQuery (unsupported key expressions, ROLLUP …), UnknownColumn.
    """
    group = stmt.args.get("group")
    if group is None:
        return Keys([], [])
    extra = real_args(group) - {"expressions"}
    if extra:
        what = {"all": "GROUP BY ALL", "rollup": "ROLLUP", "cube": "CUBE",
                "grouping_sets": "GROUPING SETS"}.get(sorted(extra)[0], sorted(extra)[0].upper())
        raise UnsupportedQuery(f"{what} is not supported: list the group keys",
                               {"construct": what})
    if not group.expressions:
        raise InvalidSql("the SQL does not parse: GROUP BY needs at least one group key")
    selects = stmt.expressions
    cols: list[str] = []
    computed: dict[str, tuple[KeyDomain, exp.Expression]] = {}
    for item in group.expressions:
        if isinstance(item, (exp.Rollup, exp.Cube, exp.GroupingSets)):
            raise unsupported(f"{item.key.upper()} is supported only in the outermost SELECT (not in a subquery, "
                              "CTE or UNION ALL part): list the group keys here", item)
        target = unparen(item)
        if isinstance(target, exp.Literal) and not target.is_string:
            pos = number(target)
            if not isinstance(pos, int) or not 1 <= pos <= len(selects):
                raise unsupported(f"GROUP BY position {target.this} is not in the SELECT list",
                                   item)
            target = unparen(selects[pos - 1].unalias())
        elif isinstance(target, exp.Column) and target.args.get("table") is None:
            if scope.table.find_column(target.name) is None and not scope.is_unit(target.name):
                for s in selects:
                    if isinstance(s, exp.Alias) and s.alias.casefold() == target.name.casefold():
                        target = unparen(s.this)
                        break
        if isinstance(target, exp.Column):
            name = scope.resolve(target)
            if scope.is_unit(name):
                raise unsupported(
                    f"GROUP BY the privacy unit ({name}) is never allowed: it would release "
                    "per-unit values",
                    target,
                )
            scope.table.column(name)  # declared (UnknownColumn otherwise)
            # issue 11 hook: a key without public keys is selected privately
            # (sql/partition_selection.py); a public table's key-less columns are keyed by their values
            if name not in cols:
                cols.append(name)
            continue
        if is_aggregate_call(target) or target.find(*AGGREGATES):
            raise unsupported(f"GROUP BY {snippet(target)}: a group key cannot contain an "
                               "aggregate", target)
        tree = key_tree(target, scope)
        typer = Binder(lambda c: scope.declared(c).type)
        domain = derive_key_domain(tree, scope.table.columns, check_predicate=typer.check_predicate,
                                   shown=target, listed=listed_literals(stmt, tree, scope))
        text = domain.expression.sql(dialect=DIALECT, comments=False)
        computed.setdefault(text, (domain, target))
    order = list(scope.table.columns)
    prefix = key_prefix(scope.table)
    ordered = sorted(computed.items())
    keys = [
        ComputedKey(f"{prefix}{i}", text, d.type, d.domain, d.rule, d.inputs)
        for i, (text, (d, _)) in enumerate(ordered)
    ]
    trees = {k.name: d.expression for k, (_, (d, _)) in zip(keys, ordered)}
    return Keys(sorted(cols, key=order.index), keys, trees)

