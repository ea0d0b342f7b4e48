"""Tests of the privacy-budget ledger (SQLite backend): filters, reports, governance,
integrity, bad input. Concurrency and crash safety are in test_ledger_concurrency.py."""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq
from _oracles import ledger_epsilon as oracle_epsilon

from dpgate import accounting
from dpgate.accounting import ORDERS, Cost
from dpgate.errors import (
    BudgetExhausted,
    DpgateError,
    InvalidBudget,
    InvalidRequest,
    LedgerError,
    PolicyError,
    UnknownConsumer,
    UnknownPopulation,
)
from dpgate.ledger import ChargeReceipt, Ledger, SpendReport, VerifyReport, open_ledger
from dpgate.ledger.base import GENESIS_HASH, entry_hash, optimal_order
from dpgate.ledger.sqlite import MIGRATIONS, SqliteLedger

DELTA = 1e-6
FINITE = [a for a in ORDERS if math.isfinite(a)]


@pytest.fixture
def ledger(tmp_path):
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    yield led
    led.close()


def dump(led: SqliteLedger) -> list[str]:
    """Every row of every table (a fresh connection), to prove that nothing changed."""
    conn = sqlite3.connect(str(led.path))
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def rr_curve(alpha: float, eps: float) -> float:
    """Hand formula, independent of accounting: RDP of ε-randomized response (the worst
    ε-DP pair), capped by ε and α·ε²/2 (Bun & Steinke 2016 Prop. 3.3)."""
    m = max(alpha * eps, (1 - alpha) * eps)
    rr = (m + math.log(math.exp(alpha * eps - m) + math.exp((1 - alpha) * eps - m))
          - math.log1p(math.exp(eps))) / (alpha - 1)
    return min(rr, eps, alpha * eps * eps / 2)


# --------------------------------------------------------------------------------------
# opening, schema, URLs
# --------------------------------------------------------------------------------------


def test_open_ledger_is_a_ledger_with_path_and_pragmas(ledger, tmp_path):
    assert isinstance(ledger, SqliteLedger)
    assert isinstance(ledger, Ledger)
    assert ledger.path == (tmp_path / "ledger.sqlite").absolute()
    conn = ledger.connect()
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        conn.close()
    assert ledger.populations() == []
    report = ledger.verify()
    assert report.ok and report.entries == 0 and report.head == GENESIS_HASH


def test_migrations_recorded_once_and_idempotent(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    open_ledger(url).close()
    conn = sqlite3.connect(str(tmp_path / "l.sqlite"))
    first = conn.execute("SELECT version, name, applied_at FROM schema_migrations").fetchall()
    conn.close()
    assert [r[0] for r in first] == [v for v, _, _ in MIGRATIONS] == [1, 2, 3, 5, 6]
    datetime.fromisoformat(first[0][2].replace("Z", "+00:00"))
    open_ledger(url).close()
    open_ledger(url).close()
    conn = sqlite3.connect(str(tmp_path / "l.sqlite"))
    assert conn.execute("SELECT version, name, applied_at FROM schema_migrations").fetchall() == first
    conn.close()


def test_newer_schema_or_other_order_grid_refused(tmp_path):
    path = tmp_path / "l.sqlite"
    open_ledger(f"sqlite:///{path}").close()
    conn = sqlite3.connect(str(path))
    conn.execute("INSERT INTO schema_migrations VALUES (99, 'future', '2099-01-01T00:00:00Z')")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="newer"):
        open_ledger(f"sqlite:///{path}")
    path2 = tmp_path / "l2.sqlite"
    open_ledger(f"sqlite:///{path2}").close()
    conn = sqlite3.connect(str(path2))
    conn.execute("UPDATE ledger_meta SET value = '[2.0]' WHERE key = 'orders'")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="order grid"):
        open_ledger(f"sqlite:///{path2}")


def test_urls(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rel = open_ledger("sqlite:///rel/ledger.sqlite")
    assert rel.path == (tmp_path / "rel" / "ledger.sqlite").absolute()
    rel.close()
    absolute = open_ledger(f"sqlite:///{tmp_path / 'abs.sqlite'}?synchronous=normal&busy_timeout_ms=500")
    assert str(tmp_path / "abs.sqlite").startswith("/")  # i.e. the URL had four slashes
    conn = absolute.connect()
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 500
    conn.close()
    absolute.close()
    from dpgate.settings import Settings

    s = Settings(home=tmp_path / "home")
    led = open_ledger(s.resolved_ledger_url())
    assert led.path == (tmp_path / "home" / "ledger.sqlite").resolve()
    led.close()
    for bad in ("sqlite:///:memory:", "sqlite://", "mysql://x/y", "nonsense", "sqlite://host/x.db",
                f"sqlite:///{tmp_path / 'x.db'}?bogus=1"):
        with pytest.raises(LedgerError):
            open_ledger(bad)
    with pytest.raises(LedgerError, match="no ledger"):
        open_ledger(f"sqlite:///{tmp_path / 'missing.sqlite'}", create=False)
    assert not (tmp_path / "missing.sqlite").exists()


def test_release_store_shares_the_file(ledger):
    from dpgate.releases import SqliteReleaseStore

    ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={"a": 1.0})
    ledger.charge("p", "a", Cost.zcdp(0.001), purpose="q")
    store = SqliteReleaseStore(ledger.connect)
    store.close()
    conn = sqlite3.connect(str(ledger.path))
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert {"releases", "charges", "events"} <= tables
    assert ledger.verify().ok


# --------------------------------------------------------------------------------------
# caps and the zCDP filter
# --------------------------------------------------------------------------------------


