"""When the budget runs out (issue 23), through the gateway: cohorts with fresh budgets, honest
renewal, proxy answers, the attack bound, DP-SGD charges from parameters, utility trials.

The project (``_budget_project``) has a population with cohorts (``club``), one without
(``shop``, with a synthetic proxy ``shop_synthetic``). Every privacy number is checked against
an independent computation (hand formulas in comments, dp-accounting, dpgate.accounting's
closed forms re-derived here).
"""

from __future__ import annotations

import math

import pytest
from _budget_project import COHORTS, write_project

from dpgate import accounting
from dpgate.errors import BudgetExhausted, InvalidBudget, InvalidRequest, PolicyError, RenewalRefused, UnsupportedQuery
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

BY_REGION = "SELECT region, COUNT(*) AS n FROM orders GROUP BY region"


@pytest.fixture
def project(tmp_path):
    return write_project(tmp_path / "project")


@pytest.fixture
def gateway(project, tmp_path):
    with Gateway.open(Settings(policies=project, home=tmp_path / "state")) as gw:
        yield gw


def _cohort_rho(gw, cohort):
    reports = gw.ledger.cohort_spend("members")
    return reports[cohort].spent_rho if cohort in reports else 0.0


# --- 1. cohorts ------------------------------------------------------------------------------


def test_a_unit_in_two_cohorts_refuses_the_dataset_with_a_count_and_no_ids(tmp_path):
    policies = write_project(tmp_path / "p", bad_units=7, with_shop=False)
    with pytest.raises(PolicyError) as err:
        Gateway.open(Settings(policies=policies, home=tmp_path / "state"))
    assert err.value.details["offending"] == 7 and err.value.details["several"] == 7
    assert "7 privacy unit(s)" in err.value.message and "two or more cohorts" in err.value.message
    # no unit id (the bad users are 0..6) and no cohort value appears in the refusal
    text = err.value.message + repr(err.value.details)
    for uid in range(7):
        assert f" {uid}," not in text and f"'{uid}'" not in text
    assert "2026-0" not in text


def test_an_undeclared_cohort_value_refuses_the_dataset(tmp_path):
    policies = write_project(tmp_path / "p", with_shop=False)
    csv = tmp_path / "p" / "orders.csv"
    csv.write_text(csv.read_text() + "9999,2027-12,eu,3\n")
    with pytest.raises(PolicyError) as err:
        Gateway.open(Settings(policies=policies, home=tmp_path / "state"))
    assert err.value.details["outside"] == 1 and err.value.details["offending"] == 1


def test_a_query_over_cohort_a_does_not_change_cohort_b(gateway):
    sql = "SELECT region, COUNT(*) AS n FROM orders WHERE signup = '2026-01' GROUP BY region"
    rel = gateway.query("club", sql, consumer="analysts", budget=QueryBudget(rho=0.02))
    assert rel["guarantee"]["cohorts"] == ["2026-01"] and rel["guarantee"]["renewal"] == "per cohort"
    assert _cohort_rho(gateway, "2026-01") == 0.02
    assert _cohort_rho(gateway, "2026-02") == 0.0 and _cohort_rho(gateway, "2026-03") == 0.0
    # IN and NOT IN on the public keys restrict too; an unrelated conjunct does not widen it
    gateway.query("club", "SELECT COUNT(*) FROM orders WHERE signup IN ('2026-02', '2026-03') AND amount > 10",
                  consumer="analysts", budget=QueryBudget(rho=0.01))
    assert [_cohort_rho(gateway, c) for c in COHORTS] == [0.02, 0.01, 0.01]
    gateway.query("club", "SELECT COUNT(*) FROM orders WHERE NOT (signup = '2026-01')", consumer="analysts",
                  budget=QueryBudget(rho=0.005))
    assert [_cohort_rho(gateway, c) for c in COHORTS] == pytest.approx([0.02, 0.015, 0.015], rel=1e-15)
    # no restriction on the cohort column: every cohort pays the full cost (parallel composition)
    rel = gateway.query("club", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.01))
    assert rel["guarantee"]["cohorts"] == COHORTS
    assert [_cohort_rho(gateway, c) for c in COHORTS] == pytest.approx([0.03, 0.025, 0.025], rel=1e-15)
    # an OR with another column cannot restrict the cohorts (conservative)
    gateway.query("club", "SELECT COUNT(*) FROM orders WHERE signup = '2026-01' OR amount > 50",
                  consumer="analysts", budget=QueryBudget(rho=0.001))
    assert [_cohort_rho(gateway, c) for c in COHORTS] == pytest.approx([0.031, 0.026, 0.026], rel=1e-15)
    assert gateway.ledger.verify().ok


