"""Quantiles grouped by keys without public keys (issue 21 item 8).

``SELECT ngram, MEDIAN(score) FROM posts GROUP BY ngram`` (``ngram`` has no public keys): step 1,
the threshold mechanism of private partition selection (the same one
:class:`~dpgate.pipeline.strategy.NoisyWithPartitionSelection` uses) selects the groups; step 2,
each quantile is chosen by the exponential mechanism on the *selected* groups' histograms only.
One charge, before any noise, covers both (sequential composition, Bun & Steinke 2016 Lemma 2.3).

The numbers by hand (module docstrings of :mod:`dpgate.partition_selection` and
:mod:`dpgate.quantile_release`): the budget ρ is split equally over n = c + 1 + q releases (c own
noisy counts/sums, the selection histogram, q quantiles), share = ρ/n;

* selection histogram: (ℓ0, ℓ2, ℓ∞) = (k, √k, 1), σ_sel = √k/√(2·share) (a Gaussian of scale σ at
  ℓ2-sensitivity Δ is Δ²/(2σ²)-zCDP, Bun & Steinke 2016 Prop. 1.6); T is OpenDP's threshold for δ_q
  at that σ (:func:`dpgate.mechanisms.selection.calibrate_selection`);
* a count: Δ2 = √k·m, σ = √k·m/√(2·share);
* a quantile: Δ∞ = m·max(num, den − num) (m for the median), per group ρ_g = share/k,
  ε_g = √(8ρ_g), Gumbel scale s = 2Δ∞/ε_g (ε-DP exponential mechanism ⇒ ε²/8-zCDP, Cesar & Rogers
  2021 Lemma 3.2), cost k·ε_g²/8 = share;
* pure ε (Laplace): b_sel = k/share, quantile s = 2Δ∞/(share/k).
"""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate import quantile_release
import dpgate.partition_selection as ps_module
from dpgate.errors import BudgetExhausted, InvalidBudget, UnsupportedQuery
from dpgate.mechanisms.selection import calibrate_selection
from dpgate.pipeline.strategy import QuantilesWithPartitionSelection, WithQuantiles
from dpgate.policy import load_policies
from dpgate.quantiles import alpha_fraction, score_sensitivity, scores
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings
from dpgate.sql.parse import parse_query
from dpgate.sql.quantile import histogram_query, histogram_sql
from tests.test_partition_selection import open_gateway, write_policy

MEDIAN_SQL = "SELECT ngram, COUNT(*) AS n, MEDIAN(score) AS med FROM posts GROUP BY ngram"


def _common(units: int = 120, keys=("a", "b"), rows_per_unit: int = 2) -> list[tuple]:
    """``units`` authors in each of ``keys`` (distinct authors per key), scores 0..10, region eu/us."""
    out = []
    for j, key in enumerate(keys):
        for i in range(units):
            for r in range(rows_per_unit):
                out.append((f"{key}{i}", key, ["eu", "us"][i % 2], (i + r + 3 * j) % 11))
    return out


def _rare(n: int) -> list[tuple]:
    """n keys held by one author each (never selected but with probability ≤ δ)."""
    return [(f"rare{i}", f"rare-{i}", "eu", 5) for i in range(n)]


# --- the strategy ------------------------------------------------------------------------------------


def test_quantiles_over_selected_keys_get_their_own_strategy(tmp_path):
    gw = open_gateway(tmp_path, _common(5))
    try:
        _, plan, strategy = gw.compile("posts", "SELECT ngram, MEDIAN(score) FROM posts GROUP BY ngram")
        assert type(strategy) is QuantilesWithPartitionSelection and strategy.selected_keys == ("ngram",)
        assert strategy.base.primitives == () and strategy.columns == ("score",)
        _, _, public = gw.compile("posts", "SELECT region, MEDIAN(score) FROM posts GROUP BY region")
        assert type(public) is WithQuantiles  # public keys: as before
        with pytest.raises(UnsupportedQuery, match="private partition selection") as e:
            gw.query("posts", "SELECT ngram, MEDIAN(score) AS m FROM posts GROUP BY ngram UNION ALL "
                              "SELECT ngram, MEDIAN(score) AS m FROM posts GROUP BY ngram", consumer="default")
        assert e.value.details.get("charged") is False
        assert gw.ledger.entries("authors") == []
    finally:
        gw.close()