def bbg_rho(eps: float, delta: float, alpha: float) -> float:
    """Hand formula, independent of dpgate: the largest ρ whose RDP value α·ρ converts to ε at
    the single order α by Balle et al. 2020, Thm. 21:
    ε = α·ρ + log((α−1)/α) − (log δ + log α)/(α − 1)."""
    return (eps - math.log((alpha - 1) / alpha) + (math.log(delta) + math.log(alpha)) / (alpha - 1)) / alpha


def test_cap_fixed_into_rho_cap_at_alpha_cap(ledger):
    from dp_accounting.rdp import rdp_privacy_accountant as oracle

    ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={})
    rep = ledger.spend("p")
    cap = ledger.cap("p")
    # ρ_cap = max over the grid of the single-order inverse; α_cap the order attaining it
    want = max(FINITE, key=lambda a: bbg_rho(1.0, DELTA, a))
    assert cap.alpha_cap == want == 24.0 and cap.rule == "alpha_cap"
    assert rep.rho_cap == pytest.approx(bbg_rho(1.0, DELTA, want), rel=1e-12)
    # the order α_cap alone proves the cap (dp-accounting's conversion as the oracle) ...
    eps, order = oracle.compute_epsilon([want], [want * rep.rho_cap], DELTA)
    assert eps <= 1.0 + 1e-12 and eps == pytest.approx(1.0, rel=1e-9) and order == want
    # ... and ρ_cap is within the grid gap of the continuous CKS optimum, never above it
    cont = accounting.rho_for_cap(1.0, DELTA, "tight")
    assert 0.99 * cont < rep.rho_cap <= cont
    assert rep.to_dict()["cap"] == {"epsilon": 1.0, "delta": DELTA, "rho": rep.rho_cap, "alpha_cap": 24.0,
                                    "selection_delta": 0.0, "rule": "alpha_cap"}
    assert rep.spent_rho == 0 and rep.spent_epsilon == 0 and rep.charges == 0
    assert rep.remaining_rho == rep.rho_cap
    assert rep.conversion == "none"


def test_rho_cap_stated_directly_records_its_epsilon(ledger):
    ledger.ensure_population("p", rho_cap=0.1, delta=DELTA, allocations={"a": 1.0})
    rep = ledger.spend("p")
    assert rep.rho_cap == 0.1
    # ε is the best single-order conversion of α·0.1 on the grid (Balle et al. 2020, Thm. 21)
    conv = {a: 0.1 * a + math.log((a - 1) / a) - (math.log(DELTA) + math.log(a)) / (a - 1) for a in FINITE}
    best = min(conv, key=conv.get)
    assert ledger.cap("p").alpha_cap == best
    assert rep.epsilon == pytest.approx(conv[best], rel=1e-12)
    assert accounting.zcdp_epsilon_tight(0.1, DELTA) <= rep.epsilon <= accounting.zcdp_epsilon_tight(0.1, DELTA) * 1.01
    ev = ledger.events("p")
    assert ev[0]["kind"] == "population_created"
    assert ev[0]["new"]["cap"]["rho_stated"] is True
    assert ev[0]["new"]["cap"]["epsilon"] == rep.epsilon
    assert ev[0]["new"]["cap"]["alpha_cap"] == best


def test_exactly_fitting_charges_and_exact_spend(ledger):
    ledger.ensure_population("p", rho_cap=0.1, delta=DELTA, allocations={"a": 1.0})
    for _ in range(100):
        ledger.charge("p", "a", Cost.zcdp(0.001), purpose="q")
    with pytest.raises(BudgetExhausted):
        ledger.charge("p", "a", Cost.zcdp(0.001), purpose="q")
    rep = ledger.spend("p")
    # the exact sum of 100 doubles 0.001 rounds to the double 0.1 (math.fsum agrees)
    assert rep.spent_rho == 0.1 == math.fsum([0.001] * 100)
    assert rep.charges == 100
    assert rep.remaining_rho == 0.0 and rep.remaining_epsilon == 0.0


def test_half_cap_charges(ledger):
    ledger.ensure_population("p", rho_cap=0.3, delta=DELTA, allocations={})
    ledger.charge("p", "x", Cost.zcdp(0.15), purpose="q")
    ledger.charge("p", "y", Cost.zcdp(0.15), purpose="q")
    with pytest.raises(BudgetExhausted):
        ledger.charge("p", "z", Cost.zcdp(1e-9), purpose="q")


def test_reported_epsilon_for_52_gaussian_releases(ledger):
    ledger.ensure_population("p", epsilon=4.0, delta=DELTA, allocations={"a": 1.0})
    rho = 1 / (2 * 13.07**2)
    receipts = [ledger.charge("p", "a", Cost.zcdp(rho), purpose="q") for _ in range(52)]
    rep = ledger.spend("p")
    # the ledger's one conversion (its cap rule: Thm. 21 of Balle et al. 2020 at the grid's orders),
    # checked against dp-accounting; the textbook CKS20 conversion (continuous order) gives 2.694
    expected = oracle_epsilon(52 / (2 * 13.07**2), DELTA)
    assert rep.spent_epsilon == pytest.approx(expected, rel=1e-9)
    assert rep.spent_epsilon == pytest.approx(2.696, abs=0.001)
    assert rep.spent_epsilon >= accounting.zcdp_epsilon_tight(52 / (2 * 13.07**2), DELTA)
    assert rep.conversion == "ledger"
    assert rep.spent_rho == pytest.approx(52 * rho, rel=1e-15)
    # per-charge ε is the charge alone, never summed (52 × 0.32 ≈ 16.8 ≠ 2.69)
    assert receipts[0].epsilon_at_delta == pytest.approx(oracle_epsilon(rho, DELTA), rel=1e-9)
    assert sum(r.epsilon_at_delta for r in receipts) > 6 * rep.spent_epsilon


