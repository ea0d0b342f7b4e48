"""The default δ reserve for private partition selection (issue 22, "no idle δ reserve").

A cap (ε, δ) reserves δ/2 for partition selection only when some query of its population could
select keys privately: a protected table with a key column without public keys
(:func:`selection_key_columns`). Otherwise the reserve is 0 and all of δ goes to ρ_cap. Values
stated in a policy file always win; the default is decided per population
(:func:`population_selection_defaults`), since a population has one cap. Used by
:mod:`dpgate.policy` when it loads files; the rule only chooses how δ is split, so no privacy
number is computed here (ρ_cap follows from :func:`dpgate.ledger.caps.validate_cap`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

__all__ = ["SELECTION_KEY_TYPES", "default_selection_deltas", "population_selection_defaults",
           "selection_key_columns"]


#: Column types whose key-less columns make partition selection possible in the default rule
#: (:func:`selection_key_columns`): discrete values a GROUP BY lists. ``float`` columns are
#: measures; a GROUP BY on one without public keys needs a stated ``selection_delta``.
SELECTION_KEY_TYPES: tuple[str, ...] = ("text", "int", "bool", "date", "timestamp")


def selection_key_columns(tables: Iterable[Any]) -> tuple[tuple[str, str], ...]:
    """``(table, column)`` of every key column without public keys of a protected table: the
    columns a GROUP BY would select privately (:mod:`dpgate.sql.partition_selection`), and
    why a default cap reserves δ for partition selection (issue 22).

    A key column is a declared column of a type in :data:`SELECTION_KEY_TYPES`; public tables
    never select (their key-less columns are keyed by their values), and neither does the
    privacy unit column when it is declared (a GROUP BY on it is refused).
    """
    return tuple((t.name, c.name) for t in tables if not t.public for c in t.columns.values()
                 if c.public_keys is None and c.type in SELECTION_KEY_TYPES
                 and (t.privacy_unit is None or c.name.casefold() != t.privacy_unit.casefold()))


def default_selection_deltas(delta: float, selects: bool) -> tuple[float, float]:
    """The default ``(selection_delta, default_selection_delta)`` of a cap δ (issue 22, "no idle
    δ reserve"): ``(δ/2, δ/200)`` when partition selection may be needed (``selects``: a key
    column without public keys, :func:`selection_key_columns`), else ``(0, 0)``: all of δ
    goes to ρ_cap (ρ_cap = ``ledger_rho(ε, δ)``)."""
    sel = delta / 2 if selects else 0.0
    return sel, sel / 100


def population_selection_defaults(policies: Mapping[str, Any]) -> dict[str, Any]:
    """The policies with the default selection reserve decided per population (issue 22): a
    population's cap is one, so if a protected table of *any* of its datasets has a key column
    without public keys (:func:`selection_key_columns`), every dataset of it whose file states no
    ``selection_delta`` reserves δ/2 (:func:`default_selection_deltas`) unless it composes in Gaussian DP
    (``composition = "gdp"``: no partition selection, reserve 0). Stated values are kept.
    Same order as ``policies``."""
    selects: dict[str, bool] = {}
    for p in policies.values():
        selects[p.population] = selects.get(p.population, False) or bool(selection_key_columns(p.tables.values()))
    out = {}
    for name, p in policies.items():
        b = p.budget
        if not b.selection_delta_stated and selects[p.population] and not b.selection_delta \
                and getattr(b, "composition", "renyi") != "gdp":  # a Gaussian-DP population never selects
            sel, per_query = default_selection_deltas(b.delta, True)
            p = dataclasses.replace(p, budget=dataclasses.replace(
                b, selection_delta=sel, default_selection_delta=per_query))
        out[name] = p
    return out
