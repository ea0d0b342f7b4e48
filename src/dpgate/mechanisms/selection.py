"""The selection mechanisms of dpgate, all OpenDP's: the threshold mechanism of private partition
selection (:func:`threshold_select`, :func:`calibrate_selection`), report-noisy-max for quantiles
(:func:`noisy_argmin`, :func:`noisy_max_cost`) and the noisy top-k (:func:`select_top_k`,
:func:`top_k_rho`). Split from :mod:`dpgate.mechanisms` (the noise step of released aggregates),
whose helpers it uses; that package never imports this module (no cycle). References: as
:mod:`dpgate.mechanisms`, and in the comments below.
"""

from __future__ import annotations

import math
import os
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import opendp.prelude as dp

from dpgate.errors import InvalidBudget, MechanismError
from dpgate.mechanisms import (
    MAX_ABS_VALUE,
    MechanismName,
    _check_map,
    _check_scale,
    _clamped_int64,
    _enable_contrib,
    _measurement,
    mechanism_name,
)

__all__ = [
    "noisy_max_within",
    "SelectionCalibration",
    "ThresholdRelease",
    "calibrate_selection",
    "select_top_k",
    "threshold_select",
    "top_k_rho",
    "noisy_argmin",
    "noisy_max_cost",
    "opendp_quantile_oracle",
    "threshold_select_opendp_map",
]


# --- private partition selection: OpenDP's threshold mechanisms (issue 11) ----------------------
#
# The per-key counts of distinct privacy units (after each unit is cut to at most k keys) get
# OpenDP's discrete Gaussian or discrete Laplace noise, and only the keys whose noisy count
# reaches a threshold T (≥ T) are released, with those noisy counts ("propose-test-release" on a
# histogram over an unknown key domain). The measurement and its privacy map are OpenDP's:
# ``make_gaussian_threshold`` (output measure approximate zCDP: (ρ, δ)) and
# ``make_laplace_threshold`` (approximate DP: (ε, δ)), whose proofs are OpenDP's proof documents
# (docs.opendp.org/en/v0.16.0/proofs/rust/src/measurements/noise_threshold/…: the privacy maps
# ``NoiseThresholdPrivacyMap`` for ZExpFamily<1> and ZExpFamily<2>), following
# [Rog23] R. Rogers, "A Unifying Privacy Analysis Framework for Unknown Domain Algorithms in
#        Differential Privacy", arXiv:2309.09170, 2023. The δ part is a union bound over the ≤ ℓ0
#        keys that only the larger neighbour has: δ = 1 − (1 − P[ℓ∞ + Z ≥ T])^ℓ0 ≤ ℓ0·P[ℓ∞ + Z ≥ T]
#        (a key is released iff its noisy count is ≥ T); the ρ (ε) part is the Gaussian (Laplace)
#        mechanism's on the counts ([CKS20] Thm. 4; [GRS12]).
# The input distance is (ℓ0, ℓ2 or ℓ1, ℓ∞) = (k, √k or k, 1): one unit is counted once in each of
# at most k keys. Threshold T is the smallest integer whose δ is ≤ δ_q.
#
# OpenDP 0.16 off-by-one (opendp/opendp issue #2922, open): the measurements keep a key whose
# noisy count is ≥ T, but their privacy map bounds P[ℓ∞ + Z > T], missing the mass at exactly T
# (measured: a one-unit key passes T = 3, b = 1 with probability 0.099, the map says δ = 0.036).
# dpgate samples the mechanism at threshold T (OpenDP's vector sampler per chunk and the test
# noisy ≥ T, the same function as the measurement's: :func:`threshold_select`) and charges the δ
# of OpenDP's map for the same measurement at threshold T − 1, which is P[ℓ∞ + Z > T − 1] = P[ℓ∞ + Z ≥ T]: exactly the
# release probability the union bound needs (tests/test_selection.py measures it). The ρ/ε part
# of the map does not depend on T.

#: Largest threshold searched (a δ_q so small that no threshold up to this meets it is refused).
_MAX_THRESHOLD = 2**52