def test_receipt_fields(ledger):
    ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={"a": 1.0})
    r = ledger.charge("p", "a", Cost.zcdp(0.002), purpose="query", metadata={"plan": "abc"})
    assert isinstance(r, ChargeReceipt)
    assert r.charge_id.startswith("chg_") and len(r.charge_id) == 28
    assert (r.population, r.consumer, r.cost, r.rho, r.duplicate) == ("p", "a", Cost.zcdp(0.002), 0.002, False)
    assert r.epsilon_at_delta == pytest.approx(oracle_epsilon(0.002, DELTA), rel=1e-9)
    assert r.delta == DELTA
    assert datetime.fromisoformat(r.created_at.replace("Z", "+00:00")).tzinfo is not None
    d = r.to_dict()
    assert d["cost"] == {"kind": "zcdp", "rho": 0.002}
    json.dumps(d, allow_nan=False)
    (e,) = ledger.entries()
    assert e["charge_id"] == r.charge_id and e["metadata"] == {"plan": "abc"} and e["purpose"] == "query"


def test_budget_exhausted_details(ledger):
    ledger.ensure_population("p", rho_cap=0.1, delta=DELTA, allocations={"a": 1.0})
    ledger.charge("p", "a", Cost.zcdp(0.06), purpose="q")
    before = dump(ledger)
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("p", "a", Cost.zcdp(0.05), purpose="q")
    d = info.value.details
    assert dump(ledger) == before
    assert info.value.code == "budget_exhausted" and info.value.http_status == 409
    assert d["population"] == "p" and d["consumer"] == "a" and d["delta"] == DELTA
    assert d["requested"]["rho"] == 0.05 and d["spent"]["rho"] == 0.06
    assert d["requested"]["epsilon"] == pytest.approx(oracle_epsilon(0.05, DELTA), rel=1e-9)
    assert d["spent"]["epsilon"] == pytest.approx(oracle_epsilon(0.06, DELTA), rel=1e-9)
    assert d["cap"]["rho"] == 0.1
    # a consumer holding the whole budget is refused where the population is: the population's
    # published ε (the best single-order conversion of α·0.1 on the grid) is the cap named
    assert d["scope"] == "population"
    assert d["cap"]["epsilon"] == ledger.spend("p").epsilon
    assert d["cap"]["epsilon"] == pytest.approx(oracle_epsilon(0.1, DELTA), rel=1e-9)
    assert d["remaining"]["rho"] == pytest.approx(0.04, rel=1e-12)
    assert d["remaining"]["epsilon"] == pytest.approx(oracle_epsilon(0.04, DELTA), rel=1e-9)
    assert d["rule"] == "zcdp"
    json.dumps(info.value.to_dict(), allow_nan=False)
    # what remains does fit
    ledger.charge("p", "a", Cost.zcdp(d["remaining"]["rho"]), purpose="q")


# --------------------------------------------------------------------------------------
# allocations
# --------------------------------------------------------------------------------------


def test_allocations_hold_consumers_to_their_share(ledger):
    ledger.ensure_population("p", rho_cap=1.0, delta=DELTA, allocations={"dash": 0.6, "analysts": 0.4})
    ledger.charge("p", "dash", Cost.zcdp(0.3), purpose="q")
    ledger.charge("p", "dash", Cost.zcdp(0.3), purpose="q")
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("p", "dash", Cost.zcdp(0.001), purpose="q")
    assert info.value.details["scope"] == "consumer"
    assert info.value.details["cap"]["rho"] == 0.6
    ledger.charge("p", "analysts", Cost.zcdp(0.4), purpose="q")
    rep = ledger.spend("p")
    assert rep.spent_rho == 1.0 and rep.remaining_rho == 0.0
    c = rep.to_dict()["consumers"]
    assert c["dash"]["share"] == 0.6 and c["dash"]["cap_rho"] == 0.6 and c["dash"]["spent_rho"] == 0.6
    assert c["dash"]["charges"] == 2 and c["analysts"]["charges"] == 1
    assert c["analysts"]["remaining_rho"] == 0.0
    assert c["dash"]["spent_epsilon"] == pytest.approx(oracle_epsilon(0.6, DELTA), rel=1e-9)


def test_population_holds_the_total_after_reallocation(ledger):
    ledger.ensure_population("p", rho_cap=1.0, delta=DELTA, allocations={"a": 0.6, "b": 0.4})
    ledger.charge("p", "a", Cost.zcdp(0.6), purpose="q")
    # policy now gives b most of the budget: b may still only use what the population has left
    ledger.apply_policy("p", rho_cap=1.0, delta=DELTA, allocations={"a": 0.2, "b": 0.8}, actor="ops",
                        reason="reallocation")
    assert ledger.spend("p").consumers["b"].remaining_rho == pytest.approx(0.4)
    ledger.charge("p", "b", Cost.zcdp(0.4), purpose="q")
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("p", "b", Cost.zcdp(0.01), purpose="q")
    assert info.value.details["scope"] == "population"
    with pytest.raises(BudgetExhausted) as info:  # a is now over its (reduced) share
        ledger.charge("p", "a", Cost.zcdp(0.01), purpose="q")
    assert info.value.details["scope"] == "consumer"
    assert info.value.details["remaining"]["rho"] == 0.0
    assert ledger.verify().ok