# --- the cost by hand --------------------------------------------------------------------------------


def test_gaussian_cost_by_hand_and_the_composition_stated(tmp_path):
    k, m, rho = 2, 3, 0.09
    gw = open_gateway(tmp_path, _common(60), k=k, m=m)
    try:
        doc = gw.explain("posts", MEDIAN_SQL, budget=QueryBudget(rho=rho))
        share = rho / 3  # c = 1 (COUNT(*) with m = 3 is not the unit count), 1 selection, q = 1
        sel = doc["partition_selection"]
        sigma_sel = math.sqrt(k) / math.sqrt(2 * share)
        assert sel["sigma"] == pytest.approx(sigma_sel, rel=1e-9)
        assert sel["rho"] == pytest.approx(share, rel=1e-9)
        delta_q = gw.policy("posts").budget.default_selection_delta
        by_hand = calibrate_selection("gaussian", sigma_sel, k, delta_q)
        assert sel["threshold"] == by_hand.threshold and sel["delta"] == pytest.approx(by_hand.delta, rel=1e-12)
        p_count = next(p.id for p in gw.compile("posts", MEDIAN_SQL)[1].primitives if p.kind == "count")
        assert doc["noise_scales"][p_count] == pytest.approx(math.sqrt(k) * m / math.sqrt(2 * share), rel=1e-9)
        q = next(iter(doc["quantiles"].values()))
        delta_inf = m * 1  # the median: num = 1, den = 2
        assert q["score_sensitivity"] == delta_inf == score_sensitivity(*alpha_fraction("0.5"), m)
        assert q["score_scale"] == pytest.approx(2 * delta_inf / math.sqrt(8 * share / k), rel=1e-9)
        assert q["rho"] == pytest.approx(share, rel=1e-9) and q["groups_per_unit"] == k
        comp = sel["composition"]
        assert comp["rule"] == "sequential"
        assert [s["step"] for s in comp["steps"]] == ["partition_selection", "quantiles"]
        assert comp["steps"][0]["rho"] == pytest.approx(2 * share, rel=1e-9)  # selection + the count
        assert comp["steps"][0]["delta"] == sel["delta"] and comp["steps"][1]["delta"] == 0.0
        assert comp["steps"][1]["rho"] == pytest.approx(share, rel=1e-9)
        assert doc["cost"]["rho"] == pytest.approx(rho, rel=1e-12) == comp["rho"]
        assert doc["cost"]["selection_delta"] == sel["delta"]
        # the release states the same composition, and is charged (ρ, δ) once
        rel = gw.query("posts", MEDIAN_SQL, consumer="default", budget=QueryBudget(rho=rho))
        assert rel["partition_selection"]["composition"]["steps"] == comp["steps"]
        assert rel["charge"]["rho"] == pytest.approx(rho, rel=1e-12)
        assert rel["charge"]["selection_delta"] == pytest.approx(sel["delta"], rel=1e-12)
        assert len(gw.ledger.entries("authors")) == 1
    finally:
        gw.close()


def test_laplace_cost_by_hand(tmp_path):
    k, m, eps = 2, 3, 0.9
    gw = open_gateway(tmp_path, _common(60), k=k, m=m)
    try:
        doc = gw.explain("posts", MEDIAN_SQL, budget=QueryBudget(epsilon=eps), mechanism="laplace")
        share = eps / 3
        sel = doc["partition_selection"]
        assert sel["scale"] == pytest.approx(k / share, rel=1e-9)  # Δ1 = k of the unit counts
        q = next(iter(doc["quantiles"].values()))
        assert q["score_scale"] == pytest.approx(2 * m / (share / k), rel=1e-9)
        assert q["epsilon"] == pytest.approx(share, rel=1e-9)
        assert doc["cost"]["epsilon"] == pytest.approx(eps, rel=1e-12)
        steps = sel["composition"]["steps"]
        assert steps[0]["epsilon"] == pytest.approx(2 * share, rel=1e-9)
        assert steps[1]["epsilon"] == pytest.approx(share, rel=1e-9)
    finally:
        gw.close()


