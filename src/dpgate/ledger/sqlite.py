"""The embedded ledger: one SQLite file (stdlib ``sqlite3``, WAL journal).

Layout (schema version 1, recorded in ``schema_migrations``):

* ``charges`` and ``events`` — the append-only entries. Triggers refuse any
  UPDATE or DELETE. Both share one sequence (``seq``) and one SHA-256 hash
  chain: every entry stores ``prev_hash`` (the previous entry's hash) and its
  own ``hash`` over its canonical serialisation (:func:`base.entry_hash`).
* ``populations`` (the cap and allocations in force), ``spend_totals`` (exact
  running totals per population and per consumer) and ``chain_head`` (last
  ``seq`` and hash) — derived state, updated in the same transaction as the
  entry that changes them, so the budget check costs O(1) per charge.
  :meth:`SqliteLedger.verify` recomputes all of it from the entries.
* ``ledger_meta`` — the RDP order grid the stored curves use.

Concurrency: each thread of each process has its own connection; a charge is
one ``BEGIN IMMEDIATE`` transaction (SQLite's write lock, held across
processes; waiting writers retry for ``busy_timeout``) that reads the totals,
decides, appends and commits — so check-and-append is atomic across threads and
processes. Threads of one process also queue on a lock first, which avoids
SQLite's sleeping busy handler between them. ``synchronous=FULL`` (default)
makes a committed charge survive power loss, not only a crashed process.

The release store (:mod:`dpgate.releases`) shares the file through
:meth:`SqliteLedger.connect`.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping
from urllib.parse import parse_qs, unquote, urlsplit

from dpgate.accounting import ORDERS, Cost
from dpgate.errors import DpgateError, LedgerError
from dpgate.ledger.base import (
    CHARGE_COLUMNS as _CHARGE_COLS,
    EVENT_COLUMNS as _EVENT_COLS,
    GENESIS_HASH,
    POPULATION_COLUMNS,
    CapSpec,
    ChargeReceipt,
    Replay,
    SpendReport,
    Totals,
    VerifyReport,
    allocation_share,
    build_spend_report,
    canonical_json,
    cap_change_result,
    charge_entry as _charge_entry,
    charge_epsilon,
    check_charge,
    display_charge as _display_charge,
    display_event as _display_event,
    event_entry as _event_entry,
    iter_sorted_entries,
    new_charge_entry,
    new_event_entry,
    population_from_row,
    prepare_charge,
    receipt_from_entry as _receipt,
    stored_state_problems,
    unknown_population,
    utc_now,
    validate_cap,
    validate_governance,
    validate_limit,
    validate_name,
    validate_population,
)

__all__ = ["SqliteLedger", "MIGRATIONS", "open_sqlite_ledger"]

_TRIGGERS = ("charges_no_update", "charges_no_delete", "events_no_update", "events_no_delete")

#: Schema migrations: (version, name, statements). Applied in order, once each, inside one
#: ``BEGIN IMMEDIATE`` transaction on open; recorded in ``schema_migrations``. Never edit a
#: released migration: append a new one.
MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (
        1,
        "ledger: populations, events, charges, totals, chain head, append-only triggers",
        (
            """CREATE TABLE ledger_meta (
                key   TEXT PRIMARY KEY,
                value TEXT NOT NULL
            )""",
            """CREATE TABLE populations (
                name        TEXT PRIMARY KEY,
                epsilon     REAL NOT NULL,
                delta       REAL NOT NULL,
                rho_cap     REAL NOT NULL,
                alpha_star  REAL NOT NULL,
                rho_stated  INTEGER NOT NULL,
                allocations TEXT NOT NULL,
                created_at  TEXT NOT NULL
            )""",
            """CREATE TABLE events (
                seq        INTEGER PRIMARY KEY,
                event_id   TEXT NOT NULL UNIQUE,
                population TEXT NOT NULL,
                kind       TEXT NOT NULL,
                actor      TEXT NOT NULL,
                reason     TEXT NOT NULL,
                old        TEXT,
                new        TEXT NOT NULL,
                created_at TEXT NOT NULL,
                prev_hash  TEXT NOT NULL,
                hash       TEXT NOT NULL
            )""",
            "CREATE INDEX events_by_population ON events (population, seq)",
            """CREATE TABLE charges (
                seq              INTEGER PRIMARY KEY,
                charge_id        TEXT NOT NULL UNIQUE,
                population       TEXT NOT NULL REFERENCES populations (name),
                consumer         TEXT NOT NULL,
                kind             TEXT NOT NULL,
                rho              REAL NOT NULL,
                epsilon_at_delta REAL NOT NULL,
                delta            REAL NOT NULL,
                cost             TEXT NOT NULL,
                purpose          TEXT NOT NULL,
                release_key      TEXT,
                metadata         TEXT NOT NULL,
                created_at       TEXT NOT NULL,
                prev_hash        TEXT NOT NULL,
                hash             TEXT NOT NULL
            )""",
            "CREATE INDEX charges_by_population ON charges (population, seq)",
            """CREATE UNIQUE INDEX charges_release_key ON charges (population, release_key)
               WHERE release_key IS NOT NULL""",
            """CREATE TABLE spend_totals (
                population TEXT NOT NULL,
                consumer   TEXT NOT NULL,
                charges    INTEGER NOT NULL,
                kinds      INTEGER NOT NULL,
                rho        TEXT NOT NULL,
                curve      TEXT,
                PRIMARY KEY (population, consumer)
            )""",
            """CREATE TABLE chain_head (
                id   INTEGER PRIMARY KEY CHECK (id = 1),
                seq  INTEGER NOT NULL,
                hash TEXT NOT NULL
            )""",
            f"INSERT INTO chain_head (id, seq, hash) VALUES (1, 0, '{GENESIS_HASH}')",
            """CREATE TRIGGER charges_no_update BEFORE UPDATE ON charges
               BEGIN SELECT RAISE(ABORT, 'ledger charges are append-only'); END""",
            """CREATE TRIGGER charges_no_delete BEFORE DELETE ON charges
               BEGIN SELECT RAISE(ABORT, 'ledger charges are append-only'); END""",
            """CREATE TRIGGER events_no_update BEFORE UPDATE ON events
               BEGIN SELECT RAISE(ABORT, 'ledger events are append-only'); END""",
            """CREATE TRIGGER events_no_delete BEFORE DELETE ON events
               BEGIN SELECT RAISE(ABORT, 'ledger events are append-only'); END""",
        ),
    ),
)

_POP_COLS = ", ".join(POPULATION_COLUMNS)
_SYNC_MODES = {"off": "OFF", "normal": "NORMAL", "full": "FULL", "extra": "EXTRA"}


def _orders_json() -> str:
    return json.dumps(["inf" if math.isinf(a) else a for a in ORDERS])


class SqliteLedger:
    """The ledger in one SQLite file (implements :class:`dpgate.ledger.base.Ledger`).

    Args:
        path: the database file (created with its parent folder if absent and
            ``create`` is true).
        synchronous: SQLite ``synchronous`` pragma: "full" (default: a committed
            charge survives power loss), "extra", "normal" (survives a process
            crash, not power loss) or "off".
        busy_timeout_ms: how long a writer waits for another process's write
            transaction before failing with :class:`~dpgate.errors.LedgerError`.
        create: if False, a missing file raises LedgerError instead of being created.

    Attributes:
        path: the database file (absolute :class:`~pathlib.Path`); the release
            store opens it through :meth:`connect`.

    Raises:
        LedgerError: the file cannot be opened or migrated, is not a ledger, or was
            written with another RDP order grid.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "full",
        busy_timeout_ms: int = 30_000,
        create: bool = True,
    ) -> None:
        self.path = Path(path).expanduser().absolute()
        if synchronous.lower() not in _SYNC_MODES:
            raise LedgerError(f"synchronous must be one of {', '.join(_SYNC_MODES)}, got {synchronous!r}")
        self._synchronous = _SYNC_MODES[synchronous.lower()]
        if int(busy_timeout_ms) < 0:
            raise LedgerError("busy_timeout_ms must be >= 0")
        self._busy_ms = int(busy_timeout_ms)
        if not self.path.exists():
            if not create:
                raise LedgerError(f"no ledger at {self.path}", {"path": str(self.path)})
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._inherited: list[sqlite3.Connection] = []  # from a parent process: never used or closed
        self._registry_lock = threading.Lock()
        self._pid = os.getpid()
        self._wlock = threading.Lock()
        self._delta_hint: dict[str, float] = {}
        self._closed = False
        self._migrate()

    # -- connections -------------------------------------------------------------------

    def connect(self, *, isolation_level: str | None = None) -> sqlite3.Connection:
        """A new connection to the ledger's file with the ledger's pragmas.

        WAL journal, ``busy_timeout``, ``foreign_keys=ON`` and the ledger's
        ``synchronous`` level. The caller owns (and closes) it. Used by the release
        store to keep releases in the same file.

        Args:
            isolation_level: passed to :func:`sqlite3.connect`; the default None is
                autocommit mode (issue ``BEGIN``/``COMMIT`` yourself).

        Raises:
            LedgerError: the file cannot be opened.
        """
        try:
            conn = sqlite3.connect(
                str(self.path),
                timeout=self._busy_ms / 1000.0,
                isolation_level=isolation_level,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise LedgerError(f"cannot put {self.path} in WAL mode (got {mode!r})")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open the ledger at {self.path}: {exc}", {"path": str(self.path)}) from exc
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise LedgerError("the ledger is closed")
        pid = os.getpid()
        if pid != self._pid:  # forked: never reuse the parent's connections or locks
            with self._registry_lock:
                if pid != self._pid:
                    self._inherited.extend(self._all)
                    self._all = []
                    self._local = threading.local()
                    self._wlock = threading.Lock()
                    self._pid = pid
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.connect()
            self._local.conn = conn
            with self._registry_lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``), committed on success, rolled back on error."""
        conn = self._conn()
        with self._wlock:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise LedgerError(f"the ledger is busy ({exc}); try again",
                                  {"path": str(self.path)}) from exc
            try:
                yield conn
            except BaseException:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:  # pragma: no cover - already rolled back
                    pass
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:  # pragma: no cover - disk full and the like
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise LedgerError(f"cannot commit to the ledger: {exc}") from exc

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: a consistent snapshot; never writes."""
        conn = self._conn()
        try:
            conn.execute("BEGIN")
        except sqlite3.Error as exc:  # pragma: no cover
            raise LedgerError(f"cannot read the ledger: {exc}") from exc
        try:
            yield conn
        finally:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:  # pragma: no cover
                pass

    def _guard(self, exc: sqlite3.Error) -> LedgerError:
        return LedgerError(f"ledger store error: {exc}", {"path": str(self.path)})

    # -- schema --------------------------------------------------------------------------

    def _migrate(self) -> None:
        try:
            with self._write() as conn:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
                )
                done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
                for version, name, statements in MIGRATIONS:
                    if version in done:
                        continue
                    for stmt in statements:
                        conn.execute(stmt)
                    conn.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                                 (version, name, utc_now()))
                unknown = done - {v for v, _, _ in MIGRATIONS}
                if unknown:
                    raise LedgerError(
                        f"the ledger at {self.path} has schema version(s) {sorted(unknown)} "
                        "newer than this dpgate; upgrade dpgate",
                        {"path": str(self.path)},
                    )
                conn.execute("INSERT OR IGNORE INTO ledger_meta (key, value) VALUES ('orders', ?)",
                             (_orders_json(),))
                stored = conn.execute("SELECT value FROM ledger_meta WHERE key = 'orders'").fetchone()[0]
                if stored != _orders_json():
                    raise LedgerError(
                        f"the ledger at {self.path} stores RDP curves on another order grid than "
                        "accounting.ORDERS; it cannot be used with this dpgate",
                        {"path": str(self.path)},
                    )
        except sqlite3.Error as exc:
            self.close()
            raise LedgerError(f"{self.path} is not a usable ledger: {exc}", {"path": str(self.path)}) from exc
        except DpgateError:
            self.close()
            raise

    # -- internals -----------------------------------------------------------------------

    @staticmethod
    def _population_row(conn: sqlite3.Connection, name: str) -> tuple[CapSpec, dict[str, float]] | None:
        row = conn.execute(f"SELECT {_POP_COLS} FROM populations WHERE name = ?", (name,)).fetchone()
        return None if row is None else population_from_row(row)

    @staticmethod
    def _append_event(
        conn: sqlite3.Connection,
        population: str,
        kind: str,
        actor: str,
        reason: str,
        old: Mapping[str, Any] | None,
        new: Mapping[str, Any],
    ) -> dict[str, Any]:
        head_seq, head_hash = conn.execute("SELECT seq, hash FROM chain_head WHERE id = 1").fetchone()
        entry = new_event_entry(population, kind, actor, reason, old, new, seq=head_seq + 1, prev_hash=head_hash)
        conn.execute(
            f"INSERT INTO events ({', '.join(_EVENT_COLS)}) VALUES ({', '.join('?' * len(_EVENT_COLS))})",
            tuple(entry[c] for c in _EVENT_COLS),
        )
        conn.execute("UPDATE chain_head SET seq = ?, hash = ? WHERE id = 1", (entry["seq"], entry["hash"]))
        return entry

    @staticmethod
    def _totals(conn: sqlite3.Connection, population: str, consumer: str) -> tuple[Totals, Totals]:
        pt = ct = Totals()
        for row in conn.execute(
            "SELECT consumer, charges, kinds, rho, curve FROM spend_totals"
            " WHERE population = ? AND consumer IN ('', ?)",
            (population, consumer),
        ):
            t = Totals.from_row(*row[1:])
            if row[0] == "":
                pt = t
            else:
                ct = t
        return pt, ct

    # -- governance ----------------------------------------------------------------------

    def ensure_population(
        self,
        name: str,
        *,
        epsilon: float | None = None,
        delta: float,
        allocations: Mapping[str, float] | None = None,
        actor: str = "policy",
        reason: str = "policy file",
        rho_cap: float | None = None,
    ) -> None:
        """Create population ``name`` if absent, else record any cap or allocation change.

        The cap (ε, δ) is fixed into the budget curve B(α) = α·ρ_cap with
        ρ_cap = ``accounting.rho_for_cap(ε, δ, "tight")`` ([CKS20] Cor. 13).
        Alternatively ``rho_cap`` states the budget directly in ρ (then the
        recorded ε is its tight conversion at δ). Creation is recorded as a
        ``population_created`` event; a differing cap as ``cap_changed`` and
        differing allocations as ``allocations_changed`` (old and new values,
        actor, reason, time). Equal values write nothing, so calling this on
        every start is idempotent.

        Args:
            name: population name (1-128 characters ``[A-Za-z0-9._:@/+-]``).
            epsilon: cap ε > 0 (total), or None with ``rho_cap``.
            delta: cap δ in (0, 1).
            allocations: consumer → share in [0, 1], summing to ≤ 1; empty or
                None: an open population (any consumer, held to the population's
                budget only).
            actor, reason: recorded with the events (non-empty).
            rho_cap: the budget in ρ (total), instead of ε.

        Raises:
            PolicyError: invalid name, cap, allocations, actor or reason (nothing written).
            LedgerError: the store failed.
        """
        cap, allocs = validate_population(name, epsilon, delta, allocations, actor, reason, rho_cap)
        try:
            with self._write() as conn:
                current = self._population_row(conn, name)
                if current is None:
                    now = utc_now()
                    conn.execute(
                        "INSERT INTO populations (name, epsilon, delta, rho_cap, alpha_star, rho_stated,"
                        " allocations, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (name, cap.epsilon, cap.delta, cap.rho_cap, cap.alpha_star, int(cap.rho_stated),
                         canonical_json(allocs), now),
                    )
                    self._append_event(conn, name, "population_created", actor, reason, None,
                                       {"cap": cap.to_dict(), "allocations": allocs})
                    return
                old_cap, old_allocs = current
                if not old_cap.same_cap(cap):
                    self._apply_cap(conn, name, old_cap, cap, actor, reason)
                if old_allocs != allocs:
                    conn.execute("UPDATE populations SET allocations = ? WHERE name = ?",
                                 (canonical_json(allocs), name))
                    self._append_event(conn, name, "allocations_changed", actor, reason,
                                       {"allocations": old_allocs}, {"allocations": allocs})
        except sqlite3.Error as exc:
            raise self._guard(exc) from exc
        self._delta_hint[name] = cap.delta

    def _apply_cap(self, conn: sqlite3.Connection, name: str, old: CapSpec, new: CapSpec,
                   actor: str, reason: str) -> dict[str, Any]:
        conn.execute(
            "UPDATE populations SET epsilon = ?, delta = ?, rho_cap = ?, alpha_star = ?, rho_stated = ?"
            " WHERE name = ?",
            (new.epsilon, new.delta, new.rho_cap, new.alpha_star, int(new.rho_stated), name),
        )
        return self._append_event(conn, name, "cap_changed", actor, reason, old.to_dict(), new.to_dict())

    def set_cap(
        self,
        population: str,
        *,
        epsilon: float | None = None,
        delta: float,
        actor: str,
        reason: str,
        rho_cap: float | None = None,
    ) -> dict[str, Any]:
        """Change a population's cap: a recorded ``cap_changed`` event, never an edit.

        The new cap is fixed into a new budget curve (see :meth:`ensure_population`).
        Lowering it below what was already spent is allowed; every later charge is
        then refused and the remaining budget is reported as 0. Charges are never
        refunded or rewritten. A cap equal to the current one records nothing
        (``changed`` is False).

        Args:
            population: the population.
            epsilon: new cap ε > 0 (total), or None with ``rho_cap``.
            delta: new cap δ in (0, 1).
            actor: who made the change (non-empty).
            reason: why (non-empty).
            rho_cap: the new budget in ρ (total), instead of ε.

        Returns:
            ``{population, changed, old, new, event_id, actor, reason, created_at}``;
            ``old``/``new`` are ``{epsilon, delta, rho_cap, alpha_star, rho_stated}``.

        Raises:
            InvalidBudget: invalid cap. InvalidRequest: empty actor or reason.
            UnknownPopulation: no such population. LedgerError: the store failed.
        """
        validate_name(population, "population")
        cap = validate_cap(epsilon, delta, rho_cap=rho_cap)
        validate_governance(actor, reason)
        try:
            with self._write() as conn:
                current = self._population_row(conn, population)
                if current is None:
                    raise unknown_population(population)
                old = current[0]
                if old.same_cap(cap):
                    return cap_change_result(population, old, cap, None, actor, reason)
                event = self._apply_cap(conn, population, old, cap, actor, reason)
        except sqlite3.Error as exc:
            raise self._guard(exc) from exc
        self._delta_hint[population] = cap.delta
        return cap_change_result(population, old, cap, event, actor, reason)

    # -- charging ------------------------------------------------------------------------

    def charge(
        self,
        population: str,
        consumer: str,
        cost: Cost,
        *,
        purpose: str,
        release_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> ChargeReceipt:
        """Atomically check the consumer's and the population's filter and append one charge.

        One ``BEGIN IMMEDIATE`` transaction: read the cap, allocations and exact
        totals; return the stored receipt if ``release_key`` was charged before
        (single flight across processes); decide with
        :func:`dpgate.ledger.base.filter_decision` (zCDP filter and Rényi filter:
        Feldman & Zrnic 2021, "Individual privacy accounting via a Rényi filter",
        §3; Whitehouse et al. 2023, "Fully-adaptive composition in differential
        privacy") against share × B(α) for the consumer
        and B(α) = α·ρ_cap for the population; append the hash-chained entry;
        update the totals and the chain head; commit. The charge is never
        refunded.

        Args:
            population: the population charged.
            consumer: the allocation charged (any name for an open population).
            cost: the cost of this charge (``Cost.zcdp(ρ)``, ``Cost.continuous_gaussian(ρ)``,
                ``Cost.rdp(curve)``, ``Cost.pure(ε)``, …).
            purpose: non-empty description stored with the entry.
            release_key: single-flight key (e.g. the release cache key), or None.
            metadata: JSON-serialisable mapping stored with the entry (no NaN/inf).

        Returns:
            :class:`~dpgate.ledger.base.ChargeReceipt` (``duplicate=True`` if
            ``release_key`` had been charged: nothing new written).

        Raises:
            InvalidBudget: invalid cost (NaN, negative, zero, wrong grid, ∞ at a finite order).
            InvalidRequest: invalid name, purpose, release_key or metadata.
            UnknownPopulation: no such population.
            UnknownConsumer: the population allocates nothing to ``consumer``.
            BudgetExhausted: a filter refuses (details: requested/spent/cap/remaining
                in ρ and ε at the cap's δ); nothing written.
            LedgerError: the store failed or stayed busy past the busy timeout.
        """
        req = prepare_charge(population, consumer, cost, purpose=purpose, release_key=release_key,
                             metadata=metadata)
        cost = req.cost
        hint = self._delta_hint.get(population)
        eps = charge_epsilon(cost, hint) if hint is not None else None  # outside the write lock
        refusal = None
        receipt: ChargeReceipt | None = None
        try:
            with self._write() as conn:
                current = self._population_row(conn, population)
                if current is None:
                    raise unknown_population(population)
                cap, allocs = current
                share = allocation_share(population, consumer, allocs)
                if release_key is not None:
                    row = conn.execute(
                        f"SELECT {', '.join(_CHARGE_COLS)} FROM charges"
                        " WHERE population = ? AND release_key = ?",
                        (population, release_key),
                    ).fetchone()
                    if row is not None:
                        receipt = _receipt(_charge_entry(row), duplicate=True)
                if receipt is None:
                    pt, ct = self._totals(conn, population, consumer)
                    pt_after, ct_after, refusal = check_charge(req, cap, share, pt, ct)
                if receipt is None and refusal is None:
                    if eps is None or hint != cap.delta:
                        eps = charge_epsilon(cost, cap.delta)
                    head_seq, head_hash = conn.execute("SELECT seq, hash FROM chain_head WHERE id = 1").fetchone()
                    entry = new_charge_entry(req, seq=head_seq + 1, prev_hash=head_hash, epsilon_at_delta=eps,
                                             delta=cap.delta)
                    conn.execute(
                        f"INSERT INTO charges ({', '.join(_CHARGE_COLS)})"
                        f" VALUES ({', '.join('?' * len(_CHARGE_COLS))})",
                        tuple(entry[c] for c in _CHARGE_COLS),
                    )
                    conn.executemany(
                        "INSERT INTO spend_totals (population, consumer, charges, kinds, rho, curve)"
                        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (population, consumer) DO UPDATE SET"
                        " charges = excluded.charges, kinds = excluded.kinds, rho = excluded.rho,"
                        " curve = excluded.curve",
                        [(population, "", *pt_after.to_row()),
                         (population, consumer, *ct_after.to_row())],
                    )
                    conn.execute("UPDATE chain_head SET seq = ?, hash = ? WHERE id = 1",
                                 (entry["seq"], entry["hash"]))
                    receipt = _receipt(entry, duplicate=False, cost=cost)
        except sqlite3.Error as exc:
            raise self._guard(exc) from exc
        self._delta_hint[population] = cap.delta
        if refusal is not None:
            raise refusal.error()
        assert receipt is not None
        return receipt

    # -- reading -------------------------------------------------------------------------

    def populations(self) -> list[str]:
        """Population names, sorted (read-only)."""
        try:
            with self._read() as conn:
                return [r[0] for r in conn.execute("SELECT name FROM populations ORDER BY name")]
        except sqlite3.Error as exc:
            raise self._guard(exc) from exc

    def spend(self, population: str) -> SpendReport:
        """Spent and remaining budget of ``population`` and of each consumer (read-only).

        ρ totals are exact sums of the entries; ε is at the cap's δ by the
        tightest conversion valid for what was composed (see
        :func:`dpgate.ledger.base.build_spend_report`).

        Raises:
            UnknownPopulation: no such population. LedgerError: the store failed.
        """
        try:
            with self._read() as conn:
                current = self._population_row(conn, population)
                if current is None:
                    raise unknown_population(population)
                rows = conn.execute(
                    "SELECT consumer, charges, kinds, rho, curve FROM spend_totals WHERE population = ?",
                    (population,),
                ).fetchall()
        except sqlite3.Error as exc:
            raise self._guard(exc) from exc
        cap, allocs = current
        totals = {r[0]: Totals.from_row(*r[1:]) for r in rows}
        pt = totals.pop("", Totals())
        return build_spend_report(population, cap, allocs, pt, totals)

    def entries(self, population: str | None = None, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Charges in ``seq`` order (read-only); with ``limit``, the most recent ``limit``.

        Each dict: seq, charge_id, population, consumer, kind, rho, epsilon_at_delta,
        delta, cost (dict), purpose, release_key, metadata (dict), created_at,
        prev_hash, hash, type ("charge").

        Raises:
            InvalidRequest: ``limit`` not a positive integer. LedgerError: store failure.
        """
        validate_limit(limit)
        sql = f"SELECT {', '.join(_CHARGE_COLS)} FROM charges"
        args: list[Any] = []
        if population is not None:
            sql += " WHERE population = ?"
            args.append(population)
        sql += " ORDER BY seq DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        try:
            with self._read() as conn:
                rows = conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise self._guard(exc) from exc
        return [_display_charge(_charge_entry(r)) for r in reversed(rows)]

    def events(self, population: str | None = None) -> list[dict[str, Any]]:
        """Governance events in ``seq`` order (read-only).

        Each dict: seq, event_id, population, kind ("population_created",
        "cap_changed", "allocations_changed"), actor, reason, old, new (dicts),
        created_at, prev_hash, hash, type ("event").
        """
        sql = f"SELECT {', '.join(_EVENT_COLS)} FROM events"
        args: tuple = ()
        if population is not None:
            sql += " WHERE population = ?"
            args = (population,)
        try:
            with self._read() as conn:
                rows = conn.execute(sql + " ORDER BY seq", args).fetchall()
        except sqlite3.Error as exc:
            raise self._guard(exc) from exc
        return [_display_event(_event_entry(r)) for r in rows]

    def chain(self) -> list[dict[str, Any]]:
        """Every entry (charges and events) in ``seq`` order, exactly as hashed (read-only).

        ``cost``, ``metadata``, ``old`` and ``new`` are the stored JSON texts, so
        :func:`dpgate.ledger.base.entry_hash` of each dict reproduces its ``hash``
        and an auditor can check the chain outside dpgate.
        """
        try:
            with self._read() as conn:
                charges = [_charge_entry(r) for r in
                           conn.execute(f"SELECT {', '.join(_CHARGE_COLS)} FROM charges ORDER BY seq")]
                events = [_event_entry(r) for r in
                          conn.execute(f"SELECT {', '.join(_EVENT_COLS)} FROM events ORDER BY seq")]
        except sqlite3.Error as exc:
            raise self._guard(exc) from exc
        return list(iter_sorted_entries(charges, events))

    def verify(self) -> VerifyReport:
        """Check the ledger's integrity (read-only; one consistent snapshot).

        Recomputes, from the entries alone: the hash chain (consecutive ``seq``,
        ``prev_hash`` links, every hash), the caps and allocations in force, the
        exact spend per population and consumer, and that every charge fitted
        its filters when written (:class:`dpgate.ledger.base.Replay`); then
        compares with the stored derived state (populations, spend totals, chain
        head) and checks the append-only triggers and the schema version.

        Returns:
            :class:`~dpgate.ledger.base.VerifyReport` (``ok`` False with one
            sentence per problem, e.g. after a row was edited with the triggers
            dropped).

        Raises:
            LedgerError: the store cannot be read.
        """
        replay = Replay()
        try:
            with self._read() as conn:
                charges = (_charge_entry(r) for r in
                           conn.execute(f"SELECT {', '.join(_CHARGE_COLS)} FROM charges ORDER BY seq"))
                events = (_event_entry(r) for r in
                          conn.execute(f"SELECT {', '.join(_EVENT_COLS)} FROM events ORDER BY seq"))
                for entry in iter_sorted_entries(charges, events):
                    replay.feed(entry)
                head = conn.execute("SELECT seq, hash FROM chain_head WHERE id = 1").fetchone()
                pops = {r[0]: r[1:] for r in conn.execute(f"SELECT name, {_POP_COLS} FROM populations")}
                stored_totals = {(r[0], r[1]): r[2:] for r in conn.execute(
                    "SELECT population, consumer, charges, kinds, rho, curve FROM spend_totals")}
                triggers = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
                versions = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        except sqlite3.Error as exc:
            raise self._guard(exc) from exc
        problems = stored_state_problems(
            replay,
            head=None if head is None else (head[0], head[1]),
            populations=pops,
            totals=stored_totals,
            triggers=triggers,
            required_triggers=_TRIGGERS,
            versions=versions,
            required_versions=[v for v, _, _ in MIGRATIONS],
        )
        return VerifyReport(not problems, problems, replay.count, replay.head, replay.charges, replay.events)

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection this ledger opened (in this process). Idempotent."""
        with self._registry_lock:
            if os.getpid() == self._pid:
                for conn in self._all:
                    try:
                        conn.close()
                    except sqlite3.Error:  # pragma: no cover
                        pass
            self._all = []
            self._local = threading.local()
        self._closed = True

    def __enter__(self) -> "SqliteLedger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteLedger({str(self.path)!r})"


def open_sqlite_ledger(url: str, *, create: bool = True) -> SqliteLedger:
    """Open ``sqlite:///relative/path`` or ``sqlite:////absolute/path``.

    Query options: ``synchronous`` (full | extra | normal | off, default full),
    ``busy_timeout_ms`` (default 30000).

    Raises:
        LedgerError: not a ``sqlite:`` URL, no path, ``:memory:`` (one file is
            needed for several processes), bad options, or the file cannot be opened.
    """
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise LedgerError(f"not a sqlite URL: {url!r}")
    if parts.netloc:
        raise LedgerError("write sqlite URLs as sqlite:///relative/path or sqlite:////absolute/path",
                          {"url": url})
    path = unquote(parts.path)
    path = path[1:] if path.startswith("/") else path
    if not path or path == ":memory:":
        raise LedgerError("the SQLite ledger needs a file path (an in-memory database cannot be shared)",
                          {"url": url})
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(options) - {"synchronous", "busy_timeout_ms"}
    if unknown:
        raise LedgerError(f"unknown sqlite ledger option(s): {', '.join(sorted(unknown))}", {"url": url})
    try:
        busy = int(options.get("busy_timeout_ms", 30_000))
    except ValueError:
        raise LedgerError("busy_timeout_ms must be an integer", {"url": url}) from None
    return SqliteLedger(path, synchronous=options.get("synchronous", "full"), busy_timeout_ms=busy, create=create)
