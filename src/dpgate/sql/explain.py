"""Explain a query without running it: the plan, its hash, the bounded SQL template and
the sensitivities. Reads no data and charges nothing.

:func:`explain_query` is the planner's view from the policy alone (no data, no ledger). The
gateway's explain (:meth:`dpgate.service.Gateway.explain`, ``POST /v1/queries/explain`` and
``dpgate explain``) adds what needs the loaded data and the ledger — the keys of public
tables, the calibrated noise and the charge — and shares :func:`released_columns` and
:func:`contribution` with it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dpgate.policy import DatasetPolicy
from dpgate.sensitivity import sensitivities
from dpgate.sql.bound import bounded_sql_template
from dpgate.sql.parse import parse_query
from dpgate.sql.plan import QueryPlan
from dpgate.sql.public import exact_sql, reads_public_only, releases_public_keys_only
from dpgate.sql.quantile import histogram_sql_template
from dpgate.sql.sources import plan_policy


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
        A query with quantiles adds ``quantiles`` (primitive id → its per-candidate
        histogram SQL template); ``bounded_sql`` and ``sensitivities`` then describe its
        count/sum primitives only (None and {} when it has none). A query that reads public
        tables only is answered exactly and free: ``public`` is True, ``exact_sql`` the
        SQL of its exact answer, ``bounded_sql`` None and ``sensitivities`` {}. A keys-only
        query over public keys has ``public_keys_only`` True (no primitive: its release is
        the policy's key list, free).

    Raises:
        InvalidSql, UnsupportedQuery, UnknownTable, UnknownColumn: as
            :func:`~dpgate.sql.parse.parse_query` (the refusal; nothing is charged).
    """
    plan = parse_query(sql, policy, dialect=dialect)
    policy = plan_policy(plan, policy)  # a join, per-unit subquery or unit path: its source's view
    doc: dict[str, Any] = {
        "dataset": plan.dataset,
        "table": plan.table,
        "canonical_sql": plan.canonical_sql,
        "plan_hash": plan.plan_hash,
        "columns": released_columns(plan),
        "computed_keys": [
            {"name": k.name, "expression": k.expression, "rule": k.rule, "type": k.type,
             "domain_size": len(k.domain)}
            for k in plan.computed_keys
        ],
        "plan": plan.to_dict(),
    }
    if reads_public_only(plan, policy):
        # nothing to protect: the exact answer, free (its keys are the public table's values)
        return {**doc, "public": True, "exact_sql": exact_sql(plan, policy), "bounded_sql": None,
                "sensitivities": {}, "contribution": contribution(plan, policy)}
    quantiles = [p for p in plan.primitives if p.kind == "quantile"]
    noisy = replace(plan, primitives=tuple(p for p in plan.primitives if p.kind != "quantile")) if quantiles else plan
    doc.update({
        "contribution": contribution(plan, policy),
        "bounded_sql": bounded_sql_template(noisy, policy) if noisy.primitives else None,
        "sensitivities": ({k: v.to_dict() for k, v in sensitivities(noisy, policy).items()}
                          if noisy.primitives else {}),
    })
    if releases_public_keys_only(plan, policy):
        doc["public_keys_only"] = True  # the policy's key list: no data read, no charge
    if quantiles:
        doc["quantiles"] = {p.id: histogram_sql_template(plan, policy, p.column) for p in quantiles}
    return doc


def released_columns(plan: QueryPlan) -> list[str]:
    """The labels of the columns a release of ``plan`` has, in order."""
    return [o.label for o in plan.visible_outputs]


def contribution(plan: QueryPlan, policy: DatasetPolicy) -> dict[str, Any]:
    """How one privacy unit's contribution is bounded: ``privacy_unit`` (None when record-level
    or public), ``record_level``, ``max_groups_per_unit`` (k), ``max_rows_per_unit`` (m),
    ``groups`` (the key combinations released; None when keys are selected privately, whose
    number the data decides) and ``selected_keys`` (the group keys without public keys, chosen
    by private partition selection); ``public`` True and the bounds None for a query of public
    tables only.

    Args:
        plan: the plan.
        policy: the plan's policy (:func:`dpgate.sql.sources.plan_policy`: a join's, per-unit
            subquery's or unit path's view is a table of it).
    """
    if reads_public_only(plan, policy):
        return {"privacy_unit": None, "record_level": False, "public": True,
                "max_groups_per_unit": None, "max_rows_per_unit": None, "groups": None, "selected_keys": []}
    table = policy.table(plan.table)
    return {
        "privacy_unit": table.privacy_unit,
        "record_level": table.record_level,
        "max_groups_per_unit": table.max_groups_per_unit,
        "max_rows_per_unit": table.max_rows_per_unit,
        "groups": None if plan.selected_keys else plan.key_combinations(table, plan.public_group_by),
        "selected_keys": list(plan.selected_keys),
    }
