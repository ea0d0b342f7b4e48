"""Search records (issue 15): charges of a tuning search, its selection, its record and replay.

Both ledger backends: SQLite (always) and PostgreSQL (``DPGATE_TEST_POSTGRES_URL``, default
``postgresql://postgres@127.0.0.1:5432/test``; skipped with the reason when no server answers).
Data: the synthetic evaluation table of tests/_eval_project.py.
"""

from __future__ import annotations

import math
import os
import secrets
import sqlite3

import numpy as np
import pytest
from _oracles import ledger_epsilon as oracle_epsilon

from dpgate import accounting
from dpgate.errors import Conflict, InvalidRequest, NotFound, UnsupportedQuery
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings
from tests._eval_project import write_eval_project

BEST = "SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC LIMIT 1"
POP = "eval-users"
PG_URL = os.environ.get("DPGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _pg_or_skip() -> str:
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect(PG_URL, connect_timeout=3, autocommit=True).close()
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL server for the search store tests: {type(exc).__name__}")
    return PG_URL


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def settings(request, tmp_path):
    policies = write_eval_project(tmp_path, epsilon=8.0)
    if request.param == "sqlite":
        yield Settings(policies=policies, home=tmp_path / "home")
        return
    import psycopg
    from psycopg import sql

    server = _pg_or_skip()
    schema = "dpgate_search_" + secrets.token_hex(6)
    sep = "&" if "?" in server else "?"
    yield Settings(policies=policies, home=tmp_path / "home", ledger_url=f"{server}{sep}schema={schema}")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def gw(settings):
    g = Gateway.open(settings)
    yield g
    g.close()


def spec(**over):
    base = {
        "purpose": "pick the best of three fine-tunes",
        "candidates": [{"name": n, "config": {"lr": lr}} for n, lr in (("a", 1e-4), ("b", 3e-4), ("c", 1e-3))],
        "training": {"name": "finetune-2026-11", "population": POP},
        "validation": {"name": "evals/eval", "population": POP},
        "selection": "private",
    }
    base.update(over)
    return base


def dpsgd_curve(sigma: float, q: float, steps: int) -> list[float]:
    """RDP of DP-SGD (Poisson-subsampled Gaussian) at the ledger's finite orders, by dp-accounting
    (the external accountant a training job would run), ∞ at the order ∞ (no claim)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    finite = [a for a in accounting.ORDERS if math.isfinite(a)]
    curve = [float(v) * steps for v in rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, finite)]
    return curve + [math.inf]


def charge_run(gw, sid, candidate, curve, **kw):
    return gw.charge_external(POP, "training", curve=curve, purpose=f"fine-tune {candidate}", actor="trainer",
                              search_id=sid, candidate=candidate, **kw)


def test_charges_of_a_search_add_up_in_the_ledger_and_survive_a_restart(settings):
    curves = {c: dpsgd_curve(s, 0.01, 1000) for c, s in (("a", 1.1), ("b", 1.3), ("c", 1.0))}
    with Gateway.open(settings) as gw:
        sid = gw.create_search(spec(), consumer="training", actor="ml-team")["search_id"]
        for c, curve in curves.items():
            charge_run(gw, sid, c, curve, outcome="completed")
        sel = gw.query("evals", BEST, consumer="training", budget=QueryBudget(epsilon=1.0), search_id=sid)
        spent = gw.ledger.spend(POP).to_dict()["spent"]
    with Gateway.open(settings) as again:  # a restart: everything comes back from the ledger database
        rec = again.search(sid)
        assert rec["status"] == "open" and len(rec["steps"]) == 4 and rec["replay"]["ok"], rec["replay"]
        assert [s["kind"] for s in rec["steps"]] == ["charge", "charge", "charge", "selection"]
        assert rec["steps"][3]["release_id"] == sel["release_id"] and rec["steps"][3]["selected"] == sel["rows"][0]
        totals = rec["totals"]["by_population"][POP]
        # the search is the population's only spender: its composed cost is the ledger's spend
        assert totals["charges"] == 4 == again.ledger.spend(POP).to_dict()["charges"]
        assert totals["epsilon_at_delta"] == pytest.approx(spent["epsilon"], rel=1e-12)
        assert totals["rho"] == pytest.approx(spent["rho"], rel=1e-12)
        # independently: the curves add order by order, plus the selection's α·ρ with ρ = 1²/8
        # (bounded range); RDP → (ε, δ) by dp-accounting's conversion on the same finite orders
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        finite = [a for a in accounting.ORDERS if math.isfinite(a)]
        total = np.sum([c[:-1] for c in curves.values()], axis=0) + np.array(finite) * (1.0 / 8)
        # at δ − selection_delta = 1e-6 − 1e-6/2 (the default reserve for partition selection, issue 11)
        oracle, _ = rdp.compute_epsilon(finite, total, 0.5e-6)
        # the ledger also tries the best order in between (≤ the grid's value)
        assert totals["epsilon_at_delta"] <= oracle * (1 + 1e-9)
        assert totals["epsilon_at_delta"] == pytest.approx(oracle, rel=0.02)


def test_a_retry_after_a_failed_target_is_charged_and_recorded(gw):
    sid = gw.create_search(spec(), consumer="training", actor="ml-team")["search_id"]
    first = gw.charge_external(POP, "training", rho=0.05, kind="zcdp", purpose="b, attempt 1", actor="trainer",
                               search_id=sid, candidate="b", outcome="target_missed", attempt=1)
    retry = gw.charge_external(POP, "training", rho=0.05, kind="zcdp", purpose="b, attempt 2", actor="trainer",
                               search_id=sid, candidate="b", step="retry", attempt=2, outcome="completed")
    gw.charge_external(POP, "training", rho=0.02, kind="zcdp", purpose="c discarded", actor="trainer",
                       search_id=sid, candidate="c", outcome="discarded")
    rec = gw.search(sid)
    assert [s["charge_id"] for s in rec["steps"]] == [first["charge_id"], retry["charge_id"],
                                                       rec["steps"][2]["charge_id"]]
    assert rec["steps"][0]["outcome"] == "target_missed" and rec["steps"][1]["step_kind"] == "retry"
    assert rec["totals"]["retries"] == 1 and rec["totals"]["failed"] == 1
    # zCDP adds: 0.05 + 0.05 + 0.02 = 0.12 (Bun & Steinke 2016, Lemma 2.3)
    assert rec["totals"]["by_population"][POP]["rho"] == pytest.approx(0.12, rel=1e-12)
    assert rec["totals"]["by_population"][POP]["epsilon_at_delta"] == pytest.approx(
        oracle_epsilon(0.12, 0.5e-6), rel=1e-9)  # at δ − selection_delta (issue 11), the ledger's conversion
    # the accountant's state after each step: ρ 0.05, 0.10, 0.12
    after = [s["accountant"]["population"]["spent"]["rho"] for s in rec["steps"]]
    assert after == pytest.approx([0.05, 0.10, 0.12], rel=1e-12)
    assert {e["charge_id"] for e in gw.ledger_entries(POP)} == set(rec["replay"]["ledger_charges"])
    assert rec["replay"]["ok"]


def test_public_data_selection_costs_nothing_and_is_recorded_as_post_processing(gw):
    s = spec(selection="public", validation={"name": "public-benchmark", "population": None})
    sid = gw.create_search(s, consumer="training", actor="ml-team")["search_id"]
    gw.charge_external(POP, "training", rho=0.1, kind="zcdp", purpose="a", actor="t", search_id=sid, candidate="a")
    before = len(gw.ledger_entries())
    rec = gw.close_search(sid, selected="a", artifacts=["s3://models/a"], actor="ml-team")
    assert len(gw.ledger_entries()) == before  # nothing charged
    last = rec["steps"][-1]
    assert rec["status"] == "closed" and last["kind"] == "close" and last["cost"] == {"rho": 0.0}
    assert "post-processing" in last["post_processing"] and rec["result"]["selected"] == "a"
    assert rec["totals"]["by_population"][POP]["rho"] == pytest.approx(0.1, rel=1e-12)


def test_private_selection_closes_on_a_released_key_and_a_closed_search_stays_closed(gw):
    sid = gw.create_search(spec(), consumer="training", actor="ml-team")["search_id"]
    rel = gw.query("evals", BEST, consumer="training", budget=QueryBudget(epsilon=2.0), search_id=sid)
    chosen = rel["rows"][0][0]
    other = next(c for c in "abc" if c != chosen) if chosen in "abc" else "a"
    with pytest.raises(InvalidRequest):
        gw.close_search(sid, selected="a", artifacts=[], actor="x")  # no selection release named
    if other != chosen:
        with pytest.raises(InvalidRequest):
            gw.close_search(sid, selected=other, artifacts=[], selection_release=rel["release_id"], actor="x")
    if chosen not in ("a", "b", "c"):
        pytest.skip("the selection chose a candidate outside this search's three (5 keys in the table)")
    rec = gw.close_search(sid, selected=chosen, artifacts=["s3://m/1"], selection_release=rel["release_id"],
                          actor="x")
    assert rec["status"] == "closed" and rec["replay"]["ok"]
    n = len(gw.ledger_entries())
    with pytest.raises(Conflict):
        gw.close_search(sid, selected=chosen, artifacts=[], selection_release=rel["release_id"], actor="x")
    with pytest.raises(Conflict):  # refused before the charge: nothing written
        gw.charge_external(POP, "training", rho=0.01, kind="zcdp", purpose="late", actor="t", search_id=sid)
    with pytest.raises(Conflict):
        gw.query("evals", BEST, consumer="training", budget=QueryBudget(epsilon=2.5), search_id=sid)
    assert len(gw.ledger_entries()) == n


def test_a_repeated_selection_in_a_search_is_recorded_free(gw):
    sid = gw.create_search(spec(), consumer="training", actor="ml-team")["search_id"]
    gw.query("evals", BEST, consumer="training", budget=QueryBudget(epsilon=1.0), search_id=sid)
    again = gw.query("evals", BEST, consumer="training", budget=QueryBudget(epsilon=1.0), search_id=sid)
    assert again["cached"] is True
    rec = gw.search(sid)
    assert rec["steps"][1]["cost"] == {"rho": 0.0} and rec["steps"][1]["cached"] is True
    assert rec["totals"]["charges"] == 1 and rec["replay"]["ok"]


@pytest.mark.parametrize("over, reason", [
    ({"stopping": "data-dependent"}, "unprivatised_stopping"),
    ({"people": "disjoint", "people_split": "by row"}, "disjoint_rows_not_people"),
    ({"validation": {"name": "v", "population": "other-people"}}, "populations_differ"),
    ({"candidates": [{"name": "a", "config": {"val_accuracy": 0.91}}]}, "raw_scores"),
])
def test_guard_rails_refuse_with_a_reason_and_charge_nothing(gw, over, reason):
    with pytest.raises(InvalidRequest) as info:
        gw.create_search(spec(**over), consumer="training", actor="ml-team")
    assert info.value.details.get("reason") == reason
    assert gw.ledger_entries() == [] and gw.search_list() == []


def test_privatised_data_dependent_stopping_is_accepted_and_its_decisions_charged(gw):
    sid = gw.create_search(spec(stopping="data-dependent", stopping_privatised=True), consumer="training",
                           actor="ml-team")["search_id"]
    gw.charge_external(POP, "training", rho=0.01, kind="zcdp", purpose="stop?", actor="t", search_id=sid,
                       step="stopping", candidate="a")
    rec = gw.search(sid)
    assert rec["stopping"] == "data-dependent" and rec["steps"][0]["step_kind"] == "stopping"


def test_refusals_of_search_steps_charge_nothing(gw):
    sid = gw.create_search(spec(), consumer="training", actor="ml-team")["search_id"]
    with pytest.raises(InvalidRequest):  # candidate not declared
        gw.charge_external(POP, "training", rho=0.01, kind="zcdp", purpose="x", actor="t", search_id=sid,
                           candidate="zz")
    with pytest.raises(NotFound):
        gw.charge_external(POP, "training", rho=0.01, kind="zcdp", purpose="x", actor="t", search_id="srch_nope")
    with pytest.raises(UnsupportedQuery):  # search_id only goes with a selection query
        gw.query("evals", "SELECT candidate, COUNT(*) FROM eval GROUP BY candidate", consumer="analysts",
                 search_id=sid)
    with pytest.raises(InvalidRequest):
        gw.charge_external(POP, "training", rho=0.01, kind="zcdp", purpose="x", actor="t", candidate="a")
    assert gw.ledger_entries() == [] and gw.search(sid)["steps"] == []


def test_the_sqlite_record_is_append_only_and_tampering_is_detected(tmp_path):
    policies = write_eval_project(tmp_path, epsilon=8.0)
    settings = Settings(policies=policies, home=tmp_path / "home")
    with Gateway.open(settings) as gw:
        sid = gw.create_search(spec(), consumer="training", actor="ml")["search_id"]
        gw.charge_external(POP, "training", rho=0.05, kind="zcdp", purpose="a", actor="t", search_id=sid,
                           candidate="a")
    conn = sqlite3.connect(tmp_path / "home" / "ledger.sqlite")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE search_steps SET body = '{}'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM searches")
    # an operator who drops the trigger and edits a step is caught by the step chain
    conn.execute("DROP TRIGGER search_steps_no_update")
    body = conn.execute("SELECT body FROM search_steps").fetchone()[0]
    conn.execute("UPDATE search_steps SET body = ?", (body.replace('"candidate":"a"', '"candidate":"b"'),))
    conn.commit()
    conn.close()
    with Gateway.open(settings) as gw:
        replay = gw.search(sid)["replay"]
        assert not replay["ok"] and any("chain" in p for p in replay["problems"])


def test_a_consumer_without_an_allocation_cannot_create_a_search(gw):
    # a trial: `dpgate search create --consumer nobody` succeeded, and every charge of the search
    # would then have been refused
    with pytest.raises(InvalidRequest) as info:
        gw.create_search(spec(), consumer="nobody", actor="ml-team")
    assert info.value.details.get("field") == "consumer" and "no allocation" in str(info.value)
    assert gw.search_list() == []


def test_a_search_is_seen_and_paid_only_by_its_consumer_on_both_backends(gw):
    """Issue 19, item 9 at the service layer (SQLite and PostgreSQL stores): the owner filter of
    list, get and close; another consumer's search is NotFound like a missing one, before any charge."""
    mine = gw.create_search(spec(), consumer="training", actor="ml-team")["search_id"]
    theirs = gw.create_search(spec(), consumer="analysts", actor="bob")["search_id"]
    assert [s["search_id"] for s in gw.search_list(owner="training")] == [mine]
    assert [s["search_id"] for s in gw.search_list(owner="analysts")] == [theirs]
    assert {s["search_id"] for s in gw.search_list()} == {mine, theirs}
    assert gw.search_list(POP, owner="nobody") == []
    assert gw.search(mine, owner="training")["consumer"] == "training"
    missing = "srch_" + "0" * 24
    for call in (lambda sid: gw.search(sid, owner="analysts"),
                 lambda sid: gw.close_search(sid, selected="a", artifacts=["s3://forged"], actor="bob",
                                             owner="analysts"),
                 lambda sid: gw.charge_external(POP, "analysts", rho=0.01, kind="zcdp", purpose="x", actor="bob",
                                                search_id=sid, candidate="a"),
                 lambda sid: gw.query("evals", BEST, consumer="analysts", budget=QueryBudget(epsilon=1.0),
                                      search_id=sid)):
        with pytest.raises(NotFound) as other:
            call(mine)
        with pytest.raises(NotFound) as absent:
            call(missing)
        assert other.value.message == absent.value.message
        assert set(other.value.details) == set(absent.value.details) == {"search_id"}
    # an admin's charge (any search visible) must still be paid by the search's consumer
    with pytest.raises(InvalidRequest) as wrong:
        gw.charge_external(POP, "analysts", rho=0.01, kind="zcdp", purpose="x", actor="root", search_id=mine,
                           candidate="a", any_search=True)
    assert wrong.value.details["search_consumer"] == "training"
    assert gw.ledger_entries() == [] and gw.search(mine)["steps"] == [] and gw.search(mine)["status"] == "open"
