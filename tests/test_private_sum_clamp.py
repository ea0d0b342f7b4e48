"""The private per-unit sum clamp τ of private truncation (issue 22 item 4).

Under ``max_rows_per_unit = { private = true, … }`` every SUM of a query chooses τ, the per-unit total
contribution, with DP (a DP quantile of the units' largest |partial| over √2-geometric candidates
B·s), charged as its own ledger entry before the query, stored, reused free; the bounded SQL clips each
partial to [−τ, τ] and the SUM's sensitivity is τ. Every number is checked against an independent
computation here; the data has an enormous unit, NULLs and negative values (the bounds allow them).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate import private_sum_clamp as clamp
from dpgate.errors import BudgetExhausted, InvalidBudget
from dpgate.pipeline import private_sum_clamp as sums
from dpgate.pipeline import private_truncation as hook
from dpgate.pipeline.budget import QueryBudget
from dpgate.pipeline.planning import compile_query
from dpgate.pipeline.private_bounds import Split
from dpgate.render.private_truncation import BIN, COUNT
from dpgate.service import Gateway
from dpgate.settings import Settings

POLICY = """
[dataset]
name = "shop"
population = "shoppers"
data_version = "v1"

[budget]
epsilon = 50.0
delta = 1e-6
default_query_rho = 0.5

[tables.orders]
source = "{orders}"
privacy_unit = "o_custkey"
max_groups_per_unit = 1
max_rows_per_unit = 64

[tables.orders.columns]
o_orderkey = {{ type = "int", unique = true }}
o_custkey = {{ type = "int" }}

[tables.lines]
source = "{lines}"
privacy_unit = {{ path = ["l_orderkey -> orders.o_orderkey", "o_custkey"] }}
max_groups_per_unit = 3
max_rows_per_unit = {{ private = true, outer = 1024 }}

[tables.lines.columns]
l_orderkey = {{ type = "int" }}
kind = {{ type = "text", public_keys = ["a", "b", "c"] }}
amount = {{ type = "int", lower = -50, upper = 100 }}
"""
SQL = "SELECT SUM(amount) AS s FROM lines"
N = 60
HEAVY, NEGATIVE = 7, 11  # 5,000 lines at the upper bound; 40 lines at the lower bound
B, OUTER = 100, 1024  # max(|L|, |U|) in steps (resolution 1) and the outer m
#: ⌈√2^k⌉ for k = 0, 1, 3, 4, … below 1024 (k = 2 repeats 2), by hand, then 1024
STEPS = [1, 2, 3, 4, 6, 8, 12, 16, 23, 32, 46, 64, 91, 128, 182, 256, 363, 512, 725, 1024]


def _customer_lines(c: int) -> list[list[int | None]]:
    """Per order of customer ``c``, its amounts (None: NULL)."""
    if c == HEAVY:
        return [[100] * 2500, [100] * 2500]
    if c == NEGATIVE:
        return [[-50] * 40]
    out = []
    for j in range(1 + c % 3):
        out.append([None if c % 5 == 0 else (c * 7 + i) % 151 - 50 for i in range(1 + (c + j) % 3)])
    return out


def _write(root: Path, removed: int | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    orders, lines, key = ["o_orderkey,o_custkey"], ["l_orderkey,kind,amount"], 0
    for c in range(N):
        if c == removed:
            continue
        for amounts in _customer_lines(c):
            key += 1
            orders.append(f"{key},{c}")
            lines += [f"{key},{'abc'[(c + i) % 3]},{'' if a is None else a}" for i, a in enumerate(amounts)]
    (root / "orders.csv").write_text("\n".join(orders) + "\n")
    (root / "lines.csv").write_text("\n".join(lines) + "\n")
    folder = root / "policies"
    folder.mkdir(exist_ok=True)
    (folder / "shop.toml").write_text(POLICY.format(orders=(root / "orders.csv").as_posix(),
                                                    lines=(root / "lines.csv").as_posix()))
    return folder


def _open(root: Path, removed: int | None = None) -> Gateway:
    return Gateway.open(Settings(policies=_write(root, removed), home=root / "home"), salt_source=lambda: 12345)


@pytest.fixture
def gw(tmp_path):
    g = _open(tmp_path / "shop")
    yield g
    g.close()


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    root = tmp_path_factory.mktemp("sumworlds")
    d = _open(root / "d")
    ns = {u: _open(root / f"without-{u}", removed=u) for u in (HEAVY, NEGATIVE, 10, 13)}
    yield d, ns
    for g in (d, *ns.values()):
        g.close()


def _charges(g: Gateway) -> list[dict]:
    return [e for e in g.ledger_entries() if e.get("type") == "charge"]


def _partial(c: int, m: int = OUTER) -> int:
    """Customer c's partial as the bounded query computes it without τ, computed here by hand:
    the non-NULL sum, m rows' worth (round half away from zero) above m values, clipped to m·[−50, 100]."""
    values = [a for order in _customer_lines(c) for a in order if a is not None]
    total, count = sum(values), len(values)
    if count > m:
        total = int(math.copysign(math.floor(abs(total) * m / count + 0.5), total))
    return min(max(total, m * -50), m * 100)


