"""Release records and the release cache.

A *release* is one immutable noisy answer plus everything needed to interpret
and audit it: the query's canonical SQL and plan hash, the contribution bounds,
the mechanism and its noise scales, per-column accuracy, the released rows, the
charge that paid for it, the data version and the published guarantee it was
made under. Serving a stored release again is post-processing of a DP output
and costs no privacy budget (Dwork & Roth 2014, Prop. 2.1).

The cache key is ``sha256(plan hash, data version, mechanism, budget)``: the
same question, on the same data, with the same noise and budget, is answered
by the stored release. Releases live in the same store as the ledger (the
SQLite file by default, :class:`SqliteReleaseStore`; the PostgreSQL database
and schema of a shared ledger, :class:`PostgresReleaseStore`), in an
append-only table: triggers refuse UPDATE and DELETE.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping, Protocol

from dpgate.errors import InvalidRequest, LedgerError, NotFound

_SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    release_id  TEXT PRIMARY KEY,
    cache_key   TEXT NOT NULL UNIQUE,
    dataset     TEXT NOT NULL,
    plan_hash   TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    body        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS releases_by_dataset ON releases (dataset, created_at);
CREATE TRIGGER IF NOT EXISTS releases_no_update BEFORE UPDATE ON releases
BEGIN SELECT RAISE(ABORT, 'releases are immutable'); END;
CREATE TRIGGER IF NOT EXISTS releases_no_delete BEFORE DELETE ON releases
BEGIN SELECT RAISE(ABORT, 'releases are immutable'); END;
"""


