"""Problems the fresh-user trial of 2026-12-03 found (each test failed before its fix).

F1 (Laplace quantiles over selected keys: 500 after the charge) is in test_quantile_selection.py,
F2/F3 (private bounds: the default resolution, the paying request repeated) in
test_private_bounds.py, the CLI's one-line internal error in test_cli_newuser.py. Here:

* F7 — ``COUNT(*) / 0`` is NULL on any data: refused before the charge, as ``COUNT(NULL)`` is.
* F8 — a policy's ``[budget] epsilon`` has an upper limit (ε = 1e308 loaded, then overflowed).
* F9 — an unknown consumer is refused by explain and by a query whose release is stored.
* F10 — ``dpgate explain --mechanism laplace`` states the pure-ε cost (it printed "cost 0").
"""

from __future__ import annotations

import pytest
from _api_server import make_project

from dpgate.cli import main
from dpgate.errors import PolicyError, UnknownConsumer, UnsupportedQuery
from dpgate.policy import load_policies
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("trial2"))


@pytest.fixture()
def gw(project, tmp_path):
    with Gateway.open(Settings(policies=project / "policies", home=tmp_path / "state")) as g:
        yield g


def _charges(gw: Gateway) -> int:
    return sum(1 for e in gw.ledger_entries() if e.get("type") == "charge")


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) / 0 FROM prompts",
    "SELECT COUNT(*) // 0.0 AS r FROM prompts",
    "SELECT region, SUM(tokens) % (0) AS r FROM prompts GROUP BY region",
    "SELECT COUNT(*) / -0 FROM prompts",
])
def test_a_division_by_a_literal_zero_is_refused_before_the_charge(gw, sql):
    with pytest.raises(UnsupportedQuery, match="division by zero") as e:
        gw.query("usage", sql, consumer="analysts", budget=QueryBudget(rho=0.001))
    assert e.value.details["reason"] == "division_by_zero"
    assert _charges(gw) == 0


def test_a_division_by_a_nonzero_literal_or_a_released_value_is_answered(gw):
    out = gw.query("usage", "SELECT COUNT(*) / 2 AS half, SUM(tokens) / COUNT(*) AS r FROM prompts",
                   consumer="analysts", budget=QueryBudget(rho=0.001))
    assert out["columns"] == ["half", "r"] and _charges(gw) == 1


@pytest.mark.parametrize("epsilon, ok", [("1e308", False), ("1e13", False), ("1e12", True), ("4.0", True)])
def test_a_policy_cap_epsilon_has_an_upper_limit(project, tmp_path, epsilon, ok):
    text = (project / "policies" / "usage.toml").read_text()
    assert "epsilon = 4.0" in text
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "usage.toml").write_text(text.replace("epsilon = 4.0", f"epsilon = {epsilon}", 1)
                                       .replace('source = "sample_data', f'source = "{project}/sample_data'))
    if ok:
        assert load_policies(folder)["usage"].budget.epsilon == float(epsilon)
    else:
        with pytest.raises(PolicyError, match="epsilon must be > 0 and at most 1e"):
            load_policies(folder)


def test_an_unknown_consumer_is_refused_by_explain_and_by_a_stored_release(gw):
    sql = "SELECT region, COUNT(*) AS n FROM prompts GROUP BY region"
    with pytest.raises(UnknownConsumer, match="no allocation for consumer 'nobody'"):
        gw.explain("usage", sql, consumer="nobody")
    gw.query("usage", sql, consumer="analysts", budget=QueryBudget(rho=0.001))
    assert gw.query("usage", sql, consumer="analysts", budget=QueryBudget(rho=0.001))["cached"]
    with pytest.raises(UnknownConsumer) as e:  # the stored release is not served to a typo either
        gw.query("usage", sql, consumer="nobody", budget=QueryBudget(rho=0.001))
    assert e.value.details["consumers"] == ["analysts", "dashboard"]
    assert gw.explain("usage", sql, consumer="dashboard")["cost"]["fits"] is True
    assert _charges(gw) == 1


def test_explain_states_a_laplace_cost_as_pure_epsilon(project, tmp_path, capsys):
    # --rho 0.002 under Laplace: ε = √(2ρ) = √0.004 = 0.063246 (the request's ρ read as ε²/2)
    code = main(["--policies", str(project / "policies"), "--home", str(tmp_path / "s"), "explain",
                 "--dataset", "usage", "--mechanism", "laplace", "--rho", "0.002", "SELECT COUNT(*) FROM prompts"])
    out = capsys.readouterr().out
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("cost "))
    assert line.split()[1:4] == ["pure", "ε", "0.06325;"], line