def test_laplace_query_is_released_and_stored_with_its_composition(tmp_path):
    """Trial finding (2026-12-03): under Laplace the composition's total was ``Cost.epsilon`` (a
    bound method), so the release store failed to write the document *after* the charge (HTTP
    500, each retry charged again). The total ε is the query's ε (sequential composition, ε adds:
    Dwork & Roth 2014 Thm 3.16): here 2·share (selection + count) + share (median) = eps."""
    eps = 0.3
    gw = open_gateway(tmp_path, _common(60), k=2, m=3, epsilon=8.0)
    try:
        out = gw.query("posts", MEDIAN_SQL, consumer="default", budget=QueryBudget(epsilon=eps),
                       mechanism="laplace")
        comp = out["partition_selection"]["composition"]
        assert comp["epsilon"] == pytest.approx(eps, rel=1e-12)
        assert math.fsum(step["epsilon"] for step in comp["steps"]) == pytest.approx(eps, rel=1e-12)
        assert "epsilon_sel + epsilon_q" in comp["note"]
        assert len(gw.ledger.entries("authors")) == 1
        again = gw.query("posts", MEDIAN_SQL, consumer="default", budget=QueryBudget(epsilon=eps),
                         mechanism="laplace")
        assert again["cached"] is True and len(gw.ledger.entries("authors")) == 1
    finally:
        gw.close()


def test_a_document_the_store_cannot_write_is_refused_before_the_charge(tmp_path, monkeypatch):
    """The release document's data-independent part is built and checked as strict JSON before
    ``ledger.charge`` (pipeline.documents.release_preamble): a non-JSON field costs nothing."""
    from dpgate.errors import Internal
    gw = open_gateway(tmp_path, _common(60), k=2, m=3, epsilon=8.0)
    try:
        monkeypatch.setattr(ps_module, "describe", lambda *a, **k: {"bad": object()})
        with pytest.raises(Internal, match="not JSON"):
            gw.query("posts", MEDIAN_SQL, consumer="default", budget=QueryBudget(epsilon=0.3),
                     mechanism="laplace")
        assert gw.ledger.entries("authors") == []
    finally:
        gw.close()


def test_median_alone_spends_half_on_the_selection(tmp_path):
    """No count/sum: n = 1 + 1, the selection histogram and the median get ρ/2 each."""
    gw = open_gateway(tmp_path, _common(60), k=1, m=1)
    try:
        doc = gw.explain("posts", "SELECT ngram, MEDIAN(score) AS med FROM posts GROUP BY ngram",
                         budget=QueryBudget(rho=0.04))
        sel = doc["partition_selection"]
        assert sel["sigma"] == pytest.approx(1 / math.sqrt(2 * 0.02), rel=1e-9)
        assert sel["composition"]["steps"][0]["rho"] == pytest.approx(0.02, rel=1e-9)
        assert sel["composition"]["steps"][1]["rho"] == pytest.approx(0.02, rel=1e-9)
        assert doc["cost"]["rho"] == pytest.approx(0.04, rel=1e-12)
    finally:
        gw.close()


# --- the quantile step sees the selected groups only (spy) -------------------------------------------


def test_the_quantile_step_sees_only_the_groups_the_selection_released(tmp_path, monkeypatch):
    chosen_by_threshold, scored = [], []
    real_threshold, real_select = ps_module.threshold_select, quantile_release.select

    def spy_threshold(cal, counts):
        out = real_threshold(cal, counts)
        chosen_by_threshold.append((cal, np.asarray(counts).copy(), out))
        return out

    def spy_select(noise, hist):
        scored.append(np.asarray(hist).copy())
        return real_select(noise, hist)

    monkeypatch.setattr(ps_module, "threshold_select", spy_threshold)
    monkeypatch.setattr(quantile_release, "select", spy_select)
    gw = open_gateway(tmp_path, _common(150, keys=("a", "b", "c")) + _rare(40), k=1, m=2)
    try:
        rel = gw.query("posts", "SELECT ngram, COUNT(*) AS n, MEDIAN(score) AS med FROM posts GROUP BY ngram",
                       consumer="default", budget=QueryBudget(rho=0.3))
        (cal, counts, chosen), = chosen_by_threshold
        assert len(counts) == 43  # every candidate went to the threshold mechanism ...
        hist, = scored  # ... the exponential mechanism scored only the groups it released
        assert hist.shape[0] == len(chosen.index) == len(rel["rows"])
        released = [r[0] for r in rel["rows"]]
        assert set(released) <= {"a", "b", "c"} | {f"rare-{i}" for i in range(40)}
        assert {"a", "b", "c"} <= set(released)  # 150 units each: far above T
        assert not any(k.startswith("rare-") for k in released)  # one unit each: P ≤ δ per key
        # each scored row is its group's histogram: 150 units × m = 2 values of the kept group
        assert (hist.sum(axis=1) == 300).all()
        assert rel["partition_selection"]["threshold"] == cal.threshold
    finally:
        gw.close()


