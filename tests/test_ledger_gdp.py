"""The Gaussian-DP filter of the ledger (issue 22 item 1), on SQLite and PostgreSQL.

Oracles computed here, independently of :mod:`dpgate.accounting.gdp`: μ_cap from the
Dong–Roth–Su closed form solved with scipy's ``norm`` (not ``log_ndtr``), and the number of
equal charges that fit from μ_cap² / μ². The adversarial-history property test draws random
sequences of Gaussian and non-Gaussian requests and checks that what was admitted always
meets the cap under the exact GDP conversion.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

from dpgate.accounting import Cost
from dpgate.errors import BudgetExhausted, InvalidBudget, PolicyError
from dpgate.ledger import open_ledger
from dpgate.ledger.caps import validate_cap
from dpgate.ledger.filter import BudgetCurve, Totals, filter_decision

EPS, DELTA = 4.0, 1e-6


def _oracle_mu_cap(eps: float, delta: float) -> float:
    f = lambda m: norm.cdf(-eps / m + m / 2) - math.exp(eps) * norm.cdf(-eps / m - m / 2) - delta  # noqa: E731
    return brentq(f, 1e-3, 50.0, xtol=1e-14)


def _oracle_delta(mu: float, eps: float) -> float:
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request, tmp_path):
    if request.param == "sqlite":
        led = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    else:
        url = request.getfixturevalue("pg_url")
        led = open_ledger(url)
    yield led
    led.close()


@pytest.fixture
def pg_url(request):
    """A fresh random schema on the test server (``test_ledger_postgres.pg_url``), or a skip."""
    pytest.importorskip("psycopg")
    return request.getfixturevalue("pg_url_fresh")


try:  # the PostgreSQL fixtures (a random schema per test, dropped afterwards)
    from test_ledger_postgres import pg_server  # noqa: F401
    from test_ledger_postgres import pg_url as pg_url_fresh  # noqa: F401
except pytest.skip.Exception:  # pragma: no cover - no psycopg
    pass


def _gaussian(rho: float) -> Cost:
    """A discrete-Gaussian-shaped charge: μ slightly above √(2ρ), as the sampler's bound is."""
    return Cost.discrete_gaussian(rho, math.sqrt(2 * rho) * (1 + 5e-4))


def test_cap_mu_matches_the_closed_form():
    cap = validate_cap(EPS, DELTA, composition="gdp")
    assert cap.mu_cap == pytest.approx(_oracle_mu_cap(EPS, DELTA), rel=1e-9)
    assert _oracle_delta(cap.mu_cap, EPS) <= DELTA * (1 + 1e-9)
    assert cap.to_dict()["composition"] == "gdp"
    assert "composition" not in validate_cap(EPS, DELTA).to_dict()  # old events hash as they were
    with pytest.raises(InvalidBudget):
        validate_cap(None, DELTA, rho_cap=0.3, composition="gdp")
    with pytest.raises(InvalidBudget):
        validate_cap(EPS, DELTA, composition="pld")


def test_gdp_population_admits_what_the_exact_conversion_allows(ledger):
    ledger.ensure_population("g", epsilon=EPS, delta=DELTA, composition="gdp")
    ledger.ensure_population("r", epsilon=EPS, delta=DELTA)
    mu_cap = _oracle_mu_cap(EPS, DELTA)
    rho = 0.005
    c = _gaussian(rho)
    expect = math.floor(mu_cap ** 2 / c.gdp_mu ** 2 * (1 + 1e-12))
    n_g = n_r = 0
    receipt = None
    for _ in range(expect + 5):
        try:
            receipt = ledger.charge("g", "a", c, purpose="t")
            n_g += 1
        except BudgetExhausted as e:
            assert e.details["rule"] == "gdp"
            assert e.details["gdp"]["mu_budget"] == pytest.approx(mu_cap, rel=1e-9)
            break
    for _ in range(expect + 5):
        try:
            ledger.charge("r", "a", c, purpose="t")
            n_r += 1
        except BudgetExhausted:
            break
    assert n_g == expect
    assert n_r < n_g  # the Rényi filter admits fewer of the same charges
    assert receipt.filter == "gdp" and receipt.to_dict()["filter"] == "gdp"
    assert receipt.to_dict()["gdp_mu"] == pytest.approx(c.gdp_mu)
    # the receipt states the exact ε of this charge alone, μ-GDP at the cap's δ
    assert receipt.epsilon_at_delta == pytest.approx(
        brentq(lambda e: _oracle_delta(c.gdp_mu, e) - DELTA, 0.0, 50.0), rel=1e-6)
    # the spend report's ε is the exact conversion of √(Σμ²)
    spent = ledger.spend("g").to_dict()
    total_mu = math.sqrt(n_g) * c.gdp_mu
    assert spent["spent"]["epsilon"] == pytest.approx(
        brentq(lambda e: _oracle_delta(total_mu, e) - DELTA, 0.0, 50.0), rel=1e-6)
    assert spent["spent"]["epsilon"] <= EPS * (1 + 1e-9)
    assert ledger.verify().ok


