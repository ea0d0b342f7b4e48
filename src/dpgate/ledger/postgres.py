"""The shared ledger: PostgreSQL (psycopg 3), for several gateway replicas at once.

Same rules, entries and reports as the SQLite ledger (:mod:`dpgate.ledger.sqlite`):
every decision, report, entry and hash comes from :mod:`dpgate.ledger.base` and
every statement on the ledger's tables from :mod:`dpgate.ledger.sql` (shared with
SQLite); this module only holds the connections, schema, migrations and locking.

Layout (schema versions 1 and 2, recorded in ``schema_migrations``; version 2 as for
SQLite: ``alpha_cap`` and ``selection_delta`` columns), in one PostgreSQL
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
import os
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterable, Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from dpgate.errors import LedgerError, LedgerUnavailable
from dpgate.ledger.connections import first_line as _first_line
from dpgate.ledger.base import GENESIS_HASH, utc_now
from dpgate.ledger.browse import BROWSE_MIGRATION
from dpgate.ledger.caps import GDP_MIGRATION
from dpgate.ledger.cohorts import COHORT_MIGRATION
from dpgate.ledger.sql import SqlLedger, SqlTransaction, orders_json

if TYPE_CHECKING:  # pragma: no cover
    from dpgate.releases import PostgresReleaseStore
    from dpgate.searches.store import PostgresSearchStore

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
    (
        2,
        "caps fixed at alpha_cap, partition-selection delta on caps, charges and totals",
        (
            "ALTER TABLE populations ADD COLUMN alpha_cap double precision",
            "ALTER TABLE populations ADD COLUMN selection_delta double precision NOT NULL DEFAULT 0",
            "ALTER TABLE charges ADD COLUMN selection_delta double precision",
            "ALTER TABLE spend_totals ADD COLUMN selection_delta text",
        ),
    ),
)

MIGRATIONS += (BROWSE_MIGRATION,)  # the ledger browser's indexes (dpgate.ledger.browse)
MIGRATIONS += (COHORT_MIGRATION,)  # cohorts: one budget per cohort (dpgate.ledger.cohorts; version 5)
MIGRATIONS += (GDP_MIGRATION,)  # Gaussian-DP composition (dpgate.ledger.caps; version 6)

_SCHEMA_RE_MAX = 63  # PostgreSQL identifiers are at most 63 bytes
_OPTIONS = ("schema", "lock_timeout_ms", "pool_size", "pool_timeout_ms")


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


class PostgresLedger(SqlLedger):
    """The ledger in a PostgreSQL schema (implements :class:`dpgate.ledger.base.Ledger`).

    Several processes and hosts may open the same database and schema at once;
    every charge is an atomic check-and-append across all of them (see the
    module docstring). The operations (ensure_population, set_cap, charge, spend,
    entries, events, populations, chain, verify) are
    :class:`dpgate.ledger.sql.SqlLedger`'s; this class holds the connection pool,
    schema, migrations and locking.

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

    _PARAM = "%s"
    _NAME_ORDER = 'name COLLATE "C"'  # code point order, whatever the database's collation
    #: every writer locks the chain-head row first: writers are serialised in chain order
    _HEAD_LOCK = "SELECT seq, hash FROM chain_head WHERE id = 1 FOR UPDATE"
    _REQUIRED_TRIGGERS = TRIGGERS
    _MIGRATIONS = MIGRATIONS

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
        super().__init__()
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
            kind = LedgerUnavailable if isinstance(exc, psycopg.OperationalError) else LedgerError
            raise kind(f"cannot connect to the ledger at {self._target}: {_first_line(exc)}",
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
            raise LedgerUnavailable(
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

    def _guard(self, exc: psycopg.Error, *, committing: bool = False) -> LedgerError:
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return LedgerUnavailable(f"the ledger is busy (lock timeout {self._lock_timeout_ms} ms); try again",
                                     {"target": self._target})
        what = "cannot commit to the ledger" if committing else "ledger store error"
        if committing:
            what += " (the outcome is unknown: check the entries before retrying)"
        details = {"target": self._target}
        if committing:
            details["outcome"] = "unknown"
        # connection refused or lost, server shutting down: retry later (503); a commit whose
        # outcome is unknown stays a LedgerError (500): retrying blindly could double a charge
        kind = LedgerUnavailable if isinstance(exc, psycopg.OperationalError) and not committing else LedgerError
        return kind(f"{what}: {_first_line(exc)}", details)

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
                             (orders_json(),))
                stored = conn.execute("SELECT value FROM ledger_meta WHERE key = 'orders'").fetchone()[0]
                if stored != orders_json():
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

    # -- hooks of SqlLedger ----------------------------------------------------------------

    def _begin(self, *, write: bool) -> Any:
        """One READ COMMITTED write transaction (the chain-head row is then locked by
        :attr:`_HEAD_LOCK`) or one REPEATABLE READ READ ONLY snapshot; yields a cursor."""
        if write:
            return self._transaction("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE")
        return self._transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    @contextmanager
    def _entry_streams(self, tx: SqlTransaction) -> Iterator[tuple[Iterable[Any], Iterable[Any]]]:
        """Charges and events through two server-side cursors (never all in memory)."""
        conn = tx.executor.connection
        with conn.cursor(name="dpgate_verify_charges") as cc, conn.cursor(name="dpgate_verify_events") as ce:
            cc.itersize = ce.itersize = 2000
            cc.execute(self._sql.charges + " ORDER BY seq")
            ce.execute(self._sql.events + " ORDER BY seq")
            yield cc, ce

    def _trigger_names(self, tx: SqlTransaction) -> set[str]:
        return {r[0] for r in tx.execute(
            "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname IN ('charges', 'events') AND NOT t.tgisinternal"
            " AND t.tgenabled IN ('O', 'A')",
            (self.schema,))}

    # -- releases and lifecycle ------------------------------------------------------------

    def release_store(self) -> "PostgresReleaseStore":
        """The release store in the ledger's database and schema
        (:class:`dpgate.releases.PostgresReleaseStore` borrowing from this ledger's pool:
        close it before the ledger).

        Raises:
            LedgerError: the releases table cannot be created.
        """
        from dpgate.releases import PostgresReleaseStore  # releases imports ledger, not the reverse

        return PostgresReleaseStore(self.connection, error=psycopg.Error)

    def search_store(self) -> "PostgresSearchStore":
        """The search store (issue 15) in the ledger's database and schema, borrowing from this
        ledger's pool (:class:`dpgate.searches.PostgresSearchStore`; close it before the ledger).

        Raises:
            LedgerError: the tables cannot be created.
        """
        from dpgate.searches.store import PostgresSearchStore  # searches imports ledger, not the reverse

        return PostgresSearchStore(self.connection, error=psycopg.Error)

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