# ---------------------------------------------------------------- numbers by hand


def test_candidates_are_the_row_bound_times_the_sqrt2_integers():
    assert list(clamp.candidates(B, OUTER)) == [B * s for s in STEPS]
    assert clamp.candidates(7, 1) == (7,) and clamp.candidates(0, 1024) == (0,)
    assert clamp.candidates(5, 3) == (5, 10, 15)
    with pytest.raises(ValueError):
        clamp.candidates(5, 0)


@pytest.mark.parametrize("quantile,delta_inf,den", [(0.99, 99, 100), (0.9, 9, 10), (0.5, 1, 2)])
@pytest.mark.parametrize("rho", [0.0005, 0.02, 1.0])
def test_the_choice_costs_eps_squared_over_8_of_the_exponential_mechanism(quantile, delta_inf, den, rho):
    """By hand: one element per unit, so the quantile score of α = num/den moves by at most
    Δ∞ = max(num, den − num) (99 for 0.99); the exponential mechanism with Gumbel scale s is
    ε = 2Δ∞/s-DP (McSherry & Talwar 2007), ε-bounded range, hence ρ = ε²/8-zCDP (Cesar & Rogers 2021,
    Lemma 3.2); scale s = 2Δ∞/√(8ρ) makes ρ the whole share. The 95 % rank error with the base measure
    2^(−1.5 i) over C = 20 candidates: s/den · (ln((1/(1 − 2^−1.5))/0.05) + 19 · 1.5 ln 2)."""
    g = clamp.grid(B, OUTER, 1.0)
    noise = clamp.calibrate("amount", g, quantile, "zcdp", rho)
    assert noise.score_sensitivity == delta_inf and noise.den == den and g.size == 20
    assert noise.scale == pytest.approx(2 * delta_inf / math.sqrt(8 * rho), rel=1e-12)
    eps = 2.0 * delta_inf / noise.scale
    assert noise.cost == pytest.approx(eps * eps / 8.0, rel=1e-12) and noise.cost <= rho
    assert noise.cost == pytest.approx(rho, rel=1e-9)
    r95 = noise.scale / den * (math.log(1 / (1 - 2 ** -1.5) / 0.05) + 19 * 1.5 * math.log(2))
    assert noise.rank_error95 == pytest.approx(r95, rel=1e-12)
    assert clamp.min_share(20, quantile, "zcdp", r95) == pytest.approx(rho, rel=1e-6)


def test_pure_dp_choice_costs_eps():
    noise = clamp.calibrate("amount", clamp.grid(B, 64, 1.0), 0.99, "pure", 0.5)
    assert noise.cost == pytest.approx(2 * 99 / noise.scale, rel=1e-12) and noise.cost <= 0.5


