"""Partition selection at scale (issue 25 item 2): the threshold mechanism on NumPy vectors, in chunks.

:func:`dpgate.mechanisms.selection.threshold_select` draws each candidate's noise with OpenDP's vector
sampler a chunk at a time (over threads) and keeps noisy counts ≥ T; the reference is OpenDP's
own threshold measurement on a dict of every candidate
(:func:`~dpgate.mechanisms.selection.threshold_select_opendp_map`, the pre-issue-25 code). Checked here:

* bookkeeping: with the noise replaced by zero, the released positions are exactly the counts
  ≥ T, for any chunk size and thread count (hypothesis);
* fixed-threshold behaviour: keys ≥ 12σ above T always kept, keys ≥ 7σ below never, at the
  right positions across chunk borders, with the noise's mean and variance;
* same distribution as OpenDP's threshold measurement: per exact count near T, the release rate
  of both paths within 5 binomial standard deviations of the exact tail P[c + Z ≥ T]
  (:meth:`~dpgate.mechanisms.selection.SelectionCalibration.release_probability`, computed from the
  discrete distributions' mass functions, not from OpenDP), and of each other;
* the released noisy values of both paths fit the exact conditional tail law P[Z = z | Z ≥ s]
  (χ² goodness of fit against the mass functions, Gaussian and Laplace);
* the calibration (T, ρ/ε, δ) is the one OpenDP's threshold map gives for the whole histogram;
* end to end, the gateway hands the mechanism exactly the candidates' unit-count histogram (one
  entry per candidate, key order) and releases exactly the candidates it keeps, with its values.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from dpgate.mechanisms import selection as mechanisms
from dpgate.mechanisms.selection import (
    ThresholdRelease,
    calibrate_selection,
    threshold_select,
    threshold_select_opendp_map,
)


class _ZeroNoise:
    """Stands in for OpenDP's vector measurement: returns its input (no noise), counts calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, arr):
        self.calls.append(len(arr))
        return np.array(arr, dtype=np.int64)


@settings(max_examples=60, deadline=None)
@example(counts=[1, 60, 1, 60, 60], chunk=2, workers=2)
@given(counts=st.lists(st.integers(1, 60), min_size=0, max_size=300),
       chunk=st.integers(1, 80), workers=st.integers(1, 4))
def test_chunk_bookkeeping_releases_exactly_the_counts_at_or_above_threshold(counts, chunk, workers):
    cal = calibrate_selection("gaussian", 3.0, 1, 1e-3)
    fake = _ZeroNoise()
    orig = mechanisms._measurement
    mechanisms._measurement = lambda mech, scale: fake
    try:
        out = threshold_select(cal, np.asarray(counts, dtype=np.int64), chunk=chunk, workers=workers)
    finally:
        mechanisms._measurement = orig
    arr = np.asarray(counts, dtype=np.int64)
    expect = np.flatnonzero(arr >= cal.threshold)
    assert isinstance(out, ThresholdRelease)
    assert out.index.dtype == np.int64 and out.noisy.dtype == np.int64
    np.testing.assert_array_equal(out.index, expect)
    np.testing.assert_array_equal(out.noisy, arr[expect])
    assert sorted(fake.calls) == sorted([min(chunk, len(arr) - lo) for lo in range(0, len(arr), chunk)])


def test_far_above_always_kept_far_below_never_across_chunks():
    """σ = 5, k = 3, δ = 1e-12: 30,000 keys, every third one 12σ above T (P[dropped] < 1e-32 each),
    the rest at one unit (T − 1 ≥ 7σ: P[released] < 2e-12 each). Chunks of 997 over 3 threads."""
    cal = calibrate_selection("gaussian", 5.0, 3, 1e-12)
    T, sigma = cal.threshold, cal.scale
    assert T - 1 >= 7 * sigma
    n = 30_000
    counts = np.ones(n, dtype=np.int64)
    high = np.arange(0, n, 3)
    counts[high] = T + 60
    out = threshold_select(cal, counts, chunk=997, workers=3)
    np.testing.assert_array_equal(out.index, high)
    assert (out.noisy >= T).all()
    z = out.noisy - counts[high]  # the noise of the kept keys (no truncation this far above T)
    m = z.size
    assert abs(z.mean()) <= 5 * sigma / math.sqrt(m)
    # variance of the discrete Gaussian with σ = 5 is σ² within 1e-100 (CKS20 Prop. 19 / Cor. 9)
    assert abs(z.var() - sigma**2) <= 5 * sigma**2 * math.sqrt(2 / m)


