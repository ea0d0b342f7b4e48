"""Private bounds (issue 22 item 3): ``bounds = "private"`` with ``outer = [lo, hi]``.

What is checked, each against an independent value:

* the policy refusals at load (non-numeric, no outer, non-finite or reversed outer, public keys, …)
  and a GROUP BY on the column at query time, all before any charge;
* the estimate's privacy cost by hand: OpenDP's exponential mechanism (Gumbel report-noisy-max) on
  ``make_quantile_score_candidates`` scores with Δ∞ = max(num, den − num) for one element per unit
  is ε = 2Δ∞/s-DP, hence ε²/8-zCDP (Cesar & Rogers 2021, ALT, Lemma 3.2); OpenDP's own
  ``make_private_quantile(…).map(1)`` and scorer as oracles;
* the charges: the estimate is a separate ledger charge written before its histogram is read, the
  query's charge equals its calibrated cost, the two add up to the requested ρ, and a second query
  reuses the stored estimate for free (one estimate charge in the ledger);
* neighbouring data: removing one unit moves the estimate's input (the per-unit histogram) by one
  element, and the bounded SUM with a *given* clamp by at most the sensitivity computed from that
  clamp (hypothesis);
* adversarial values (NaN, ±inf, NULL, 1e300) in the column;
* explain before paying: the estimate and its cost, the ± at the outer range, nothing charged.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import opendp.prelude as dp
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate import private_bounds as estimate
from dpgate.errors import BudgetExhausted, InvalidBudget, PolicyError, UnsupportedQuery
from dpgate.pipeline import private_bounds as hook
from dpgate.pipeline.budget import QueryBudget
from dpgate.pipeline.planning import compile_query
from dpgate.policy import load_policies
from dpgate.quantiles import alpha_fraction, scores
from dpgate.render.private_bounds import BIN, COUNT, histogram_tree
from dpgate.service import Gateway
from dpgate.settings import Settings
from _engines import as_query

dp.enable_features("contrib")

POLICY = """
[dataset]
name = "shop"
population = "shoppers"
data_version = "v1"

[budget]
epsilon = 20.0
delta = 1e-6
default_query_rho = 0.5
{budget_extra}

