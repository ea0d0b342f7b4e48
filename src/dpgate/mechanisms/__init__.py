"""The noise step: calibrate, account and sample OpenDP's discrete mechanisms.

This package (with :mod:`dpgate.mechanisms.selection`: OpenDP's threshold mechanism of private
partition selection, report-noisy-max and the noisy top-k) is the only part of dpgate that
imports OpenDP. Every noisy value the
gateway releases comes from one of two OpenDP measurements on integer vectors:

* the **discrete Gaussian** (default): ``make_gaussian`` on
  ``vector_domain(atom_domain(T=i64))`` with ``l2_distance(T=f64)``; output
  measure zero-concentrated divergence (ρ-zCDP). For an integer vector query
  with L2 sensitivity Δ2 and scale σ it costs ρ = Δ2²/(2σ²)
  ([CKS20] Thm. 4, and its multivariate form for vectors of independent
  coordinates, same paper, Sec. 2);
* the **discrete Laplace** (``mechanism="laplace"``): ``make_laplace`` on the
  same domain with ``l1_distance(T=f64)``; output measure max divergence
  (pure ε-DP), ε = Δ1/b ([GRS12]; sampled exactly with the algorithm of [CKS20]).

Units: every sensitivity, scale and value here is in the primitive's *integer
units* (rows for counts, ``resolution`` for fixed-point sums, ``resolution²``
for sums of squares). Post-processing converts to output units.

Sensitivities need not be integers (e.g. Δ2 = √k·m): the input metric is the
float-typed ``l2_distance(T=f64)`` / ``l1_distance(T=f64)`` over an integer
domain, which OpenDP accepts; its privacy map takes the real d_in as given and
rounds its arithmetic upward, so the sensitivity is never under-stated (for an
integer-valued query the true shift is an integer vector whose norm is ≤ d_in).

Budget split: a query with n primitives and budget ρ (or ε) gives each
primitive ρ/n (or ε/n), or, with ``weights`` c_i (:mod:`dpgate.postprocess.split`, the
default of the pipeline), ρ_i ∝ √c_i·Δ2_i (or ε_i ∝ (c_i·Δ1_i²)^{1/3}), the shares summing
to at most ρ in floating point (:func:`_split`); by composition ([BS16] Lemma 2.3 for ρ; [DR14]
Thm. 3.16 for ε) the release costs ρ (or ε). Each primitive's cost is read back
from OpenDP's own privacy map (``meas.map(d_in)``) and checked against
:func:`dpgate.accounting.gaussian_rho` (or Δ1/b): a disagreement beyond
1e-9 relative raises :class:`MechanismError`. The scale is nudged upward by a
few ulps when OpenDP's (upward-rounded) map exceeds the per-primitive share, so
the charged budget is exactly the requested one and OpenDP certifies it.

64-bit limits (:mod:`dpgate.limits`): OpenDP's integer samplers work on ``i64``
and add noise with saturating arithmetic. :func:`sample` **clamps** each exact
per-group value to [−2^62, 2^62] (:data:`MAX_ABS_VALUE`) before the noise —
never an error that would say, without noise, whether an exact aggregate crossed
2^62 (issue 9). The clamp is a contraction (|c(a) − c(b)| ≤ |a − b| coordinatewise,
the projection onto an interval; Bauschke & Combettes 2017, Prop. 4.16), so it
cannot raise the L1/L2 sensitivity. :func:`calibrate` refuses scales above 2^52
(:data:`MAX_SCALE`; as :class:`~dpgate.errors.InvalidBudget`: the budget is too
small), so that saturation cannot happen in practice (a 2^10·σ-tail event); an
output that still saturates raises :class:`MechanismError` — a function of the
noisy value only (post-processing), never of the data.

Sensitivity 0: a primitive whose sensitivity is 0 has the same value on every
dataset (any two datasets are joined by a chain of add/remove-one-unit steps,
none of which moves it), e.g. a sum over bounds ``[0, 0]``. It is released
exactly: scale 0, cost 0, no OpenDP call; the budget is split over the noisy
primitives only (issue 9 item 8).

References
----------
[CKS20] C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential
        Privacy. NeurIPS 2020 (arXiv:2004.00010).
[BS16]  M. Bun, T. Steinke. Concentrated Differential Privacy. TCC 2016.
[GRS12] A. Ghosh, T. Roughgarden, M. Sundararajan. Universally Utility-Maximizing
        Privacy Mechanisms. SIAM J. Comput. 2012.
[DR14]  C. Dwork, A. Roth. The Algorithmic Foundations of Differential Privacy. 2014.
"""