def test_open_population_accepts_any_consumer(ledger):
    ledger.ensure_population("p", rho_cap=1.0, delta=DELTA, allocations={})
    ledger.charge("p", "anyone", Cost.zcdp(0.5), purpose="q")
    ledger.charge("p", "someone-else", Cost.zcdp(0.5), purpose="q")
    with pytest.raises(BudgetExhausted):
        ledger.charge("p", "third", Cost.zcdp(0.01), purpose="q")
    rep = ledger.spend("p").to_dict()
    assert rep["consumers"]["anyone"]["share"] is None
    assert rep["consumers"]["anyone"]["cap_rho"] == 1.0


def test_unknown_population_and_consumer(ledger):
    ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={"a": 1.0})
    before = dump(ledger)
    with pytest.raises(UnknownPopulation):
        ledger.charge("nope", "a", Cost.zcdp(0.001), purpose="q")
    with pytest.raises(UnknownConsumer) as info:
        ledger.charge("p", "b", Cost.zcdp(0.001), purpose="q")
    assert info.value.http_status == 404 and info.value.details == {"population": "p", "consumer": "b"}
    with pytest.raises(UnknownPopulation):
        ledger.spend("nope")
    with pytest.raises(UnknownPopulation):
        ledger.set_cap("nope", epsilon=1.0, delta=DELTA, actor="admin", reason="r")
    assert dump(ledger) == before


# --------------------------------------------------------------------------------------
# RDP curves and the Rényi filter
# --------------------------------------------------------------------------------------


def test_mixed_zcdp_and_pure_epsilon_refused_exactly_when_an_order_exceeds_the_budget(tmp_path):
    # Hand-computed example. ρ_cap = 0.5 (stated in ρ), δ = 1e-6, so B(α) = 0.5·α.
    # After a zCDP charge of ρ = 0.25, B(α) − S(α) = 0.25·α at every order.
    # A pure ε-DP charge costs the randomized-response curve
    #   c(α) = min( log((e^{αε} + e^{(1−α)ε}) / (1 + e^ε)) / (α−1), ε, α·ε²/2 ),
    # whose ratio c(α)/α is largest at the smallest grid order α = 1.01:
    #   ε = 0.70: c(1.01) = 0.237632 ≤ 0.25·1.01 = 0.2525  → admitted
    #   ε = 0.75: c(1.01) = 0.271215 > 0.2525              → refused, binding order 1.01
    # (at α* ≈ 5.907, the extra order, c ≈ 0.64 ≪ 0.25·5.907 ≈ 1.48: never binding here).
    # The threshold ε* solves max_α c(α)/α = 0.25: ε* ≈ 0.72249.
    assert rr_curve(1.01, 0.70) == pytest.approx(0.237632, abs=1e-6)
    assert rr_curve(1.01, 0.75) == pytest.approx(0.271215, abs=1e-6)
    thr = brentq(lambda e: max(rr_curve(a, e) / a for a in FINITE) - 0.25, 0.5, 1.0, xtol=1e-14)
    assert thr == pytest.approx(0.72249, abs=1e-5)

    def fresh(name):
        led = open_ledger(f"sqlite:///{tmp_path / name}")
        led.ensure_population("p", rho_cap=0.5, delta=DELTA, allocations={})
        led.charge("p", "a", Cost.zcdp(0.25), purpose="gaussian release")
        return led

    cases = [(0.70, True), (0.75, False), (thr * (1 - 1e-6), True), (thr * (1 + 1e-6), False)]
    for i, (eps, fits) in enumerate(cases):
        led = fresh(f"l{i}.sqlite")
        if fits:
            r = led.charge("p", "a", Cost.pure(eps), purpose="laplace release")
            assert r.cost.kind == "rdp"
            assert r.rho == pytest.approx(max(rr_curve(a, eps) / a for a in FINITE), rel=1e-9)
        else:
            with pytest.raises(BudgetExhausted) as info:
                led.charge("p", "a", Cost.pure(eps), purpose="laplace release")
            assert info.value.details["rule"] == "renyi"
            assert info.value.details["binding_order"] == 1.01
        led.close()


def test_mixed_history_from_pure_epsilon_first(tmp_path):
    # Pure ε = 0.5 first (c(1.01)/1.01 ≈ 0.1235), then zCDP: a zCDP charge of ρ fits iff
    # ρ ≤ 0.5 − max_α c(α)/α (the zCDP request is α·ρ at every order).
    led = open_ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    led.ensure_population("p", rho_cap=0.5, delta=DELTA, allocations={})
    led.charge("p", "a", Cost.pure(0.5), purpose="q")
    room = 0.5 - max(rr_curve(a, 0.5) / a for a in FINITE)
    rep = led.spend("p")
    assert rep.remaining_rho == pytest.approx(room, rel=1e-9)
    assert rep.conversion == "ledger"
    with pytest.raises(BudgetExhausted):
        led.charge("p", "a", Cost.zcdp(room * (1 + 1e-6)), purpose="q")
    led.charge("p", "a", Cost.zcdp(room * (1 - 1e-6)), purpose="q")
    assert led.verify().ok
    led.close()


def test_optimal_order_is_the_cks_minimiser():
    # [CKS20] Cor. 13: with x = α − 1, the objective's derivative vanishes where
    # ρx² + log(1 + x) = log(1/δ).
    for rho, delta in [(0.5, 1e-6), (0.0243, 1e-6), (0.01, 1e-9), (2.0, 1e-5)]:
        L = -math.log(delta)
        x = brentq(lambda x: rho * x * x + math.log1p(x) - L, 1e-12, math.sqrt(L / rho) + 1)
        assert optimal_order(rho, delta) == pytest.approx(1 + x, rel=1e-5)


