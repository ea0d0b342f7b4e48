"""Readiness of a serving gateway (``GET /readyz``): can it charge and store releases now?

Liveness (``GET /healthz``) only says the process answers HTTP and touches nothing. Readiness
checks the two stores a release needs, each bounded by the ledger wait
(``Settings.ledger_wait_s``):

* **ledger** — a read of its populations (PostgreSQL: a pooled connection and a query; SQLite:
  a read transaction) and, for SQLite, that the file is still there and that its write lock can
  be taken (``BEGIN IMMEDIATE`` then ``ROLLBACK`` on a connection of its own, opened read-write
  without creating a file): a file locked by another writer reads fine in WAL mode, but no charge
  could be written;
* **release store** — a read of the newest release.

The probe is unauthenticated (like ``/healthz``), so its answer names checks, never paths or
server messages (those go to the log), and one result serves every probe for
:data:`CACHE_S` seconds: a flood of probes cannot turn into a flood of lock attempts.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dpgate.errors import DpgateError

log = logging.getLogger("dpgate.api")

__all__ = ["CACHE_S", "Readiness"]

#: Seconds one readiness result is reused.
CACHE_S = 1.0


def _sqlite_write_probe(path: Path, wait_s: float) -> None:
    """Take and release the SQLite write lock of an existing file (never creates one)."""
    if not path.is_file():
        raise FileNotFoundError(f"the ledger file {path} is missing")
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=rw", uri=True, timeout=wait_s, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    finally:
        conn.close()


class Readiness:
    """The readiness checks of one gateway, cached for :data:`CACHE_S` seconds.

    Args:
        wait_s: the longest a check waits for a lock (the ledger wait).
    """

    def __init__(self, wait_s: float) -> None:
        self.wait_s = float(wait_s)
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._result: dict[str, str] = {}

    def check(self, gateway: Any) -> dict[str, str]:
        """``{"ledger": "ok" | "unavailable", "release_store": "ok" | "unavailable"}``."""
        with self._lock:  # concurrent probes wait for one check and share its result
            if time.monotonic() - self._at < CACHE_S:
                return dict(self._result)
            self._result = {"ledger": self._probe("ledger", lambda: self._ledger(gateway.ledger)),
                            "release_store": self._probe("release store",
                                                         lambda: gateway.release_store.list(limit=1))}
            self._at = time.monotonic()
            return dict(self._result)

    def _ledger(self, ledger: Any) -> None:
        ledger.populations()
        path = getattr(ledger, "path", None)
        if isinstance(path, Path):  # SQLite: reads pass while a writer holds the lock; charges would not
            _sqlite_write_probe(path, self.wait_s)

    @staticmethod
    def _probe(name: str, check) -> str:
        try:
            check()
        except (DpgateError, sqlite3.Error, OSError) as exc:
            log.warning("readiness: the %s is unavailable: %s", name, exc)
            return "unavailable"
        except Exception as exc:  # noqa: BLE001 - a driver's own error (psycopg): not ready, logged
            log.warning("readiness: the %s is unavailable: %s: %s", name, type(exc).__name__, exc)
            return "unavailable"
        return "ok"
