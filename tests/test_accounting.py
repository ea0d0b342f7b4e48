"""Tests of dpgate.accounting: every privacy number checked against an independent value.

Oracles: dp-accounting 0.6 (``RdpAccountant``, ``compute_epsilon``, ``PLDAccountant`` with
``GaussianDpEvent`` / ``LaplaceDpEvent`` / ``RandomizedResponseDpEvent`` / ``ZCDpEvent``),
closed forms evaluated by hand in comments, and the worked example of the seed (DESIGN.md).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import dp_accounting as dpa
from dp_accounting import pld
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from dpgate import accounting as acc
from dpgate.accounting import (
    ORDERS,
    SEED_ORDERS,
    Cost,
    advanced_composition,
    basic_composition,
    cost_epsilon,
    gaussian_epsilon_exact,
    gaussian_rdp,
    gaussian_rho,
    gaussian_sigma,
    group_privacy,
    group_privacy_rho,
    laplace_rdp,
    max_true_positive_rate,
    poisson_subsampling_epsilon,
    pure_dp_rdp,
    rdp_epsilon_basic,
    rdp_epsilon_tight,
    rho_for_cap,
    zcdp_epsilon,
    zcdp_epsilon_simple,
    zcdp_epsilon_tight,
    zcdp_optimal_order,
)

FINITE_ORDERS = [a for a in ORDERS if math.isfinite(a)]
DELTA = 1e-6
LOG_INV_DELTA = math.log(1e6)  # 13.815510557964274


def sig4(x: float) -> float:
    """Round to 4 significant digits (the precision the brief states values to)."""
    return float(f"{x:.4g}")


def dense_cks_oracle(rho: float, delta: float) -> float:
    """dp-accounting's CKS/Balle conversion on a dense grid of orders: ≈ the continuous inf."""
    orders = np.linspace(1.02, 60.0, 30_000)
    eps, _ = compute_epsilon(orders, orders * rho, delta)
    return float(eps)


def pld_gaussian_oracle(sigma: float, count: int, delta: float) -> float:
    """dp-accounting's PLD accountant: the exact ε of composed Gaussians (up to discretisation)."""
    accountant = pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dpa.GaussianDpEvent(noise_multiplier=sigma), count)
    return float(accountant.get_epsilon(delta))


# ---------------------------------------------------------------------------------------
# the grid
# ---------------------------------------------------------------------------------------


def test_order_grids():
    assert SEED_ORDERS == (1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128, 256)
    assert list(ORDERS) == sorted(ORDERS) and len(set(ORDERS)) == len(ORDERS)
    assert all(a > 1 for a in ORDERS)
    assert ORDERS[-1] == math.inf and 1024.0 in ORDERS and max(FINITE_ORDERS) == 1024.0
    assert set(SEED_ORDERS) <= set(ORDERS)


# ---------------------------------------------------------------------------------------
# per-mechanism costs
# ---------------------------------------------------------------------------------------


def test_gaussian_rho_and_sigma():
    # ρ = Δ²/(2σ²): Δ = 1, σ = 10 → 1/200
    assert gaussian_rho(1, 10) == pytest.approx(0.005, rel=1e-15)
    # Δ = 3, σ = 2 → 9/8
    assert gaussian_rho(3, 2) == pytest.approx(1.125, rel=1e-15)
    assert gaussian_rho(0, 2) == 0.0
    assert gaussian_sigma(1, 0.005) == pytest.approx(10.0, rel=1e-14)
    assert gaussian_sigma(3, gaussian_rho(3, 7.5)) == pytest.approx(7.5, rel=1e-14)


