"""``{"ci95": w}`` means the released cell (issue 9 item 7).

Unit tests of :func:`dpgate.postprocess.calibration.scales_for_ci95` with hand-derived values,
and the gateway: explain states the cost and whether it fits, a query that does not fit is
refused with ``budget_exhausted`` and nothing charged, and the release says which
approximation applied.
"""

from __future__ import annotations

import math

import pytest

from dpgate.errors import BudgetExhausted, InvalidBudget
from dpgate.mechanisms import ci_halfwidth, sigma_for_ci95
from dpgate.postprocess.calibration import CellTarget, scales_for_ci95
from dpgate.service import QueryBudget
from tests.shared_data import smartnoise_dir

Z = 1.959963984540054
#: The normal quantile of each AVG part's interval: 97.5 % two-sided (0.05/2 per part, so the
#: box covers both parts with probability ≥ 95 % by the union bound), z = Φ⁻¹(1 − 0.0125).
Z_AVG = 2.2414027276049464


def part_hw(mechanism: str, scale: float, parts: int) -> float:
    """The half-width the release uses for one of a ratio cell's parts: 1 − 0.05/parts."""
    return ci_halfwidth(mechanism, scale, 0.05 / parts)


def rho(deltas: dict[str, float], scales: dict[str, float]) -> float:
    """ρ = Σ Δ²/(2σ²) (Canonne, Kamath & Steinke 2020, Thm. 4), integer units."""
    return sum(deltas[p] ** 2 / (2 * scales[p] ** 2) for p in scales)


# --- counts and sums: exact ----------------------------------------------------------------------


def test_count_and_sum_take_the_exact_inverse():
    targets = [CellTarget("n", "count", ("p0",)), CellTarget("s", "sum", ("p1",))]
    out = scales_for_ci95(targets, {"p0": 4.0, "p1": 400.0}, {"p0": 1.0, "p1": 0.5},
                          mechanism="gaussian", halfwidth=20.0)
    assert out.scales["p0"] == sigma_for_ci95("gaussian", 20.0)
    assert out.scales["p1"] == sigma_for_ci95("gaussian", 40.0)  # 20 output units = 40 steps of 0.5
    assert out.predicted["n"] <= 20.0 and out.predicted["s"] <= 20.0
    assert out.rules["n"].startswith("exact")


# --- AVG: interval arithmetic at the expected count ----------------------------------------------


def avg_case(mechanism="gaussian"):
    # AVG(income), income ∈ [0, 500000], m = 4: Δ_S = 4·500000 (integer units of resolution 1),
    # Δ_C = 4; target ±5000 at an expected count of 1900.
    targets = [CellTarget("avg_income", "avg", ("s", "c"), (0.0, 500_000.0))]
    deltas = {"s": 2_000_000.0, "c": 4.0}
    out = scales_for_ci95(targets, deltas, {"s": 1.0, "c": 1.0}, mechanism=mechanism, halfwidth=5000.0,
                          expected_count=1900)
    return out, deltas


def test_avg_meets_the_bound_at_the_expected_count():
    out, _ = avg_case()
    hs, hc = (part_hw("gaussian", out.scales[p], 2) for p in ("s", "c"))
    # the reported half-width at C = n, any mean in [0, M]: (h_S + M·h_C)/(n − h_C) ≤ w
    bound = (hs + 500_000 * hc) / (1900 - hc)
    assert bound <= 5000.0
    assert out.predicted["avg_income"] == pytest.approx(bound)
    # and it is nearly tight: 10 % more noise on both parts breaks it
    hs2, hc2 = (part_hw("gaussian", 1.1 * out.scales[p], 2) for p in ("s", "c"))
    assert (hs2 + 500_000 * hc2) / (1900 - hc2) > 5000.0


