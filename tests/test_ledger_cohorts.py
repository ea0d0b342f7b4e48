"""One budget per (population, cohort) in the ledger (issue 23 item 1), on SQLite and PostgreSQL.

Cohorts' units are disjoint, so a charge is admitted only if *each* cohort it names admits it,
and adds its full cost to each of them (parallel composition); a cohort never charged has the
whole cap. The cohorts a charge drew on are part of its hash-chained entry; ``verify`` replays
every cohort's totals; the cohort rule of a charged population cannot change (renewal).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from urllib.parse import urlsplit

import pytest

from dpgate.accounting import Cost
from dpgate.errors import BudgetExhausted, InvalidRequest, RenewalRefused
from dpgate.ledger import open_ledger
from dpgate.ledger.base import entry_hash

DELTA = 1e-6
PG_URL = os.environ.get("DPGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request, tmp_path):
    if request.param == "sqlite":
        led = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
        yield led
        led.close()
        return
    psycopg = pytest.importorskip("psycopg")
    from psycopg import sql

    try:
        psycopg.connect(PG_URL, connect_timeout=3, autocommit=True).close()
    except psycopg.Error:
        pytest.skip(f"no PostgreSQL server at {urlsplit(PG_URL).hostname}")
    schema = "dpg_cohorts_" + secrets.token_hex(6)
    led = open_ledger(f"{PG_URL}{'&' if urlsplit(PG_URL).query else '?'}schema={schema}")
    yield led
    led.close()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _population(led, name="members", column="signup"):
    led.ensure_population(name, epsilon=4.0, delta=DELTA, allocations={"analysts": 0.5, "dashboard": 0.5},
                          cohort_column=column)
    return led.cap(name).rho_cap


def test_a_charge_on_cohort_a_leaves_cohort_b_untouched(ledger):
    rho_cap = _population(ledger)
    ledger.charge("members", "analysts", Cost.zcdp(0.02), purpose="q", cohorts=["2026-01"])
    spend = ledger.cohort_spend("members")
    assert set(spend) == {"2026-01"}  # cohort B has no row: it has spent nothing
    assert spend["2026-01"].spent_rho == 0.02
    # B can still spend the whole share of the cap; A cannot
    ledger.charge("members", "analysts", Cost.zcdp(0.5 * rho_cap), purpose="all of B", cohorts=["2026-02"])
    with pytest.raises(BudgetExhausted) as err:
        ledger.charge("members", "analysts", Cost.zcdp(0.5 * rho_cap), purpose="all of A", cohorts=["2026-01"])
    assert err.value.details["cohort"] == "2026-01" and "cohort '2026-01'" in err.value.message
    after = ledger.cohort_spend("members")
    assert after["2026-01"].spent_rho == 0.02
    assert after["2026-02"].spent_rho == pytest.approx(0.5 * rho_cap, rel=1e-15)
    assert ledger.verify().ok


def test_every_cohort_is_charged_in_full_and_all_or_nothing(ledger):
    rho_cap = _population(ledger)
    ledger.charge("members", "dashboard", Cost.zcdp(0.4 * rho_cap), purpose="fill B", cohorts=["2026-02"])
    # a charge on A and B that fits A but not B: refused, A unchanged, nothing written
    before = ledger.verify().entries
    with pytest.raises(BudgetExhausted) as err:
        ledger.charge("members", "dashboard", Cost.zcdp(0.2 * rho_cap), purpose="both", cohorts=["2026-01", "2026-02"])
    assert err.value.details["cohort"] == "2026-02"
    assert err.value.details["cohorts"] == ["2026-01", "2026-02"]
    assert "2026-01" not in ledger.cohort_spend("members")
    assert ledger.verify().entries == before
    # one that fits both: each cohort pays the full cost (not a split)
    r = ledger.charge("members", "dashboard", Cost.zcdp(0.1 * rho_cap), purpose="both", cohorts=["2026-02", "2026-01"])
    assert r.cohorts == ("2026-01", "2026-02")
    spend = ledger.cohort_spend("members")
    assert spend["2026-01"].spent_rho == pytest.approx(0.1 * rho_cap, rel=1e-15)
    assert spend["2026-02"].spent_rho == pytest.approx(0.5 * rho_cap, rel=1e-15)
    # the population's own totals add every charge once (the sum over cohorts)
    assert ledger.spend("members").spent_rho == pytest.approx(0.5 * rho_cap, rel=1e-15)
    assert ledger.verify().ok


def test_a_new_cohort_starts_with_the_whole_cap(ledger):
    rho_cap = _population(ledger)
    for c in ("2026-01", "2026-02"):
        ledger.charge("members", "analysts", Cost.zcdp(0.5 * rho_cap), purpose="spend it all", cohorts=[c])
        ledger.charge("members", "dashboard", Cost.zcdp(0.5 * rho_cap), purpose="spend it all", cohorts=[c])
    with pytest.raises(BudgetExhausted):
        ledger.charge("members", "analysts", Cost.zcdp(1e-6), purpose="more", cohorts=["2026-01"])
    # the cohort of next month: the whole cap, for each consumer's share
    ledger.charge("members", "analysts", Cost.zcdp(0.5 * rho_cap), purpose="new people", cohorts=["2026-03"])
    ledger.charge("members", "dashboard", Cost.zcdp(0.5 * rho_cap), purpose="new people", cohorts=["2026-03"])
    assert ledger.cohort_spend("members")["2026-03"].remaining_rho == 0.0
    assert ledger.verify().ok


def test_cohorts_are_required_exactly_for_populations_with_cohorts(ledger):
    _population(ledger)
    ledger.ensure_population("plain", epsilon=1.0, delta=DELTA, allocations={})
    with pytest.raises(InvalidRequest, match="names the cohorts"):
        ledger.charge("members", "analysts", Cost.zcdp(0.01), purpose="q")
    with pytest.raises(InvalidRequest, match="has no cohorts"):
        ledger.charge("plain", "anyone", Cost.zcdp(0.01), purpose="q", cohorts=["2026-01"])
    with pytest.raises(InvalidRequest, match="at least one cohort"):
        ledger.charge("members", "analysts", Cost.zcdp(0.01), purpose="q", cohorts=[])
    assert ledger.verify().entries == 2  # two creation events, no charge


def test_the_cohorts_of_a_charge_are_hashed_and_replayed(ledger):
    _population(ledger)
    ledger.charge("members", "analysts", Cost.zcdp(0.01), purpose="q", cohorts=["2026-01", "2026-02"])
    chain = ledger.chain()
    charge = [e for e in chain if e["type"] == "charge"][0]
    assert charge["cohorts"] == '["2026-01","2026-02"]'
    assert entry_hash(charge) == charge["hash"]
    created = [e for e in chain if e["type"] == "event"][0]
    assert '"cohort_column":"signup"' in created["new"]
    # a charge without cohorts (another population) has no cohorts field: its hash is as before
    ledger.ensure_population("plain", epsilon=1.0, delta=DELTA, allocations={})
    ledger.charge("plain", "x", Cost.zcdp(0.01), purpose="q")
    plain = [e for e in ledger.chain() if e["type"] == "charge"][-1]
    assert "cohorts" not in plain
    report = ledger.verify()
    assert report.ok, report.problems


def test_verify_finds_edited_cohort_totals_and_cohort_columns(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    led = open_ledger(url)
    _population(led)
    led.charge("members", "analysts", Cost.zcdp(0.01), purpose="q", cohorts=["2026-01"])
    led.close()
    conn = sqlite3.connect(str(tmp_path / "l.sqlite"))
    with conn:  # an operator "renews" cohort 2026-01 by hand, and drops the cohort rule
        conn.execute("DELETE FROM cohort_totals WHERE cohort = '2026-01'")
        conn.execute("DELETE FROM population_cohorts")
    conn.close()
    led = open_ledger(url)
    report = led.verify()
    led.close()
    assert not report.ok
    text = " ".join(report.problems)
    assert "cohort '2026-01'" in text and "cohort columns" in text


def test_switching_cohorts_on_after_a_charge_is_refused_as_renewal(ledger):
    ledger.ensure_population("plain", epsilon=1.0, delta=DELTA, allocations={})
    # before any charge the rule may still be adopted (nothing was spent)
    out = ledger.apply_policy("plain", epsilon=1.0, delta=DELTA, allocations={}, actor="ops",
                              reason="cohorts from the start", cohort_column="signup")
    assert [e["kind"] for e in out["events"]] == ["cohorts_changed"]
    assert ledger.cohort_column("plain") == "signup"
    ledger.charge("plain", "x", Cost.zcdp(0.01), purpose="q", cohorts=["a"])
    with pytest.raises(RenewalRefused) as err:
        ledger.apply_policy("plain", epsilon=1.0, delta=DELTA, allocations={}, actor="ops",
                            reason="drop the cohorts", cohort_column=None)
    assert "renews only by opening new cohorts" in err.value.message
    ledger.ensure_population("fixed", epsilon=1.0, delta=DELTA, allocations={})
    ledger.charge("fixed", "x", Cost.zcdp(0.01), purpose="q")
    with pytest.raises(RenewalRefused) as err:
        ledger.apply_policy("fixed", epsilon=1.0, delta=DELTA, allocations={}, actor="ops",
                            reason="fresh budgets per month", cohort_column="signup")
    assert "fixed cap, no renewal" in err.value.message and "after 12 periods" in err.value.message
    assert ledger.cohort_column("fixed") is None
    assert ledger.verify().ok


def test_policy_drift_reports_the_cohort_rule(ledger):
    _population(ledger)
    drift = ledger.ensure_population("members", epsilon=4.0, delta=DELTA,
                                     allocations={"analysts": 0.5, "dashboard": 0.5})
    assert drift.drifted and drift.cohorts_differ
    assert drift.to_dict()["cohort_column"] == {"ledger": "signup", "policy": None}
    same = ledger.ensure_population("members", epsilon=4.0, delta=DELTA,
                                    allocations={"analysts": 0.5, "dashboard": 0.5}, cohort_column="signup")
    assert not same.drifted


def test_renewal_refusal_states_the_seeds_figures():
    from dpgate.accounting import periods_epsilon
    from dpgate.ledger.caps import validate_cap
    from dpgate.ledger.renewal import renewal_refused

    # ρ 0.1 per period (a cap stated in ρ) at δ 1e-6: 9.34 after 12 periods, 17.70 after 36
    cap = validate_cap(None, DELTA, rho_cap=0.1)
    err = renewal_refused("monthly", cap, "renewing population 'monthly'")
    assert err.code == "renewal_refused" and err.http_status == 409
    assert "epsilon = 9.34 after 12 periods" in err.message
    assert "epsilon = 17.70 after 36 periods" in err.message
    assert "epsilon = 2.45" in err.message  # what one period looks like
    after = {a["periods"]: a for a in err.details["renewal"]["after"]}
    assert after[12]["epsilon"] == periods_epsilon(0.1, 12, DELTA)
    assert after[36]["epsilon_tight"] == periods_epsilon(0.1, 36, DELTA, "tight")