from __future__ import annotations

import math
import os
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Mapping

import numpy as np
import opendp.prelude as dp

from dpgate import accounting, limits
from dpgate.errors import InvalidBudget, InvalidRequest, MechanismError
from dpgate.policy import MECHANISMS


__all__ = [
    "MAX_ABS_VALUE",
    "MAX_SCALE",
    "Calibration",
    "MechanismName",
    "calibrate",
    "ci95_halfwidth",
    "ci_halfwidth",
    "mechanism_name",
    "sample",
    "sigma_for_ci95",
]

MechanismName = Literal["discrete_gaussian", "discrete_laplace"]

#: Exact values are clamped to ±2^62 before the noise (:data:`dpgate.limits.MAX_ABS_AGGREGATE`).
MAX_ABS_VALUE: int = limits.MAX_ABS_AGGREGATE
#: Largest noise scale (σ or b, integer units) accepted by :func:`calibrate` (2^52).
MAX_SCALE: float = limits.MAX_SCALE

_I64_MAX = 2**63 - 1
_I64_MIN = -(2**63)
#: Relative tolerance between OpenDP's privacy map and our formula.
_MAP_RTOL = 1e-9
#: Vectors at least this long are noised in parallel slices (see :func:`sample`).
_PARALLEL_MIN_CELLS = 8192
#: Up to this σ the discrete Gaussian's 95 % half-width is OpenDP's exact value.
_EXACT_CI_MAX_SIGMA = 1e4
_Z975 = statistics.NormalDist().inv_cdf(0.975)

#: Accepted names: the public ones (:data:`dpgate.policy.MECHANISMS`) and the measurements'.
_NAMES: dict[str, MechanismName] = {
    **MECHANISMS, **{measurement: measurement for measurement in MECHANISMS.values()}
}


def mechanism_name(mechanism: str) -> MechanismName:
    """Normalise a mechanism name: ``"gaussian"`` → ``"discrete_gaussian"``, ``"laplace"`` → ``"discrete_laplace"``.

    Raises:
        InvalidRequest: any other name (lists the accepted ones).
    """
    try:
        return _NAMES[mechanism]
    except (KeyError, TypeError):
        raise InvalidRequest(
            f"unknown mechanism {mechanism!r}; use 'gaussian' (discrete Gaussian, ρ-zCDP) "
            "or 'laplace' (discrete Laplace, pure ε-DP)",
            {"mechanism": str(mechanism), "accepted": list(MECHANISMS)},
        ) from None


@lru_cache(maxsize=1)
def _enable_contrib() -> None:
    # OpenDP gates its (proof-documented) measurements behind "contrib"; done lazily, once.
    dp.enable_features("contrib")


def _measurement(mechanism: MechanismName, scale: float):
    """One OpenDP measurement on i64 vectors with a float-typed L2 (Gaussian) or L1 (Laplace) metric."""
    _enable_contrib()
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    try:
        if mechanism == "discrete_gaussian":
            meas = dp.m.make_gaussian(domain, dp.l2_distance(T="f64"), scale=float(scale))
            expected = dp.zero_concentrated_divergence()
        else:
            meas = dp.m.make_laplace(domain, dp.l1_distance(T="f64"), scale=float(scale))
            expected = dp.max_divergence()
    except dp.OpenDPException as e:  # pragma: no cover - guarded by our own checks
        raise MechanismError(f"OpenDP refused the {mechanism} measurement: {e}") from None
    if meas.output_measure != expected:  # pragma: no cover - guards an OpenDP API change
        raise MechanismError(
            f"OpenDP's {mechanism} measurement has output measure {meas.output_measure}, "
            f"expected {expected}"
        )
    return meas


def _privacy_map(meas, d_in: float) -> float:
    try:
        return float(meas.map(float(d_in)))
    except dp.OpenDPException as e:
        raise MechanismError(f"OpenDP's privacy map failed: {e}") from None


def _formula(mechanism: MechanismName, d_in: float, scale: float) -> float:
    """Our own cost formula: ρ = Δ2²/(2σ²) ([CKS20] Thm. 4) or ε = Δ1/b ([GRS12])."""
    if mechanism == "discrete_gaussian":
        return accounting.gaussian_rho(d_in, scale)
    return d_in / scale