def test_a_where_that_excludes_every_cohort_is_refused_for_free(gateway):
    with pytest.raises(UnsupportedQuery) as err:
        gateway.query("club", "SELECT COUNT(*) FROM orders WHERE signup = '1999-01'", consumer="analysts")
    assert err.value.details["reason"] == "no_cohort"
    assert gateway.ledger.spend("members").charges == 0


def test_exhausting_one_cohort_leaves_the_others_and_a_new_cohort_starts_full(project, tmp_path):
    home = tmp_path / "state"
    with Gateway.open(Settings(policies=project, home=home)) as gw:
        share = 0.5 * gw.ledger.cap("members").rho_cap
        a = "SELECT COUNT(*) FROM orders WHERE signup = '2026-01'"
        gw.query("club", a, consumer="analysts", budget=QueryBudget(rho=share))
        with pytest.raises(BudgetExhausted) as err:
            gw.query("club", a + " AND amount > 1", consumer="analysts", budget=QueryBudget(rho=0.001))
        assert err.value.details["cohort"] == "2026-01"
        # a query over every cohort is refused too (all or nothing), and charges none of them
        with pytest.raises(BudgetExhausted):
            gw.query("club", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.001))
        assert _cohort_rho(gw, "2026-02") == 0.0
        gw.query("club", "SELECT COUNT(*) FROM orders WHERE signup = '2026-02'", consumer="analysts",
                 budget=QueryBudget(rho=share))
    # next month: the policy declares cohort 2026-04 (and its first users arrive)
    for f in (project / "club.toml",):
        f.write_text(f.read_text().replace('"2026-03"]', '"2026-03", "2026-04"]'))
    csv = project.parent / "orders.csv"
    csv.write_text(csv.read_text() + "".join(f"{500 + i},2026-04,eu,{i}\n" for i in range(30)))
    with Gateway.open(Settings(policies=project, home=home)) as gw:
        rel = gw.query("club", "SELECT COUNT(*) FROM orders WHERE signup = '2026-04'", consumer="analysts",
                       budget=QueryBudget(rho=share))  # the whole share of the cap: a fresh budget
        assert rel["guarantee"]["cohorts"] == ["2026-04"]
        report = gw.budget("club")
        assert report["cohorts"]["2026-03"]["fresh"] is True
        assert report["cohorts"]["2026-01"]["remaining"]["rho"] == pytest.approx(share, rel=1e-12)
        assert report["worst_cohort"] in ("2026-01", "2026-02", "2026-04")
        assert "per cohort" in report["renewal"]
        assert gw.ledger.verify().ok


