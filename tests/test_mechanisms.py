"""The noise step (dpgate.mechanisms): calibration, OpenDP's privacy maps, sampling, ci95.

Real OpenDP throughout. Expected values are derived by hand in comments:
discrete Gaussian ρ = Δ2²/(2σ²) ([CKS20] Thm. 4), discrete Laplace ε = Δ1/b.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import opendp.prelude as dp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpgate import accounting, mechanisms
from dpgate.errors import InvalidBudget, InvalidRequest, MechanismError
from dpgate.mechanisms import calibrate, ci95_halfwidth, sample, sigma_for_ci95

dp.enable_features("contrib")


# --- calibration: Gaussian ------------------------------------------------------------------


def test_gaussian_equal_split_hand_values():
    # Δ2 = 1 for both primitives, ρ = 0.5 split over n = 2: ρ_i = 0.25,
    # σ = Δ2/√(2ρ_i) = 1/√0.5 = √2.
    cal = calibrate({"p0": (1.0, 1.0), "p1": (1.0, 1.0)}, mechanism="gaussian", rho=0.5)
    assert cal.mechanism == "discrete_gaussian"
    assert cal.scales == {"p0": pytest.approx(math.sqrt(2), rel=1e-15),
                          "p1": pytest.approx(math.sqrt(2), rel=1e-15)}
    assert cal.rho == 0.5 and cal.epsilon is None
    assert cal.cost.kind == "zcdp" and cal.cost.rho == 0.5 and cal.cost.gdp_mu is not None  # + its μ-GDP claim
    for pid in ("p0", "p1"):
        assert cal.primitive_costs[pid] == pytest.approx(0.25, rel=1e-12)
        assert cal.primitive_costs[pid] <= 0.25  # OpenDP certifies the share, never more


def test_gaussian_non_integer_sensitivity_uses_the_real_value():
    # k = 3 groups, m = 2 rows: Δ2 = √3·2 = √12 (not an integer). ρ = 0.1, one primitive:
    # σ = √12/√0.2 = √60.
    d2 = math.sqrt(3) * 2
    cal = calibrate({"p0": (6.0, d2)}, mechanism="gaussian", rho=0.1)
    assert cal.scales["p0"] == pytest.approx(math.sqrt(60), rel=1e-12)
    # OpenDP's own privacy map, evaluated independently here, at d_in = √12:
    meas = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="f64"),
                              scale=cal.scales["p0"])
    assert meas.map(d2) == pytest.approx(12 / (2 * 60), rel=1e-12)
    assert meas.map(d2) <= 0.1
    # The integer-rounded-up sensitivity would over-charge: 4²/(2·60) = 0.133 > 0.1.
    assert meas.map(4.0) > 0.1


def test_gaussian_scales_mode_cost_from_privacy_map():
    # σ = (2, 5), Δ2 = (1, 3): ρ = 1/8 + 9/50 = 0.305.
    cal = calibrate({"a": (1, 1), "b": (3, 3)}, mechanism="gaussian", scales={"a": 2.0, "b": 5.0})
    assert cal.scales == {"a": 2.0, "b": 5.0}
    assert cal.rho == pytest.approx(0.125 + 0.18, rel=1e-12)
    assert cal.cost.kind == "zcdp" and cal.cost.rho == cal.rho


def test_discrete_gaussian_rho_matches_opendp_zcdp_to_approx_dp():
    # The (ε, δ) we publish for a ρ-zCDP release is the CKS conversion; OpenDP's own
    # zCDP → approx-DP profile of the same measurement must agree.
    cal = calibrate({"p0": (1.0, 1.0)}, mechanism="gaussian", rho=0.5)
    meas = dp.c.make_zCDP_to_approxDP(dp.m.make_gaussian(
        dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="f64"), scale=cal.scales["p0"]))
    eps_opendp = meas.map(1.0).epsilon(1e-6)
    assert accounting.zcdp_epsilon_tight(cal.rho, 1e-6) == pytest.approx(eps_opendp, rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(
    d2=st.floats(1e-3, 1e6),
    rho=st.floats(1e-6, 10.0),
    n=st.integers(1, 5),
)
def test_gaussian_calibration_property(d2, rho, n):
    sens = {f"p{i}": (d2, d2 * (i + 1)) for i in range(n)}
    cal = calibrate(sens, mechanism="gaussian", rho=rho)
    assert cal.rho == pytest.approx(rho, rel=1e-12) and cal.rho >= rho  # never under-stated
    for pid, (_, l2) in sens.items():
        own = accounting.gaussian_rho(l2, cal.scales[pid])
        assert own == pytest.approx(rho / n, rel=1e-9)
        assert cal.primitive_costs[pid] <= rho / n * (1 + 1e-15)
    assert math.fsum(cal.primitive_costs.values()) <= cal.rho * (1 + 1e-12)


# --- calibration: Laplace ---------------------------------------------------------------------


def test_laplace_equal_split_hand_values():
    # ε = 1 over n = 2: ε_i = 0.5; b = Δ1/ε_i: Δ1 = 1 → b = 2, Δ1 = 3 → b = 6.
    cal = calibrate({"p0": (1.0, 1.0), "p1": (3.0, math.sqrt(3))}, mechanism="laplace", epsilon=1.0)
    assert cal.mechanism == "discrete_laplace"
    assert cal.scales == {"p0": pytest.approx(2.0), "p1": pytest.approx(6.0)}
    assert cal.epsilon == 1.0 and cal.rho is None
    assert cal.primitive_costs == {"p0": pytest.approx(0.5), "p1": pytest.approx(0.5)}
    assert cal.cost == accounting.Cost.pure(1.0)
    # independent: OpenDP's map of b = 6 at Δ1 = 3 is 3/6.
    meas = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="f64"), scale=6.0)
    assert meas.map(3.0) == pytest.approx(0.5)


def test_laplace_scales_mode():
    # b = (4, 10), Δ1 = (2, 5): ε = 0.5 + 0.5 = 1.
    cal = calibrate({"a": (2, 2), "b": (5, 5)}, mechanism="discrete_laplace", scales={"a": 4, "b": 10})
    assert cal.epsilon == pytest.approx(1.0)


# --- calibration: errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(mechanism="gaussian", epsilon=1.0), InvalidBudget),
        (dict(mechanism="laplace", rho=1.0), InvalidBudget),
        (dict(mechanism="gaussian"), InvalidBudget),
        (dict(mechanism="gaussian", rho=0.0), InvalidBudget),
        (dict(mechanism="gaussian", rho=-1.0), InvalidBudget),
        (dict(mechanism="gaussian", rho=math.nan), InvalidBudget),
        (dict(mechanism="gaussian", rho=math.inf), InvalidBudget),
        (dict(mechanism="laplace", epsilon="x"), InvalidBudget),
        (dict(mechanism="gaussian", rho=1.0, scales={"p0": 1.0}), InvalidBudget),
        (dict(mechanism="uniform", rho=1.0), InvalidRequest),
        (dict(mechanism="gaussian", scales={}), MechanismError),
        (dict(mechanism="gaussian", scales={"p0": 0.0}), MechanismError),
        (dict(mechanism="gaussian", scales={"p0": math.nan}), MechanismError),
        (dict(mechanism="gaussian", scales={"p0": 2.0**53}), InvalidBudget),
    ],
)
def test_calibrate_errors(kwargs, error):
    with pytest.raises(error):
        calibrate({"p0": (1.0, 1.0)}, **kwargs)


@pytest.mark.parametrize("sens", [{}, {"p0": (1.0, math.nan)}, {"p0": (1.0, math.inf)}, {"p0": (1.0, -1.0)}])
def test_calibrate_bad_sensitivity(sens):
    with pytest.raises(MechanismError):
        calibrate(sens, mechanism="gaussian", rho=0.1)


@pytest.mark.parametrize("mech, budget", [("gaussian", {"rho": 0.3}), ("laplace", {"epsilon": 0.3})])
def test_a_zero_sensitivity_primitive_is_exact_and_free(mech, budget):
    # Issue 9 item 8. p0 has sensitivity 0 (a sum over bounds [0, 0]): it is the same on every
    # dataset, so it is released exactly (scale 0) at cost 0, and the whole budget goes to the
    # noisy primitives: ρ = 0.3 over n = 2 → 0.15 each, σ = Δ2/√(2·0.15) = 1/√0.3.
    cal = calibrate({"p0": (0.0, 0.0), "p1": (1.0, 1.0), "p2": (1.0, 1.0)}, mechanism=mech, **budget)
    assert cal.scales["p0"] == 0.0 and cal.primitive_costs["p0"] == 0.0
    expected = 1 / math.sqrt(0.3) if mech == "gaussian" else 1 / 0.15  # b = Δ1/(ε/n)
    assert cal.scales["p1"] == pytest.approx(expected, rel=1e-12)
    assert (cal.rho if mech == "gaussian" else cal.epsilon) == pytest.approx(0.3, rel=1e-12)
    assert cal.ci95_halfwidths()["p0"] == 0.0
    values = {"p0": np.array([0, 7], dtype=np.int64), "p1": np.zeros(2, dtype=np.int64),
              "p2": np.zeros(2, dtype=np.int64)}
    assert sample(cal, values)["p0"].tolist() == [0, 7]  # exact: no noise


def test_only_zero_sensitivity_primitives_cost_nothing():
    cal = calibrate({"p0": (0.0, 0.0)}, mechanism="gaussian", rho=0.5)
    assert cal.rho == 0.0 and cal.cost == accounting.Cost.zcdp(0.0) and cal.scales == {"p0": 0.0}
    cal = calibrate({"p0": (0.0, 0.0)}, mechanism="laplace", scales={})  # no scale needed
    assert cal.epsilon == 0.0


def test_calibrate_too_much_noise_for_64_bits():
    # Δ2 = 1e12 units (e.g. bound 1e9 at resolution 1e-3), ρ = 1e-12: σ = 1e12/√2e-12 ≈ 7e17 > 2^52.
    with pytest.raises(InvalidBudget, match="2\\^52"):
        calibrate({"p0": (1e12, 1e12)}, mechanism="gaussian", rho=1e-12)


@pytest.mark.parametrize("kwargs", [dict(mechanism="gaussian", rho=5e-324),
                                    dict(mechanism="laplace", epsilon=5e-324),
                                    dict(mechanism="laplace", epsilon=1e-310)])
def test_a_subnormal_budget_is_too_small_not_an_internal_error(kwargs):
    # Split over two primitives, 5e-324 underflows to 0 (a ZeroDivisionError or ValueError
    # once, a 500); a vanishing budget is the request's fault: 400 invalid_budget.
    with pytest.raises(InvalidBudget, match="too small"):
        calibrate({"p0": (1.0, 1.0), "p1": (3.0, 3.0)}, **kwargs)


def test_privacy_map_disagreement_is_an_error(monkeypatch):
    # If our formula and OpenDP's map ever disagree, calibration must refuse.
    monkeypatch.setattr(mechanisms, "_formula", lambda mech, d, s: 2 * d * d / (2 * s * s))
    with pytest.raises(MechanismError, match="disagree"):
        calibrate({"p0": (1.0, 1.0)}, mechanism="gaussian", rho=0.5)


# --- sampling ----------------------------------------------------------------------------------


def test_sample_is_int_and_noisy():
    cal = calibrate({"p0": (1.0, 1.0), "p1": (1.0, 1.0)}, mechanism="gaussian", rho=0.01)  # σ = 10
    values = {"p0": np.arange(1000, dtype=np.int64), "p1": np.zeros(5, dtype=np.int64)}
    out = sample(cal, values)
    assert set(out) == {"p0", "p1"}
    assert out["p0"].dtype == np.int64 and out["p0"].shape == (1000,)
    assert out["p1"].shape == (5,)
    assert (out["p0"] != values["p0"]).mean() > 0.9  # P(Z = 0) ≈ 0.04 at σ = 10
    assert values["p0"][3] == 3  # input untouched


def test_sample_gaussian_statistics():
    # 100,000 draws of N_Z(0, σ²), σ = 10 (the discrete Gaussian's variance is below σ² by a
    # negligible e^{-Θ(σ²)} term for σ ≥ 1, CKS20). mean: |m| < 5·σ/√n = 0.158; std within 2 %.
    cal = calibrate({"p0": (1, 1)}, mechanism="gaussian", scales={"p0": 10.0})
    noise = sample(cal, {"p0": np.zeros(100_000, dtype=np.int64)})["p0"]
    assert abs(noise.mean()) < 5 * 10 / math.sqrt(100_000)
    assert noise.std() == pytest.approx(10.0, rel=0.02)


def test_sample_laplace_statistics():
    # Discrete Laplace b = 5: variance 2q/(1 − q)², q = e^{-1/5} (sum of the geometric pmf).
    q = math.exp(-1 / 5)
    var = 2 * q / (1 - q) ** 2
    cal = calibrate({"p0": (1, 1)}, mechanism="laplace", scales={"p0": 5.0})
    noise = sample(cal, {"p0": np.full(100_000, 7, dtype=np.int64)})["p0"] - 7
    assert abs(noise.mean()) < 5 * math.sqrt(var / 100_000)
    assert noise.var() == pytest.approx(var, rel=0.04)


def test_sample_parallel_slices_keep_order():
    # ≥ 8,192 cells go through parallel slices: each cell must stay at its position.
    n = 50_000
    values = np.arange(n, dtype=np.int64) * 1_000
    cal = calibrate({"p0": (1, 1)}, mechanism="gaussian", scales={"p0": 1.0})
    out = sample(cal, {"p0": values})["p0"]
    assert np.abs(out - values).max() < 20  # P(|Z| ≥ 20) at σ = 1 is ~1e-87


def test_sample_accepts_python_int_objects_and_unsigned():
    cal = calibrate({"p0": (1, 1)}, mechanism="gaussian", scales={"p0": 1.0})
    obj = np.array([1, 2**40, -3], dtype=object)
    assert sample(cal, {"p0": obj})["p0"].dtype == np.int64
    assert sample(cal, {"p0": np.array([1, 2], dtype=np.uint32)})["p0"].shape == (2,)
    assert sample(cal, {"p0": np.array([], dtype=np.int64)})["p0"].shape == (0,)
    # Read-only arrays (the engine's zero-copy Arrow results) and strided views work too.
    ro = np.arange(10, dtype=np.int64)
    ro.flags.writeable = False
    assert sample(cal, {"p0": ro})["p0"].shape == (10,)
    assert sample(cal, {"p0": np.arange(20, dtype=np.int64)[::2]})["p0"].shape == (10,)


@pytest.mark.parametrize(
    "values, clamped",
    [
        (np.array([2**62 + 1, -(2**62) - 1, 5], dtype=np.int64), [2**62, -(2**62), 5]),
        (np.array([-(2**63), 2**63 - 1], dtype=np.int64), [-(2**62), 2**62]),
        (np.array([2**64 - 1, 3], dtype=np.uint64), [2**62, 3]),
        (np.array([2**100, -(2**127), 4], dtype=object), [2**62, -(2**62), 4]),  # HUGEINT sums
    ],
)
def test_sample_clamps_exact_values_beyond_2_62(values, clamped):
    # Issue 9 item 1: an exact aggregate beyond ±2^62 is clamped before the noise (a
    # contraction: the sensitivity is unchanged), never refused — a refusal after the charge
    # would publish, without noise, that the exact value crossed 2^62.
    cal = calibrate({"p0": (1, 1)}, mechanism="gaussian", scales={"p0": 1.0})
    out = sample(cal, {"p0": values})["p0"]
    assert out.dtype == np.int64
    assert np.abs(out - np.array(clamped, dtype=np.int64)).max() < 20  # σ = 1


@settings(max_examples=200, deadline=None)
@given(a=st.integers(-(2**130), 2**130), b=st.integers(-(2**130), 2**130))
def test_the_clamp_is_a_contraction(a, b):
    # |c(a) − c(b)| ≤ |a − b|: the clamp cannot raise a sensitivity (checked on the exact
    # values the sampler would noise, by setting the noise to an exact primitive, scale 0).
    cal = calibrate({"p0": (0.0, 0.0)}, mechanism="gaussian", rho=1.0)
    ca, cb = (int(sample(cal, {"p0": np.array([v], dtype=object)})["p0"][0]) for v in (a, b))
    assert abs(ca - cb) <= abs(a - b)
    assert abs(ca) <= mechanisms.MAX_ABS_VALUE


@pytest.mark.parametrize(
    "values",
    [
        np.array([1.5, 2.0]),
        np.array([True, False]),
        np.array([1, None], dtype=object),
        np.array([[1, 2]], dtype=np.int64),
    ],
)
def test_sample_refuses_bad_values(values):
    cal = calibrate({"p0": (1, 1)}, mechanism="gaussian", scales={"p0": 1.0})
    with pytest.raises(MechanismError):
        sample(cal, {"p0": values})


def test_sample_refuses_mismatched_primitives():
    cal = calibrate({"p0": (1, 1)}, mechanism="gaussian", scales={"p0": 1.0})
    with pytest.raises(MechanismError):
        sample(cal, {"p1": np.zeros(1, dtype=np.int64)})
    with pytest.raises(MechanismError):
        sample(cal, {"p0": np.zeros(1, dtype=np.int64), "p1": np.zeros(1, dtype=np.int64)})


# --- ci95 --------------------------------------------------------------------------------------


def _exact_dg_halfwidth(sigma: float) -> int:
    """Independent: smallest t with P(|Z| ≤ t) ≥ 0.95 for N_Z(0, σ²), by summing the pmf."""
    x = np.arange(0, int(math.ceil(14 * sigma)) + 2, dtype=float)
    w = np.exp(-x * x / (2 * sigma * sigma))
    total = w[0] + 2 * w[1:].sum()
    cdf = (w[0] + 2 * np.concatenate([[0.0], np.cumsum(w[1:])])) / total
    return int(np.argmax(cdf >= 0.95))


def _exact_dl_halfwidth(b: float) -> int:
    """Independent: the same for the discrete Laplace, by summing its pmf ∝ e^{-|x|/b}."""
    x = np.arange(0, int(math.ceil(60 * b)) + 2, dtype=float)
    w = np.exp(-x / b)
    total = w[0] + 2 * w[1:].sum()
    cdf = (w[0] + 2 * np.concatenate([[0.0], np.cumsum(w[1:])])) / total
    return int(np.argmax(cdf >= 0.95))


@pytest.mark.parametrize("sigma", [0.2, 0.5, 1.0, 2.5, 10.0, 37.3, 100.0, 1234.5, 9999.0,
                                   10_001.0, 12_345.6, 54_321.0])
def test_ci95_discrete_gaussian_exact(sigma):
    # Includes σ just above the 10^4 switch to the continuity-corrected normal quantile.
    assert ci95_halfwidth("gaussian", sigma) == _exact_dg_halfwidth(sigma)
    assert ci95_halfwidth("discrete_gaussian", sigma) == _exact_dg_halfwidth(sigma)


def test_ci95_large_sigma_is_close_to_1_96_sigma():
    assert ci95_halfwidth("gaussian", 1e9) == pytest.approx(1.959964 * 1e9, rel=1e-6)


@pytest.mark.parametrize("b", [0.05, 0.27, 0.5, 1.0, 2.0, 6.0, 33.5, 100.0, 2500.0])
def test_ci95_discrete_laplace_exact(b):
    assert ci95_halfwidth("laplace", b) == _exact_dl_halfwidth(b)


@pytest.mark.parametrize("b", [0.5, 1.0, 7.0, 1e3, 1e6])
def test_ci95_discrete_laplace_agrees_with_opendp(b):
    # OpenDP's accuracy a satisfies P(|Z| ≥ a) = 0.05 (real a); the integer half-width is ⌈a⌉ − 1.
    a = dp.discrete_laplacian_scale_to_accuracy(b, 0.05)
    assert ci95_halfwidth("laplace", b) == max(0, math.ceil(a) - 1)


def test_ci95_errors():
    assert ci95_halfwidth("gaussian", 0.0) == 0.0  # an exact primitive
    with pytest.raises(MechanismError):
        ci95_halfwidth("gaussian", -1.0)
    with pytest.raises(MechanismError):
        ci95_halfwidth("laplace", math.nan)
    with pytest.raises(InvalidRequest):
        ci95_halfwidth("cauchy", 1.0)


@pytest.mark.parametrize("mech", ["gaussian", "laplace"])
@pytest.mark.parametrize("target", [0, 1, 2.7, 10, 196, 2420, 19_600, 1e6])
def test_sigma_for_ci95_is_the_largest_scale_meeting_the_target(mech, target):
    s = sigma_for_ci95(mech, target)
    assert ci95_halfwidth(mech, s) <= target
    assert ci95_halfwidth(mech, s * (1 + 1e-9)) > target  # any more noise misses the target


@pytest.mark.parametrize("mech", ["gaussian", "laplace"])
@pytest.mark.parametrize("target", [1e17, 1e20, 1e62, 1e300])
def test_sigma_for_ci95_of_a_huge_target_is_the_largest_scale_and_fast(mech, target):
    # A ci95 of 1 in a column of resolution 1e-62 is a target of 1e62 integer units. The
    # search used to walk the Laplace tail one integer at a time there (a request that hung
    # before its charge); the most noise 64-bit samplers carry (2^52) already meets it.
    assert sigma_for_ci95(mech, target) == mechanisms.MAX_SCALE
    cal = calibrate({"p0": (1.0, 1.0)}, mechanism=mech, scales={"p0": sigma_for_ci95(mech, target)})
    assert cal.scales["p0"] == 2.0**52


def test_sigma_for_ci95_errors():
    for bad in (-1.0, math.nan, math.inf, "x"):
        with pytest.raises(InvalidBudget):
            sigma_for_ci95("gaussian", bad)


def test_calibration_ci95_halfwidths():
    cal = calibrate({"p0": (1, 1)}, mechanism="gaussian", scales={"p0": 1.0})
    # N_Z(0, 1): P(|Z| ≤ 1) ≈ 0.79, P(|Z| ≤ 2) ≈ 0.96 → t = 2.
    assert cal.ci95_halfwidths() == {"p0": 2.0}


def test_mechanisms_module_has_no_import_time_side_effects():
    # Importing dpgate.mechanisms must not enable OpenDP's "contrib" features (global state):
    # in a fresh interpreter, building a measurement right after the import still fails.
    code = (
        "import dpgate.mechanisms, opendp.prelude as dp\n"
        "try:\n"
        "    dp.m.make_gaussian(dp.atom_domain(T='i64'), dp.absolute_distance(T='f64'), scale=1.0)\n"
        "except Exception as e:\n"
        "    print('refused', type(e).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("refused"), out.stdout + out.stderr
