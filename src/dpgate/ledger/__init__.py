"""The privacy-budget ledger: populations, caps, allocations, charges, governance events.

``open_ledger(url)`` opens a backend by URL; every backend implements the
:class:`~dpgate.ledger.base.Ledger` protocol with the same rules (zCDP and
Rényi filters against the budget curve fixed when the cap is set, exact
totals, append-only hash-chained entries). See :mod:`dpgate.ledger.base`.
"""

from __future__ import annotations

from dpgate.errors import LedgerError
from dpgate.ledger.base import ChargeReceipt, ConsumerSpend, Ledger, SpendReport, VerifyReport

__all__ = ["open_ledger", "Ledger", "ChargeReceipt", "ConsumerSpend", "SpendReport", "VerifyReport"]


def open_ledger(url: str, *, create: bool = True) -> Ledger:
    """Open the ledger at ``url``.

    * ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` — one SQLite file
      (created with its folder if absent, unless ``create`` is False); options
      ``?synchronous=full|extra|normal|off`` and ``?busy_timeout_ms=N``. The
      object is a :class:`dpgate.ledger.sqlite.SqliteLedger` (it also has
      ``path`` and ``connect()`` for the release store).
    * ``postgresql://user:password@host:port/db`` (also ``postgres://``,
      ``postgresql+psycopg://``) — a ledger shared by several replicas, a
      :class:`dpgate.ledger.postgres.PostgresLedger`; options ``?schema=``,
      ``pool_size=``, ``lock_timeout_ms=``, ``pool_timeout_ms=`` and any libpq
      option (see :func:`dpgate.ledger.postgres.open_postgres_ledger`). It has
      ``release_store()`` for the release store.

    Args:
        url: the ledger URL (``Settings.resolved_ledger_url()``).
        create: create a missing SQLite file (False: raise LedgerError instead).

    Returns:
        An open :class:`~dpgate.ledger.base.Ledger`; call ``close()`` when done.

    Raises:
        LedgerError: unsupported scheme, bad URL or options, or the store cannot be opened.
    """
    if not isinstance(url, str) or ":" not in url:
        raise LedgerError(f"not a ledger URL: {url!r} (expected sqlite:///path or postgresql://…)")
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from dpgate.ledger.sqlite import open_sqlite_ledger

        return open_sqlite_ledger(url, create=create)
    if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        try:
            from dpgate.ledger import postgres  # type: ignore[attr-defined]
        except ModuleNotFoundError as exc:
            if exc.name != "dpgate.ledger.postgres":
                raise
            raise LedgerError("the PostgreSQL ledger backend is not available in this build") from None
        return postgres.open_postgres_ledger(url)  # type: ignore[attr-defined]
    raise LedgerError(f"unsupported ledger URL scheme {scheme!r} (expected sqlite or postgresql)",
                      {"scheme": scheme})