def test_the_release_cache_key_includes_the_cohort_scope(project, tmp_path):
    home = tmp_path / "state"
    with Gateway.open(Settings(policies=project, home=home)) as gw:
        first = gw.query("club", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.01))
        again = gw.query("club", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert again["cached"] is True and again["release_id"] == first["release_id"]
        # a query differing only in post-processing is derived (and stored under its own release key)
        derived = gw.query("club", BY_REGION + " ORDER BY n DESC", consumer="analysts", budget=QueryBudget(rho=0.01))
        assert derived["cached"] is True and derived["derived_from"] == first["release_id"]
    # a new cohort is declared (same data version): the query now draws on four cohorts, so the
    # stored release (which drew on three) is not served for it
    (project / "club.toml").write_text((project / "club.toml").read_text()
                                       .replace('"2026-03"]', '"2026-03", "2026-04"]'))
    with Gateway.open(Settings(policies=project, home=home)) as gw:
        new = gw.query("club", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert new["cached"] is False and new["guarantee"]["cohorts"] == COHORTS + ["2026-04"]
        # the derived release of the old scope is not served for the new one either
        again = gw.query("club", BY_REGION + " ORDER BY n DESC", consumer="analysts", budget=QueryBudget(rho=0.01))
        assert again["release_id"] != derived["release_id"] and again["guarantee"]["cohorts"] == COHORTS + ["2026-04"]


def test_explain_names_the_cohorts_and_fits_against_them(gateway):
    share = 0.5 * gateway.ledger.cap("members").rho_cap
    gateway.query("club", "SELECT COUNT(*) FROM orders WHERE signup = '2026-01'", consumer="analysts",
                  budget=QueryBudget(rho=share))
    spent = gateway.explain("club", BY_REGION, budget=QueryBudget(rho=0.01), consumer="analysts")
    assert spent["cohorts"]["drew_on"] == COHORTS and spent["cost"]["fits"] is False
    assert "2026-01" in spent["cost"]["message"]
    other = gateway.explain("club", "SELECT COUNT(*) FROM orders WHERE signup = '2026-02'",
                            budget=QueryBudget(rho=0.01), consumer="analysts")
    assert other["cohorts"]["drew_on"] == ["2026-02"] and other["cost"]["fits"] is True


# --- 2. honest renewal ---------------------------------------------------------------------------


def test_renewal_is_refused_with_the_arithmetic(gateway):
    with pytest.raises(RenewalRefused) as err:
        gateway.renew("plain", actor="ops", reason="new month")
    cap = gateway.ledger.cap("plain")
    twelve = accounting.periods_epsilon(cap.rho_cap, 12, cap.rho_delta)
    assert f"epsilon = {twelve:.2f} after 12 periods" in err.value.message
    assert "fixed cap, no renewal" in err.value.message
    with pytest.raises(RenewalRefused) as err:
        gateway.renew("members", actor="ops", reason="new month")
    assert "renews only by opening new cohorts" in err.value.message


def test_the_published_guarantee_says_which_rule_applies(gateway):
    plain = gateway.dataset("shop")
    assert plain["renewal"].startswith("fixed cap, no renewal")
    rel = gateway.query("shop", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.01))
    assert rel["guarantee"]["renewal"] == "fixed cap, no renewal"
    club = gateway.dataset("club")
    assert club["renewal"].startswith("per cohort")
    assert set(club["cohorts"]["spend"]) == set(COHORTS)


def test_moving_a_dataset_with_charges_to_a_fresh_population_is_refused(project, tmp_path):
    home = tmp_path / "state"
    with Gateway.open(Settings(policies=project, home=home)) as gw:
        gw.query("shop", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.01))
    for name in ("shop.toml", "shop_synthetic.toml"):
        f = project / name
        f.write_text(f.read_text().replace('population = "plain"', 'population = "plain-2026"'))
    with pytest.raises(RenewalRefused) as err:
        Gateway.open(Settings(policies=project, home=home))
    assert "moving dataset 'shop'" in err.value.message and "'plain-2026'" in err.value.message
    assert "after 12 periods" in err.value.message


def test_raising_the_cap_stays_a_governance_decision(gateway):
    before = gateway.ledger.cap("plain")
    out = gateway.set_cap("plain", epsilon=6.0, delta=1e-6, actor="board", reason="approved in the May review")
    assert out["changed"] is True and gateway.ledger.cap("plain").epsilon == 6.0
    from dpgate.budget_views import cap_change_preview

    pv = cap_change_preview(gateway.ledger, "plain", 8.0, 1e-6)
    assert pv["before"]["cap"]["epsilon"] == 6.0 and pv["after"]["cap"]["epsilon"] == 8.0
    assert pv["after"]["attack_bound"]["tightest"]["tpr"] > pv["before"]["attack_bound"]["tightest"]["tpr"]
    assert before.epsilon == 4.0


# --- 3. proxy answers ----------------------------------------------------------------------------


def _exhaust_shop(gw):
    share = 0.5 * gw.ledger.cap("plain").rho_cap
    gw.query("shop", "SELECT COUNT(*) FROM orders", consumer="analysts", budget=QueryBudget(rho=share))


