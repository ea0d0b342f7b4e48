"""The release cache: one charge and one release per question, across threads, processes
and replicas — and no question blocked by a release that was never stored.

**Single flight.** Identical concurrent requests (same noise key) wait on one
in-process lock (:class:`SingleFlight`: locks are reference-counted and dropped
when the last holder leaves, so memory does not grow with the number of
questions asked); across processes the ledger's single-flight ``release_key``
gives one charge, and the other processes wait for the release it pays for.

**Attempts and failure markers.** A charge is written before any noise is drawn
and is never refunded, so a charged attempt whose release is never stored (the
computation failed, the process crashed, the PostgreSQL commit's outcome was
unknown) must not block the question forever. Each attempt at a noise key has
its own ledger key (:func:`~dpgate.releases.keys.attempt_key`: the noise key, then
``…:retry:1``, ``…:retry:2``, …); the first attempt not marked failed in the
shared store's ``release_failures`` is the current one. A failure is marked
durably in the store every replica shares:

* by the process whose computation (or ledger commit) failed, at once;
* by any process that finds the current attempt charged but no release stored a
  *lease* after the charge was written (:attr:`ReleaseCache.lease_s`, longer than
  any computation may take: the engine's query timeout plus a margin) — the
  charging process crashed.

The next identical request then charges the next attempt afresh (the lost charge
stays; charges are never refunded) instead of waiting 60 s and answering 409.
Clocks of replicas are assumed synchronised to well within the lease.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterator

from dpgate.errors import Conflict, LedgerError
from dpgate.releases.keys import CacheKeys, attempt_key
from dpgate.releases.model import Release
from dpgate.releases.store import ReleaseStore

__all__ = ["SingleFlight", "ReleaseCache", "Flight", "DEFAULT_LEASE_S", "MAX_ATTEMPTS"]

log = logging.getLogger("dpgate")

#: Default lease (seconds) after a charge within which its release must be stored.
DEFAULT_LEASE_S = 90.0
#: Most attempts one request makes before answering 409 ``conflict``.
MAX_ATTEMPTS = 5


class SingleFlight:
    """Per-key locks of one process, dropped when no thread holds or waits for them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[str, list[Any]] = {}  # key → [lock, holders and waiters]

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Hold the lock of ``key`` for the ``with`` block (other threads with the same key wait)."""
        with self._lock:
            entry = self._locks.get(key)
            if entry is None:
                entry = self._locks[key] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]

    def __len__(self) -> int:
        """How many keys have a lock now (0 when nobody holds or waits)."""
        with self._lock:
            return len(self._locks)


def _timestamp(text: str) -> float:
    """Seconds since the epoch of an ISO-8601 timestamp (``…Z`` or with an offset)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Flight:
    """One request holding the single-flight lock of its noise key (see :meth:`ReleaseCache.flight`).

    Attributes:
        cache: the cache.
        keys: the request's keys.
    """

    cache: "ReleaseCache"
    keys: CacheKeys

    def lookup(self) -> Release | None:
        """The stored release under the release key, else under the noise key, else None."""
        store = self.cache.store
        return store.find(self.keys.release) or store.find(self.keys.noise)

    def run(self, *, charge: Callable[[str], Any], compute: Callable[[Any], Release]) -> tuple[Release, bool]:
        """Charge and compute the release of the noise key (once across every process).

        Args:
            charge: called with the attempt's ledger ``release_key``; returns the ledger's
                :class:`~dpgate.ledger.ChargeReceipt` (``duplicate`` True when another
                process charged this attempt already), or None when the release costs
                nothing (every primitive exact). May raise (e.g. budget exhausted):
                nothing was charged then, unless the error is a
                :class:`~dpgate.errors.LedgerError` with ``details["outcome"] == "unknown"``.
            compute: called with a fresh receipt; returns the release to store under the
                noise key (it may raise: the charge stays, the attempt is marked failed).

        Returns:
            ``(release, fresh)``: the stored release and True if this call computed it
            (False: another process's, served from the store).

        Raises:
            whatever ``charge`` or ``compute`` raise; Conflict: no release after
            :data:`MAX_ATTEMPTS` attempts.
        """
        cache, noise = self.cache, self.keys.noise
        for _ in range(MAX_ATTEMPTS):
            key = cache.current_attempt(noise)
            try:
                receipt = charge(key)
            except LedgerError as exc:
                if (exc.details or {}).get("outcome") == "unknown":
                    cache.mark_failed(noise, key, None, f"ledger commit with an unknown outcome: {exc.message}")
                raise
            if receipt is not None and receipt.duplicate:
                hit = cache.await_release(self.keys, key, receipt)
                if hit is not None:
                    return hit, False
                continue  # that attempt failed: the next one is charged afresh
            try:
                release = compute(receipt)
                stored = cache.store.put(release)
            except BaseException as exc:
                cache.mark_failed(noise, key, getattr(receipt, "charge_id", None),
                                  f"the release was not stored: {type(exc).__name__}")
                raise
            return stored, stored.release_id == release.release_id
        raise Conflict("an identical query was charged several times but no release was stored; "
                       "try again later or with a different budget", {"cache_key": noise})