@dataclass(frozen=True)
class SelectionCalibration:
    """The calibrated threshold mechanism of one private partition selection.

    Attributes:
        mechanism: ``"discrete_gaussian"`` or ``"discrete_laplace"``.
        scale: σ (Gaussian) or b (Laplace) of the noise on each key's unit count.
        threshold: T: a key is released iff its noisy count of units is ≥ T.
        groups: ℓ0 = k, the most keys one unit is counted in.
        cost: ρ (Gaussian, zCDP part) or ε (Laplace) from OpenDP's privacy map.
        delta: δ charged: OpenDP's privacy map at threshold T − 1 (≤ the requested δ_q;
            the OpenDP issue #2922 workaround, module comments).
        d_in: the (ℓ0, ℓ2|ℓ1, ℓ∞) input distance the map was evaluated at.
    """

    mechanism: MechanismName
    scale: float
    threshold: int
    groups: int
    cost: float
    delta: float
    d_in: tuple[int, float, float]

    def release_probability(self, units: int) -> float:
        """P[a key held by ``units`` units is released] = P[units + Z ≥ T] (Z the noise)."""
        return _tail_above(self.mechanism, self.scale, self.threshold - int(units) - 1)

    def units_needed(self, probability: float) -> int:
        """Smallest number of units a key needs to be released with at least ``probability``."""
        lo, hi = 0, max(1, self.threshold)
        while self.release_probability(hi) < probability:
            hi *= 2
        while lo < hi:
            mid = (lo + hi) // 2
            if self.release_probability(mid) >= probability:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def describe(self) -> dict:
        """JSON-ready summary for releases and explain."""
        gaussian = self.mechanism == "discrete_gaussian"
        return {
            "mechanism": "gaussian_threshold" if gaussian else "laplace_threshold",
            ("sigma" if gaussian else "scale"): self.scale,
            "threshold": self.threshold,
            "released_if": f"noisy count of distinct units >= {self.threshold}",
            "max_keys_per_unit": self.groups,
            ("rho" if gaussian else "epsilon"): self.cost,
            "delta": self.delta,
            "units_for_50pct": self.units_needed(0.5),
            "units_for_95pct": self.units_needed(0.95),
        }


def _tail_above(mech: MechanismName, scale: float, t: int) -> float:
    """P[Z > t] for the discrete Gaussian (σ = scale) or discrete Laplace (b = scale) Z."""
    if mech == "discrete_laplace":
        q = math.exp(-1.0 / scale)
        # P(Z = x) = (1−q)/(1+q)·q^|x| ([GRS12]); P(Z ≥ s) = q^s/(1+q) for s ≥ 1, symmetric.
        if t >= 0:
            return q ** (t + 1) / (1 + q)
        return 1.0 - q ** (-t) / (1 + q)
    # discrete Gaussian: exact sums of exp(−x²/2σ²) over a ±40σ window (the rest < 1e-300)
    width = int(math.ceil(40 * scale)) + 2
    if width > 5_000_000:  # large σ: the continuous normal is within O(1/σ) of it
        return statistics.NormalDist(0.0, scale).cdf(-(t + 0.5))
    xs = np.arange(-width, width + 1, dtype=np.float64)
    w = np.exp(-(xs * xs) / (2.0 * scale * scale))
    return float(w[xs > t].sum() / w.sum())


def _threshold_measurement(mech: MechanismName, scale: float, threshold: int):
    """OpenDP's threshold measurement on maps (i64 key index → i64 unit count)."""
    _enable_contrib()
    domain = dp.map_domain(dp.atom_domain(T="i64"), dp.atom_domain(T="i64"))
    try:
        if mech == "discrete_gaussian":
            return dp.m.make_gaussian_threshold(domain, dp.l02inf_distance(dp.absolute_distance(T="f64")),
                                                scale=float(scale), threshold=int(threshold))
        return dp.m.make_laplace_threshold(domain, dp.l01inf_distance(dp.absolute_distance(T="f64")),
                                           scale=float(scale), threshold=int(threshold))
    except dp.OpenDPException as e:  # pragma: no cover - guarded by our own checks
        raise MechanismError(f"OpenDP refused the threshold measurement: {e}") from None


def _selection_d_in(mech: MechanismName, groups: int) -> tuple[int, float, float]:
    return (int(groups), math.sqrt(groups) if mech == "discrete_gaussian" else float(groups), 1.0)


