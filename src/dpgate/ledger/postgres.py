"""The shared ledger: PostgreSQL (psycopg 3), for several gateway replicas at once.

Same rules, entries and reports as the SQLite ledger (:mod:`dpgate.ledger.sqlite`):
every decision, report, entry and hash comes from :mod:`dpgate.ledger.base`; this
module only stores rows.

Layout (schema version 1, recorded in ``schema_migrations``), in one PostgreSQL
schema (``?schema=…`` in the URL, default ``public``):

* ``charges`` and ``events`` — the append-only entries. Triggers refuse any
  UPDATE, DELETE or TRUNCATE (``restrict_violation``). Both share one sequence
  (``seq``) and one SHA-256 hash chain (:func:`base.entry_hash`). JSON fields
  (cost, metadata, old, new) are stored as the exact canonical text that was
  hashed (``text``, not ``jsonb``, which would re-serialise them).
* ``populations``, ``spend_totals`` (exact fixed-point running totals, hex
  text) and ``chain_head`` — derived state, updated in the same transaction as
  the entry that changes them; :meth:`PostgresLedger.verify` recomputes it.
* ``ledger_meta`` — the RDP order grid the stored curves use.

Concurrency across processes and replicas: every write is one READ COMMITTED
transaction that first locks the single ``chain_head`` row (``SELECT … FOR
UPDATE``). Every writer of the hash chain must take that lock, so writers are
serialised in chain order, and each statement after the lock sees everything
committed before it (READ COMMITTED takes a fresh snapshot per statement):
reading the totals, deciding with the filters, appending and updating the
totals is one atomic check-and-append. A unique index on
``(population, release_key)`` backs the single-flight check. Reads run in
REPEATABLE READ READ ONLY transactions (one consistent snapshot each).

Connections come from a bounded pool (``psycopg_pool.ConnectionPool``, at most
``pool_size`` per process, default 10, whatever the number of server threads), in
autocommit mode with explicit ``BEGIN``; a transaction borrows one connection and
returns it. A forked child builds its own pool and never touches its parent's
connections. A connection the server dropped while idle (restart, failover, idle
timeout) is replaced and the transaction retried once, since nothing of it was
sent yet.

The release store (:class:`dpgate.releases.PostgresReleaseStore`) lives in the
same database and schema and borrows connections from the same pool
(:meth:`PostgresLedger.release_store`, :meth:`PostgresLedger.connection`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from dpgate.accounting import ORDERS, Cost
from dpgate.errors import LedgerError
from dpgate.ledger.base import (
    CHARGE_COLUMNS,
    EVENT_COLUMNS,
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
    charge_entry,
    charge_epsilon,
    check_charge,
    display_charge,
    display_event,
    event_entry,
    iter_sorted_entries,
    new_charge_entry,
    new_event_entry,
    population_from_row,
    prepare_charge,
    receipt_from_entry,
    stored_state_problems,
    unknown_population,
    utc_now,
    validate_cap,
    validate_governance,
    validate_limit,
    validate_name,
    validate_population,
)

if TYPE_CHECKING:  # pragma: no cover
    from dpgate.releases import PostgresReleaseStore

__all__ = ["PostgresLedger", "MIGRATIONS", "TRIGGERS", "open_postgres_ledger", "advisory_key"]

#: The append-only triggers :meth:`PostgresLedger.verify` requires (present and enabled).
TRIGGERS = (
    "charges_no_update", "charges_no_delete", "charges_no_truncate",
    "events_no_update", "events_no_delete", "events_no_truncate",
)  # fmt: skip

#: Schema migrations: (version, name, statements). Applied in order, once each, in one
#: transaction holding an advisory lock (so replicas starting together migrate once);
#: recorded in ``schema_migrations``. Never edit a released migration: append a new one.
MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (
        1,
        "ledger: populations, events, charges, totals, chain head, append-only triggers",
        (
            """CREATE TABLE ledger_meta (
                key   text PRIMARY KEY,
                value text NOT NULL
            )""",
            """CREATE TABLE populations (
                name        text PRIMARY KEY,
                epsilon     double precision NOT NULL,
                delta       double precision NOT NULL,
                rho_cap     double precision NOT NULL,
                alpha_star  double precision NOT NULL,
                rho_stated  boolean NOT NULL,
                allocations text NOT NULL,
                created_at  text NOT NULL
            )""",
            """CREATE TABLE events (
                seq        bigint PRIMARY KEY,
                event_id   text NOT NULL UNIQUE,
                population text NOT NULL,
                kind       text NOT NULL,
                actor      text NOT NULL,
                reason     text NOT NULL,
                old        text,
                new        text NOT NULL,
                created_at text NOT NULL,
                prev_hash  text NOT NULL,
                hash       text NOT NULL
            )""",
            "CREATE INDEX events_by_population ON events (population, seq)",
            """CREATE TABLE charges (
                seq              bigint PRIMARY KEY,
                charge_id        text NOT NULL UNIQUE,
                population       text NOT NULL REFERENCES populations (name),
                consumer         text NOT NULL,
                kind             text NOT NULL,
                rho              double precision NOT NULL,
                epsilon_at_delta double precision NOT NULL,
                delta            double precision NOT NULL,
                cost             text NOT NULL,
                purpose          text NOT NULL,
                release_key      text,
                metadata         text NOT NULL,
                created_at       text NOT NULL,
                prev_hash        text NOT NULL,
                hash             text NOT NULL
            )""",
            "CREATE INDEX charges_by_population ON charges (population, seq)",
            """CREATE UNIQUE INDEX charges_release_key ON charges (population, release_key)
               WHERE release_key IS NOT NULL""",
            """CREATE TABLE spend_totals (
                population text NOT NULL,
                consumer   text NOT NULL,
                charges    bigint NOT NULL,
                kinds      integer NOT NULL,
                rho        text NOT NULL,
                curve      text,
                PRIMARY KEY (population, consumer)
            )""",
            """CREATE TABLE chain_head (
                id   integer PRIMARY KEY CHECK (id = 1),
                seq  bigint NOT NULL,
                hash text NOT NULL
            )""",
            f"INSERT INTO chain_head (id, seq, hash) VALUES (1, 0, '{GENESIS_HASH}')",
            """CREATE FUNCTION dpgate_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN
                   RAISE EXCEPTION 'ledger % are append-only', TG_TABLE_NAME
                       USING ERRCODE = 'restrict_violation';
               END
               $$""",
            """CREATE TRIGGER charges_no_update BEFORE UPDATE ON charges
               FOR EACH ROW EXECUTE FUNCTION dpgate_ledger_append_only()""",
            """CREATE TRIGGER charges_no_delete BEFORE DELETE ON charges
               FOR EACH ROW EXECUTE FUNCTION dpgate_ledger_append_only()""",
            """CREATE TRIGGER charges_no_truncate BEFORE TRUNCATE ON charges
               FOR EACH STATEMENT EXECUTE FUNCTION dpgate_ledger_append_only()""",
            """CREATE TRIGGER events_no_update BEFORE UPDATE ON events
               FOR EACH ROW EXECUTE FUNCTION dpgate_ledger_append_only()""",
            """CREATE TRIGGER events_no_delete BEFORE DELETE ON events
               FOR EACH ROW EXECUTE FUNCTION dpgate_ledger_append_only()""",
            """CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
               FOR EACH STATEMENT EXECUTE FUNCTION dpgate_ledger_append_only()""",
        ),
    ),
)

_CHARGE_SELECT = f"SELECT {', '.join(CHARGE_COLUMNS)} FROM charges"
_EVENT_SELECT = f"SELECT {', '.join(EVENT_COLUMNS)} FROM events"
_POP_SELECT = f"SELECT {', '.join(POPULATION_COLUMNS)} FROM populations WHERE name = %s"
_INSERT_CHARGE = (f"INSERT INTO charges ({', '.join(CHARGE_COLUMNS)})"
                  f" VALUES ({', '.join(['%s'] * len(CHARGE_COLUMNS))})")
_INSERT_EVENT = (f"INSERT INTO events ({', '.join(EVENT_COLUMNS)})"
                 f" VALUES ({', '.join(['%s'] * len(EVENT_COLUMNS))})")
_UPSERT_TOTALS = (
    "INSERT INTO spend_totals (population, consumer, charges, kinds, rho, curve)"
    " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (population, consumer) DO UPDATE SET"
    " charges = excluded.charges, kinds = excluded.kinds, rho = excluded.rho, curve = excluded.curve"
)
_SCHEMA_RE_MAX = 63  # PostgreSQL identifiers are at most 63 bytes
_OPTIONS = ("schema", "lock_timeout_ms", "pool_size", "pool_timeout_ms")


def _orders_json() -> str:
    return json.dumps(["inf" if math.isinf(a) else a for a in ORDERS])


def advisory_key(label: str) -> int:
    """A signed 64-bit key for ``pg_advisory_xact_lock`` derived from ``label`` (SHA-256)."""
    return int.from_bytes(hashlib.sha256(label.encode("utf-8")).digest()[:8], "big", signed=True)


def _redact(conninfo: str) -> str:
    """The connection target for messages: host, port and database, never the password."""
    try:
        d = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "the PostgreSQL server"
    host = d.get("host") or d.get("hostaddr") or "localhost"
    return f"postgresql://{host}:{d.get('port') or 5432}/{d.get('dbname') or ''}"


class PostgresLedger:
    """The ledger in a PostgreSQL schema (implements :class:`dpgate.ledger.base.Ledger`).

    Several processes and hosts may open the same database and schema at once;
    every charge is an atomic check-and-append across all of them (see the
    module docstring).

    Args:
        conninfo: a libpq connection string or ``postgresql://`` URL (without
            dpgate's own options).
        schema: the PostgreSQL schema holding the tables (created if absent;
            default ``public``).
        lock_timeout_ms: how long a write waits for another writer's lock before
            failing with :class:`~dpgate.errors.LedgerError` (PostgreSQL
            ``lock_timeout``; 0 waits forever).
        pool_size: most connections this process keeps open (≥ 1); threads beyond
            it wait for a free connection.
        pool_timeout_ms: how long a thread waits for a free (or new) connection
            before failing with :class:`~dpgate.errors.LedgerError`.

    Attributes:
        conninfo: the connection string (may contain a password: never log it).
        schema: the schema name.

    Raises:
        LedgerError: bad arguments, the server cannot be reached, the schema
            cannot be migrated, holds a newer schema version, or uses another RDP
            order grid.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "public",
        lock_timeout_ms: int = 30_000,
        pool_size: int = 10,
        pool_timeout_ms: int = 30_000,
    ) -> None:
        if not isinstance(schema, str) or not schema or len(schema.encode("utf-8")) > _SCHEMA_RE_MAX \
                or "\x00" in schema:
            raise LedgerError(f"schema must be a PostgreSQL identifier of 1-63 bytes, got {schema!r}")
        for name, value, low in (("lock_timeout_ms", lock_timeout_ms, 0), ("pool_size", pool_size, 1),
                                 ("pool_timeout_ms", pool_timeout_ms, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise LedgerError(f"{name} must be an integer >= {low}, got {value!r}")
        self.conninfo = conninfo
        self.schema = schema
        self._lock_timeout_ms = lock_timeout_ms
        self._pool_size = pool_size
        self._pool_timeout_s = pool_timeout_ms / 1000.0
        self._target = _redact(conninfo)
        self._pool: ConnectionPool | None = None
        self._inherited: list[ConnectionPool] = []  # a parent process's pools: never used or closed
        self._pool_lock = threading.Lock()
        self._pid = os.getpid()
        self._delta_hint: dict[str, float] = {}
        self._closed = False
        conn = self.connect()  # fails fast, with the server's own message, if unreachable
        try:
            self._migrate(conn)
        finally:
            conn.close()

    # -- connections -------------------------------------------------------------------

    def _configure(self, conn: psycopg.Connection) -> None:
        conn.execute("SELECT set_config('search_path', %s, false), set_config('lock_timeout', %s, false)",
                     (sql.Identifier(self.schema).as_string(conn), f"{self._lock_timeout_ms}ms"))

    def connect(self) -> psycopg.Connection:
        """A new connection of its own to the ledger's database, in autocommit mode, with
        ``search_path`` set to the ledger's schema and the ledger's ``lock_timeout``.

        The caller owns (and closes) it. Prefer :meth:`connection`, which borrows one
        from the ledger's pool.

        Raises:
            LedgerError: the server cannot be reached or refuses the connection.
        """
        try:
            conn = psycopg.connect(self.conninfo, autocommit=True)
        except psycopg.Error as exc:
            raise LedgerError(f"cannot connect to the ledger at {self._target}: {_first_line(exc)}",
                              {"target": self._target}) from exc
        try:
            self._configure(conn)
        except psycopg.Error as exc:
            conn.close()
            raise LedgerError(f"cannot configure the ledger connection: {_first_line(exc)}",
                              {"target": self._target}) from exc
        return conn

    def _get_pool(self) -> ConnectionPool:
        if self._closed:
            raise LedgerError("the ledger is closed")
        pid = os.getpid()
        if self._pool is None or pid != self._pid:
            with self._pool_lock:
                if self._closed:
                    raise LedgerError("the ledger is closed")
                if pid != self._pid:  # forked: the parent's pool holds the parent's sockets
                    if self._pool is not None:
                        self._inherited.append(self._pool)
                    self._pool = None
                    self._pool_lock = threading.Lock()
                    self._pid = pid
                if self._pool is None:
                    self._pool = ConnectionPool(
                        self.conninfo, min_size=1, max_size=self._pool_size, kwargs={"autocommit": True},
                        configure=self._configure, timeout=self._pool_timeout_s, open=True,
                        name=f"dpgate-ledger-{self.schema}",
                    )
        return self._pool

    def _getconn(self) -> psycopg.Connection:
        pool = self._get_pool()
        try:
            return pool.getconn()
        except PoolTimeout as exc:
            raise LedgerError(
                f"no connection to the ledger at {self._target} within {self._pool_timeout_s:g} s "
                "(server unreachable, or every pooled connection busy); try again",
                {"target": self._target},
            ) from exc

    def _putconn(self, conn: psycopg.Connection) -> None:
        pool = self._pool
        if pool is not None and os.getpid() == self._pid:
            try:
                pool.putconn(conn)  # a broken connection is discarded and replaced
                return
            except Exception:  # noqa: BLE001 - the pool was closed meanwhile
                pass
        if os.getpid() == self._pid:
            conn.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """Borrow a connection from the ledger's pool (autocommit mode, ``search_path`` =
        the ledger's schema); it goes back to the pool on exit, rolled back if left in a
        transaction. Used by :class:`dpgate.releases.PostgresReleaseStore`.

        Raises:
            LedgerError: the ledger is closed, or no connection within ``pool_timeout_ms``.
        """
        conn = self._getconn()
        try:
            yield conn
        finally:
            self._putconn(conn)

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[psycopg.Cursor]:
        conn = self._getconn()
        try:
            try:
                conn.execute(begin)
            except psycopg.Error as exc:
                if not (conn.closed or conn.broken):
                    raise self._guard(exc) from exc
                # the connection was lost while idle (server restart, failover, idle timeout):
                # nothing was sent in this transaction yet, so one retry on another one is safe
                self._putconn(conn)
                conn = self._getconn()
                try:
                    conn.execute(begin)
                except psycopg.Error as exc2:
                    raise self._guard(exc2) from exc2
            try:
                with conn.cursor() as cur:
                    yield cur
            except BaseException as exc:
                try:
                    if not conn.closed:
                        conn.execute("ROLLBACK")
                except psycopg.Error:  # pragma: no cover - connection lost
                    pass
                if isinstance(exc, psycopg.Error):
                    raise self._guard(exc) from exc
                raise
            try:
                conn.execute("COMMIT")
            except psycopg.Error as exc:
                raise self._guard(exc, committing=True) from exc
        finally:
            self._putconn(conn)

    @contextmanager
    def _write(self) -> Iterator[tuple[psycopg.Cursor, int, str]]:
        """One write transaction holding the chain-head row lock; yields (cursor, head seq, head hash)."""
        with self._transaction("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE") as cur:
            row = cur.execute("SELECT seq, hash FROM chain_head WHERE id = 1 FOR UPDATE").fetchone()
            if row is None:
                raise LedgerError("the ledger's chain head row is missing (run dpgate ledger verify)")
            yield cur, int(row[0]), row[1]

    def _read(self) -> Any:
        """One read-only transaction on a consistent snapshot."""
        return self._transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def _guard(self, exc: psycopg.Error, *, committing: bool = False) -> LedgerError:
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return LedgerError(f"the ledger is busy (lock timeout {self._lock_timeout_ms} ms); try again",
                               {"target": self._target})
        what = "cannot commit to the ledger" if committing else "ledger store error"
        if committing:
            what += " (the outcome is unknown: check the entries before retrying)"
        return LedgerError(f"{what}: {_first_line(exc)}", {"target": self._target})

    # -- schema --------------------------------------------------------------------------

    def _migrate(self, conn: psycopg.Connection) -> None:
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key(f"dpgate.ledger:{self.schema}"),))
                if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)).fetchone() is None:
                    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL, applied_at text NOT NULL)"
                )
                done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
                unknown = done - {v for v, _, _ in MIGRATIONS}
                if unknown:
                    raise LedgerError(
                        f"the ledger at {self._target} (schema {self.schema!r}) has schema version(s) "
                        f"{sorted(unknown)} newer than this dpgate; upgrade dpgate",
                        {"target": self._target, "schema": self.schema},
                    )
                for version, name, statements in MIGRATIONS:
                    if version in done:
                        continue
                    for stmt in statements:
                        conn.execute(stmt)  # type: ignore[arg-type] - constant DDL
                    conn.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
                                 (version, name, utc_now()))
                conn.execute("INSERT INTO ledger_meta (key, value) VALUES ('orders', %s) ON CONFLICT DO NOTHING",
                             (_orders_json(),))
                stored = conn.execute("SELECT value FROM ledger_meta WHERE key = 'orders'").fetchone()[0]
                if stored != _orders_json():
                    raise LedgerError(
                        f"the ledger at {self._target} (schema {self.schema!r}) stores RDP curves on "
                        "another order grid than accounting.ORDERS; it cannot be used with this dpgate",
                        {"target": self._target, "schema": self.schema},
                    )
        except psycopg.Error as exc:
            raise LedgerError(
                f"the ledger at {self._target} (schema {self.schema!r}) is not usable: {_first_line(exc)}",
                {"target": self._target, "schema": self.schema},
            ) from exc

    # -- internals -----------------------------------------------------------------------

    @staticmethod
    def _population_row(cur: psycopg.Cursor, name: str) -> tuple[CapSpec, dict[str, float]] | None:
        row = cur.execute(_POP_SELECT, (name,)).fetchone()
        return None if row is None else population_from_row(row)

    @staticmethod
    def _append_event(
        cur: psycopg.Cursor,
        head: list[Any],
        population: str,
        kind: str,
        actor: str,
        reason: str,
        old: Mapping[str, Any] | None,
        new: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Append one event after ``head`` = [seq, hash] (updated in place) and move the chain head."""
        entry = new_event_entry(population, kind, actor, reason, old, new, seq=head[0] + 1, prev_hash=head[1])
        cur.execute(_INSERT_EVENT, tuple(entry[c] for c in EVENT_COLUMNS))
        cur.execute("UPDATE chain_head SET seq = %s, hash = %s WHERE id = 1", (entry["seq"], entry["hash"]))
        head[0], head[1] = entry["seq"], entry["hash"]
        return entry

    @staticmethod
    def _totals(cur: psycopg.Cursor, population: str, consumer: str) -> tuple[Totals, Totals]:
        pt = ct = Totals()
        for row in cur.execute(
            "SELECT consumer, charges, kinds, rho, curve FROM spend_totals"
            " WHERE population = %s AND consumer IN ('', %s)",
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

        Same contract as :meth:`dpgate.ledger.sqlite.SqliteLedger.ensure_population`:
        the cap (ε, δ) is fixed into B(α) = α·ρ_cap with ρ_cap =
        ``accounting.rho_for_cap(ε, δ, "tight")`` ([CKS20] Cor. 13), or stated as
        ``rho_cap`` directly; creation is a ``population_created`` event, a differing
        cap ``cap_changed`` and differing allocations ``allocations_changed``; equal
        values write nothing (idempotent; safe when several replicas start at once).

        Args:
            name: population name (1-128 characters ``[A-Za-z0-9._:@/+-]``).
            epsilon: cap ε > 0 (total), or None with ``rho_cap``.
            delta: cap δ in (0, 1).
            allocations: consumer → share in [0, 1], summing to ≤ 1 (empty or None: open).
            actor, reason: recorded with the events (non-empty).
            rho_cap: the budget in ρ (total), instead of ε.

        Raises:
            PolicyError: invalid name, cap, allocations, actor or reason (nothing written).
            LedgerError: the store failed.
        """
        cap, allocs = validate_population(name, epsilon, delta, allocations, actor, reason, rho_cap)
        with self._write() as (cur, seq, hash_):
            head = [seq, hash_]
            current = self._population_row(cur, name)
            if current is None:
                cur.execute(
                    "INSERT INTO populations (name, epsilon, delta, rho_cap, alpha_star, rho_stated,"
                    " allocations, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    (name, cap.epsilon, cap.delta, cap.rho_cap, cap.alpha_star, cap.rho_stated,
                     canonical_json(allocs), utc_now()),
                )
                self._append_event(cur, head, name, "population_created", actor, reason, None,
                                   {"cap": cap.to_dict(), "allocations": allocs})
            else:
                old_cap, old_allocs = current
                if not old_cap.same_cap(cap):
                    self._apply_cap(cur, head, name, old_cap, cap, actor, reason)
                if old_allocs != allocs:
                    cur.execute("UPDATE populations SET allocations = %s WHERE name = %s",
                                (canonical_json(allocs), name))
                    self._append_event(cur, head, name, "allocations_changed", actor, reason,
                                       {"allocations": old_allocs}, {"allocations": allocs})
        self._delta_hint[name] = cap.delta

    def _apply_cap(self, cur: psycopg.Cursor, head: list[Any], name: str, old: CapSpec, new: CapSpec,
                   actor: str, reason: str) -> dict[str, Any]:
        cur.execute(
            "UPDATE populations SET epsilon = %s, delta = %s, rho_cap = %s, alpha_star = %s, rho_stated = %s"
            " WHERE name = %s",
            (new.epsilon, new.delta, new.rho_cap, new.alpha_star, new.rho_stated, name),
        )
        return self._append_event(cur, head, name, "cap_changed", actor, reason, old.to_dict(), new.to_dict())

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

        Same contract as :meth:`dpgate.ledger.sqlite.SqliteLedger.set_cap`: lowering
        the cap below the spend refuses every later charge; an equal cap records
        nothing (``changed`` False).

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
        event = None
        with self._write() as (cur, seq, hash_):
            current = self._population_row(cur, population)
            if current is None:
                raise unknown_population(population)
            old = current[0]
            if not old.same_cap(cap):
                event = self._apply_cap(cur, [seq, hash_], population, old, cap, actor, reason)
        if event is not None:
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

        One READ COMMITTED transaction that locks the chain head (``FOR UPDATE``)
        first, so that charges from every process and replica are serialised: read
        the cap, allocations and exact totals; return the stored receipt if
        ``release_key`` was charged before (single flight); decide with
        :func:`dpgate.ledger.base.check_charge` (zCDP filter and Rényi filter:
        Feldman & Zrnic 2021, §3; Whitehouse et al. 2023) against share × B(α) for
        the consumer and B(α) = α·ρ_cap for the population; append the
        hash-chained entry; update the totals and the chain head; commit. Never
        refunded.

        Args:
            population: the population charged.
            consumer: the allocation charged (any name for an open population).
            cost: the cost of this charge (ρ or an RDP curve on ``accounting.ORDERS``).
            purpose: non-empty description stored with the entry.
            release_key: single-flight key (e.g. the release cache key), or None.
            metadata: JSON-serialisable mapping stored with the entry (no NaN/inf).

        Returns:
            :class:`~dpgate.ledger.base.ChargeReceipt` (``duplicate=True`` if
            ``release_key`` had been charged: nothing new written).

        Raises:
            InvalidBudget: invalid cost. InvalidRequest: invalid name, purpose,
                release_key or metadata. UnknownPopulation, UnknownConsumer: not found.
            BudgetExhausted: a filter refuses (details in ρ and ε at the cap's δ);
                nothing written.
            LedgerError: the store failed, or the lock wait exceeded ``lock_timeout_ms``.
        """
        req = prepare_charge(population, consumer, cost, purpose=purpose, release_key=release_key,
                             metadata=metadata)
        hint = self._delta_hint.get(population)
        eps = charge_epsilon(req.cost, hint) if hint is not None else None  # outside the lock
        refusal = None
        receipt: ChargeReceipt | None = None
        with self._write() as (cur, seq, hash_):
            current = self._population_row(cur, population)
            if current is None:
                raise unknown_population(population)
            cap, allocs = current
            share = allocation_share(population, consumer, allocs)
            if release_key is not None:
                row = cur.execute(_CHARGE_SELECT + " WHERE population = %s AND release_key = %s",
                                  (population, release_key)).fetchone()
                if row is not None:
                    receipt = receipt_from_entry(charge_entry(row), duplicate=True)
            if receipt is None:
                pt, ct = self._totals(cur, population, consumer)
                pt_after, ct_after, refusal = check_charge(req, cap, share, pt, ct)
                if refusal is None:
                    if eps is None or hint != cap.delta:
                        eps = charge_epsilon(req.cost, cap.delta)
                    entry = new_charge_entry(req, seq=seq + 1, prev_hash=hash_, epsilon_at_delta=eps,
                                             delta=cap.delta)
                    cur.execute(_INSERT_CHARGE, tuple(entry[c] for c in CHARGE_COLUMNS))
                    cur.executemany(_UPSERT_TOTALS, [(population, "", *pt_after.to_row()),
                                                     (population, consumer, *ct_after.to_row())])
                    cur.execute("UPDATE chain_head SET seq = %s, hash = %s WHERE id = 1",
                                (entry["seq"], entry["hash"]))
                    receipt = receipt_from_entry(entry, duplicate=False, cost=req.cost)
        self._delta_hint[population] = cap.delta
        if refusal is not None:
            raise refusal.error()
        assert receipt is not None
        return receipt

    # -- reading -------------------------------------------------------------------------

    def populations(self) -> list[str]:
        """Population names, sorted (read-only)."""
        with self._read() as cur:
            return [r[0] for r in cur.execute("SELECT name FROM populations ORDER BY name COLLATE \"C\"")]

    def spend(self, population: str) -> SpendReport:
        """Spent and remaining budget of ``population`` and of each consumer (read-only,
        one snapshot); see :func:`dpgate.ledger.base.build_spend_report`.

        Raises:
            UnknownPopulation: no such population. LedgerError: the store failed.
        """
        with self._read() as cur:
            current = self._population_row(cur, population)
            if current is None:
                raise unknown_population(population)
            rows = cur.execute(
                "SELECT consumer, charges, kinds, rho, curve FROM spend_totals WHERE population = %s",
                (population,),
            ).fetchall()
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
        query = _CHARGE_SELECT
        args: list[Any] = []
        if population is not None:
            query += " WHERE population = %s"
            args.append(population)
        query += " ORDER BY seq DESC"
        if limit is not None:
            query += " LIMIT %s"
            args.append(limit)
        with self._read() as cur:
            rows = cur.execute(query, args).fetchall()  # type: ignore[call-overload]
        return [display_charge(charge_entry(r)) for r in reversed(rows)]

    def events(self, population: str | None = None) -> list[dict[str, Any]]:
        """Governance events in ``seq`` order (read-only); dicts as in
        :meth:`dpgate.ledger.sqlite.SqliteLedger.events` (``old``/``new`` parsed)."""
        query = _EVENT_SELECT
        args: tuple = ()
        if population is not None:
            query += " WHERE population = %s"
            args = (population,)
        with self._read() as cur:
            rows = cur.execute(query + " ORDER BY seq", args).fetchall()  # type: ignore[call-overload]
        return [display_event(event_entry(r)) for r in rows]

    def chain(self) -> list[dict[str, Any]]:
        """Every entry (charges and events) in ``seq`` order, exactly as hashed (read-only):
        :func:`dpgate.ledger.base.entry_hash` of each dict reproduces its ``hash``."""
        with self._read() as cur:
            charges = [charge_entry(r) for r in cur.execute(_CHARGE_SELECT + " ORDER BY seq").fetchall()]
            events = [event_entry(r) for r in cur.execute(_EVENT_SELECT + " ORDER BY seq").fetchall()]
        return list(iter_sorted_entries(charges, events))

    def verify(self) -> VerifyReport:
        """Check the ledger's integrity (read-only; one consistent snapshot).

        Recomputes from the entries alone (:class:`dpgate.ledger.base.Replay`, entries
        streamed with server-side cursors): the hash chain, the caps and allocations in
        force, the exact spend per population and consumer, and that every charge
        fitted its filters when written; then compares with the stored derived state
        and checks that the append-only triggers exist *and are enabled* and that the
        schema migrations are recorded (:func:`dpgate.ledger.base.stored_state_problems`).

        Returns:
            :class:`~dpgate.ledger.base.VerifyReport`.

        Raises:
            LedgerError: the store cannot be read.
        """
        replay = Replay()
        with self._read() as cur:
            conn = cur.connection
            with conn.cursor(name="dpgate_verify_charges") as cc, conn.cursor(name="dpgate_verify_events") as ce:
                cc.itersize = ce.itersize = 2000
                cc.execute(_CHARGE_SELECT + " ORDER BY seq")
                ce.execute(_EVENT_SELECT + " ORDER BY seq")
                for entry in iter_sorted_entries((charge_entry(r) for r in cc), (event_entry(r) for r in ce)):
                    replay.feed(entry)
            head = cur.execute("SELECT seq, hash FROM chain_head WHERE id = 1").fetchone()
            pops = {r[0]: r[1:] for r in cur.execute(
                f"SELECT name, {', '.join(POPULATION_COLUMNS)} FROM populations")}
            stored_totals = {(r[0], r[1]): r[2:] for r in cur.execute(
                "SELECT population, consumer, charges, kinds, rho, curve FROM spend_totals")}
            triggers = {r[0] for r in cur.execute(
                "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname IN ('charges', 'events') AND NOT t.tgisinternal"
                " AND t.tgenabled IN ('O', 'A')",
                (self.schema,))}
            versions = {r[0] for r in cur.execute("SELECT version FROM schema_migrations")}
        problems = stored_state_problems(
            replay,
            head=None if head is None else (int(head[0]), head[1]),
            populations=pops,
            totals=stored_totals,
            triggers=triggers,
            required_triggers=TRIGGERS,
            versions=versions,
            required_versions=[v for v, _, _ in MIGRATIONS],
        )
        return VerifyReport(not problems, problems, replay.count, replay.head, replay.charges, replay.events)

    # -- releases and lifecycle ------------------------------------------------------------

    def release_store(self) -> "PostgresReleaseStore":
        """The release store in the ledger's database and schema
        (:class:`dpgate.releases.PostgresReleaseStore` borrowing from this ledger's pool:
        close it before the ledger).

        Raises:
            LedgerError: the releases table cannot be created.
        """
        from dpgate.releases import PostgresReleaseStore  # releases imports ledger, not the reverse

        return PostgresReleaseStore(self.connection)

    def close(self) -> None:
        """Close this process's connection pool (never a parent process's). Idempotent."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None and os.getpid() == self._pid:
            pool.close()

    def __enter__(self) -> "PostgresLedger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresLedger({self._target!r}, schema={self.schema!r})"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def open_postgres_ledger(url: str) -> PostgresLedger:
    """Open ``postgresql://user[:password]@host[:port]/dbname[?options]``.

    Also accepted: ``postgres://`` and ``postgresql+psycopg://`` (SQLAlchemy style).
    dpgate's own query options:

    * ``schema`` — the PostgreSQL schema holding the ledger and release tables
      (created if absent; default ``public``);
    * ``lock_timeout_ms`` — how long a write waits for another writer (default 30000);
    * ``pool_size`` — most connections per process (default 10);
    * ``pool_timeout_ms`` — how long a request waits for a pooled connection (default 30000).

    Every other query option goes to libpq (e.g. ``sslmode=require``,
    ``connect_timeout=10``, ``application_name``, default ``dpgate``).

    Raises:
        LedgerError: not a PostgreSQL URL, bad options, the server cannot be reached,
            or the schema cannot be migrated.
    """
    if not isinstance(url, str):
        raise LedgerError(f"not a ledger URL: {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("postgresql", "postgres") and not scheme.startswith("postgresql+"):
        raise LedgerError(f"not a postgresql URL: {url.split('@')[-1]!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _OPTIONS}
    rest = [(k, v) for k, v in query if k not in _OPTIONS]
    if not any(k == "application_name" for k, _ in rest):
        rest.append(("application_name", "dpgate"))
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(rest), ""))
    try:
        psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        raise LedgerError(f"invalid postgresql URL: {_first_line(exc)}") from None
    numbers: dict[str, int] = {}
    for name, default in (("lock_timeout_ms", 30_000), ("pool_size", 10), ("pool_timeout_ms", 30_000)):
        try:
            numbers[name] = int(ours.get(name, default))
        except ValueError:
            raise LedgerError(f"{name} must be an integer, got {ours[name]!r}") from None
    return PostgresLedger(conninfo, schema=ours.get("schema", "public"), **numbers)
