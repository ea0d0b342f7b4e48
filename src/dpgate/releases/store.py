"""The release store: releases, failure markers and store settings, next to the ledger.

Releases live in the same store as the ledger (the SQLite file by default,
:class:`SqliteReleaseStore`; the PostgreSQL database and schema of a shared
ledger, :class:`PostgresReleaseStore`), so every replica sharing a ledger shares
them. Three tables:

* ``releases`` — append-only (triggers refuse UPDATE and DELETE): one row per
  release, unique per cache key (``put`` keeps the first one stored);
* ``release_failures`` — durable failure markers: a charged attempt whose release
  was never stored (its computation failed, its process crashed, its ledger commit
  had an unknown outcome). The next identical request, in any process, reads them
  and is charged afresh under the next attempt key instead of waiting for a
  release that will never come (:mod:`dpgate.releases.cache`);
* ``release_meta`` — settings every replica must share, set once by whichever
  replica starts first (``INSERT … ON CONFLICT DO NOTHING``, then read back): the
  key of the published data fingerprints (:meth:`SqliteReleaseStore.shared_secret`);
* ``dashboard_pins`` — the releases pinned to a dashboard (issue 24), with the title the
  person who pinned it gave, who and when. Curation, not privacy: a pin can be removed
  (the release it names never changes).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable, ContextManager, Protocol

from dpgate.errors import InvalidRequest, LedgerError, NotFound
from dpgate.ledger.connections import LentConnections, ThreadConnections, first_line
from dpgate.ledger.entries import utc_now
from dpgate.releases.model import Release

__all__ = ["ReleaseStore", "SqliteReleaseStore", "PostgresReleaseStore", "PG_RELEASE_TRIGGERS", "MAX_PINS",
           "MAX_TITLE", "check_pin"]

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
CREATE TABLE IF NOT EXISTS release_failures (
    release_key TEXT PRIMARY KEY,
    noise_key   TEXT NOT NULL,
    charge_id   TEXT,
    reason      TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS release_failures_by_noise_key ON release_failures (noise_key);
CREATE TABLE IF NOT EXISTS release_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dashboard_pins (
    dashboard  TEXT NOT NULL,
    release_id TEXT NOT NULL,
    title      TEXT NOT NULL,
    pinned_by  TEXT NOT NULL,
    pinned_at  TEXT NOT NULL,
    PRIMARY KEY (dashboard, release_id)
);
"""

#: Most releases pinned to one dashboard.
MAX_PINS = 48
#: Longest pin title.
MAX_TITLE = 200


def _pin_dict(row: tuple) -> dict[str, Any]:
    dashboard, release_id, title, pinned_by, pinned_at = row
    return {"dashboard": dashboard, "release_id": release_id, "title": title, "pinned_by": pinned_by,
            "pinned_at": pinned_at}


def check_pin(dashboard: str, title: str, actor: str) -> str:
    """The pin's title, stripped; raises InvalidRequest for an empty dashboard or actor or a
    title longer than :data:`MAX_TITLE` characters."""
    if not dashboard or not actor:
        raise InvalidRequest("a pin needs a dashboard and an actor")
    title = (title or "").strip()
    if len(title) > MAX_TITLE:
        raise InvalidRequest(f"the title is longer than {MAX_TITLE} characters", {"field": "title"})
    return title


class ReleaseStore(Protocol):
    """Persistent store of releases, failure markers and shared settings (same backend as the ledger)."""

    def put(self, release: Release) -> Release:
        """Store ``release``; if its cache key is already stored, return the stored one instead."""

    def get(self, release_id: str) -> Release:
        """The release with that id; raises :class:`~dpgate.errors.NotFound`."""

    def find(self, cache_key: str) -> Release | None:
        """The release stored under ``cache_key``, or None."""

    def list(self, dataset: str | None = None, *, limit: int = 100) -> list[Release]:
        """Releases, newest first, optionally of one dataset; ``limit`` ≥ 1."""

    def mark_failed(self, noise_key: str, release_key: str, charge_id: str | None, reason: str) -> None:
        """Record durably that the attempt ``release_key`` at ``noise_key`` stored no release
        (idempotent: the first marker stays)."""

    def failed_attempts(self, noise_key: str) -> set[str]:
        """The attempt keys at ``noise_key`` marked failed."""

    def shared_secret(self, name: str, candidate: str) -> str:
        """The value of setting ``name``, set to ``candidate`` if none is stored yet (atomic:
        every replica and concurrent first start reads the one value stored)."""

    def pin(self, dashboard: str, release_id: str, *, title: str, actor: str) -> dict[str, Any]:
        """Pin a stored release to ``dashboard`` (again: its title is replaced); the pin as a dict.
        Raises NotFound (no such release), InvalidRequest (title, or :data:`MAX_PINS` reached)."""

    def unpin(self, dashboard: str, release_id: str) -> bool:
        """Remove a pin; True if there was one."""

    def pins(self, dashboard: str) -> list[dict[str, Any]]:
        """The dashboard's pins, oldest first: ``{dashboard, release_id, title, pinned_by, pinned_at}``."""

    def close(self) -> None:
        """Release resources."""