class ReleaseCache:
    """The release store with single flight, the two cache keys and durable failure markers.

    Args:
        store: the release store (shared by every replica of the ledger).
        lease_s: how long after its charge a release must be stored before any process
            declares the attempt failed (longer than the slowest computation).
        poll_s: how often a waiting process looks for the release.

    Attributes:
        store, lease_s, poll_s: as given.
        flights: the in-process single-flight locks.
    """

    def __init__(self, store: ReleaseStore, *, lease_s: float = DEFAULT_LEASE_S, poll_s: float = 0.05) -> None:
        self.store = store
        self.lease_s = float(lease_s)
        self.poll_s = float(poll_s)
        self.flights = SingleFlight()

    @contextmanager
    def flight(self, keys: CacheKeys) -> Iterator[Flight]:
        """Hold the in-process single-flight lock of ``keys.noise`` and yield the :class:`Flight`."""
        with self.flights.hold(keys.noise):
            yield Flight(self, keys)

    def mark_failed(self, noise_key: str, release_key: str, charge_id: str | None, reason: str) -> None:
        """Mark attempt ``release_key`` failed in the store; if the store cannot be written either,
        log it and go on (the caller's own error matters more; other processes then declare the
        attempt lost when its lease runs out)."""
        try:
            self.store.mark_failed(noise_key, release_key, charge_id, reason)
        except Exception:  # noqa: BLE001 - never mask the error that caused the failure
            log.warning("could not record the failed release attempt %s; other processes will wait for "
                        "its lease (%g s) to run out", release_key, self.lease_s, exc_info=True)

    def current_attempt(self, noise_key: str) -> str:
        """The ledger key of the current attempt at ``noise_key``: the first not marked failed."""
        failed = self.store.failed_attempts(noise_key)
        n = 0
        while attempt_key(noise_key, n) in failed:
            n += 1
        return attempt_key(noise_key, n)

    def await_release(self, keys: CacheKeys, release_key: str, receipt: Any) -> Release | None:
        """Wait for the release another process is computing for attempt ``release_key``.

        Returns:
            The release once stored; None once the attempt is marked failed — by its process,
            or here when no release was stored ``lease_s`` after the charge (``receipt.created_at``).
        """
        deadline = _timestamp(receipt.created_at) + self.lease_s
        while True:
            hit = self.store.find(keys.noise)
            if hit is not None:
                return hit
            if release_key in self.store.failed_attempts(keys.noise):
                return None
            if time.time() >= deadline:
                self.store.mark_failed(keys.noise, release_key, receipt.charge_id,
                                       f"no release stored within {self.lease_s:g} s of the charge "
                                       "(the charging process stopped)")
                return None
            time.sleep(self.poll_s)
