"""Who owns the cap (DESIGN.md): after a population is created, the ledger owns its cap and
allocations. Restarts, deploys and CLI commands never put a policy file's values back; a
differing file is reported as drift and adopted only by ``dpgate caps apply`` (issue 9, item 4).

Real gateway, real SQLite ledger, real HTTP app (no mocks); a small project in tmp.
"""

from __future__ import annotations

import logging

import pytest
from _api_server import LiveServer
from _small_project import write_project
from _oracles import ledger_epsilon as oracle_epsilon

from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.cli import main as cli
from dpgate.ledger import open_ledger
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

DELTA = 1e-6


@pytest.fixture
def settings(tmp_path):
    return Settings(policies=write_project(tmp_path / "project"), home=tmp_path / "state")


def _argv(settings: Settings) -> list[str]:
    return ["--policies", str(settings.policies), "--home", str(settings.home)]


def _events(settings: Settings) -> list[dict]:
    led = open_ledger(settings.resolved_ledger_url(), create=False)
    try:
        return led.events("shoppers")
    finally:
        led.close()


def test_a_lowered_cap_stays_lowered_across_restarts_and_cli_commands(settings, capsys):
    with Gateway.open(settings) as gw:
        out = gw.set_cap("shoppers", epsilon=0.5, delta=DELTA, actor="root", reason="incident 7")
        assert out["changed"] and out["new"]["epsilon"] == 0.5
    # a restart (a new gateway on the same home) keeps the ledger's cap
    with Gateway.open(settings) as gw:
        assert gw.dataset("shop")["cap"]["epsilon"] == 0.5
        assert gw.budget("shop")["cap"]["epsilon"] == 0.5
    # so does every CLI command that opens the ledger
    assert cli(["budget", "shop", *_argv(settings)]) == 0
    printed = capsys.readouterr().out
    # the drift was said once, by the gateway opened first after the change (its log); later
    # commands do not repeat it (issue 24), and the JSON report always carries it
    assert "warning" not in printed and "ε = 0.5" in printed
    assert cli(["budget", "shop", "--json", *_argv(settings)]) == 0
    assert "caps apply" in capsys.readouterr().out
    assert cli(["explain", "SELECT COUNT(*) FROM orders", "--dataset", "shop", *_argv(settings)]) == 0
    assert cli(["query", "SELECT COUNT(*) FROM orders", "--dataset", "shop", "--rho", "0.001",
                "--json", *_argv(settings)]) == 0
    capsys.readouterr()
    kinds = [(e["kind"], e["actor"]) for e in _events(settings)]
    assert kinds == [("population_created", "policy"), ("cap_changed", "root")]
    with Gateway.open(settings) as gw:
        assert gw.dataset("shop")["cap"]["epsilon"] == 0.5


def test_a_differing_policy_file_is_reported_as_drift_never_applied(settings, tmp_path, caplog):
    with Gateway.open(settings) as gw:
        gw.query("shop", "SELECT COUNT(*) FROM orders", consumer="analysts", budget=QueryBudget(rho=0.01))
    write_project(tmp_path / "project", epsilon=8.0, analysts=0.9, dashboard=0.1)  # a "deploy"
    with caplog.at_level(logging.WARNING, logger="dpgate"):
        gw = Gateway.open(settings)
    try:
        assert any("caps apply" in r.getMessage() for r in caplog.records)
        page = gw.dataset("shop")
        assert page["cap"]["epsilon"] == 4.0  # the ledger's, not the file's 8.0
        assert page["allocations"] == {"analysts": 0.5, "dashboard": 0.5}
        drift = page["policy_drift"]
        assert drift["drifted"] is True and len(drift["differences"]) == 2
        assert drift["policy"]["cap"]["epsilon"] == 8.0 and drift["ledger"]["cap"]["epsilon"] == 4.0
        assert gw.budget("shop")["policy_drift"]["drifted"] is True
        assert gw.budget("shop")["consumers"]["analysts"]["share"] == 0.5
    finally:
        gw.close()
    assert [e["kind"] for e in _events(settings)] == ["population_created"]


def test_caps_apply_adopts_the_policy_file_as_a_recorded_governance_event(settings, tmp_path, capsys):
    with Gateway.open(settings) as gw:
        gw.set_cap("shoppers", epsilon=1.0, delta=DELTA, actor="root", reason="incident")
    assert cli(["caps", "show", *_argv(settings)]) == 0
    assert "drift" in capsys.readouterr().out
    # the population must be named by a policy; the reason is required
    assert cli(["caps", "apply", "--population", "nobody", "--reason", "x", *_argv(settings)]) == 4  # unknown_population: "not found" in the one exit-status table
    with pytest.raises(SystemExit):
        cli(["caps", "apply", *_argv(settings)])
    capsys.readouterr()
    assert cli(["caps", "apply", "--population", "shoppers", "--reason", "review 2026-Q3 approved",
                "--actor", "alice", "--json", *_argv(settings)]) == 0
    ev = _events(settings)[-1]
    assert (ev["kind"], ev["actor"], ev["reason"]) == ("cap_changed", "alice", "review 2026-Q3 approved")
    assert ev["old"]["epsilon"] == 1.0 and ev["new"]["epsilon"] == 4.0
    with Gateway.open(settings) as gw:
        page = gw.dataset("shop")
        assert page["cap"]["epsilon"] == 4.0 and page["policy_drift"]["drifted"] is False
    # applying again records nothing
    assert cli(["caps", "apply", "--reason", "again", *_argv(settings)]) == 0
    assert len(_events(settings)) == 3


