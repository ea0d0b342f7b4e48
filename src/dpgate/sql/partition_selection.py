"""Private partition selection, plan side (issue 11; DESIGN.md "SQL the gateway answers").

A GROUP BY column without public keys in the policy is a *selected key*: its
values are not enumerated from the policy but chosen from the data by private
partition selection (Wilson et al. 2020, "Differentially private SQL with bounded
user contribution", PoPETs 2020(2), §4.2; Rogers 2023, arXiv:2309.09170):

1. the bounding rewrite (:mod:`dpgate.sql.bound`) keeps at most k groups per
   privacy unit (always ranked by the secret salt: the key domain is unknown);
2. per *candidate* (a tuple of selected-key values seen in the kept partials),
   the number of distinct units — each unit counts at most once per candidate and
   in at most k candidates, so the histogram's (ℓ0, ℓ2, ℓ∞) distance is
   (k, √k, 1);
3. OpenDP's threshold mechanism (:func:`dpgate.mechanisms.selection.threshold_select`)
   noises those counts and keeps the candidates whose noisy count exceeds T;
4. the released rows are the kept candidates × every combination of the public
   keys (public part enumerated, the rest selected), with the plan's primitives
   noised as for public keys with k groups per unit.

NULL is a key value like any other (grouped by ``IS NOT DISTINCT FROM``) and is
selected or not by the same rule.

Noise reuse: when no public key is mixed in, a primitive whose exact value *is*
the candidate's unit count — ``COUNT(DISTINCT <unit>)``, and ``COUNT(*)`` when
m = 1 (or a record-level table) — is released from the threshold mechanism's
own noisy count: no second charge (the values are part of the mechanism's
output). Every other primitive is calibrated and charged as usual.

This module only plans and writes SQL; the threshold itself (OpenDP) lives in
:mod:`dpgate.mechanisms`.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from dpgate.policy import ColumnPolicy, DatasetPolicy, TablePolicy, quote_identifier as q
from dpgate.sql.plan import QueryPlan
from dpgate.sql.primitives import primitive_kind

#: Pseudo-primitive id of the selection histogram in a calibration (never a column name).
SELECTION_ID = "__selection"
#: Result column of the bounded SQL: the candidate's number of distinct units.
UNITS_COLUMN = "__dpg_units"
_PREFIX = "__dpg_"


def selected_columns(table: TablePolicy, group_by: Iterable[str]) -> tuple[str, ...]:
    """The group-by columns without public keys (selected privately), in ``group_by`` order;
    none for a public table (its key-less columns are keyed by their values)."""
    if getattr(table, "public", False):
        return ()
    # computed keys (sql/keys.py) are not declared columns and have their own domains
    return tuple(c for c in group_by if (col := table.find_column(c)) is not None and col.public_keys is None)


def reused_primitives(plan: QueryPlan, policy: DatasetPolicy) -> tuple[str, ...]:
    """Ids of primitives released from the threshold mechanism's own noisy counts.

    Only without public keys in the GROUP BY (otherwise a candidate's unit count spans several
    released rows): ``count_distinct_unit`` always; ``count`` when each unit adds at most one
    row per group (m = 1, or a record-level table), where the bounded row count equals the
    number of distinct units.
    """
    if not plan.selected_keys or plan.public_group_by:
        return ()
    table = policy.table(plan.table)
    one_row = table.record_level or table.max_rows_per_unit == 1
    return tuple(p.id for p in plan.primitives if primitive_kind(p.kind).counts_units(one_row))


def units_cte(plan: QueryPlan, source: str, record_level: bool) -> str:
    """CTE ``__dpg_cand``: per candidate (selected-key tuple), the number of distinct units.

    ``source`` is the bounded partials (one row per kept (unit, group)), or the filtered rows
    of a record-level table (each row its own unit).
    """
    sel = [q(f"{_PREFIX}g{plan.group_by.index(c)}") for c in plan.selected_keys]
    count = "COUNT(*)" if record_level else f"COUNT(DISTINCT {q(_PREFIX + 'u')})"
    return (f"{q(_PREFIX + 'cand')} AS (\n  SELECT {', '.join(sel)}, {count} AS {q(_PREFIX + 'n')}\n"
            f"  FROM {source}\n  GROUP BY {', '.join(sel)}\n)")


def final_sql(plan: QueryPlan, keys: list[ColumnPolicy],
              public: tuple[list[str], dict[int, str], list[str]]) -> str:
    """The final SELECT of a selecting query: every candidate × every public-key combination.

    Columns: the group keys (named as in ``plan.group_by``), one integer per primitive (0 for
    an empty group), and :data:`UNITS_COLUMN`. Rows are ordered by candidate (selected keys,
    NULLs last), then public-key order, so each candidate's rows are consecutive (whatever
    the keys' order in ``plan.group_by``).

    Args:
        public: the public keys' domain as SQL, :func:`dpgate.sql.bound._key_relations` of
            ``plan.public_group_by`` (several columns of one public table: their tuples).
    """
    grp, cand = q(_PREFIX + "groups"), q(_PREFIX + "cand")
    g = [q(f"{_PREFIX}g{i}") for i in range(len(keys))]
    joins, refs, public_order = public
    out, on, order = [], [], []
    for i, c in enumerate(keys):
        if c.name in plan.selected_keys:
            out.append(f"CAST({cand}.{g[i]} AS {c.duckdb_type}) AS {q(c.name)}")
            on.append(f"{cand}.{g[i]} IS NOT DISTINCT FROM {grp}.{g[i]}")
            order.append(f"{cand}.{g[i]} NULLS LAST")
        else:
            out.append(f"CAST({refs[i]} AS {c.duckdb_type}) AS {q(c.name)}")
            on.append(f"{refs[i]} = {grp}.{g[i]}")
    order += public_order
    out += [f"COALESCE({grp}.{q(_PREFIX + p.id)}, 0) AS {q(p.id)}" for p in plan.primitives]
    out.append(f"{cand}.{q(_PREFIX + 'n')} AS {q(UNITS_COLUMN)}")
    frm = " CROSS JOIN ".join([cand] + joins)
    return (f"SELECT {', '.join(out)}\nFROM {frm}\nLEFT JOIN {grp} ON {' AND '.join(on)}\n"
            f"ORDER BY {', '.join(order)}")


def public_combinations(plan: QueryPlan, policy: DatasetPolicy) -> int:
    """P: rows per candidate (the number of public-key combinations; 1 without public keys).

    A computed key (``GROUP BY FLOOR(age / 10)``, :mod:`dpgate.sql.keys`) counts with its
    computed domain, a declared column with its public keys. Called before the charge too
    (:meth:`dpgate.service.Gateway.query`): it reads the plan and the policy only.

    Raises:
        UnknownColumn: a public group key is neither declared nor computed (a planner defect).
    """
    return plan.key_combinations(policy.table(plan.table), plan.public_group_by)


def candidate_counts(values: dict[str, np.ndarray], per_candidate: int) -> np.ndarray:
    """Each candidate's unit count (the bounded SQL repeats it on each of its rows)."""
    units = np.asarray(values[UNITS_COLUMN])
    return units[::per_candidate] if per_candidate > 1 else units


def row_mask(selected: Iterable[int] | np.ndarray, n_candidates: int, per_candidate: int) -> np.ndarray:
    """Boolean mask of the bounded SQL's rows that belong to the selected candidates (positions)."""
    chosen = np.zeros(n_candidates, dtype=bool)
    idx = selected if isinstance(selected, np.ndarray) else np.fromiter(selected, dtype=np.int64)
    if idx.size:
        chosen[idx] = True
    return np.repeat(chosen, per_candidate)