def test_gdp_population_refuses_charges_without_a_gdp_claim(ledger):
    ledger.ensure_population("g", epsilon=EPS, delta=DELTA, selection_delta=DELTA / 2, composition="gdp")
    ledger.charge("g", "a", _gaussian(0.01), purpose="t")
    for cost, sel in [(Cost.zcdp(0.01), 0.0), (Cost.rdp([0.01] * 41 + [math.inf]), 0.0), (_gaussian(0.01), 1e-9)]:
        with pytest.raises(InvalidBudget) as e:
            ledger.charge("g", "a", cost, purpose="t", selection_delta=sel)
        assert e.value.details["rule"] == "gdp_claim"
    # a pure-ε charge is μ-GDP with μ = 2Φ⁻¹(e^ε/(1+e^ε)) and is admitted at that μ
    r = ledger.charge("g", "a", Cost.pure(0.1), purpose="t")
    assert r.filter == "gdp" and r.to_dict()["gdp_mu"] == pytest.approx(2 * norm.ppf(1 / (1 + math.exp(-0.1))))
    assert ledger.verify().ok


def test_composition_is_fixed_before_the_first_charge(ledger):
    ledger.ensure_population("g", epsilon=EPS, delta=DELTA)
    out = ledger.set_cap("g", epsilon=EPS, delta=DELTA, actor="admin", reason="gdp", composition="gdp")
    assert out["changed"] and ledger.cap("g").gdp
    ledger.charge("g", "a", _gaussian(0.01), purpose="t")
    with pytest.raises(InvalidBudget):
        ledger.set_cap("g", epsilon=EPS, delta=DELTA, actor="admin", reason="back", composition="renyi")
    # a cap change that keeps the composition is allowed (and keeps it)
    ledger.set_cap("g", epsilon=3.0, delta=DELTA, actor="admin", reason="lower")
    assert ledger.cap("g").gdp and ledger.cap("g").epsilon == 3.0
    # apply_policy (a policy file states no composition) keeps the ledger's
    ledger.apply_policy("g", epsilon=3.0, delta=DELTA, actor="admin", reason="policy")
    assert ledger.cap("g").gdp
    assert ledger.verify().ok
    with pytest.raises(PolicyError):
        ledger.ensure_population("h", epsilon=EPS, delta=DELTA, composition="nope")


def test_gdp_totals_are_stored_and_read_back(ledger, tmp_path):
    ledger.ensure_population("g", epsilon=EPS, delta=DELTA, allocations={"a": 0.5, "b": 0.5}, composition="gdp")
    c1, c2 = _gaussian(0.01), _gaussian(0.02)
    ledger.charge("g", "a", c1, purpose="t")
    ledger.charge("g", "b", c2, purpose="t")
    entries = ledger.entries("g")
    costs = [e["cost"] for e in entries if e.get("type", "charge") == "charge" and "cost" in e]
    assert {round(c["gdp_mu"], 12) for c in costs} == {round(c1.gdp_mu, 12), round(c2.gdp_mu, 12)}
    tx_totals = ledger._totals if hasattr(ledger, "_totals") else None
    assert tx_totals is not None
    with ledger._tx(write=False) as tx:
        pt, ct = ledger._totals(tx, "g", "a")
    assert pt.gdp_mu2 == pytest.approx(c1.gdp_mu ** 2 + c2.gdp_mu ** 2, rel=1e-15)
    assert ct.gdp_mu2 == pytest.approx(c1.gdp_mu ** 2, rel=1e-15)
    assert ledger.verify().ok  # the replay recomputes Σμ² and compares it with the stored totals


