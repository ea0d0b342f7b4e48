"""Hypothesis property tests of dpgate.accounting (edge rules, orderings, round trips, oracle)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from dpgate.accounting import (
    CONVERSIONS,
    ORDERS,
    Cost,
    gaussian_epsilon_exact,
    gaussian_rdp,
    laplace_rdp,
    pure_dp_rdp,
    rdp_epsilon_basic,
    rdp_epsilon_tight,
    rho_for_cap,
    zcdp_epsilon,
    zcdp_epsilon_simple,
    zcdp_epsilon_tight,
)

FINITE_ORDERS = np.asarray([a for a in ORDERS if math.isfinite(a)])

# ρ and δ over many orders of magnitude (log-uniform)
rhos = st.floats(-12, 4).map(lambda e: 10.0**e)
deltas = st.floats(-15, -0.05).map(lambda e: 10.0**e)
epsilons = st.floats(-3, 1.5).map(lambda e: 10.0**e)
REL = 1e-9  # tolerance for numerically computed (root-found) conversions

ZCDP_CONVERSIONS = [zcdp_epsilon_simple, zcdp_epsilon_tight, gaussian_epsilon_exact]


@st.composite
def rdp_curves(draw):
    """Realistic RDP curves on ORDERS: sums of Gaussian, Laplace and pure-ε curves."""
    rho = draw(st.one_of(st.just(0.0), rhos))
    lap = draw(st.one_of(st.just(0.0), epsilons))
    pure = draw(st.one_of(st.just(0.0), epsilons))
    curve = gaussian_rdp(rho) + laplace_rdp(lap) + pure_dp_rdp(pure)
    assume(np.isfinite(curve).any())
    return curve


@settings(max_examples=60, deadline=None)
@given(rho=rhos, d1=deltas, d2=deltas)
def test_zcdp_conversions_non_increasing_in_delta_and_non_negative(rho, d1, d2):
    lo, hi = sorted((d1, d2))
    for fn in ZCDP_CONVERSIONS:
        e_lo, e_hi = fn(rho, lo), fn(rho, hi)
        assert e_lo >= 0 and e_hi >= 0
        assert e_hi <= e_lo * (1 + REL) + 1e-300, fn.__name__
    assert zcdp_epsilon_tight(rho, 0.0) == math.inf


@settings(max_examples=60, deadline=None)
@given(rho=rhos, delta=deltas)
def test_exact_le_tight_le_simple(rho, delta):
    simple = zcdp_epsilon_simple(rho, delta)
    tight = zcdp_epsilon_tight(rho, delta)
    exact = gaussian_epsilon_exact(rho, delta)
    assert tight <= simple
    assert exact <= tight * (1 + REL) + 1e-300
    # the tight grid conversion of the α·ρ curve lies between the continuous optimum and basic
    curve = gaussian_rdp(rho)
    grid = rdp_epsilon_tight(curve, delta)
    assert tight <= grid * (1 + REL) + 1e-300
    assert grid <= rdp_epsilon_basic(curve, delta)


@settings(max_examples=40, deadline=None)
@given(epsilon=epsilons, delta=deltas, conversion=st.sampled_from(CONVERSIONS))
def test_rho_for_cap_round_trips(epsilon, delta, conversion):
    rho = rho_for_cap(epsilon, delta, conversion)
    assert rho > 0
    back = zcdp_epsilon(rho, delta, conversion)
    assert back <= epsilon  # never over the cap
    assert back == pytest.approx(epsilon, rel=1e-8)
    # and it is the largest such ρ: a little more exceeds the cap
    assert zcdp_epsilon(rho * (1 + 1e-6), delta, conversion) > epsilon


@settings(max_examples=60, deadline=None)
@given(curve=rdp_curves(), d1=deltas, d2=deltas)
def test_rdp_conversions_monotone_non_negative_and_ordered(curve, d1, d2):
    lo, hi = sorted((d1, d2))
    for fn in (rdp_epsilon_basic, rdp_epsilon_tight):
        assert 0 <= fn(curve, hi) <= fn(curve, lo)
    assert rdp_epsilon_tight(curve, lo) <= rdp_epsilon_basic(curve, lo)
    # pure ε (the α = ∞ entry) bounds both at every δ, including δ = 0
    assert rdp_epsilon_tight(curve, lo) <= curve[-1]
    assert rdp_epsilon_tight(curve, 0.0) == curve[-1]


@settings(max_examples=80, deadline=None)
@given(
    curve=st.lists(st.floats(1e-6, 50.0), min_size=len(FINITE_ORDERS), max_size=len(FINITE_ORDERS)),
    delta=deltas,
)
def test_tight_rdp_conversion_matches_dp_accounting(curve, delta):
    # dp-accounting ignores orders <= 1.01 in its CKS/Balle bound, so compare on the orders
    # above 1.01 (equal) and on the full finite grid (ours can only be smaller).
    curve = np.asarray(curve)
    above = FINITE_ORDERS > 1.01
    oracle, _ = compute_epsilon(FINITE_ORDERS[above], curve[above], delta)
    ours = rdp_epsilon_tight(curve[above], delta, FINITE_ORDERS[above])
    assert ours == pytest.approx(float(oracle), rel=1e-12, abs=1e-12)
    full_oracle, _ = compute_epsilon(FINITE_ORDERS, curve, delta)
    assert rdp_epsilon_tight(curve, delta, FINITE_ORDERS) <= float(full_oracle) + 1e-12


@st.composite
def costs(draw):
    kind = draw(st.sampled_from(["zcdp", "gaussian", "pure", "laplace", "rdp"]))
    if kind == "zcdp":
        return Cost.zcdp(draw(rhos))
    if kind == "gaussian":
        return Cost.continuous_gaussian(draw(rhos))
    if kind == "pure":
        return Cost.pure(draw(epsilons))
    if kind == "laplace":
        return Cost.laplace(draw(epsilons))
    return Cost.rdp(list(draw(rdp_curves())))


@settings(max_examples=80, deadline=None)
@given(cost=costs())
def test_cost_dict_round_trip(cost):
    data = json.loads(json.dumps(cost.to_dict(), allow_nan=False))
    again = Cost.from_dict(data)
    assert again == cost
    assert again.to_dict() == cost.to_dict()


@settings(max_examples=80, deadline=None)
@given(a=costs(), b=costs(), c=costs())
def test_cost_addition_composes(a, b, c):
    ab = a + b
    # the curve of a sum is the sum of the curves (RDP composition, Mironov 2017 Prop. 1);
    # addition is commutative and associative up to rounding
    np.testing.assert_allclose(ab.curve_at(), a.curve_at() + b.curve_at(), rtol=1e-12)
    np.testing.assert_allclose((b + a).curve_at(), ab.curve_at(), rtol=1e-12)
    np.testing.assert_allclose(((a + b) + c).curve_at(), (a + (b + c)).curve_at(), rtol=1e-12)
    if a.is_zcdp and b.is_zcdp:
        assert ab.is_zcdp and ab.rho == pytest.approx(a.rho + b.rho, rel=1e-15)
        assert ab.kind == ("gaussian" if a.kind == b.kind == "gaussian" else "zcdp")
        # composing never lowers the reported ε (zcdp reporting is >= exact at equal ρ)
        assert ab.epsilon(1e-6) >= max(a.epsilon(1e-6), b.epsilon(1e-6)) * (1 - 1e-9)
    else:
        assert ab.kind == "rdp"
        # on one conversion (tight RDP) more spend is never reported as less ε
        a_rdp = Cost.rdp(list(a.curve_at()))
        assert ab.epsilon(1e-6) >= a_rdp.epsilon(1e-6) - 1e-12
    assert sum([a, b]) == ab