def test_histogram_statement_tree_is_its_text_and_keeps_every_candidate(tmp_path):
    write_policy(tmp_path / "p", tmp_path / "posts.csv", k=2, m=3)
    (tmp_path / "posts.csv").write_text("author,ngram,region,score\n")
    policy = load_policies(tmp_path / "p")["posts"]
    for sql in ("SELECT ngram, MEDIAN(score) FROM posts GROUP BY ngram",
                "SELECT ngram, region, MAX(score) FROM posts WHERE score > 2 GROUP BY ngram, region"):
        plan = parse_query(sql, policy)
        text = histogram_sql(plan, policy, "score", salt=77)
        assert histogram_query(plan, policy, "score", salt=77) == sqlglot.parse_one(text, read="duckdb")
        assert '"__dpg_r"' not in text and "QUALIFY" in text  # no public enumeration; always k groups per unit


# --- neighbouring data: the quantile step's input -----------------------------------------------------


@pytest.fixture(scope="module")
def hist_policies(tmp_path_factory):
    out = {}
    for k, m in ((1, 1), (2, 3)):
        folder = tmp_path_factory.mktemp(f"k{k}m{m}")
        (folder / "posts.csv").write_text("author,ngram,region,score\n")
        write_policy(folder / "policies", folder / "posts.csv", k=k, m=m)
        out[(k, m)] = load_policies(folder / "policies")["posts"]
    return out


def _histogram(policy, rows, salt) -> dict:
    """{(ngram, candidate): count} of the selecting histogram statement on ``rows`` (DuckDB)."""
    plan = parse_query("SELECT ngram, MEDIAN(score) FROM posts GROUP BY ngram", policy)
    con = duckdb.connect()
    try:
        con.execute('CREATE SCHEMA "posts"')
        con.execute('CREATE TABLE "posts"."posts" (author VARCHAR, ngram VARCHAR, region VARCHAR, score BIGINT)')
        if rows:
            con.executemany('INSERT INTO "posts"."posts" VALUES (?, ?, ?, ?)', rows)
        res = con.execute(histogram_sql(plan, policy, "score", salt=salt)).fetchall()
    finally:
        con.close()
    return {(r[0], int(r[1])): int(r[2]) for r in res}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", "c", None]),
                               st.one_of(st.none(), st.integers(-5, 15))), min_size=1, max_size=40),
       km=st.sampled_from([(1, 1), (2, 3)]), victim=st.integers(0, 5), salt=st.integers(0, 2**63 - 1))
def test_removing_one_unit_moves_each_candidates_scores_by_at_most_the_sensitivity(
        hist_policies, rows, km, victim, salt):
    """Neighbouring data (one unit's rows removed), same salt: the histograms change in at most k
    groups, by at most m values in each (ℓ1 per group ≤ m), so each candidate's integer score moves by
    at most Δ∞ = m·max(num, den − num) (:func:`dpgate.quantiles.score_sensitivity`), the sensitivity
    the exponential mechanism is calibrated with."""
    k, m = km
    full = [(f"u{u}", g, "eu", x) for u, g, x in rows]
    h1 = _histogram(hist_policies[km], full, salt)
    h2 = _histogram(hist_policies[km], [r for r in full if r[0] != f"u{victim}"], salt)
    groups = {g for g, _ in h1} | {g for g, _ in h2}
    changed = 0
    num, den = alpha_fraction("0.5")
    for g in groups:
        v1 = np.array([h1.get((g, b), 0) for b in range(11)])
        v2 = np.array([h2.get((g, b), 0) for b in range(11)])
        assert (v1 >= v2).all() and (v1 - v2).sum() <= m
        changed += bool((v1 != v2).any())
        s1, s2 = scores(v1, num, den), scores(v2, num, den)
        assert np.abs(np.asarray(s1) - np.asarray(s2)).max() <= score_sensitivity(num, den, m)
    assert changed <= k


