"""Private selection queries (issue 15): the exponential mechanism over a public candidate set.

Synthetic data (tests/_eval_project.py): 200 users × 5 candidates, one row per user and
candidate, exact SUM(correct) a=100, b=110, c=120, d=104, e=90.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from _oracles import ledger_epsilon as oracle_epsilon

from dpgate.errors import InvalidBudget, UnsupportedQuery
from dpgate.mechanisms.selection import select_top_k, top_k_rho
from dpgate.selection import calibrate_selection
from dpgate.service import QueryBudget
from dpgate.sql.bound import bounded_query
from dpgate.sql.parse import parse_query
from dpgate.sql.selection_query import recognize
from tests._eval_project import CANDIDATES, CORRECT, USERS, open_eval_gateway
from _engines import as_query

BEST = "SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC LIMIT 1"


@pytest.fixture
def gw(tmp_path):
    g = open_eval_gateway(tmp_path)
    yield g
    g.close()


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def closed_form(scores: dict[str, int], epsilon: float, delta_u: float) -> dict[str, float]:
    """Exponential mechanism with a monotone utility: P[c] ∝ exp(ε·u(c)/Δu)
    (McSherry & Talwar 2007, Thm. 6 and the monotone remark; Dwork & Roth 2014, Thm. 3.10)."""
    top = max(scores.values())
    w = {c: math.exp(epsilon * (u - top) / delta_u) for c, u in scores.items()}
    z = sum(w.values())
    return {c: v / z for c, v in w.items()}


def test_selection_releases_keys_only_and_charges_the_bounded_range_rho(gw):
    r = gw.query("evals", BEST, consumer="analysts", budget=QueryBudget(epsilon=0.5))
    assert r["columns"] == ["candidate"] and len(r["rows"]) == 1 and r["rows"][0][0] in CANDIDATES
    assert r["accuracy"] == {} and r["noise_scales"] == {}
    sel = r["selection"]
    assert sel["scores_released"] is False and "scores" not in sel
    assert sel["candidates"] == 5 and sel["candidate_keys"] == CANDIDATES and sel["k"] == 1
    # Δu = m·max(|0|, |1|) = 1 (max_rows_per_unit = 1); monotone (lower = 0): ε = Δu/scale.
    assert sel["delta_u"] == 1.0 and sel["monotonic"] is True and sel["gumbel_scale"] == pytest.approx(2.0)
    # Hand derivation: ε = 0.5 pure, bounded range ⇒ ρ = ε²/8 = 0.25/8 = 0.03125 (Cesar & Rogers 2021).
    assert r["charge"]["rho"] == pytest.approx(0.03125, rel=1e-12)
    # ε at δ − selection_delta = 1e-6 − 1e-6/2 (the default reserve for partition selection, issue 11)
    assert r["charge"]["epsilon_at_delta"] == pytest.approx(oracle_epsilon(0.03125, 0.5e-6), rel=1e-9)
    entries = gw.ledger_entries()
    assert len(entries) == 1 and entries[0]["rho"] == pytest.approx(0.03125, rel=1e-12)
    assert r["mechanism"] == "exponential_mechanism"
    # the scores (exact or noisy) are nowhere in the release: no leaf value is a score, and no
    # text leaf spells one as a number (identifiers, hashes and timestamps are random text, so a
    # substring check over repr(r) fails by chance; CI saw "110" inside a timestamp)
    for leaf in _leaves(r):
        assert not (isinstance(leaf, (int, float)) and not isinstance(leaf, bool) and leaf in (104, 110, 120)), leaf
        if isinstance(leaf, str):
            assert not re.search(r"(?<![\w.:-])(?:1[12]0|104)(?![\w.:-])", leaf), leaf


def test_repeat_is_served_from_the_store_for_free(gw):
    first = gw.query("evals", BEST, consumer="analysts", budget=QueryBudget(epsilon=0.5))
    again = gw.query("evals", "select candidate from eval group by 1 order by sum(correct) desc limit 1",
                     consumer="analysts", budget=QueryBudget(epsilon=0.5))
    assert again["cached"] is True and again["rows"] == first["rows"]
    assert again["release_id"] == first["release_id"]
    assert len(gw.ledger_entries()) == 1  # post-processing: no second charge


def test_top_k_by_peeling_costs_k_times_and_rho_budget_is_split(gw):
    r = gw.query("evals", BEST.replace("LIMIT 1", "LIMIT 3"), consumer="analysts", budget=QueryBudget(rho=0.06))
    sel = r["selection"]
    assert len(r["rows"]) == 3 and len({row[0] for row in r["rows"]}) == 3
    # ρ = 0.06 over k = 3 peels: ε₁ = √(8·0.06/3) = 0.4, ε = 1.2; ρ = 3·0.4²/8 = 0.06.
    assert sel["epsilon_per_selection"] == pytest.approx(0.4, rel=1e-12)
    assert sel["epsilon"] == pytest.approx(1.2, rel=1e-12)
    assert r["charge"]["rho"] == pytest.approx(0.06, rel=1e-9)


def test_non_monotone_sum_doubles_the_scale(gw):
    # score ∈ [-1, 1] at resolution 0.5: Δu = 1·max(2, 2) = 2 steps (1.0 in column units); not
    # monotone (L < 0 < U): ε₁ = 2Δu/scale ⇒ scale = 2·2/0.5 = 8.
    e = gw.explain("evals", "SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(score) ASC LIMIT 1",
                   budget=QueryBudget(epsilon=0.5))
    sel = e["selection"]
    assert sel["monotonic"] is False and sel["delta_u_integer_units"] == 2 and sel["delta_u"] == 1.0
    assert sel["gumbel_scale"] == pytest.approx(8.0)
    assert e["cost"]["rho"] == pytest.approx(0.5**2 / 8, rel=1e-12)


def test_opendp_map_matches_the_bounded_range_formula():
    # ρ = k·(c·Δ/s)²/8: c = 2 not monotone, 1 monotone (hand derivation, Cesar & Rogers 2021).
    assert top_k_rho(3, 2, 2.0, monotonic=False) == pytest.approx(2 * (2 * 3 / 2.0) ** 2 / 8, rel=1e-12)
    assert top_k_rho(1, 1, 2.0, monotonic=True) == pytest.approx((1 / 2.0) ** 2 / 8, rel=1e-12)
    assert top_k_rho(5, 4, 10.0, monotonic=True) == pytest.approx(4 * 0.5**2 / 8, rel=1e-12)


def test_delta_u_is_the_per_candidate_bound_even_when_a_unit_is_in_every_candidate(tmp_path):
    """Every user has a row for each of the 5 candidates (max_groups_per_unit = 5), yet Δu = 1:
    the exponential mechanism's sensitivity is the largest change of one candidate's score
    (L∞), not the sum over the candidates a unit touches. Checked on neighbouring datasets:
    removing any one user moves every bounded score by at most Δu."""
    g = open_eval_gateway(tmp_path / "full")
    try:
        policy = g.policy("evals")
        sel = recognize(parse_query(BEST, policy), policy)
        cal = calibrate_selection(sel, policy, {"epsilon": 1.0})
        assert cal.delta_u == 1 and cal.candidates == 5
        full = g.engine.execute(as_query(bounded_query(sel.plan, policy, salt=7)))
        base = np.asarray(full[sel.utility.id], dtype=np.int64)
        assert dict(zip(full["candidate"], base.tolist())) == CORRECT  # exact bounded scores
    finally:
        g.close()
    for user in (0, 95, 105, 119, 199):
        h = open_eval_gateway(tmp_path / f"minus{user}", drop_user=user)
        try:
            out = h.engine.execute(as_query(bounded_query(sel.plan, h.policy("evals"), salt=7)))
            diff = np.abs(np.asarray(out[sel.utility.id], dtype=np.int64) - base)
            assert diff.max() <= cal.delta_u
            assert diff.sum() >= 0  # several candidates may move at once; each by ≤ Δu
        finally:
            h.close()


def test_selection_probabilities_match_the_exponential_mechanism():
    """20,000 draws of OpenDP's Gumbel top-1 at ε = 0.1, Δu = 1 (monotone: scale = 10) on the
    exact scores; each candidate's frequency lies within 4.5 binomial standard errors of the
    closed form P[c] ∝ exp(ε·u(c)/Δu). Two-sided normal tail at 4.5σ is 6.8e-6 per candidate:
    a false failure has probability < 5·6.8e-6 = 3.4e-5 (union bound)."""
    names = list(CORRECT)
    scores = np.array([CORRECT[c] for c in names], dtype=np.int64)
    n = 20_000
    counts = dict.fromkeys(names, 0)
    for _ in range(n):
        counts[names[select_top_k(scores, 1, 10.0, monotonic=True, descending=True)[0]]] += 1
    expected = closed_form(CORRECT, 0.1, 1.0)
    assert expected["c"] == pytest.approx(0.569833, abs=1e-6)  # 1/(1+e^-1+e^-1.6+e^-2+e^-3) = 1/1.754898
    for c in names:
        p = expected[c]
        se = math.sqrt(p * (1 - p) / n)
        assert abs(counts[c] / n - p) <= 4.5 * se, (c, counts[c] / n, p)


def test_gateway_picks_the_best_candidate_with_the_mechanisms_probability(tmp_path):
    """End to end: 400 fresh selections (each budget slightly different, so none is served from
    the cache) at ε ≈ 0.1 pick c with probability ≈ 0.5698; the count of c lies within 4.5
    binomial standard errors (false failure < 6.8e-6). Data: the exact scores above."""
    g = open_eval_gateway(tmp_path)
    try:
        hits = 0
        n = 400
        for i in range(n):
            eps = 0.1 * (1 + i * 1e-9)
            r = g.query("evals", BEST, consumer="analysts", budget=QueryBudget(epsilon=eps))
            assert r["cached"] is False
            hits += r["rows"][0][0] == "c"
        p = closed_form(CORRECT, 0.1, 1.0)["c"]
        assert abs(hits / n - p) <= 4.5 * math.sqrt(p * (1 - p) / n)
        assert len(g.ledger_entries()) == n
    finally:
        g.close()


def test_explain_reads_no_data_and_charges_nothing(gw, monkeypatch):
    def forbidden(sql):  # pragma: no cover - must not be called
        raise AssertionError("explain read data")

    monkeypatch.setattr(gw.engine, "execute", forbidden)
    e = gw.explain("evals", BEST, budget=QueryBudget(epsilon=0.5))
    assert e["kind"] == "selection" and e["mechanism"] == "exponential_mechanism"
    assert e["cost"]["rho"] == pytest.approx(0.03125) and e["cost"]["fits"] is True
    assert e["selection"]["candidates"] == 5
    assert gw.ledger_entries() == []


@pytest.mark.parametrize("sql, reason", [
    ("SELECT split FROM eval GROUP BY split ORDER BY COUNT(*) DESC LIMIT 1", "no_public_candidates"),
    ("SELECT candidate FROM eval GROUP BY candidate ORDER BY AVG(correct) DESC LIMIT 1", "selection_utility"),
    ("SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC LIMIT 0", "selection_limit"),
    ("SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC LIMIT 6", "selection_limit"),
    ("SELECT candidate FROM eval GROUP BY candidate HAVING COUNT(*) > 3 ORDER BY SUM(correct) DESC LIMIT 1",
     "selection_having"),
    ("SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC, COUNT(*) LIMIT 1",
     "selection_order_by"),
])
def test_refused_selections_cost_nothing(gw, sql, reason):
    with pytest.raises(UnsupportedQuery) as info:
        gw.query("evals", sql, consumer="analysts")
    assert info.value.details["reason"] == reason
    # like every planner refusal, it says so (a trial found selection refusals without it)
    assert "nothing was charged" in str(info.value) and info.value.details["charged"] is False
    with pytest.raises(UnsupportedQuery):
        gw.explain("evals", sql)
    assert gw.ledger_entries() == []


def test_ci95_budget_is_refused_for_a_selection(gw):
    with pytest.raises(InvalidBudget):
        gw.query("evals", BEST, consumer="analysts", budget=QueryBudget(ci95=5.0))
    assert gw.ledger_entries() == []


def test_keys_ordered_by_an_aggregate_without_limit_stay_an_ordinary_release(gw):
    # No LIMIT: every (public) key is released, ordered by noisy sums (Gaussian, post-processing).
    r = gw.query("evals", "SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC",
                 consumer="analysts", budget=QueryBudget(rho=0.5))
    assert sorted(row[0] for row in r["rows"]) == CANDIDATES
    assert r.get("kind") != "selection"


def test_population_size_is_what_the_fixture_says():
    assert USERS == 200 and max(CORRECT.values()) <= USERS


# --- property: Δu and monotonicity on neighbouring datasets (hypothesis) ----------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.test_sensitivity import PROP_POLICY, extra_unit_rows, rows_strategy, run_primitives  # noqa: E402

SELECTIONS = [
    "SELECT g FROM t GROUP BY g ORDER BY COUNT(*) DESC LIMIT 1",
    "SELECT g, h FROM t GROUP BY g, h ORDER BY SUM(y) DESC LIMIT 2",
    "SELECT h FROM t WHERE x > 0 GROUP BY h ORDER BY COUNT(DISTINCT u) ASC LIMIT 1",
    "SELECT g FROM t GROUP BY g ORDER BY SUM(x) DESC LIMIT 2",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy(st.integers(0, 5) | st.none()), extra=extra_unit_rows(),
       sql=st.sampled_from(SELECTIONS), salt=st.integers(0, 2**63 - 1))
def test_adding_one_unit_moves_each_candidate_score_by_at_most_delta_u(rows, extra, sql, salt):
    """Adding one unit (up to 14 rows over any candidates; k = 2, m = 3) moves every candidate's
    bounded score by at most Δu, and for a utility declared monotone, never downwards."""
    plan, before = run_primitives("t", rows, sql, salt)
    _, after = run_primitives("t", rows + extra, sql, salt)
    sel = recognize(plan, PROP_POLICY)
    cal = calibrate_selection(sel, PROP_POLICY, {"epsilon": 1.0})
    diff = [int(b) - int(a) for a, b in zip(before[sel.utility.id], after[sel.utility.id])]
    assert max((abs(d) for d in diff), default=0) <= cal.delta_u, (diff, cal.delta_u)
    if cal.monotonic:
        assert all(d >= 0 for d in diff), diff


def test_delta_u_is_attained_so_the_property_can_fail():
    # one unit with m = 3 rows at y = 7 in candidate a: SUM(y) moves by exactly Δu = 3·7 = 21
    sql = "SELECT g FROM t GROUP BY g ORDER BY SUM(y) DESC LIMIT 1"
    plan, before = run_primitives("t", [], sql, 3)
    _, after = run_primitives("t", [{"u": 99, "g": "a", "h": 0, "x": 1.0, "y": 7}] * 4, sql, 3)
    sel = recognize(plan, PROP_POLICY)
    cal = calibrate_selection(sel, PROP_POLICY, {"epsilon": 1.0})
    assert cal.delta_u == 21 and cal.monotonic
    assert max(int(b) - int(a) for a, b in zip(before[sel.utility.id], after[sel.utility.id])) == 21
    # SUM(x) over [-5, 10] is not monotone: the scale doubles (ε = 2Δu/scale)
    sel_x = recognize(parse_query("SELECT g FROM t GROUP BY g ORDER BY SUM(x) DESC LIMIT 1", PROP_POLICY),
                      PROP_POLICY)
    cal_x = calibrate_selection(sel_x, PROP_POLICY, {"epsilon": 1.0})
    assert not cal_x.monotonic and cal_x.delta_u == 3 * 20 and cal_x.scale == pytest.approx(2 * 60 / 1.0)


def test_a_joined_public_tables_keys_are_a_public_candidate_set(tmp_path):
    """Candidates from a public table joined on a protected one (its values are public keys)."""
    from dpgate.service import Gateway
    from dpgate.settings import Settings
    from tests.test_public_tables import write

    g = Gateway.open(Settings(policies=write(tmp_path / "p"), home=tmp_path / "home"))
    try:
        r = g.query("lib", "SELECT g.category FROM checkouts c JOIN genres g ON c.genre = g.genre "
                           "GROUP BY g.category ORDER BY COUNT(*) DESC LIMIT 1",
                    consumer="analysts", budget=QueryBudget(epsilon=1.0))
        assert r["kind"] == "selection" and r["selection"]["candidates"] == 2
        assert r["rows"][0][0] in ("fiction", "nonfiction") and r["charge"]["rho"] == pytest.approx(1 / 8)
        # the protected table's own genre column has no public keys: refused, nothing charged
        with pytest.raises(UnsupportedQuery) as info:
            g.query("lib", "SELECT genre FROM checkouts GROUP BY genre ORDER BY COUNT(*) DESC LIMIT 1",
                    consumer="analysts")
        assert info.value.details["reason"] == "no_public_candidates"
        assert len(g.ledger_entries()) == 1
    finally:
        g.close()


def test_a_computed_keys_domain_is_a_public_candidate_set(gw):
    """GROUP BY a CASE with literal results: the candidates are its domain (from the policy),
    Δu is still the per-candidate bound after the rewrite caps m rows per unit and key."""
    sql = ("SELECT CASE WHEN candidate IN ('a', 'b') THEN 'ab' ELSE 'cde' END AS grp FROM eval "
           "GROUP BY grp ORDER BY SUM(correct) DESC LIMIT 1")
    r = gw.query("evals", sql, consumer="analysts", budget=QueryBudget(epsilon=1.0))
    sel = r["selection"]
    assert r["columns"] == ["grp"] and r["rows"][0][0] in ("ab", "cde")
    assert sel["candidates"] == 2 and sel["candidate_keys"] == ["ab", "cde"] and sel["delta_u"] == 1.0
    assert r["charge"]["rho"] == pytest.approx(1 / 8, rel=1e-12)
