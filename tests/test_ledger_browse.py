"""Paginated ledger reads (``dpgate.ledger.browse``) on both backends.

Every expectation is computed from :meth:`Ledger.entries` / :meth:`Ledger.events`
(the unpaginated reads) filtered in Python, so a page that skips, repeats or
misorders an entry fails. PostgreSQL runs when a server answers at
``DPGATE_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``)
and is skipped otherwise.
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timezone

import pytest

from dpgate.accounting import Cost
from dpgate.errors import InvalidRequest
from dpgate.ledger import open_ledger
from dpgate.ledger.browse import normalise_time

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger(request, tmp_path):
    if request.param == "sqlite":
        led = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        yield led
        led.close()
        return
    psycopg = pytest.importorskip("psycopg")
    url = os.environ.get("DPGATE_TEST_POSTGRES_URL", DEFAULT_PG)
    try:
        psycopg.connect(url, connect_timeout=3, autocommit=True).close()
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL server answers (set DPGATE_TEST_POSTGRES_URL): {type(exc).__name__}")
    schema = "dpgate_test_" + secrets.token_hex(6)
    led = open_ledger(url + ("&" if "?" in url else "?") + f"schema={schema}")
    yield led
    led.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _fill(led, n: int = 23) -> None:
    """Two populations, three consumers, interleaved charges and one cap change in the middle."""
    led.ensure_population("pop-a", epsilon=4.0, delta=1e-6, allocations={"dash": 0.6, "analysts": 0.4})
    led.ensure_population("pop-b", epsilon=2.0, delta=1e-6, allocations={"ml": 1.0})
    for i in range(n):
        if i == n // 2:
            led.set_cap("pop-a", epsilon=3.5, delta=1e-6, actor="root", reason="quarterly review")
        pop, consumer = [("pop-a", "dash"), ("pop-a", "analysts"), ("pop-b", "ml")][i % 3]
        led.charge(pop, consumer, Cost.zcdp(1e-5 * (i + 1)), purpose=f"q{i}")


def _walk(led, **filters):
    """Every entry reachable by following ``older`` from the first page, and back by ``newer``."""
    pages = [led.entries_page(limit=4, **filters)]
    while pages[-1].older is not None:
        pages.append(led.entries_page(limit=4, before=pages[-1].older, **filters))
    forward = [e["seq"] for p in pages for e in p.entries]
    back = list(pages[-1].entries)
    page = pages[-1]
    while page.newer is not None:
        page = led.entries_page(limit=4, after=page.newer, **filters)
        back = page.entries + back
    return forward, [e["seq"] for e in back], pages


def test_pages_cover_every_charge_once_newest_first(ledger):
    _fill(ledger)
    expected = [e["seq"] for e in reversed(ledger.entries())]
    forward, back, pages = _walk(ledger)
    assert forward == expected
    assert back == expected  # walking back with `newer` meets the same entries
    assert pages[0].newer is None and pages[-1].older is None
    assert all(len(p.entries) == 4 for p in pages[:-1])
    # the page's entries are what Ledger.entries returns for them (decoded the same way)
    by_seq = {e["seq"]: e for e in ledger.entries()}
    assert all(e == by_seq[e["seq"]] for p in pages for e in p.entries)


@pytest.mark.parametrize("filters", [
    {"population": "pop-a"},
    {"population": "pop-a", "consumer": "analysts"},
    {"consumer": "ml"},
    {"population": "pop-b", "consumer": "dash"},  # matches nothing
])
def test_filters_by_population_and_consumer(ledger, filters):
    _fill(ledger)
    expected = [e["seq"] for e in reversed(ledger.entries())
                if all(e[k] == v for k, v in filters.items())]
    forward, back, _ = _walk(ledger, **filters)
    assert forward == expected and back == expected


def test_time_window(ledger):
    _fill(ledger, n=9)
    entries = ledger.entries()
    since, until = entries[2]["created_at"], entries[6]["created_at"]
    page = ledger.entries_page(since=since, until=until, limit=100)
    assert [e["seq"] for e in page.entries] == [e["seq"] for e in reversed(entries[2:6])]
    # dates and offsets are normalised to the stored UTC form
    assert ledger.entries_page(since="2000-01-01", limit=100).entries == list(reversed(entries))
    assert ledger.entries_page(until="2000-01-01T00:00+02:00", limit=100).entries == []


def test_events_page(ledger):
    _fill(ledger)
    events = ledger.events()
    page = ledger.entries_page("event", limit=100)
    assert [e["seq"] for e in page.entries] == [e["seq"] for e in reversed(events)]
    assert {e["kind"] for e in page.entries} == {"population_created", "cap_changed"}
    only_a = ledger.entries_page("event", population="pop-a", consumer="ignored-for-events", limit=1)
    assert only_a.entries[0]["kind"] == "cap_changed" and only_a.entries[0]["reason"] == "quarterly review"
    assert only_a.older is not None
    assert ledger.entries_page("event", population="pop-a", before=only_a.older, limit=5).entries[0]["kind"] \
        == "population_created"


def test_spend_series_reads_only_new_charges(ledger):
    _fill(ledger)
    a = [e for e in ledger.entries() if e["population"] == "pop-a"]
    series = ledger.spend_series("pop-a")
    assert series == [(e["seq"], e["created_at"], e["consumer"], e["rho"]) for e in a]
    last = series[4][0]
    assert ledger.spend_series("pop-a", after=last) == series[5:]
    assert ledger.spend_series("pop-a", after=series[-1][0]) == []
    assert ledger.spend_series("pop-a", limit=2) == series[:2]
    assert ledger.spend_series("nobody") == []


@pytest.mark.parametrize("kwargs", [
    {"kind": "both"}, {"limit": 0}, {"limit": 1001}, {"limit": True}, {"before": -1},
    {"before": 3, "after": 1}, {"since": "yesterday"}, {"population": "bad name; --"},
    {"consumer": "x' OR '1'='1"},
])
def test_bad_arguments_are_clear_errors(ledger, kwargs):
    with pytest.raises(InvalidRequest):
        ledger.entries_page(**kwargs)


def test_normalise_time():
    assert normalise_time("2026-11-30") == "2026-11-30T00:00:00.000000Z"
    assert normalise_time("2026-11-30T14:05Z") == "2026-11-30T14:05:00.000000Z"
    assert normalise_time("2026-11-30T14:05:06.5+01:00") == "2026-11-30T13:05:06.500000Z"
    assert normalise_time(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)) == "2026-01-02T03:04:05.000000Z"
    assert normalise_time("  ") is None and normalise_time(None) is None
    with pytest.raises(InvalidRequest):
        normalise_time("30/11/2026")


def test_browsing_queries_use_the_indexes(tmp_path):
    import sqlite3

    led = open_ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    _fill(led, n=6)
    led.close()
    conn = sqlite3.connect(str(tmp_path / "l.sqlite"))
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"charges_by_consumer", "charges_by_time", "events_by_time"} <= names
        plan = " ".join(str(r) for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT seq FROM charges WHERE consumer = 'dash' ORDER BY seq DESC LIMIT 51"))
        assert "charges_by_consumer" in plan
        plan = " ".join(str(r) for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT MIN(seq), MAX(seq) FROM charges WHERE created_at >= '2026' AND created_at < '2027'"))
        assert "charges_by_time" in plan and "COVERING" in plan
    finally:
        conn.close()


def test_a_time_window_before_every_entry_or_after_them_is_empty(ledger):
    _fill(ledger, n=4)
    assert ledger.entries_page(until="2000-01-01").entries == []
    assert ledger.entries_page("event", since="2999-01-01").entries == []
    last = ledger.entries()[-1]["created_at"]
    page = ledger.entries_page(since=last, consumer="ml", limit=5)
    assert all(e["created_at"] >= last and e["consumer"] == "ml" for e in page.entries)


def test_spend_series_states_a_dp_sgd_curve_by_the_orders_the_cap_checks(ledger):
    # A DP-SGD run's curve is known up to order 12 only (Poisson-subsampled Gaussian, q = 0.01,
    # σ = 1, 10,000 steps; dp-accounting's curve), so above order 12 it makes no claim (+∞) and its
    # ρ-bound over the whole grid is ∞; the stored `rho` column says so. The cap (ε = 10, δ = 1e-6)
    # checks orders α ≤ α_cap = 4 only (test_ledger_external), so the burn-down must plot the ρ
    # the filter sees, max_{α ≤ 4} ε(α)/α, here computed from dp-accounting's own values, which is
    # also the population's spent ρ in the spend report — never ∞ for an admitted charge.
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting import rdp

    from dpgate.accounting import ORDERS, curve_on_grid

    caller = [1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0]
    acc = rdp.RdpAccountant(orders=caller)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), 10_000))
    oracle = dict(zip(caller, map(float, acc._rdp)))
    ledger.ensure_population("p", epsilon=10.0, delta=1e-6, allocations={})
    assert ledger.cap("p").alpha_cap == 4.0
    receipt = ledger.charge("p", "analysts", Cost("rdp", curve=tuple(curve_on_grid(list(oracle.values()), caller))),
                            purpose="dp-sgd")
    assert receipt.rho == float("inf")  # no claim above order 12: no finite bound on the whole grid
    # each grid order α ≤ 4 takes the caller's value at the smallest caller order ≥ α
    expected = max(oracle[min(b for b in caller if b >= a)] / a for a in ORDERS if a <= 4.0)
    ((_, _, consumer, rho),) = ledger.spend_series("p")
    assert consumer == "analysts"
    assert rho == pytest.approx(expected, rel=1e-12)
    assert rho == pytest.approx(ledger.spend("p").spent_rho, rel=1e-12)
    ledger.charge("p", "analysts", Cost.zcdp(0.01), purpose="q")
    assert [r[3] for r in ledger.spend_series("p")] == [pytest.approx(expected, rel=1e-12), 0.01]
