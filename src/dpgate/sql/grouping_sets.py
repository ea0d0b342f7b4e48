"""``ROLLUP``, ``CUBE`` and ``GROUPING SETS``: one release whose parts are its grouping sets
(issue 21 item 7).

``SELECT region, week, COUNT(*) FROM t GROUP BY ROLLUP(region, week)`` is the SQL standard's
``GROUPING SETS ((region, week), (region), ())``: the rows of ``GROUP BY region, week``, then of
``GROUP BY region`` with ``week`` NULL, then the grand total with both NULL. Each grouping set is
planned as a standalone query over the same statement, and the sets are released together as a
``UNION ALL`` of those queries (:mod:`dpgate.sql.union`): every part is bounded and calibrated on its
own, the charge is the sum of the parts' costs (sequential composition: zCDP ρ adds, Bun & Steinke
2016 Lemma 2.3), and everything a ``UNION ALL`` refuses is refused here for the same reasons. The
grouping sets are not disjoint in the privacy units (every unit's rows are in every set), so
there is no parallel composition to claim.

The expansion (:func:`grouping_set_branches`) is syntactic and reads no data:

* ``GROUP BY a, ROLLUP(b, c)`` is the cross product of its items' sets, as in SQL:2003
  (``(a, b, c), (a, b), (a)``); ``CUBE(a, b)`` is every subset, largest first; a parenthesised
  list is one element (``ROLLUP((a, b), c)``); ``GROUPING SETS`` may nest ``ROLLUP``/``CUBE``.
* MySQL's and Spark's ``GROUP BY a, b WITH ROLLUP`` / ``WITH CUBE`` and Spark's ``GROUP BY a, b
  GROUPING SETS (…)`` are read as ``ROLLUP(a, b)``, ``CUBE(a, b)`` and ``GROUPING SETS (…)``.
* In the part of a set S, each select-list or HAVING reference to a grouping key outside S
  (outside aggregate arguments) becomes ``NULL`` — an output keeps its name (``NULL AS week``) —
  and ``GROUPING(k, …)`` / ``GROUPING_ID(k, …)`` becomes its integer: bit i (from the right,
  last argument lowest) is 1 where the i-th argument is not in S.
* A key is matched by its SQL text, a column also by its name where one side is unqualified, an
  ordinal (``ROLLUP(1, 2)``) or an output alias by the select-list expression it names.

Refused before anything is read (``UnsupportedQuery``, ``details.reason = "grouping_sets"``):
more than :data:`~dpgate.sql.union.MAX_PARTS` sets, a set listed twice (it would release the same
rows twice at twice the cost), ``ORDER BY``/``LIMIT``/``OFFSET`` over the sets (as over a UNION
ALL: sort the released rows yourself), ``GROUP BY ALL`` mixed with grouping sets, and grouping
sets inside a ``UNION ALL`` part, a subquery or a CTE (left to the planner's refusal).
"""

from __future__ import annotations

from itertools import combinations

from sqlglot import exp

from dpgate.errors import DpgateError, UnsupportedQuery
from dpgate.sql.union import MAX_PARTS, PartNames

__all__ = ["GROUPING_SET_NAMES", "grouping_set_branches", "in_grouping_set"]

_GROUPING = (exp.Rollup, exp.Cube, exp.GroupingSets)

#: How the union's refusals name a grouping set ("grouping set 2 of 3", ``details.grouping_set``).
GROUPING_SET_NAMES = PartNames(part="grouping set", suffix="", whole="a release of grouping sets",
                               detail="grouping_set")


