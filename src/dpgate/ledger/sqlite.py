"""The embedded ledger: one SQLite file (stdlib ``sqlite3``, WAL journal).

Layout (schema versions 1 and 2, recorded in ``schema_migrations``):

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

Version 2 added ``alpha_cap`` and ``selection_delta`` to ``populations`` (NULL
``alpha_cap``: a cap fixed by the legacy rule, kept as it was), and
``selection_delta`` to ``charges`` and ``spend_totals`` (NULL: none spent); rows
written before keep their hashes.

Concurrency: each thread of each process has its own connection; a charge is
one ``BEGIN IMMEDIATE`` transaction (SQLite's write lock, held across
processes; waiting writers retry for ``busy_timeout``) that reads the totals,
decides, appends and commits — so check-and-append is atomic across threads and
processes. Threads of one process also queue on a lock first, which avoids
SQLite's sleeping busy handler between them. ``synchronous=FULL`` (default)
makes a committed charge survive power loss, not only a crashed process.

The operations on these tables (governance, charging, reading, verifying) are
:class:`dpgate.ledger.sql.SqlLedger`'s, shared with the PostgreSQL backend; this
module holds the connections, pragmas, schema, migrations and locking.

The release store (:mod:`dpgate.releases`) shares the file through
:meth:`SqliteLedger.connect`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, unquote, urlsplit

from dpgate.errors import DpgateError, LedgerError, LedgerUnavailable
from dpgate.ledger.base import GENESIS_HASH, utc_now
from dpgate.ledger.browse import BROWSE_MIGRATION
from dpgate.ledger.connections import is_unavailable
from dpgate.ledger.caps import GDP_MIGRATION
from dpgate.ledger.cohorts import COHORT_MIGRATION
from dpgate.ledger.sql import SqlLedger, SqlTransaction, orders_json

__all__ = ["SqliteLedger", "MIGRATIONS", "open_sqlite_ledger"]

#: The append-only triggers :meth:`SqliteLedger.verify` requires.
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
    (
        2,
        "caps fixed at alpha_cap, partition-selection delta on caps, charges and totals",
        (
            "ALTER TABLE populations ADD COLUMN alpha_cap REAL",
            "ALTER TABLE populations ADD COLUMN selection_delta REAL NOT NULL DEFAULT 0",
            "ALTER TABLE charges ADD COLUMN selection_delta REAL",
            "ALTER TABLE spend_totals ADD COLUMN selection_delta TEXT",
        ),
    ),
)

MIGRATIONS += (BROWSE_MIGRATION,)  # the ledger browser's indexes (dpgate.ledger.browse)
MIGRATIONS += (COHORT_MIGRATION,)  # cohorts: one budget per cohort (dpgate.ledger.cohorts; version 5)
MIGRATIONS += (GDP_MIGRATION,)  # Gaussian-DP composition (dpgate.ledger.caps; version 6)

_SYNC_MODES = {"off": "OFF", "normal": "NORMAL", "full": "FULL", "extra": "EXTRA"}


class SqliteLedger(SqlLedger):
    """The ledger in one SQLite file (implements :class:`dpgate.ledger.base.Ledger`).

    The operations (ensure_population, set_cap, charge, spend, entries, events,
    populations, chain, verify) are :class:`dpgate.ledger.sql.SqlLedger`'s; this
    class holds the connections, pragmas, schema and locking: every write is one
    ``BEGIN IMMEDIATE`` transaction.

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

    _PARAM = "?"
    _NAME_ORDER = "name"  # SQLite's default BINARY collation: code point order
    _HEAD_LOCK = None  # BEGIN IMMEDIATE already excludes every other writer
    _REQUIRED_TRIGGERS = _TRIGGERS
    _MIGRATIONS = MIGRATIONS

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "full",
        busy_timeout_ms: int = 30_000,
        create: bool = True,
    ) -> None:
        super().__init__()
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
            raise LedgerUnavailable(f"cannot open the ledger at {self.path}: {exc}", {"path": str(self.path)}) from exc
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
        # threads of this process queue here first: bounded by the same wait as another process's lock
        if not self._wlock.acquire(timeout=self._busy_ms / 1000.0 if self._busy_ms else -1):
            raise LedgerUnavailable(f"the ledger is busy (no write slot within {self._busy_ms} ms); try again",
                                    {"path": str(self.path)})
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise LedgerUnavailable(f"the ledger is busy ({exc}); try again",
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
                raise LedgerError(f"cannot commit to the ledger (the outcome is unknown): {exc}",
                                  {"outcome": "unknown"}) from exc
        finally:
            self._wlock.release()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: a consistent snapshot; never writes."""
        conn = self._conn()
        try:
            conn.execute("BEGIN")
        except sqlite3.Error as exc:  # pragma: no cover
            kind = LedgerUnavailable if is_unavailable(exc) else LedgerError
            raise kind(f"cannot read the ledger: {exc}") from exc
        try:
            yield conn
        finally:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:  # pragma: no cover
                pass

    def _guard(self, exc: sqlite3.Error) -> LedgerError:
        kind = LedgerUnavailable if is_unavailable(exc) else LedgerError
        return kind(f"ledger store error: {exc}", {"path": str(self.path)})

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
                             (orders_json(),))
                stored = conn.execute("SELECT value FROM ledger_meta WHERE key = 'orders'").fetchone()[0]
                if stored != orders_json():
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

    # -- hooks of SqlLedger ----------------------------------------------------------------

    @contextmanager
    def _begin(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """One write (``BEGIN IMMEDIATE``) or read transaction; SQLite errors become LedgerError."""
        try:
            with (self._write() if write else self._read()) as conn:
                yield conn
        except sqlite3.Error as exc:
            raise self._guard(exc) from exc

    @staticmethod
    def _flag(value: bool) -> int:
        return int(value)

    def _trigger_names(self, tx: SqlTransaction) -> set[str]:
        return {r[0] for r in tx.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}

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
