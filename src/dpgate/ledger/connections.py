"""Connection handling shared by the stores that live next to the ledger (releases, searches).

Both stores keep their tables in the ledger's database and borrow its connections:

* :class:`ThreadConnections` — SQLite: one connection per thread, opened on first use with
  the ledger's ``connect`` (its file and pragmas), all closed by :meth:`ThreadConnections.close`.
  A ``sqlite3.Connection`` must not be shared between threads, and opening one per call
  would be slow.
* :class:`LentConnections` — PostgreSQL: connections lent by the ledger's pool
  (``PostgresLedger.connection``); the store owns none, and after :meth:`LentConnections.close`
  it refuses further use. Driver errors become :class:`~dpgate.errors.LedgerError` with the
  first line of the driver's message.

Nothing here imports a database driver: the PostgreSQL backend passes its base exception
class (:mod:`dpgate.ledger.postgres` is the one module that imports psycopg).
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterator

from dpgate.errors import LedgerError, LedgerUnavailable

__all__ = ["ThreadConnections", "LentConnections", "first_line", "is_unavailable"]

#: SQLite primary result codes that mean "the file cannot be used right now", not "this is wrong":
#: BUSY, LOCKED, IOERR, FULL, CANTOPEN, PROTOCOL (https://www.sqlite.org/rescode.html).
_SQLITE_UNAVAILABLE = frozenset({5, 6, 10, 13, 14, 15})


def is_unavailable(exc: BaseException) -> bool:
    """Whether a driver error means the database is unavailable (retry later), not a defect.

    SQLite (stdlib): an :class:`sqlite3.OperationalError` whose primary result code is in
    :data:`_SQLITE_UNAVAILABLE` (locked past the busy timeout, cannot open the file, I/O error).
    PostgreSQL: any ``psycopg.OperationalError`` (connection refused or lost, server shutting
    down, lock timeout), recognised by class name so this module imports no driver.
    """
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(exc, sqlite3.OperationalError) and code is not None and (code & 0xFF) in _SQLITE_UNAVAILABLE
    return any(c.__name__ == "OperationalError" and c.__module__.startswith("psycopg") for c in type(exc).__mro__)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name if the message is empty)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class ThreadConnections:
    """One SQLite connection per thread, all closed on :meth:`close`.

    Args:
        connect: a zero-argument callable returning a new ``sqlite3.Connection`` to the
            ledger's file with its pragmas (``SqliteLedger.connect``).
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection opened so far (errors on close are ignored); a later
        :meth:`get` opens a new one."""
        with self._lock:
            for conn in self._all:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._all.clear()
        self._local = threading.local()


class LentConnections:
    """Connections lent by a PostgreSQL ledger's pool, for a store that owns none.

    Args:
        connection: a zero-argument callable returning a context manager that lends a
            psycopg connection (autocommit, ``search_path`` on the ledger's schema).
        error: the driver's base exception class (``psycopg.Error``).
        name: the store's name in messages (``"release store"``).
    """

    def __init__(self, connection: Callable[[], ContextManager[Any]], *, error: type[Exception], name: str) -> None:
        self._connection = connection
        self.error = error
        self._name = name
        self._closed = False

    def check(self) -> None:
        """Raise :class:`LedgerError` if the store was closed."""
        if self._closed:
            raise LedgerError(f"the {self._name} is closed")

    @contextmanager
    def lend(self, failure: str | None = None) -> Iterator[Any]:
        """A lent connection; a driver error inside the block becomes ``LedgerError("<failure>:
        <first line>")`` (default failure text: ``"<name> error"``).

        Raises:
            LedgerError: the store is closed, or the driver failed.
        """
        self.check()
        with self._connection() as conn:
            try:
                yield conn
            except self.error as exc:
                kind = LedgerUnavailable if is_unavailable(exc) else LedgerError
                raise kind(f"{failure or self._name + ' error'}: {first_line(exc)}") from exc

    def run(self, query: str, args: tuple = (), failure: str | None = None) -> list[tuple]:
        """Execute one statement on a lent connection; its rows ([] when it returns none)."""
        with self.lend(failure) as conn:
            cur = conn.execute(query, args)
            return cur.fetchall() if cur.description is not None else []

    def close(self) -> None:
        """Stop using the ledger's connections (the ledger owns and closes them). Idempotent."""
        self._closed = True