def _probabilities(hist: np.ndarray, num: int, den: int, scale: float) -> np.ndarray:
    """The exponential mechanism's selection probabilities, from the definition (prior 2^(−1.5 i))."""
    elements = np.repeat(np.arange(len(hist)), hist)
    score = np.array([abs((den - num) * np.sum(elements < i) - num * np.sum(elements > i)) for i in range(len(hist))],
                     dtype=float)
    logits = -(score + np.rint(1.5 * math.log(2) * scale * np.arange(len(hist)))) / scale
    p = np.exp(logits - logits.max())
    return p / p.sum()


def _need(g: Gateway, sql: str = SQL) -> sums.SumNeed:
    base = g.policy("shop")
    need = hook.needed(base, g.compile("shop", sql), "v1")
    (out,) = sums.needed(base, g.compile("shop", sql), "v1", need.private, need.quantile)
    return out


def _histogram(g: Gateway, sql: str = SQL) -> np.ndarray:
    need = _need(g, sql)
    out = g.engine.execute(need.tree)
    h = np.zeros(need.grid.size, dtype=np.int64)
    np.add.at(h, np.asarray(out[BIN], dtype=np.int64), np.asarray(out[COUNT], dtype=np.int64))
    return h


def _snapped(elements: list[int]) -> list[int]:
    cands = clamp.candidates(B, OUTER)
    h = [0] * len(cands)
    for e in elements:
        h[next(i for i, c in enumerate(cands) if e <= c)] += 1
    return h


# ---------------------------------------------------------------- neighbouring and adversarial data


def test_each_unit_is_one_element_its_largest_partial_in_absolute_value(worlds):
    d, _ = worlds
    h = _histogram(d)
    assert h.sum() == N
    assert _partial(HEAVY) == 102_400 and h[-1] == 1  # 500,000 clipped to m rows' worth at the bound: the top
    assert _partial(NEGATIVE) == -2000  # negative: its |partial| is its element
    assert _partial(10) == 0  # only NULL amounts: a partial of 0, the smallest candidate
    assert h.tolist() == _snapped([abs(_partial(c)) for c in range(N)])


