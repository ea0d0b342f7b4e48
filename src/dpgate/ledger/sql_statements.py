"""The statements on the ledger's common SQL layout (``populations``, ``events``, ``charges``,
``spend_totals``, ``chain_head``), written once per driver placeholder, and
:class:`SqlTransaction`, one open transaction with its chain head.

Used by :class:`dpgate.ledger.sql.SqlLedger` (both backends); :func:`orders_json` is the
``ledger_meta`` value each backend's migration checks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

from dpgate.accounting import ORDERS
from dpgate.errors import LedgerError
from dpgate.ledger.caps import POPULATION_COLUMNS
from dpgate.ledger.entries import (
    EVENT_COLUMNS,
    STORED_CHARGE_COLUMNS,
)

_HEAD_SELECT = "SELECT seq, hash FROM chain_head WHERE id = 1"


def orders_json() -> str:
    """The ``ledger_meta`` value recording ``accounting.ORDERS`` (JSON list; ∞ as ``"inf"``).

    A stored ledger whose value differs holds RDP curves on another order grid
    and must not be used (each backend's migration checks it).
    """
    return json.dumps(["inf" if math.isinf(a) else a for a in ORDERS])


@dataclass(frozen=True)
class _Statements:
    """The shared statements, written with one driver's placeholder."""

    population: str
    insert_population: str
    update_allocations: str
    update_cap: str
    insert_event: str
    insert_charge: str
    move_head: str
    totals: str
    upsert_totals: str
    charge_by_release_key: str
    spend_totals: str
    charges: str
    events: str
    where_population: str
    limit: str
    all_populations: str
    all_totals: str

    @classmethod
    def build(cls, p: str) -> "_Statements":
        """Every shared statement with ``p`` as the driver's placeholder (``?`` or ``%s``)."""
        charges = f"SELECT {', '.join(STORED_CHARGE_COLUMNS)} FROM charges"
        totals_cols = "consumer, charges, kinds, rho, curve, selection_delta, gdp"
        return cls(
            population=f"SELECT {', '.join(POPULATION_COLUMNS)} FROM populations WHERE name = {p}",
            insert_population=(
                f"INSERT INTO populations (name, {', '.join(POPULATION_COLUMNS)}, created_at)"
                f" VALUES ({', '.join([p] * (len(POPULATION_COLUMNS) + 2))})"
            ),
            update_allocations=f"UPDATE populations SET allocations = {p} WHERE name = {p}",
            update_cap=(
                f"UPDATE populations SET epsilon = {p}, delta = {p}, rho_cap = {p}, alpha_star = {p},"
                f" rho_stated = {p}, alpha_cap = {p}, selection_delta = {p}, composition = {p} WHERE name = {p}"
            ),
            insert_event=(f"INSERT INTO events ({', '.join(EVENT_COLUMNS)})"
                          f" VALUES ({', '.join([p] * len(EVENT_COLUMNS))})"),
            insert_charge=(f"INSERT INTO charges ({', '.join(STORED_CHARGE_COLUMNS)})"
                           f" VALUES ({', '.join([p] * len(STORED_CHARGE_COLUMNS))})"),
            move_head=f"UPDATE chain_head SET seq = {p}, hash = {p} WHERE id = 1",
            totals=(f"SELECT {totals_cols} FROM spend_totals"
                    f" WHERE population = {p} AND consumer IN ('', {p})"),
            upsert_totals=(
                "INSERT INTO spend_totals (population, consumer, charges, kinds, rho, curve, selection_delta, gdp)"
                f" VALUES ({', '.join([p] * 8)}) ON CONFLICT (population, consumer) DO UPDATE SET"
                " charges = excluded.charges, kinds = excluded.kinds, rho = excluded.rho,"
                " curve = excluded.curve, selection_delta = excluded.selection_delta, gdp = excluded.gdp"
            ),
            charge_by_release_key=f"{charges} WHERE population = {p} AND release_key = {p}",
            spend_totals=f"SELECT {totals_cols} FROM spend_totals WHERE population = {p}",
            charges=charges,
            events=f"SELECT {', '.join(EVENT_COLUMNS)} FROM events",
            where_population=f" WHERE population = {p}",
            limit=f" LIMIT {p}",
            all_populations=f"SELECT name, {', '.join(POPULATION_COLUMNS)} FROM populations",
            all_totals=("SELECT population, consumer, charges, kinds, rho, curve, selection_delta, gdp"
                        " FROM spend_totals"),
        )


class SqlTransaction:
    """One open ledger transaction: the backend's executor and the chain head.

    Args:
        executor: the backend's DB-API executor (``sqlite3.Connection`` or a psycopg
            cursor): ``execute(query[, params])`` returns an iterable cursor with
            ``fetchone``/``fetchall``; a psycopg cursor is reused by the next
            ``execute``, so every result is consumed before the next statement.
        head: the chain head ``(seq, hash)`` if the transaction already read (and
            locked) it; None: read on first use of :meth:`head`.

    Attributes:
        executor: the executor (for backend hooks that need the driver).
    """

    __slots__ = ("executor", "_head")

    def __init__(self, executor: Any, head: tuple[int, str] | None = None) -> None:
        self.executor = executor
        self._head = head

    def execute(self, query: str, params: Iterable[Any] | None = None) -> Any:
        """Run one statement; returns the driver's cursor (iterate or fetch it before the next).

        Raises:
            the driver's error (the enclosing :meth:`SqlLedger._begin` turns it into LedgerError).
        """
        if params is None:
            return self.executor.execute(query)
        return self.executor.execute(query, params)

    def executemany(self, query: str, rows: Iterable[Iterable[Any]]) -> None:
        """Run one statement once per parameter row (driver errors as :meth:`execute`)."""
        self.executor.executemany(query, rows)

    def head(self) -> tuple[int, str]:
        """The chain head ``(seq, hash)`` as of this transaction (after its own appends).

        Raises:
            LedgerError: the ``chain_head`` row is missing.
        """
        if self._head is None:
            row = self.execute(_HEAD_SELECT).fetchone()
            if row is None:
                raise LedgerError("the ledger's chain head row is missing (run dpgate ledger verify)")
            self._head = (row[0], row[1])
        return self._head

    def lock_head(self, statement: str) -> None:
        """Run the backend's row-lock statement on the chain head and keep the ``(seq, hash)`` it returns.

        Raises:
            LedgerError: the ``chain_head`` row is missing.
        """
        row = self.execute(statement).fetchone()
        if row is None:
            raise LedgerError("the ledger's chain head row is missing (run dpgate ledger verify)")
        self._head = (int(row[0]), row[1])

    def set_head(self, seq: int, hash_: str) -> None:
        """Record the new chain head after an append (the caller updates the ``chain_head`` row)."""
        self._head = (seq, hash_)
