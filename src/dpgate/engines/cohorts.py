"""The cohort rule, checked when a dataset's data loads (issue 23 item 1).

A population with cohorts (``[population] cohort_column``) keeps one budget per cohort, which
is sound only if every privacy unit belongs to exactly one cohort: the same declared cohort
on every row of every protected table. After an engine has loaded a dataset,
:func:`check_cohort_rule` counts the units that break the rule with one generated query per
dataset (the unit as text across the protected tables, grouped by unit) and refuses the
dataset if any does. The error gives the *number* of offending units, split by kind (in
several cohorts; with a missing or undeclared cohort), never a unit id or a cohort value.

Rows whose unit is NULL or NULL-like (:data:`~dpgate.engines.base.NULL_LIKE_UNITS`) are no
unit (the bounding rewrite drops them) and are not counted. For a record-level table every
row is its own unit: a row without a declared cohort is an offending unit.

The query is DuckDB-dialect SQL generated from the policy; each engine renders it in its
own dialect like any bounded query. Nothing here imports an engine's driver.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpgate.engines.base import NULL_LIKE_UNITS
from dpgate.errors import PolicyError
from dpgate.policy import CohortPolicy, DatasetPolicy, quote_identifier as q
from dpgate.rendered import parse_generated

__all__ = ["cohort_check_sql", "check_cohort_rule"]


def _literal(value: Any, ctype: str) -> str:
    if ctype == "bool":
        return "TRUE" if value else "FALSE"
    if ctype == "int":
        return str(int(value))
    return "'" + str(value).replace("'", "''") + "'"


def cohort_check_sql(policy: DatasetPolicy) -> str | None:
    """The counting query for ``policy`` (None without cohorts).

    Columns of its one row: ``offending`` (units breaking the rule), ``several`` (units with
    rows in two or more cohorts), ``outside`` (units with a row whose cohort is missing or not
    a declared key).
    """
    cohorts: CohortPolicy | None = getattr(policy, "cohorts", None)
    if cohorts is None:
        return None
    keys = ", ".join(_literal(k, cohorts.type) for k in cohorts.keys)
    null_like = ", ".join("'" + s + "'" for s in NULL_LIKE_UNITS)
    unit_rows, record_rows = [], []
    for table in sorted(policy.tables.values(), key=lambda t: t.name):
        if table.public:
            continue
        col = table.column(cohorts.column)
        c = q(col.name)
        if table.privacy_unit is None:
            record_rows.append(f"SELECT {c} AS __c FROM {table.relation}")
        else:
            unit_rows.append(f"SELECT CAST({q(table.privacy_unit)} AS VARCHAR) AS __u, {c} AS __c "
                             f"FROM {table.relation}")
    outside = f"CASE WHEN __c IN ({keys}) THEN 0 ELSE 1 END"
    parts = []
    if unit_rows:
        parts.append(
            "SELECT CASE WHEN COUNT(DISTINCT __c) > 1 THEN 1 ELSE 0 END AS several, "
            f"CASE WHEN COUNT(__c) < COUNT(*) OR MAX({outside}) = 1 THEN 1 ELSE 0 END AS outside "
            f"FROM ({' UNION ALL '.join(unit_rows)}) AS __r "
            f"WHERE __u IS NOT NULL AND lower(trim(__u)) NOT IN ({null_like}) "
            f"GROUP BY __u HAVING COUNT(DISTINCT __c) > 1 OR COUNT(__c) < COUNT(*) OR MAX({outside}) = 1")
    if record_rows:
        parts.append(f"SELECT 0 AS several, 1 AS outside FROM ({' UNION ALL '.join(record_rows)}) AS __s "
                     f"WHERE __c IS NULL OR {outside} = 1")
    if not parts:
        return None
    return ("SELECT COUNT(*) AS offending, COALESCE(SUM(several), 0) AS several, "
            f"COALESCE(SUM(outside), 0) AS outside FROM ({' UNION ALL '.join(parts)}) AS __o")


def check_cohort_rule(engine: Any, policy: DatasetPolicy) -> None:
    """Refuse ``policy``'s loaded data if a unit is not in exactly one declared cohort.

    Args:
        engine: the dataset's loaded engine (``execute`` of one generated SELECT).
        policy: its policy (nothing is checked without ``cohorts``).

    Raises:
        PolicyError: ``details``: dataset, cohort_column, offending, several, outside (counts).
    """
    sql = cohort_check_sql(policy)
    if sql is None:
        return
    out = engine.execute(parse_generated(sql))  # the engine package's own load-time check
    offending, several, outside = (int(np.asarray(out[k]).tolist()[0]) for k in ("offending", "several", "outside"))
    if offending == 0:
        return
    column = policy.cohorts.column  # type: ignore[union-attr]
    what = []
    if several:
        what.append(f"{several:,} in two or more cohorts")
    if outside:
        what.append(f"{outside:,} with a row whose {column!r} is missing or not one of the declared cohorts")
    raise PolicyError(
        f"dataset {policy.name!r} breaks its cohort rule: {offending:,} privacy unit(s) are not in exactly one "
        f"cohort ({'; '.join(what)}). Each unit's budget is its cohort's, so every unit must have one declared "
        f"cohort on all its rows; fix the data (or the declared cohorts) and load again. The dataset is refused",
        {"dataset": policy.name, "cohort_column": column, "offending": offending, "several": several,
         "outside": outside})