def test_renyi_population_is_unchanged_by_gdp_claims(ledger):
    ledger.ensure_population("r", epsilon=EPS, delta=DELTA)
    a = b = 0
    ledger.ensure_population("r2", epsilon=EPS, delta=DELTA)
    for _ in range(200):
        try:
            ledger.charge("r", "x", _gaussian(0.003), purpose="t")
            a += 1
        except BudgetExhausted:
            break
    for _ in range(200):
        try:
            ledger.charge("r2", "x", Cost.zcdp(0.003), purpose="t")
            b += 1
        except BudgetExhausted:
            break
    assert a == b


_REQUEST = st.one_of(
    st.tuples(st.just("gauss"), st.floats(1e-4, 0.2)),
    st.tuples(st.just("zcdp"), st.floats(1e-4, 0.2)),
    st.tuples(st.just("pure"), st.floats(1e-3, 1.0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_REQUEST, min_size=1, max_size=60), st.floats(0.5, 8.0), st.sampled_from([1e-9, 1e-6, 1e-4]))
def test_adversarial_histories_never_exceed_the_cap(requests, eps, delta):
    """Whatever the order and mix of requests, what a GDP scope admitted is √(Σμ²)-GDP with
    δ_μ(ε) ≤ δ (checked by the closed form), and only Gaussian-DP claims were admitted."""
    cap = validate_cap(eps, delta, composition="gdp")
    budget = BudgetCurve.of(cap)
    totals = Totals()
    admitted_mu2 = 0.0
    for kind, x in requests:
        cost = _gaussian(x) if kind == "gauss" else Cost.zcdp(x) if kind == "zcdp" else Cost.pure(x)
        d = filter_decision(totals, cost, budget)
        if kind == "zcdp":  # no GDP claim
            assert not d.ok and d.rule == "gdp_claim"
            continue
        mu = cost.gdp_bound
        if kind == "pure":  # independently: randomised response's μ
            assert mu == pytest.approx(2 * norm.ppf(1 / (1 + math.exp(-x))), rel=1e-8)
        if d.ok:
            totals = totals.add(cost)
            admitted_mu2 += mu ** 2
        else:
            assert admitted_mu2 + mu ** 2 > cap.mu_cap ** 2 * (1 - 1e-9)
    if admitted_mu2 > 0:
        assert _oracle_delta(math.sqrt(admitted_mu2), eps) <= delta * (1 + 1e-6)
        assert totals.gdp_mu2 == pytest.approx(admitted_mu2, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1e-4, 0.1), min_size=1, max_size=40), st.floats(0.05, 1.0))
def test_consumer_share_holds_in_gdp(rhos, share):
    cap = validate_cap(EPS, DELTA, composition="gdp")
    cb = BudgetCurve.of(cap, share)
    t = Totals()
    for r in rhos:
        c = _gaussian(r)
        if filter_decision(t, c, cb).ok:
            t = t.add(c)
    assert (t.gdp_mu2 or 0.0) <= share * cap.mu_cap ** 2 * (1 + 1e-9)


