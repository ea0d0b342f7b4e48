"""Oracle tests of :mod:`dpgate.accounting.gdp` (issue 22 item 1).

References computed independently here: dp-accounting's PLD of the continuous Gaussian
(an upper bound, pessimistic discretisation), and the discrete Gaussian's exact trade-off
function and privacy profile by summing its pmf (Canonne, Kamath & Steinke 2020, Thm. 7 for
the profile; the vertices of the Neyman–Pearson tests for the trade-off function).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp, ndtri_exp
from scipy.stats import norm

from dpgate import accounting
from dpgate.accounting import Cost
from dpgate.accounting.gdp import (
    discrete_gaussian_mu,
    discrete_gaussian_unit_mu,
    gdp_delta,
    gdp_epsilon,
    gdp_mu_for_cap,
    pure_dp_mu,
)

pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")


def _log_pmf(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Support x and log pmf of N_Z(0, σ²), truncated where the mass is below 2^-1074."""
    m = int(math.ceil(40.0 * sigma + 40))
    x = np.arange(-m, m + 1, dtype=float)
    lp = -x * x / (2 * sigma * sigma)
    return x, lp - logsumexp(lp)


def _exact_mu_needed(sigma: float, k: int) -> float:
    """The smallest μ with T(N_Z(0,σ²), N_Z(k,σ²)) ≥ G_μ, from the test vertices directly:
    max over thresholds c of Φ⁻¹(1 − α_c) − Φ⁻¹(β_c), α_c = P[X ≥ c], β_c = P[X < c − k]."""
    x, lp = _log_pmf(sigma)
    log_cdf = np.logaddexp.accumulate(lp)  # log P[X ≤ x_i]
    log_sf = np.logaddexp.accumulate(lp[::-1])[::-1]  # log P[X ≥ x_i]
    best = 0.0
    n = len(x)
    for i in range(k + 1, n):  # c = x[i]; α = P[X ≥ c] = sf[i]; β = P[X ≤ c − k − 1] = cdf[i − k − 1]
        # each quantile from its smaller tail (no cancellation near probability 1)
        q_alpha = -ndtri_exp(log_sf[i]) if log_sf[i] < math.log(0.5) else ndtri_exp(log_cdf[i - 1])
        q_beta = ndtri_exp(log_cdf[i - k - 1]) if log_cdf[i - k - 1] < math.log(0.5) else -ndtri_exp(log_sf[i - k])
        if min(log_sf[i], log_cdf[i - k - 1]) < -700:
            continue
        best = max(best, float(q_alpha - q_beta))  # Φ⁻¹(1−α) − Φ⁻¹(β)
    return best


def _exact_profile(sigma: float, k: int, eps: float) -> float:
    """CKS20 Thm. 7: δ(ε) = P[X > εσ²/k − k/2] − e^ε·P[X > εσ²/k + k/2], summed from the pmf."""
    x, lp = _log_pmf(sigma)
    p = np.exp(lp)
    t = eps * sigma * sigma / k
    return float(p[x > t - k / 2].sum() - math.exp(eps) * p[x > t + k / 2].sum())


# ---------------------------------------------------------------------------------------
# the continuous Gaussian: closed form vs dp-accounting's PLD
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma,count", [(1.0, 1), (3.0, 1), (9.0, 52), (20.0, 10)])
@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0])
def test_gdp_delta_matches_dp_accounting_pld(sigma, count, eps):
    ref = pld.from_gaussian_mechanism(standard_deviation=sigma, sensitivity=1.0,
                                      value_discretization_interval=1e-4)
    if count > 1:
        ref = ref.self_compose(count)
    mu = math.sqrt(count) / sigma
    ours = gdp_delta(mu, eps)
    theirs = ref.get_delta_for_epsilon(eps)
    assert ours <= theirs * (1 + 1e-9) + 1e-15  # the PLD is pessimistic: an upper bound
    assert ours == pytest.approx(theirs, rel=2e-2, abs=1e-12)