def test_same_release_rates_as_opendp_threshold_measurement():
    """Counts T − 3 … T + 3, 6,000 keys each, through both paths (Gaussian σ = 2 and Laplace b = 2):
    each path's released fraction per count is within 5 binomial sd of the exact P[c + Z ≥ T],
    and the two paths within 5 sd of each other (false failure < 1e-5 over all checks)."""
    for mech in ("gaussian", "laplace"):
        cal = calibrate_selection(mech, 2.0, 1, 1e-3)
        T = cal.threshold
        per = 6000
        levels = np.arange(T - 3, T + 4, dtype=np.int64)
        counts = np.tile(levels, per)  # interleaved: every chunk holds every level
        new = threshold_select(cal, counts, chunk=4096, workers=2)
        ref = threshold_select_opendp_map(cal, counts)
        for rel in (new, ref):
            assert (np.diff(rel.index) > 0).all() and (rel.noisy >= T).all()
        for c in levels:
            p = cal.release_probability(int(c))
            sd = math.sqrt(p * (1 - p) / per)
            rate_new = float((counts[new.index] == c).sum()) / per
            rate_ref = float((counts[ref.index] == c).sum()) / per
            assert abs(rate_new - p) <= 5 * sd, (mech, int(c), rate_new, p)
            assert abs(rate_ref - p) <= 5 * sd, (mech, int(c), rate_ref, p)
            assert abs(rate_new - rate_ref) <= 5 * math.sqrt(2) * sd


def test_released_noisy_values_have_the_reference_distribution():
    """Keys exactly at T (half are released): the released noisy values' mean from both paths is
    within 5 standard errors of each other (Gaussian σ = 3, 8,000 keys per path)."""
    cal = calibrate_selection("gaussian", 3.0, 1, 1e-2)
    counts = np.full(8000, cal.threshold, dtype=np.int64)
    a = threshold_select(cal, counts, chunk=1000, workers=2).noisy.astype(float)
    b = threshold_select_opendp_map(cal, counts).noisy.astype(float)
    se = math.sqrt(a.var() / a.size + b.var() / b.size)
    assert abs(a.mean() - b.mean()) <= 5 * se
    assert a.min() >= cal.threshold and b.min() >= cal.threshold


def _tail_pmf(mech: str, scale: float, lo: int, hi: int) -> np.ndarray:
    """P[Z = z | Z ≥ lo] for z = lo … hi − 1, then P[Z ≥ hi | Z ≥ lo] (last cell), by direct
    summation of the unnormalised mass functions: discrete Gaussian exp(−z²/2σ²) ([CKS20] Def. 1),
    discrete Laplace q^|z|, q = e^{−1/b} ([GRS12]); the tail beyond lo + 60·scale is < 1e-300."""
    zs = np.arange(lo, lo + int(60 * scale) + 60, dtype=np.float64)
    w = np.exp(-(zs * zs) / (2 * scale * scale)) if mech == "gaussian" else np.exp(-np.abs(zs) / scale)
    w = w / w.sum()
    cells = w[: hi - lo]
    return np.append(cells, w[hi - lo:].sum())


@pytest.mark.parametrize("mech, scale", [("gaussian", 3.0), ("laplace", 2.0)])
def test_released_values_follow_the_exact_tail_distribution(mech, scale):
    """Issue 25 item 2, the distribution check of the whole output of one key: keys held by
    T − 2 units are released iff Z ≥ 2, with noisy value T − 2 + Z. For both paths (chunks over
    threads; OpenDP's own map measurement) the released values' histogram over z = 2 … 9 and
    ≥ 10 fits the exact conditional law P[Z = z | Z ≥ 2] (computed above from the mass
    functions, not from OpenDP): χ² goodness of fit, p > 1e-6 each (false failure < 4e-6)."""
    from scipy.stats import chisquare

    cal = calibrate_selection(mech, scale, 1, 1e-2)
    c = cal.threshold - 2
    counts = np.full(20_000, c, dtype=np.int64)
    pmf = _tail_pmf(mech, scale, 2, 10)
    for rel in (threshold_select(cal, counts, chunk=3000, workers=2), threshold_select_opendp_map(cal, counts)):
        z = rel.noisy - c
        assert z.min() >= 2 and rel.index.size > 1000
        observed = np.append(np.bincount(z[z < 10] - 2, minlength=8), (z >= 10).sum())
        assert chisquare(observed, pmf * z.size).pvalue > 1e-6, (mech, observed.tolist())


