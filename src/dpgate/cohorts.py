"""Which cohorts a query draws on, from the plan and the policy alone (issue 23 item 1).

A population with cohorts (``[population] cohort_column``, :class:`dpgate.policy.CohortPolicy`)
keeps one budget per cohort (:mod:`dpgate.ledger.cohorts`). A query is charged, in full, to
every cohort it *can* touch: every declared cohort, unless a top-level conjunct of its WHERE
reads the cohort column alone — then only the cohorts whose key satisfies that conjunct.

The conjunct is evaluated on the **public cohort keys** (the policy's), never on data: a
tableless DuckDB query over a ``VALUES`` list of the keys, each cast to the column's declared
type, with the conjunct under ``TRY`` exactly as the bounded query applies the WHERE
(:func:`dpgate.sql.bound._where`). This is sound because the engines check at load that every
row's cohort value is one of the keys exactly: a row of cohort c passes the WHERE only if the
conjunct holds for c, so a unit of a cohort that fails the conjunct contributes no row.
A conjunct is used only if it reads nothing but the cohort column; for datasets on another
engine than DuckDB only comparisons that cannot depend on the engine's collation or overflow
rules (``=``, ``<>``, ``IN``, ``NOT IN`` with literals, or any comparison of an int/bool
column) are used. Anything else — OR with other columns, ``FILTER`` clauses, joins, per-unit
subqueries — is charged to every cohort (conservative).

A declared cohort that has no units yet is still charged when a query can touch it: the
gateway never looks at the data to decide the scope. Declare a cohort when its units arrive.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Mapping

from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.policy import CohortPolicy, DatasetPolicy, TablePolicy

__all__ = ["cohort_scope", "charge_scope", "scope_signature", "population_cohorts", "release_guarantee"]

_PORTABLE = (exp.EQ, exp.NEQ, exp.In)


def _conjuncts(tree: exp.Expression) -> list[exp.Expression]:
    while isinstance(tree, exp.Paren):
        tree = tree.this
    if isinstance(tree, exp.And):
        return _conjuncts(tree.left) + _conjuncts(tree.right)
    return [tree]


def _reads_only(node: exp.Expression, column: str) -> bool:
    cols = {c.name.casefold() for c in node.find_all(exp.Column)}
    return cols == {column.casefold()}


def _portable(node: exp.Expression, cohorts: CohortPolicy) -> bool:
    """True when the conjunct means the same on every engine (see the module docstring)."""
    if cohorts.type in ("int", "bool"):
        return True
    inner = node.this if isinstance(node, exp.Not) else node
    if not isinstance(inner, _PORTABLE):
        return False
    operands = [inner.this] + (list(inner.expressions) if isinstance(inner, exp.In) else [inner.expression])
    return all(isinstance(o, (exp.Column, exp.Literal)) for o in operands if o is not None)


def _literal(value: Any, cohorts: CohortPolicy) -> str:
    if cohorts.type == "bool":
        return "TRUE" if value else "FALSE"
    if cohorts.type == "int":
        return f"CAST({int(value)} AS BIGINT)"
    return "CAST('" + str(value).replace("'", "''") + "' AS VARCHAR)"


def _satisfying(conjuncts: list[exp.Expression], cohorts: CohortPolicy) -> set[int]:
    """Indices of the cohort keys for which every conjunct is TRUE (DuckDB, no table read)."""
    from dpgate.engines.duckdb import evaluate_tableless

    col = '"' + cohorts.column.replace('"', '""') + '"'
    rows = ", ".join(f"({_literal(k, cohorts)}, {i})" for i, k in enumerate(cohorts.keys))
    preds = " AND ".join(f"TRY({c.sql(dialect='duckdb')})" for c in conjuncts)
    sql = f"SELECT __k FROM (VALUES {rows}) AS __t({col}, __k) WHERE {preds}"
    try:
        out, _ = evaluate_tableless(sql)
    except ValueError:
        return set(range(len(cohorts.keys)))  # cannot evaluate: every cohort (conservative)
    return {int(r[0]) for r in out}


def cohort_scope(policy: DatasetPolicy, plan: Any) -> tuple[str, ...] | None:
    """The cohorts (ledger names, sorted) a plan's charge draws on; None without cohorts.

    Raises:
        UnsupportedQuery: the WHERE excludes every cohort (the query could read no unit's rows:
            nothing is charged, and nothing would be learnt).
    """
    cohorts: CohortPolicy | None = getattr(policy, "cohorts", None)
    if cohorts is None:
        return None
    keep = set(range(len(cohorts.keys)))
    table = policy.table(plan.table)
    if type(table) is TablePolicy and not table.public and plan.where:  # a declared table, not a join
        import sqlglot

        tree = sqlglot.parse_one(plan.where, read="duckdb")
        usable = [c for c in _conjuncts(tree) if _reads_only(c, cohorts.column)
                  and (getattr(policy, "engine", "duckdb") == "duckdb" or _portable(c, cohorts))]
        if usable:
            keep = _satisfying(usable, cohorts)
    if not keep:
        raise UnsupportedQuery(
            f"the WHERE clause excludes every cohort of {cohorts.column!r} (declared: "
            f"{', '.join(cohorts.names[:20])}{' …' if len(cohorts.keys) > 20 else ''}), so the query reads no "
            "unit's rows; nothing was charged",
            {"reason": "no_cohort", "cohort_column": cohorts.column})
    return tuple(sorted(cohorts.key_text(cohorts.keys[i]) for i in keep))


def charge_scope(ledger: Any, policy: DatasetPolicy, plan: Any) -> tuple[str, ...] | None:
    """The cohorts a charge for ``plan`` draws on, under the rule *the ledger* enforces (it owns it):
    None when the ledger keeps one budget for the population — also while a policy file's new
    ``cohort_column`` is only drift (then the whole population is charged, which is conservative) —
    else :func:`cohort_scope`.

    Raises:
        Conflict: the ledger has a cohort column the policy does not declare (run ``dpgate caps
            show``; the cohort rule of a charged population cannot change).
        UnsupportedQuery: as :func:`cohort_scope`.
    """
    from dpgate.errors import Conflict

    column = ledger.cohort_column(policy.population) if hasattr(ledger, "cohort_column") else None
    if column is None:
        return None
    cohorts = getattr(policy, "cohorts", None)
    if cohorts is None or cohorts.column != column:
        raise Conflict(
            f"population {policy.population!r} keeps one budget per cohort of {column!r} in the ledger, but the "
            f"policy of {policy.name!r} declares {'no cohorts' if cohorts is None else repr(cohorts.column)}: "
            "declare the ledger's cohort column again (`dpgate caps show` shows the drift); nothing was charged",
            {"population": policy.population, "cohort_column": column})
    return cohort_scope(policy, plan)


def scope_signature(scope: Iterable[str] | None) -> str:
    """The cohort scope as a short text for release-cache keys ('' without cohorts), so that a
    release is served again only for the same cohorts."""
    if scope is None:
        return ""
    return "|cohorts=" + hashlib.sha256("\x1f".join(scope).encode("utf-8")).hexdigest()[:32]


def population_cohorts(policies: Mapping[str, DatasetPolicy], population: str) -> tuple[str, ...] | None:
    """Every cohort the policies of ``population`` declare (ledger names, sorted), or None when
    the population has no cohorts (proxy datasets are left out: they never charge)."""
    names: set[str] = set()
    found = False
    for policy in policies.values():
        if policy.population != population or getattr(policy, "provenance", None) is not None:
            continue
        if policy.cohorts is not None:
            found = True
            names.update(policy.cohorts.names)
    return tuple(sorted(names)) if found else None


def release_guarantee(policy: DatasetPolicy, receipt: Any) -> dict[str, Any]:
    """What a release states about renewal and cohorts (merged into its ``guarantee``).

    Without cohorts: ``{"renewal": "fixed cap, no renewal"}``. With cohorts: ``{"renewal": "per
    cohort", "cohort_column", "cohorts": the cohorts the release drew on, "statement"}``.
    """
    cohorts = getattr(policy, "cohorts", None)
    drew = list(getattr(receipt, "cohorts", None) or ())
    if cohorts is None or (receipt is not None and not drew):  # the ledger charged the whole population
        return {"renewal": "fixed cap, no renewal"}
    charged = (f"this release drew on {len(drew)} cohort(s) and was charged in full to each of them" if drew
               else "this release was not charged (it releases nothing that depends on a unit)")
    return {
        "renewal": "per cohort",
        "cohort_column": cohorts.column,
        "cohorts": drew,
        "statement": f"per cohort: the units of each cohort of {cohorts.column!r} have their own cap; {charged}",
    }