def test_avg_cost_matches_the_lagrange_optimum():
    # Continuous limit (h ≈ z·σ, z = 2.2414 for each part's 97.5 % interval): minimise
    # Δ_S²/2σ_S² + Δ_C²/2σ_C² subject to z·(σ_S + K·σ_C) = w·n with K = M + w (from
    # (h_S + M·h_C)/(n − h_C) ≤ w). Lagrange gives σ_i ∝ (Δ_i²/a_i)^{1/3} and
    # ρ* = (Δ_S^{2/3} + (K·Δ_C)^{2/3})³ / (2R²), R = w·n/z.
    out, deltas = avg_case()
    K, R = 500_000 + 5000, 5000 * 1900 / Z_AVG
    optimum = (deltas["s"] ** (2 / 3) + (K * deltas["c"]) ** (2 / 3)) ** 3 / (2 * R**2)
    assert optimum == pytest.approx(0.8994, rel=1e-3)  # by hand: (15874 + 15980)³ / (2 · 4.2385e6²)
    # the exact discrete half-widths are a little below z·σ (integers, P(|Z| ≤ t) ≥ 0.975), so
    # slightly more noise fits: at most the continuous optimum, and not far below it
    assert 0.9 * optimum <= rho(deltas, out.scales) <= optimum * 1.001
    # … and no split along the constraint does better (brute force over 400 splits)
    best = math.inf
    for i in range(1, 400):
        hc = i * 0.05  # output units of the count's half-width
        hs = 5000 * 1900 - (500_000 + 5000) * hc
        if hs <= 0:
            break
        # the largest σ whose 97.5 % half-width is ≤ the target (bisection on the monotone map)
        sc, ss = sigma_at("gaussian", hc, 2), sigma_at("gaussian", hs, 2)
        best = min(best, rho(deltas, {"s": ss, "c": sc}))
    assert rho(deltas, out.scales) <= best * 1.001


def sigma_at(mechanism: str, halfwidth: float, parts: int) -> float:
    """The largest σ whose (1 − 0.05/parts) half-width is ≤ ``halfwidth`` (bisection)."""
    lo, hi = 1e-6, 1e12
    while hi / lo > 1 + 1e-12:
        mid = math.sqrt(lo * hi)
        if part_hw(mechanism, mid, parts) <= halfwidth:
            lo = mid
        else:
            hi = mid
    return lo


def test_the_issue_example_no_longer_costs_thousands():
    # Before: ±5000 on the hidden noisy sum alone, σ_S = 5000/1.96 → ρ = 2e6²/(2·2551²) ≈ 3.1e5
    # for the sum (19,207 in the issue's policy). Now the released AVG is the target.
    out, deltas = avg_case()
    assert rho(deltas, out.scales) < 1.0


def test_avg_with_the_laplace_mechanism():
    out, _ = avg_case("laplace")
    hs, hc = (part_hw("laplace", out.scales[p], 2) for p in ("s", "c"))
    assert (hs + 500_000 * hc) / (1900 - hc) <= 5000.0


def test_ratios_need_an_expected_count():
    targets = [CellTarget("a", "avg", ("s", "c"), (0.0, 100.0))]
    with pytest.raises(InvalidBudget) as e:
        scales_for_ci95(targets, {"s": 100.0, "c": 1.0}, {"s": 1.0, "c": 1.0}, mechanism="gaussian",
                        halfwidth=1.0)
    assert "expected_count" in e.value.message and e.value.details["field"] == "expected_count"
    for bad in (1.0, 0.5, math.inf, math.nan):
        with pytest.raises(InvalidBudget):
            scales_for_ci95(targets, {"s": 100.0, "c": 1.0}, {"s": 1.0, "c": 1.0}, mechanism="gaussian",
                            halfwidth=1.0, expected_count=bad)


# --- VAR and STDDEV ----------------------------------------------------------------------------------


def var_bound(hq, hs, hc, big, n):
    e1 = (hs + big * hc) / (n - hc)
    e2 = (hq + big * big * hc) / (n - hc)
    return e2 + 2 * big * e1 + e1 * e1