def calibrate_selection(mechanism: str, scale: float, groups: int, delta: float) -> SelectionCalibration:
    """The smallest integer threshold T whose OpenDP privacy map gives δ ≤ ``delta``.

    Args:
        mechanism: ``gaussian``/``laplace`` (or the ``discrete_*`` names).
        scale: σ or b of the noise on each key's count of units (from :func:`calibrate`'s
            share for the selection), > 0.
        groups: ℓ0 = k, the most keys one privacy unit is counted in (≥ 1).
        delta: δ_q, the δ this selection may spend, in (0, 1).

    Returns:
        A :class:`SelectionCalibration` whose ``cost`` (ρ or ε) and ``delta`` are OpenDP's map
        at (ℓ0, ℓ2|ℓ1, ℓ∞) = (k, √k|k, 1), the δ taken at threshold T − 1 (OpenDP issue
        #2922: the measurement keeps noisy counts ≥ T).

    Raises:
        InvalidBudget: ``delta`` not in (0, 1), or so small that no threshold ≤ 2^52 meets it.
        MechanismError: OpenDP failed, or its ρ/ε disagrees with Δ2²/(2σ²) or Δ1/b.
    """
    mech = mechanism_name(mechanism)
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and 0 < delta < 1):
        raise InvalidBudget(f"the selection delta must be in (0, 1), got {delta!r}", {"delta": repr(delta)})
    if groups < 1:
        raise MechanismError("partition selection needs k ≥ 1")
    scale = _check_scale("selection", scale)
    d_in = _selection_d_in(mech, groups)

    def mapped(t: int) -> tuple[float, float]:
        # the δ of threshold t is OpenDP's map at t − 1 (issue #2922 workaround, see above)
        try:
            c, d = _threshold_measurement(mech, scale, t - 1).map(d_in)
        except dp.OpenDPException as e:
            raise MechanismError(f"OpenDP's threshold privacy map failed: {e}") from None
        return float(c), float(d)

    lo, hi = 2, 2
    while mapped(hi)[1] > delta:
        lo, hi = hi + 1, hi * 2
        if hi > _MAX_THRESHOLD:
            raise InvalidBudget(
                f"the selection delta {delta:g} is too small for noise scale {scale:.4g}: no threshold "
                "up to 2^52 meets it", {"delta": delta})
    while lo < hi:
        mid = (lo + hi) // 2
        if mapped(mid)[1] <= delta:
            hi = mid
        else:
            lo = mid + 1
    cost, got = mapped(lo)
    _check_map(mech, "selection", d_in[1], scale, cost)
    return SelectionCalibration(mech, scale, lo, int(groups), cost, got, d_in)


@dataclass(frozen=True)
class ThresholdRelease:
    """Output of the threshold mechanism: the released candidates and their noisy counts.

    Attributes:
        index: int64 vector, ascending: the positions (in the ``counts`` given to
            :func:`threshold_select`) of the candidates released.
        noisy: int64 vector aligned with ``index``: each released candidate's noisy count
            of units (every value ≥ T).
    """

    index: np.ndarray
    noisy: np.ndarray

    def __len__(self) -> int:
        return int(self.index.size)


#: Candidates per chunk of :func:`threshold_select` (bounds the memory of one OpenDP call).
_SELECTION_CHUNK = 65_536


