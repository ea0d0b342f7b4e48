"""``UNION ALL`` of aggregate queries: the branches of one release of several parts (issue 21 item 6).

``SELECT 'men' AS grp, COUNT(*) AS n FROM pums WHERE sex = 1 UNION ALL SELECT 'women', COUNT(*)
FROM pums WHERE sex = 0`` is one release whose rows are the concatenation of its parts' rows. Each
branch is planned like a standalone query (:func:`dpgate.sql.compile.compile_statement`); the
parts compose *sequentially* (zCDP ρ adds, Bun & Steinke 2016 Lemma 2.3), even when their rows are
disjoint: parallel composition needs the parts to partition the privacy units, which the planner
cannot prove from WHERE in general.

This module splits the tree (:func:`union_branches`), refuses what a union release cannot be
(``UNION`` distinct: deduplicating noisy rows is not a function of the parts' releases as
composed here; ``ORDER BY``/``LIMIT`` over the union; INTERSECT/EXCEPT), names the part of a part's
refusal (:func:`in_part`), and checks that the parts' columns match in number and type
(:func:`check_union_columns`). The union's hash (:func:`union_hash`) covers every part's plan hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from sqlglot import exp

from dpgate.errors import DpgateError, UnsupportedQuery
from dpgate.policy import DatasetPolicy
from dpgate.sql.plan import AggregateOutput, DerivedOutput, KeyOutput, QueryPlan

__all__ = ["MAX_PARTS", "PartNames", "UNION_NAMES", "check_union_columns", "in_part", "output_types", "union_branches", "union_hash"]

#: Most parts one UNION ALL release may have.
MAX_PARTS = 32


@dataclass(frozen=True)
class PartNames:
    """How refusals name a multi-part release's parts: a UNION ALL's "part 2 of 3 of the UNION ALL"
    (``details.part``), grouping sets' "grouping set 2 of 3" (``details.grouping_set``)."""

    part: str = "part"
    suffix: str = " of the UNION ALL"
    whole: str = "a UNION ALL"
    detail: str = "part"

    def of(self, i: int, n: int | None = None) -> str:
        """``part i[ of n] of the UNION ALL`` (1-based ``i``)."""
        return f"{self.part} {i}" + (f" of {n}" if n is not None else "") + self.suffix


#: The UNION ALL's names (the default).
UNION_NAMES = PartNames()


def union_branches(tree: exp.Union) -> list[exp.Select]:
    """The SELECT branches of a top-level ``UNION ALL`` tree, left to right.

    A ``WITH`` on the union is copied into every branch (each branch then inlines it like a
    standalone query). A parenthesised branch ``(SELECT …)`` is read as its SELECT.

    Raises:
        UnsupportedQuery: ``UNION`` (distinct), INTERSECT/EXCEPT, ORDER BY/LIMIT/OFFSET over the
            union, ``UNION ALL BY NAME``, a branch that is not a SELECT, more than :data:`MAX_PARTS`.
    """
    with_ = tree.args.get("with_") or tree.args.get("with")
    branches: list[exp.Select] = []

    def walk(node: exp.Expression, top: bool) -> None:
        if isinstance(node, exp.Subquery) and isinstance(node.this, (exp.Select, exp.SetOperation)) \
                and not node.args.get("alias"):
            node = node.this
        if isinstance(node, exp.SetOperation):
            if not isinstance(node, exp.Union):
                raise UnsupportedQuery(f"set operations ({node.key.upper()}) are not supported: only UNION ALL "
                                       "of aggregate queries is", {"construct": node.key.upper()})
            if node.args.get("distinct"):
                raise UnsupportedQuery(
                    "UNION (distinct) is not supported: it would deduplicate noisy rows; write UNION ALL "
                    "(one release of several parts, composed sequentially)", {"construct": "UNION", "reason": "union_distinct"})
            if node.args.get("by_name") or node.args.get("side") or node.args.get("kind") or node.args.get("on"):
                raise UnsupportedQuery("UNION ALL BY NAME (or with a side or ON) is not supported: list the "
                                       "columns in the same order in every part", {"construct": "UNION ALL BY NAME"})
            for arg in ("order", "limit", "offset"):
                if node.args.get(arg) is not None:
                    raise UnsupportedQuery(
                        f"{'ORDER BY' if arg == 'order' else arg.upper()} over a UNION ALL is not supported: the "
                        "release is the parts' rows in order; sort or cut the released rows yourself "
                        "(post-processing, free), or put ORDER BY/LIMIT inside a part",
                        {"construct": arg.upper(), "reason": "union_post_processing"})
            if not top and (node.args.get("with_") or node.args.get("with")):
                raise UnsupportedQuery("WITH inside a UNION ALL part is not supported: put it before the "
                                       "first SELECT", {"construct": "WITH"})
            walk(node.this, False)
            walk(node.expression, False)
            return
        if not isinstance(node, exp.Select):
            raise UnsupportedQuery(f"part {len(branches) + 1} of the UNION ALL is not a SELECT",
                                   {"part": len(branches) + 1})
        if with_ is not None:
            if node.args.get("with_") is not None or node.args.get("with") is not None:
                raise UnsupportedQuery("a WITH on the UNION ALL and one inside a part: write them in one WITH",
                                       {"construct": "WITH", "part": len(branches) + 1})
            node.set("with_", with_.copy())
        branches.append(node)

    walk(tree, True)
    if len(branches) > MAX_PARTS:
        raise UnsupportedQuery(f"a UNION ALL may have at most {MAX_PARTS} parts; found {len(branches)}",
                               {"parts": len(branches), "max": MAX_PARTS})
    return branches