def test_var_and_stddev_bounds():
    # age ∈ [0, 100], m = 1 (Δ_Q = 100², Δ_S = 100, Δ_C = 1), n = 1000.
    deltas = {"q": 10_000.0, "s": 100.0, "c": 1.0}
    units = {"q": 1.0, "s": 1.0, "c": 1.0}
    var = scales_for_ci95([CellTarget("v", "var_pop", ("q", "s", "c"), (0.0, 100.0))], deltas, units,
                          mechanism="gaussian", halfwidth=50.0, expected_count=1000)
    h = {p: part_hw("gaussian", var.scales[p], 3) for p in deltas}
    assert var_bound(h["q"], h["s"], h["c"], 100.0, 1000) <= 50.0
    sd = scales_for_ci95([CellTarget("d", "stddev_pop", ("q", "s", "c"), (0.0, 100.0))], deltas, units,
                         mechanism="gaussian", halfwidth=2.0, expected_count=1000)
    h = {p: part_hw("gaussian", sd.scales[p], 3) for p in deltas}
    # worst case over the variance: √(H_var) ≤ w, i.e. H_var ≤ 4
    assert math.sqrt(var_bound(h["q"], h["s"], h["c"], 100.0, 1000)) <= 2.0
    assert "worst case" in sd.rules["d"]


def test_a_shared_primitive_takes_the_smallest_scale():
    # COUNT(age) and AVG(age) share the non-NULL count: it must meet both targets.
    targets = [CellTarget("n", "count_column", ("c",)), CellTarget("a", "avg", ("s", "c"), (0.0, 100.0))]
    deltas, units = {"s": 100.0, "c": 1.0}, {"s": 1.0, "c": 1.0}
    both = scales_for_ci95(targets, deltas, units, mechanism="gaussian", halfwidth=3.0, expected_count=500)
    alone = scales_for_ci95(targets[1:], deltas, units, mechanism="gaussian", halfwidth=3.0, expected_count=500)
    assert both.scales["c"] == min(alone.scales["c"], sigma_for_ci95("gaussian", 3.0))
    assert both.predicted["n"] <= 3.0 and both.predicted["a"] <= 3.0


# --- the gateway -------------------------------------------------------------------------------------

shared = pytest.mark.skipif(not (smartnoise_dir() / "PUMS_dup.csv").exists(),
                            reason="../shared/data not present")


@pytest.fixture
def gateway(tmp_path):
    from tests.test_service import make_gateway

    g = make_gateway(tmp_path, epsilon=200.0)
    yield g
    g.close()


@shared
def test_release_meets_the_target_and_says_how(gateway):
    b = QueryBudget(ci95=5000.0, expected_count=1900)
    explained = gateway.explain("pums", "SELECT AVG(income), COUNT(*) FROM persons", budget=b,
                                consumer="analysts")
    assert explained["cost"]["fits"] is True and "fits" in explained["cost"]["message"]
    cells = explained["accuracy_target"]["cells"]
    assert cells["AVG(income)"]["ci95_at_most"] <= 5000.0 and cells["COUNT(*)"]["ci95_at_most"] <= 5000.0
    release = gateway.query("pums", "SELECT AVG(income), COUNT(*) FROM persons", consumer="analysts", budget=b)
    # PUMS_dup has 1,948 rows (≥ the expected 1,900): the reported half-width is within the target
    assert release["accuracy"]["AVG(income)"]["ci95"] <= 5000.0
    assert release["accuracy"]["COUNT(*)"]["ci95"] <= 5000.0
    assert release["charge"]["rho"] == pytest.approx(explained["cost"]["rho"], rel=1e-9)
    target = release["budget"]["accuracy_target"]
    assert target["expected_count"] == 1900 and "interval arithmetic" in target["cells"]["AVG(income)"]["rule"]