def threshold_select(calibration: SelectionCalibration, counts: np.ndarray, *,
                     chunk: int = _SELECTION_CHUNK, workers: int | None = None) -> ThresholdRelease:
    """Run the threshold mechanism on the candidates' unit counts, in chunks over threads.

    The mechanism is OpenDP's ``make_gaussian_threshold`` / ``make_laplace_threshold``
    (calibrated, and its privacy map evaluated once for the whole histogram, by
    :func:`calibrate_selection`). Its function is, per key (OpenDP 0.16 pseudocode
    ``MakeNoiseThreshold_IBig_for_RV.py`` and ``MakeNoiseThreshold_MapDomain_for_IntExpFamily``):
    add one draw of ``ZExpFamily<P>`` with scale ``integerize_scale(scale, 0)`` (the discrete
    Gaussian, P = 2, or discrete Laplace, P = 1, sampled exactly as in [CKS20]), keep the key iff
    the noisy value is ≥ T, saturate to i64. OpenDP's vector measurement ``make_gaussian`` /
    ``make_laplace`` on ``vector_domain(atom_domain(i64))`` (:func:`_measurement`; pseudocode
    ``MakeNoise_VectorDomain_for_IntExpFamily.py``) draws the same ``ZExpFamily<P>`` noise with
    the same integerized scale independently for each coordinate and saturates the same way.
    So this function draws each candidate's noise with OpenDP's vector sampler, a chunk of
    candidates per call, and applies the fixed test ``noisy ≥ T`` in NumPy: the output — the set
    of released keys with their noisy counts — has exactly the distribution of one call of
    OpenDP's threshold measurement on the whole map, because

    * the noise is independent across keys, so cutting the candidates into chunks (and noising
      the chunks in any order, on any thread) does not change the joint distribution;
    * T, σ (or b), ρ (or ε) and δ are fixed by :func:`calibrate_selection` from (ρ or ε, δ_q,
      k) before any data is read, so no chunk sees anything computed from another chunk;
    * the privacy map is a property of that one mechanism on the whole histogram (ℓ0, ℓ2|ℓ1,
      ℓ∞) = (k, √k|k, 1), computed once; the chunks are not separate releases to compose;
    * OpenDP's map output is an unordered HashMap (shuffled); here the released keys come in
      candidate order, which is a function of the data's key values only (post-processing).

    Nothing is skipped: every candidate, however small its count, is released with positive
    probability, so each one's noise is drawn. Tests compare this with OpenDP's own threshold
    measurement (:func:`threshold_select_opendp_map`) in distribution.

    Args:
        calibration: from :func:`calibrate_selection`.
        counts: 1-D integer vector, candidate i's count of distinct units (each ≥ 1);
            clamped to ±2^62 as in :func:`sample`.
        chunk: candidates per OpenDP call (≥ 1).
        workers: threads (default: up to the CPU count, at most 8; 1 runs in this thread).

    Returns:
        A :class:`ThresholdRelease`: positions (ascending) and noisy counts of the released
        candidates.

    Raises:
        MechanismError: non-integer counts, or an OpenDP failure.
    """
    arr = _clamped_int64("selection", counts)
    empty = np.zeros(0, dtype=np.int64)
    if arr.size == 0:
        return ThresholdRelease(empty, empty.copy())
    chunk = max(1, int(chunk))
    meas = _measurement(calibration.mechanism, calibration.scale)
    threshold = int(calibration.threshold)

    def one(lo: int) -> tuple[np.ndarray, np.ndarray]:
        noisy = np.asarray(meas(arr[lo:lo + chunk]), dtype=np.int64)
        keep = np.flatnonzero(noisy >= threshold)
        return keep + lo, noisy[keep]

    starts = range(0, arr.size, chunk)
    n = workers if workers is not None else min(os.cpu_count() or 1, 8)
    n = max(1, min(int(n), len(starts)))
    try:
        if n == 1:
            parts = [one(lo) for lo in starts]
        else:
            with ThreadPoolExecutor(max_workers=n, thread_name_prefix="dpgate-select") as pool:
                parts = list(pool.map(one, starts))  # in chunk order: the index stays ascending
    except dp.OpenDPException as e:
        raise MechanismError(f"OpenDP's threshold sampler failed: {e}") from None
    return ThresholdRelease(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def threshold_select_opendp_map(calibration: SelectionCalibration, counts: np.ndarray) -> ThresholdRelease:
    """Reference: OpenDP's threshold measurement itself, one call on a Python dict of every candidate.

    The pre-issue-25 implementation (single-threaded; ~the cost of building and converting the
    dict plus the noise), kept as the oracle the tests and ``bench.partition_bench --reference``
    compare :func:`threshold_select` with. Same arguments, result and errors.
    """
    arr = _clamped_int64("selection", counts)
    meas = _threshold_measurement(calibration.mechanism, calibration.scale, calibration.threshold)
    try:
        out = meas({i: int(c) for i, c in enumerate(arr.tolist())})
    except dp.OpenDPException as e:
        raise MechanismError(f"OpenDP's threshold sampler failed: {e}") from None
    index = np.array(sorted(int(i) for i in out), dtype=np.int64)
    return ThresholdRelease(index, np.array([int(out[int(i)]) for i in index], dtype=np.int64))


# --- quantiles: OpenDP's exponential mechanism (report-noisy-max with Gumbel noise) -----------
#
# The scores are computed by dpgate.quantiles from per-candidate counts (the same integer
# scores as OpenDP's ``make_quantile_score_candidates``; a test pins the equality) and the
# selection is OpenDP's ``make_noisy_max`` (Gumbel noise ⇒ the exponential mechanism,
# McSherry & Talwar 2007), whose privacy map also gives the cost. dpgate.quantiles owns the
# rest (grid, bounding, budget split, rank error).


def _noisy_max(measure: str, scale: float):
    """OpenDP's ``make_noisy_max`` on i64 score vectors (L∞ input metric), choosing the minimum.

    ``measure``: ``"zcdp"`` (ZeroConcentratedDivergence) or ``"pure"`` (MaxDivergence).
    With Gumbel noise of scale ``scale`` it selects index i with probability
    ∝ exp(−score_i/scale) (Gumbel-max trick), and its privacy map for score
    sensitivity Δ∞ is ε = 2Δ∞/scale, or ρ = ε²/8 under zCDP (bounded-range
    conversion, Cesar & Rogers 2021 Lemma 3.2; Durfee & Rogers 2019 Lemma 3.1).
    """
    _enable_contrib()
    out = dp.zero_concentrated_divergence() if measure == "zcdp" else dp.max_divergence()
    try:
        return dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T="i64")), dp.linf_distance(T="i64"),
                                   out, scale=float(scale), negate=True)
    except dp.OpenDPException as e:  # pragma: no cover - guarded by our own checks
        raise MechanismError(f"OpenDP refused the noisy-max measurement: {e}") from None