def test_gdp_delta_closed_form_and_edges():
    mu, eps = 0.8, 1.3
    expect = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    assert gdp_delta(mu, eps) == pytest.approx(expect, rel=1e-12)
    assert gdp_delta(0.0, 1.0) == 0.0
    assert gdp_delta(1.0, 0.0) == pytest.approx(2 * norm.cdf(0.5) - 1, rel=1e-12)
    with pytest.raises(ValueError):
        gdp_delta(-1.0, 1.0)


@pytest.mark.parametrize("eps,delta", [(4.0, 5e-7), (4.0, 1e-6), (1.0, 1e-6), (0.1, 1e-9), (10.0, 1e-5)])
def test_gdp_mu_for_cap_is_the_largest_mu(eps, delta):
    mu = gdp_mu_for_cap(eps, delta)
    assert gdp_delta(mu, eps) <= delta
    assert gdp_delta(mu * (1 + 1e-9), eps) > delta
    # dp-accounting's Gaussian PLD at σ = 1/μ: its δ at ε is the cap's δ (upper bound, within 2 %)
    ref = pld.from_gaussian_mechanism(standard_deviation=1.0 / mu, sensitivity=1.0,
                                      value_discretization_interval=1e-4)
    assert ref.get_delta_for_epsilon(eps) == pytest.approx(delta, rel=2e-2)
    # the exact ε of μ at δ is the cap's ε
    assert gdp_epsilon(mu, delta) == pytest.approx(eps, rel=1e-9)


def test_gdp_budget_beats_the_renyi_cap():
    """At ε = 4, δ = 5e-7 the GDP filter's ρ-equivalent μ²/2 is larger than the ledger's RDP ρ_cap."""
    from dpgate.ledger.caps import fix_epsilon_cap

    mu = gdp_mu_for_cap(4.0, 5e-7)
    rho_cap, _ = fix_epsilon_cap(4.0, 5e-7)
    assert mu * mu / 2 > rho_cap * 1.1
    assert mu == pytest.approx(0.81586, rel=1e-4)


# ---------------------------------------------------------------------------------------
# the discrete Gaussian
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [1.0, 1.3, 2.0, 3.0, 5.0, 9.0, 16.0, 40.0])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_discrete_gaussian_mu_dominates_the_exact_trade_off(sigma, k):
    needed = _exact_mu_needed(sigma, k)
    bound = k * discrete_gaussian_unit_mu(sigma)
    assert needed <= bound
    if k == 1:  # and is tight: the central vertex attains it
        assert needed == pytest.approx(bound, rel=1e-7)


@pytest.mark.parametrize("sigma", [1.0, 2.0, 9.0])
@pytest.mark.parametrize("k", [1, 2])
def test_discrete_gaussian_profile_below_gdp(sigma, k):
    mu = k * discrete_gaussian_unit_mu(sigma)
    for eps in np.linspace(0.0, 8.0, 161):
        assert _exact_profile(sigma, k, float(eps)) <= gdp_delta(mu, float(eps)) + 1e-15


def test_discrete_gaussian_is_not_exactly_gdp_at_k_over_sigma():
    """Why μ₁(σ) > 1/σ: at σ = 1 the exact profile exceeds the continuous Gaussian's at ε = 0."""
    assert _exact_profile(1.0, 1, 0.0) > gdp_delta(1.0, 0.0)
    assert discrete_gaussian_unit_mu(1.0) > 1.0


def test_multivariate_shift_is_the_product_of_coordinates():
    """A shift (1, 1) of a 2-D discrete Gaussian: the exact profile of the product (privacy
    losses added by convolution) stays below G_μ with μ = √2·μ₁(σ) = discrete_gaussian_mu."""
    sigma = 1.5
    x, lp = _log_pmf(sigma)
    p = np.exp(lp)
    loss = (1.0 - 2.0 * x) / (2 * sigma * sigma)  # log p(x)/p(x−1)
    l2 = (loss[:, None] + loss[None, :]).ravel()
    p2 = (p[:, None] * p[None, :]).ravel()
    mu = discrete_gaussian_mu([(math.sqrt(2.0), sigma)])
    assert mu == pytest.approx(math.sqrt(2.0) * discrete_gaussian_unit_mu(sigma), rel=1e-8)
    for eps in np.linspace(0.0, 6.0, 61):
        delta = float(np.sum(p2 * np.clip(1.0 - np.exp(float(eps) - l2), 0.0, None)))
        assert delta <= gdp_delta(mu, float(eps)) + 1e-15


