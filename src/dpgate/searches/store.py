"""The search store: search records and their steps, append-only, next to the ledger.

Two tables in the ledger's database (the SQLite file, or the PostgreSQL database and schema of a
shared ledger), created on first use like the release store's:

* ``searches`` — one row per search: its declaration (population, consumer, purpose,
  candidates, data boundaries, selection, stopping), immutable;
* ``search_steps`` — one row per step, numbered 1, 2, … per search: a charge (training run,
  retry, stopping decision), a selection, or the closing step. Each step's body carries
  ``prev_hash`` and ``hash`` (SHA-256 of its canonical JSON), a hash chain per search like the
  ledger's, so a removed or edited step is detected (:func:`dpgate.searches.record.verify_chain`).

Both tables refuse UPDATE and DELETE (triggers; PostgreSQL also TRUNCATE). A search is closed
when its last step is a ``close`` step; :meth:`append` refuses any step after it, atomically
(SQLite ``BEGIN IMMEDIATE``; PostgreSQL a transaction-level advisory lock per search).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Callable, ContextManager, Protocol

from dpgate.errors import Conflict, LedgerError, NotFound
from dpgate.ledger.connections import LentConnections, ThreadConnections, first_line

__all__ = ["SearchStore", "SqliteSearchStore", "PostgresSearchStore", "open_search_store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS searches (
    search_id   TEXT PRIMARY KEY,
    population  TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    body        TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS search_steps (
    search_id   TEXT NOT NULL REFERENCES searches (search_id),
    step        INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    body        TEXT NOT NULL,
    PRIMARY KEY (search_id, step)
);
CREATE TRIGGER IF NOT EXISTS searches_no_update BEFORE UPDATE ON searches
BEGIN SELECT RAISE(ABORT, 'search records are append-only'); END;
CREATE TRIGGER IF NOT EXISTS searches_no_delete BEFORE DELETE ON searches
BEGIN SELECT RAISE(ABORT, 'search records are append-only'); END;
CREATE TRIGGER IF NOT EXISTS search_steps_no_update BEFORE UPDATE ON search_steps
BEGIN SELECT RAISE(ABORT, 'search records are append-only'); END;
CREATE TRIGGER IF NOT EXISTS search_steps_no_delete BEFORE DELETE ON search_steps
BEGIN SELECT RAISE(ABORT, 'search records are append-only'); END;
"""