def _check_map(mechanism: MechanismName, pid: str, d_in: float, scale: float, mapped: float) -> None:
    ours = _formula(mechanism, d_in, scale)
    if not math.isfinite(mapped) or abs(mapped - ours) > _MAP_RTOL * max(abs(ours), 1e-300):
        raise MechanismError(
            f"OpenDP's privacy map ({mapped!r}) and dpgate's formula ({ours!r}) disagree for "
            f"primitive {pid!r} ({mechanism}, d_in={d_in!r}, scale={scale!r})",
            {"primitive": pid, "opendp": mapped, "dpgate": ours},
        )


def _check_scale(pid: str, scale: float) -> float:
    s = float(scale)
    if not math.isfinite(s) or s <= 0:
        raise MechanismError(f"noise scale of primitive {pid!r} must be finite and > 0, got {scale!r}")
    if s > MAX_SCALE:
        raise _budget_too_small(pid, s)
    return s


def _budget_too_small(pid: str, scale: float) -> InvalidBudget:
    # a budget so small that the noise would not fit: the request is at fault (400)
    return InvalidBudget(
        f"the budget is too small: noise scale {scale:.4g} (integer units) of primitive {pid!r} "
        "exceeds 2^52, beyond what 64-bit integer noise can carry; raise the budget, coarsen "
        "the column's resolution or tighten its bounds",
        {"primitive": pid, "scale": scale if math.isfinite(scale) else None, "max_scale": MAX_SCALE},
    )


def _scale_for_share(gaussian: bool, pid: str, d_in: float, share: float) -> float:
    """σ = Δ2/√(2ρ_i) or b = Δ1/ε_i for one primitive's share of the budget.

    A share so small that it underflows (a subnormal budget split n ways) or that the
    scale overflows is a budget too small (400), not an internal error.
    """
    if not share > 0:
        raise _budget_too_small(pid, math.inf)
    with np.errstate(all="ignore"):
        try:
            s = accounting.gaussian_sigma(d_in, share) if gaussian else d_in / share
        except (ValueError, ZeroDivisionError, OverflowError):
            s = math.inf
    if not math.isfinite(s):
        raise _budget_too_small(pid, s)
    return _check_scale(pid, s)


def _certify(mech: MechanismName, pid: str, d_in: float, scale: float, share: float) -> tuple[float, float]:
    """Widen ``scale`` by ulps until OpenDP's (upward-rounded) map certifies ``share``; (scale, map)."""
    mapped = _privacy_map(_measurement(mech, scale), d_in)
    for _ in range(64):
        if mapped <= share:
            break
        scale = math.nextafter(scale, math.inf)
        mapped = _privacy_map(_measurement(mech, scale), d_in)
    return _check_scale(pid, scale), mapped


@dataclass(frozen=True)
class Calibration:
    """The calibrated noise of one release: one scale per primitive, and its total cost.

    Attributes:
        mechanism: ``"discrete_gaussian"`` or ``"discrete_laplace"``.
        scales: primitive id → σ (discrete Gaussian) or b (discrete Laplace), in
            the primitive's integer units; 0 for a primitive of sensitivity 0
            (released exactly).
        cost: the release's total cost: ``Cost.zcdp(rho)`` or ``Cost.pure(epsilon)``.
        rho: total ρ (zCDP) of the release for the Gaussian, else None.
        epsilon: total ε (pure DP) of the release for the Laplace, else None.
        primitive_costs: primitive id → its own cost (ρ or ε) as read from
            OpenDP's privacy map at the primitive's sensitivity.
        sensitivities: primitive id → the d_in used (Δ2 for the Gaussian, Δ1
            for the Laplace), integer units.
        selection: the threshold mechanism of a query with privately selected keys
            (issue 11), whose ρ/ε is included in ``cost``; None otherwise.
        reused: primitive ids whose noisy values are the threshold mechanism's own noisy
            counts (their ``scales`` entry is the selection's; :func:`sample` must not be
            given them).
    """

    mechanism: MechanismName
    scales: dict[str, float]
    cost: accounting.Cost
    rho: float | None
    epsilon: float | None
    primitive_costs: dict[str, float]
    sensitivities: dict[str, float]
    #: the partition selection's :class:`~dpgate.mechanisms.selection.SelectionCalibration`, or None
    #: (typed Any: that module imports this package, never the other way)
    selection: Any = None
    reused: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        """True when every primitive has sensitivity 0 (scale 0) and no key is selected
        privately: the release is a constant, released exactly; it costs nothing."""
        return self.selection is None and all(s == 0 for s in self.scales.values())

    def ci95_halfwidths(self) -> dict[str, float]:
        """Primitive id → 95 % half-width of its noise (integer units), see :func:`ci95_halfwidth`."""
        return {pid: ci95_halfwidth(self.mechanism, s) for pid, s in self.scales.items()}