def grouping_set_branches(select: exp.Expression) -> list[exp.Select] | None:
    """The standalone SELECT of each grouping set of ``select``, in the standard's order, or
    ``None`` when its GROUP BY has no ``ROLLUP``/``CUBE``/``GROUPING SETS``.

    Args:
        select: the analyst's parsed statement (not modified; each branch is a copy).

    Returns:
        One SELECT per grouping set (its GROUP BY the set's keys, absent for the empty set), with
        the keys outside the set replaced by NULL in the select list and HAVING.

    Raises:
        UnsupportedQuery: the refusals listed in the module docstring (nothing read or charged).
    """
    if not isinstance(select, exp.Select):
        return None
    group = select.args.get("group")
    items = _standard_items(group) if group is not None else []
    if not any(isinstance(i, _GROUPING) for i in items):
        return None
    if group.args.get("all"):
        raise _refusal("GROUP BY ALL with ROLLUP, CUBE or GROUPING SETS is not supported: list the keys")
    for arg, word in (("order", "ORDER BY"), ("limit", "LIMIT"), ("offset", "OFFSET")):
        if select.args.get(arg) is not None:
            raise _refusal(
                f"{word} over ROLLUP, CUBE or GROUPING SETS is not supported: the release is each grouping "
                "set's rows in order; sort or cut the released rows yourself (post-processing, free)",
                construct=word)
    sets = [()]
    for item in items:
        sets = [a + b for a in sets for b in _sets_of(item)]
    if len(sets) > MAX_PARTS:
        raise _refusal(f"these grouping sets are {len(sets)} queries; at most {MAX_PARTS} are released together",
                       sets=len(sets), max=MAX_PARTS)
    resolved = [tuple(_dedupe([_resolve(e, select) for e in s])) for s in sets]
    seen: dict[tuple[str, ...], int] = {}
    for i, keys in enumerate(resolved):
        text = tuple(sorted(_text(k) for k in keys))
        if text in seen:
            raise _refusal(f"grouping set {i + 1} repeats grouping set {seen[text] + 1}: each set is released "
                           "once (a repeated set would cost twice for the same rows)", set=i + 1)
        seen[text] = i
    every = _dedupe([k for keys in resolved for k in keys])
    return [_branch(select, written, keys, every) for written, keys in zip(
        (tuple(_dedupe(list(s))) for s in sets), resolved)]


def _standard_items(group: exp.Group) -> list[exp.Expression]:
    """The GROUP BY items in the standard's spelling: MySQL's and Spark's ``GROUP BY a, b WITH
    ROLLUP`` (``WITH CUBE``) is ``ROLLUP(a, b)`` (``CUBE(a, b)``); Hive's and Spark's ``GROUP BY a, b
    GROUPING SETS ((a), (b))`` is ``GROUPING SETS ((a), (b))`` (the listed keys only name the
    columns the sets may use, as in Spark's documentation of ``GROUP BY``)."""
    items = list(group.expressions)
    if group.args.get("grouping_sets"):
        return list(group.args["grouping_sets"])
    if group.args.get("rollup"):
        return [exp.Rollup(expressions=[i.copy() for i in items])]
    if group.args.get("cube"):
        return [exp.Cube(expressions=[i.copy() for i in items])]
    return items


def in_grouping_set(e: DpgateError, index: int, branch: exp.Select) -> DpgateError:
    """``e`` with "grouping set i (keys): " before its message and ``details.grouping_set = i``
    (1-based), so a set's own refusal names its set."""
    group = branch.args.get("group")
    keys = ", ".join(k.sql(dialect="duckdb") for k in group.expressions) if group is not None else ""
    prefix = f"grouping set {index + 1} ({keys}): "
    if not e.message.startswith(prefix):
        e.message = prefix + e.message
        e.args = (e.message,)
    e.details["grouping_set"] = index + 1
    e.details.pop("part", None)
    return e


def _refusal(message: str, construct: str = "GROUPING SETS", **details) -> UnsupportedQuery:
    return UnsupportedQuery(message, {"construct": construct, "reason": "grouping_sets", **details})


def _elements(node: exp.Expression) -> tuple[exp.Expression, ...]:
    """One element of a ROLLUP/CUBE/GROUPING SETS list: a parenthesised list is several keys."""
    if isinstance(node, exp.Tuple):
        return tuple(node.expressions)
    if isinstance(node, exp.Paren):
        return (node.this,)
    return (node,)