def cache_key(plan_hash: str, data_version: str, mechanism: str, budget: Mapping[str, Any]) -> str:
    """The release cache key: SHA-256 hex of the plan hash, data version, mechanism and budget.

    Args:
        plan_hash: :attr:`dpgate.sql.plan.QueryPlan.plan_hash`.
        data_version: the dataset's data version (policy value or source fingerprint).
        mechanism: ``"gaussian"`` or ``"laplace"``.
        budget: the resolved budget of the query, e.g. ``{"rho": 0.001}`` (JSON-serialisable).
    """
    payload = json.dumps(
        {"plan": plan_hash, "data": data_version, "mechanism": mechanism, "budget": dict(budget)},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class Release:
    """One stored release.

    Attributes:
        release_id: ``rel_`` + 24 hex characters.
        cache_key: see :func:`cache_key`.
        dataset: dataset name.
        plan_hash: the plan's canonical hash.
        created_at: ISO-8601 UTC timestamp.
        body: the JSON-ready release document (columns, rows, accuracy, charge,
            bounds, mechanism, guarantee, …) as returned to clients, without
            the ``cached`` flag.
    """

    release_id: str
    cache_key: str
    dataset: str
    plan_hash: str
    created_at: str
    body: Mapping[str, Any] = field(repr=False)

    def to_dict(self, *, cached: bool) -> dict[str, Any]:
        """The release document with ``cached`` set (True when served from the store).

        ``paid_by`` always names the charge that paid for the release; ``charge``
        is that charge only for the request that created it, and None when the
        release is served again (which costs nothing).
        """
        doc = json.loads(json.dumps(self.body))  # a deep copy callers may modify
        doc.pop("noisy", None)  # internal: the noisy primitives behind the released cells
        doc["cached"] = cached
        doc["paid_by"] = doc.get("charge")
        if cached:
            doc["charge"] = None  # serving a stored release is post-processing: cost 0
        return doc


class ReleaseStore(Protocol):
    """Persistent, append-only store of releases (same backend as the ledger)."""

    def put(self, release: Release) -> Release:
        """Store ``release``; if its cache key is already stored, return the stored one instead."""

    def get(self, release_id: str) -> Release:
        """The release with that id; raises :class:`~dpgate.errors.NotFound`."""

    def find(self, cache_key: str) -> Release | None:
        """The release stored under ``cache_key``, or None."""

    def list(self, dataset: str | None = None, *, limit: int = 100) -> list[Release]:
        """Releases, newest first, optionally of one dataset; ``limit`` ≥ 1."""

    def close(self) -> None:
        """Release resources."""


def _row_to_release(row: tuple) -> Release:
    release_id, key, dataset, plan_hash, created_at, body = row
    return Release(release_id, key, dataset, plan_hash, created_at, json.loads(body))


class SqliteReleaseStore:
    """Releases in the ledger's SQLite file (one connection per thread).

    Args:
        connect: a zero-argument callable returning a new ``sqlite3.Connection``
            to the ledger's file with its pragmas (``SqliteLedger.connect``).
    Raises:
        LedgerError: the table cannot be created.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        try:
            self._conn().executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot create the release store: {exc}") from exc

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def put(self, release: Release) -> Release:
        """Store ``release`` (INSERT OR IGNORE on the cache key) and return what is stored."""
        conn = self._conn()
        body = json.dumps(release.body, allow_nan=False, separators=(",", ":"))
        with conn:
            conn.execute(
                "INSERT OR IGNORE INTO releases VALUES (?, ?, ?, ?, ?, ?)",
                (release.release_id, release.cache_key, release.dataset, release.plan_hash,
                 release.created_at, body),
            )
        stored = self.find(release.cache_key)
        assert stored is not None
        return stored

    def get(self, release_id: str) -> Release:
        """The release with that id; raises NotFound."""
        row = self._conn().execute(
            "SELECT release_id, cache_key, dataset, plan_hash, created_at, body FROM releases"
            " WHERE release_id = ?",
            (release_id,),
        ).fetchone()
        if row is None:
            raise NotFound("no release with that id", {"release_id": release_id})
        return _row_to_release(row)

    def find(self, cache_key: str) -> Release | None:
        """The release stored under ``cache_key``, or None."""
        row = self._conn().execute(
            "SELECT release_id, cache_key, dataset, plan_hash, created_at, body FROM releases"
            " WHERE cache_key = ?",
            (cache_key,),
        ).fetchone()
        return None if row is None else _row_to_release(row)

    def list(self, dataset: str | None = None, *, limit: int = 100) -> list[Release]:
        """Releases newest first (optionally of one dataset), at most ``limit``."""
        sql = "SELECT release_id, cache_key, dataset, plan_hash, created_at, body FROM releases"
        args: tuple = ()
        if dataset is not None:
            sql += " WHERE dataset = ?"
            args = (dataset,)
        sql += " ORDER BY created_at DESC, release_id DESC LIMIT ?"
        return [_row_to_release(r) for r in self._conn().execute(sql, args + (int(limit),))]

    def close(self) -> None:
        """Close every connection this store opened."""
        with self._lock:
            for conn in self._all:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._all.clear()
        self._local = threading.local()


_PG_TABLE = """CREATE TABLE releases (
    release_id  text PRIMARY KEY,
    cache_key   text NOT NULL UNIQUE,
    dataset     text NOT NULL,
    plan_hash   text NOT NULL,
    created_at  text NOT NULL,
    body        json NOT NULL
)"""
_PG_INDEX = "CREATE INDEX IF NOT EXISTS releases_by_dataset ON releases (dataset, created_at)"
_PG_FUNCTION = """CREATE OR REPLACE FUNCTION dpgate_releases_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'releases are immutable' USING ERRCODE = 'restrict_violation';
END
$$"""
#: The immutability triggers of the PostgreSQL releases table: name → (timing, level).
PG_RELEASE_TRIGGERS = {
    "releases_no_update": ("BEFORE UPDATE", "ROW"),
    "releases_no_delete": ("BEFORE DELETE", "ROW"),
    "releases_no_truncate": ("BEFORE TRUNCATE", "STATEMENT"),
}
_PG_COLUMNS = "release_id, cache_key, dataset, plan_hash, created_at, body"


class PostgresReleaseStore:
    """Releases in the PostgreSQL database and schema of a shared ledger.

    Same table shape as :class:`SqliteReleaseStore` (``release_id`` primary key,
    ``cache_key`` unique, ``dataset``, ``plan_hash``, ``created_at``, ``body``),
    with ``body`` of type ``json`` (validated, stored as written: key order kept)
    and triggers refusing UPDATE, DELETE and TRUNCATE. Created on first use, under
    a transaction-level advisory lock so that replicas starting together do not
    race. ``put`` is ``INSERT … ON CONFLICT DO NOTHING``: when two replicas store
    a release for the same cache key at once, both get the first one stored.

    Args:
        connection: a zero-argument callable returning a context manager that lends a
            psycopg connection in autocommit mode whose ``search_path`` names the
            ledger's schema (``PostgresLedger.connection``: the ledger's pool). The
            store owns no connection; close it before the ledger.

    Raises:
        LedgerError: the table cannot be created.
    """

    def __init__(self, connection: Callable[[], ContextManager[Any]]) -> None:
        import psycopg  # only this backend needs it

        self._errors = psycopg.Error
        self._connection = connection
        self._closed = False
        try:
            with connection() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('dpgate.releases:' || current_schema()))")
                if conn.execute("SELECT to_regclass('releases')").fetchone()[0] is None:
                    conn.execute(_PG_TABLE)
                conn.execute(_PG_INDEX)
                present = {r[0] for r in conn.execute(
                    "SELECT tgname FROM pg_trigger WHERE tgrelid = 'releases'::regclass AND NOT tgisinternal")}
                if set(PG_RELEASE_TRIGGERS) - present:
                    conn.execute(_PG_FUNCTION)
                for name, (timing, level) in PG_RELEASE_TRIGGERS.items():
                    if name not in present:
                        conn.execute(f"CREATE TRIGGER {name} {timing} ON releases"
                                     f" FOR EACH {level} EXECUTE FUNCTION dpgate_releases_immutable()")
        except psycopg.Error as exc:
            raise LedgerError(f"cannot create the release store: {_first_line(exc)}") from exc

    def _run(self, query: str, args: tuple = ()) -> list[tuple]:
        if self._closed:
            raise LedgerError("the release store is closed")
        with self._connection() as conn:
            try:
                cur = conn.execute(query, args)
                return cur.fetchall() if cur.description is not None else []
            except self._errors as exc:
                raise LedgerError(f"release store error: {_first_line(exc)}") from exc

    @staticmethod
    def _release(row: tuple) -> Release:
        release_id, key, dataset, plan_hash, created_at, body = row
        return Release(release_id, key, dataset, plan_hash, created_at, body)

    def put(self, release: Release) -> Release:
        """Store ``release`` unless its cache key (or id) is stored already; return what is stored.

        Raises:
            ValueError: the body is not JSON-serialisable (NaN, infinity, other objects).
            LedgerError: the store failed, or the release id is taken by another cache key.
        """
        body = json.dumps(release.body, allow_nan=False, separators=(",", ":"))
        self._run(
            f"INSERT INTO releases ({_PG_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s::json) ON CONFLICT DO NOTHING",
            (release.release_id, release.cache_key, release.dataset, release.plan_hash, release.created_at, body),
        )
        stored = self.find(release.cache_key)
        if stored is None:
            raise LedgerError("release id already used by another release", {"release_id": release.release_id})
        return stored

    def get(self, release_id: str) -> Release:
        """The release with that id; raises NotFound."""
        rows = self._run(f"SELECT {_PG_COLUMNS} FROM releases WHERE release_id = %s", (release_id,))
        if not rows:
            raise NotFound("no release with that id", {"release_id": release_id})
        return self._release(rows[0])

    def find(self, cache_key: str) -> Release | None:
        """The release stored under ``cache_key``, or None."""
        rows = self._run(f"SELECT {_PG_COLUMNS} FROM releases WHERE cache_key = %s", (cache_key,))
        return self._release(rows[0]) if rows else None

    def list(self, dataset: str | None = None, *, limit: int = 100) -> list[Release]:
        """Releases newest first (optionally of one dataset), at most ``limit`` (≥ 1).

        Raises:
            InvalidRequest: ``limit`` not a positive integer.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidRequest(f"limit must be a positive integer, got {limit!r}", {})
        query = f"SELECT {_PG_COLUMNS} FROM releases"
        args: tuple = ()
        if dataset is not None:
            query += " WHERE dataset = %s"
            args = (dataset,)
        query += " ORDER BY created_at DESC, release_id DESC LIMIT %s"
        return [self._release(r) for r in self._run(query, args + (limit,))]

    def close(self) -> None:
        """Stop using the ledger's connections (the ledger owns and closes them). Idempotent."""
        self._closed = True


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