@settings(max_examples=25, deadline=None)
@given(st.floats(min_value=1.0, max_value=30.0))
def test_unit_mu_dominates_every_increment(sigma):
    """Step 4 of the argument (sup of the increments at the centre), at random σ."""
    assert _exact_mu_needed(sigma, 1) <= discrete_gaussian_unit_mu(sigma)


def test_unit_mu_edges_and_monotone():
    assert discrete_gaussian_unit_mu(0.5) == math.inf
    s = np.geomspace(1.0, 1e6, 200)
    f = np.array([discrete_gaussian_unit_mu(float(v)) * v for v in s])
    assert (np.diff(f) <= 1e-12).all() and f[-1] == pytest.approx(1.0, abs=1e-8)
    assert discrete_gaussian_unit_mu(9.0) * 9.0 - 1 == pytest.approx(1 / (24 * 81), rel=0.05)
    assert discrete_gaussian_mu([(0.0, 1e-3), (2.0, 10.0)]) == pytest.approx(
        2.0 * discrete_gaussian_unit_mu(10.0), rel=1e-8)
    assert discrete_gaussian_mu([(1.0, 0.5)]) == math.inf


def test_cost_carries_and_composes_gdp_mu():
    a = Cost.discrete_gaussian(0.01, 0.15)
    b = Cost.discrete_gaussian(0.02, 0.21)
    assert (a + b).gdp_mu == pytest.approx(math.hypot(0.15, 0.21))
    assert (a + Cost.zcdp(0.01)).gdp_mu is None
    assert (a + Cost.continuous_gaussian(0.02)).gdp_mu == pytest.approx(math.hypot(0.15, 0.2))
    assert Cost.from_dict(a.to_dict()) == a
    assert "gdp_mu" not in Cost.zcdp(0.01).to_dict()
    assert Cost.discrete_gaussian(0.01, math.inf) == Cost.zcdp(0.01)
    with pytest.raises(ValueError):
        Cost("gaussian", rho=0.1, gdp_mu=0.5)


def test_calibration_sets_the_release_mu():
    from dpgate import mechanisms

    cal = mechanisms.calibrate({"a": (1.0, 1.0), "b": (2.0, 2.0)}, rho=0.01)
    sig = cal.scales
    expect = math.sqrt((1.0 * discrete_gaussian_unit_mu(sig["a"])) ** 2 + (2.0 * discrete_gaussian_unit_mu(sig["b"])) ** 2)
    assert cal.cost.gdp_mu == pytest.approx(expect, rel=1e-8)
    assert cal.cost.gdp_mu >= math.sqrt(2 * cal.cost.rho)
    assert accounting.gdp_epsilon(cal.cost.gdp_mu, 1e-6) < accounting.cost_epsilon(cal.cost, 1e-6)


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0])
def test_pure_dp_mu_is_randomised_responses(eps):
    mu = pure_dp_mu(eps)
    a = 1 / (1 + math.exp(eps))  # RR's vertex: α = β
    assert norm.cdf(norm.ppf(1 - a) - mu) == pytest.approx(a, rel=1e-7)  # G_μ passes through it: tight
    assert norm.cdf(norm.ppf(1 - a) - mu * (1 - 1e-6)) > a  # a smaller μ is not valid for RR
    # the Laplace mechanism (ε-DP) under dp-accounting's PLD stays below μ-GDP at every ε'
    ref = pld.from_laplace_mechanism(parameter=1.0 / eps, sensitivity=1.0, value_discretization_interval=1e-4)
    for e in np.linspace(0.0, 3.0, 31):
        assert ref.get_delta_for_epsilon(float(e)) <= gdp_delta(mu, float(e)) + 1e-4
    assert Cost.pure(eps).gdp_bound == pytest.approx(mu) and Cost.laplace(eps).gdp_bound == pytest.approx(mu)
    assert Cost.rdp([0.1] * 41 + [math.inf]).gdp_bound is None
