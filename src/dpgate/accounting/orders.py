"""The ledger's order grid, argument checks, and the RDP curves of the basic mechanisms.

Part of :mod:`dpgate.accounting` (see its docstring for conventions and references).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Literal, Sequence, get_args

import numpy as np


#: The order grid of the worked example (seed); a subset of :data:`ORDERS`.
SEED_ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0,
    48.0, 64.0, 128.0, 256.0,
)  # fmt: skip

#: The ledger's RDP order grid: ascending, every order > 1, a superset of
#: :data:`SEED_ORDERS`, dense near 1 (large budgets), high orders up to 1024
#: (small budgets, pure-DP-like mechanisms) and ``math.inf`` last (the pure-ε
#: limit, D_∞). Changing it invalidates stored curves: never edit in place.
ORDERS: tuple[float, ...] = (
    1.01, 1.05, 1.1, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0,
    10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0, 80.0, 96.0, 128.0,
    160.0, 192.0, 256.0, 320.0, 384.0, 512.0, 640.0, 768.0, 1024.0, math.inf,
)  # fmt: skip

CostKind = Literal["zcdp", "gaussian", "rdp"]
Conversion = Literal["simple", "tight", "exact"]
#: Names accepted by :func:`rho_for_cap` (and the CLI): ρ-zCDP → (ε, δ) conversions.
CONVERSIONS: tuple[str, ...] = get_args(Conversion)


# --------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must not be NaN")
    return v


def _nonneg(name: str, value: Any, *, allow_inf: bool = False) -> float:
    v = _real(name, value)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {v!r}")
    if math.isinf(v) and not allow_inf:
        raise ValueError(f"{name} must be finite, got {v!r}")
    return v


def _positive(name: str, value: Any) -> float:
    v = _nonneg(name, value)
    if v == 0:
        raise ValueError(f"{name} must be > 0, got {v!r}")
    return v


def _delta(value: Any, name: str = "delta") -> float:
    v = _real(name, value)
    if not 0.0 <= v < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {v!r}")
    return v


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return int(value)


def _orders(orders: Iterable[float]) -> np.ndarray:
    try:
        a = np.asarray(tuple(orders), dtype=float)
    except (TypeError, ValueError):
        raise ValueError("orders must be a sequence of real numbers") from None
    if a.ndim != 1 or a.size == 0:
        raise ValueError("orders must be a non-empty one-dimensional sequence")
    if np.isnan(a).any() or (a <= 1.0).any():
        raise ValueError("orders must all be > 1 (RDP order α > 1; use math.inf for pure ε)")
    if (np.diff(a) <= 0).any():
        raise ValueError("orders must be strictly ascending")
    return a


def _curve(curve: Iterable[float], orders: np.ndarray, name: str = "curve") -> np.ndarray:
    try:
        c = np.asarray(tuple(curve), dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of real numbers") from None
    if c.ndim != 1 or c.shape != orders.shape:
        raise ValueError(
            f"{name} must have one value per order: got {c.size} values for {orders.size} orders"
        )
    if np.isnan(c).any():
        raise ValueError(f"{name} must not contain NaN")
    if (c < 0).any():
        raise ValueError(f"{name} must be non-negative (RDP ε(α) >= 0)")
    return c


# --------------------------------------------------------------------------------------
# per-mechanism costs
# --------------------------------------------------------------------------------------


def gaussian_rho(l2_sensitivity: float, sigma: float) -> float:
    """ρ of one Gaussian release: ρ = Δ2² / (2σ²), per release.

    Holds for the continuous Gaussian ([BS16] Prop. 1.6) and the discrete
    Gaussian with the same σ (the σ parameter of N_Z(0, σ²); [CKS20] Thm. 4).

    Args:
        l2_sensitivity: Δ2 >= 0, in the same units as the noise.
        sigma: noise scale σ > 0 (same units).

    Returns:
        ρ (zCDP) of this one release.

    Raises:
        ValueError: NaN, negative or infinite Δ2; σ not > 0 or not finite.
    """
    d = _nonneg("l2_sensitivity", l2_sensitivity)
    s = _positive("sigma", sigma)
    return d * d / (2.0 * s * s)


def gaussian_sigma(l2_sensitivity: float, rho: float) -> float:
    """σ giving a Gaussian release of cost ρ: σ = Δ2 / √(2ρ) (inverse of :func:`gaussian_rho`).

    [BS16] Prop. 1.6; [CKS20] Thm. 4 for the discrete Gaussian.

    Args:
        l2_sensitivity: Δ2 > 0.
        rho: this release's ρ > 0 (per release, not a total).

    Returns:
        σ, in the units of Δ2.

    Raises:
        ValueError: Δ2 or ρ not > 0, NaN or infinite.
    """
    d = _positive("l2_sensitivity", l2_sensitivity)
    r = _positive("rho", rho)
    return d / math.sqrt(2.0 * r)


def gaussian_rdp(rho: float, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """RDP curve of ρ-zCDP (e.g. a Gaussian mechanism): ε(α) = α·ρ.

    ρ-zCDP is by definition (α, αρ)-RDP for every α > 1 ([BS16] Def. 1.1); for
    the Gaussian mechanism with ρ = Δ2²/(2σ²) this is [Mir17] Prop. 7. At
    α = ∞ the value is ∞ when ρ > 0 (no pure-DP guarantee) and 0 when ρ = 0.

    Args:
        rho: total ρ >= 0 (per release or composed: the curve is linear in ρ).
        orders: ascending orders α > 1 (``math.inf`` allowed).

    Returns:
        float array, ε(α) at each order.

    Raises:
        ValueError: bad ρ or orders.
    """
    r = _nonneg("rho", rho)
    a = _orders(orders)
    with np.errstate(invalid="ignore"):
        out = a * r
    return np.where(np.isinf(a), math.inf if r > 0 else 0.0, out)


def laplace_rdp(epsilon: float, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """RDP curve of one continuous Laplace release with ε = Δ1/b ([Mir17] Prop. 6).

    For α > 1::

        ε(α) = 1/(α−1) · log( α/(2α−1) · e^{(α−1)ε} + (α−1)/(2α−1) · e^{−αε} )

    evaluated in log-space (``logaddexp``) so α = 1024 does not overflow; at
    α = ∞ it is ε (pure DP). Each value is also capped at ε.

    Args:
        epsilon: ε = Δ1/b >= 0 of one release (per release).
        orders: ascending orders α > 1 (``math.inf`` allowed).

    Returns:
        float array, ε(α) at each order.

    Raises:
        ValueError: bad ε or orders.
    """
    e = _nonneg("epsilon", epsilon)
    a = _orders(orders)
    out = np.empty_like(a)
    fin = np.isfinite(a)
    af = a[fin]
    if e == 0:
        return np.zeros_like(a)
    log_terms = np.logaddexp(
        np.log(af) - np.log(2 * af - 1) + (af - 1) * e,
        np.log(af - 1) - np.log(2 * af - 1) - af * e,
    )
    out[fin] = np.minimum(np.maximum(log_terms / (af - 1), 0.0), e)
    out[~fin] = e
    return out


def pure_dp_rdp(epsilon: float, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """Worst-case RDP curve of any ε-DP mechanism (e.g. the discrete Laplace), per release.

    Every ε-DP pair of output distributions has its privacy region inside that
    of binary randomized response with parameter ε ([KOV15] Thm. 2.1), so it is
    a post-processing of randomized response (Blackwell's theorem; [KOV15]
    Sec. 2 — randomized response is the "dominating pair" of pure ε-DP), and
    Rényi divergence obeys data processing ([vEH14] Thm. 9). Hence the
    randomized response curve is the tightest bound valid for every ε-DP
    mechanism::

        ε(α) = 1/(α−1) · log( (e^{αε} + e^{(1−α)ε}) / (1 + e^ε) )

    (log-space). It is additionally capped by ε ([Mir17] Prop. 3's D_∞ bound)
    and by α·ε²/2 ([BS16] Prop. 3.3: ε-DP ⇒ ε²/2-zCDP); the minimum of the three
    is returned. At α = ∞ the value is ε.

    Args:
        epsilon: ε >= 0 of the mechanism (per release).
        orders: ascending orders α > 1 (``math.inf`` allowed).

    Returns:
        float array, ε(α) at each order.

    Raises:
        ValueError: bad ε or orders.
    """
    e = _nonneg("epsilon", epsilon)
    a = _orders(orders)
    out = np.empty_like(a)
    fin = np.isfinite(a)
    af = a[fin]
    if e == 0:
        return np.zeros_like(a)
    rr = (np.logaddexp(af * e, (1 - af) * e) - np.logaddexp(0.0, e)) / (af - 1)
    quad = af * e * e / 2.0
    # Where αε is tiny the log-space difference above cancels to (near) zero, which
    # would under-charge; there use the valid upper bound αε²/2 itself (its relative
    # slack over the RR curve is O((αε)²)).
    rr = np.where(af * e < 1e-4, quad, rr)
    out[fin] = np.maximum(np.minimum(np.minimum(rr, e), quad), 0.0)
    out[~fin] = e
    return out


# --------------------------------------------------------------------------------------
# conversions to (ε, δ)