def _row_to_release(row: tuple) -> Release:
    release_id, key, dataset, plan_hash, created_at, body = row
    return Release.from_body(release_id, key, dataset, plan_hash, created_at,
                             json.loads(body) if isinstance(body, str) else body)


class SqliteReleaseStore:
    """Releases in the ledger's SQLite file (one connection per thread).

    Args:
        connect: a zero-argument callable returning a new ``sqlite3.Connection``
            to the ledger's file with its pragmas (``SqliteLedger.connect``).
    Raises:
        LedgerError: the table cannot be created.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connections = ThreadConnections(connect)
        try:
            self._conn().executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot create the release store: {exc}") from exc

    def _conn(self) -> sqlite3.Connection:
        return self._connections.get()

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

    def mark_failed(self, noise_key: str, release_key: str, charge_id: str | None, reason: str) -> None:
        """Record that attempt ``release_key`` stored no release (INSERT OR IGNORE: idempotent)."""
        conn = self._conn()
        try:
            with conn:
                conn.execute("INSERT OR IGNORE INTO release_failures VALUES (?, ?, ?, ?, ?)",
                             (release_key, noise_key, charge_id, reason[:1000], utc_now()))
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot record a failed release: {exc}") from exc

    def failed_attempts(self, noise_key: str) -> set[str]:
        """The attempt keys at ``noise_key`` marked failed."""
        rows = self._conn().execute("SELECT release_key FROM release_failures WHERE noise_key = ?",
                                    (noise_key,)).fetchall()
        return {r[0] for r in rows}

    def shared_secret(self, name: str, candidate: str) -> str:
        """The stored value of ``name`` (``candidate`` stored first if there is none): one
        ``INSERT OR IGNORE`` then a read, so concurrent first starts all read the same value."""
        conn = self._conn()
        try:
            with conn:
                conn.execute("INSERT OR IGNORE INTO release_meta (key, value) VALUES (?, ?)", (name, candidate))
            row = conn.execute("SELECT value FROM release_meta WHERE key = ?", (name,)).fetchone()
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read the release store's settings: {exc}") from exc
        return row[0]

    def pin(self, dashboard: str, release_id: str, *, title: str, actor: str) -> dict[str, Any]:
        """Pin a stored release to ``dashboard`` (pinned again: the new title replaces the old)."""
        title = check_pin(dashboard, title, actor)
        self.get(release_id)  # NotFound for an unknown release
        conn = self._conn()
        try:
            with conn:
                present = conn.execute("SELECT COUNT(*) FROM dashboard_pins WHERE dashboard = ? AND release_id <> ?",
                                       (dashboard, release_id)).fetchone()[0]
                if present >= MAX_PINS:
                    raise InvalidRequest(f"dashboard {dashboard!r} already has {MAX_PINS} pins: unpin one first",
                                         {"dashboard": dashboard, "max": MAX_PINS})
                conn.execute("INSERT INTO dashboard_pins VALUES (?, ?, ?, ?, ?) ON CONFLICT (dashboard, release_id) "
                             "DO UPDATE SET title = excluded.title", (dashboard, release_id, title, actor, utc_now()))
            row = conn.execute("SELECT dashboard, release_id, title, pinned_by, pinned_at FROM dashboard_pins "
                               "WHERE dashboard = ? AND release_id = ?", (dashboard, release_id)).fetchone()
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot pin the release: {exc}") from exc
        return _pin_dict(row)

    def unpin(self, dashboard: str, release_id: str) -> bool:
        """Remove the pin of ``release_id`` from ``dashboard``; True if there was one."""
        conn = self._conn()
        try:
            with conn:
                cur = conn.execute("DELETE FROM dashboard_pins WHERE dashboard = ? AND release_id = ?",
                                   (dashboard, release_id))
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot unpin the release: {exc}") from exc
        return cur.rowcount > 0

    def pins(self, dashboard: str) -> list[dict[str, Any]]:
        """The pins of ``dashboard``, oldest first."""
        rows = self._conn().execute("SELECT dashboard, release_id, title, pinned_by, pinned_at FROM dashboard_pins "
                                    "WHERE dashboard = ? ORDER BY pinned_at, release_id", (dashboard,)).fetchall()
        return [_pin_dict(r) for r in rows]

    def close(self) -> None:
        """Close every connection this store opened."""
        self._connections.close()


_PG_TABLE = """CREATE TABLE releases (
    release_id  text PRIMARY KEY,
    cache_key   text NOT NULL UNIQUE,
    dataset     text NOT NULL,
    plan_hash   text NOT NULL,
    created_at  text NOT NULL,
    body        json NOT NULL
)"""
_PG_INDEX = "CREATE INDEX IF NOT EXISTS releases_by_dataset ON releases (dataset, created_at)"
_PG_SIDE_TABLES = (
    """CREATE TABLE IF NOT EXISTS release_failures (
        release_key text PRIMARY KEY,
        noise_key   text NOT NULL,
        charge_id   text,
        reason      text NOT NULL,
        created_at  text NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS release_failures_by_noise_key ON release_failures (noise_key)",
    """CREATE TABLE IF NOT EXISTS release_meta (
        key   text PRIMARY KEY,
        value text NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dashboard_pins (
        dashboard  text NOT NULL,
        release_id text NOT NULL,
        title      text NOT NULL,
        pinned_by  text NOT NULL,
        pinned_at  text NOT NULL,
        PRIMARY KEY (dashboard, release_id)
    )""",
)
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
        error: the driver's base exception class (``psycopg.Error``), given by the ledger
            backend, the one module that imports the driver.

    Raises:
        LedgerError: the table cannot be created.
    """

    def __init__(self, connection: Callable[[], ContextManager[Any]], *, error: type[Exception]) -> None:
        self._lent = LentConnections(connection, error=error, name="release store")
        try:
            with connection() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('dpgate.releases:' || current_schema()))")
                if conn.execute("SELECT to_regclass('releases')").fetchone()[0] is None:
                    conn.execute(_PG_TABLE)
                conn.execute(_PG_INDEX)
                for stmt in _PG_SIDE_TABLES:
                    conn.execute(stmt)
                present = {r[0] for r in conn.execute(
                    "SELECT tgname FROM pg_trigger WHERE tgrelid = 'releases'::regclass AND NOT tgisinternal")}
                if set(PG_RELEASE_TRIGGERS) - present:
                    conn.execute(_PG_FUNCTION)
                for name, (timing, level) in PG_RELEASE_TRIGGERS.items():
                    if name not in present:
                        conn.execute(f"CREATE TRIGGER {name} {timing} ON releases"
                                     f" FOR EACH {level} EXECUTE FUNCTION dpgate_releases_immutable()")
        except error as exc:
            raise LedgerError(f"cannot create the release store: {first_line(exc)}") from exc

    def _run(self, query: str, args: tuple = ()) -> list[tuple]:
        return self._lent.run(query, args)

    @staticmethod
    def _release(row: tuple) -> Release:
        return _row_to_release(row)

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

    def mark_failed(self, noise_key: str, release_key: str, charge_id: str | None, reason: str) -> None:
        """Record that attempt ``release_key`` stored no release (ON CONFLICT DO NOTHING: idempotent).

        Raises:
            LedgerError: the store failed.
        """
        self._run("INSERT INTO release_failures (release_key, noise_key, charge_id, reason, created_at)"
                  " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                  (release_key, noise_key, charge_id, reason[:1000], utc_now()))

    def failed_attempts(self, noise_key: str) -> set[str]:
        """The attempt keys at ``noise_key`` marked failed."""
        return {r[0] for r in self._run("SELECT release_key FROM release_failures WHERE noise_key = %s",
                                        (noise_key,))}

    def shared_secret(self, name: str, candidate: str) -> str:
        """The stored value of ``name`` (``candidate`` stored first if there is none), shared by
        every replica of the database and schema."""
        self._run("INSERT INTO release_meta (key, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                  (name, candidate))
        return self._run("SELECT value FROM release_meta WHERE key = %s", (name,))[0][0]

    def pin(self, dashboard: str, release_id: str, *, title: str, actor: str) -> dict[str, Any]:
        """Pin a stored release to ``dashboard`` (pinned again: the new title replaces the old).
        The pin count is checked before the insert (a race may exceed :data:`MAX_PINS` by a few)."""
        title = check_pin(dashboard, title, actor)
        self.get(release_id)
        present = self._run("SELECT COUNT(*) FROM dashboard_pins WHERE dashboard = %s AND release_id <> %s",
                            (dashboard, release_id))[0][0]
        if present >= MAX_PINS:
            raise InvalidRequest(f"dashboard {dashboard!r} already has {MAX_PINS} pins: unpin one first",
                                 {"dashboard": dashboard, "max": MAX_PINS})
        self._run("INSERT INTO dashboard_pins (dashboard, release_id, title, pinned_by, pinned_at) "
                  "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (dashboard, release_id) DO UPDATE SET title = EXCLUDED.title",
                  (dashboard, release_id, title, actor, utc_now()))
        rows = self._run("SELECT dashboard, release_id, title, pinned_by, pinned_at FROM dashboard_pins "
                         "WHERE dashboard = %s AND release_id = %s", (dashboard, release_id))
        return _pin_dict(tuple(rows[0]))

    def unpin(self, dashboard: str, release_id: str) -> bool:
        """Remove the pin of ``release_id`` from ``dashboard``; True if there was one."""
        rows = self._run("DELETE FROM dashboard_pins WHERE dashboard = %s AND release_id = %s RETURNING release_id",
                         (dashboard, release_id))
        return bool(rows)

    def pins(self, dashboard: str) -> list[dict[str, Any]]:
        """The pins of ``dashboard``, oldest first."""
        return [_pin_dict(tuple(r)) for r in self._run(
            "SELECT dashboard, release_id, title, pinned_by, pinned_at FROM dashboard_pins WHERE dashboard = %s "
            "ORDER BY pinned_at, release_id", (dashboard,))]

    def close(self) -> None:
        """Stop using the ledger's connections (the ledger owns and closes them). Idempotent."""
        self._lent.close()