def _budget(name: str, value: float | None) -> float:
    if value is None:
        raise InvalidBudget(f"{name} is required for this mechanism")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidBudget(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise InvalidBudget(f"{name} must be finite and > 0, got {value!r}", {name: str(value)})
    return v


def calibrate(
    sensitivities: Mapping[str, tuple[float, float]],
    *,
    mechanism: str = "gaussian",
    rho: float | None = None,
    epsilon: float | None = None,
    scales: Mapping[str, float] | None = None,
    weights: Mapping[str, float] | None = None,
) -> Calibration:
    """Calibrate the noise of one release and compute its cost from OpenDP's privacy maps.

    Two modes:

    * budget given (``rho`` for the Gaussian, ``epsilon`` for the Laplace):
      split over the n primitives of non-zero sensitivity (a primitive of
      sensitivity 0 is a constant: released exactly, scale 0, cost 0; see the module
      docstring), equally (ρ_i = ρ/n) or by ``weights`` (:func:`_split`); σ_i = Δ2_i/√(2ρ_i)
      ([CKS20] Thm. 4, via :func:`dpgate.accounting.gaussian_sigma`) or b_i = Δ1_i/ε_i
      ([GRS12]); the release costs ρ (or ε) by composition ([BS16] Lemma 2.3;
      [DR14] Thm. 3.16): the shares' sum is ≤ the budget in floating point and the
      charged total is exactly the requested budget.
    * ``scales`` given: use them; the cost is the sum of the primitives' costs
      from OpenDP's privacy maps (e.g. for a ``{ci95: …}`` budget, with scales
      from :func:`sigma_for_ci95`).

    Args:
        sensitivities: primitive id → (Δ1, Δ2) under add/remove one privacy
            unit, integer units, finite and ≥ 0 (0: exact, no noise, no cost).
        mechanism: ``"gaussian"`` (default, discrete Gaussian, ρ-zCDP) or
            ``"laplace"`` (discrete Laplace, pure ε-DP); the ``discrete_*`` names
            are accepted too.
        rho: total ρ of this release (Gaussian only).
        epsilon: total ε of this release (Laplace only).
        scales: primitive id → σ or b (integer units), instead of a budget.
        weights: with a budget, primitive id → c_i > 0 for every noisy primitive: the
            share minimising Σ c_i·Var(Z_i) (:func:`_split`); None: equal shares.

    Returns:
        A :class:`Calibration` whose ``cost`` is ``Cost.zcdp(total ρ)`` or
        ``Cost.pure(total ε)``.

    Raises:
        InvalidRequest: unknown mechanism.
        InvalidBudget: missing, non-finite or non-positive budget; a budget in the
            other mechanism's currency (ε for the Gaussian, ρ for the Laplace);
            both a budget and scales; a budget so small that a scale would exceed
            :data:`MAX_SCALE`.
        MechanismError: no primitives; a non-finite or negative sensitivity;
            scales missing a primitive; OpenDP's
            privacy map disagreeing with our formula beyond 1e-9 relative.
    """
    mech = mechanism_name(mechanism)
    gaussian = mech == "discrete_gaussian"
    if not sensitivities:
        raise MechanismError("a release needs at least one noisy primitive")
    if gaussian and epsilon is not None:
        raise InvalidBudget(
            "the discrete Gaussian is charged in ρ (zCDP); give rho (or choose mechanism 'laplace')"
        )
    if not gaussian and rho is not None:
        raise InvalidBudget(
            "the discrete Laplace is charged in ε (pure DP); give epsilon (or choose mechanism 'gaussian')"
        )
    if scales is not None and (rho is not None or epsilon is not None):
        raise InvalidBudget("give either a budget or noise scales, not both")

    d_in: dict[str, float] = {}
    for pid, pair in sensitivities.items():
        try:
            l1, l2 = (float(x) for x in pair)
        except (TypeError, ValueError):
            raise MechanismError(f"sensitivity of primitive {pid!r} must be a pair (l1, l2)") from None
        d = l2 if gaussian else l1
        if not math.isfinite(d) or d < 0:
            raise MechanismError(
                f"{'L2' if gaussian else 'L1'} sensitivity of primitive {pid!r} must be finite and >= 0, "
                f"got {d!r}"
            )
        d_in[pid] = d
    noisy = [pid for pid, d in d_in.items() if d > 0]

    if scales is None:
        requested = _budget("rho" if gaussian else "epsilon", rho if gaussian else epsilon)
        shares = _split(requested, {p: d_in[p] for p in noisy}, weights, gaussian)
    else:
        missing = sorted(set(noisy) - set(scales))
        if missing:
            raise MechanismError(f"no noise scale given for primitive(s) {missing}")
    out_scales: dict[str, float] = {}
    costs: dict[str, float] = {}
    for pid, d in d_in.items():
        if d == 0:  # a constant: exact, free
            out_scales[pid], costs[pid] = 0.0, 0.0
            continue
        if scales is None:
            s = _scale_for_share(gaussian, pid, d, shares[pid])
            s, mapped = _certify(mech, pid, d, s, shares[pid])
        else:
            s = _check_scale(pid, scales[pid])
            mapped = _privacy_map(_measurement(mech, s), d)
        _check_map(mech, pid, d, s, mapped)
        out_scales[pid], costs[pid] = s, mapped
    total = math.fsum(costs.values())
    if scales is None and noisy:
        total = max(requested, total)  # the requested budget, unless OpenDP's map says more

    return Calibration(
        mechanism=mech,
        scales=out_scales,
        # μ-GDP of the discrete Gaussian from each primitive's (Δ₂, σ) (issue 22; the ledger's GDP filter)
        cost=accounting.Cost.discrete_gaussian(
            total, accounting.discrete_gaussian_mu((d_in[p], out_scales[p]) for p in d_in))
        if gaussian else accounting.Cost.pure(total),
        rho=total if gaussian else None,
        epsilon=None if gaussian else total,
        primitive_costs=costs,
        sensitivities=d_in,
    )


def _split(total: float, d_in: Mapping[str, float], weights: Mapping[str, float] | None,
           gaussian: bool) -> dict[str, float]:
    """Each noisy primitive's share of ``total`` (ρ or ε); the shares' ``math.fsum`` is ≤ ``total``.

    Equal (``weights`` None): total/n. Weighted: minimising Σ c_i Δ_i²/ρ_i subject to
    Σ ρ_i = ρ gives ρ_i = ρ·√c_i Δ_i / Σ_j √c_j Δ_j (Lagrange; Gaussian, Var = Δ²/(2ρ)); for the
    Laplace (Var = 2Δ²/ε²) ε_i ∝ (c_i Δ_i²)^{1/3} (derivations in :mod:`dpgate.postprocess.split`).
    Rounding: the largest share absorbs the residue total − Σ others and is stepped down by
    ulps while the correctly rounded sum exceeds ``total``, so OpenDP's certified costs (each ≤
    its share) never add up to more than the requested budget.

    Raises:
        MechanismError: weights missing, non-finite or ≤ 0 for a noisy primitive.
    """
    if not d_in:
        return {}
    if weights is None:
        return {p: total / len(d_in) for p in d_in}
    raw: dict[str, float] = {}
    for p, d in d_in.items():
        c = weights.get(p)
        if c is None or not math.isfinite(float(c)) or not float(c) > 0:
            raise MechanismError(f"no positive split weight for primitive {p!r}", {"primitive": p})
        raw[p] = math.sqrt(float(c)) * d if gaussian else (float(c) * d * d) ** (1.0 / 3.0)
    norm = math.fsum(raw.values())
    shares = {p: total * (r / norm) for p, r in raw.items()}
    big = max(shares, key=shares.__getitem__)
    shares[big] = total - math.fsum(v for p, v in shares.items() if p != big)
    while math.fsum(shares.values()) > total:
        shares[big] = math.nextafter(shares[big], 0.0)
    return shares


def _clamped_int64(pid: str, values: np.ndarray) -> np.ndarray:
    """The exact values as a writable C-contiguous int64 vector, each clamped to ±2^62.

    The clamp (not an error) is what keeps the outcome independent of the data: see the
    module docstring for why it leaves the sensitivity unchanged. Only the *type* of the
    input can make this fail (floats, NULLs, booleans: a programming error, the same on
    every dataset, since the engine's result types follow from the SQL alone).
    """
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise MechanismError(f"values of primitive {pid!r} must be a 1-D vector, got shape {arr.shape}")
    if arr.dtype.kind == "u":
        arr = np.minimum(arr, np.uint64(MAX_ABS_VALUE))
    elif arr.dtype.kind == "O":
        # The engine's lossless path for HUGEINT values: Python ints (rare; one by one).
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in arr):
            raise MechanismError(f"values of primitive {pid!r} must be integers (no NULL, no floats)")
        return np.array([min(max(int(v), -MAX_ABS_VALUE), MAX_ABS_VALUE) for v in arr], dtype=np.int64)
    elif arr.dtype.kind != "i":
        raise MechanismError(
            f"values of primitive {pid!r} must be integers (fixed-point units), got dtype {arr.dtype}"
        )
    # np.clip returns a new (writable, C-contiguous) array: OpenDP reads such a buffer, and
    # Arrow's zero-copy arrays are read-only.
    return np.clip(arr.astype(np.int64, copy=False), -MAX_ABS_VALUE, MAX_ABS_VALUE)


