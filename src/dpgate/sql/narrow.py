"""A WHERE on a key column narrows the released keys (issue 24, item 9).

``SELECT week, COUNT(*) FROM prompts WHERE week < 4 GROUP BY week`` with public keys
``range(0, 52)`` releases weeks 0–3, not four noisy counts and 48 noisy zeros. The
released key set must never depend on the data, so the predicate is evaluated on the
*public key domain* (the policy's key list), never on rows:

* the plan's WHERE is split into its top-level conjuncts (``a AND b AND …``);
* a conjunct that references only group-by columns with public keys (declared columns:
  not computed keys, not keys chosen by partition selection) is evaluated by DuckDB —
  in memory, no table, external access off (:func:`dpgate.engines.duckdb.evaluate_tableless`,
  installed by the pipeline: :mod:`dpgate.sql.evaluation`)
  — on every combination of those columns' keys, typed as the loaded columns are; a key
  stays if some combination makes the conjunct TRUE (FALSE and NULL drop it, as WHERE
  drops rows). A conjunct over several key columns narrows each of them to the keys
  that take part in a satisfying combination (the key set stays a product of per-column
  lists);
* each column keeps the intersection over its conjuncts, in the policy's order
  (:class:`~dpgate.sql.plan.NarrowedKey` in the plan).

It is exact: the conjunct is the very text the bounded SQL's WHERE runs, on the same
values, so a dropped key is one no row can reach (every row with that key fails WHERE)
and its group would be empty — the release loses only noisy zeros. Contribution bounds
and sensitivities are unchanged (the rows are the same); ``k`` can only bind more often.
Anything else — a conjunct over a non-key column, an OR across a key and a non-key
column, a computed key, more than :data:`MAX_COMBINATIONS` combinations, a conjunct
DuckDB cannot evaluate — simply does not narrow (the full domain is released, as
before). An engine other than DuckDB that evaluated a conjunct differently could only
drop rows of a released key, never release a key outside the policy's list.

A WHERE that leaves no key of some column is refused (a release without rows), before
any charge.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import sqlglot
from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.policy import ColumnPolicy, TablePolicy, quote_identifier as q
from dpgate.sql import evaluation
from dpgate.sql.plan import NarrowedKey

__all__ = ["MAX_COMBINATIONS", "narrow_keys"]

#: Most key combinations a conjunct is evaluated on (larger products do not narrow).
MAX_COMBINATIONS = 1_000_000
_ORD = "__dpg_n"


def _conjuncts(tree: exp.Expression) -> list[exp.Expression]:
    while isinstance(tree, exp.Paren):
        tree = tree.this
    if isinstance(tree, exp.And):
        return _conjuncts(tree.this) + _conjuncts(tree.expression)
    return [tree]


def _literal(value: object, col: ColumnPolicy) -> str:
    if col.type == "text":
        return "'" + str(value).replace("'", "''") + "'"
    if col.type == "bool":
        return "TRUE" if value else "FALSE"
    if col.type == "int":
        return str(int(value))  # type: ignore[call-overload]
    return repr(float(value))  # type: ignore[arg-type]


def _relation(col: ColumnPolicy, i: int) -> str:
    """(ordinal, key) of every public key of ``col``, typed as the loaded column."""
    keys = col.public_keys
    assert keys is not None
    n, v = q(f"{_ORD}{i}"), q(col.name)
    if isinstance(keys, range):
        return (f"(SELECT range - {keys.start} AS {n}, CAST(range AS BIGINT) AS {v} "
                f"FROM range({keys.start}, {keys.stop})) AS __dpg_k{i}")
    lits = ", ".join(f"({j}, CAST({_literal(k, col)} AS {col.duckdb_type}))" for j, k in enumerate(keys))
    return f"(VALUES {lits}) AS __dpg_k{i}({n}, {v})"


def _satisfying(conjunct_sql: str, relations: tuple[str, ...]) -> tuple[frozenset[int], ...]:
    """Per relation, the ordinals of the keys taking part in a combination where the
    conjunct is TRUE, by the installed evaluator (:mod:`dpgate.sql.evaluation`). Raises
    ValueError (DuckDB failed)."""
    evaluator = evaluation.installed()
    if evaluator is None:
        evaluation.evaluate_tableless("")  # raises NoEvaluator
    return _satisfying_with(conjunct_sql, relations, evaluator)


@functools.lru_cache(maxsize=512)
def _satisfying_with(conjunct_sql: str, relations: tuple[str, ...], evaluate_tableless
                     ) -> tuple[frozenset[int], ...]:
    """:func:`_satisfying` by ``evaluate_tableless``. Cached: pure in its arguments."""
    ords = ", ".join(q(f"{_ORD}{i}") for i in range(len(relations)))
    sql = (f"SELECT DISTINCT {ords} FROM {' CROSS JOIN '.join(relations)} WHERE {conjunct_sql} "
           f"ORDER BY {ords}")
    rows, _ = evaluate_tableless(sql)
    return tuple(frozenset(int(r[i]) for r in rows) for i in range(len(relations)))


def _as_domain(col: ColumnPolicy, kept: Sequence[int]) -> tuple[tuple, range | None]:
    """The kept keys in policy order: ``(values, range)``; a range when ``col``'s keys are a
    range and the kept ordinals are contiguous (its SQL stays compact)."""
    keys = col.public_keys
    assert keys is not None
    if isinstance(keys, range) and kept and kept[-1] - kept[0] + 1 == len(kept):
        return (), range(keys.start + kept[0], keys.start + kept[-1] + 1)
    return tuple(keys[j] for j in kept), None


def narrow_keys(where: exp.Expression | str | None, table: TablePolicy, keys: Sequence[str]) -> tuple[NarrowedKey, ...]:
    """The group keys ``keys`` (declared columns with public keys) that the canonical WHERE
    ``where`` narrows, each with the public keys it keeps (module docstring).

    Args:
        where: the plan's canonical WHERE as its tree (``PlanTrees.where``: the shape DuckDB's
            parser gives the canonical text, over declared, double-quoted names), or None; a
            canonical text is parsed (callers outside the planner).
        table: the table policy (or joined/per-unit table) the query reads.
        keys: the plan's declared group-by columns that have public keys.

    Returns:
        One :class:`~dpgate.sql.plan.NarrowedKey` per column whose key set shrank, in
        ``keys`` order; empty when nothing narrows (then the plan and its hash are as before).

    Raises:
        UnsupportedQuery: the WHERE leaves a key column without any key (nothing to release).
    """
    if where is None or not keys:
        return ()
    if isinstance(where, str):
        where = sqlglot.parse_one(where, read="duckdb")
    columns: dict[str, ColumnPolicy] = {}
    for name in keys:
        col = table.find_column(name)
        if col is not None and col.public_keys is not None and col.type in ("int", "float", "text", "bool"):
            columns[name] = col
    if not columns:
        return ()
    kept: dict[str, frozenset[int]] = {}
    for conjunct in _conjuncts(where):
        refs = {c.name for c in conjunct.find_all(exp.Column)}
        if not refs or not refs <= set(columns):
            continue  # reads a non-key column (or no column): it does not narrow
        names = [n for n in columns if n in refs]
        if math.prod(len(columns[n].public_keys) for n in names) > MAX_COMBINATIONS:  # type: ignore[arg-type]
            continue
        relations = tuple(_relation(columns[n], i) for i, n in enumerate(names))
        try:
            satisfying = _satisfying(conjunct.sql(dialect="duckdb", comments=False), relations)
        except ValueError:
            continue  # DuckDB cannot evaluate it on the keys: no narrowing
        for name, ords in zip(names, satisfying):
            kept[name] = kept[name] & ords if name in kept else ords
    out = []
    for name, col in columns.items():
        if name not in kept or len(kept[name]) == len(col.public_keys):  # type: ignore[arg-type]
            continue
        if not kept[name]:
            raise UnsupportedQuery(
                f"the WHERE clause leaves no public key of group key {name!r}: the release would "
                "have no rows (the predicate was evaluated on the policy's key list, not on data)",
                {"column": name, "construct": "WHERE"})
        values, as_range = _as_domain(col, sorted(kept[name]))
        out.append(NarrowedKey(name, values, (as_range.start, as_range.stop) if as_range is not None else None))
    return tuple(out)