def test_legacy_caps_check_alpha_star_and_keep_the_published_cap_for_rdp_curves():
    # Legacy caps (fixed before the α_cap rule) keep their rule: every grid order and α*.
    # An RDP curve shaped like a Gaussian, c(α) = α·ρ, known only at the grid orders.
    # ρ_cap = 0.5, δ = 1e-6 → α* ≈ 5.907, between grid orders 5 and 6. At α* the ledger
    # bounds D_α* by the chord of (α−1)·c(α) (convexity): with λ = (6 − α*)/(6 − 5),
    #   D_α* ≤ ρ·[λ·4·5 + (1−λ)·5·6]/(α*−1),
    # so the curve fits iff ρ ≤ ρ_cap·α*(α*−1)/[λ·20 + (1−λ)·30] ≈ 0.99715·ρ_cap.
    from dpgate.ledger.base import BudgetCurve, Totals, build_spend_report, filter_decision, legacy_cap

    cap = legacy_cap(None, DELTA, rho_cap=0.5)
    assert cap.rule == "legacy" and cap.alpha_cap is None
    L = -math.log(DELTA)
    x = brentq(lambda x: 0.5 * x * x + math.log1p(x) - L, 1e-9, 100)
    assert cap.alpha_star == pytest.approx(1 + x, rel=1e-5)
    lam = (6 - cap.alpha_star) / (6 - 5)
    limit = cap.alpha_star * (cap.alpha_star - 1) / (lam * 20 + (1 - lam) * 30)
    assert limit == pytest.approx(0.99715, abs=1e-4)
    b = BudgetCurve.of(cap)
    over = filter_decision(Totals(), Cost.rdp(accounting.gaussian_rdp(0.5 * limit * (1 + 1e-9))), b)
    assert not over.ok and over.binding_order == cap.alpha_star
    fits = Cost.rdp(accounting.gaussian_rdp(0.5 * limit * (1 - 1e-9)))
    assert filter_decision(Totals(), fits, b).ok
    rep = build_spend_report("p", cap, {}, Totals().add(fits), {})
    # the admitted history meets the published cap; on the grid alone it would not
    assert rep.spent_epsilon <= rep.epsilon * (1 + 1e-9)
    assert accounting.rdp_epsilon_tight(accounting.gaussian_rdp(0.5), DELTA) > rep.epsilon * 1.0001
    assert filter_decision(Totals(), Cost.zcdp(0.5), b).ok


def test_a_gaussian_shaped_curve_may_use_all_of_rho_cap_at_alpha_cap(ledger):
    # With α_cap on the grid there is no chord to pay for: c(α) = α·ρ fits iff ρ ≤ ρ_cap.
    ledger.ensure_population("p", rho_cap=0.5, delta=DELTA, allocations={})
    cap = ledger.cap("p")
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("p", "a", Cost.rdp(accounting.gaussian_rdp(0.5 * (1 + 1e-9))), purpose="q")
    assert info.value.details["binding_order"] <= cap.alpha_cap
    ledger.charge("p", "a", Cost.rdp(accounting.gaussian_rdp(0.5)), purpose="q")
    rep = ledger.spend("p")
    assert rep.spent_epsilon <= rep.epsilon * (1 + 1e-12)
    assert rep.remaining_rho == 0.0
    assert ledger.verify().ok


def test_reported_conversion_follows_what_was_composed(ledger):
    # one conversion whatever was composed (issue 24): the ledger's cap rule, [BBG+20] Thm. 21 at
    # the grid's orders; continuous Gaussians are no longer reported by their exact conversion
    # (smaller), so that the ε shown for a spend equal to ρ_cap is the cap's ε
    ledger.ensure_population("g", epsilon=4.0, delta=DELTA, allocations={})
    for _ in range(3):
        ledger.charge("g", "sgd", Cost.continuous_gaussian(0.02), purpose="external")
    rep = ledger.spend("g")
    assert rep.conversion == "ledger"
    assert rep.spent_epsilon == pytest.approx(oracle_epsilon(math.fsum([0.02] * 3), DELTA), rel=1e-9)
    assert rep.spent_epsilon > accounting.gaussian_epsilon_exact(math.fsum([0.02] * 3), DELTA)
    ledger.charge("g", "sgd", Cost.zcdp(0.01), purpose="ours")
    rep = ledger.spend("g")
    assert rep.spent_epsilon == pytest.approx(oracle_epsilon(math.fsum([0.02] * 3 + [0.01]), DELTA), rel=1e-9)
    ledger.charge("g", "sgd", Cost.laplace(0.1), purpose="laplace")
    rep = ledger.spend("g")
    assert rep.conversion == "ledger"
    curve = np.asarray([a * 0.07 if math.isfinite(a) else math.inf for a in ORDERS]) + \
        accounting.laplace_rdp(0.1)
    assert rep.spent_epsilon == pytest.approx(oracle_epsilon(curve.tolist(), DELTA), rel=1e-9)


def test_rdp_curve_charge_rho_bound(ledger):
    ledger.ensure_population("p", epsilon=8.0, delta=DELTA, allocations={})
    curve = [0.01 * a ** 1.5 if math.isfinite(a) else math.inf for a in ORDERS]
    curve = [min(v, 5.0) for v in curve]  # finite everywhere but ∞ at α = ∞ is allowed
    curve[-1] = math.inf
    r = ledger.charge("p", "sgd", Cost.rdp(curve), purpose="dp-sgd")
    assert r.rho == max(c / a for c, a in zip(curve, ORDERS) if math.isfinite(a))
    (e,) = ledger.entries()
    assert e["kind"] == "rdp" and e["cost"]["curve"][-1] == "inf"
    assert ledger.verify().ok


