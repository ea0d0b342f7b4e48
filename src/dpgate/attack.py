"""The membership-attack bound of a cap and of a spend (issue 23 item 4: choosing a cap).

Against an (ε, δ)-DP release, any test of "is unit x in the data?" has
TPR ≤ e^ε·FPR + δ (and ≤ 1 − e^−ε·(1 − δ − FPR)) at every false-positive rate: the privacy
region of Kairouz, Oh & Viswanath 2015, Thm. 2.1 (after Wasserman & Zhou 2010). A cap is
easier to choose in these terms: at ε = 4, δ = 1e-6 an attacker who accepts 1 % false
positives may reach 55 % true positives — at ε = 1, only 2.7 %.

This module builds the published bound (pure; the formulas are in :mod:`dpgate.accounting`):

* ``dp`` — the (ε, δ) region at the cap's (or the spend's) ε and δ;
* ``zcdp`` — for the cap (the ledger enforces it as B(α) = α·ρ_cap at the orders up to α_cap,
  which every admitted history meets) and for histories of ρ-costs (our discrete Gaussian):
  :func:`~dpgate.accounting.rdp_true_positive_rate` / :func:`~dpgate.accounting.zcdp_true_positive_rate`
  (Mironov 2017 Prop. 10 and the intersection of the (ε(δ'), δ') regions), plus the selection δ;
* ``gdp`` — only for histories of *continuous* Gaussian mechanisms (external charges of kind
  ``gaussian``, e.g. DP-SGD without amplification): the exact trade-off
  TPR = Φ(Φ⁻¹(FPR) + μ), μ = √(2ρ) (Dong, Roth & Su 2022, Def. 2.6, Cor. 3.3).

**Assumption stated with every bound**: the discrete Gaussian of our own releases is ρ-zCDP
(Canonne, Kamath & Steinke 2020, Thm. 4) but is not claimed μ-GDP, so its histories get the
zCDP bound, not the Gaussian trade-off curve; the GDP curve would be smaller, and is not proven
for it here. The ``tightest`` figure is the smallest *valid* bound.
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache
from typing import Any, Sequence

from dpgate import accounting

__all__ = ["FPR", "FPR_GRID", "attack_bound", "cap_attack_bound", "spend_attack_bound", "ASSUMPTION"]

#: The false-positive rate the bound is quoted at.
FPR = 0.01
#: The FPRs of the published curve.
FPR_GRID: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
#: What the bound assumes of our discrete Gaussian (published with it).
ASSUMPTION = ("discrete Gaussian releases are bounded as rho-zCDP (Canonne, Kamath & Steinke 2020, Thm. 4), "
              "not as Gaussian DP: the tighter Gaussian trade-off curve is used only for histories of continuous "
              "Gaussian mechanisms (external charges of kind 'gaussian')")


def _clip(x: float) -> float:
    return max(0.0, min(1.0, x))


def attack_bound(epsilon: float, delta: float, *, rho: float | None = None, curve: Sequence[float] | None = None,
                 orders: Sequence[float] | None = None, mu: float | None = None, extra_delta: float = 0.0,
                 fpr: float = FPR, fprs: Sequence[float] = FPR_GRID) -> dict[str, Any]:
    """The TPR bound at ``fpr`` and the curve over ``fprs`` of a guarantee.

    Args:
        epsilon, delta: the (ε, δ) guarantee (ε may be ∞: no bound, TPR ≤ 1).
        rho: a total ρ-zCDP guarantee as well (e.g. the spend of discrete Gaussian releases).
        curve, orders: an RDP guarantee as well (ε(α) at ``orders``; e.g. a cap's B(α)).
        mu: a μ-GDP guarantee as well (continuous Gaussians only).
        extra_delta: a δ added to the zCDP/RDP/GDP bounds (the selection δ of approximate zCDP).
        fpr: the quoted false-positive rate; fprs: the curve's.

    Returns:
        ``{fpr, epsilon, delta, dp: {tpr, curve}, [zcdp|rdp|gdp: {…, tpr, curve}], tightest: {tpr,
        bound, curve}, fprs, source}`` (TPRs in [0, 1]; ∞ as "inf").
    """
    grid = sorted(set(fprs) | {fpr})
    at = grid.index(fpr)
    eps_ok = math.isfinite(epsilon)
    dp = [accounting.max_true_positive_rate(epsilon, delta, f) if eps_ok else 1.0 for f in grid]
    out: dict[str, Any] = {
        "fpr": fpr,
        "epsilon": epsilon if eps_ok else "inf",
        "delta": delta,
        "fprs": grid,
        "dp": {"tpr": accounting.max_true_positive_rate(epsilon, delta, fpr) if eps_ok else 1.0, "curve": dp,
               "source": "Kairouz, Oh & Viswanath 2015, Thm. 2.1: TPR <= e^epsilon * FPR + delta"},
    }
    candidates = {"dp": out["dp"]}
    if rho is not None and math.isfinite(rho):
        zc = [_clip(v + extra_delta) for v in accounting.zcdp_attack_curve(rho, grid).tolist()]
        out["zcdp"] = {"rho": rho, "tpr": zc[at],
                       "curve": zc, "extra_delta": extra_delta,
                       "source": "rho-zCDP: Mironov 2017 Prop. 10 and the (epsilon(delta'), delta') regions "
                                 "(Canonne, Kamath & Steinke 2020, Cor. 13)"}
        candidates["zcdp"] = out["zcdp"]
    if curve is not None and orders is not None:
        rc = [_clip(v + extra_delta) for v in accounting.rdp_attack_curve(curve, grid, orders).tolist()]
        out["rdp"] = {"orders": list(orders), "tpr": rc[at],
                      "curve": rc, "extra_delta": extra_delta,
                      "source": "RDP at the cap's checked orders: Mironov 2017 Prop. 10 and the (epsilon(delta'), "
                                "delta') regions (Balle et al. 2020, Thm. 21)"}
        candidates["rdp"] = out["rdp"]
    if mu is not None:
        gc = [_clip(accounting.gdp_true_positive_rate(mu, f) + extra_delta) for f in grid]
        out["gdp"] = {"mu": mu, "tpr": _clip(accounting.gdp_true_positive_rate(mu, fpr) + extra_delta), "curve": gc,
                      "source": "Gaussian DP: TPR = Phi(Phi^-1(FPR) + mu) (Dong, Roth & Su 2022, Def. 2.6)"}
        candidates["gdp"] = out["gdp"]
    best = min(candidates, key=lambda k: candidates[k]["tpr"])
    out["tightest"] = {"bound": best, "tpr": candidates[best]["tpr"],
                       "curve": [min(c["curve"][i] for c in candidates.values()) for i in range(len(grid))]}
    out["assumption"] = ASSUMPTION
    return out


@lru_cache(maxsize=256)
def _cap_bound(cap: Any) -> dict[str, Any]:
    orders = list(cap.checked_orders)
    return attack_bound(cap.epsilon, cap.delta, curve=[a * cap.rho_cap for a in orders], orders=orders,
                        extra_delta=cap.selection_delta)


def cap_attack_bound(cap: Any) -> dict[str, Any]:
    """The bound of a cap (:class:`~dpgate.ledger.caps.CapSpec`): its (ε, δ), and the RDP budget
    B(α) = α·ρ_cap at the orders its filter checks (every admitted history meets it), plus the
    selection δ. Memoised per cap (a copy is returned)."""
    return copy.deepcopy(_cap_bound(cap))


def spend_attack_bound(report: Any) -> dict[str, Any]:
    """The bound of what a spend report (:class:`~dpgate.ledger.reports.SpendReport`) has spent:
    (ε spent, δ) always; the zCDP bound for a history of ρ-costs (``conversion`` "zcdp", or
    "ledger" with a finite ρ bound); the
    Gaussian trade-off for continuous Gaussians only ("gaussian"); plus the selection δ spent."""
    d = report.cap.rho_delta if report.cap is not None else report.delta
    conversion = "gaussian" if getattr(report, "continuous_gaussian", False) else report.conversion
    return copy.deepcopy(_spend_bound(conversion, report.spent_epsilon, report.spent_rho, d,
                                      report.selection_delta_spent))


@lru_cache(maxsize=1024)
def _spend_bound(conversion: str, eps: float, rho: float, d: float, extra: float) -> dict[str, Any]:
    if conversion == "none":
        return attack_bound(0.0, 0.0)
    if conversion == "zcdp" or (conversion == "ledger" and math.isfinite(rho)):
        # "ledger": the ledger's one conversion of a spend whose ρ bound (max ε(α)/α) is finite:
        # ε(α) ≤ ρ·α at every order, so the history is ρ-zCDP and the zCDP bound holds
        return attack_bound(eps, d + extra, rho=rho, extra_delta=extra)
    if conversion == "gaussian":
        return attack_bound(eps, d + extra, rho=rho, mu=accounting.gdp_mu(rho), extra_delta=extra)
    return attack_bound(eps, d + extra)