def test_gaussian_rdp_curve():
    curve = gaussian_rdp(0.25, ORDERS)
    np.testing.assert_allclose(curve[:-1], 0.25 * np.asarray(FINITE_ORDERS), rtol=1e-15)
    assert curve[-1] == math.inf
    assert gaussian_rdp(0.0, ORDERS)[-1] == 0.0
    # dp-accounting's RDP of a Gaussian with noise multiplier 10 (ρ = 1/200) on finite orders
    oracle = RdpAccountant(FINITE_ORDERS)
    oracle.compose(dpa.GaussianDpEvent(10.0), 1)
    np.testing.assert_allclose(gaussian_rdp(0.005, FINITE_ORDERS), oracle._rdp, rtol=1e-12)


@pytest.mark.parametrize("epsilon", [0.01, 0.5, 1.0, 3.0, 20.0])
def test_laplace_rdp_matches_dp_accounting(epsilon):
    # Mironov 2017 Prop. 6 as implemented by dp-accounting (LaplaceDpEvent, scale b = Δ1/ε).
    oracle = RdpAccountant(FINITE_ORDERS)
    oracle.compose(dpa.LaplaceDpEvent(noise_multiplier=1.0 / epsilon), 1)
    ours = laplace_rdp(epsilon, ORDERS)
    assert np.all(np.isfinite(ours))  # α = 1024 does not overflow (log-space)
    np.testing.assert_allclose(ours[:-1], oracle._rdp, rtol=1e-9, atol=1e-15)
    assert ours[-1] == epsilon  # α = ∞: pure ε


def test_laplace_rdp_hand_value():
    # α = 2, ε = 1: log(2/3·e + 1/3·e^{-2}) = log(1.8121879 + 0.0451118) = log(1.8572997) = 0.6191
    assert laplace_rdp(1.0, (2.0,))[0] == pytest.approx(math.log(2 / 3 * math.e + math.exp(-2) / 3), rel=1e-14)
    assert sig4(laplace_rdp(1.0, (2.0,))[0]) == 0.6191


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0])
def test_pure_dp_curve_is_randomized_response(epsilon):
    # Binary randomized response with ε: dp-accounting's RandomizedResponseDpEvent with
    # noise parameter p = 2/(1+e^ε) over 2 buckets (keep prob 1 − p/2 = e^ε/(1+e^ε)),
    # under the replace-one relation (ε-DP's worst case).
    oracle = RdpAccountant(FINITE_ORDERS, dpa.NeighboringRelation.REPLACE_ONE)
    oracle.compose(dpa.RandomizedResponseDpEvent(2.0 / (1.0 + math.exp(epsilon)), 2), 1)
    ours = pure_dp_rdp(epsilon, ORDERS)
    np.testing.assert_allclose(ours[:-1], oracle._rdp, rtol=1e-9, atol=1e-15)
    assert ours[-1] == epsilon
    assert np.all(ours <= epsilon)
    assert np.all(ours[:-1] <= np.asarray(FINITE_ORDERS) * epsilon**2 / 2 + 1e-15)  # BS16 Prop 3.3
    # Laplace is one ε-DP mechanism: its curve sits under the worst case
    assert np.all(laplace_rdp(epsilon, ORDERS) <= ours + 1e-12)


# ---------------------------------------------------------------------------------------
# the worked example (DESIGN.md, Accounting)
# ---------------------------------------------------------------------------------------


def test_fifty_gaussian_releases():
    rho = 50 * gaussian_rho(1, 10)  # 50 · 1/200 = 0.25
    assert rho == pytest.approx(0.25)
    # simple: 0.25 + 2·√(0.25 · ln 1e6) = 0.25 + 2·1.858461 = 3.966922
    simple = zcdp_epsilon_simple(rho, DELTA)
    assert simple == pytest.approx(0.25 + 2 * math.sqrt(0.25 * LOG_INV_DELTA), rel=1e-15)
    assert sig4(simple) == 3.967 and round(simple, 4) == 3.9669
    # tight (CKS 2020): dp-accounting's conversion on a dense order grid
    tight = zcdp_epsilon_tight(rho, DELTA)
    assert round(tight, 4) == 3.5423
    assert tight == pytest.approx(dense_cks_oracle(rho, DELTA), abs=2e-6)
    assert tight <= dense_cks_oracle(rho, DELTA) + 1e-12  # the continuous inf is below any grid
    # exact (Balle–Wang): dp-accounting's PLD accountant on 50 Gaussians with σ = 10
    exact = gaussian_epsilon_exact(rho, DELTA)
    assert round(exact, 4) == 3.3076
    assert exact == pytest.approx(pld_gaussian_oracle(10.0, 50, DELTA), abs=5e-4)
    # Dispatch by cost kind: our discrete Gaussians get CKS, declared continuous ones exact.
    assert cost_epsilon(Cost.zcdp(rho), DELTA) == tight
    assert cost_epsilon(Cost.continuous_gaussian(rho), DELTA) == exact