def test_a_refused_query_falls_back_to_the_proxy_free_labelled_and_not_stored(gateway):
    _exhaust_shop(gateway)
    charges = gateway.ledger.spend("plain").charges
    stored = len(gateway.releases("shop", limit=1000))
    with pytest.raises(BudgetExhausted):
        gateway.query("shop", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.01))
    ans = gateway.query("shop", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.01), fallback="proxy")
    assert ans["source"] == "proxy" and ans["dp"] is False and ans["stored"] is False
    assert ans["proxy"] == {"dataset": "shop_synthetic", "provenance": "synthetic: 120 made-up users for the tests"}
    assert ans["charge"] is None and ans["refused"]["code"] == "budget_exhausted"
    # exact on the proxy: 120 synthetic users, one order each (42 in eu, 39 in us, 39 in apac)
    assert ans["rows"] == [["eu", 42], ["us", 39], ["apac", 39]]
    assert ans["accuracy"] == {}
    assert gateway.ledger.spend("plain").charges == charges  # free
    assert len(gateway.releases("shop", limit=1000)) == stored  # never stored
    with pytest.raises(Exception):
        gateway.release(ans["release_id"])
    # never served as a DP release: once budget exists again the same query gets a fresh DP release
    gateway.set_cap("plain", epsilon=8.0, delta=1e-6, actor="board", reason="test")
    dp = gateway.query("shop", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.01), fallback="proxy")
    assert dp.get("source") != "proxy" and dp["cached"] is False and dp["charge"] is not None
    assert dp["rows"] != ans["rows"] or dp["accuracy"]  # a noisy release with its accuracy


def test_the_policy_default_makes_dashboards_fall_back(gateway):
    share = 0.5 * gateway.ledger.cap("plain").rho_cap
    gateway.query("shop", "SELECT COUNT(*) FROM orders", consumer="dashboard", budget=QueryBudget(rho=share))
    ans = gateway.query("shop", BY_REGION, consumer="dashboard", budget=QueryBudget(rho=0.01))
    assert ans["source"] == "proxy"
    with pytest.raises(BudgetExhausted):  # the request may opt out
        gateway.query("shop", BY_REGION, consumer="dashboard", budget=QueryBudget(rho=0.01), fallback="none")


def test_fallback_is_validated_before_anything_runs(gateway):
    with pytest.raises(InvalidRequest, match="names no proxy"):
        gateway.query("club", BY_REGION, consumer="analysts", fallback="proxy")
    with pytest.raises(InvalidRequest, match="fallback must be"):
        gateway.query("shop", BY_REGION, consumer="analysts", fallback="maybe")
    assert gateway.ledger.spend("members").charges == 0


def test_quantiles_are_not_answered_from_the_proxy(gateway):
    _exhaust_shop(gateway)
    with pytest.raises(BudgetExhausted) as err:
        gateway.query("shop", "SELECT MEDIAN(amount) FROM orders", consumer="analysts",
                      budget=QueryBudget(rho=0.01), fallback="proxy")
    assert err.value.details["proxy"]["answered"] is False


# --- 6. utility trials ---------------------------------------------------------------------------


def test_explain_trial_runs_on_the_proxy_for_free_with_the_expected_error(gateway):
    before = gateway.ledger.spend("plain").charges
    out = gateway.explain("shop", BY_REGION, budget=QueryBudget(rho=0.02), trial=True)
    trial = out["trial"]
    assert trial["source"] == "proxy" and trial["dp"] is False
    assert trial["rows"] == [["eu", 42], ["us", 39], ["apac", 39]]
    # ± at the requested budget: COUNT(*) with k = 1 and m = 3 rows per unit has Δ2 = 3, and
    # ρ = Δ2²/(2σ²) = 0.02 gives σ = 3/√0.04 = 15; the ± is the discrete Gaussian's 95 % half-width at σ = 15
    from dpgate.mechanisms import ci95_halfwidth

    assert trial["accuracy"]["n"]["sigma"] == pytest.approx(15.0, rel=1e-12)
    assert trial["accuracy"]["n"]["ci95"] == ci95_halfwidth("discrete_gaussian", 15.0)
    assert gateway.ledger.spend("plain").charges == before
    with pytest.raises(InvalidRequest, match="no proxy"):
        gateway.explain("club", BY_REGION, trial=True)


