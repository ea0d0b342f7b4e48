"""One conversion, said once (issue 24, item 3): every surface shows the ledger's number for the
same (ε, δ) — the cap rule (α_cap on the ledger's RDP grid, at δ less the δ reserved for partition
selection). Before, the quickstart cap (ε 4, δ 1e-6) read as ε 4, ε 3.88, ρ 0.311 and ρ 0.2947
on different surfaces.

The expected figures are computed independently: dp-accounting's RDP conversion on the grid's
finite orders (``tests/_oracles.py``, ``_api_server.rho_cap_oracle``).
"""

from __future__ import annotations

import json
import re

import pytest
from _api_server import make_project, rho_cap_oracle
from _oracles import ledger_epsilon as oracle_epsilon

from dpgate.cli import main as cli
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

CAP_EPSILON, CAP_DELTA = 4.0, 1e-6  # policies/usage.toml
RHO_DELTA = CAP_DELTA / 2  # the default reserve for partition selection
COUNT = "SELECT region, COUNT(*) AS n FROM prompts WHERE week = {w} GROUP BY region"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("one-conversion"))


@pytest.fixture()
def settings(project, tmp_path):
    return Settings(policies=project / "policies", home=tmp_path / "state")


def test_the_cap_reads_the_same_on_every_surface(settings, capsys):
    rho_cap = rho_cap_oracle(CAP_EPSILON, RHO_DELTA)
    assert rho_cap == pytest.approx(0.294741, abs=1e-6)
    # the calculator's first row is the ledger's ρ for the cap, and back
    assert cli(["accounting", "rho", "--epsilon", "4", "--delta", "1e-6", "--json"]) == 0
    calc = json.loads(capsys.readouterr().out)
    assert calc["rho_cap"]["ledger"] == pytest.approx(rho_cap, rel=1e-9)
    with Gateway.open(settings) as gw:
        cap = gw.dataset("usage")["cap"]
        assert cap["rho"] == pytest.approx(rho_cap, rel=1e-9) and cap["epsilon"] == CAP_EPSILON
        report = gw.budget("usage")
        assert report["cap"]["rho"] == cap["rho"]
        # the burn-down's right-hand axis labels the cap's ρ with the cap's ε (was "ε 3.88": the
        # textbook conversion at the full δ)
        from dpgate.ui.data import BurndownCache

        chart = str(BurndownCache().chart(gw.ledger, "product-users", report, gw.ledger.events("product-users"))["svg"])
        labels = re.findall(r"ε (\d+(?:\.\d+)?)", chart)
        assert "4" in labels and "3.88" not in labels, labels
    assert cli(["accounting", "epsilon", "--rho", repr(rho_cap), "--delta", "1e-6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"]["ledger"] == pytest.approx(CAP_EPSILON, rel=1e-9)


def test_a_requested_epsilon_is_what_the_receipt_and_explain_state(settings):
    with Gateway.open(settings) as gw:
        e = gw.explain("usage", COUNT.format(w=1), budget=QueryBudget(epsilon=0.5), consumer="analysts")
        r = gw.query("usage", COUNT.format(w=1), consumer="analysts", budget=QueryBudget(epsilon=0.5))
        for cost in (e["cost"], r["charge"]):
            # stated at the δ it is charged at (not "the cap's δ" 1e-6), by the ledger's conversion
            assert cost["delta"] == RHO_DELTA
            assert cost["epsilon_at_delta"] == pytest.approx(0.5, rel=1e-9)
        # the ρ is the largest whose conversion is 0.5 (dp-accounting oracle), the same in explain
        assert oracle_epsilon(r["charge"]["rho"], RHO_DELTA) == pytest.approx(0.5, rel=1e-9)
        assert oracle_epsilon(r["charge"]["rho"] * 1.001, RHO_DELTA) > 0.5
        assert e["cost"]["rho"] == pytest.approx(r["charge"]["rho"], rel=1e-12)
        # the spend report states the same conversion of what was spent
        spent = gw.budget("usage")["consumers"]["analysts"]
        assert spent["spent_epsilon"] == pytest.approx(0.5, rel=1e-9)


def test_a_laplace_charge_states_its_own_epsilon_at_delta_zero(settings):
    with Gateway.open(settings) as gw:
        r = gw.query("usage", COUNT.format(w=2), consumer="analysts", budget=QueryBudget(epsilon=0.05),
                     mechanism="laplace")
        assert r["mechanism"] == "discrete_laplace"
        assert r["charge"]["epsilon_at_delta"] == pytest.approx(0.05, rel=1e-12) and r["charge"]["delta"] == 0.0
        e = gw.explain("usage", COUNT.format(w=3), budget=QueryBudget(epsilon=0.05), mechanism="laplace")
        assert e["cost"]["delta"] == 0.0 and e["cost"]["epsilon_at_delta"] == pytest.approx(0.05, rel=1e-12)
        (entry,) = [x for x in gw.ledger_entries() if x["charge_id"] == r["charge"]["charge_id"]]
        assert entry["delta"] == 0.0


def test_every_surface_names_the_rule_and_the_readme_explains_it(settings, capsys):
    from pathlib import Path

    from dpgate.ledger.caps import LEDGER_RULE_DIFFERENCE

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert "### One conversion: the ledger's" in readme
    assert cli(["budget", "usage", "--policies", str(settings.policies), "--home", str(settings.home)]) == 0
    out = capsys.readouterr().out
    assert LEDGER_RULE_DIFFERENCE in out and "One conversion: the ledger's" in out
    assert cli(["accounting", "rho", "--epsilon", "4", "--delta", "1e-6"]) == 0
    assert LEDGER_RULE_DIFFERENCE in capsys.readouterr().out