@pytest.mark.parametrize("mech", ["gaussian", "laplace"])
def test_calibration_is_opendp_threshold_map_for_whole_histogram(mech):
    """T, the ρ/ε and the δ charged are OpenDP's threshold map for the whole histogram at
    (ℓ0, ℓ2|ℓ1, ℓ∞) = (k, √k|k, 1), evaluated once (δ at T − 1, the issue #2922 workaround);
    the chunked sampler does not touch them."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    k, scale, delta = 3, 4.0, 1e-7
    cal = calibrate_selection(mech, scale, k, delta)
    domain = dp.map_domain(dp.atom_domain(T="i64"), dp.atom_domain(T="i64"))
    if mech == "gaussian":
        make = lambda t: dp.m.make_gaussian_threshold(  # noqa: E731
            domain, dp.l02inf_distance(dp.absolute_distance(T="f64")), scale=scale, threshold=t)
        d_in = (k, math.sqrt(k), 1.0)
    else:
        make = lambda t: dp.m.make_laplace_threshold(  # noqa: E731
            domain, dp.l01inf_distance(dp.absolute_distance(T="f64")), scale=scale, threshold=t)
        d_in = (k, float(k), 1.0)
    cost, got = make(cal.threshold - 1).map(d_in)
    assert (cal.cost, cal.delta) == (float(cost), float(got))
    assert got <= delta < make(cal.threshold - 2).map(d_in)[1]


def test_empty_and_bad_counts():
    cal = calibrate_selection("gaussian", 3.0, 1, 1e-3)
    out = threshold_select(cal, np.zeros(0, dtype=np.int64))
    assert len(out) == 0 and out.index.dtype == np.int64
    with pytest.raises(mechanisms.MechanismError):
        threshold_select(cal, np.array([1.5, 2.0]))


def test_gateway_hands_the_mechanism_the_exact_histogram_and_releases_its_choice(tmp_path, monkeypatch):
    """End to end (issue 25 item 2): the pipeline calls the threshold mechanism once, with one
    entry per candidate (key order) holding that candidate's exact number of distinct units —
    computed here by counting authors in Python (no author holds more than k = 2 keys, so the
    bounding drops none; duplicate rows of one author count once) — and releases exactly the
    candidates the mechanism keeps, with its noisy counts (COUNT(*) at m = 1 is the unit count,
    reused). The mechanism is a deterministic stand-in (keeps every other candidate, noisy =
    count + 1000), so the released rows are known exactly: the NumPy path loses, reorders or
    duplicates no candidate."""
    from dpgate import partition_selection as pipeline_selection
    from tests.test_partition_selection import open_gateway

    rows, holders = [], {}
    for j in range(12):
        key = f"g{j:02d}"
        for u in range(j + 1):
            rows.append((f"a{j}_{u}", key, "eu", 1))
            holders.setdefault(key, set()).add(f"a{j}_{u}")
        rows.append((f"a{j}_0", key, "us", 2))  # a second row of one author: still one unit
    rows += [("x", "g00", "eu", 3), ("x", "g01", "eu", 3)]  # one author in two keys (k = 2)
    holders["g00"].add("x")
    holders["g01"].add("x")
    expected = [len(holders[key]) for key in sorted(holders)]

    calls: list[np.ndarray] = []

    def stand_in(cal, counts):
        counts = np.asarray(counts, dtype=np.int64)
        calls.append(counts.copy())
        index = np.arange(0, counts.size, 2, dtype=np.int64)
        return ThresholdRelease(index, counts[index] + 1000)

    monkeypatch.setattr(pipeline_selection, "threshold_select", stand_in)
    gw = open_gateway(tmp_path, rows, k=2, m=1, rho=0.2)
    try:
        r = gw.query("posts", "SELECT ngram, COUNT(*) AS n FROM posts GROUP BY ngram", consumer="default")
    finally:
        gw.close()
    assert len(calls) == 1 and calls[0].tolist() == expected
    keys = sorted(holders)
    assert [row[0] for row in r["rows"]] == keys[::2]
    assert [row[1] for row in r["rows"]] == [c + 1000 for c in expected[::2]]
    assert r["partition_selection"]["counts_from_selection"] == ["p0"]