def test_gateway_queries_compose_in_gdp(tmp_path):
    """End to end: a population switched to Gaussian DP before its first charge admits the
    service's discrete Gaussian releases by Σμ² (μ from each release's (Δ₂, σ)), a Laplace
    release at randomised response's μ, and its receipts name the filter."""
    test_service = pytest.importorskip("test_service")
    if not (test_service.DATA / "PUMS_dup.csv").exists():
        pytest.skip("../shared/data not present")
    from dpgate.accounting import discrete_gaussian_mu
    from dpgate.service import QueryBudget

    gw = test_service.make_gateway(tmp_path)
    try:
        pop = "census-people"
        cap = gw.ledger.cap(pop)
        gw.ledger.set_cap(pop, epsilon=cap.epsilon, delta=cap.delta, selection_delta=cap.selection_delta,
                          actor="test", reason="gdp", composition="gdp")
        r = gw.query("pums", "SELECT sex, COUNT(*) AS n FROM persons GROUP BY sex", consumer="analysts",
                     budget=QueryBudget(rho=0.02))
        (sigma,) = r["noise_scales"].values()
        entry = [e for e in gw.ledger.entries(pop) if "cost" in e][-1]
        assert entry["cost"]["gdp_mu"] == pytest.approx(discrete_gaussian_mu([(4.0, sigma)]), rel=1e-9)
        r2 = gw.query("pums", "SELECT sex, COUNT(*) AS n FROM persons GROUP BY sex", consumer="analysts",
                      budget=QueryBudget(epsilon=0.1), mechanism="laplace")  # pure ε: μ-GDP with RR's μ
        assert r2["charge"]["epsilon_at_delta"] == pytest.approx(0.1, rel=1e-9)  # admitted, its own ε at δ 0
        assert len([e for e in gw.ledger.entries(pop) if "cost" in e]) == 2
        assert gw.ledger.verify().ok
    finally:
        gw.close()


def test_switching_filters_after_seeing_outputs_is_not_a_filter():
    """Why the composition is fixed per population (``dpgate.ledger.filter`` docstring): the rule
    "GDP filter while every charge is Gaussian; at a non-Gaussian charge the Rényi filter, if it
    admits the whole history" exceeds the cap's δ. Two steps: a Gaussian of ρ₁ = 0.7·ρ_cap; then,
    seeing the privacy loss l₁ of its output, either the Gaussian that exhausts μ_cap (the GDP
    filter admits it) or randomised response with the largest ε₂ the Rényi filter admits after
    ρ₁ — whichever adds more to δ(ε) given l₁. Computed exactly by quadrature over l₁."""
    import numpy as np

    cap = validate_cap(EPS, DELTA, selection_delta=DELTA / 2, composition="gdp")
    renyi = validate_cap(EPS, DELTA, selection_delta=DELTA / 2)
    d, mu_cap = cap.rho_delta, _oracle_mu_cap(EPS, DELTA / 2)
    rho1 = 0.7 * renyi.rho_cap
    mu1 = math.sqrt(2 * rho1)
    mu2 = math.sqrt(mu_cap ** 2 - mu1 ** 2)
    assert filter_decision(Totals().add(Cost.continuous_gaussian(rho1)), Cost.continuous_gaussian(mu2 ** 2 / 2),
                           BudgetCurve.of(cap)).ok
    t, b = Totals().add(Cost.zcdp(rho1)), BudgetCurve.of(renyi)
    lo, hi = 0.0, 5.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if filter_decision(t, Cost.pure(mid), b).ok else (lo, mid)
    e2 = lo
    assert e2 > 0.4 and filter_decision(t, Cost.pure(e2), b).ok  # the Rényi filter admits this RR
    l1 = np.linspace(mu1 ** 2 / 2 - 12 * mu1, mu1 ** 2 / 2 + 12 * mu1, 200001)
    w = norm.pdf(l1, mu1 ** 2 / 2, mu1) * (l1[1] - l1[0])
    x = EPS - l1  # what the rest of the transcript must add to the privacy loss
    gauss = norm.cdf(-x / mu2 + mu2 / 2) - np.exp(x) * norm.cdf(-x / mu2 - mu2 / 2)
    p = math.exp(e2) / (1 + math.exp(e2))
    rr = p * np.clip(1 - np.exp(x - e2), 0, None) + (1 - p) * np.clip(1 - np.exp(x + e2), 0, None)
    only_gdp = float(np.sum(w * gauss))
    switching = float(np.sum(w * np.maximum(gauss, rr)))
    assert only_gdp == pytest.approx(d, rel=1e-8)  # the GDP filter alone meets the cap exactly
    assert switching > d * (1 + 5e-5)  # choosing the continuation from the output does not