def test_per_release_conversion_summed_is_the_mistake():
    # Converting each release with δ/50 and summing ε: 50 · (0.005 + 2√(0.005·ln(5e7))) = 30.02
    per_release = zcdp_epsilon_simple(gaussian_rho(1, 10), DELTA / 50)
    summed = 50 * per_release
    assert summed == pytest.approx(50 * (0.005 + 2 * math.sqrt(0.005 * math.log(50 / DELTA))), rel=1e-14)
    assert round(summed, 1) == 30.0
    # ... which overstates the true composed cost ~7.6× (3.97 by the simple conversion)
    assert summed > 7 * zcdp_epsilon_simple(0.25, DELTA)


def test_fifty_two_releases_on_seed_orders():
    sigma = 13.07
    rho = 52 / (2 * sigma**2)  # 0.152201...
    curve = gaussian_rdp(rho, SEED_ORDERS)
    # basic RDP (Mironov Prop. 3) on SEED_ORDERS: min_α αρ + ln(1e6)/(α−1), hand-evaluated
    hand = min(a * rho + LOG_INV_DELTA / (a - 1) for a in SEED_ORDERS)
    basic = rdp_epsilon_basic(curve, DELTA, SEED_ORDERS)
    assert basic == pytest.approx(hand, rel=1e-14)
    assert round(basic, 4) == 3.0571
    # tight: 2.6944 is the CKS conversion at the continuous optimum α ≈ 9.71
    assert round(zcdp_epsilon_tight(rho, DELTA), 4) == 2.6944
    assert zcdp_epsilon_tight(rho, DELTA) == pytest.approx(dense_cks_oracle(rho, DELTA), abs=2e-6)
    # restricted to the SEED_ORDERS grid the tight RDP conversion gives 2.6959 (best α = 10),
    # identical to dp-accounting's RdpAccountant on the same orders
    oracle = RdpAccountant(list(SEED_ORDERS))
    oracle.compose(dpa.GaussianDpEvent(sigma), 52)
    tight_grid = rdp_epsilon_tight(curve, DELTA, SEED_ORDERS)
    assert tight_grid == pytest.approx(oracle.get_epsilon(DELTA), rel=1e-12)
    assert round(tight_grid, 4) == 2.6959
    # exact Gaussian DP: dp-accounting PLD on 52 Gaussians
    exact = gaussian_epsilon_exact(rho, DELTA)
    assert round(exact, 4) == 2.5121
    assert exact == pytest.approx(pld_gaussian_oracle(sigma, 52, DELTA), abs=5e-4)


def test_optimal_order():
    # dp-accounting's argmin on a dense grid (step ≈ 0.002) for ρ = 0.25, δ = 1e-6: α ≈ 7.857
    orders = np.linspace(1.02, 60.0, 30_000)
    _, oracle_order = compute_epsilon(orders, orders * 0.25, DELTA)
    alpha = zcdp_optimal_order(0.25, DELTA)
    assert alpha == pytest.approx(float(oracle_order), abs=2e-3)
    # stationarity: ρx² + log(1+x) = log(1/δ) at x = α − 1
    x = alpha - 1
    assert 0.25 * x * x + math.log1p(x) == pytest.approx(LOG_INV_DELTA, rel=1e-14)
    assert rdp_epsilon_tight([alpha * 0.25], DELTA, [alpha]) == pytest.approx(zcdp_epsilon_tight(0.25, DELTA))
    with pytest.raises(ValueError, match="rho"):
        zcdp_optimal_order(0.0, DELTA)
    with pytest.raises(ValueError, match="delta"):
        zcdp_optimal_order(0.25, 0.0)


