"""Ledgers written before the α_cap rule keep verifying (issue 9, item 6).

``fixtures/ledger_v1.sql`` is a SQLite ledger written by the previous dpgate (schema version 1,
caps fixed by the legacy rule: continuous CKS ρ_cap, every grid order and α* checked), dumped
with ``sqlite3 iterdump``: two populations, zCDP, pure-ε, RDP-curve and continuous-Gaussian
charges, a cap change by an admin and an allocation change. Opening it with this dpgate
applies migration 2 (recorded), keeps every hash, every cap and its rule, every total; new
charges on a legacy population are decided by its legacy rule until a governance event
re-fixes its cap by the α_cap rule. The same history is replayed into PostgreSQL.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from dpgate.accounting import Cost
from dpgate.errors import BudgetExhausted
from dpgate.ledger import open_ledger
from dpgate.ledger.base import legacy_cap

FIXTURE = Path(__file__).parent / "fixtures" / "ledger_v1.sql"
DELTA = 1e-6
# what the old code reported for "census" (cap changed to ε = 3 by alice, then reallocated)
CENSUS_RHO_CAP = 0.18506984065340149
CENSUS_SPENT_RHO = 0.13965881525354062


def _legacy_sqlite(path: Path) -> str:
    conn = sqlite3.connect(str(path))
    conn.executescript(FIXTURE.read_text())
    conn.close()
    return f"sqlite:///{path}"


def _check_opened_legacy(led) -> None:
    report = led.verify()
    assert report.ok, report.problems
    assert (report.charges, report.events) == (9, 4)
    cap = led.cap("census")
    assert cap.rule == "legacy" and cap.alpha_cap is None
    assert cap == legacy_cap(3.0, DELTA)  # the old rule's numbers, recomputed independently here
    rep = led.spend("census")
    assert rep.rho_cap == CENSUS_RHO_CAP and rep.spent_rho == pytest.approx(CENSUS_SPENT_RHO, rel=1e-15)
    assert rep.to_dict()["cap"]["rule"] == "legacy"
    assert led.cap("open").rule == "legacy"
    # new charges on a legacy population follow its rule (every order checked) and verify
    led.charge("census", "analysts", Cost.zcdp(0.001), purpose="after the upgrade")
    led.charge("open", "sgd", Cost.pure(0.05), purpose="after the upgrade")
    assert led.verify().ok
    # the drift report suggests re-fixing; caps apply with the same values records the new rule
    drift = led.ensure_population("census", epsilon=3.0, delta=DELTA, allocations={"analysts": 0.6,
                                                                                  "dashboard": 0.4})
    assert not drift.drifted and drift.legacy_rule and "caps apply" in drift.message()
    out = led.apply_policy("census", epsilon=3.0, delta=DELTA, allocations={"analysts": 0.6, "dashboard": 0.4},
                           actor="ops", reason="re-fix under the alpha_cap rule")
    assert [e["kind"] for e in out["events"]] == ["cap_changed"]
    new = led.cap("census")
    assert new.rule == "alpha_cap" and new.epsilon == 3.0
    assert led.events("census")[-1]["old"] == cap.to_dict()
    led.charge("census", "analysts", Cost.zcdp(0.001), purpose="after re-fixing")
    with pytest.raises(BudgetExhausted):
        led.charge("census", "analysts", Cost.zcdp(1.0), purpose="too much")
    assert led.verify().ok


def test_a_v1_sqlite_ledger_migrates_and_keeps_verifying(tmp_path):
    url = _legacy_sqlite(tmp_path / "old.sqlite")
    led = open_ledger(url)
    try:
        conn = sqlite3.connect(str(tmp_path / "old.sqlite"))
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
        conn.close()
        assert versions == [1, 2, 3, 5, 6]
        _check_opened_legacy(led)
    finally:
        led.close()
    again = open_ledger(url)  # reopening migrates nothing more
    assert again.verify().ok
    again.close()


def test_a_v1_history_in_postgresql_migrates_and_keeps_verifying(tmp_path):
    psycopg = pytest.importorskip("psycopg")
    import os
    import secrets

    from psycopg import sql

    from dpgate.ledger.postgres import MIGRATIONS

    server = os.environ.get("DPGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    try:
        admin = psycopg.connect(server, autocommit=True, connect_timeout=3)
    except psycopg.Error:
        pytest.skip("no PostgreSQL server at " + server.split("@")[-1])
    schema = "dpg_mig_" + secrets.token_hex(6)
    try:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        # schema version 1 exactly as the previous dpgate created it, then the fixture's rows
        admin.execute("CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                      " applied_at text NOT NULL)")
        with admin.transaction():
            for stmt in MIGRATIONS[0][2]:
                admin.execute(stmt)
        order = ["schema_migrations", "ledger_meta", "populations", "events", "charges", "spend_totals",
                 "chain_head"]
        rows = sorted((line for line in FIXTURE.read_text().splitlines() if line.startswith("INSERT INTO")),
                      key=lambda line: order.index(re.match(r'INSERT INTO "(\w+)"', line).group(1)))
        admin.execute("DELETE FROM chain_head")
        for line in rows:
            line = re.sub(r'^INSERT INTO "(\w+)"', r"INSERT INTO \1", line).rstrip(";")
            if line.startswith("INSERT INTO populations"):  # rho_stated: 0/1 → boolean
                line = re.sub(r",([01]),'\{", lambda m: f",{'true' if m.group(1) == '1' else 'false'},'{{", line)
            admin.execute(line)
        url = f"{server}?schema={schema}"
        led = open_ledger(url)
        try:
            assert [r[0] for r in admin.execute("SELECT version FROM schema_migrations ORDER BY version")] == [1, 2, 3, 5, 6]
            _check_opened_legacy(led)
        finally:
            led.close()
    finally:
        admin.execute("SET search_path TO public")
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        admin.close()
