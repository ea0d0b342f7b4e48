"""Empirical privacy audit of the noise step on a real neighbouring pair of datasets.

d1.csv and d2.csv (../shared/data/smartnoise) differ by one user, A867, who has one row:
the released count (rows, or distinct users) differs by exactly 1 = the sensitivity.

For a claimed guarantee we run the mechanism many times on each dataset (one vector of
100,000 copies of the count through the same OpenDP measurement: i.i.d. draws), pick a
threshold test "output ≥ T ⇒ d1" on a *separate* selection sample, and on fresh samples
compute a Clopper–Pearson lower bound on ε at confidence 1 − α, α = 1e-6
(Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning",
NeurIPS 2020, §3; Nasr et al. 2021, Eq. 3):

    pure ε:      ε_lb = ln(TPR_lb / FPR_ub)
    (ε, δ):      ε_lb = ln((TPR_lb − δ) / FPR_ub)

with TPR_lb the lower (α/2) CP bound of P[M(d1) ≥ T], FPR_ub the upper (α/2) CP bound of
P[M(d2) ≥ T]. A correct mechanism gives ε_lb ≤ ε except with probability ≤ α. Each audit
is also run with the noise scale deliberately halved (twice the true ε for the Laplace,
4× the ρ for the Gaussian) and must then detect the violation (ε_lb > claimed ε):
the test can fail in both directions.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from scipy.stats import beta

from dpgate import accounting
from dpgate.mechanisms import calibrate, sample
from tests.shared_data import smartnoise_dir

DATA = smartnoise_dir()
N = 100_000  # draws per dataset for the bound
N_SELECT = 10_000  # draws per dataset to choose the threshold (a separate sample)
ALPHA = 1e-6

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def counts() -> dict[str, tuple[int, int]]:
    if not (DATA / "d1.csv").exists():
        pytest.skip("../shared/data not present")
    out = {}
    for name in ("d1", "d2"):
        with open(DATA / f"{name}.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        out[name] = (len(rows), len({r["UserId"] for r in rows}))
    # The neighbouring pair: one user (A867, one row) removed.
    assert out["d1"][0] - out["d2"][0] == 1 and out["d1"][1] - out["d2"][1] == 1
    return out


def _draws(cal, value: int, n: int = N) -> np.ndarray:
    return sample(cal, {"p0": np.full(n, value, dtype=np.int64)})["p0"]


def _cp_lower(k: int, n: int, a: float) -> float:
    return 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))


def _cp_upper(k: int, n: int, a: float) -> float:
    return 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))


def _epsilon_lb(x1: np.ndarray, x2: np.ndarray, threshold: int, delta: float) -> float:
    tpr_lb = _cp_lower(int((x1 >= threshold).sum()), len(x1), ALPHA / 2)
    fpr_ub = _cp_upper(int((x2 >= threshold).sum()), len(x2), ALPHA / 2)
    if tpr_lb - delta <= 0:
        return 0.0
    return max(0.0, math.log((tpr_lb - delta) / fpr_ub))


def audit(cal, c1: int, c2: int, delta: float) -> float:
    """ε lower bound of the test "output ≥ T", T chosen on a separate selection sample."""
    sel1, sel2 = _draws(cal, c1, N_SELECT), _draws(cal, c2, N_SELECT)
    candidates = range(int(np.percentile(sel2, 1)), int(sel1.max()) + 1)
    threshold = max(candidates, key=lambda t: _epsilon_lb(sel1, sel2, t, delta))
    return _epsilon_lb(_draws(cal, c1), _draws(cal, c2), threshold, delta)


def test_audit_discrete_laplace_pure_epsilon(counts):
    # COUNT(*) with m = 1: Δ1 = 1. Claimed ε = 1 → b = 1. The likelihood ratio of the
    # discrete Laplace tail is exactly e^ε, so the bound approaches but cannot exceed 1.
    (c1, _), (c2, _) = counts["d1"], counts["d2"]
    epsilon = 1.0
    cal = calibrate({"p0": (1.0, 1.0)}, mechanism="laplace", epsilon=epsilon)
    assert cal.scales["p0"] == pytest.approx(1.0)
    lb = audit(cal, c1, c2, delta=0.0)
    assert 0.5 < lb <= epsilon  # tight enough to be meaningful, never above the claim

    # Halved noise (b = 0.5) really is 2-DP: the audit must catch the false claim of ε = 1.
    broken = calibrate({"p0": (1.0, 1.0)}, mechanism="laplace", scales={"p0": cal.scales["p0"] / 2})
    assert audit(broken, c1, c2, delta=0.0) > epsilon


def test_audit_discrete_gaussian_epsilon_delta(counts):
    # COUNT(DISTINCT UserId): Δ2 = 1. Claimed ρ = 0.5 → σ = 1; at δ = 1e-3 the published
    # ε is the CKS conversion ε(ρ = 0.5, δ = 1e-3) ≈ 3.54 (accounting.zcdp_epsilon_tight).
    (_, u1), (_, u2) = counts["d1"], counts["d2"]
    delta = 1e-3
    cal = calibrate({"p0": (1.0, 1.0)}, mechanism="gaussian", rho=0.5)
    assert cal.scales["p0"] == pytest.approx(1.0)
    claimed = accounting.zcdp_epsilon_tight(cal.rho, delta)
    assert claimed == pytest.approx(3.54, abs=0.01)
    lb = audit(cal, u1, u2, delta)
    assert 1.0 < lb <= claimed

    # Halved σ (ρ = 2): a single threshold test already shows ε > 3.54 at δ = 1e-3
    # (expected ≈ 5.1 from the exact pmf).
    broken = calibrate({"p0": (1.0, 1.0)}, mechanism="gaussian", scales={"p0": cal.scales["p0"] / 2})
    assert audit(broken, u1, u2, delta) > claimed