def test_cap_and_dashboard_sigma():
    # simple: (√(ln 1e6 + 4) − √(ln 1e6))² = (4.2208407 − 3.7169221)² = 0.5039186² = 0.253936
    rho_cap = rho_for_cap(4.0, DELTA, "simple")
    assert rho_cap == pytest.approx((math.sqrt(LOG_INV_DELTA + 4) - math.sqrt(LOG_INV_DELTA)) ** 2, rel=1e-13)
    assert round(rho_cap, 6) == 0.253936
    assert zcdp_epsilon_simple(rho_cap, DELTA) <= 4.0
    # dashboard: 60 % of ρ_cap over 52 releases of sensitivity 1 → σ = 1/√(2 · 0.6ρ_cap/52)
    sigma = gaussian_sigma(1.0, 0.6 * rho_cap / 52)
    assert round(sigma, 4) == 13.0632
    assert sigma == pytest.approx(1 / math.sqrt(2 * 0.6 * rho_cap / 52), rel=1e-14)


def test_cap_by_tight_and_exact_conversion():
    tight = rho_for_cap(4.0, DELTA, "tight")
    exact = rho_for_cap(4.0, DELTA, "exact")
    # a tighter conversion admits more ρ under the same cap
    assert rho_for_cap(4.0, DELTA, "simple") < tight < exact
    assert zcdp_epsilon_tight(tight, DELTA) == pytest.approx(4.0, rel=1e-10)
    assert gaussian_epsilon_exact(exact, DELTA) == pytest.approx(4.0, rel=1e-10)
    # oracle: dp-accounting's dense-grid CKS conversion at ρ_cap gives the cap back
    assert dense_cks_oracle(tight, DELTA) == pytest.approx(4.0, abs=1e-5)
    assert sig4(tight) == 0.3111 and sig4(exact) == 0.3510
    assert rho_for_cap(4.0, DELTA) == tight  # default: "tight"


def test_monthly_renewal():
    # 12 · 0.1 = 1.2: 1.2 + 2√(1.2·ln 1e6) = 1.2 + 8.143369 = 9.343369
    assert round(zcdp_epsilon_simple(12 * 0.1, DELTA), 4) == 9.3434
    # 36 · 0.1 = 3.6: 3.6 + 2√(3.6·ln 1e6) = 3.6 + 14.104728 = 17.704728
    assert round(zcdp_epsilon_simple(36 * 0.1, DELTA), 4) == 17.7047


def test_amplification_by_poisson_subsampling():
    # ln(1 + 0.01·(e − 1)) = ln(1.0171828) = 0.0170369
    assert round(poisson_subsampling_epsilon(1.0, 0.01), 6) == 0.017037
    assert poisson_subsampling_epsilon(1.0, 1.0) == pytest.approx(1.0, rel=1e-15)
    assert poisson_subsampling_epsilon(1.0, 0.0) == 0.0