@shared
def test_a_cost_beyond_what_is_left_is_explained_and_refused_free(tmp_path):
    from tests.test_service import make_gateway

    gateway = make_gateway(tmp_path)  # cap ε = 4: the analysts have ρ ≈ 0.16 left
    b = QueryBudget(ci95=0.5)  # a count exact to ±0 needs a tiny σ: ρ ≈ 58
    explained = gateway.explain("pums", "SELECT COUNT(*) FROM persons", budget=b, consumer="analysts")
    assert explained["cost"]["fits"] is False
    assert "does NOT fit" in explained["cost"]["message"] and "budget_exhausted" in explained["cost"]["message"]
    before = gateway.ledger.spend("census-people").charges
    with pytest.raises(BudgetExhausted):
        gateway.query("pums", "SELECT COUNT(*) FROM persons", consumer="analysts", budget=b)
    assert gateway.ledger.spend("census-people").charges == before
    gateway.close()


@shared
def test_avg_without_an_expected_count_is_refused_with_the_fix(gateway):
    with pytest.raises(InvalidBudget) as e:
        gateway.explain("pums", "SELECT AVG(income) FROM persons", budget=QueryBudget(ci95=5000.0))
    assert "expected_count" in e.value.message
    with pytest.raises(InvalidBudget):
        QueryBudget(rho=1.0, expected_count=100)


def test_api_accepts_expected_count():
    from dpgate.api.schemas import BudgetRequest

    assert BudgetRequest(ci95=5.0, expected_count=100).to_query_budget().expected_count == 100
    # the API schema types the fields; the one validator (QueryBudget) refuses the values
    with pytest.raises(InvalidBudget):
        BudgetRequest(ci95=5.0, expected_count=0.5).to_query_budget()
    with pytest.raises(InvalidBudget):
        BudgetRequest(rho=0.1, expected_count=100).to_query_budget()


@shared
def test_noise_calibrated_for_an_avg_does_not_answer_a_sum_at_the_same_ci95(gateway):
    # Found by a hostile trial: AVG(income) at ci95 = 20,000 (expected 700 rows) gives the hidden
    # sum a σ fitted to the ratio (its own half-width ≈ 20,000·700 = 1.4e7), and the same budget
    # then answered SUM(income), COUNT(income) from that noise for free with a SUM ci95 of ~7e6.
    # The noise key of a ci95 budget names the cells it was calibrated for: the second query is
    # calibrated for its own cells — a SUM of incomes in [0, 500,000] within ±20,000 costs
    # ρ ≈ 19,000, far beyond what is left — so it is refused before any charge.
    b = QueryBudget(ci95=20_000.0, expected_count=700)
    first = gateway.query("pums", "SELECT AVG(income) FROM persons WHERE sex = 1", consumer="analysts", budget=b)
    assert first["accuracy"]["AVG(income)"]["ci95"] <= 20_000.0
    population = gateway.population_of("pums")
    before = gateway.ledger.spend(population).charges
    with pytest.raises(BudgetExhausted):
        gateway.query("pums", "SELECT SUM(income), COUNT(income) FROM persons WHERE sex = 1",
                      consumer="analysts", budget=b)
    assert gateway.ledger.spend(population).charges == before
    # a COUNT alone at that ci95 is cheap: a new release of its own whose cell meets the target
    count = gateway.query("pums", "SELECT COUNT(income) FROM persons WHERE sex = 1", consumer="analysts", budget=b)
    assert count["cached"] is False and count["charge"]["rho"] > 0
    assert count["accuracy"]["COUNT(income)"]["ci95"] <= 20_000.0
    # a rho budget still shares the noisy primitives between the two (post-processing, free)
    r = QueryBudget(rho=0.05)
    gateway.query("pums", "SELECT AVG(income) FROM persons WHERE sex = 0", consumer="analysts", budget=r)
    shared_noise = gateway.query("pums", "SELECT SUM(income), COUNT(income) FROM persons WHERE sex = 0",
                                 consumer="analysts", budget=r)
    assert shared_noise["cached"] is True and shared_noise["charge"] is None
