"""Training runs (DP-SGD) charged from their parameters, the sampler checked (issue 23 item 5).

A DP-SGD run is described by its sampling rate ``q``, noise multiplier ``σ`` (noise standard
deviation over the clipping norm), number of ``steps`` and the batch ``sampler``. The gateway
computes the run's RDP curve itself (:func:`dpgate.accounting.dp_sgd_rdp`):

* ``poisson`` — the Poisson-subsampled Gaussian (Mironov, Talwar & Zhang 2019), amplified;
* ``shuffle``, ``fixed_batches``, ``with_replacement`` — no amplification: every step is the
  full-data Gaussian, ρ = steps/(2σ²). Amplification by subsampling is a theorem about
  Poisson sampling; shuffling into fixed batches is not Poisson sampling, and no proof for it
  is implemented here.

A caller may still supply its own curve (its accountant's): the charge is then marked
``"accountant": "caller"``; with parameters given too, the caller's curve must be at least the
gateway's at every order where the gateway's is finite, otherwise the charge is refused
(``invalid_budget``) before anything is written — an accountant that assumed amplification
the sampler does not give is caught here.

Pure: builds the :class:`~dpgate.accounting.Cost` and the metadata recorded with the charge;
the ledger (or :meth:`dpgate.service.Gateway.charge_external`) writes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from dpgate import accounting
from dpgate.errors import InvalidBudget

__all__ = ["DpSgdRun", "SAMPLERS", "external_cost", "CURVE_TOLERANCE"]

SAMPLERS = accounting.DP_SGD_SAMPLERS
#: Relative slack allowed when a caller's curve is compared with the gateway's (float noise
#: of another implementation of the same formula; dp-accounting agrees to ~1e-10).
CURVE_TOLERANCE = 1e-9
#: Largest number of steps accepted (the integer-order sum is O(α) per order, not per step).
MAX_STEPS = 100_000_000


def _enc(v: float) -> Any:
    return "inf" if math.isinf(v) else float(v)


@dataclass(frozen=True)
class DpSgdRun:
    """The parameters of one DP-SGD run.

    Attributes:
        q: sampling rate per step in (0, 1] (batch size over dataset size).
        noise_multiplier: σ/C > 0.
        steps: noisy gradient steps ≥ 1.
        sampler: one of :data:`SAMPLERS`.
    """

    q: float
    noise_multiplier: float
    steps: int
    sampler: str

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "DpSgdRun":
        """Validate ``{"q", "noise_multiplier", "steps", "sampler"}`` (the API's ``dp_sgd``).

        Raises:
            InvalidBudget: a missing, unknown or invalid field (named).
        """
        if not isinstance(data, Mapping):
            raise InvalidBudget("dp_sgd must be an object {q, noise_multiplier, steps, sampler}", {"field": "dp_sgd"})
        fields = {"q", "noise_multiplier", "steps", "sampler"}
        unknown = sorted(set(data) - fields)
        missing = sorted(fields - set(data))
        if unknown or missing:
            raise InvalidBudget(
                "dp_sgd needs exactly q, noise_multiplier, steps and sampler"
                + (f" (unknown: {', '.join(unknown)})" if unknown else "")
                + (f" (missing: {', '.join(missing)})" if missing else ""),
                {"field": "dp_sgd", "unknown": unknown, "missing": missing})
        q, sigma, steps, sampler = data["q"], data["noise_multiplier"], data["steps"], data["sampler"]
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < float(q) <= 1.0:
            raise InvalidBudget(f"dp_sgd.q must be a number in (0, 1], got {q!r}", {"field": "dp_sgd.q"})
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not 0.0 < float(sigma) < math.inf:
            raise InvalidBudget(f"dp_sgd.noise_multiplier must be finite and > 0, got {sigma!r}",
                                {"field": "dp_sgd.noise_multiplier"})
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
            raise InvalidBudget(f"dp_sgd.steps must be an integer in [1, {MAX_STEPS}], got {steps!r}",
                                {"field": "dp_sgd.steps"})
        variance = float(sigma) ** 2
        if variance == 0.0 or not math.isfinite(steps / (2.0 * variance)):
            # σ² underflows (or steps/(2σ²) overflows) in doubles: the curve cannot be computed
            # (a division by zero, NaN) and the run protects no one at any order
            raise InvalidBudget(f"dp_sgd.noise_multiplier {sigma!r} is too small: steps/(2σ²) is not a finite "
                                "number, so the run makes no privacy claim (nothing was charged)",
                                {"field": "dp_sgd.noise_multiplier"})
        if sampler not in SAMPLERS:
            raise InvalidBudget(f"dp_sgd.sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}",
                                {"field": "dp_sgd.sampler", "samplers": list(SAMPLERS)})
        return cls(float(q), float(sigma), int(steps), str(sampler))

    @property
    def amplified(self) -> bool:
        """True when the curve uses amplification by (Poisson) subsampling."""
        return self.sampler == "poisson" and self.q < 1.0

    def cost(self) -> accounting.Cost:
        """The run's cost (:func:`dpgate.accounting.dp_sgd_cost`)."""
        return accounting.dp_sgd_cost(self.q, self.noise_multiplier, self.steps, self.sampler)

    def formula(self) -> str:
        """One sentence: which formula the gateway charged, and why."""
        if self.amplified:
            return ("Poisson-subsampled Gaussian, steps × log(A_alpha)/(alpha − 1) (Mironov, Talwar & Zhang "
                    "2019, Sec. 3.3)")
        why = ("q = 1: every step sees the whole data" if self.sampler == "poisson" else
               f"sampler {self.sampler!r} is not Poisson sampling, so amplification by subsampling does not "
               "apply")
        return (f"no amplification ({why}): the full-data Gaussian at every step, rho = steps/(2 sigma^2) = "
                f"{self.steps / (2 * self.noise_multiplier ** 2):.6g}")

    def to_dict(self) -> dict[str, Any]:
        """``{q, noise_multiplier, steps, sampler}``."""
        return {"q": self.q, "noise_multiplier": self.noise_multiplier, "steps": self.steps,
                "sampler": self.sampler}


def _caller_cost(curve: Sequence[float], orders: Sequence[float] | None) -> accounting.Cost:
    if orders is None or tuple(float(a) for a in orders) == accounting.ORDERS:
        cost = accounting.Cost.rdp(list(curve))
        accounting.check_nondecreasing(cost.curve, accounting.ORDERS)
        return cost
    return accounting.Cost.rdp_on_orders(list(curve), [float(a) for a in orders])


def external_cost(*, kind: str = "rdp", curve: Sequence[float] | None = None,
                  orders: Sequence[float] | None = None, rho: float | None = None,
                  dp_sgd: Mapping[str, Any] | DpSgdRun | None = None) -> tuple[accounting.Cost, dict[str, Any]]:
    """The cost of an external charge and the metadata that records how it was computed.

    Args:
        kind: ``"rdp"`` (a caller's curve), ``"zcdp"`` / ``"gaussian"`` (a caller's ρ).
        curve, orders: the caller's RDP curve (``orders`` None: the ledger's grid).
        rho: the caller's ρ.
        dp_sgd: the run's parameters (:class:`DpSgdRun` or its mapping). Alone: the gateway's
            curve is charged. With ``curve``: the caller's curve is checked against it.

    Returns:
        ``(cost, metadata)``; metadata has ``accountant`` ("gateway" or "caller"), and with
        parameters ``dp_sgd`` (the parameters), ``formula`` and ``amplified``; with a caller
        curve on its own grid, ``caller_orders`` / ``caller_curve``.

    Raises:
        InvalidBudget: malformed input; a caller's curve below the gateway's for the stated
            parameters (the order, both values); ``dp_sgd`` with ``rho``.
    """
    run = None
    if dp_sgd is not None:
        run = dp_sgd if isinstance(dp_sgd, DpSgdRun) else DpSgdRun.from_mapping(dp_sgd)
    meta: dict[str, Any] = {}
    try:
        if run is not None and curve is None:
            if rho is not None:
                raise ValueError("give dp_sgd or rho, not both")
            cost = run.cost()
            meta.update(accountant="gateway", dp_sgd=run.to_dict(), formula=run.formula(), amplified=run.amplified)
            return cost, meta
        if kind == "rdp":
            if curve is None:
                raise ValueError("curve is required for kind 'rdp' (or describe the run with dp_sgd)")
            cost = _caller_cost(curve, orders)
            if orders is not None and tuple(float(a) for a in orders) != accounting.ORDERS:
                meta["caller_orders"] = [_enc(float(a)) for a in orders]
                meta["caller_curve"] = [_enc(float(v)) for v in curve]
        elif kind in ("zcdp", "gaussian"):
            if rho is None:
                raise ValueError(f"rho is required for kind {kind!r}")
            cost = accounting.Cost.zcdp(rho) if kind == "zcdp" else accounting.Cost.continuous_gaussian(rho)
        else:
            raise ValueError("kind must be 'rdp', 'zcdp' or 'gaussian'")
    except ValueError as exc:
        raise InvalidBudget(str(exc), {"kind": kind}) from None
    meta["accountant"] = "caller"
    if run is None:
        return cost, meta
    # the caller's curve, checked against the gateway's for the stated parameters
    mine = run.cost().curve_at(accounting.ORDERS)
    theirs = cost.curve_at(accounting.ORDERS)
    finite = np.isfinite(mine)
    short = finite & (theirs < mine * (1.0 - CURVE_TOLERANCE))
    meta.update(dp_sgd=run.to_dict(), formula=run.formula(), amplified=run.amplified)
    if short.any():
        i = int(np.flatnonzero(short)[0])
        alpha = accounting.ORDERS[i]
        raise InvalidBudget(
            f"the supplied RDP curve is below what the stated DP-SGD run costs at order alpha = {alpha:g}: "
            f"epsilon(alpha) = {theirs[i]:.6g} supplied, {mine[i]:.6g} by the gateway's accountant "
            f"({run.formula()}). An accountant that assumes amplification the sampler does not give (e.g. "
            "Poisson amplification for shuffled batches) undercounts; nothing was charged",
            {"order": alpha, "supplied": float(theirs[i]), "gateway": float(mine[i]), "dp_sgd": run.to_dict()})
    # where the gateway's curve makes no claim (+inf) the charge makes none either
    charged = np.where(finite, theirs, math.inf)
    if not np.array_equal(charged, theirs):
        cost = accounting.Cost.rdp(charged.tolist())
    return cost, meta