# --- 4. the attack bound -------------------------------------------------------------------------


def test_the_dataset_publishes_the_attack_bound_of_cap_and_spend(gateway):
    doc = gateway.dataset("shop")
    cap = doc["attack_bound"]["cap"]
    # (ε, δ) = (4, 1e-6): e⁴·0.01 + 1e-6 = 0.5459825 at FPR = 1 %
    assert cap["dp"]["tpr"] == pytest.approx(math.exp(4) * 0.01 + 1e-6, rel=1e-12)
    # the RDP budget the ledger enforces (B(α) = α·ρ_cap up to α_cap) is tighter than the point
    assert cap["tightest"]["tpr"] < cap["dp"]["tpr"] and cap["tightest"]["tpr"] >= 0.01
    assert doc["attack_bound"]["spent"]["tightest"]["tpr"] == pytest.approx(0.01)  # nothing spent yet
    gateway.query("shop", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.05))
    spent = gateway.dataset("shop")["attack_bound"]["spent"]
    assert spent["zcdp"]["rho"] == pytest.approx(0.05) and "gdp" not in spent  # discrete Gaussian: no GDP claim
    assert spent["zcdp"]["tpr"] == pytest.approx(accounting.zcdp_true_positive_rate(0.05, 0.01))
    assert "not as Gaussian DP" in spent["assumption"]


def test_a_continuous_gaussian_history_gets_the_gdp_curve(gateway):
    gateway.charge_external("plain", "analysts", dp_sgd={"q": 0.5, "noise_multiplier": 10.0, "steps": 4,
                                                         "sampler": "shuffle"}, purpose="tiny run", actor="t")
    spent = gateway.dataset("shop")["attack_bound"]["spent"]
    # 4 steps at σ = 10 without amplification: ρ = 4/200 = 0.02, μ = √(2ρ) = 0.2
    assert spent["gdp"]["mu"] == pytest.approx(0.2, rel=1e-12)
    assert spent["gdp"]["tpr"] == pytest.approx(accounting.gdp_true_positive_rate(0.2, 0.01), rel=1e-12)
    assert spent["tightest"]["bound"] == "gdp"


# --- 5. DP-SGD charges from parameters -----------------------------------------------------------


def test_dp_sgd_charges_are_computed_and_recorded_with_the_sampler(gateway):
    out = gateway.charge_external("plain", "analysts", dp_sgd={"q": 0.01, "noise_multiplier": 1.1, "steps": 1000,
                                                               "sampler": "poisson"}, purpose="fine-tune", actor="t")
    assert out["accountant"] == "gateway" and out["dp_sgd"]["sampler"] == "poisson"
    entry = gateway.ledger_entries("plain")[-1]
    assert entry["metadata"]["dp_sgd"] == {"q": 0.01, "noise_multiplier": 1.1, "steps": 1000, "sampler": "poisson"}
    assert entry["metadata"]["amplified"] is True
    assert entry["cost"]["curve"][:-1] == pytest.approx(accounting.dp_sgd_rdp(0.01, 1.1, 1000, "poisson")[:-1].tolist())


def test_shuffle_is_charged_without_amplification_and_refused_when_it_does_not_fit(gateway):
    with pytest.raises(BudgetExhausted) as err:
        gateway.charge_external("plain", "analysts", dp_sgd={"q": 0.01, "noise_multiplier": 1.1, "steps": 1000,
                                                             "sampler": "shuffle"}, purpose="fine-tune", actor="t")
    # 1000/(2·1.1²) = 413.2 in ρ: far above the analysts' half of ρ_cap
    assert err.value.details["requested"]["rho"] == pytest.approx(1000 / (2 * 1.1**2), rel=1e-12)
    assert gateway.ledger.spend("plain").charges == 0