def test_ten_laplace_releases():
    curve = 10 * laplace_rdp(1.0, ORDERS)
    # Tight RDP conversion on ORDERS at δ = 1e-6: the best order is α = 1024 giving 9.99898,
    # below the 10 of basic composition (= the α = ∞ entry). dp-accounting agrees on the
    # finite orders.
    tight = rdp_epsilon_tight(curve, DELTA, ORDERS)
    assert round(tight, 5) == 9.99898
    oracle = RdpAccountant(FINITE_ORDERS)
    oracle.compose(dpa.LaplaceDpEvent(1.0), 10)
    assert tight == pytest.approx(oracle.get_epsilon(DELTA), rel=1e-12)
    assert tight <= 10.0
    assert rdp_epsilon_basic(curve, DELTA, ORDERS) == 10.0  # the α = ∞ candidate wins
    # δ = 1e-7: no finite order beats pure ε = 10; SEED_ORDERS (max 256, no ∞) cannot reach 10
    assert rdp_epsilon_tight(curve, 1e-7, ORDERS) == 10.0
    assert rdp_epsilon_tight(10 * laplace_rdp(1.0, SEED_ORDERS), DELTA, SEED_ORDERS) > 10.0
    # δ = 0: only the pure-ε entry applies
    assert rdp_epsilon_tight(curve, 0.0, ORDERS) == 10.0
    assert cost_epsilon(sum([Cost.laplace(1.0)] * 10), DELTA) == pytest.approx(tight, rel=1e-12)


# ---------------------------------------------------------------------------------------
# conversions: edge rules
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [zcdp_epsilon_simple, zcdp_epsilon_tight, gaussian_epsilon_exact])
def test_zcdp_edge_rules(fn):
    assert fn(0.25, 0.0) == math.inf  # δ = 0, ρ > 0: ∞ at once
    assert fn(0.0, 0.0) == 0.0
    assert fn(0.0, DELTA) == 0.0
    if fn is zcdp_epsilon_simple:
        assert fn(1e-20, 0.5) == pytest.approx(2 * math.sqrt(1e-20 * math.log(2)), rel=1e-6)
    else:  # the raw CKS formula is negative here: clamped (and TV <= δ anyway)
        assert fn(1e-20, 0.5) == 0.0
    for bad in (math.nan, -1.0, math.inf, "0.1", None, True):
        with pytest.raises(ValueError, match="rho"):
            fn(bad, DELTA)
    for bad in (math.nan, -1e-9, 1.0, 2.0, None):
        with pytest.raises(ValueError, match="delta"):
            fn(0.1, bad)


def test_rdp_conversion_edge_rules():
    curve = gaussian_rdp(0.25, ORDERS)
    assert rdp_epsilon_tight(curve, 0.0) == math.inf  # α = ∞ entry is ∞ for a Gaussian
    assert rdp_epsilon_basic(curve, 0.0) == math.inf
    assert rdp_epsilon_tight(np.zeros(len(ORDERS)), 0.0) == 0.0
    assert rdp_epsilon_tight(np.full(len(ORDERS), 1e-9), 0.5) == 0.0
    with pytest.raises(ValueError, match="curve"):
        rdp_epsilon_tight(curve[:-1], DELTA)
    with pytest.raises(ValueError, match="curve"):
        rdp_epsilon_tight([math.nan] * len(ORDERS), DELTA)
    with pytest.raises(ValueError, match="curve"):
        rdp_epsilon_tight([-0.1] * len(ORDERS), DELTA)
    with pytest.raises(ValueError, match="orders"):
        rdp_epsilon_tight([0.1, 0.2], DELTA, orders=(1.0, 2.0))  # α = 1 is not an RDP order here
    with pytest.raises(ValueError, match="orders"):
        rdp_epsilon_tight([0.1, 0.2], DELTA, orders=(3.0, 2.0))
    with pytest.raises(ValueError, match="delta"):
        rdp_epsilon_tight(curve, 1.5)


def test_rdp_tight_versus_basic_and_zcdp():
    rho = 0.25
    curve = gaussian_rdp(rho, ORDERS)
    basic = rdp_epsilon_basic(curve, DELTA)
    tight = rdp_epsilon_tight(curve, DELTA)
    # the grid optimum is above the continuous optimum (CKS) and below basic (Mironov)
    assert zcdp_epsilon_tight(rho, DELTA) <= tight < basic
    assert tight == pytest.approx(zcdp_epsilon_tight(rho, DELTA), abs=5e-3)


