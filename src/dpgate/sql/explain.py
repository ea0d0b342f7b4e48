"""Explain a query without running it: the plan, its hash, the bounded SQL template and
the sensitivities. Reads no data and charges nothing.
"""

from __future__ import annotations

from typing import Any

from dpgate.policy import DatasetPolicy
from dpgate.sensitivity import sensitivities
from dpgate.sql.bound import bounded_sql_template
from dpgate.sql.parse import parse_query


def explain_query(sql: str, policy: DatasetPolicy, *, dialect: str | None = None) -> dict[str, Any]:
    """Plan ``sql`` against ``policy`` and describe what a release would compute.

    Args:
        sql: the analyst's SQL text.
        policy: the dataset's policy.
        dialect: the SQL dialect of ``sql`` (:data:`dpgate.sql.parse.DIALECTS`; default duckdb).

    Returns:
        JSON-serialisable dict: ``dataset``, ``table``, ``canonical_sql``, ``plan_hash``,
        ``plan`` (:meth:`~dpgate.sql.plan.QueryPlan.to_dict`), ``bounded_sql`` (the
        template with the secret salt shown as ``<salt>``), ``sensitivities`` (primitive
        id → {l1, l2, linf, groups}, integer units of the primitive), ``contribution``
        (privacy unit or None for record-level, k, m, groups released), ``columns``
        (released column labels) and ``computed_keys`` (each computed group key's name,
        canonical expression, domain rule, type and domain size; empty when none).

    Raises:
        InvalidSql, UnsupportedQuery, UnknownTable, UnknownColumn: as
            :func:`~dpgate.sql.parse.parse_query` (the refusal; nothing is charged).
    """
    plan = parse_query(sql, policy, dialect=dialect)
    table = policy.table(plan.table)
    return {
        "dataset": plan.dataset,
        "table": plan.table,
        "canonical_sql": plan.canonical_sql,
        "plan_hash": plan.plan_hash,
        "columns": [o.label for o in plan.visible_outputs],
        "contribution": {
            "privacy_unit": table.privacy_unit,
            "record_level": table.record_level,
            "max_groups_per_unit": table.max_groups_per_unit,
            "max_rows_per_unit": table.max_rows_per_unit,
            "groups": plan.key_combinations(table),
        },
        "computed_keys": [
            {"name": k.name, "expression": k.expression, "rule": k.rule, "type": k.type,
             "domain_size": len(k.domain)}
            for k in plan.computed_keys
        ],
        "plan": plan.to_dict(),
        "bounded_sql": bounded_sql_template(plan, policy),
        "sensitivities": {k: v.to_dict() for k, v in sensitivities(plan, policy).items()},
    }