def test_a_callers_curve_is_checked_against_the_stated_parameters(gateway):
    run = {"q": 0.01, "noise_multiplier": 1.1, "steps": 1000, "sampler": "shuffle"}
    amplified = accounting.dp_sgd_rdp(0.01, 1.1, 1000, "poisson").tolist()
    # an accountant that assumed Poisson amplification for shuffled batches: refused, nothing charged
    with pytest.raises(InvalidBudget, match="below what the stated DP-SGD run costs"):
        gateway.charge_external("plain", "analysts", curve=amplified, dp_sgd=run, purpose="x", actor="t")
    # the same curve with the parameters it was computed for: accepted, marked as the caller's
    out = gateway.charge_external("plain", "analysts", curve=amplified, dp_sgd={**run, "sampler": "poisson"},
                                  purpose="x", actor="t")
    assert out["accountant"] == "caller"
    assert gateway.ledger_entries("plain")[-1]["metadata"]["accountant"] == "caller"
    # a curve without parameters stays possible, marked as the caller's accountant
    out = gateway.charge_external("plain", "analysts", curve=[0.001 * a for a in accounting.ORDERS[:-1]] + [math.inf],
                                  purpose="y", actor="t")
    assert out["accountant"] == "caller" and "dp_sgd" not in out


def test_external_charges_on_a_cohort_population_draw_on_the_declared_cohorts(gateway):
    out = gateway.charge_external("members", "analysts", rho=0.01, kind="gaussian", purpose="run", actor="t")
    assert out["cohorts"] == COHORTS
    out = gateway.charge_external("members", "analysts", rho=0.01, kind="gaussian", purpose="run", actor="t",
                                  cohorts=["2026-03"])
    assert out["cohorts"] == ["2026-03"]
    with pytest.raises(InvalidRequest, match="declares no cohort"):
        gateway.charge_external("members", "analysts", rho=0.01, kind="gaussian", purpose="run", actor="t",
                                cohorts=["1999-01"])
    assert [_cohort_rho(gateway, c) for c in COHORTS] == [0.01, 0.01, 0.02]


def test_cohorts_added_to_a_charged_population_stay_drift_and_cannot_be_adopted(project, tmp_path):
    from dpgate.service import apply_policies
    from dpgate.policy import load_policies

    home = tmp_path / "state"
    with Gateway.open(Settings(policies=project, home=home)) as gw:
        gw.query("shop", BY_REGION, consumer="analysts", budget=QueryBudget(rho=0.01))
    shop = project / "shop.toml"  # an edit that would hand every signup month a fresh budget
    shop.write_text(shop.read_text().replace("[budget]", '[population]\ncohort_column = "signup"\n\n[budget]', 1))
    with Gateway.open(Settings(policies=project, home=home)) as gw:
        drift = gw.dataset("shop")["policy_drift"]
        assert drift["drifted"] and drift["cohort_column"] == {"ledger": None, "policy": "signup"}
        # the ledger's rule holds: the whole population is charged, and says so
        rel = gw.query("shop", "SELECT COUNT(*) FROM orders WHERE signup = '2026-01'", consumer="analysts",
                       budget=QueryBudget(rho=0.01))
        assert rel["guarantee"]["renewal"] == "fixed cap, no renewal" and "cohorts" not in rel["guarantee"]
        assert gw.ledger.spend("plain").spent_rho == pytest.approx(0.02)
        assert gw.dataset("shop")["renewal"].startswith("fixed cap, no renewal")
        with pytest.raises(RenewalRefused, match="switching population 'plain' to cohorts"):
            apply_policies(gw.ledger, load_policies(project), actor="ops", reason="monthly budgets",
                           population="plain")
        assert gw.ledger.cohort_column("plain") is None


@pytest.mark.parametrize("sampler", ["poisson", "shuffle"])
def test_a_noise_multiplier_whose_square_underflows_is_refused_for_free(gateway, sampler):
    """σ = 1e-300: σ² is 0 in doubles, so the curve cannot be computed (the trial found a
    ZeroDivisionError, HTTP 500); refused as an invalid budget, nothing charged."""
    run = {"q": 0.01, "noise_multiplier": 1e-300, "steps": 10, "sampler": sampler}
    with pytest.raises(InvalidBudget, match="too small"):
        gateway.charge_external("plain", "analysts", dp_sgd=run, purpose="x", actor="t")
    assert gateway.ledger.spend("plain").charges == 0
