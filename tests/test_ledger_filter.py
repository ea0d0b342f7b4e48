"""Property tests of the ledger's filter decision and totals (pure functions, no database).

The decision of :func:`dpgate.ledger.base.filter_decision` is compared with a brute-force
re-implementation of the rule written here from its statement (sums recomputed from scratch
with ``math.fsum`` for every request), and the safety claim is checked: whatever sequence of
charges is admitted, the reported ε of the whole history stays within the published cap.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dpgate import accounting
from dpgate.accounting import ORDERS, Cost
from dpgate.ledger.base import TOLERANCE, BudgetCurve, Totals, build_spend_report, filter_decision, validate_cap

FINITE = [a for a in ORDERS if math.isfinite(a)]

costs = st.one_of(
    st.tuples(st.just("zcdp"), st.floats(1e-5, 0.4)),
    st.tuples(st.just("gaussian"), st.floats(1e-5, 0.4)),
    st.tuples(st.just("pure"), st.floats(1e-3, 1.5)),
    st.tuples(st.just("laplace"), st.floats(1e-3, 1.5)),
    st.tuples(st.just("gauss_rdp"), st.floats(1e-5, 0.4)),
    # a request sized to what remains (× 0.97 … 1.03): exercises the boundary
    st.tuples(st.just("fill_rdp"), st.floats(0.97, 1.03)),
    st.tuples(st.just("fill_zcdp"), st.floats(0.97, 1.03)),
)


def make(kind: str, x: float) -> Cost:
    if kind == "zcdp":
        return Cost.zcdp(x)
    if kind == "gaussian":
        return Cost.continuous_gaussian(x)
    if kind == "pure":
        return Cost.pure(x)
    if kind == "laplace":
        return Cost.laplace(x)
    return Cost.rdp(accounting.gaussian_rdp(x))


def brute_force(accepted: list[Cost], req: Cost, rho_b: float, a_star: float) -> tuple[bool, float]:
    """The rule from its statement; returns (admit, smallest relative margin)."""
    allc = accepted + [req]
    slack = 1 + TOLERANCE
    if all(c.is_zcdp for c in allc):
        total = math.fsum(c.rho for c in allc)
        return total <= rho_b * slack, abs(total / (rho_b * slack) - 1)
    rho = math.fsum(c.rho for c in allc if c.is_zcdp)
    rdp = [c for c in allc if not c.is_zcdp]
    ok, margin = True, math.inf
    for i, a in enumerate(FINITE):
        s = a * rho + math.fsum(c.curve[i] for c in rdp)
        lim = a * rho_b * slack
        ok &= s <= lim
        margin = min(margin, abs(s / lim - 1))
    # α*: Σ of RDP curves bounded by min(next grid value, chord of (α−1)·c(α))
    i2 = next(i for i, a in enumerate(ORDERS) if a >= a_star)
    col = [math.fsum(c.curve[j] for c in rdp) for j in range(len(ORDERS))]
    bound = col[i2]
    if 0 < i2 and math.isfinite(ORDERS[i2]) and ORDERS[i2] != a_star:
        a1, a2 = ORDERS[i2 - 1], ORDERS[i2]
        lam = (a2 - a_star) / (a2 - a1)
        bound = min(bound, (lam * (a1 - 1) * col[i2 - 1] + (1 - lam) * (a2 - 1) * col[i2]) / (a_star - 1))
    s = a_star * rho + bound
    lim = a_star * rho_b * slack
    ok &= s <= lim
    margin = min(margin, abs(s / lim - 1))
    return ok, margin


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    eps=st.floats(0.3, 8.0),
    delta=st.sampled_from([1e-5, 1e-6, 1e-8]),
    share=st.sampled_from([1.0, 0.5, 0.25]),
    seq=st.lists(costs, min_size=1, max_size=25),
)
def test_filter_matches_the_rule_and_keeps_the_published_cap(eps, delta, share, seq):
    cap = validate_cap(eps, delta)
    budget = BudgetCurve(share * cap.rho_cap, cap.alpha_star)
    totals = Totals()
    accepted: list[Cost] = []
    for kind, x in seq:
        if kind.startswith("fill_"):
            room = budget.rho - totals.rho_equivalent(budget)
            if room <= 1e-9 * budget.rho:
                continue
            kind, x = ("gauss_rdp" if kind == "fill_rdp" else "zcdp"), x * room / cap.rho_cap
        req = make(kind, x * cap.rho_cap if kind in ("zcdp", "gaussian", "gauss_rdp") else x)
        want, margin = brute_force(accepted, req, budget.rho, budget.alpha_star)
        got = filter_decision(totals, req, budget)
        if margin > 1e-9:  # away from exact ties, rounding cannot flip the decision
            assert got.ok == want, (kind, x, got)
        event("refused" if not got.ok else ("admitted mixed" if not totals.zcdp_only or not req.is_zcdp
                                              else "admitted zcdp"))
        if got.ok:
            totals = totals.add(req)
            accepted.append(req)
    # exact totals: the ρ part is the correctly rounded exact sum of the entries
    assert totals.rho_value == math.fsum(c.rho for c in accepted if c.is_zcdp)
    assert totals.charges == len(accepted)
    if any(not c.is_zcdp for c in accepted):
        expect = [math.fsum(c.curve[i] for c in accepted if not c.is_zcdp) for i in range(len(ORDERS))]
        assert np.array_equal(totals.curve_values(), np.asarray(expect))
    # the published guarantee holds for what was admitted (population scope, share 1)
    if share == 1.0:
        rep = build_spend_report("p", cap, {}, totals, {})
        assert rep.spent_epsilon <= eps * (1 + 1e-9)
        assert rep.spent_rho <= cap.rho_cap * (1 + 1e-9)
        assert rep.remaining_rho >= 0.0


@settings(max_examples=40, deadline=None)
@given(rhos=st.lists(st.floats(1e-12, 1.0), min_size=1, max_size=200))
def test_totals_are_exact_sums(rhos):
    t = Totals()
    for r in rhos:
        t = t.add(Cost.zcdp(r))
    assert t.rho_value == math.fsum(rhos)
    back = Totals.from_row(*t.to_row())
    assert back == t


@settings(max_examples=40, deadline=None)
@given(rho=st.floats(1e-4, 5.0), delta=st.sampled_from([1e-5, 1e-6, 1e-9]))
def test_zcdp_history_up_to_the_cap(rho, delta):
    cap = validate_cap(None, delta, rho_cap=rho)
    b = BudgetCurve(cap.rho_cap, cap.alpha_star)
    half = Totals().add(Cost.zcdp(rho / 2))
    assert filter_decision(half, Cost.zcdp(rho / 2), b).ok
    assert not filter_decision(half, Cost.zcdp(rho / 2 * (1 + 1e-9)), b).ok
