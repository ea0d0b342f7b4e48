"""The semi-join node of the source tree (issue 21 item 5): the outer rows filtered by ``[NOT] EXISTS``
(or ``IN``) over a protected table, where the subquery provably reads only the outer row's own unit.

Built by :mod:`dpgate.sql.unit_semi_joins`; this module holds the node and the proof it checks once,
when it is built (house rule 9)::

    SemiJoinSource(outer, semi_joins, view)      outer: a declared table, a unit path or a join
    SemiJoin(inner, links, negated, condition)   one subquery; links: its UnitLinks
    UnitLink(outer_table.column = inner_table.column, proof)

**The property.** For every outer row ``r`` of unit ``u`` and every inner row ``s`` the subquery
can meet, ``s`` belongs to ``u``. A :class:`UnitLink` is an equality of the correlation that proves
it from the policy alone, one of:

* ``"unit"``: the two tables' privacy units (``o_custkey = c_custkey``);
* ``"hop"``: one side's unit-path first hop to the other side's key (``l_orderkey = o_orderkey``,
  ``lineitem``'s unit being ``l_orderkey -> orders.o_orderkey -> o_custkey``): the line's unit is
  attached through exactly the one order whose (unique) key it holds, and that order is ``r``
  (or ``s``); the rest of the path must be the target's own unit declaration;
* ``"same hop"``: two rows of tables whose unit paths are the same and start with these columns
  (``l2.l_orderkey = l1.l_orderkey``): both reach the one order of that key, hence one unit;
* ``"same row"``: a column declared ``unique`` of one protected table compared with itself
  (``o2.o_orderkey = o1.o_orderkey``): ``s`` is ``r``.

A row whose path is broken (no order) has no unit: as an outer row it is dropped before bounding;
as an inner row it meets no outer row that has a unit (the equality would give it ``r``'s unit).

**Why the bounds hold.** The filter is a function of the outer row and of its own unit's rows, so
adding or removing one unit changes only that unit's outer rows (and which of them pass): the
filtered table is a neighbour of the unfiltered one in the same sense. The bounding rewrite then
runs on the filtered rows with the outer source's own k, m and clamps, unchanged — the semi-join
only removes rows — and the sensitivity is the outer query's (Dwork & Roth 2014, Def. 2.4 with a
per-unit pre-processing, Prop. 2.1; Wilson et al. 2020, PoPETs 2020(2), §3).

Refused at construction (``UnsupportedQuery``, ``details.reason = "semi_join"``): a subquery with
no link; a link that proves nothing (a non-unit, non-key column, a key that is not unique, a
path that does not start there, a public table); an outer source that is public, record-level
or a per-unit subquery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from dpgate.errors import Internal, UnsupportedQuery
from dpgate.policy import TablePolicy
from dpgate.sql.sources import _FAMILIES, PerUnitSource, Source, VirtualTable

__all__ = ["SEMI_JOIN_MARK", "UnitLink", "SemiJoin", "SemiJoinSource", "refusal"]

#: Marks a semi-join's canonical name (never a declared table name: it contains spaces).
SEMI_JOIN_MARK = "SEMI JOIN "


def refusal(message: str, construct: str = "", **details: Any) -> UnsupportedQuery:
    """The semi-join refusal (``details.reason = "semi_join"``)."""
    return UnsupportedQuery(message, {"reason": "semi_join", "construct": construct[:200], **details})


def _is_unit(t: TablePolicy, column: str) -> bool:
    return t.privacy_unit is not None and column.casefold() == t.privacy_unit.casefold()


def _first_hop(t: TablePolicy, column: str):
    up = t.unit_path
    return up.hops[0] if up is not None and up.hops[0].column.casefold() == column.casefold() else None


def _type(t: TablePolicy, column: str) -> str | None:
    c = t.find_column(column)
    return None if c is None else c.type


@dataclass(frozen=True)
class UnitLink:
    """One equality ``outer_table.outer_column = inner_table.inner_column`` of a semi-join's
    correlation that keeps the inner rows inside the outer row's unit (module docstring).

    Attributes:
        proof: ``"unit"``, ``"hop"``, ``"same hop"`` or ``"same row"`` (derived at construction).

    Raises:
        UnsupportedQuery: (at construction) the equality proves nothing, saying what would.
    """

    outer_table: TablePolicy
    outer_column: str
    inner_table: TablePolicy
    inner_column: str
    proof: str = field(init=False, default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "proof", self.prove())

    def prove(self) -> str:
        """The kind of proof (module docstring), or a refusal."""
        a, ca, b, cb = self.outer_table, self.outer_column, self.inner_table, self.inner_column
        text = f"{a.name}.{ca} = {b.name}.{cb}"
        if a.public or b.public:
            raise refusal(f"the correlation {text} compares a public table's column: it does not keep the "
                          "subquery inside one unit", text)
        if _is_unit(a, ca) and _is_unit(b, cb):
            ta, tb = _type(a, ca) or "text", _type(b, cb) or "text"
            if _FAMILIES[ta] != _FAMILIES[tb]:
                raise refusal(f"the correlation {text} compares privacy units of two types ({ta}, {tb})", text)
            return "unit"
        for p, cp, t, ct in ((a, ca, b, cb), (b, cb, a, ca)):
            hop = _first_hop(p, cp)
            if hop is not None and hop.table.casefold() == t.name.casefold() \
                    and hop.key.casefold() == ct.casefold() and _rest_is_own_unit(p, t):
                return "hop"
        ha, hb = _first_hop(a, ca), _first_hop(b, cb)
        if ha is not None and hb is not None and a.unit_path == b.unit_path:
            return "same hop"
        if a.name == b.name and ca.casefold() == cb.casefold() and not a.record_level \
                and (col := a.find_column(ca)) is not None and col.unique:
            return "same row"
        raise refusal(
            f"the correlation {text} does not prove that the subquery reads only the outer row's own privacy "
            "unit (its rows would decide other units' rows): correlate on the privacy units "
            f"({_unit_text(a)} = {_unit_text(b)}), on a unit path's first hop (a foreign key to the unique key "
            "it references), or on a key declared unique in the same table", text)


def _unit_text(t: TablePolicy) -> str:
    if t.privacy_unit is not None:
        return f"{t.name}.{t.privacy_unit}"
    return f"{t.name} (unit {t.unit_path})" if t.unit_path is not None else f"{t.name} (no privacy unit)"


def _rest_is_own_unit(path_table: TablePolicy, target: TablePolicy) -> bool:
    """The path after its first hop is ``target``'s own unit declaration: the unit column itself
    (a one-hop path) or the same remaining hops."""
    up = path_table.unit_path
    if len(up.hops) == 1:
        return target.unit_path is None and _is_unit(target, up.unit)
    return target.unit_path is not None and target.unit_path.hops == up.hops[1:] \
        and target.unit_path.unit == up.unit


@dataclass(frozen=True)
class SemiJoin:
    """One ``[NOT] EXISTS`` over one protected table (an ``IN`` arrives as its EXISTS).

    Attributes:
        inner: the declared table the subquery reads.
        links: the correlation's :class:`UnitLink` equalities (at least one).
        negated: ``NOT EXISTS``.
        condition: the subquery's SELECT as a tree (``SELECT 1 FROM inner AS … WHERE …``), its outer
            references qualified by the outer rows' alias.
        text: the subquery as the analyst wrote it (for explain and messages).
    """

    inner: TablePolicy
    links: tuple[UnitLink, ...]
    negated: bool
    condition: exp.Select
    text: str

    def __post_init__(self) -> None:
        if not self.links:
            raise refusal("the subquery over a protected table is not correlated on an equality that keeps it "
                          "inside the outer row's privacy unit", self.text)
        if self.inner.public or any(link.inner_table is not self.inner for link in self.links):
            raise Internal("a semi-join's links name its protected inner table")

    def tree(self) -> exp.Expression:
        """``[NOT] EXISTS (subquery)``."""
        node: exp.Expression = exp.Exists(this=self.condition.copy())
        return exp.Not(this=node) if self.negated else node


@dataclass(frozen=True)
class SemiJoinSource(Source):
    """The outer source's rows that pass every :class:`SemiJoin` (module docstring).

    Attributes:
        outer: the source of the outer rows (a declared table, a unit path or a join).
        semi_joins: the filters, in the order written.
        view: the :class:`VirtualTable` of the rows: the outer view's columns, unit, k and m.

    Raises:
        UnsupportedQuery: (at construction) an outer source that is public, record-level or a
            per-unit subquery; a link whose outer table is not read by the outer source.
        Internal: the view does not match the outer source.
    """

    outer: Source
    semi_joins: tuple[SemiJoin, ...]
    view: VirtualTable

    def __post_init__(self) -> None:
        t, v = self.outer.table, self.view
        first = self.semi_joins[0].text if self.semi_joins else ""
        if isinstance(self.outer, PerUnitSource):
            raise refusal("an EXISTS or IN over a protected table cannot filter a per-unit subquery's rows: "
                          "filter the inner query's rows instead", first)
        if t.public or t.record_level:
            raise refusal(f"an EXISTS or IN over a protected table cannot filter the rows of {t.name!r}, which "
                          "has no privacy unit: its rows would be decided by protected rows of any unit", first)
        if not self.semi_joins:
            raise Internal("a semi-join source has at least one semi-join")
        if (v.privacy_unit, v.max_groups_per_unit, v.max_rows_per_unit, v.public) != (
                t.privacy_unit, t.max_groups_per_unit, t.max_rows_per_unit, False) \
                or dict(v.columns) != dict(t.columns) or not v.name.startswith(SEMI_JOIN_MARK):
            raise Internal("a semi-join's view has its outer source's columns, unit, k and m")

    @property
    def table(self) -> VirtualTable:
        """The filtered rows' view."""
        return self.view

    @property
    def canonical_from(self) -> str:
        """``(SELECT * FROM <outer> WHERE [NOT] EXISTS (…)) AS semi`` (the canonical SQL's FROM)."""
        conds = " AND ".join(s.tree().sql(dialect="duckdb") for s in self.semi_joins)
        return f"(SELECT * FROM {self.outer.canonical_from} AS __dpg_outer WHERE {conds})"

    def describe(self) -> dict[str, Any]:
        """The outer source's description with a ``semi_join`` section."""
        out = dict(self.outer.describe())
        out["semi_join"] = {
            "subqueries": [s.text for s in self.semi_joins],
            "correlation": [f"{k.outer_table.name}.{k.outer_column} = {k.inner_table.name}.{k.inner_column} "
                            f"({k.proof})" for s in self.semi_joins for k in s.links],
            "bounding": ("the subqueries read only the outer row's own unit (proven from the policy), so they "
                         "filter rows before bounding; k, m and the clamps are the outer table's, unchanged")}
        return out