def test_zero_cost_rule_matches_dp_accounting():
    # Tiny curves: 1 − e^{−ε(α)} <= δ² gives (0, δ) (Bretagnolle–Huber), as in dp-accounting
    curve = np.full(len(FINITE_ORDERS), 1e-14)
    assert rdp_epsilon_tight(curve, 1e-6, FINITE_ORDERS) == 0.0
    assert compute_epsilon(FINITE_ORDERS, curve, 1e-6)[0] == 0.0


def test_zcdp_epsilon_dispatch_and_unknown_conversion():
    assert zcdp_epsilon(0.25, DELTA, "simple") == zcdp_epsilon_simple(0.25, DELTA)
    assert zcdp_epsilon(0.25, DELTA, "tight") == zcdp_epsilon_tight(0.25, DELTA)
    assert zcdp_epsilon(0.25, DELTA, "exact") == gaussian_epsilon_exact(0.25, DELTA)
    with pytest.raises(ValueError, match="conversion"):
        zcdp_epsilon(0.25, DELTA, "loose")
    with pytest.raises(ValueError, match="conversion"):
        rho_for_cap(4.0, DELTA, "loose")


def test_rho_for_cap_edge_rules():
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="epsilon"):
            rho_for_cap(bad, DELTA)
    with pytest.raises(ValueError, match="delta"):
        rho_for_cap(4.0, 1.0)
    assert rho_for_cap(4.0, 0.0) == 0.0  # no ρ > 0 meets a finite ε at δ = 0


def test_extreme_rho_is_robust():
    for rho in (1e-300, 1e-30, 1e-9, 1e6, 1e12):
        for delta in (1e-300, 1e-12, 1e-6, 0.5):
            s = zcdp_epsilon_simple(rho, delta)
            t = zcdp_epsilon_tight(rho, delta)
            x = gaussian_epsilon_exact(rho, delta)
            assert 0.0 <= x <= t * (1 + 1e-12) + 1e-300 and t <= s
            assert all(math.isfinite(v) for v in (s, t, x))
    # tiny ρ, tiny δ: exact ≈ the first-order expansion δ ≈ μ·φ(z)/z² with z = ε/μ
    rho, delta = 1e-30, 1e-300
    mu = math.sqrt(2 * rho)
    z = gaussian_epsilon_exact(rho, delta) / mu
    log_delta = math.log(mu) - z * z / 2 - 0.5 * math.log(2 * math.pi) - 2 * math.log(z)
    assert log_delta == pytest.approx(math.log(delta), rel=1e-3)


# ---------------------------------------------------------------------------------------
# the Cost currency
# ---------------------------------------------------------------------------------------


def test_cost_constructors_and_curves():
    z = Cost.zcdp(0.1)
    assert z.kind == "zcdp" and z.rho == 0.1 and z.curve is None and z.is_zcdp
    g = Cost.continuous_gaussian(0.2)
    assert g.kind == "gaussian" and g.is_zcdp
    np.testing.assert_allclose(z.curve_at()[:-1], 0.1 * np.asarray(FINITE_ORDERS))
    assert z.curve_at()[-1] == math.inf
    p = Cost.pure(1.0)
    assert p.kind == "rdp" and not p.is_zcdp and p.rho is None
    np.testing.assert_array_equal(p.curve_at(), pure_dp_rdp(1.0))
    lap = Cost.laplace(1.0)
    np.testing.assert_array_equal(lap.curve_at(), laplace_rdp(1.0))
    custom = Cost.rdp(list(gaussian_rdp(0.3)), ORDERS)
    assert custom.kind == "rdp" and len(custom.curve) == len(ORDERS)
    # off-grid orders: the next grid order's value (an upper bound; RDP is monotone in α)
    at = lap.curve_at((2.1, 1024.0, 2048.0))
    assert at[0] == laplace_rdp(1.0, (2.25,))[0]
    assert at[1] == laplace_rdp(1.0, (1024.0,))[0]
    assert at[2] == 1.0  # only α = ∞ lies above 2048
    assert Cost.rdp(list(gaussian_rdp(0.3))).curve_at((2048.0,))[0] == math.inf
    assert Cost.rdp(list(gaussian_rdp(0.3))).rho_bound() == pytest.approx(0.3)
    assert Cost.zcdp(0.3).rho_bound() == 0.3