def noisy_max_cost(measure: str, scale: float, score_sensitivity: int) -> float:
    """Cost (ρ for ``"zcdp"``, ε for ``"pure"``) of one noisy-max selection, from OpenDP's privacy map.

    Args:
        measure: ``"zcdp"`` or ``"pure"``.
        scale: Gumbel scale in score units (> 0).
        score_sensitivity: Δ∞ of the integer score vector under add/remove one unit.

    Raises:
        MechanismError: OpenDP's map fails.
    """
    meas = _noisy_max(measure, scale)
    try:
        return float(meas.map(int(score_sensitivity)))
    except dp.OpenDPException as e:
        raise MechanismError(f"OpenDP's privacy map failed: {e}") from None


def noisy_max_within(measure: str, scale: float, score_sensitivity: int, budget: float) -> tuple[float, float]:
    """``(scale, cost)``: the smallest float scale ≥ ``scale`` (within 64 ulps) whose OpenDP map
    certifies ``cost ≤ budget`` (OpenDP rounds its map upward, so the closed-form scale
    ``2Δ∞/ε`` can map a hair above the budget). ``cost`` is the map at the returned scale: the
    caller compares it with ``budget`` (it is still above it only if 64 ulps did not suffice).

    Args:
        measure: ``"zcdp"`` or ``"pure"``. scale: the closed-form Gumbel scale (score units, > 0).
        score_sensitivity: Δ∞ of the integer scores. budget: ρ (zCDP) or ε (pure) allowed.

    Raises:
        MechanismError: OpenDP's map fails.
    """
    cost = noisy_max_cost(measure, scale, score_sensitivity)
    for _ in range(64):
        if cost <= budget:
            break
        scale = math.nextafter(scale, math.inf)
        cost = noisy_max_cost(measure, scale, score_sensitivity)
    return scale, cost


# ---------------------------------------------------------------------------------------------
# Private selection (issue 15): OpenDP's noisy top-k with Gumbel noise = the exponential
# mechanism. The calibration, the Δu analysis and the release live in dpgate.selection; this
# section only builds the OpenDP measurement, reads its privacy map and samples it.
# ---------------------------------------------------------------------------------------------


def _top_k_measurement(k: int, scale: float, *, monotonic: bool, negate: bool):
    """OpenDP's ``make_noisy_top_k`` on i64 score vectors, output measure ρ-zCDP (Gumbel noise).

    With ``zero_concentrated_divergence`` OpenDP 0.16 adds Gumbel noise of ``scale`` to each
    score and returns the indices of the k largest (smallest with ``negate``): the exponential
    mechanism, k times by peeling (Durfee & Rogers 2019, "Practical Differentially Private Top-k
    Selection with Pay-what-you-get Composition", NeurIPS: one-shot Gumbel top-k has the
    distribution of k peeled exponential mechanisms). Input metric
    ``linf_distance(T=i64, monotonic=…)``: d_in bounds the change of any one score. Its privacy
    map is the bounded-range one, ρ = k·ε₁²/8 with ε₁ = c·d_in/scale (c = 1 monotonic, 2
    otherwise): the exponential mechanism is ε₁-bounded-range (Durfee & Rogers 2019, Sec. 3) and
    an ε-bounded-range mechanism is ε²/8-zCDP (Cesar & Rogers 2021, "Bounding, Concentrating,
    and Truncating", ALT, Sec. 3); k peels compose additively in ρ (Bun & Steinke 2016,
    Lemma 2.3). OpenDP's proof document of ``make_noisy_top_k`` proves the same map.
    """
    _enable_contrib()
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    try:
        meas = dp.m.make_noisy_top_k(domain, dp.linf_distance(T="i64", monotonic=bool(monotonic)),
                                     dp.zero_concentrated_divergence(), k=int(k), scale=float(scale),
                                     negate=bool(negate))
    except dp.OpenDPException as e:
        raise MechanismError(f"OpenDP refused the noisy top-k measurement: {e}") from None
    if meas.output_measure != dp.zero_concentrated_divergence():  # pragma: no cover - API guard
        raise MechanismError(f"OpenDP's noisy top-k has output measure {meas.output_measure}")
    return meas