def test_the_join_that_multiplies_a_units_rows_multiplies_its_partial():
    """lines ⋈ orders ⋈ orders again on the unit: each line meets every order of its customer."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        g = _open(Path(tmp))
        try:
            sql = ("SELECT SUM(amount) AS s FROM lines JOIN orders ON l_orderkey = orders.o_orderkey "
                   "JOIN orders AS o2 ON o2.o_custkey = orders.o_custkey")
            h = _histogram(g, sql)
            joined = []
            for c in range(N):
                orders = len(_customer_lines(c))
                values = [a for o in _customer_lines(c) for a in o if a is not None] * orders
                total, count = sum(values), len(values)
                if count > OUTER:
                    total = int(math.copysign(math.floor(abs(total) * OUTER / count + 0.5), total))
                joined.append(abs(min(max(total, OUTER * -50), OUTER * 100)))
            assert h.tolist() == _snapped(joined)
            doc = g.query("shop", sql, consumer="default", budget=QueryBudget(rho=1.0))
            (used,) = doc["private_truncation"]["sum_clamps"]
            shown = doc["bounds"]["private_truncation"]["sum_clamps"]
            assert shown == [{"column": "amount", "tau_steps": used["tau_steps"], "chosen_in": used["release_id"]}]
        finally:
            g.close()


def test_removing_any_unit_moves_the_choice_by_the_dp_rule_only(worlds):
    d, ns = worlds
    h = _histogram(d)
    noise = clamp.calibrate("amount", clamp.grid(B, OUTER, 1.0), 0.99, "zcdp", 0.01)
    eps = 2 * noise.score_sensitivity / noise.scale
    p = _probabilities(h, noise.num, noise.den, noise.scale)
    from dpgate.quantiles import scores
    for u, g in ns.items():
        hn = _histogram(g)
        diff = h - hn
        assert np.abs(diff).sum() == 1 and diff.min() == 0, u  # one element: the heavy, negative, NULL unit's too
        # the scores move by at most the rule's Δ∞ = max(num, den − num) = 99
        assert np.max(np.abs(scores(h, noise.num, noise.den) - scores(hn, noise.num, noise.den))) <= 99
        q = _probabilities(hn, noise.num, noise.den, noise.scale)
        assert np.max(np.abs(np.log(p) - np.log(q))) <= eps + 1e-9  # the released τ moves by e^ε at most


def test_the_sampler_follows_the_probabilities_the_cost_assumes(worlds):
    d, _ = worlds
    h = _histogram(d)
    noise = clamp.calibrate("amount", clamp.grid(B, OUTER, 1.0), 0.99, "zcdp", 0.002)  # small: spread out
    p = _probabilities(h, noise.num, noise.den, noise.scale)
    cands = clamp.candidates(B, OUTER)
    draws = [cands.index(clamp.choose(noise, h)) for _ in range(3000)]
    assert np.max(np.abs(np.bincount(draws, minlength=len(cands)) / len(draws) - p)) < 0.04


def _bounded(g: Gateway, tau: int, sql: str = SQL) -> tuple[float, dict]:
    """The bounded query's value with τ set on the table (as a stored choice would set it), and its
    calibration's sensitivities."""
    base = g.policy("shop")
    t = base.tables["lines"]
    pt = dataclasses.replace(t.private_truncation, sum_clamps=(("amount", tau, "rel_test"),))
    pol = dataclasses.replace(base, tables={**base.tables, "lines": dataclasses.replace(t, private_truncation=pt)})
    compiled_policy, plan, strategy = compile_query(pol, sql, None)
    runner = g._runner("shop", compiled_policy, strategy)
    runner.prepare(g.engine, 12345)
    assert f"-{tau}" in runner._general.sql() or tau >= 51_200  # the clamp is in the generated SQL
    values = g.engine.execute(runner._general)
    cal = runner.calibrate(runner.resolve(QueryBudget(rho=1.0), None))
    sid = next(p.id for p in plan.primitives if p.kind == "sum")
    return float(values[sid][0]), cal.sensitivities


def test_the_generated_sql_clips_each_units_total_to_tau(worlds):
    d, _ = worlds
    for tau in (100, 600, 2300, 102_400):
        got, sens = _bounded(d, tau)
        by_hand = sum(min(max(_partial(c), max(-51_200, -tau)), min(102_400, tau)) for c in range(N))
        assert got == by_hand
        assert {s.l2 for s in sens.values()} == {float(tau)}  # Δ2 = Δ∞ = τ ungrouped (k_eff = 1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tau=st.sampled_from(clamp.candidates(B, OUTER)), removed=st.sampled_from([HEAVY, NEGATIVE, 10, 13]))
def test_removing_one_unit_moves_the_clamped_sum_by_at_most_tau(worlds, tau, removed):
    d, ns = worlds
    on_d, sens = _bounded(d, tau)
    on_n, _ = _bounded(ns[removed], tau)
    assert next(iter(sens.values())).linf == tau  # the SUM's sensitivity is τ (τ ≤ m·B = 102,400)
    assert abs(on_d - on_n) <= tau
    if removed == HEAVY:
        assert abs(on_d - on_n) == min(tau, 102_400)  # the enormous unit is clipped to τ exactly
    # and the choice's scores move by at most the rule's Δ∞ = max(num, den − num) at any quantile
    from dpgate.quantiles import alpha_fraction, scores
    h, hn = _histogram(d), _histogram(ns[removed])
    for q in (0.5, 0.9, 0.99):
        num, den = alpha_fraction(repr(q))
        assert np.max(np.abs(scores(h, num, den) - scores(hn, num, den))) <= max(num, den - num)