# --- adversarial data and refusals -------------------------------------------------------------------

FLOAT_POLICY = """
[dataset]
name = "adv"
population = "adv"
data_version = "v1"

[budget]
epsilon = 4.0
delta = 1e-5
default_query_rho = 0.1
selection_delta = 1e-6

[tables.t]
source = "{source}"
privacy_unit = "u"
max_groups_per_unit = 2
max_rows_per_unit = 2

[tables.t.columns]
u = {{ type = "text" }}
s = {{ type = "text" }}
f = {{ type = "float", lower = 0, upper = 10, resolution = 0.5 }}
"""


def test_null_keys_nan_values_and_one_heavy_unit(tmp_path):
    lines = ["u,s,f"]
    for i in range(200):  # 200 units with a NULL key, values 2.0 .. 3.0
        lines.append(f"n{i},,{2 + (i % 3) * 0.5}")
    for i in range(200):  # 200 units in 'x' whose values are NaN/inf half of the time
        lines.append(f"x{i},x,{['nan', 'inf', '-inf', '7.5', '8'][i % 5]}")
    lines += [f"heavy,x,{j % 10}" for j in range(3000)]  # one unit with many rows: at most m = 2 count
    lines += [f"heavy,h{j},1" for j in range(50)]  # ... and 50 keys only it holds
    src = tmp_path / "t.csv"
    src.write_text("\n".join(lines) + "\n")
    (tmp_path / "pol").mkdir()
    (tmp_path / "pol" / "adv.toml").write_text(FLOAT_POLICY.format(source=src.as_posix()))
    gw = Gateway.open(Settings(policies=tmp_path / "pol", home=tmp_path / "home"), salt_source=lambda: 99)
    scored = []
    real = quantile_release.selected_histograms

    def spy(result, plan, keys, candidates):
        out = real(result, plan, keys, candidates)
        scored.append(out)
        return out

    try:
        quantile_release.selected_histograms = spy
        rel = gw.query("adv", "SELECT s, COUNT(*) AS n, MEDIAN(f) AS med, MAX(f) AS hi FROM t GROUP BY s",
                       consumer="default", budget=QueryBudget(rho=0.3))
        rows = {r[0]: r for r in rel["rows"]}
        assert set(rows) == {None, "x"}  # the NULL key is a key; heavy's own keys: one unit each
        hist, = scored
        assert hist.shape[0] == 2
        # 'x': 80 units with 7.5 / 8 (NaN and ±inf rows are left out) + heavy's at most m = 2 values
        x = list(rows).index("x")
        assert 80 <= hist[x].sum() <= 82
        null = list(rows).index(None)
        assert hist[null].sum() == 200
        assert all(0 <= r[2] <= 10 and 0 <= r[3] <= 10 for r in rows.values())
        assert rows[None][2] in (2.0, 2.5, 3.0) or abs(rows[None][2] - 2.5) <= 1.5
    finally:
        quantile_release.selected_histograms = real
        gw.close()


def test_refused_before_any_charge_when_the_budget_cannot_cover_it(tmp_path):
    gw = open_gateway(tmp_path, _common(30))
    try:
        with pytest.raises(BudgetExhausted) as e:
            gw.query("posts", MEDIAN_SQL, consumer="default", budget=QueryBudget(rho=1e3))
        assert e.value.details.get("charged", False) is False
        with pytest.raises(InvalidBudget):  # a δ above the cap's selection reserve
            gw.query("posts", MEDIAN_SQL, consumer="default", budget=QueryBudget(rho=0.01, delta=0.5))
        with pytest.raises(InvalidBudget, match="ci95"):
            gw.query("posts", MEDIAN_SQL, consumer="default", budget=QueryBudget(ci95=1.0))
        assert gw.ledger.entries("authors") == []
    finally:
        gw.close()
    gw = open_gateway(tmp_path / "off", _common(30), extra="selection_delta = 0")
    try:
        with pytest.raises(UnsupportedQuery, match="selection_delta = 0"):
            gw.query("posts", MEDIAN_SQL, consumer="default")
        assert gw.ledger.entries("authors") == []
    finally:
        gw.close()