# --------------------------------------------------------------------------------------
# single flight
# --------------------------------------------------------------------------------------


def test_release_key_single_flight(ledger):
    ledger.ensure_population("p", rho_cap=0.01, delta=DELTA, allocations={})
    first = ledger.charge("p", "a", Cost.zcdp(0.006), purpose="q", release_key="k1")
    again = ledger.charge("p", "b", Cost.zcdp(0.006), purpose="q", release_key="k1")
    assert not first.duplicate and again.duplicate
    assert again.charge_id == first.charge_id and again.consumer == "a"
    assert len(ledger.entries()) == 1
    # a duplicate is served even when the budget could not pay for it again
    assert ledger.charge("p", "a", Cost.zcdp(0.006), purpose="q", release_key="k1").duplicate
    with pytest.raises(BudgetExhausted):
        ledger.charge("p", "a", Cost.zcdp(0.006), purpose="q", release_key="k2")


def test_release_key_single_flight_across_threads(ledger):
    ledger.ensure_population("p", rho_cap=1.0, delta=DELTA, allocations={})
    barrier = threading.Barrier(8)
    out: list[ChargeReceipt] = []

    def go():
        barrier.wait()
        out.append(ledger.charge("p", "a", Cost.zcdp(0.1), purpose="q", release_key="same"))

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.duplicate for r in out) == [False] + [True] * 7
    assert len({r.charge_id for r in out}) == 1
    assert ledger.spend("p").charges == 1


# --------------------------------------------------------------------------------------
# governance events
# --------------------------------------------------------------------------------------


def test_ensure_population_creates_once_and_never_changes_what_the_ledger_owns(ledger):
    d = ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={"a": 0.5, "b": 0.5})
    assert d.created and not d.drifted
    d = ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={"b": 0.5, "a": 0.5})
    assert not d.created and not d.drifted and d.message() == ""
    assert [e["kind"] for e in ledger.events("p")] == ["population_created"]
    # a policy file with other values changes nothing: it is reported as drift
    before = dump(ledger)
    d = ledger.ensure_population("p", epsilon=2.0, delta=DELTA, allocations={"a": 0.7, "b": 0.3},
                                 actor="policy", reason="policy file v2")
    assert dump(ledger) == before
    assert d.drifted and d.cap_differs and d.allocations_differ
    assert d.ledger_cap.epsilon == 1.0 and d.policy_cap.epsilon == 2.0
    assert "caps apply" in d.message() and len(d.differences()) == 2
    assert ledger.spend("p").epsilon == 1.0
    # adopting the file's values is a recorded governance event
    out = ledger.apply_policy("p", epsilon=2.0, delta=DELTA, allocations={"a": 0.7, "b": 0.3},
                              actor="cli:alice", reason="policy file v2 reviewed")
    assert out["changed"] and [e["kind"] for e in out["events"]] == ["cap_changed", "allocations_changed"]
    ev = ledger.events("p")
    assert [e["kind"] for e in ev] == ["population_created", "cap_changed", "allocations_changed"]
    assert ev[1]["old"]["epsilon"] == 1.0 and ev[1]["new"]["epsilon"] == 2.0
    assert ev[1]["new"]["rho_cap"] == ledger.cap("p").rho_cap
    assert ev[2]["old"] == {"allocations": {"a": 0.5, "b": 0.5}}
    assert ev[2]["new"] == {"allocations": {"a": 0.7, "b": 0.3}}
    assert ev[2]["actor"] == "cli:alice" and ev[2]["reason"] == "policy file v2 reviewed"
    assert ledger.spend("p").epsilon == 2.0
    assert not ledger.ensure_population("p", epsilon=2.0, delta=DELTA, allocations={"a": 0.7, "b": 0.3}).drifted
    again = ledger.apply_policy("p", epsilon=2.0, delta=DELTA, allocations={"a": 0.7, "b": 0.3},
                                actor="cli:alice", reason="again")
    assert not again["changed"] and len(ledger.events("p")) == 3
    with pytest.raises(UnknownPopulation):
        ledger.apply_policy("nope", epsilon=2.0, delta=DELTA, allocations={}, actor="a", reason="r")
    with pytest.raises(InvalidRequest):
        ledger.apply_policy("p", epsilon=2.0, delta=DELTA, allocations={}, actor="a", reason=" ")
    assert ledger.populations() == ["p"]
    assert ledger.verify().ok