class SearchStore(Protocol):
    """Persistent, append-only store of search records (same backend as the ledger)."""

    def create(self, search_id: str, population: str, created_at: str, body: dict[str, Any]) -> None:
        """Store a new search (Conflict if the id exists)."""

    def get(self, search_id: str) -> dict[str, Any]:
        """``{search_id, population, created_at, body, steps: [{step, kind, created_at, body}]}``;
        NotFound if absent."""

    def append(self, search_id: str, kind: str, created_at: str,
               build: Callable[[int, dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
        """Append one step atomically: ``build(step_number, previous_step_body)`` makes its body.
        NotFound: no such search; Conflict: the search is closed."""

    def list(self, population: str | None = None, *, limit: int = 100,
             consumer: str | None = None) -> list[dict[str, Any]]:
        """Searches (without steps), newest first; only ``population``'s and only those owned by
        ``consumer`` (the declaration's ``consumer``) when given."""

    def close(self) -> None:
        """Release resources."""


def _dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _loads(body: Any) -> dict[str, Any]:
    return json.loads(body) if isinstance(body, str) else body


def _list_sql(p: str, consumer_expr: str, population: str | None, consumer: str | None,
              limit: int) -> tuple[str, tuple]:
    """The list statement and its arguments (``p``: the driver's parameter marker; ``consumer_expr``:
    the dialect's expression for the declaration's ``consumer``, which is JSON text in ``body``)."""
    where, args = [], []
    if population is not None:
        where.append(f"population = {p}")
        args.append(population)
    if consumer is not None:
        where.append(f"{consumer_expr} = {p}")
        args.append(consumer)
    sql = "SELECT search_id, population, created_at, body FROM searches"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return sql + f" ORDER BY created_at DESC, search_id DESC LIMIT {p}", (*args, int(limit))


def _insert_step(conn: Any, p: str, search_id: str, kind: str, created_at: str,
                 build: Callable[[int, dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
    """Number, build and insert the next step of a search, inside the caller's transaction.

    Args:
        conn: a DB-API connection with ``execute`` (sqlite3 or psycopg).
        p: the driver's parameter marker (``"?"`` or ``"%s"``).

    Raises:
        NotFound: no such search. Conflict: the search is closed.
    """
    if conn.execute(f"SELECT 1 FROM searches WHERE search_id = {p}", (search_id,)).fetchone() is None:
        raise NotFound("no search with that id", {"search_id": search_id})
    last = conn.execute(f"SELECT step, kind, body FROM search_steps WHERE search_id = {p} "
                        "ORDER BY step DESC LIMIT 1", (search_id,)).fetchone()
    if last is not None and last[1] == "close":
        raise Conflict("the search is closed: a closed search cannot be reopened or extended "
                       "(start a new search on the same budget)", {"search_id": search_id})
    number = 1 if last is None else int(last[0]) + 1
    body = build(number, None if last is None else _loads(last[2]))
    conn.execute(f"INSERT INTO search_steps VALUES ({p}, {p}, {p}, {p}, {p})",
                 (search_id, number, kind, created_at, _dumps(body)))
    return {"step": number, "kind": kind, "created_at": created_at, "body": body}


class SqliteSearchStore:
    """Search records in the ledger's SQLite file (one connection per thread).

    Args:
        connect: returns a new connection to the ledger's file (``SqliteLedger.connect``).
    Raises:
        LedgerError: the tables cannot be created.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connections = ThreadConnections(connect)
        try:
            self._conn().executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot create the search store: {exc}") from exc

    def _conn(self) -> sqlite3.Connection:
        return self._connections.get()

    def create(self, search_id: str, population: str, created_at: str, body: dict[str, Any]) -> None:
        """Insert the search row; Conflict if the id is taken."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("INSERT INTO searches VALUES (?, ?, ?, ?)", (search_id, population, created_at,
                                                                           _dumps(body)))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.IntegrityError:
            raise Conflict("a search with that id exists", {"search_id": search_id}) from None
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot store the search: {exc}") from exc

    def get(self, search_id: str) -> dict[str, Any]:
        """The search and its steps (NotFound if absent)."""
        conn = self._conn()
        row = conn.execute("SELECT search_id, population, created_at, body FROM searches WHERE search_id = ?",
                           (search_id,)).fetchone()
        if row is None:
            raise NotFound("no search with that id", {"search_id": search_id})
        steps = conn.execute("SELECT step, kind, created_at, body FROM search_steps WHERE search_id = ? "
                             "ORDER BY step", (search_id,)).fetchall()
        return {"search_id": row[0], "population": row[1], "created_at": row[2], "body": _loads(row[3]),
                "steps": [{"step": s[0], "kind": s[1], "created_at": s[2], "body": _loads(s[3])} for s in steps]}

    def append(self, search_id: str, kind: str, created_at: str,
               build: Callable[[int, dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
        """Append a step under ``BEGIN IMMEDIATE`` (one writer: numbering and the closed check are atomic)."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                step = _insert_step(conn, "?", search_id, kind, created_at, build)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot append to the search: {exc}") from exc
        return step

    def list(self, population: str | None = None, *, limit: int = 100,
             consumer: str | None = None) -> list[dict[str, Any]]:
        """Searches newest first (optionally of one population, of one owning consumer)."""
        sql, args = _list_sql("?", "json_extract(body, '$.consumer')", population, consumer, limit)
        return [{"search_id": r[0], "population": r[1], "created_at": r[2], "body": _loads(r[3])}
                for r in self._conn().execute(sql, args)]

    def close(self) -> None:
        """Close every connection this store opened."""
        self._connections.close()


_PG_TABLES = (
    """CREATE TABLE IF NOT EXISTS searches (
        search_id   text PRIMARY KEY,
        population  text NOT NULL,
        created_at  text NOT NULL,
        body        text NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS search_steps (
        search_id   text NOT NULL REFERENCES searches (search_id),
        step        integer NOT NULL,
        kind        text NOT NULL,
        created_at  text NOT NULL,
        body        text NOT NULL,
        PRIMARY KEY (search_id, step)
    )""",
)
_PG_FUNCTION = """CREATE OR REPLACE FUNCTION dpgate_searches_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'search records are append-only' USING ERRCODE = 'restrict_violation';
END
$$"""
#: table → trigger name → (timing, level)
PG_SEARCH_TRIGGERS = {
    table: {f"{table}_no_update": ("BEFORE UPDATE", "ROW"), f"{table}_no_delete": ("BEFORE DELETE", "ROW"),
            f"{table}_no_truncate": ("BEFORE TRUNCATE", "STATEMENT")}
    for table in ("searches", "search_steps")
}


class PostgresSearchStore:
    """Search records in the PostgreSQL database and schema of a shared ledger.

    Args:
        connection: lends a pooled autocommit connection (``PostgresLedger.connection``).
        error: the driver's base exception class, given by the ledger backend (the one module
            that imports the driver).
    Raises:
        LedgerError: the tables cannot be created.
    """

    def __init__(self, connection: Callable[[], ContextManager[Any]], *, error: type[Exception]) -> None:
        self._lent = LentConnections(connection, error=error, name="search store")
        try:
            with connection() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('dpgate.searches:' || current_schema()))")
                for stmt in _PG_TABLES:
                    conn.execute(stmt)
                conn.execute(_PG_FUNCTION)
                for table, triggers in PG_SEARCH_TRIGGERS.items():
                    present = {r[0] for r in conn.execute(
                        "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal", (table,))}
                    for name, (timing, level) in triggers.items():
                        if name not in present:
                            conn.execute(f"CREATE TRIGGER {name} {timing} ON {table} FOR EACH {level} "
                                         "EXECUTE FUNCTION dpgate_searches_append_only()")
        except error as exc:
            raise LedgerError(f"cannot create the search store: {first_line(exc)}") from exc

    def create(self, search_id: str, population: str, created_at: str, body: dict[str, Any]) -> None:
        """Insert the search row; Conflict if the id is taken."""
        with self._lent.lend("cannot store the search") as conn:
            cur = conn.execute("INSERT INTO searches VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                               (search_id, population, created_at, _dumps(body)))
            rowcount = cur.rowcount
        if rowcount != 1:
            raise Conflict("a search with that id exists", {"search_id": search_id})

    def get(self, search_id: str) -> dict[str, Any]:
        """The search and its steps (NotFound if absent)."""
        with self._lent.lend() as conn:
            row = conn.execute("SELECT search_id, population, created_at, body FROM searches "
                               "WHERE search_id = %s", (search_id,)).fetchone()
            steps = conn.execute("SELECT step, kind, created_at, body FROM search_steps WHERE search_id = %s "
                                 "ORDER BY step", (search_id,)).fetchall()
        if row is None:
            raise NotFound("no search with that id", {"search_id": search_id})
        return {"search_id": row[0], "population": row[1], "created_at": row[2], "body": _loads(row[3]),
                "steps": [{"step": s[0], "kind": s[1], "created_at": s[2], "body": _loads(s[3])} for s in steps]}

    def append(self, search_id: str, kind: str, created_at: str,
               build: Callable[[int, dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
        """Append a step in one transaction under an advisory lock on the search."""
        with self._lent.lend("cannot append to the search") as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('dpgate.search:' || %s))", (search_id,))
            return _insert_step(conn, "%s", search_id, kind, created_at, build)

    def list(self, population: str | None = None, *, limit: int = 100,
             consumer: str | None = None) -> list[dict[str, Any]]:
        """Searches newest first (optionally of one population, of one owning consumer)."""
        self._lent.check()
        sql, args = _list_sql("%s", "(body::json ->> 'consumer')", population, consumer, limit)
        rows = self._lent.run(sql, args)
        return [{"search_id": r[0], "population": r[1], "created_at": r[2], "body": _loads(r[3])} for r in rows]

    def close(self) -> None:
        """Stop using the ledger's connections (the ledger owns them). Idempotent."""
        self._lent.close()


def open_search_store(ledger: Any) -> SearchStore:
    """The search store in the same backend as ``ledger``.

    Raises:
        LedgerError: the backend has none, or the tables cannot be created.
    """
    if hasattr(ledger, "search_store"):
        return ledger.search_store()
    connect = getattr(ledger, "connect", None)
    if connect is None:
        raise LedgerError("this ledger backend has no search store")
    return SqliteSearchStore(connect)