def _sets_of(item: exp.Expression) -> list[tuple[exp.Expression, ...]]:
    """The grouping sets of one GROUP BY item (a plain key is the one set of itself)."""
    if isinstance(item, exp.Rollup):
        parts = [_elements(e) for e in item.expressions]
        return [sum(parts[:n], ()) for n in range(len(parts), -1, -1)]
    if isinstance(item, exp.Cube):
        parts = [_elements(e) for e in item.expressions]
        if len(parts) > 5:
            raise _refusal(f"CUBE of {len(parts)} elements is {2 ** len(parts)} grouping sets; at most "
                           f"{MAX_PARTS} are released together", construct="CUBE")
        return [sum((parts[i] for i in chosen), ()) for n in range(len(parts), -1, -1)
                for chosen in combinations(range(len(parts)), n)]
    if isinstance(item, exp.GroupingSets):
        out: list[tuple[exp.Expression, ...]] = []
        for e in item.expressions:
            out.extend(_sets_of(e) if isinstance(e, _GROUPING) else [_elements(e)])
        return out
    return [(item,)]


def _resolve(key: exp.Expression, select: exp.Select) -> exp.Expression:
    """The select-list expression an ordinal or an output alias names; else the key itself."""
    projections = select.expressions
    if isinstance(key, exp.Literal) and not key.is_string and key.this.isdigit():
        n = int(key.this)
        if 1 <= n <= len(projections):
            return projections[n - 1].unalias()
    if isinstance(key, exp.Column) and not key.table:
        for p in projections:
            if isinstance(p, exp.Alias) and p.alias == key.name:
                return p.this
    return key


def _text(node: exp.Expression) -> str:
    return node.sql(dialect="duckdb", comments=False)


def _same(a: exp.Expression, b: exp.Expression) -> bool:
    if isinstance(a, exp.Column) and isinstance(b, exp.Column) and (not a.table or not b.table):
        return a.name == b.name
    return _text(a) == _text(b)


def _dedupe(keys: list[exp.Expression]) -> list[exp.Expression]:
    out: list[exp.Expression] = []
    for k in keys:
        if not any(_same(k, o) for o in out):
            out.append(k)
    return out


def _branch(select: exp.Select, written: tuple[exp.Expression, ...], keys: tuple[exp.Expression, ...],
            every: list[exp.Expression]) -> exp.Select:
    """The standalone query of one grouping set: its keys grouped, the others NULL."""
    missing = [k for k in every if not any(_same(k, s) for s in keys)]
    branch = select.copy()
    branch.set("group", exp.Group(expressions=[k.copy() for k in written]) if written else None)
    projections = []
    for p in branch.expressions:
        name = p.alias_or_name
        inner = p.unalias()
        replaced = _null_missing(inner.copy(), keys, missing, every)
        if _text(replaced) == _text(inner):
            projections.append(p)
        else:
            projections.append(exp.alias_(replaced, name or _text(inner), quoted=bool(name) and not name.islower()))
    branch.set("expressions", projections)
    having = branch.args.get("having")
    if having is not None:
        branch.set("having", exp.Having(this=_null_missing(having.this.copy(), keys, missing, every)))
    return branch


def _null_missing(node: exp.Expression, keys: tuple[exp.Expression, ...], missing: list[exp.Expression],
                  every: list[exp.Expression]) -> exp.Expression:
    """``node`` with each key in ``missing`` (outside aggregate arguments) as NULL and each
    ``GROUPING(…)``/``GROUPING_ID(…)`` as its integer for the set ``keys``.

    Raises:
        UnsupportedQuery: a GROUPING argument that is no grouping key (as DuckDB refuses it).
    """
    if isinstance(node, (exp.Grouping, exp.GroupingId)):
        bits = 0
        for arg in node.expressions:
            if not any(_same(_unparen(arg), k) for k in every):
                raise _refusal(f"GROUPING({_text(arg)}): its argument must be a key of the grouping sets",
                               construct="GROUPING")
            bits = bits * 2 + (0 if any(_same(_unparen(arg), k) for k in keys) else 1)
        return exp.Literal.number(bits)
    if isinstance(node, exp.AggFunc) or any(_same(node, k) for k in keys):
        return node  # aggregate arguments are rows; a key of the set stays whole (a % 2 with a missing)
    if any(_same(node, m) for m in missing):
        return exp.Null()
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            node.set(key, _null_missing(value, keys, missing, every))
        elif isinstance(value, list):
            node.set(key, [_null_missing(v, keys, missing, every) if isinstance(v, exp.Expression) else v
                           for v in value])
    return node


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node
