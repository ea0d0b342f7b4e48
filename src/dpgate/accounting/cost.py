"""The ledger's currency: :class:`Cost` (ρ or an RDP curve) and its (ε, δ).

Part of :mod:`dpgate.accounting` (see its docstring for conventions and references).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from dpgate.accounting.conversions import (
    _check_grid,
    curve_on_grid,
    gaussian_epsilon_exact,
    rdp_epsilon_tight,
    zcdp_epsilon_tight,
)
from dpgate.accounting.gdp import pure_dp_mu
from dpgate.accounting.orders import ORDERS, CostKind, _curve, _nonneg, _orders, gaussian_rdp, laplace_rdp, pure_dp_rdp


@dataclass(frozen=True)
class Cost:
    """The cost of one charge in the ledger currency (ρ for Gaussians, else an RDP curve).

    Fields:
        kind: "zcdp" — our own discrete Gaussian releases (ρ-zCDP, [CKS20] Thm. 4);
            "gaussian" — continuous Gaussian mechanisms declared by an external
            consumer (ρ; eligible for exact Gaussian-DP reporting, [BW18]);
            "rdp" — a general RDP curve at :data:`ORDERS`.
        rho: ρ >= 0 for "zcdp"/"gaussian", else ``None``.
        curve: ε(α) at :data:`ORDERS` (tuple of floats >= 0, +inf allowed meaning
            "no claim at that order", at least one finite value) for "rdp",
            else ``None``.
        gdp_mu: for a "zcdp" cost of dpgate's own discrete Gaussian releases, a μ such that
            the charge is μ-GDP ([DRS22]; :func:`dpgate.accounting.gdp.discrete_gaussian_mu`,
            set by :meth:`discrete_gaussian`); else ``None`` (no GDP claim). A "gaussian" cost
            is exactly √(2ρ)-GDP without it (:attr:`gdp_bound`).

    Composition (``+``): ρ adds ([BS16] Lemma 2.3) and RDP curves add order by
    order ([Mir17] Prop. 1), also under adaptive composition. zcdp+zcdp → zcdp,
    gaussian+gaussian → gaussian, zcdp+gaussian → zcdp (no longer eligible for
    exact Gaussian reporting), anything + rdp → rdp (ρ converted to α·ρ).
    ``sum(costs)`` works (0 is the identity).

    Raises (on construction):
        ValueError: invalid kind, ρ or curve (message names the field).
    """

    kind: CostKind
    rho: float | None = None
    curve: tuple[float, ...] | None = None
    gdp_mu: float | None = None

    def __post_init__(self) -> None:
        if self.gdp_mu is not None:
            if self.kind != "zcdp":
                raise ValueError("gdp_mu is for 'zcdp' costs only (a 'gaussian' cost is √(2ρ)-GDP already)")
            mu = _nonneg("gdp_mu", self.gdp_mu)
            if math.isinf(mu):
                raise ValueError("gdp_mu must be finite (leave it None for no GDP claim)")
            object.__setattr__(self, "gdp_mu", mu)
        if self.kind in ("zcdp", "gaussian"):
            if self.curve is not None:
                raise ValueError(f"curve must be None for a {self.kind!r} cost")
            object.__setattr__(self, "rho", _nonneg("rho", self.rho))
        elif self.kind == "rdp":
            if self.rho is not None:
                raise ValueError("rho must be None for an 'rdp' cost (give the curve)")
            if self.curve is None:
                raise ValueError("curve is required for an 'rdp' cost")
            c = _curve(self.curve, np.asarray(ORDERS))
            if not np.isfinite(c).any():
                raise ValueError("curve must be finite at one order at least")
            object.__setattr__(self, "curve", tuple(float(v) for v in c))
        else:
            raise ValueError(f"kind must be 'zcdp', 'gaussian' or 'rdp', got {self.kind!r}")

    # -- constructors ------------------------------------------------------------------

    @classmethod
    def zcdp(cls, rho: float) -> "Cost":
        """ρ-zCDP cost of our discrete Gaussian release(s); ``rho`` total for this charge.

        Raises:
            ValueError: ρ NaN, negative or infinite.
        """
        return cls("zcdp", rho=rho)

    @classmethod
    def discrete_gaussian(cls, rho: float, gdp_mu: float | None) -> "Cost":
        """ρ-zCDP cost of dpgate's discrete Gaussian release(s) that is also ``gdp_mu``-GDP.

        ``gdp_mu`` from :func:`dpgate.accounting.gdp.discrete_gaussian_mu` (the release's
        (Δ₂, σ) per primitive); None or ∞ (a scale below the GDP bound's range): a plain
        :meth:`zcdp` cost.

        Raises:
            ValueError: ρ or μ NaN or negative.
        """
        if gdp_mu is None or math.isinf(gdp_mu) or rho == 0:  # ρ = 0: exact, never charged
            return cls("zcdp", rho=rho)
        return cls("zcdp", rho=rho, gdp_mu=gdp_mu)

    @classmethod
    def continuous_gaussian(cls, rho: float) -> "Cost":
        """Cost of continuous Gaussian mechanism(s) with total ρ = Σ Δ2²/(2σ²).

        Reported with the exact Gaussian-DP conversion ([BW18] Thm. 8) while the
        ledger history contains only such costs.

        Raises:
            ValueError: ρ NaN, negative or infinite.
        """
        return cls("gaussian", rho=rho)

    @classmethod
    def rdp(cls, curve: Sequence[float], orders: Sequence[float] = ORDERS) -> "Cost":
        """A general RDP cost: ε(α) at the ledger's grid (e.g. from a DP-SGD accountant).

        Args:
            curve: ε(α) >= 0, one value per order (+inf allowed, at least one finite).
            orders: must equal :data:`ORDERS` (given to make the grid explicit).

        Raises:
            ValueError: orders differ from :data:`ORDERS`; wrong length; NaN or negative values.
        """
        _check_grid(orders)
        return cls("rdp", curve=tuple(np.asarray(tuple(curve), dtype=float).tolist()))

    @classmethod
    def rdp_on_orders(cls, curve: Sequence[float], orders: Sequence[float]) -> "Cost":
        """An RDP cost computed at the caller's own ``orders`` (e.g. Opacus' or dp-accounting's
        grid), mapped onto :data:`ORDERS` by :func:`curve_on_grid` (conservatively: each ledger
        order takes the value at the next caller order above it; +inf beyond the last).

        Raises:
            ValueError: bad orders or curve (see :func:`curve_on_grid`); no finite value
                left on the ledger's grid.
        """
        return cls("rdp", curve=tuple(curve_on_grid(curve, orders).tolist()))

    @classmethod
    def pure(cls, epsilon: float) -> "Cost":
        """Cost of any ε-DP mechanism (e.g. the discrete Laplace): the worst-case RDP curve.

        Curve from :func:`pure_dp_rdp` (randomized response, [KOV15] Thm. 2.1;
        capped by ε and αε²/2, [BS16] Prop. 3.3). ``epsilon`` is the total ε of the charge.

        Raises:
            ValueError: ε NaN, negative or infinite.
        """
        return cls("rdp", curve=tuple(pure_dp_rdp(epsilon).tolist()))

    @classmethod
    def laplace(cls, epsilon: float) -> "Cost":
        """Cost of one continuous Laplace release with ε = Δ1/b ([Mir17] Prop. 6).

        Raises:
            ValueError: ε NaN, negative or infinite.
        """
        return cls("rdp", curve=tuple(laplace_rdp(epsilon).tolist()))

    # -- views -------------------------------------------------------------------------

    @property
    def is_zcdp(self) -> bool:
        """True for "zcdp" and "gaussian" costs (a ρ describes them fully)."""
        return self.kind in ("zcdp", "gaussian")

    @property
    def gdp_bound(self) -> float | None:
        """The μ of a μ-GDP claim for this cost, or None: ``gdp_mu`` for a discrete Gaussian,
        √(2ρ) for a "gaussian" (continuous, [DRS22] Thm. 2.7: Δ/σ per release, composed
        exactly, Cor. 3.3), ``pure_dp_mu(ε)`` for an RDP curve finite at α = ∞ (pure ε-DP:
        the discrete Laplace, ``Cost.pure``), None otherwise."""
        if self.kind == "gaussian":
            return math.sqrt(2.0 * float(self.rho))  # type: ignore[arg-type]
        if self.kind == "rdp":  # a finite D_∞: pure ε-DP, hence pure_dp_mu(ε)-GDP
            eps = float(self.curve[-1])  # type: ignore[index]
            return pure_dp_mu(eps) if math.isfinite(eps) and eps < 700 else None
        return self.gdp_mu

    def curve_at(self, orders: Sequence[float] = ORDERS) -> np.ndarray:
        """ε(α) of this cost at ``orders`` (float array, a fresh copy).

        zcdp/gaussian: α·ρ ([BS16] Def. 1.1), ∞ at α = ∞ when ρ > 0. rdp: the
        stored values at grid orders; at an order α off the grid, the smallest
        stored value at a grid order β >= α (a valid upper bound since Rényi
        divergence is non-decreasing in its order, [vEH14] Thm. 3), ∞ if none.

        Raises:
            ValueError: bad orders.
        """
        if self.is_zcdp:
            return gaussian_rdp(self.rho, orders)  # type: ignore[arg-type]
        a = _orders(orders)
        grid = np.asarray(ORDERS)
        c = np.asarray(self.curve, dtype=float)
        # suffix minimum: env[i] = min_{j >= i} c[j]
        env = np.minimum.accumulate(c[::-1])[::-1]
        idx = np.searchsorted(grid, a, side="left")
        out = np.full(a.shape, math.inf)
        ok = idx < grid.size
        out[ok] = env[idx[ok]]
        exact = ok.copy()
        exact[ok] = grid[idx[ok]] == a[ok]
        out[exact] = c[idx[exact]]
        return out

    def rho_bound(self, max_order: float | None = None) -> float:
        """The smallest ρ' with ε(α) <= α·ρ' at every finite order α of :data:`ORDERS`
        (with ``max_order``: at every grid order α <= ``max_order`` only).

        For zcdp/gaussian costs this is ρ itself. Used to state an RDP charge in
        ρ units: over the whole grid it may be ∞ (a curve that makes no claim at
        high orders, such as a DP-SGD run's); over the orders a cap checks
        (``max_order`` = the cap's α_cap, see ``docs/DESIGN_NOTES.md``) it is the
        share of the budget α·ρ_cap that the filter sees the charge use.

        Args:
            max_order: the largest order to include (None: every finite order).
        """
        if self.is_zcdp:
            return float(self.rho)  # type: ignore[arg-type]
        a = np.asarray(ORDERS)
        keep = np.isfinite(a) if max_order is None else (np.isfinite(a) & (a <= max_order))
        if not keep.any():
            return math.inf
        return float(np.max(np.asarray(self.curve)[keep] / a[keep]))

    def epsilon(self, delta: float) -> float:
        """Shorthand for :func:`cost_epsilon` ``(self, delta)``."""
        return cost_epsilon(self, delta)

    # -- composition -------------------------------------------------------------------

    def __add__(self, other: object) -> "Cost":
        if isinstance(other, (int, float)) and not isinstance(other, bool) and other == 0:
            return self
        if not isinstance(other, Cost):
            return NotImplemented
        if self.is_zcdp and other.is_zcdp:
            kind = "gaussian" if self.kind == other.kind == "gaussian" else "zcdp"
            rho = float(self.rho) + float(other.rho)  # type: ignore[arg-type]
            a, b = self.gdp_bound, other.gdp_bound
            if kind == "zcdp" and a is not None and b is not None:
                return Cost("zcdp", rho=rho, gdp_mu=math.hypot(a, b))  # [DRS22] Cor. 3.3
            return Cost(kind, rho=rho)
        total = self.curve_at(ORDERS) + other.curve_at(ORDERS)
        return Cost("rdp", curve=tuple(total.tolist()))

    def __radd__(self, other: object) -> "Cost":
        if isinstance(other, (int, float)) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented

    # -- serialisation -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form: {"kind", "rho"[, "gdp_mu"]} or {"kind", "orders", "curve"}.

        Infinite curve values and the order ∞ are written as the string "inf"
        (strict JSON has no infinity). Round-trips exactly with :meth:`from_dict`.
        """
        if self.is_zcdp:
            out: dict[str, Any] = {"kind": self.kind, "rho": float(self.rho)}  # type: ignore[arg-type]
            if self.gdp_mu is not None:
                out["gdp_mu"] = float(self.gdp_mu)
            return out
        enc = lambda v: "inf" if math.isinf(v) else float(v)  # noqa: E731
        return {
            "kind": "rdp",
            "orders": [enc(a) for a in ORDERS],
            "curve": [enc(v) for v in self.curve],  # type: ignore[union-attr]
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Cost":
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: unknown kind, missing fields, a curve on another grid, bad values.
        """
        if not isinstance(data, Mapping):
            raise ValueError("cost must be a mapping")
        kind = data.get("kind")
        if kind in ("zcdp", "gaussian"):
            if "rho" not in data:
                raise ValueError("rho is required for a zcdp/gaussian cost")
            mu = data.get("gdp_mu")
            if mu is not None and kind != "zcdp":
                raise ValueError("gdp_mu is for 'zcdp' costs only")
            return cls(kind, rho=data["rho"], gdp_mu=mu)
        if kind == "rdp":
            dec = lambda v: math.inf if v in ("inf", "Infinity", "+inf") else v  # noqa: E731
            if "curve" not in data or not isinstance(data["curve"], (list, tuple)):
                raise ValueError("curve (a list) is required for an rdp cost")
            orders = data.get("orders", ORDERS)
            if not isinstance(orders, (list, tuple)):
                raise ValueError("orders must be a list")
            return cls.rdp([dec(v) for v in data["curve"]], [dec(a) for a in orders])
        raise ValueError(f"kind must be 'zcdp', 'gaussian' or 'rdp', got {kind!r}")


def cost_epsilon(cost: Cost, delta: float) -> float:
    """ε at δ of a (composed) cost, by the tightest conversion valid for its kind.

    "zcdp" → [CKS20] Cor. 13 (:func:`zcdp_epsilon_tight`); "gaussian" → exact
    Gaussian DP ([BW18] Thm. 8, :func:`gaussian_epsilon_exact`); "rdp" →
    [BBG+20] Thm. 21 on :data:`ORDERS` (:func:`rdp_epsilon_tight`).

    Raises:
        ValueError: ``cost`` not a Cost; δ outside [0, 1).
    """
    if not isinstance(cost, Cost):
        raise ValueError(f"cost must be a Cost, got {type(cost).__name__}")
    if cost.kind == "zcdp":
        return zcdp_epsilon_tight(cost.rho, delta)  # type: ignore[arg-type]
    if cost.kind == "gaussian":
        return gaussian_epsilon_exact(cost.rho, delta)  # type: ignore[arg-type]
    return rdp_epsilon_tight(cost.curve, delta, ORDERS)  # type: ignore[arg-type]