def test_set_cap_is_an_event_and_lowering_below_spend_refuses_everything(ledger):
    ledger.ensure_population("p", rho_cap=0.1, delta=DELTA, allocations={"a": 1.0})
    for _ in range(5):
        ledger.charge("p", "a", Cost.zcdp(0.01), purpose="q")
    entries_before = ledger.entries()
    out = ledger.set_cap("p", rho_cap=0.02, delta=DELTA, actor="alice", reason="incident 42")
    assert out["changed"] and out["old"]["rho_cap"] == 0.1 and out["new"]["rho_cap"] == 0.02
    assert out["actor"] == "alice" and out["reason"] == "incident 42" and out["event_id"].startswith("evt_")
    # the answer says the cap is now below what was spent, and by how much
    assert out["exhausted"] is True
    assert out["over_by"]["rho"] == pytest.approx(0.05 - 0.02, rel=1e-9)
    assert out["spent"]["rho"] == pytest.approx(0.05) and out["remaining"]["rho"] == 0.0
    assert out["over_by"]["epsilon"] == pytest.approx(
        oracle_epsilon(0.05, DELTA) - out["new"]["epsilon"], rel=1e-9)
    assert "below what was already spent" in out["message"]
    ev = ledger.events("p")[-1]
    assert (ev["kind"], ev["actor"], ev["reason"], ev["old"]["rho_cap"], ev["new"]["rho_cap"]) == (
        "cap_changed", "alice", "incident 42", 0.1, 0.02)
    rep = ledger.spend("p")
    assert rep.spent_rho == pytest.approx(0.05) and rep.remaining_rho == 0.0 and rep.remaining_epsilon == 0.0
    assert rep.consumers["a"].remaining_rho == 0.0
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("p", "a", Cost.zcdp(1e-12), purpose="q")
    assert info.value.details["remaining"] == {"rho": 0.0, "epsilon": 0.0}
    assert ledger.entries() == entries_before  # never edited or refunded
    same = ledger.set_cap("p", rho_cap=0.02, delta=DELTA, actor="alice", reason="again")
    assert not same["changed"] and len(ledger.events("p")) == 2
    up = ledger.set_cap("p", epsilon=5.0, delta=1e-7, actor="bob", reason="new agreement")
    assert up["exhausted"] is False and up["over_by"] is None
    r = ledger.charge("p", "a", Cost.zcdp(0.01), purpose="q")
    assert r.delta == 1e-7 and r.epsilon_at_delta == pytest.approx(oracle_epsilon(0.01, 1e-7), rel=1e-9)
    assert ledger.spend("p").delta == 1e-7
    assert ledger.verify().ok


# --------------------------------------------------------------------------------------
# integrity
# --------------------------------------------------------------------------------------


def _populate(led):
    led.ensure_population("p", rho_cap=1.0, delta=DELTA, allocations={"a": 0.5, "b": 0.5})
    for i in range(6):
        led.charge("p", "ab"[i % 2], Cost.zcdp(0.01 * (i + 1)), purpose=f"q{i}")
    led.charge("p", "a", Cost.pure(0.1), purpose="laplace")


def test_hash_chain_links_every_entry(ledger):
    _populate(ledger)
    chain = ledger.chain()
    assert [e["seq"] for e in chain] == list(range(1, 9))
    assert chain[0]["type"] == "event" and chain[0]["prev_hash"] == GENESIS_HASH
    for prev, cur in zip(chain, chain[1:]):
        assert cur["prev_hash"] == prev["hash"]
    for e in chain:
        assert entry_hash(e) == e["hash"]
    rep = ledger.verify()
    assert isinstance(rep, VerifyReport)
    assert rep.ok and rep.entries == 8 and rep.charges == 7 and rep.events == 1
    assert rep.head == chain[-1]["hash"]


def test_append_only_triggers(ledger):
    _populate(ledger)
    conn = ledger.connect()
    for sql in ("UPDATE charges SET rho = 0 WHERE seq = 2", "DELETE FROM charges WHERE seq = 2",
                "UPDATE events SET reason = 'x'", "DELETE FROM events"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute(sql)
    conn.close()
    assert ledger.verify().ok


def test_tampering_with_a_charge_is_reported(ledger):
    _populate(ledger)
    conn = sqlite3.connect(str(ledger.path))
    conn.execute("DROP TRIGGER charges_no_update")
    conn.execute("UPDATE charges SET rho = 0.0001 WHERE seq = 3")
    conn.commit()
    conn.close()
    rep = ledger.verify()
    assert not rep.ok
    text = "\n".join(rep.problems)
    assert "seq=3: hash mismatch" in text
    assert "rho column" in text
    assert "charges_no_update" in text


def test_tampering_by_deleting_or_editing_derived_state_is_reported(ledger):
    _populate(ledger)
    conn = sqlite3.connect(str(ledger.path))
    conn.execute("DROP TRIGGER charges_no_delete")
    conn.execute("DELETE FROM charges WHERE seq = (SELECT MAX(seq) FROM charges)")
    conn.execute("UPDATE spend_totals SET charges = 0 WHERE consumer = 'b'")
    conn.execute("UPDATE populations SET rho_cap = 100")
    conn.commit()
    conn.close()
    rep = ledger.verify()
    text = "\n".join(rep.problems)
    assert not rep.ok
    assert "chain head" in text
    assert "consumer 'b': the stored spend totals differ" in text
    assert "cap in force differs" in text


def test_tampering_in_the_middle_breaks_the_links(ledger):
    _populate(ledger)
    conn = sqlite3.connect(str(ledger.path))
    conn.execute("DROP TRIGGER charges_no_delete")
    conn.execute("DELETE FROM charges WHERE seq = 4")
    conn.commit()
    conn.close()
    text = "\n".join(ledger.verify().problems)
    assert "expected seq 4" in text and "prev_hash" in text


def test_reading_changes_nothing(ledger):
    _populate(ledger)
    before = dump(ledger)
    head = ledger.verify().head
    for _ in range(2):
        ledger.spend("p")
        ledger.verify()
        ledger.entries(limit=3)
        ledger.events()
        ledger.populations()
        ledger.chain()
    assert dump(ledger) == before
    rep = ledger.verify()
    assert rep.head == head and rep.entries == 8


def test_entries_limit_and_population_filter(ledger):
    _populate(ledger)
    ledger.ensure_population("q", epsilon=1.0, delta=DELTA, allocations={})
    ledger.charge("q", "z", Cost.zcdp(0.001), purpose="other")
    assert [e["purpose"] for e in ledger.entries("p", limit=2)] == ["q5", "laplace"]
    assert len(ledger.entries("p")) == 7 and len(ledger.entries()) == 8
    assert [e["population"] for e in ledger.entries(limit=1)] == ["q"]
    assert [e["kind"] for e in ledger.events("q")] == ["population_created"]
    with pytest.raises(InvalidRequest):
        ledger.entries(limit=0)


# --------------------------------------------------------------------------------------
# bad input: clear errors, nothing written
# --------------------------------------------------------------------------------------


def _raw_cost(kind, rho=None, curve=None) -> Cost:
    """A Cost built around its own checks (what a buggy caller could hand the ledger)."""
    c = object.__new__(Cost)
    object.__setattr__(c, "kind", kind)
    object.__setattr__(c, "rho", rho)
    object.__setattr__(c, "curve", curve)
    return c


def test_bad_charges_cost_nothing(ledger):
    ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={"a": 1.0})
    before = dump(ledger)
    with pytest.raises(ValueError, match="rho"):
        Cost.zcdp(-0.1)
    with pytest.raises(ValueError, match="rho"):
        Cost.zcdp(float("nan"))
    bad_costs = [
        _raw_cost("zcdp", rho=-0.1),
        _raw_cost("zcdp", rho=float("nan")),
        _raw_cost("zcdp", rho=math.inf),
        _raw_cost("zcdp", rho=0.0),
        _raw_cost("laplace", rho=0.1),
        _raw_cost("rdp", curve=(0.1,) * 3),
        _raw_cost("rdp", curve=(float("nan"),) * len(ORDERS)),
        _raw_cost("rdp", curve=(-1.0,) * len(ORDERS)),
        Cost.rdp([0.0] * len(ORDERS)),
        Cost.rdp([math.inf] + [1.0] * (len(ORDERS) - 1)),  # no claim at α = 1.01: never fits
        0.001,
        None,
    ]
    for cost in bad_costs:
        with pytest.raises(InvalidBudget):
            ledger.charge("p", "a", cost, purpose="q")  # type: ignore[arg-type]
    for kwargs in ({"purpose": ""}, {"purpose": None}, {"purpose": "q", "metadata": {"x": float("nan")}},
                   {"purpose": "q", "metadata": {"x": object()}}, {"purpose": "q", "metadata": [1]},
                   {"purpose": "q", "release_key": ""}):
        with pytest.raises(InvalidRequest):
            ledger.charge("p", "a", Cost.zcdp(0.001), **kwargs)  # type: ignore[arg-type]
    for pop, con in (("", "a"), ("p", ""), ("p", "a b"), (None, "a")):
        with pytest.raises(InvalidRequest):
            ledger.charge(pop, con, Cost.zcdp(0.001), purpose="q")  # type: ignore[arg-type]
    assert dump(ledger) == before


