"""Releases: the typed release value, its two cache keys, the store next to the ledger, and the
release cache (single flight and durable failure markers shared by every replica).

* :mod:`dpgate.releases.model` — :class:`Release` (what is served) and
  :class:`NoisyPrimitives` (what only the gateway reads);
* :mod:`dpgate.releases.keys` — :class:`CacheKeys` (release key, noise key) and attempt keys;
* :mod:`dpgate.releases.store` — :class:`SqliteReleaseStore`, :class:`PostgresReleaseStore`;
* :mod:`dpgate.releases.cache` — :class:`ReleaseCache`: single flight, attempts, failure markers.
"""

from __future__ import annotations

from typing import Any

from dpgate.errors import LedgerError
from dpgate.releases.cache import DEFAULT_LEASE_S, Flight, ReleaseCache, SingleFlight
from dpgate.releases.keys import CacheKeys, attempt_key, cache_key
from dpgate.releases.model import NoisyPrimitives, Release, new_release_id, now
from dpgate.releases.store import PG_RELEASE_TRIGGERS, PostgresReleaseStore, ReleaseStore, SqliteReleaseStore

__all__ = [
    "Release", "NoisyPrimitives", "new_release_id", "now",
    "CacheKeys", "cache_key", "attempt_key",
    "ReleaseStore", "SqliteReleaseStore", "PostgresReleaseStore", "PG_RELEASE_TRIGGERS",
    "ReleaseCache", "Flight", "SingleFlight", "DEFAULT_LEASE_S",
    "open_release_store",
]  # fmt: skip


def open_release_store(ledger: Any) -> ReleaseStore:
    """The release store living in the same backend as ``ledger`` (its SQLite file, or its
    PostgreSQL database and schema).

    Raises:
        LedgerError: the backend has no release store, or its tables cannot be created.
    """
    if hasattr(ledger, "release_store"):
        return ledger.release_store()
    connect = getattr(ledger, "connect", None)
    if connect is None:
        raise LedgerError("this ledger backend has no release store")
    return SqliteReleaseStore(connect)