def top_k_rho(d_in: int, k: int, scale: float, *, monotonic: bool) -> float:
    """ρ (zCDP) of OpenDP's Gumbel noisy top-k, read from its own privacy map.

    Args:
        d_in: Δu, the L∞ sensitivity of the score vector (integer units, ≥ 0).
        k: number of keys selected (≥ 1).
        scale: Gumbel scale (integer units, > 0).
        monotonic: every score moves in the same direction when one unit is added or removed.
    Returns:
        ρ = k·(c·d_in/scale)²/8, c = 1 if monotonic else 2 (:func:`_top_k_measurement`).
    Raises:
        MechanismError: OpenDP refuses the parameters.
    """
    meas = _top_k_measurement(k, scale, monotonic=monotonic, negate=False)
    try:
        return float(meas.map(int(d_in)))
    except dp.OpenDPException as e:
        raise MechanismError(f"OpenDP's privacy map failed: {e}") from None


def noisy_argmin(measure: str, scale: float, scores: np.ndarray) -> int:
    """Index chosen by OpenDP's report-noisy-max (Gumbel) on the negated integer ``scores``.

    Args:
        measure: ``"zcdp"`` or ``"pure"`` (the same sampler; only the map differs).
        scale: Gumbel scale in score units.
        scores: 1-D int64 scores (smaller is better), each ≤ 2^62.

    Raises:
        MechanismError: OpenDP's sampler fails.
    """
    meas = _noisy_max(measure, scale)
    arr = np.ascontiguousarray(np.minimum(np.asarray(scores, dtype=np.int64), MAX_ABS_VALUE))
    try:
        return int(meas(arr))
    except dp.OpenDPException as e:
        raise MechanismError(f"OpenDP's sampler failed: {e}") from None


def opendp_quantile_oracle(values: list[float], candidates: list[float], alpha: float,
                           scale: float, measure: str = "zcdp") -> tuple[list[int], float, float]:
    """OpenDP's own quantile scorer and private quantile, for tests (scores, map(1), score Δ).

    Returns ``make_quantile_score_candidates(values)``, ``make_private_quantile(…).map(1)``
    and the scorer's ``map(1)`` (its integer score sensitivity). Not used to release.
    """
    _enable_contrib()
    dom = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    met = dp.symmetric_distance()
    out = dp.zero_concentrated_divergence() if measure == "zcdp" else dp.max_divergence()
    t = dp.t.make_quantile_score_candidates(dom, met, list(map(float, candidates)), alpha=alpha)
    m = dp.m.make_private_quantile(dom, met, out, list(map(float, candidates)), alpha=alpha, scale=scale)
    return list(t(list(map(float, values)))), float(m.map(1)), float(t.map(1))


def select_top_k(scores: np.ndarray, k: int, scale: float, *, monotonic: bool, descending: bool) -> list[int]:
    """Indices of the k noisy-best scores (OpenDP Gumbel noisy top-k; scores never leave here).

    Args:
        scores: 1-D integer score vector (integer units), one per candidate; clamped to ±2^62
            first (a contraction: the L∞ sensitivity cannot grow).
        k: 1 ≤ k ≤ len(scores).
        scale: Gumbel scale (integer units).
        monotonic, descending: see :func:`top_k_rho`; ``descending=False`` selects the k smallest.
    Returns:
        The selected indices, best first.
    Raises:
        MechanismError: any OpenDP failure.
    """
    arr = _clamped_int64("score", scores)
    meas = _top_k_measurement(k, scale, monotonic=monotonic, negate=not descending)
    try:
        return [int(i) for i in meas(arr)]
    except dp.OpenDPException as e:
        raise MechanismError(f"OpenDP's noisy top-k failed: {e}") from None
