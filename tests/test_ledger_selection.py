"""The ledger side of private partition selection (issue 11; DESIGN.md "Accounting"): approximate
zCDP. A charge carries (ρ, δ_q); ρ goes through the filter, the δ parts add up (a union bound,
valid under adaptivity) and are capped at the cap's ``selection_delta``; ρ_cap is fixed at
δ − selection_delta. Survives restarts and races, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import math
import os
import secrets
import threading

import pytest
from _oracles import ledger_epsilon as oracle_epsilon

from dpgate.accounting import ORDERS, Cost
from dpgate.errors import BudgetExhausted, InvalidBudget
from dpgate.ledger import open_ledger

DELTA = 1e-6
SEL = 4e-7
PG_SERVER = os.environ.get("DPGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'l.sqlite'}"
        return
    psycopg = pytest.importorskip("psycopg")
    from psycopg import sql

    try:
        conn = psycopg.connect(PG_SERVER, autocommit=True, connect_timeout=3)
    except psycopg.Error:
        pytest.skip("no PostgreSQL server")
    schema = "dpg_sel_" + secrets.token_hex(6)
    yield f"{PG_SERVER}?schema={schema}"
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    conn.close()


def test_rho_cap_is_fixed_at_delta_minus_selection_delta(url):
    led = open_ledger(url)
    try:
        led.ensure_population("p", epsilon=2.0, delta=DELTA, selection_delta=SEL, allocations={})
        cap = led.cap("p")
        assert cap.selection_delta == SEL and cap.rho_delta == pytest.approx(DELTA - SEL)
        # hand formula (Balle et al. 2020, Thm. 21 at one order), maximised over the grid, at δ − SEL
        d = DELTA - SEL
        rho = {a: (2.0 - math.log((a - 1) / a) + (math.log(d) + math.log(a)) / (a - 1)) / a
               for a in ORDERS if math.isfinite(a)}
        best = max(rho, key=rho.get)
        assert cap.alpha_cap == best and cap.rho_cap == pytest.approx(rho[best], rel=1e-12)
        assert led.events("p")[0]["new"]["cap"]["selection_delta"] == SEL
        with pytest.raises(Exception):
            led.ensure_population("q", epsilon=2.0, delta=DELTA, selection_delta=DELTA, allocations={})
    finally:
        led.close()


def test_selection_delta_adds_up_refuses_at_the_cap_and_survives_a_restart(url):
    led = open_ledger(url)
    led.ensure_population("p", epsilon=2.0, delta=DELTA, selection_delta=SEL, allocations={"a": 0.5, "b": 0.5})
    for _ in range(3):
        r = led.charge("p", "a", Cost.zcdp(0.001), purpose="select keys", selection_delta=5e-8)
        assert r.selection_delta == 5e-8
    rep = led.spend("p").to_dict()
    assert rep["spent"]["selection_delta"] == math.fsum([5e-8] * 3)
    assert rep["remaining"]["selection_delta"] == pytest.approx(SEL - 1.5e-7)
    assert rep["consumers"]["a"]["selection_delta_spent"] == pytest.approx(1.5e-7)
    led.close()
    led = open_ledger(url)  # a restart
    try:
        # consumer a holds half of the selection δ: 2e-7, of which 1.5e-7 is spent
        with pytest.raises(BudgetExhausted) as info:
            led.charge("p", "a", Cost.zcdp(0.001), purpose="select keys", selection_delta=6e-8)
        d = info.value.details
        assert d["rule"] == "selection_delta" and d["scope"] == "consumer"
        assert d["selection"]["remaining"] == pytest.approx(5e-8)
        assert info.value.message.startswith("needs δ 6e-08 for partition selection; left for a: δ 5e-08 of 2e-07")
        assert "partition selection budget exhausted" in d["explanation"]
        led.charge("p", "a", Cost.zcdp(0.001), purpose="select keys", selection_delta=5e-8)  # exactly fits
        led.charge("p", "b", Cost.zcdp(0.001), purpose="select keys", selection_delta=2e-7)
        with pytest.raises(BudgetExhausted) as info:  # the population's selection δ is spent
            led.charge("p", "b", Cost.zcdp(0.001), purpose="select keys", selection_delta=1e-12)
        assert info.value.details["rule"] == "selection_delta"
        led.charge("p", "b", Cost.zcdp(0.001), purpose="no selection")  # ρ alone still fits
        assert led.spend("p").selection_delta_spent == pytest.approx(SEL)
        report = led.verify()
        assert report.ok, report.problems
        with pytest.raises(InvalidBudget):
            led.charge("p", "a", Cost.zcdp(0.001), purpose="q", selection_delta=-1e-9)
        with pytest.raises(InvalidBudget):
            led.charge("p", "a", Cost.zcdp(0.001), purpose="q", selection_delta=float("nan"))
    finally:
        led.close()


def test_no_selection_delta_reserved_means_no_selection(url):
    led = open_ledger(url)
    try:
        led.ensure_population("p", epsilon=2.0, delta=DELTA, allocations={})
        with pytest.raises(BudgetExhausted) as info:
            led.charge("p", "a", Cost.zcdp(0.001), purpose="select", selection_delta=1e-9)
        assert "not available" in info.value.message and "caps apply" in info.value.message
        # adopting a policy that reserves selection δ is a recorded governance event
        out = led.apply_policy("p", epsilon=2.0, delta=DELTA, selection_delta=SEL, allocations={},
                               actor="ops", reason="enable partition selection")
        assert [e["kind"] for e in out["events"]] == ["cap_changed"]
        led.charge("p", "a", Cost.zcdp(0.001), purpose="select", selection_delta=1e-9)
        assert led.verify().ok
    finally:
        led.close()


def test_threads_racing_for_selection_delta_never_exceed_it(url):
    led = open_ledger(url)
    try:
        led.ensure_population("p", epsilon=2.0, delta=DELTA, selection_delta=SEL, allocations={})
        barrier = threading.Barrier(8)
        outcomes: list[str] = []

        def go() -> None:
            barrier.wait()
            for _ in range(3):
                try:
                    led.charge("p", "a", Cost.zcdp(1e-4), purpose="select", selection_delta=3e-8)
                    outcomes.append("ok")
                except BudgetExhausted:
                    outcomes.append("refused")

        threads = [threading.Thread(target=go) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # ⌊4e-7 / 3e-8⌋ = 13 charges fit, whatever the interleaving
        assert outcomes.count("ok") == 13 and outcomes.count("refused") == 11
        assert led.spend("p").selection_delta_spent == pytest.approx(13 * 3e-8)
        assert led.spend("p").selection_delta_spent <= SEL
        assert led.verify().ok
    finally:
        led.close()


def test_reported_epsilon_is_stated_at_delta_minus_selection_delta(url):
    led = open_ledger(url)
    try:
        led.ensure_population("p", epsilon=2.0, delta=DELTA, selection_delta=SEL, allocations={})
        r = led.charge("p", "a", Cost.zcdp(0.01), purpose="q", selection_delta=1e-8)
        assert r.delta == pytest.approx(DELTA - SEL)
        # the ledger's one conversion at the δ the charge was made at (dp-accounting as the oracle)
        assert r.epsilon_at_delta == pytest.approx(oracle_epsilon(0.01, DELTA - SEL), rel=1e-9)
        rep = led.spend("p")
        assert rep.spent_epsilon == pytest.approx(oracle_epsilon(0.01, DELTA - SEL), rel=1e-9)
    finally:
        led.close()