def test_bad_caps_and_allocations_cost_nothing(ledger):
    ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={"a": 1.0})
    before = dump(ledger)
    for eps, delta in [(0.0, DELTA), (-1.0, DELTA), (math.inf, DELTA), (float("nan"), DELTA),
                       (1.0, 0.0), (1.0, 1.0), (1.0, -0.1), (1.0, float("nan")), ("1", DELTA)]:
        with pytest.raises(InvalidBudget):
            ledger.set_cap("p", epsilon=eps, delta=delta, actor="a", reason="r")
        with pytest.raises(PolicyError):
            ledger.ensure_population("new", epsilon=eps, delta=delta, allocations={})
    with pytest.raises(InvalidBudget):
        ledger.set_cap("p", epsilon=1.0, rho_cap=0.1, delta=DELTA, actor="a", reason="r")
    with pytest.raises(InvalidBudget):
        ledger.set_cap("p", rho_cap=-0.1, delta=DELTA, actor="a", reason="r")
    with pytest.raises(InvalidRequest):
        ledger.set_cap("p", epsilon=2.0, delta=DELTA, actor="", reason="r")
    with pytest.raises(InvalidRequest):
        ledger.set_cap("p", epsilon=2.0, delta=DELTA, actor="a", reason=" ")
    for allocs in ({"a": 0.6, "b": 0.5}, {"a": 1.5}, {"a": -0.1}, {"a": float("nan")}, {"": 0.5},
                   {"a": "half"}, [("a", 0.5), ("a", 0.5)]):
        with pytest.raises(PolicyError):
            ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations=allocs)
        with pytest.raises(PolicyError):
            ledger.ensure_population("new", epsilon=1.0, delta=DELTA, allocations=allocs)
    with pytest.raises(PolicyError, match="sum"):
        ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={"a": 0.6, "b": 0.5})
    assert dump(ledger) == before
    # shares summing to exactly 1 within floating point are fine
    ledger.ensure_population("ok", epsilon=1.0, delta=DELTA, allocations={"a": 0.1, "b": 0.2, "c": 0.7})
    assert all(issubclass(e, DpgateError) for e in (InvalidBudget, PolicyError, InvalidRequest))


def test_closed_ledger_refuses(tmp_path):
    led = open_ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    led.close()
    led.close()
    with pytest.raises(LedgerError):
        led.populations()


def test_spend_report_is_json_ready(ledger):
    _populate(ledger)
    rep = ledger.spend("p")
    assert isinstance(rep, SpendReport)
    d = rep.to_dict()
    json.dumps(d, allow_nan=False)
    assert set(d) >= {"population", "cap", "spent", "remaining", "charges", "consumers"}
    assert set(d["consumers"]["a"]) == {"share", "cap_rho", "spent_rho", "spent_epsilon",
                                        "remaining_rho", "remaining_epsilon", "charges", "selection_delta_spent"}
    assert d["charges"] == 7 and d["consumers"]["a"]["charges"] == 4


def test_file_path_accepts_pathlike(tmp_path):
    led = SqliteLedger(Path(tmp_path) / "sub" / "l.sqlite")
    assert led.path.parent.is_dir()
    led.close()