def test_cost_validation():
    with pytest.raises(ValueError, match="rho"):
        Cost.zcdp(-0.1)
    with pytest.raises(ValueError, match="rho"):
        Cost.zcdp(math.nan)
    with pytest.raises(ValueError, match="rho"):
        Cost.continuous_gaussian(math.inf)
    with pytest.raises(ValueError, match="epsilon"):
        Cost.pure(-1.0)
    with pytest.raises(ValueError, match="epsilon"):
        Cost.laplace(math.nan)
    with pytest.raises(ValueError, match="orders"):  # a curve on another grid is refused
        Cost.rdp(list(gaussian_rdp(0.3, SEED_ORDERS)), SEED_ORDERS)
    with pytest.raises(ValueError, match="curve"):
        Cost.rdp([0.1] * (len(ORDERS) - 1))
    with pytest.raises(ValueError, match="curve"):
        Cost.rdp([math.nan] * len(ORDERS))
    with pytest.raises(ValueError, match="curve"):
        Cost.rdp([-1.0] * len(ORDERS))
    with pytest.raises(ValueError, match="curve"):
        Cost.rdp([math.inf] * len(ORDERS))  # no finite order: no claim at all
    with pytest.raises(ValueError, match="kind"):
        Cost("ldp", rho=0.1)
    with pytest.raises(ValueError, match="curve"):
        Cost("zcdp", rho=0.1, curve=(0.1,))


def test_cost_addition():
    assert Cost.zcdp(0.1) + Cost.zcdp(0.2) == Cost.zcdp(0.1 + 0.2)
    assert Cost.continuous_gaussian(0.1) + Cost.continuous_gaussian(0.2) == Cost.continuous_gaussian(0.1 + 0.2)
    mixed = Cost.zcdp(0.1) + Cost.continuous_gaussian(0.2)
    assert mixed.kind == "zcdp" and mixed.rho == pytest.approx(0.3)  # loses exact eligibility
    assert (Cost.continuous_gaussian(0.2) + Cost.zcdp(0.1)).kind == "zcdp"
    r = Cost.zcdp(0.1) + Cost.pure(1.0)
    assert r.kind == "rdp"
    np.testing.assert_allclose(r.curve_at(), gaussian_rdp(0.1) + pure_dp_rdp(1.0))
    assert sum([Cost.zcdp(0.1)] * 3) == Cost.zcdp(0.1) + Cost.zcdp(0.1) + Cost.zcdp(0.1)
    with pytest.raises(TypeError):
        Cost.zcdp(0.1) + 1.5  # noqa: B018


def test_cost_dict_round_trip_is_json():
    for cost in (
        Cost.zcdp(0.1),
        Cost.continuous_gaussian(1 / 3),
        Cost.pure(0.7),
        Cost.laplace(2.0),
        Cost.zcdp(0.05) + Cost.laplace(1.0),
    ):
        text = json.dumps(cost.to_dict(), allow_nan=False)  # strict JSON: no Infinity/NaN
        assert Cost.from_dict(json.loads(text)) == cost
    with pytest.raises(ValueError, match="kind"):
        Cost.from_dict({"kind": "nope"})
    with pytest.raises(ValueError, match="orders"):
        Cost.from_dict({"kind": "rdp", "orders": [2.0], "curve": [0.1]})