[tables.orders]
source = "{source}"
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.orders.columns]
user_id = {{ type = "int" }}
region = {{ type = "text", public_keys = ["eu", "us", "apac"] }}
{amount}
"""
PRIVATE = 'amount = { type = "int", bounds = "private", outer = [0, 1000000] }'


def _rows(n_users: int = 400) -> list[str]:
    lines = ["user_id,region,amount"]
    for u in range(n_users):
        for j in range(1 + u % 3):  # 1-3 rows per unit
            amount = (u * 7 + j * 13) % 101 if u % 50 else 5000 + u  # a few heavy units
            lines.append(f"{u},{['eu', 'us', 'apac'][u % 3]},{amount}")
    return lines


def write(root: Path, *, amount: str = PRIVATE, budget_extra: str = "", lines: list[str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    csv = root / "orders.csv"
    csv.write_text("\n".join(lines or _rows()) + "\n")
    folder = root / "policies"
    folder.mkdir(exist_ok=True)
    (folder / "shop.toml").write_text(POLICY.format(source=csv.as_posix(), amount=amount, budget_extra=budget_extra))
    return folder


def open_gw(root: Path, **kw) -> Gateway:
    folder = write(root, **kw)
    return Gateway.open(Settings(policies=folder, home=root / "home"), salt_source=lambda: 12345)


@pytest.fixture
def gw(tmp_path):
    g = open_gw(tmp_path / "shop")
    yield g
    g.close()


def _charges(gw: Gateway) -> list[dict]:
    return [e for e in gw.ledger_entries() if e.get("type") == "charge"]


# ---------------------------------------------------------------- policy refusals


@pytest.mark.parametrize("amount,fragment", [
    ('amount = { type = "text", bounds = "private", outer = [0, 10] }', "needs a numeric column"),
    ('amount = { type = "int", bounds = "private" }', "needs outer = [lo, hi]"),
    ('amount = { type = "float", bounds = "private", outer = [0, inf] }', "outer must be finite"),
    ('amount = { type = "float", bounds = "private", outer = [nan, 10] }', "outer must be finite"),
    ('amount = { type = "int", bounds = "private", outer = [10, 0] }', "reversed or empty"),
    ('amount = { type = "int", bounds = "private", outer = [5, 5] }', "reversed or empty"),
    ('amount = { type = "int", bounds = "private", outer = [0] }', "two numbers"),
    ('amount = { type = "int", bounds = "private", outer = ["0", "9"] }', "two numbers"),
    ('amount = { type = "int", bounds = "private", outer = [0, 10], public_keys = [1, 2] }', "public_keys"),
    ('amount = { type = "int", bounds = "private", outer = [0, 10], lower = 0, upper = 5 }', "exclude each other"),
    ('amount = { type = "int", bounds = "fixed", outer = [0, 10] }', 'bounds must be "private"'),
    ('amount = { type = "int", outer = [0, 10] }', 'go(es) with bounds = "private"'),
    ('amount = { type = "int", bounds = "private", outer = [0, 10], quantile = 1.5 }', "quantile must be"),
    ('amount = { type = "float", bounds = "private", outer = [0, 1e300] }', "too large"),
])
def test_policy_refuses_bad_private_bounds(tmp_path, amount, fragment):
    folder = write(tmp_path, amount=amount)
    with pytest.raises(PolicyError) as info:
        load_policies(folder)
    assert info.value.code == "invalid_policy" and fragment in info.value.message, info.value.message
    assert info.value.details["column"] == "amount"


@pytest.mark.parametrize("extra,fragment", [("private_bounds_share = 1.0", "private_bounds_share must be in (0, 1)"),
                                             ("private_bounds_share = 0", "private_bounds_share must be in (0, 1)"),
                                             ("private_bounds_max_rank_error = -1", "must be > 0")])
def test_policy_refuses_bad_private_bounds_settings(tmp_path, extra, fragment):
    with pytest.raises(PolicyError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        load_policies(write(tmp_path, budget_extra=extra))


def test_the_loaded_column_is_clamped_to_outer_and_says_so(tmp_path):
    col = load_policies(write(tmp_path))["shop"].table("orders").column("amount")
    assert (col.lower, col.upper, col.resolution) == (0.0, 1e6, 1.0)
    assert col.private_bounds.outer == (0.0, 1e6) and col.private_bounds.quantile == 0.99
    assert col.to_dict()["bounds"] == "private" and col.to_dict()["outer"] == [0.0, 1e6]
    other = load_policies(write(tmp_path / "plain", amount='amount = { type = "int", lower = 0, upper = 100 }'))
    assert "bounds" not in other["shop"].table("orders").column("amount").to_dict()  # digests of others unchanged


@pytest.mark.parametrize("amount,resolution", [
    # 10**(floor(log10(1e9)) − 12) = 1e-3: twelve digits against the outer range (six for declared
    # bounds would be 1000: every value, and the estimated clamp, a multiple of 1000)
    ('amount = { type = "float", bounds = "private", outer = [0, 1e9] }', 1e-3),
    ('amount = { type = "float", bounds = "private", outer = [-50, 250] }', 1e-10),
    ('amount = { type = "float", bounds = "private", outer = [0, 1e9], resolution = 0.5 }', 0.5),  # stated: kept
    ('amount = { type = "int", bounds = "private", outer = [0, 1000000000] }', 1.0),  # int: 1
])
def test_a_private_float_columns_default_resolution_is_fine_against_its_outer_range(tmp_path, amount, resolution):
    """Trial finding (2026-12-03): the default resolution came from the outer range at 6 digits."""
    col = load_policies(write(tmp_path, amount=amount))["shop"].table("orders").column("amount")
    assert col.resolution == resolution


def test_a_group_key_on_a_private_column_is_refused_before_any_charge(gw):
    with pytest.raises(UnsupportedQuery) as info:
        gw.query("shop", "SELECT amount, SUM(amount) FROM orders GROUP BY amount", consumer="default",
                 budget=QueryBudget(rho=1.0))
    assert info.value.details["reason"] == "private_bounds_group_key"
    assert _charges(gw) == []


# ---------------------------------------------------------------- the estimate's cost, by hand


def _column(quantile: float = 0.95, outer=(0.0, 1e6), resolution: float = 1.0):
    from dpgate.policy.columns import ColumnPolicy
    from dpgate.policy.private_bounds import PrivateBounds

    return ColumnPolicy("amount", "float", outer[0], outer[1], resolution,
                        private_bounds=PrivateBounds(tuple(outer), quantile))


@pytest.mark.parametrize("quantile", [0.9, 0.95, 0.99])
@pytest.mark.parametrize("rho", [0.01, 0.1, 1.0])
def test_the_estimate_costs_eps_squared_over_8_of_the_exponential_mechanism(quantile, rho):
    noise = estimate.calibrate(_column(quantile), "zcdp", rho)
    num, den = alpha_fraction(repr(quantile))
    delta = max(num, den - num)  # one element per unit moves each score by at most this
    eps = 2 * delta / noise.scale  # the exponential mechanism's ε for Gumbel scale s
    assert eps ** 2 / 8 == pytest.approx(rho, rel=1e-9)  # ρ = ε²/8 (Cesar & Rogers 2021 Lemma 3.2)
    assert noise.scale == pytest.approx(2 * delta / math.sqrt(8 * rho), rel=1e-9)
    assert noise.cost <= rho and noise.cost == pytest.approx(rho, rel=1e-9)
    # OpenDP's own private quantile at that scale (its scale is in ranks: ours / den): the same map
    cands = [float(c) for c in range(10)]
    m = dp.m.make_private_quantile(dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance(),
                                   dp.zero_concentrated_divergence(), cands, alpha=quantile, scale=noise.scale / den)
    assert m.map(1) == pytest.approx(noise.cost, rel=1e-9)


def _opendp_ratio(quantile: float, cands: list[float]) -> int:
    """OpenDP writes α over its own denominator; its scores (and Δ) are ours × this factor."""
    t = dp.t.make_quantile_score_candidates(dp.vector_domain(dp.atom_domain(T=float, nan=False)),
                                            dp.symmetric_distance(), cands, alpha=quantile)
    num, den = alpha_fraction(repr(quantile))
    return int(t.map(1) // max(num, den - num))


def test_pure_dp_estimate_costs_eps():
    noise = estimate.calibrate(_column(0.9), "pure", 0.5)
    assert 2 * 9 / noise.scale == pytest.approx(0.5, rel=1e-9) and noise.cost == pytest.approx(0.5, rel=1e-9)


def test_scores_of_snapped_per_unit_elements_are_opendps():
    col = _column(0.95, outer=(0.0, 5000.0))
    grid = estimate.grid_of(col)
    rng = np.random.default_rng(3)  # test data only
    elements = rng.integers(0, 5001, 300)
    snapped = np.array(grid.distances)[np.searchsorted(np.array(grid.distances), elements, side="left")]
    hist = np.bincount(np.searchsorted(np.array(grid.distances), elements, side="left"), minlength=grid.size)
    t = dp.t.make_quantile_score_candidates(dp.vector_domain(dp.atom_domain(T=float, nan=False)),
                                            dp.symmetric_distance(), [float(c) for c in grid.distances], alpha=0.95)
    theirs = np.array(t([float(v) for v in snapped]), dtype=np.int64)
    assert np.array_equal(theirs, scores(hist, 19, 20) * _opendp_ratio(0.95, [float(c) for c in grid.distances]))


def test_the_grid_is_geometric_inside_outer_and_the_clamp_stays_inside():
    g = estimate.grid_of(_column(outer=(0.0, 1e6)))
    d = np.array(g.distances)
    assert d[0] == 1 and d[-1] == 1_000_000 and np.all(np.diff(d) > 0)
    assert np.all(d[1:-1] / d[:-2] <= estimate.RATIO + 1) and g.size < 50
    assert g.bounds(0) == (0.0, 1.0) and g.bounds(g.size - 1) == (0.0, 1e6)
    sym = estimate.grid_of(_column(outer=(-300.0, 1000.0)))
    assert sym.origin == 0 and sym.bounds(sym.size - 1) == (-300.0, 1000.0)
    lo, hi = sym.bounds(3)
    assert lo == -hi  # symmetric around 0, cut to outer
    neg = estimate.grid_of(_column(outer=(-1000.0, -10.0)))
    assert neg.origin == -10 and neg.bounds(0) == (-11.0, -10.0)


def test_the_exponential_mechanism_picks_by_exp_minus_score_over_scale():
    """The selection probabilities are the ones the charge assumes: P[i] ∝ 2^(−i)·exp(−score_i/s)
    (the exponential mechanism with base measure 2^(−i), a public prior)."""
    noise = estimate.calibrate(_column(0.5, outer=(0.0, 4.0)), "zcdp", 0.005)  # distances 1, 2, 3, 4; s = 10
    hist = np.array([30, 0, 0, 10])
    sc = scores(hist, 1, 2).astype(float)
    assert np.abs(estimate.penalties(noise) - math.log(2) * noise.scale * np.arange(4)).max() <= 0.5
    want = 2.0 ** -np.arange(4) * np.exp(-(sc - sc.min()) / noise.scale)
    want /= want.sum()
    picks = np.bincount([estimate.choose(noise, hist)[0] for _ in range(4000)], minlength=noise.grid.size) / 4000
    assert np.abs(picks - want).max() < 0.03
    # and the prior is data-independent: the shifted scores on neighbours move by at most Δ∞ as the scores do
    assert np.array_equal(estimate.penalties(noise), estimate.penalties(estimate.calibrate(
        _column(0.5, outer=(0.0, 4.0)), "zcdp", 0.005)))


# ---------------------------------------------------------------- charges, reuse, refusals


def test_first_query_charges_the_estimate_separately_then_the_query_and_they_add_up(gw, monkeypatch):
    events: list = []
    real_charge, real_execute = gw.ledger.charge, gw.engine.execute

    def charge(*a, **kw):
        r = real_charge(*a, **kw)
        events.append(("charge", kw.get("metadata", {}).get("kind"), a[2]))
        return r

    def execute(q, **kw):
        events.append(("execute", BIN in q.sql() if hasattr(q, "sql") else False, None))
        return real_execute(q, **kw)
    monkeypatch.setattr(gw.ledger, "charge", charge)
    monkeypatch.setattr(gw.engine, "execute", execute)
    sql = "SELECT region, SUM(amount) AS s FROM orders GROUP BY region"
    doc = gw.query("shop", sql, consumer="default", budget=QueryBudget(rho=2.0))
    kinds = [(e[0], e[1]) for e in events]
    assert kinds == [("charge", "private_bounds"), ("execute", True), ("charge", None), ("execute", False)], kinds
    est, main = events[0][2], events[2][2]
    # independently: the estimate at share × ρ, the query calibrated at (1 − share) × ρ on the chosen clamp
    col = gw.policy("shop").table("orders").column("amount")
    assert est.rho == estimate.calibrate(col, "zcdp", 0.1 * 2.0).cost
    pb = doc["private_bounds"]["orders.amount"]
    assert pb["charged_now"] and pb["rho"] == est.rho
    policy = hook.with_bounds(gw.policy("shop"), {hook.needed(gw.policy("shop"), [gw.compile("shop", sql)[1]])[0]:
                                                  gw.release_store.get(pb["release_id"])})
    p2, _, strategy = compile_query(policy, sql, None)
    runner = gw._runner("shop", p2, strategy)
    assert main == runner.calibrate(runner.resolve(QueryBudget(rho=0.9 * 2.0), None)).cost
    assert est.rho + main.rho == pytest.approx(2.0, rel=1e-12)  # the requested ρ, all of it, no more
    assert sum(c["rho"] for c in _charges(gw)) == pytest.approx(2.0, rel=1e-12)
    # the release says which bounds it used, and where they came from
    assert doc["bounds"]["columns"]["amount"]["upper"] == pb["upper"] < 1e6
    assert doc["bounds"]["columns"]["amount"]["private"]["chosen_in"] == pb["release_id"]
    assert f"in release {pb['release_id']}" in doc["bounds"]["columns"]["amount"]["private"]["note"]
    stored = gw.release_store.get(pb["release_id"]).document
    assert stored["kind"] == "private_bounds" and stored["charge"]["charge_id"] == pb["charge_id"]


def test_the_stored_estimate_is_reused_for_free(gw):
    first = gw.query("shop", "SELECT SUM(amount) FROM orders", consumer="default", budget=QueryBudget(rho=2.0))
    before = _charges(gw)
    assert [c["metadata"].get("kind") for c in before] == ["private_bounds", None]
    second = gw.query("shop", "SELECT region, AVG(amount) FROM orders GROUP BY region", consumer="default",
                      budget=QueryBudget(rho=1.0))
    after = _charges(gw)
    assert len(after) == 3 and after[-1]["rho"] == pytest.approx(1.0, rel=1e-12)  # all of it for the query
    assert [c["metadata"].get("kind") for c in after].count("private_bounds") == 1
    a, b = first["private_bounds"]["orders.amount"], second["private_bounds"]["orders.amount"]
    assert b["release_id"] == a["release_id"] and not b["charged_now"] and (a["lower"], a["upper"]) == (b["lower"], b["upper"])
    assert second["bounds"]["columns"]["amount"]["private"]["chosen_in"] == a["release_id"]
    # the identical query again: a cache hit, nothing charged, the note still there
    again = gw.query("shop", "SELECT region, AVG(amount) FROM orders GROUP BY region", consumer="default",
                     budget=QueryBudget(rho=1.0))
    assert again["cached"] and len(_charges(gw)) == 3
    assert again["bounds"]["columns"]["amount"]["private"]["chosen_in"] == a["release_id"]
    # explain now: the stored bounds, the query's whole budget, no estimate to pay for
    doc = gw.explain("shop", "SELECT SUM(amount) FROM orders", budget=QueryBudget(rho=0.3))
    assert doc["cost"]["rho"] == pytest.approx(0.3) and doc["private_bounds"]["orders.amount"]["release_id"] == a["release_id"]


def test_the_request_that_paid_for_the_estimate_is_served_free_when_repeated(gw):
    """Trial finding (2026-12-03): the first request ran at (1 − share)·ρ after paying share·ρ for the
    estimate; the identical request again ran at its whole ρ, a new key, and was charged again. Now
    it finds the first release (README: repeating a request costs nothing)."""
    sql = "SELECT region, SUM(amount) AS s FROM orders GROUP BY region"
    first = gw.query("shop", sql, consumer="default", budget=QueryBudget(rho=2.0))
    assert len(_charges(gw)) == 2  # the estimate, then the query
    again = gw.query("shop", sql, consumer="default", budget=QueryBudget(rho=2.0))
    assert again["cached"] and len(_charges(gw)) == 2
    assert again["release_id"] == first["release_id"] and again["rows"] == first["rows"]
    assert again["private_bounds"]["orders.amount"]["release_id"] == first["private_bounds"]["orders.amount"]["release_id"]
    # another budget is another request: it runs (and is charged) at its whole ρ
    other = gw.query("shop", sql, consumer="default", budget=QueryBudget(rho=1.0))
    assert not other["cached"] and _charges(gw)[-1]["rho"] == pytest.approx(1.0, rel=1e-12)


def test_a_new_data_version_estimates_again(tmp_path):
    g = open_gw(tmp_path / "a")
    try:
        g.query("shop", "SELECT SUM(amount) FROM orders", consumer="default", budget=QueryBudget(rho=2.0))
        g.data_versions["shop"] = "v2"
        doc = g.query("shop", "SELECT SUM(amount) FROM orders", consumer="default", budget=QueryBudget(rho=2.0))
        assert doc["private_bounds"]["orders.amount"]["charged_now"]
        assert [c["metadata"].get("kind") for c in _charges(g)].count("private_bounds") == 2
    finally:
        g.close()


def test_explain_before_paying_states_the_estimate_and_the_outer_worst_case(gw):
    doc = gw.explain("shop", "SELECT SUM(amount) AS s FROM orders", budget=QueryBudget(rho=2.0))
    pb = doc["private_bounds"]["orders.amount"]
    assert pb["rho"] == pytest.approx(0.2) and pb["outer"] == [0.0, 1e6] and "outer range" in pb["note"]
    assert doc["cost"]["rho"] == pytest.approx(2.0, rel=1e-12) and doc["cost"]["query"]["rho"] == pytest.approx(1.8)
    assert doc["cost"]["fits"] is True
    # the ± is the outer range's: Δ2 = m · 1e6 for SUM (m = 3, resolution 1)
    assert max(s["l2"] for s in doc["sensitivity"].values()) == 3 * 1_000_000
    assert _charges(gw) == []


def test_a_budget_too_small_for_the_estimate_is_refused_before_any_charge(gw):
    with pytest.raises(InvalidBudget) as info:
        gw.query("shop", "SELECT SUM(amount) FROM orders", consumer="default", budget=QueryBudget(rho=1e-6))
    assert info.value.details["reason"] == "private_bounds_budget" and "nothing was charged" in info.value.message
    with pytest.raises(InvalidBudget):
        gw.explain("shop", "SELECT SUM(amount) FROM orders", budget=QueryBudget(rho=1e-6))
    with pytest.raises(InvalidBudget, match="ci95"):
        gw.query("shop", "SELECT SUM(amount) FROM orders", consumer="default", budget=QueryBudget(ci95=100.0))
    assert _charges(gw) == [] and gw.release_store.list("shop") == []


def test_a_request_whose_total_does_not_fit_is_refused_before_any_charge(tmp_path):
    g = open_gw(tmp_path / "small")
    try:
        left = g.ledger.spend("shoppers").remaining_rho
        with pytest.raises(BudgetExhausted):
            g.query("shop", "SELECT SUM(amount) FROM orders", consumer="default", budget=QueryBudget(rho=left * 1.05))
        assert _charges(g) == []
    finally:
        g.close()


def test_queries_not_clamping_the_column_estimate_nothing(gw):
    gw.query("shop", "SELECT region, COUNT(*), COUNT(amount) FROM orders WHERE amount > 10 GROUP BY region",
             consumer="default", budget=QueryBudget(rho=0.5))
    assert [c["metadata"].get("kind") for c in _charges(gw)] == [None]


def test_laplace_splits_pure_epsilon(gw):
    doc = gw.query("shop", "SELECT SUM(amount) FROM orders", consumer="default", budget=QueryBudget(epsilon=2.0),
                   mechanism="laplace")
    pb = doc["private_bounds"]["orders.amount"]
    assert pb["epsilon"] == pytest.approx(0.2, rel=1e-9)
    assert doc["budget"] == {"epsilon": pytest.approx(1.8)}


# ---------------------------------------------------------------- neighbouring data


def _histogram(g: Gateway) -> np.ndarray:
    pol = g.policy("shop")
    col = pol.table("orders").column("amount")
    grid = estimate.grid_of(col)
    out = g.engine.execute(as_query(histogram_tree(pol.table("orders"), col, grid)))
    h = np.zeros(grid.size, dtype=np.int64)
    np.add.at(h, np.asarray(out[BIN], dtype=np.int64), np.asarray(out[COUNT], dtype=np.int64))
    return h


def _neighbour(root: Path, removed: int) -> Gateway:
    lines = _rows()
    kept = [lines[0]] + [x for x in lines[1:] if int(x.split(",")[0]) != removed]
    assert len(kept) < len(lines)
    return open_gw(root / f"without-{removed}", lines=kept)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    root = tmp_path_factory.mktemp("worlds")
    d = open_gw(root / "d")
    ns = {u: _neighbour(root, u) for u in (50, 101, 302)}  # a heavy unit (5050, 3 rows), 3 rows, 3 rows
    yield d, ns
    for g in (d, *ns.values()):
        g.close()


def test_one_unit_moves_the_estimates_input_by_one_element(worlds):
    d, ns = worlds
    h = _histogram(d)
    assert h.sum() == 400  # one element per unit, whatever its rows
    for g in ns.values():
        hn = _histogram(g)
        diff = h - hn
        assert np.abs(diff).sum() == 1 and diff.min() == 0
        # so every quantile score moves by at most Δ∞ = max(num, den − num), the sensitivity the cost assumes
        for num, den in ((19, 20), (99, 100), (1, 2)):
            assert np.abs(scores(h, num, den) - scores(hn, num, den)).max() <= max(num, den - num)


def _bounded_sum(g: Gateway, upper: float) -> float:
    base = g.policy("shop")
    col = base.table("orders").column("amount")
    t = base.tables["orders"]
    cols = dict(t.columns)
    cols["amount"] = dataclasses.replace(col, lower=0.0, upper=float(upper))
    pol = dataclasses.replace(base, tables={"orders": dataclasses.replace(t, columns=cols)})
    _, plan, strategy = compile_query(pol, "SELECT SUM(amount) AS s FROM orders", None)
    runner = g._runner("shop", pol, strategy)
    runner.prepare(g.engine, 12345)
    values = g.engine.execute(as_query(runner._general))
    return float(values[plan.primitives[0].id][0]), runner.calibrate(runner.resolve(QueryBudget(rho=1.0), None))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(upper=st.integers(1, 1_000_000), removed=st.sampled_from([50, 101, 302]))
def test_bounded_sum_with_a_given_clamp_moves_by_at_most_its_sensitivity(worlds, upper, removed):
    d, ns = worlds
    on_d, cal = _bounded_sum(d, upper)
    on_n, _ = _bounded_sum(ns[removed], upper)
    sens = next(iter(cal.sensitivities.values())).l2  # derived from the clamp: m · max(|L|, |U|) = 3 · upper
    assert sens == 3 * upper
    assert abs(on_d - on_n) <= sens


# ---------------------------------------------------------------- adversarial values


def test_nan_inf_null_and_huge_values(tmp_path):
    lines = ["user_id,region,amount"] + [f"{u},eu,{u % 100}" for u in range(300)]
    lines += ["1000,eu,nan", "1001,us,inf", "1002,us,-inf", "1003,apac,", "1004,apac,1e300", "1005,eu,-1e300",
              "1006,eu,nan", "1006,eu,7"]
    g = open_gw(tmp_path / "adv", amount='amount = { type = "float", bounds = "private", outer = [0, 1000000], resolution = 1 }',
                lines=lines)
    try:
        h = _histogram(g)
        # units 1000-1003 have no finite value (dropped); 1004 clamps to the outer top, 1005 to 0; 1006 keeps 7
        assert h.sum() == 300 + 3 and h[-1] == 1
        doc = g.query("shop", "SELECT SUM(amount) AS s, AVG(amount) AS a FROM orders", consumer="default",
                      budget=QueryBudget(rho=2.0))
        assert all(math.isfinite(v) for v in doc["rows"][0])
        assert doc["private_bounds"]["orders.amount"]["upper"] <= 1e6
    finally:
        g.close()


# ---------------------------------------------------------------- HTTP


def test_through_the_api(tmp_path):
    from _api_server import LiveServer

    from dpgate.api import create_app
    from dpgate.auth import KeyStore

    folder = write(tmp_path / "api")
    settings = Settings(policies=folder, home=tmp_path / "api" / "state")
    key = KeyStore(settings.resolved_keys_file()).add("alice", role="analyst", consumer="default")[0]
    with LiveServer(create_app(settings)) as live, live.client(key) as client:
        ex = client.post("/v1/queries/explain", json={"dataset": "shop", "sql": "SELECT SUM(amount) FROM orders",
                                                       "budget": {"rho": 2.0}})
        assert ex.status_code == 200, ex.text
        assert ex.json()["private_bounds"]["orders.amount"]["rho"] == pytest.approx(0.2)
        r = client.post("/v1/queries", json={"dataset": "shop", "sql": "SELECT SUM(amount) FROM orders",
                                             "budget": {"rho": 2.0}})
        assert r.status_code == 200, r.text
        rid = r.json()["private_bounds"]["orders.amount"]["release_id"]
        stored = client.get(f"/v1/releases/{rid}")
        assert stored.status_code == 200 and stored.json()["kind"] == "private_bounds", stored.text
        ds = client.get("/v1/datasets/shop")
        assert ds.status_code == 200, ds.text
        bad = client.post("/v1/queries", json={"dataset": "shop", "sql": "SELECT amount, COUNT(*) FROM orders "
                                               "GROUP BY amount", "budget": {"rho": 1.0}})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "unsupported_query"


def test_record_level_tables_count_each_row_as_a_unit(tmp_path):
    folder = write(tmp_path / "rec")
    toml = folder / "shop.toml"
    toml.write_text(toml.read_text().replace('privacy_unit = "user_id"\nmax_groups_per_unit = 1\nmax_rows_per_unit = 3\n', ""))
    g = Gateway.open(Settings(policies=folder, home=tmp_path / "rec" / "home"))
    try:
        assert g.policy("shop").table("orders").record_level
        assert _histogram(g).sum() == len(_rows()) - 1  # one element per row
        doc = g.query("shop", "SELECT SUM(amount) FROM orders", consumer="default", budget=QueryBudget(rho=2.0))
        assert sum(c["rho"] for c in _charges(g)) == pytest.approx(2.0, rel=1e-12)
        assert doc["bounds"]["columns"]["amount"]["private"]["chosen_in"] == doc["private_bounds"]["orders.amount"]["release_id"]
    finally:
        g.close()
