"""Cohorts of a population (``[population] cohort_column``, issue 23): one budget per cohort.

Part of :mod:`dpgate.policy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from dpgate.errors import policy_error as _policy_error
from dpgate.policy.fields import _NAME_RE, _check_keys

if TYPE_CHECKING:
    from dpgate.policy.tables import TablePolicy


# --- cohorts and proxies (issue 23) ------------------------------------------------------

#: Most cohorts a population may declare (each is one budget in the ledger).
MAX_COHORTS = 10_000
#: Column types a cohort column may have (its public keys name the cohorts).
COHORT_TYPES: tuple[str, ...] = ("text", "int", "bool")


@dataclass(frozen=True)
class CohortPolicy:
    """The cohorts of a population (``[population] cohort_column = "signup_month"``).

    Every unit belongs to exactly one cohort — the value of ``column`` on each of its rows,
    the same on every row and every table, one of the column's public keys (the engines
    check it when the data loads). The ledger keeps one budget per (population, cohort);
    since the cohorts' units are disjoint, a query is charged its full cost on every cohort
    it can touch (parallel composition), and a cohort declared later starts with the whole
    cap. A unit's cohort must never change (e.g. the month the unit first appeared): the
    gateway checks each data version, not across versions.

    Attributes:
        column: the cohort column (declared, with public keys, in every protected table).
        type: its declared type (one of :data:`COHORT_TYPES`).
        keys: the cohorts (the column's public keys, in declaration order).
    """

    column: str
    type: str
    keys: tuple

    def key_text(self, value: Any) -> str:
        """A cohort's name in the ledger: the key as text (``true``/``false`` for booleans)."""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    @property
    def names(self) -> tuple[str, ...]:
        """Every cohort's ledger name, in declaration order."""
        return tuple(self.key_text(k) for k in self.keys)

    def to_dict(self) -> dict[str, Any]:
        """``{column, type, cohorts}`` (the public part: the cohorts are public keys)."""
        return {"column": self.column, "type": self.type, "cohorts": list(self.names)}


def _parse_cohorts(section: Mapping[str, Any], tables: Mapping[str, TablePolicy], path: Path) -> CohortPolicy | None:
    """``[population] cohort_column``: validated against every protected table's declaration."""
    _check_keys(section, {"cohort_column"}, path, "[population]")
    column = section.get("cohort_column")
    if column is None:
        return None
    if not isinstance(column, str) or not _NAME_RE.match(column):
        raise _policy_error(path, "[population] cohort_column must be a column name")
    protected = [t for t in tables.values() if not t.public]
    if not protected:
        raise _policy_error(path, "[population] cohort_column needs a protected table (every table is public)")
    found: CohortPolicy | None = None
    for table in protected:
        if table.unit_path is not None:
            raise _policy_error(path, "[population] cohort_column: a table whose privacy unit is a foreign-key "
                                      "path is not supported with cohorts yet (issue 21: each unit's cohort is "
                                      "checked on its rows once the path is joined)", table.name)
    for table in protected:
        col = table.find_column(column)
        if col is None:
            raise _policy_error(path, f"[population] cohort_column {column!r}: every protected table must declare "
                                      "it (each unit's cohort is read from its rows)", table.name, column)
        if table.privacy_unit is not None and col.name.casefold() == table.privacy_unit.casefold():
            raise _policy_error(path, "the cohort column cannot be the privacy unit", table.name, column)
        if col.type not in COHORT_TYPES:
            raise _policy_error(path, f"a cohort column must be of type {', '.join(COHORT_TYPES)} "
                                      f"(got {col.type})", table.name, column)
        if col.public_keys is None:
            raise _policy_error(path, "the cohort column must declare its cohorts as public_keys", table.name, column)
        keys = tuple(col.public_keys)
        if len(keys) > MAX_COHORTS:
            raise _policy_error(path, f"more than {MAX_COHORTS:,} cohorts", table.name, column)
        here = CohortPolicy(col.name, col.type, keys)
        if found is None:
            found = here
        elif (found.type, found.keys) != (here.type, here.keys):
            raise _policy_error(path, "the cohort column must have the same type and public keys in every "
                                      "protected table", table.name, column)
    return found