def test_avg_keeps_the_split_sum_at_tau_count_at_m(worlds):
    d, _ = worlds
    _, sens = _bounded(d, 600, "SELECT AVG(amount) AS a FROM lines")
    assert sorted(s.linf for s in sens.values()) == [600.0, 1024.0]  # SUM: τ; COUNT(amount): m = outer here


# ---------------------------------------------------------------- the pipeline


def test_the_choices_are_charged_before_the_query_and_shown(gw):
    doc = gw.query("shop", SQL, consumer="default", budget=QueryBudget(rho=1.0))
    charges = _charges(gw)
    assert [c["metadata"].get("kind") for c in charges] == ["private_truncation", "private_sum_clamp", None]
    # 10 % shared by the two choices; the SUM's quantile is the default sum_quantile 0.9
    share = clamp.calibrate("amount", clamp.grid(B, OUTER, 1.0), 0.9, "zcdp", 0.05).cost
    assert charges[1]["rho"] == share and sum(c["rho"] for c in charges) == pytest.approx(1.0, rel=1e-12)
    (used,) = doc["private_truncation"]["sum_clamps"]
    tau = used["tau_steps"]
    assert used["charged_now"] and used["rho"] == share and tau in clamp.candidates(B, OUTER)
    assert used["charge_id"] == charges[1]["charge_id"] and f"τ = {tau:g}" in used["note"]
    stored = gw.release_store.get(used["release_id"]).document
    assert stored["kind"] == "private_sum_clamp" and stored["rows"] == [[tau, float(tau)]]
    assert stored["estimate"]["quantile"] == 0.9 and stored["estimate"]["score_sensitivity"] == 9
    # the query's σ is calibrated for Δ2 = min(τ, m·B) at 90 % of ρ
    m = doc["private_truncation"]["max_rows_per_unit"]
    sigma = next(iter(doc["accuracy"].values()))["sigma"]
    assert charges[2]["rho"] == pytest.approx(min(tau, m * B) ** 2 / (2 * sigma ** 2), rel=1e-9)
    # the same request again: served the release, free; AVG of the same rows reuses both choices
    assert gw.query("shop", SQL, consumer="default", budget=QueryBudget(rho=1.0))["cached"]
    avg = gw.query("shop", "SELECT AVG(amount) AS a FROM lines", consumer="default", budget=QueryBudget(rho=0.5))
    assert [c["metadata"].get("kind") for c in _charges(gw)][3:] == [None]
    assert avg["private_truncation"]["sum_clamps"][0]["release_id"] == used["release_id"]


def test_explain_states_the_clamp_and_its_cost_and_charges_nothing(gw):
    e = gw.explain("shop", SQL, budget=QueryBudget(rho=1.0))
    (planned,) = e["private_truncation"]["sum_clamps"]
    assert planned["column"] == "amount" and planned["grid"]["candidates"][-1] == 102_400.0
    share = clamp.calibrate("amount", clamp.grid(B, OUTER, 1.0), 0.9, "zcdp", 0.05).cost
    assert e["cost"]["private_sum_clamps"] == [share] and e["cost"]["rho"] == pytest.approx(1.0, rel=1e-12)
    assert _charges(gw) == []
    gw.query("shop", SQL, consumer="default", budget=QueryBudget(rho=1.0))
    again = gw.explain("shop", SQL, budget=QueryBudget(rho=1.0))
    assert again["private_truncation"]["sum_clamps"][0]["charged_now"] is False


def test_a_share_too_small_is_refused_before_any_charge(gw):
    need = _need(gw)
    with pytest.raises(InvalidBudget, match="per-unit clamp of SUM") as e:
        sums.calibrated(gw.policy("shop"), [need], Split("zcdp", 1e-9, QueryBudget(rho=1.0), 1.0))
    assert e.value.details["reason"] == "private_sum_clamp_budget" and "nothing was charged" in e.value.message
    with pytest.raises(InvalidBudget):
        gw.query("shop", SQL, consumer="default", budget=QueryBudget(rho=1e-9))
    with pytest.raises(InvalidBudget, match="ci95"):
        gw.query("shop", SQL, consumer="default", budget=QueryBudget(ci95=1000.0))
    assert _charges(gw) == []