def test_lowering_a_cap_below_the_spend_says_so(settings):
    with Gateway.open(settings) as gw:
        for i in range(3):
            gw.query("shop", f"SELECT COUNT(*) FROM orders WHERE amount > {i}", consumer="analysts",
                     budget=QueryBudget(rho=0.02))
        out = gw.set_cap("shoppers", epsilon=0.1, delta=DELTA, actor="root", reason="incident")
        # ρ_cap of (0.1, 1e-6) is far below the 0.06 spent
        assert out["exhausted"] is True
        assert out["spent"]["rho"] == pytest.approx(0.06)
        assert out["over_by"]["rho"] == pytest.approx(0.06 - out["new"]["rho_cap"])
        # ε at δ − selection_delta: the default reserve δ/2 for partition selection (issue 11)
        eps_spent = oracle_epsilon(0.06, DELTA / 2)  # the ledger's one conversion (dp-accounting)
        assert out["over_by"]["epsilon"] == pytest.approx(eps_spent - 0.1)
        assert "below what was already spent" in out["message"]
        up = gw.set_cap("shoppers", epsilon=4.0, delta=DELTA, actor="root", reason="restored")
        assert up["exhausted"] is False and up["over_by"] is None


def test_releases_report_the_cap_the_ledger_enforced(settings):
    with Gateway.open(settings) as gw:
        gw.set_cap("shoppers", epsilon=2.0, delta=DELTA, actor="root", reason="tighter")
        rel = gw.query("shop", "SELECT region, COUNT(*) FROM orders GROUP BY region", consumer="analysts",
                       budget=QueryBudget(rho=0.01))
        cap = rel["guarantee"]["cap"]
        assert cap["epsilon"] == 2.0 and cap["delta"] == DELTA  # the policy file says 4.0
        assert cap["rho"] == gw.ledger.cap("shoppers").rho_cap
        assert rel["charge"]["delta"] == DELTA / 2  # ρ's δ: δ − selection_delta (default δ/2, issue 11)


def test_http_cap_change_survives_an_app_restart(settings):
    store = KeyStore(settings.resolved_keys_file())
    admin = store.add("root", role="admin")[0]
    dashboard = store.add("wall", role="dashboard")[0]
    with LiveServer(create_app(settings)) as server, server.client(admin) as client:
        r = client.post("/v1/admin/populations/shoppers/cap",
                        json={"epsilon": 0.5, "delta": DELTA, "reason": "incident"})
        assert r.status_code == 200, r.text
        assert r.json()["exhausted"] is False
    with LiveServer(create_app(settings)) as server, server.client(dashboard) as client:  # a deploy
        page = client.get("/v1/datasets/shop").json()
        assert page["cap"]["epsilon"] == 0.5
        assert page["policy_drift"]["drifted"] is True
        assert page["policy_drift"]["policy"]["cap"]["epsilon"] == 4.0


def test_the_drift_warning_is_said_once_per_change(settings, tmp_path, caplog, capsys):
    with Gateway.open(settings) as gw:  # creates the population from the file (ε 4), then lowers the cap
        gw.set_cap("shoppers", epsilon=0.5, delta=DELTA, actor="root", reason="incident 8")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "caps apply" in r.getMessage()]

    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="dpgate"):
        Gateway.open(settings).close()
        Gateway.open(settings).close()
        assert len(warnings()) == 1  # the first start after the change says it, the second does not
        assert cli(["budget", "shop", *_argv(settings)]) == 0
        assert "warning" not in capsys.readouterr().out
        write_project(tmp_path / "project", epsilon=6.0)  # another change of the file: said again
        Gateway.open(settings).close()
        assert len(warnings()) == 2 and "epsilon = 6" in warnings()[-1]
    # a fresh state folder (another machine) says it once too, in `dpgate budget`
    other = Settings(policies=settings.policies, home=tmp_path / "other-state",
                     ledger_url=settings.resolved_ledger_url())
    assert cli(["budget", "shop", "--policies", str(other.policies), "--home", str(other.home),
                "--ledger-url", other.ledger_url]) == 0
    assert "warning" in capsys.readouterr().out
    assert cli(["budget", "shop", "--policies", str(other.policies), "--home", str(other.home),
                "--ledger-url", other.ledger_url]) == 0
    assert "warning" not in capsys.readouterr().out