def test_cost_epsilon_dispatch():
    assert cost_epsilon(Cost.zcdp(0.25), DELTA) == zcdp_epsilon_tight(0.25, DELTA)
    assert cost_epsilon(Cost.continuous_gaussian(0.25), DELTA) == gaussian_epsilon_exact(0.25, DELTA)
    lap = Cost.laplace(1.0)
    assert cost_epsilon(lap, DELTA) == rdp_epsilon_tight(laplace_rdp(1.0), DELTA)
    assert Cost.pure(1.0).epsilon(0.0) == 1.0
    with pytest.raises(ValueError, match="cost"):
        cost_epsilon(0.25, DELTA)


# ---------------------------------------------------------------------------------------
# (ε, δ) helpers
# ---------------------------------------------------------------------------------------


def test_basic_composition():
    assert basic_composition([(1.0, 1e-6), (0.5, 2e-6)]) == pytest.approx((1.5, 3e-6))
    assert basic_composition([]) == (0.0, 0.0)
    with pytest.raises(ValueError, match="epsilon"):
        basic_composition([(-1.0, 0.0)])
    with pytest.raises(ValueError, match="delta"):
        basic_composition([(1.0, 2.0)])


def test_advanced_composition():
    # k = 100, ε = 0.1, δ' = 1e-6: √(200·ln 1e6)·0.1 + 100·0.1·(e^0.1 − 1)
    #   = 52.565218·0.1 + 10·0.1051709 = 5.2565218 + 1.0517092 = 6.308231
    eps, delta = advanced_composition(0.1, 1e-8, 100, 1e-6)
    assert eps == pytest.approx(math.sqrt(200 * LOG_INV_DELTA) * 0.1 + 10 * math.expm1(0.1), rel=1e-14)
    assert round(eps, 4) == 6.3082
    assert delta == pytest.approx(100 * 1e-8 + 1e-6)
    with pytest.raises(ValueError, match="k"):
        advanced_composition(0.1, 0.0, 0, 1e-6)
    with pytest.raises(ValueError, match="delta_prime"):
        advanced_composition(0.1, 0.0, 10, 0.0)


def test_group_privacy():
    # k = 3, ε = 0.5, δ = 1e-6: (1.5, 3·e^{1.0}·1e-6 = 8.1548e-6)
    eps, delta = group_privacy(0.5, 1e-6, 3)
    assert eps == 1.5
    assert delta == pytest.approx(3 * math.e * 1e-6, rel=1e-14)
    assert group_privacy(1.0, 0.0, 5) == (5.0, 0.0)
    assert group_privacy(10.0, 0.1, 10)[1] == 1.0  # δ capped at 1
    assert group_privacy_rho(0.1, 3) == pytest.approx(0.9)  # k²ρ
    with pytest.raises(ValueError, match="k"):
        group_privacy(1.0, 0.0, 1.5)


def test_max_true_positive_rate():
    # ε = 1, δ = 1e-6, FPR = 0.05: e·0.05 + 1e-6 = 0.1359151
    assert max_true_positive_rate(1.0, 1e-6, 0.05) == pytest.approx(math.e * 0.05 + 1e-6, rel=1e-14)
    # FPR = 0.5: the other face binds: 1 − e^{−1}(1 − 0 − 0.5) = 0.8160603
    assert max_true_positive_rate(1.0, 0.0, 0.5) == pytest.approx(1 - 0.5 / math.e, rel=1e-14)
    assert max_true_positive_rate(0.0, 0.0, 0.3) == pytest.approx(0.3)  # no privacy loss: no power
    assert max_true_positive_rate(50.0, 0.0, 0.5) == 1.0
    assert max_true_positive_rate(math.inf, 0.0, 0.0) == 1.0
    with pytest.raises(ValueError, match="false_positive_rate"):
        max_true_positive_rate(1.0, 0.0, 1.5)


def test_module_has_no_randomness():
    source = open(acc.__file__, encoding="utf-8").read()
    assert "import random" not in source and "numpy.random" not in source and "np.random" not in source
