"""Issue 22 item 5: a ρ/ε budget is split over a query's primitives to minimise the outputs' error.

Oracles are computed here by hand from the Lagrange rule (minimise Σ c_i Δ_i²/ρ_i subject to
Σ ρ_i = ρ ⇒ ρ_i ∝ √c_i Δ_i; Laplace: Σ c_i Δ_i²/ε_i² ⇒ ε_i ∝ (c_i Δ_i²)^{1/3}), with the
coefficients of :mod:`dpgate.postprocess.split` written out again (AVG: a_S = 1, a_N = E[μ²] for
μ ~ U[lo, hi]); σ = Δ2/√(2ρ_i) (Canonne, Kamath & Steinke 2020, Thm. 4). The end-to-end check
compares the AVG's empirical RMSE over repeated releases (OpenDP noise) with the equal split.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _small_project import write_project
from hypothesis import given, settings, strategies as st

from dpgate import mechanisms
from dpgate.postprocess.calibration import CellTarget
from dpgate.postprocess.split import output_coefficients, predicted_variance, split_weights
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

AVG = CellTarget("a", "avg", ("s", "n"), (0.0, 100.0))
STD = CellTarget("sd", "stddev_pop", ("q", "s", "n"), (0.0, 100.0))
UNITS = {"q": 1.0, "s": 1.0, "n": 1.0, "c": 1.0}


def _shares(cal):
    return dict(cal.primitive_costs)


def test_avg_split_for_bounds_0_100_k1_m1_is_sqrt3_to_1():
    # bounds [0, 100], k = m = 1: Δ_S = 100, Δ_N = 1. E[μ²] = (0 + 0 + 100²)/3 = 10⁴/3.
    # √c_S Δ_S ∝ 1·100, √c_N Δ_N ∝ √(10⁴/3)·1 = 100/√3 ⇒ ρ_S : ρ_N = √3 : 1,
    # ρ_S = ρ·√3/(√3 + 1) = ρ(3 − √3)/2 ≈ 0.6340ρ, ρ_N = ρ(√3 − 1)/2 ≈ 0.3660ρ.
    rho = 0.5
    d = {"s": 100.0, "n": 1.0}
    w = split_weights([AVG], d, UNITS)
    cal = mechanisms.calibrate({p: (v, v) for p, v in d.items()}, rho=rho, weights=w)
    assert cal.primitive_costs["s"] == pytest.approx(rho * (3 - math.sqrt(3)) / 2, rel=1e-12)
    assert cal.primitive_costs["n"] == pytest.approx(rho * (math.sqrt(3) - 1) / 2, rel=1e-12)
    assert cal.scales["s"] == pytest.approx(100 / math.sqrt(2 * rho * (3 - math.sqrt(3)) / 2), rel=1e-9)
    assert cal.scales["n"] == pytest.approx(1 / math.sqrt(2 * rho * (math.sqrt(3) - 1) / 2), rel=1e-9)
    assert cal.rho == rho and cal.cost.rho == rho


def test_worst_case_mean_would_give_the_equal_split():
    # The derivation's remark: with |μ| ≤ B = max(|lo|, |hi|) the weights are a_S = 1, a_N = B², and
    # Δ_S = B·Δ_N, so √c_S Δ_S = √c_N Δ_N: equal. Checked through the Lagrange rule of calibrate.
    d = {"s": 100.0, "n": 1.0}
    cal = mechanisms.calibrate({p: (v, v) for p, v in d.items()}, rho=1.0, weights={"s": 1.0, "n": 100.0 ** 2})
    assert cal.primitive_costs["s"] == pytest.approx(0.5, rel=1e-12)
    assert cal.primitive_costs["n"] == pytest.approx(0.5, rel=1e-12)


def test_stddev_split_by_hand():
    # bounds [0, 100], m = 3: Δ_Q = 3·10⁴, Δ_S = 300, Δ_N = 3. μ ~ U[0, 100], q ~ U[0, 10⁴]:
    # E[μ²] = 10⁴/3, E[μ⁴] = 10⁸/5, E[q] = 5000, E[q²] = 10⁸/3,
    # E[(2μ² − q)²] = 4·10⁸/5 − 4·(10⁴/3)·5000 + 10⁸/3 = 10⁸·(12 − 10 + 5)/15 = 7·10⁸/15.
    # √c_i Δ_i ∝ 1·3·10⁴, √(4·10⁴/3)·300, √(7·10⁸/15)·3.
    d = {"q": 3e4, "s": 300.0, "n": 3.0}
    raw = {"q": 3e4, "s": math.sqrt(4e4 / 3) * 300, "n": math.sqrt(7e8 / 15) * 3}
    total = sum(raw.values())
    cal = mechanisms.calibrate({p: (v, v) for p, v in d.items()}, rho=0.01, weights=split_weights([STD], d, UNITS))
    for p in d:
        assert cal.primitive_costs[p] == pytest.approx(0.01 * raw[p] / total, rel=1e-12)


def test_shared_primitive_counts_once_with_both_outputs_weights():
    # COUNT(*) n (p0), AVG a (sum p1, count p2), SUM s (p1), m = 3, bounds [0, 100]:
    # normalisers n: 1·9, a: 300² + (10⁴/3)·9 = 120000, s: 300² = 90000;
    # c0 = 1/9, c1 = 1/120000 + 1/90000 = 7/360000, c2 = (10⁴/3)/120000 = 1/36;
    # √c_i Δ_i = 1, √7/2, 1/2.
    targets = [CellTarget("n", "count", ("p0",)), CellTarget("a", "avg", ("p1", "p2"), (0.0, 100.0)),
               CellTarget("s", "sum", ("p1",), (0.0, 100.0))]
    d = {"p0": 3.0, "p1": 300.0, "p2": 3.0}
    w = split_weights(targets, d, {"p0": 1.0, "p1": 1.0, "p2": 1.0})
    assert w == pytest.approx({"p0": 1 / 9, "p1": 7 / 360000, "p2": 1 / 36}, rel=1e-12)
    cal = mechanisms.calibrate({p: (v, v) for p, v in d.items()}, rho=1.0, weights=w)
    total = 1.5 + math.sqrt(7) / 2
    assert _shares(cal) == pytest.approx({"p0": 1 / total, "p1": math.sqrt(7) / 2 / total,
                                          "p2": 0.5 / total}, rel=1e-12)


def test_laplace_follows_the_cube_root_rule():
    # ε_i ∝ (c_i Δ_i²)^{1/3}: AVG [0, 100], Δ1_S = 100, Δ1_N = 1, c_S = 1/n, c_N = (10⁴/3)/n
    # (n the normaliser, common): (10⁴)^{1/3} : (10⁴/3)^{1/3} = 3^{1/3} : 1.
    d = {"s": 100.0, "n": 1.0}
    cal = mechanisms.calibrate({p: (v, v) for p, v in d.items()}, mechanism="laplace", epsilon=1.0,
                               weights=split_weights([AVG], d, UNITS))
    r = 3 ** (1 / 3)
    assert cal.primitive_costs["s"] == pytest.approx(r / (r + 1), rel=1e-12)
    assert cal.primitive_costs["n"] == pytest.approx(1 / (r + 1), rel=1e-12)
    assert cal.scales["s"] == pytest.approx(100 / (r / (r + 1)), rel=1e-9)  # b = Δ1/ε_i
    assert cal.epsilon == 1.0


def test_a_primitive_no_output_weighs_falls_back_to_the_equal_split():
    d = {"s": 100.0, "n": 1.0, "c": 1.0}  # "c" belongs to no output
    assert split_weights([AVG], d, UNITS) is None
    cal = mechanisms.calibrate({p: (v, v) for p, v in d.items()}, rho=0.3, weights=None)
    assert _shares(cal) == pytest.approx({"s": 0.1, "n": 0.1, "c": 0.1}, rel=1e-12)


def test_weights_must_cover_every_noisy_primitive():
    with pytest.raises(mechanisms.MechanismError):
        mechanisms.calibrate({"s": (1.0, 1.0), "n": (1.0, 1.0)}, rho=1.0, weights={"s": 1.0})


bounds_st = st.tuples(st.floats(-1e6, 1e6), st.floats(0.0, 1e6)).map(lambda t: (t[0], t[0] + t[1]))


@settings(max_examples=200, deadline=None)
@given(bounds=bounds_st, m=st.integers(1, 50), k=st.integers(1, 20), res=st.sampled_from([1.0, 0.01, 0.5]),
       rho=st.floats(1e-6, 1e3), fn=st.sampled_from(["avg", "var_pop", "stddev_pop"]))
def test_split_never_predicts_more_variance_than_equal_and_charges_exactly_rho(bounds, m, k, res, rho, fn):
    # Δ2 per sensitivity.py: count √k·m, sum √k·m·max(|lo|, |hi|)/res, sum_squares √k·m·max(lo², hi²)/res².
    lo, hi = bounds
    f = math.sqrt(k) * m
    big = max(abs(lo), abs(hi))
    d = {"n": f, "s": f * big / res, "q": f * big * big / res ** 2}
    units = {"n": 1.0, "s": res, "q": res ** 2}
    t = CellTarget("o", fn, ("s", "n") if fn == "avg" else ("q", "s", "n"), bounds)
    d = {p: v for p, v in d.items() if p in t.primitives}
    w = split_weights([t], d, units)
    noisy = {p: v for p, v in d.items() if v > 0}
    if w is None:  # bounds [0, 0]: only the count is noisy and no ratio weight survives
        return
    shares = mechanisms._split(rho, noisy, w, True)
    assert math.fsum(shares.values()) <= rho
    assert math.fsum(shares.values()) == pytest.approx(rho, rel=1e-12)
    equal = {p: rho / len(noisy) for p in noisy}
    new = predicted_variance([t], d, units, shares)["o"]
    old = predicted_variance([t], d, units, equal)["o"]
    assert new <= old * (1 + 1e-9)


@settings(max_examples=50, deadline=None)
@given(rho=st.floats(1e-8, 1e4), ws=st.lists(st.floats(1e-6, 1e6), min_size=2, max_size=6),
       ds=st.lists(st.floats(1e-3, 1e6), min_size=6, max_size=6))
def test_the_charged_cost_is_the_requested_budget_to_the_bit(rho, ws, ds):
    pids = [f"p{i}" for i in range(len(ws))]
    cal = mechanisms.calibrate({p: (ds[i], ds[i]) for i, p in enumerate(pids)}, rho=rho,
                               weights=dict(zip(pids, ws)))
    assert cal.rho == rho and cal.cost.rho == rho
    assert math.fsum(cal.primitive_costs.values()) <= rho


def test_coefficients_are_data_independent_functions_of_the_bounds():
    a = output_coefficients(AVG, UNITS)
    assert a == pytest.approx({"s": 1.0, "n": 1e4 / 3}, rel=1e-12)  # E[μ²] for μ ~ U[0, 100]
    sym = output_coefficients(CellTarget("a", "avg", ("s", "n"), (-50.0, 50.0)), UNITS)
    assert sym["n"] == pytest.approx(2500 / 3, rel=1e-12)  # (lo² + lo·hi + hi²)/3


# ------------------------------------------------------------------ through the gateway


@pytest.fixture
def gateway(tmp_path):
    settings_ = Settings(policies=write_project(tmp_path / "project"), home=tmp_path / "state")
    with Gateway.open(settings_) as gw:
        yield gw


def test_explain_shows_the_split_and_the_ledger_charges_the_budget(gateway):
    doc = gateway.explain("shop", "SELECT AVG(amount) AS a FROM orders", budget=QueryBudget(rho=0.01))
    split = doc["primitive_split"]
    assert split["rule"] == "optimal"
    rows = split["primitives"]
    by_agg = {r["aggregate"]: r for r in rows.values()}
    # amount in [0, 100], m = 3: the [0, 100] oracle above (the factor m cancels)
    assert by_agg["SUM(amount)"]["rho"] == pytest.approx(0.01 * (3 - math.sqrt(3)) / 2, rel=1e-12)
    assert by_agg["COUNT(amount)"]["rho"] == pytest.approx(0.01 * (math.sqrt(3) - 1) / 2, rel=1e-12)
    assert by_agg["COUNT(amount)"]["sigma"] == pytest.approx(3 / math.sqrt(0.01 * (math.sqrt(3) - 1)), rel=1e-9)
    assert math.fsum(r["rho"] for r in rows.values()) <= 0.01
    assert doc["cost"]["rho"] == 0.01
    rel = gateway.query("shop", "SELECT AVG(amount) AS a FROM orders", budget=QueryBudget(rho=0.01),
                        consumer="analysts")
    assert rel["noise_scales"] == doc["noise_scales"]  # the answer is calibrated as explained
    assert rel["charge"]["rho"] == 0.01  # the ledger's charge (the runner asserts it equals the calibrated cost)


def _exact_amounts():
    # tests/_small_project.py's orders: user u has 1 + u % 3 rows of amount (7u + 13j) % 101
    vals = [(u * 7 + j * 13) % 101 for u in range(300) for j in range(1 + u % 3)]
    return sum(vals), len(vals)


def test_avg_rmse_over_repeated_releases_beats_the_equal_split(gateway):
    # The gateway's own calibration of AVG(amount) (from explain: what the answer uses) against the
    # equal split at the same ρ: the exact sum and count of the sample data noised 20000 times with
    # OpenDP's samplers. The mean (≈ 50) is half the bound 100, where the predicted MSE ratio is
    # (1/0.634 + 0.25/0.366)/(2 + 0.25·2) ≈ 0.904 (RMSE ≈ 0.95); the estimate's sd is ≈ 0.5 %.
    rho, reps = 0.01, 20000
    doc = gateway.explain("shop", "SELECT AVG(amount) AS a FROM orders", budget=QueryBudget(rho=rho))
    by_agg = {r["aggregate"]: pid for pid, r in doc["primitive_split"]["primitives"].items()}
    ps, pn = by_agg["SUM(amount)"], by_agg["COUNT(amount)"]
    s_true, n_true = _exact_amounts()
    pairs = {ps: (300.0, 300.0), pn: (3.0, 3.0)}  # Δ2 = m·max(|lo|, |hi|), m
    cals = {"optimal": mechanisms.calibrate(pairs, scales=doc["noise_scales"]),
            "equal": mechanisms.calibrate(pairs, rho=rho)}
    assert cals["optimal"].rho == pytest.approx(rho, rel=1e-12)
    errs = {}
    for name, cal in cals.items():
        noisy = mechanisms.sample(cal, {ps: np.full(reps, s_true, dtype=np.int64),
                                        pn: np.full(reps, n_true, dtype=np.int64)})
        avg = noisy[ps] / np.maximum(noisy[pn], 1)
        errs[name] = float(np.sqrt(np.mean((avg - s_true / n_true) ** 2)))
    assert errs["optimal"] < 0.98 * errs["equal"], errs