def _invoke(meas, arr: np.ndarray) -> np.ndarray:
    try:
        if arr.size < _PARALLEL_MIN_CELLS:
            return np.asarray(meas(arr), dtype=np.int64)
        workers = max(1, min(os.cpu_count() or 1, 8, arr.size // (_PARALLEL_MIN_CELLS // 2)))
        if workers == 1:
            return np.asarray(meas(arr), dtype=np.int64)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dpgate-noise") as pool:
            parts = list(pool.map(meas, np.array_split(arr, workers)))
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    except dp.OpenDPException as e:
        raise MechanismError(f"OpenDP's sampler failed: {e}") from None


def sample(calibration: Calibration, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add the calibrated OpenDP noise to each primitive's integer vector.

    Each exact value is first clamped to [−2^62, 2^62] (:data:`MAX_ABS_VALUE`; a
    contraction, see the module docstring), so no data can make this fail. A
    primitive of scale 0 (sensitivity 0, a constant) is returned exactly.
    One measurement is built per primitive per call and invoked on the whole
    vector (OpenDP samples each coordinate independently with the exact samplers of [CKS20]).
    Vectors of 8,192 cells or more are cut into a few contiguous slices noised
    by the same measurement in parallel threads (OpenDP's sampler releases the
    GIL): since the noise is i.i.d. per coordinate, the output distribution is
    exactly that of one call on the whole vector. No other source of randomness
    is used.

    Args:
        calibration: from :func:`calibrate`.
        values: primitive id → 1-D integer vector (one cell per group, integer
            units), for exactly the primitives of ``calibration``. int64/uint
            arrays, or object arrays of Python ints (HUGEINT results), of any size.

    Returns:
        primitive id → noisy int64 vector of the same length.

    Raises:
        MechanismError: missing or extra primitives; non-integer values (floats,
            NULLs, booleans); an output that saturated i64 (a function of the noisy
            value, probability < e^{-2^19}); any OpenDP failure.
    """
    expected, given = set(calibration.scales), set(values)
    if expected != given:
        raise MechanismError(
            "the values do not match the calibrated primitives",
            {"missing": sorted(expected - given), "unexpected": sorted(given - expected)},
        )
    out: dict[str, np.ndarray] = {}
    for pid, scale in calibration.scales.items():
        arr = _clamped_int64(pid, values[pid])
        if arr.size == 0 or scale == 0:  # nothing to noise, or a constant (sensitivity 0)
            out[pid] = arr
            continue
        noisy = _invoke(_measurement(calibration.mechanism, scale), arr)
        if noisy.shape != arr.shape:  # pragma: no cover - guards an OpenDP change
            raise MechanismError(f"OpenDP returned {noisy.shape} cells for {arr.shape} inputs")
        if ((noisy == _I64_MAX) | (noisy == _I64_MIN)).any():
            raise MechanismError(
                f"noise for primitive {pid!r} saturated the 64-bit range; coarsen the resolution",
                {"primitive": pid},
            )
        out[pid] = noisy
    return out


@lru_cache(maxsize=4096)
def _ci95_cached(mech: MechanismName, scale: float) -> float:
    if mech == "discrete_laplace":
        # P(Z = x) = (1−q)/(1+q)·q^|x|, q = e^{−1/b} ([GRS12]); summing the two
        # geometric tails, P(|Z| ≤ t) = 1 − 2q^{t+1}/(1+q). Smallest integer t with this ≥ 0.95:
        log_q = -1.0 / scale
        target = math.log(0.025) + math.log1p(math.exp(log_q))  # log(0.025·(1+q))
        t = max(0, math.ceil(target / log_q - 1.0))

        def covers(k: int) -> bool:
            return k >= 0 and 1.0 - 2.0 * math.exp((k + 1) * log_q) / (1.0 + math.exp(log_q)) >= 0.95

        while t > 0 and covers(t - 1):  # guard the closed form's rounding at integer boundaries
            t -= 1
        while not covers(t):
            t += 1
        return float(t)
    if scale <= _EXACT_CI_MAX_SIGMA:
        # OpenDP's exact tail of the discrete Gaussian: accuracy a with P(|Z| ≥ a) ≤ α, a integer,
        # hence P(|Z| ≤ a − 1) ≥ 1 − α.
        _enable_contrib()
        a = float(dp.discrete_gaussian_scale_to_accuracy(float(scale), 0.05))
        return max(0.0, a - 1.0)
    # σ > 10^4: the continuity-corrected normal quantile ceil(z·σ − ½). The discrete Gaussian's
    # mass differs from the normal's by O(e^{−2π²σ²}) in the normaliser and O(σ^{-2}) relatively in
    # the tail sum (Euler–Maclaurin), so t is exact unless z·σ − ½ is within ~1e-8 of an integer.
    return float(math.ceil(_Z975 * scale - 0.5))


def ci95_halfwidth(mechanism: str, scale: float) -> float:
    """95 % half-width of the noise: the smallest integer t with P(|Z| ≤ t) ≥ 0.95.

    ``[noisy − t, noisy + t]`` then covers the true (integer) value with
    probability ≥ 95 %. Same units as ``scale`` (integer units of the primitive).

    * discrete Gaussian N_Z(0, σ²): exact for σ ≤ 10^4 (OpenDP's
      ``discrete_gaussian_scale_to_accuracy``, which sums the pmf; its accuracy
      a satisfies P(|Z| ≥ a) ≤ 0.05, so t = a − 1); above, ⌈1.95996·σ − ½⌉
      (continuity-corrected normal quantile; agrees with the exact value up to
      ties within ~1e-8, tested at the switch-over).
    * discrete Laplace with scale b: exact from the closed form
      P(|Z| ≤ t) = 1 − 2e^{−(t+1)/b}/(1 + e^{−1/b}) (sum of the pmf
      (1−q)/(1+q)·q^{|x|}, q = e^{−1/b}, [GRS12]).

    Args:
        mechanism: ``"gaussian"``/``"discrete_gaussian"`` or ``"laplace"``/``"discrete_laplace"``.
        scale: σ or b ≥ 0, finite (0: an exact primitive, t = 0).

    Returns:
        t as a float (an integer value).

    Raises:
        InvalidRequest: unknown mechanism.
        MechanismError: scale not finite or negative.
    """
    mech = mechanism_name(mechanism)
    s = float(scale)
    if not math.isfinite(s) or s < 0:
        raise MechanismError(f"noise scale must be finite and >= 0, got {scale!r}")
    return 0.0 if s == 0 else _ci95_cached(mech, s)


def sigma_for_ci95(mechanism: str, halfwidth: float) -> float:
    """The largest noise scale whose 95 % half-width (:func:`ci95_halfwidth`) is ≤ ``halfwidth``.

    The inverse used for a ``{ci95: …}`` budget: the least noise (hence the least
    privacy spent) that still meets the requested accuracy. Found by bisection on
    the monotone map scale → half-width to a relative precision of 1e-12,
    returning the lower end (so the target is met). Units: integer units of the
    primitive (convert the analyst's output-unit target by the resolution first).

    Args:
        mechanism: as for :func:`ci95_halfwidth`.
        halfwidth: target t ≥ 0, finite; non-integers are floored (the noise is
            an integer).

    Returns:
        σ (discrete Gaussian) or b (discrete Laplace) > 0, at most :data:`MAX_SCALE`
        (a target wider than 2^52 noise gives is met by 2^52).

    Raises:
        InvalidRequest: unknown mechanism.
        InvalidBudget: halfwidth negative or not finite.
    """
    mech = mechanism_name(mechanism)
    try:
        h = float(halfwidth)
    except (TypeError, ValueError):
        raise InvalidBudget(f"ci95 must be a number, got {halfwidth!r}") from None
    if not math.isfinite(h) or h < 0:
        raise InvalidBudget(f"ci95 must be finite and >= 0, got {halfwidth!r}")
    t = math.floor(h)
    if ci95_halfwidth(mech, MAX_SCALE) <= t:
        # The most noise the 64-bit samplers carry already meets the target: use it (a
        # search beyond would only find scales calibrate refuses, and slowly).
        return MAX_SCALE
    # Bracket: the half-width is ≈ 1.96σ (Gaussian) or ≈ 3.0b (Laplace).
    lo, hi = 1e-6, max(1.0, 2.0 * (t + 1))
    if ci95_halfwidth(mech, lo) > t:  # pragma: no cover - t = 0 is met by tiny scales
        raise MechanismError(f"no noise scale achieves a 95 % half-width of {h}")
    while ci95_halfwidth(mech, hi) <= t:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        if hi - lo <= 1e-12 * hi:
            break
        mid = 0.5 * (lo + hi)
        if ci95_halfwidth(mech, mid) <= t:
            lo = mid
        else:
            hi = mid
    return lo


@lru_cache(maxsize=4096)
def _ci_cached(mech: MechanismName, scale: float, alpha: float) -> float:
    if mech == "discrete_laplace":
        # P(|Z| ≤ t) = 1 − 2q^{t+1}/(1+q), q = e^{−1/b} ([GRS12]); smallest integer t with this ≥ 1 − α.
        log_q = -1.0 / scale

        def covers(k: int) -> bool:
            return k >= 0 and 2.0 * math.exp((k + 1) * log_q) / (1.0 + math.exp(log_q)) <= alpha

        t = max(0, math.ceil((math.log(alpha / 2.0) + math.log1p(math.exp(log_q))) / log_q - 1.0))
        while t > 0 and covers(t - 1):
            t -= 1
        while not covers(t):
            t += 1
        return float(t)
    if scale <= _EXACT_CI_MAX_SIGMA:
        _enable_contrib()
        a = float(dp.discrete_gaussian_scale_to_accuracy(float(scale), float(alpha)))
        return max(0.0, a - 1.0)
    z = statistics.NormalDist().inv_cdf(1.0 - alpha / 2.0)
    return float(math.ceil(z * scale - 0.5))


def ci_halfwidth(mechanism: str, scale: float, alpha: float = 0.05) -> float:
    """(1 − α) half-width of the noise: the smallest integer t with P(|Z| ≤ t) ≥ 1 − α.

    :func:`ci95_halfwidth` at any level, computed the same way (discrete
    Laplace: exact closed form of [GRS12]; discrete Gaussian: OpenDP's exact
    ``discrete_gaussian_scale_to_accuracy`` for σ ≤ 10^4, the continuity-corrected
    normal quantile above). Used for union (Bonferroni) bounds over several
    primitives, e.g. α = 0.05/k each for a 95 % statement about k of them.

    Args:
        mechanism: ``"gaussian"``/``"discrete_gaussian"`` or ``"laplace"``/``"discrete_laplace"``.
        scale: σ or b > 0, finite (integer units).
        alpha: miss probability in (0, 1).

    Returns:
        t as a float (an integer value), in the units of ``scale``.

    Raises:
        InvalidRequest: unknown mechanism.
        MechanismError: scale not finite or not > 0, or alpha outside (0, 1).
    """
    mech = mechanism_name(mechanism)
    s = float(scale)
    if not math.isfinite(s) or s <= 0:
        raise MechanismError(f"noise scale must be finite and > 0, got {scale!r}")
    a = float(alpha)
    if not (0.0 < a < 1.0):
        raise MechanismError(f"alpha must be in (0, 1), got {alpha!r}")
    return _ci_cached(mech, s, a)
