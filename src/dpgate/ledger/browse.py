"""Paginated, indexed reads of the ledger for people browsing it (the web pages, exports).

:meth:`Ledger.entries` returns every charge of a population at once (or the last
``limit``), fully decoded; a browser over a ledger of 100,000 entries needs
less: one page of entries, newest first, found by filters, and the next page
found by a cursor (the ``seq`` where the page ended) rather than an offset, so
that every page costs the same whatever its depth. :class:`LedgerBrowsing` adds
two read-only methods to :class:`~dpgate.ledger.sql.SqlLedger` (both backends):

* :meth:`LedgerBrowsing.entries_page` — one page of charges or governance
  events filtered by population, consumer and time (keyset pagination on the
  primary key ``seq``; the population filter uses the ``(population, seq)``
  index each table has);
* :meth:`LedgerBrowsing.spend_series` — the light columns ``(seq, created_at,
  consumer, rho)`` of a population's charges after a given ``seq``, for a
  burn-down chart kept up to date incrementally (only new rows are read).

Times are the entries' ``created_at`` texts (ISO-8601 UTC with microseconds and
``Z``, :func:`dpgate.ledger.base.utc_now`), which order like the instants they
name; filters are normalised to the same form.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, ClassVar

from dpgate.accounting import Cost
from dpgate.errors import InvalidRequest
from dpgate.ledger.entries import (
    EVENT_COLUMNS,
    STORED_CHARGE_COLUMNS,
    charge_entry,
    display_charge,
    display_event,
    event_entry,
)
from dpgate.ledger.validation import validate_name

__all__ = ["BROWSE_MIGRATION", "EntryPage", "LedgerBrowsing", "normalise_time", "MAX_PAGE_SIZE"]

#: Largest page :meth:`LedgerBrowsing.entries_page` returns.
MAX_PAGE_SIZE = 1000

#: Ledger schema migration 3 (both backends, appended to their ``MIGRATIONS``): the indexes the
#: browsing queries use. A consumer filter walks ``charges_by_consumer`` newest first; a time
#: window is first turned into the exact ``seq`` range of the entries inside it with a covering
#: scan of ``charges_by_time`` / ``events_by_time``, then read by primary key like any page.
BROWSE_MIGRATION: tuple[int, str, tuple[str, ...]] = (
    3,
    "indexes for browsing the ledger: charges by consumer and by time, events by time",
    (
        "CREATE INDEX IF NOT EXISTS charges_by_consumer ON charges (consumer, seq)",
        "CREATE INDEX IF NOT EXISTS charges_by_time ON charges (created_at, seq)",
        "CREATE INDEX IF NOT EXISTS events_by_time ON events (created_at, seq)",
    ),
)


def normalise_time(value: str | datetime | None, what: str = "time") -> str | None:
    """An instant as the ledger writes ``created_at`` (``YYYY-MM-DDTHH:MM:SS.ffffffZ``, UTC).

    Accepts a timezone-aware :class:`~datetime.datetime`, or ISO-8601 text: a
    date (``2026-11-30``, midnight UTC), a date and time with or without seconds
    and fraction, ``Z`` or an offset (none: UTC). None or blank gives None.

    Raises:
        InvalidRequest: the text is not an ISO-8601 date or date-time.
    """
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        except ValueError:
            raise InvalidRequest(
                f"{what} must be an ISO-8601 date or date-time (e.g. 2026-11-30 or 2026-11-30T14:00Z)",
                {"field": what},
            ) from None
    else:
        parsed = value
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class EntryPage:
    """One page of ledger entries, newest first.

    Attributes:
        entries: the entries (dicts as :meth:`Ledger.entries` / :meth:`Ledger.events`
            return them: ``cost``/``metadata`` or ``old``/``new`` decoded), newest first.
        newer: pass as ``after`` to get the page of newer entries; None when
            this page holds the newest matching entry.
        older: pass as ``before`` to get the page of older entries; None when
            this page holds the oldest matching entry.
    """

    entries: list[dict[str, Any]] = field(default_factory=list)
    newer: int | None = None
    older: int | None = None


class LedgerBrowsing:
    """Read-only, paginated queries for :class:`~dpgate.ledger.sql.SqlLedger` (a mixin).

    Uses the host class's ``_tx(write=False)`` (one consistent snapshot) and
    ``_PARAM`` (the driver's placeholder).
    """

    _PARAM: ClassVar[str]

    def entries_page(
        self,
        kind: str = "charge",
        *,
        population: str | None = None,
        consumer: str | None = None,
        since: str | datetime | None = None,
        until: str | datetime | None = None,
        before: int | None = None,
        after: int | None = None,
        limit: int = 50,
    ) -> EntryPage:
        """One page of charges (``kind="charge"``) or governance events (``kind="event"``).

        Newest first. Without a cursor: the newest ``limit`` matching entries.
        ``before=s``: the newest ``limit`` matching entries with ``seq < s`` (the
        next page, older); ``after=s``: the oldest ``limit`` with ``seq > s``
        (the previous page, newer), still listed newest first. Each page is one
        range scan of the primary key (or of the ``(population, seq)`` index)
        that stops after ``limit + 1`` matches.

        Args:
            kind: ``"charge"`` or ``"event"``.
            population: only this population's entries.
            consumer: only charges of this consumer (ignored for events, which
                belong to a population, not to a consumer).
            since, until: only entries with ``since <= created_at < until``
                (see :func:`normalise_time`).
            before, after: ``seq`` cursors (at most one).
            limit: page size, 1 to :data:`MAX_PAGE_SIZE`.

        Returns:
            :class:`EntryPage`.

        Raises:
            InvalidRequest: bad kind, name, time, cursor or limit.
            LedgerError: the store failed.
        """
        if kind not in ("charge", "event"):
            raise InvalidRequest("kind must be 'charge' or 'event'", {"kind": kind})
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
            raise InvalidRequest(f"limit must be an integer from 1 to {MAX_PAGE_SIZE}", {"limit": limit})
        if before is not None and after is not None:
            raise InvalidRequest("give at most one of before and after")
        for name, cursor in (("before", before), ("after", after)):
            if cursor is not None and (isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0):
                raise InvalidRequest(f"{name} must be a non-negative integer", {name: cursor})
        p = self._PARAM
        where: list[str] = []
        args: list[Any] = []
        if population is not None:
            where.append(f"population = {p}")
            args.append(validate_name(population, "population"))
        if consumer is not None and kind == "charge":
            where.append(f"consumer = {p}")
            args.append(validate_name(consumer, "consumer"))
        lo, hi = normalise_time(since, "since"), normalise_time(until, "until")
        window: list[str] = []
        window_args: list[Any] = []
        if lo is not None:
            window.append(f"created_at >= {p}")
            window_args.append(lo)
        if hi is not None:
            window.append(f"created_at < {p}")
            window_args.append(hi)
        where += window
        args += window_args
        if before is not None:
            where.append(f"seq < {p}")
            args.append(before)
        if after is not None:
            where.append(f"seq > {p}")
            args.append(after)
        columns, table = (STORED_CHARGE_COLUMNS, "charges") if kind == "charge" else (EVENT_COLUMNS, "events")
        order = "ASC" if after is not None else "DESC"
        query = (f"SELECT {', '.join(columns)} FROM {table}"
                 + (f" WHERE {' AND '.join(where)}" if where else "")
                 + f" ORDER BY seq {order} LIMIT {p}")
        with self._tx(write=False) as tx:  # type: ignore[attr-defined]
            if window:
                # the exact seq range of the entries in the window (a covering index scan), so that
                # the page below reads only rows inside it, however far back the window lies
                bounds = tx.execute(f"SELECT MIN(seq), MAX(seq) FROM {table} WHERE {' AND '.join(window)}",
                                    window_args).fetchone()
                if bounds is None or bounds[0] is None:
                    return EntryPage([], None, None)
                query = query.replace(" ORDER BY", f"{' AND' if where else ' WHERE'} seq BETWEEN {p} AND {p} ORDER BY", 1)
                args += [int(bounds[0]), int(bounds[1])]
            rows = tx.execute(query, [*args, limit + 1]).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        if after is not None:
            rows.reverse()
        decode = ((lambda r: display_charge(charge_entry(r))) if kind == "charge"
                  else (lambda r: display_event(event_entry(r))))
        entries = [decode(r) for r in rows]
        if not entries:
            # an empty page: offer the way back to where the cursor came from
            return EntryPage([], newer=before - 1 if before is not None and before > 0 else None,
                             older=after + 1 if after is not None else None)
        newest, oldest = entries[0]["seq"], entries[-1]["seq"]
        if after is not None:
            newer, older = (newest if more else None), oldest
        else:
            newer, older = (newest if before is not None else None), (oldest if more else None)
        return EntryPage(entries, newer=newer, older=older)

    def spend_series(self, population: str, *, after: int = 0, limit: int | None = None) -> list[tuple[int, str, str, float]]:
        """The light columns of ``population``'s charges with ``seq > after``, in ``seq`` order.

        Each item is ``(seq, created_at, consumer, rho)``: ``rho`` is the stored ρ
        of the charge (its zCDP ρ; for an RDP-curve charge, the smallest ρ whose
        zCDP curve bounds it). A curve with no finite bound over the whole grid
        (no claim at high orders, e.g. a DP-SGD run) is stated instead by its
        bound over the orders the population's cap checks (α ≤ α_cap,
        ``Cost.rho_bound(max_order=α_cap)``): the share of the budget the filter
        sees it use, never ∞ for a charge the filter admitted. One range scan of
        the ``(population, seq)`` index (plus one read of the costs of such
        curves): a caller that remembers the last ``seq`` it saw reads only new
        charges.

        Args:
            population: the population.
            after: read charges with ``seq > after`` (0: all).
            limit: at most this many rows (None: all).

        Raises:
            InvalidRequest: bad name, cursor or limit. LedgerError: the store failed.
        """
        validate_name(population, "population")
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise InvalidRequest("after must be a non-negative integer", {"after": after})
        p = self._PARAM
        query = (f"SELECT seq, created_at, consumer, rho FROM charges WHERE population = {p} AND seq > {p}"
                 " ORDER BY seq")
        args: list[Any] = [population, after]
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise InvalidRequest("limit must be a positive integer", {"limit": limit})
            query += f" LIMIT {p}"
            args.append(limit)
        with self._tx(write=False) as tx:  # type: ignore[attr-defined]
            rows = [(int(r[0]), r[1], r[2], float(r[3])) for r in tx.execute(query, args).fetchall()]
            unbounded = [r[0] for r in rows if not math.isfinite(r[3])]
            if not unbounded:
                return rows
            marks = ", ".join([p] * len(unbounded))
            costs = dict(tx.execute(f"SELECT seq, cost FROM charges WHERE seq IN ({marks})", unbounded).fetchall())
        alpha_cap = self.cap(population).alpha_cap  # type: ignore[attr-defined]
        max_order = alpha_cap if alpha_cap is not None else None
        return [(seq, at, who, rho if math.isfinite(rho)
                 else Cost.from_dict(json.loads(costs[seq])).rho_bound(max_order=max_order))
                for seq, at, who, rho in rows]
