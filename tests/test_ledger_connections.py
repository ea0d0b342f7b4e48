"""The connection helpers shared by the release and search stores (dpgate.ledger.connections):
one SQLite connection per thread, all closed on shutdown; PostgreSQL connections lent by the
ledger's pool, refused after close, driver errors as LedgerError."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager

import pytest

from dpgate.errors import Conflict, LedgerError
from dpgate.ledger.connections import LentConnections, ThreadConnections, first_line
from dpgate.releases.store import SqliteReleaseStore
from dpgate.searches.store import SqliteSearchStore


def test_one_sqlite_connection_per_thread_all_closed_on_close(tmp_path):
    opened: list[sqlite3.Connection] = []

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(tmp_path / "x.sqlite", check_same_thread=False)
        opened.append(conn)
        return conn

    pool = ThreadConnections(connect)
    main = pool.get()
    assert pool.get() is main
    other: list[sqlite3.Connection] = []
    t = threading.Thread(target=lambda: other.append(pool.get()))
    t.start()
    t.join()
    assert other[0] is not main and opened == [main, other[0]]
    pool.close()
    for conn in opened:
        with pytest.raises(sqlite3.ProgrammingError):
            conn.execute("SELECT 1")
    assert pool.get() is not main and len(opened) == 3  # a new one after close
    pool.close()


class _DriverError(Exception):
    pass


class _Conn:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def execute(self, query, args=()):
        if self.fail:
            raise _DriverError("relation \"x\" does not exist\nLINE 1: SELECT …")
        return self


def _lender(fail: bool = False):
    lent: list[int] = []

    @contextmanager
    def connection():
        lent.append(1)
        yield _Conn(fail)

    return connection, lent


def test_lent_connections_convert_driver_errors_and_refuse_after_close():
    connection, lent = _lender(fail=True)
    store = LentConnections(connection, error=_DriverError, name="release store")
    with pytest.raises(LedgerError, match=r'^release store error: relation "x" does not exist$'):
        store.run("SELECT 1")
    with pytest.raises(LedgerError, match=r'^cannot append to the search: relation'):
        with store.lend("cannot append to the search") as conn:
            conn.execute("SELECT 1")
    with pytest.raises(Conflict):  # not a driver error: passes through unchanged
        with store.lend():
            raise Conflict("taken", {})
    store.close()
    store.close()  # idempotent
    n = len(lent)
    with pytest.raises(LedgerError, match="the release store is closed"):
        store.run("SELECT 1")
    assert len(lent) == n  # nothing borrowed once closed
    assert first_line(ValueError("")) == "ValueError"


def test_both_stores_use_the_shared_helpers(tmp_path):
    def connect():
        return sqlite3.connect(tmp_path / "s.sqlite", check_same_thread=False, isolation_level=None)

    for cls in (SqliteReleaseStore, SqliteSearchStore):
        store = cls(connect)
        assert isinstance(store._connections, ThreadConnections)
        store.close()
