"""Honest renewal (issue 23 item 2): spent budget is never given back to the same units.

Renewing a cap — zeroing its spend every month — is the tempting wrong answer to a budget that
runs out: a unit present in every period composes every period's spend. At ρ = 0.1 a month and
δ = 1e-6 each month looks like ε = 2.45, but a unit present for 12 months has lost ε = 9.34 and
after 36 months ε = 17.70 (Bun & Steinke 2016, Prop. 1.3; the tighter [CKS20] conversion the
ledger reports with gives 8.64 and 16.73). The published guarantee must say which applies.

What counts as *restoring spent budget* (refused, :class:`~dpgate.errors.RenewalRefused`, 409):

* a **reset or renewal** of a population's spend (``dpgate caps renew``, the admin form's
  renewal, ``POST /v1/admin/populations/{p}/renew``): the ledger has no such operation;
* a **policy edit that moves a dataset with charges to a fresh population** (renaming
  ``[dataset] population``): the units are the same people, and the new population would start
  at zero — refused when the gateway (or ``dpgate caps apply``) creates it;
* **switching cohorts on** (or off, or to another column) for a population that has charges:
  each cohort would start with a full cap while its units already spent.

What is *not* restoring spent budget, and stays allowed (a recorded governance event with a
reason): **raising the cap**. It gives the same units more budget, but every charge stays on
the ledger and the published guarantee becomes the new, larger total — the guarantee stays
true. The cap form and ``dpgate caps`` show the attack bound before and after
(:mod:`dpgate.attack`). A population with cohorts renews honestly by opening new cohorts: new
units, fresh budget; the units of old cohorts keep what they spent.

The arithmetic is the ledger's own (:func:`dpgate.accounting.periods_epsilon`), at the cap's
rate (one cap's ρ each period) and δ.
"""

from __future__ import annotations

from typing import Any

from dpgate import accounting
from dpgate.errors import RenewalRefused
from dpgate.ledger.caps import CapSpec

__all__ = ["RENEWAL_PERIODS", "renewal_arithmetic", "renewal_refused", "guarantee_statement"]

#: The periods the refusal states (a year and three years of monthly renewals).
RENEWAL_PERIODS: tuple[int, ...] = (12, 36)


def renewal_arithmetic(rho_per_period: float, delta: float,
                       periods: tuple[int, ...] = RENEWAL_PERIODS) -> dict[str, Any]:
    """What renewing ``rho_per_period`` each period costs a unit present in every period.

    Returns:
        ``{rho_per_period, delta, per_period {epsilon, epsilon_tight}, after: [{periods, rho,
        epsilon, epsilon_tight}]}`` — ``epsilon`` by [BS16] Prop. 1.3 (the seed's figures),
        ``epsilon_tight`` by [CKS20] Cor. 13 (the ledger's reporting conversion).
    """
    def both(n: int) -> dict[str, Any]:
        return {"periods": n, "rho": n * rho_per_period,
                "epsilon": accounting.periods_epsilon(rho_per_period, n, delta, "simple"),
                "epsilon_tight": accounting.periods_epsilon(rho_per_period, n, delta, "tight")}

    one = both(1)
    return {"rho_per_period": rho_per_period, "delta": delta,
            "per_period": {"epsilon": one["epsilon"], "epsilon_tight": one["epsilon_tight"]},
            "after": [both(n) for n in periods]}


def renewal_refused(population: str, cap: CapSpec, attempt: str, *,
                    cohort_column: str | None = None) -> RenewalRefused:
    """The refusal of ``attempt`` (e.g. "renewing the cap") for ``population`` under ``cap``.

    Without cohorts the message states the arithmetic at the cap's rate and the honest options;
    with cohorts, that the population renews only by opening new cohorts.
    """
    arith = renewal_arithmetic(cap.rho_cap, cap.rho_delta)
    pp = arith["per_period"]
    after = arith["after"]
    figures = " and ".join(f"epsilon = {a['epsilon']:.2f} after {a['periods']} periods" for a in after)
    tight = " and ".join(f"{a['epsilon_tight']:.2f}" for a in after)
    details = {"population": population, "attempt": attempt, "cohort_column": cohort_column,
               "renewal": arith, "cap": cap.public()}
    if cohort_column is not None:
        message = (f"{attempt} is refused: population {population!r} has cohorts ({cohort_column!r}) and renews only "
                   "by opening new cohorts. Declare the new cohort as a public key of the cohort column: a cohort "
                   "that no charge has touched starts with the whole cap, while the units of the old cohorts keep "
                   f"what they spent (renewing their budget would cost a unit present in every period {figures} at "
                   f"this cap's rho = {cap.rho_cap:.4g} per period, delta = {cap.rho_delta:.3g})")
        return RenewalRefused(message, details)
    message = (
        f"{attempt} would restore spent budget for the same units of population {population!r} and is refused: "
        f"this population has a fixed cap, no renewal. Renewing it each period makes each period's "
        f"rho = {cap.rho_cap:.4g} look like epsilon = {pp['epsilon']:.2f} (delta = {cap.rho_delta:.3g}), but a unit "
        f"present in every period loses {figures} (Bun & Steinke 2016, Prop. 1.3; {tight} by the tighter "
        "Canonne-Kamath-Steinke conversion the ledger reports spend with). The honest options: serve stored "
        "releases (free), answer from a proxy dataset ([dataset] proxy), give new units a fresh budget with "
        "cohorts ([population] cohort_column, for a new population), or raise the cap as a recorded governance "
        "decision (the published guarantee then becomes the new total)")
    return RenewalRefused(message, details)


def guarantee_statement(cap: CapSpec, cohort_column: str | None, cohorts: dict[str, Any] | None = None) -> str:
    """The published renewal rule: ``"fixed cap, no renewal: …"`` or ``"per cohort: …"``.

    Args:
        cap: the cap in force.
        cohort_column: the population's cohort column, or None.
        cohorts: cohort → ``{"epsilon": spent ε}`` for the cohorts charged so far (optional).
    """
    head = f"epsilon = {cap.epsilon:.4g}, delta = {cap.delta:.3g}"
    if cohort_column is None:
        return (f"fixed cap, no renewal: every unit's total loss over all releases, past and future, is at most "
                f"{head}")
    spent = ""
    if cohorts:
        parts = [f"units of cohort {c!r} have spent epsilon = {v['epsilon']:.4g}" for c, v in sorted(cohorts.items())]
        spent = "; " + "; ".join(parts)
    return (f"per cohort ({cohort_column!r}): the units of each cohort have a cap of {head}, spent only by the "
            f"releases that drew on that cohort; a new cohort starts with the whole cap{spent}")