def in_part(e: DpgateError, index: int, parts: int) -> DpgateError:
    """``e`` with "part i of n of the UNION ALL: " before its message and ``details.part = i``
    (1-based): each part's own refusal names its part."""
    prefix = f"part {index + 1} of {parts} of the UNION ALL: "
    if not e.message.startswith(prefix):
        e.message = prefix + e.message
        e.args = (e.message,)
    e.details["part"] = index + 1
    return e


def output_types(plan: QueryPlan, policy: DatasetPolicy) -> list[str]:
    """The type class of each visible output: ``number`` (aggregates, int/float keys), ``text``,
    ``bool``, ``date``, ``timestamp``, or ``any`` (a select-list expression other than a literal)."""
    table = policy.table(plan.table)
    out = []
    for o in plan.visible_outputs:
        if isinstance(o, AggregateOutput):
            out.append("number")
        elif isinstance(o, KeyOutput):
            computed = plan.computed_key(o.column)
            t = computed.type if computed is not None else table.column(o.column).type
            out.append("number" if t in ("int", "float") else t)
        elif isinstance(o, DerivedOutput):
            out.append(_literal_type(plan.derived_tree(o)))
        else:  # pragma: no cover - every output is one of the three
            out.append("any")
    return out


def _literal_type(node: exp.Expression) -> str:
    while isinstance(node, (exp.Paren, exp.Neg)):
        node = node.this
    if isinstance(node, exp.Literal):
        return "text" if node.is_string else "number"
    if isinstance(node, exp.Boolean):
        return "bool"
    return "any"


def check_union_columns(plans: Sequence[QueryPlan], policies: Sequence[DatasetPolicy],
                        names: PartNames = UNION_NAMES) -> None:
    """Refuse parts whose columns differ from the first part's in number or type class
    (:func:`output_types`; ``any`` matches every class; NULL-free SQL's compatible types).

    Raises:
        UnsupportedQuery: ``details = {"part", "reason": "union_columns", …}`` naming the part.
    """
    first = output_types(plans[0], policies[0])
    labels = [o.label or o.name for o in plans[0].visible_outputs]
    for i, (plan, policy) in enumerate(zip(plans[1:], policies[1:]), start=2):
        types = output_types(plan, policy)
        if len(types) != len(first):
            raise UnsupportedQuery(
                f"{names.of(i)} has {len(types)} columns, {names.part} 1 has {len(first)}: every {names.part} must "
                "release the same columns", {names.detail: i, "reason": "union_columns", "columns": len(types),
                                            "expected": len(first)})
        for c, (a, b) in enumerate(zip(first, types)):
            if "any" not in (a, b) and a != b:
                raise UnsupportedQuery(
                    f"column {c + 1} ({labels[c]}) of {names.of(i)} is {b}, in {names.part} 1 it is {a}: the "
                    f"{names.part}s' columns must have compatible types", {names.detail: i, "reason": "union_columns",
                                                                          "column": c + 1, "type": b, "expected": a})


def union_hash(plans: Sequence[QueryPlan]) -> str:
    """The union's plan hash: SHA-256 over its parts' plan hashes, in order (``union:`` prefix)."""
    body = "\n".join(p.plan_hash for p in plans)
    return "union:" + hashlib.sha256(body.encode()).hexdigest()