def test_a_total_that_does_not_fit_is_refused_before_any_charge(gw):
    with pytest.raises(BudgetExhausted):
        gw.query("shop", SQL, consumer="default", budget=QueryBudget(rho=5000.0))
    assert _charges(gw) == []


def test_the_clamps_statement_is_checked_before_the_row_caps_charge(gw, monkeypatch):
    real = gw.engine.check

    def check(tree, *a, **kw):
        if "ABS(" in tree.sql().upper():  # the τ histogram (its elements are |partials|)
            raise InvalidBudget("refused by the engine check", {})
        return real(tree, *a, **kw)
    monkeypatch.setattr(gw.engine, "check", check)
    with pytest.raises(InvalidBudget, match="engine check"):
        gw.query("shop", SQL, consumer="default", budget=QueryBudget(rho=1.0))
    assert _charges(gw) == []


def test_counts_choose_no_clamp(gw):
    doc = gw.query("shop", "SELECT COUNT(*) AS n FROM lines", consumer="default", budget=QueryBudget(rho=1.0))
    assert doc["private_truncation"]["sum_clamps"] == []
    assert [c["metadata"].get("kind") for c in _charges(gw)] == ["private_truncation", None]


def test_the_text_renderer_and_the_tree_agree_with_a_clamp(worlds):
    import sqlglot

    from dpgate.sql.bound import bounded_query, bounded_sql

    d, _ = worlds
    base = d.policy("shop")
    t = base.tables["lines"]
    pt = dataclasses.replace(t.private_truncation, sum_clamps=(("amount", 2300, "rel_test"),))
    pol = dataclasses.replace(base, tables={**base.tables, "lines": dataclasses.replace(t, private_truncation=pt)})
    for sql in (SQL, "SELECT kind, AVG(amount) AS a FROM lines JOIN orders ON l_orderkey = orders.o_orderkey "
                     "GROUP BY kind"):
        policy, plan, _ = compile_query(pol, sql, None)
        tree = bounded_query(plan, policy, salt=5)
        assert tree == sqlglot.parse_one(bounded_sql(plan, policy, salt=5), read="duckdb")
        assert "LEAST(GREATEST(COALESCE(" in tree.sql() and ", -2300), 2300)" in tree.sql()  # [max(−51200, −τ), τ]
        # the plan's digest carries τ: a plan with another τ (or none) is another release
        other, plan0, _ = compile_query(base, sql, None)
        assert plan.policy_digest != plan0.policy_digest


def test_sum_quantile_is_declared_with_the_row_cap_and_checked_when_the_policy_loads(tmp_path):
    from dpgate.errors import PolicyError
    from dpgate.policy import load_policies

    folder = _write(tmp_path / "q")
    toml = folder / "shop.toml"
    text = toml.read_text()
    toml.write_text(text.replace("outer = 1024 }", "outer = 1024, sum_quantile = 0.5 }"))
    g = Gateway.open(Settings(policies=folder, home=tmp_path / "q" / "home"), salt_source=lambda: 1)
    try:
        assert g.policy("shop").tables["lines"].private_truncation.sum_quantile == 0.5
        doc = g.query("shop", SQL, consumer="default", budget=QueryBudget(rho=1.0))
        rid = doc["private_truncation"]["sum_clamps"][0]["release_id"]
        assert g.release_store.get(rid).document["estimate"]["quantile"] == 0.5
    finally:
        g.close()
    for bad in ("1.0", "0", "\"high\""):
        toml.write_text(text.replace("outer = 1024 }", f"outer = 1024, sum_quantile = {bad} }}"))
        with pytest.raises(PolicyError, match="sum_quantile must be a number in"):
            load_policies(folder)
