"""Issue 23's accounting: DP-SGD curves (against dp-accounting), the attack bound, renewal arithmetic.

Every number is computed independently: dp-accounting's RDP accountant for the subsampled
Gaussian (an oracle within 1e-6), closed forms evaluated by hand in comments for the attack
bound and the renewal figures of the seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpgate import accounting
from dpgate.accounting import (
    ORDERS,
    dp_sgd_cost,
    dp_sgd_rdp,
    gdp_mu,
    gdp_true_positive_rate,
    max_true_positive_rate,
    periods_epsilon,
    poisson_subsampled_gaussian_rdp,
    rdp_true_positive_rate,
    zcdp_true_positive_rate,
)

FINITE = [a for a in ORDERS if math.isfinite(a)]
# three (q, σ, steps) settings of typical DP-SGD runs, the last one far from the others
SETTINGS = [(0.01, 1.1, 1000), (0.004, 0.8, 5000), (0.1, 2.0, 200)]


def _oracle(q: float, sigma: float, steps: int) -> np.ndarray:
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    acc = rdp.RdpAccountant(orders=FINITE)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return np.asarray(acc._rdp)  # the accountant's composed curve at our orders


@pytest.mark.parametrize("q,sigma,steps", SETTINGS)
def test_poisson_subsampled_gaussian_matches_dp_accounting(q, sigma, steps):
    ours = dp_sgd_rdp(q, sigma, steps, "poisson")
    ref = _oracle(q, sigma, steps)
    assert np.isfinite(ref).all()
    np.testing.assert_allclose(ours[:-1], ref, rtol=1e-6, atol=1e-6)
    assert math.isinf(ours[-1])  # the sampled Gaussian makes no claim at α = ∞
    # the curve is a valid RDP curve: non-decreasing in α (van Erven & Harremoës 2014, Thm. 3)
    assert (np.diff(ours[:-1]) >= -1e-12).all()


def test_integer_and_fractional_orders_agree_around_an_integer():
    # the integer-order sum and the fractional series are two formulas for one function of α:
    # at α = 3 ± 1e-7 the series must be within float noise of the sum at α = 3
    q, sigma = 0.02, 1.3
    a3 = poisson_subsampled_gaussian_rdp(q, sigma, [3.0])[0]
    near = poisson_subsampled_gaussian_rdp(q, sigma, [3.0 - 1e-7, 3.0 + 1e-7])
    assert near[0] <= a3 + 1e-9 and a3 <= near[1] + 1e-9
    assert near == pytest.approx([a3, a3], rel=1e-5)


def test_special_cases_of_the_sampled_gaussian():
    # q = 1: the Gaussian mechanism, α/(2σ²) (Mironov 2017, Cor. 3); q = 0: nothing
    np.testing.assert_allclose(poisson_subsampled_gaussian_rdp(1.0, 2.0, [2.0, 10.0]), [2 / 8, 10 / 8])
    assert poisson_subsampled_gaussian_rdp(0.0, 2.0, [2.0]).tolist() == [0.0]
    # amplification: subsampling never costs more than the full-data Gaussian
    full = dp_sgd_rdp(0.05, 1.0, 100, "shuffle")
    amp = dp_sgd_rdp(0.05, 1.0, 100, "poisson")
    assert (amp[:-1] <= full[:-1]).all()
    low = [i for i, a in enumerate(FINITE) if a <= 6]
    assert (amp[low] < full[low] / 10).all()


@pytest.mark.parametrize("sampler", ["shuffle", "fixed_batches", "with_replacement"])
def test_other_samplers_are_charged_without_amplification(sampler):
    # steps × α/(2σ²): the full-data Gaussian at every step, whatever q says
    curve = dp_sgd_rdp(0.01, 1.1, 1000, sampler)
    np.testing.assert_allclose(curve[:-1], [1000 * a / (2 * 1.1**2) for a in FINITE], rtol=1e-15)
    cost = dp_sgd_cost(0.01, 1.1, 1000, sampler)
    assert cost.kind == "gaussian" and cost.rho == pytest.approx(1000 / (2 * 1.1**2), rel=1e-15)
    # the same run with Poisson sampling is ~2 orders of magnitude cheaper at α = 8
    assert dp_sgd_rdp(0.01, 1.1, 1000, "poisson")[ORDERS.index(8.0)] < curve[ORDERS.index(8.0)] / 50


def test_dp_sgd_arguments_are_checked():
    with pytest.raises(ValueError, match="sampler"):
        dp_sgd_rdp(0.01, 1.0, 10, "random")
    with pytest.raises(ValueError, match="steps"):
        dp_sgd_rdp(0.01, 1.0, 0, "poisson")
    with pytest.raises(ValueError, match="q"):
        dp_sgd_rdp(1.5, 1.0, 10, "poisson")
    with pytest.raises(ValueError, match="noise_multiplier"):
        dp_sgd_rdp(0.01, 0.0, 10, "shuffle")


# --- the attack bound --------------------------------------------------------------------------


def test_dp_attack_bound_by_hand():
    # TPR ≤ e^ε·FPR + δ (Kairouz, Oh & Viswanath 2015, Thm. 2.1), the first face binds at small FPR:
    # ε = 1: e · 0.01 + 1e-6 = 0.02718282 + 0.000001 = 0.02718382
    assert max_true_positive_rate(1.0, 1e-6, 0.01) == pytest.approx(0.0271838183, rel=1e-9)
    # ε = 4: e⁴ · 0.01 + 1e-6 = 0.5459815 + 0.000001 = 0.5459825
    assert max_true_positive_rate(4.0, 1e-6, 0.01) == pytest.approx(0.5459825003, rel=1e-9)
    # at FPR = 0.2 and ε = 4 the second face binds: 1 − e⁻⁴·(1 − 1e-6 − 0.2) = 1 − 0.01831564·0.799999
    # = 1 − 0.01465249 = 0.98534751
    assert max_true_positive_rate(4.0, 1e-6, 0.2) == pytest.approx(1 - math.exp(-4) * (0.8 - 1e-6), rel=1e-12)
    assert round(max_true_positive_rate(4.0, 1e-6, 0.2), 6) == 0.985348


def test_gdp_trade_off_by_hand():
    # TPR = Φ(Φ⁻¹(FPR) + μ) (Dong, Roth & Su 2022): Φ⁻¹(0.01) = −2.3263479, + 1 = −1.3263479,
    # Φ(−1.3263479) = ½·erfc(1.3263479/√2) = ½·erfc(0.9378657) = 0.0923622
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))  # noqa: E731
    assert gdp_true_positive_rate(1.0, 0.01) == pytest.approx(phi(-2.3263478740408408 + 1.0), rel=1e-9)
    assert round(gdp_true_positive_rate(1.0, 0.01), 6) == 0.092362
    assert gdp_true_positive_rate(0.0, 0.3) == pytest.approx(0.3)
    # μ = √(2ρ) for continuous Gaussians: ρ = 0.5 → μ = 1
    assert gdp_mu(0.5) == 1.0


def test_zcdp_attack_bound_is_valid_and_tighter_than_one_epsilon_delta_point():
    rho, fpr = 0.5, 0.01
    # Mironov 2017 Prop. 10 at α = √(ln(1/FPR)/ρ) = √(4.60517/0.5) = 3.03485:
    # exp((α−1)(ρ + ln FPR/α)) = exp(2.034854·(0.5 − 1.517427)) = exp(−2.070316) = 0.126146
    alpha = math.sqrt(math.log(1 / fpr) / rho)
    mironov = math.exp((alpha - 1) * (rho + math.log(fpr) / alpha))
    assert round(mironov, 5) == 0.12615
    got = zcdp_true_positive_rate(rho, fpr)
    assert got <= mironov + 1e-12
    # valid: a continuous Gaussian with ρ = 0.5 (μ = 1) is ρ-zCDP and reaches Φ(Φ⁻¹(FPR) + 1) exactly,
    # so no ρ-zCDP bound may be below it
    assert got >= gdp_true_positive_rate(1.0, fpr)
    # tighter than the single (ε, δ) point of the same ρ at δ = 1e-6
    eps = accounting.zcdp_epsilon_tight(rho, 1e-6)
    assert got < max_true_positive_rate(eps, 1e-6, fpr)


def test_rdp_attack_bound_of_a_gaussian_curve_equals_the_zcdp_one_on_the_grid():
    rho, fpr = 0.2, 0.05
    curve = [a * rho for a in FINITE]
    by_rdp = rdp_true_positive_rate(curve, fpr, FINITE)
    assert gdp_true_positive_rate(math.sqrt(2 * rho), fpr) <= by_rdp
    assert by_rdp >= zcdp_true_positive_rate(rho, fpr) - 1e-3  # a grid of orders is never better than all α
    assert by_rdp < max_true_positive_rate(accounting.zcdp_epsilon_tight(rho, 1e-6), 1e-6, fpr)


def test_attack_bounds_are_monotone_in_fpr():
    fprs = [0.001, 0.01, 0.05, 0.1, 0.5]
    for fn in (lambda f: zcdp_true_positive_rate(0.3, f), lambda f: gdp_true_positive_rate(0.8, f)):
        values = [fn(f) for f in fprs]
        assert values == sorted(values) and all(v >= f for v, f in zip(values, fprs))


# --- renewal arithmetic (the seed's figures) -----------------------------------------------------


def test_renewal_arithmetic_of_the_seed():
    # ρ 0.1 a month at δ 1e-6 (Bun & Steinke 2016, Prop. 1.3: ε = ρ + 2√(ρ ln 1/δ)):
    # one month: 0.1 + 2√(0.1 · 13.8155) = 0.1 + 2·1.17540 = 2.4508
    # 12 months: ρ = 1.2: 1.2 + 2√(1.2 · 13.8155) = 1.2 + 2·4.07168 = 9.3434
    # 36 months: ρ = 3.6: 3.6 + 2√(3.6 · 13.8155) = 3.6 + 2·7.05236 = 17.7047
    log_inv = math.log(1e6)
    assert periods_epsilon(0.1, 1, 1e-6) == pytest.approx(0.1 + 2 * math.sqrt(0.1 * log_inv), rel=1e-12)
    assert round(periods_epsilon(0.1, 1, 1e-6), 2) == 2.45
    assert round(periods_epsilon(0.1, 12, 1e-6), 2) == 9.34
    assert round(periods_epsilon(0.1, 36, 1e-6), 2) == 17.70
    # the tighter conversion the ledger reports spend with is smaller, never larger
    assert periods_epsilon(0.1, 12, 1e-6, "tight") < periods_epsilon(0.1, 12, 1e-6)


def test_attack_curves_equal_the_pointwise_bounds():
    fprs = [0.0, 0.001, 0.01, 0.2, 1.0]
    assert accounting.zcdp_attack_curve(0.3, fprs).tolist() == [zcdp_true_positive_rate(0.3, f) for f in fprs]
    curve = [a * 0.3 for a in FINITE]
    assert accounting.rdp_attack_curve(curve, fprs, FINITE).tolist() == \
        [rdp_true_positive_rate(curve, f, FINITE) for f in fprs]


@pytest.mark.parametrize("q,sigma,steps", SETTINGS)
def test_poisson_subsampled_gaussian_matches_opacus_where_installed(q, sigma, steps):
    rdp = pytest.importorskip("opacus.accountants.analysis.rdp", reason="Opacus (and torch) not installed")
    ours = dp_sgd_rdp(q, sigma, steps, "poisson")[:-1]
    theirs = np.asarray(rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=FINITE))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_the_attack_bound_survives_huge_epsilons():
    # the API fuzz found e^ε overflowing a double in the (ε(δ'), δ') family at δ = 0.5: TPR ≤ 1, no error
    assert max_true_positive_rate(5000.0, 1e-6, 0.01) == 1.0
    assert max_true_positive_rate(5000.0, 1e-6, 0.0) == 1e-6  # at FPR = 0 the bound is δ, for any ε
    from dpgate.attack import cap_attack_bound
    from dpgate.ledger.caps import validate_cap

    bound = cap_attack_bound(validate_cap(1.0, 0.5))
    assert 0.0 <= bound["tightest"]["tpr"] <= 1.0
