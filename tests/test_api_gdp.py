"""Gaussian-DP composition end to end over HTTP (issue 22 item 1): a policy file states
``[budget] composition = "gdp"``; the gateway creates the population with it, releases say
which filter admitted them and their μ, explain's ``fits`` agrees with the ledger, the budget
shows the exact GDP ε of the remaining μ, and a top-k selection (no GDP claim) is refused
with nothing charged.

Oracles computed here, independently of :mod:`dpgate.accounting.gdp`: μ_cap and the ε of a μ
from the Dong–Roth–Su closed form δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) solved with
scipy's ``norm`` and ``brentq``.
"""

from __future__ import annotations

import math

import pytest
from _api_server import LiveServer, assert_error
from _budget_project import orders_csv
from scipy.optimize import brentq
from scipy.stats import norm

from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.settings import Settings

EPS, DELTA = 2.0, 1e-6
BY_REGION = "SELECT region, COUNT(*) AS n FROM orders GROUP BY region"
TOP_REGION = "SELECT region FROM orders GROUP BY region ORDER BY COUNT(*) DESC LIMIT 1"

POLICY = """
[dataset]
name = "gshop"
population = "gauss"
data_version = "v1"

[budget]
epsilon = {eps}
delta = {delta}
default_query_rho = 0.01
composition = "gdp"

[allocations]
analysts = 1.0

[tables.orders]
source = "{source}"
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.orders.columns]
signup = {{ type = "text", public_keys = ["2026-01", "2026-02", "2026-03"] }}
region = {{ type = "text", public_keys = ["eu", "us", "apac"] }}
amount = {{ type = "int", lower = 0, upper = 100 }}
"""


def _delta(mu: float, eps: float) -> float:
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


def _oracle_mu_cap(eps: float, delta: float) -> float:
    return brentq(lambda m: _delta(m, eps) - delta, 1e-3, 50.0, xtol=1e-14)


def _oracle_epsilon(mu: float, delta: float) -> float:
    return brentq(lambda e: _delta(mu, e) - delta, 0.0, 100.0, xtol=1e-13)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("apigdp")
    policies = root / "project" / "policies"
    policies.mkdir(parents=True)
    data = orders_csv(root / "project" / "orders.csv")
    (policies / "gshop.toml").write_text(POLICY.format(eps=EPS, delta=DELTA, source=data.as_posix()))
    settings = Settings(policies=policies, home=root / "state")
    store = KeyStore(settings.resolved_keys_file())
    keys = {"analyst": store.add("alice", role="analyst", consumer="analysts")[0]}
    with LiveServer(create_app(settings)) as server:
        yield server, keys


def _budget(c) -> dict:
    r = c.get("/v1/datasets/gshop/budget")
    assert r.status_code == 200, r.text
    return r.json()


def test_gdp_policy_end_to_end(live):
    server, keys = live
    mu_cap = _oracle_mu_cap(EPS, DELTA)  # no selection reserve: a gdp population never selects
    with server.client(keys["analyst"]) as c:
        b = _budget(c)
        assert b["composition"] == "gdp" and b["cap"]["composition"] == "gdp"
        assert b["cap"]["selection_delta"] == 0.0
        assert b["gdp"]["mu_cap"] == pytest.approx(mu_cap, rel=1e-9)
        assert b["remaining"]["epsilon"] == pytest.approx(EPS, rel=1e-7)  # nothing spent: the cap's ε

        # explain: the release's μ² against μ_cap² (not ρ), and it names the filter
        ex = c.post("/v1/queries/explain", json={"dataset": "gshop", "sql": BY_REGION, "budget": {"rho": 0.1}})
        assert ex.status_code == 200, ex.text
        cost = ex.json()["cost"]
        assert cost["filter"] == "gdp" and cost["fits"] is True
        assert cost["remaining_mu"] == pytest.approx(mu_cap, rel=1e-9)

        # query: the release's charge shows the filter and its μ; its ε is μ's exact ε
        r = c.post("/v1/queries", json={"dataset": "gshop", "sql": BY_REGION, "budget": {"rho": 0.1}})
        assert r.status_code == 200, r.text
        charge = r.json()["charge"]
        assert charge["filter"] == "gdp"
        mu1 = charge["gdp_mu"]
        assert mu1 == pytest.approx(cost["requested_mu"], rel=1e-12)
        assert math.sqrt(0.2) < mu1 < math.sqrt(0.2) * 1.01  # discrete Gaussian: just above √(2ρ)
        assert charge["epsilon_at_delta"] == pytest.approx(_oracle_epsilon(mu1, DELTA), rel=1e-6)
        assert cost["epsilon_at_delta"] == pytest.approx(charge["epsilon_at_delta"], rel=1e-12)

        # budget: remaining ε is the exact GDP ε of √(μ_cap² − μ1²), not a Rényi figure
        b = _budget(c)
        left = mu_cap ** 2 - mu1 ** 2
        assert b["remaining"]["mu"] == pytest.approx(math.sqrt(left), rel=1e-9)
        assert b["remaining"]["epsilon"] == pytest.approx(_oracle_epsilon(math.sqrt(left), DELTA), rel=1e-6)
        assert b["spent"]["epsilon"] == pytest.approx(_oracle_epsilon(mu1, DELTA), rel=1e-6)
        assert b["consumers"]["analysts"]["remaining_mu"] == pytest.approx(math.sqrt(left), rel=1e-9)

        # explain's fits agrees with the ledger on both sides of the boundary: ρ = μ²/2 of what is left
        # is too much for the discrete Gaussian (its μ is a little above √(2ρ)); 0.99 of it fits
        for factor, admitted in ((1.0, False), (0.99, True)):
            budget = {"rho": left / 2 * factor}
            ex = c.post("/v1/queries/explain", json={"dataset": "gshop", "sql": BY_REGION, "budget": budget}).json()
            assert ex["cost"]["fits"] is admitted, ex["cost"]["message"]
            r = c.post("/v1/queries", json={"dataset": "gshop", "sql": BY_REGION, "budget": budget})
            if admitted:
                assert r.status_code == 200, r.text
                assert r.json()["charge"]["filter"] == "gdp"
            else:
                details = assert_error(r, 409, "budget_exhausted")
                assert details["rule"] == "gdp"
        charges = _budget(c)["charges"]
        assert charges == 2

        # a top-k selection has no GDP claim: explain says so, the query is refused 4xx, nothing charged
        ex = c.post("/v1/queries/explain", json={"dataset": "gshop", "sql": TOP_REGION, "budget": {"rho": 1e-4}})
        assert ex.status_code == 200, ex.text
        assert ex.json()["kind"] == "selection"
        assert ex.json()["cost"]["fits"] is False and ex.json()["cost"]["refused"] == "invalid_budget"
        details = assert_error(c.post("/v1/queries", json={"dataset": "gshop", "sql": TOP_REGION,
                                                           "budget": {"rho": 1e-4}}), 400, "invalid_budget")
        assert details["rule"] == "gdp_claim"
        assert _budget(c)["charges"] == charges

        # a GROUP BY that would select keys privately: refused, naming the Gaussian-DP filter, nothing charged
        r = c.post("/v1/queries", json={"dataset": "gshop", "sql": "SELECT amount, COUNT(*) AS n FROM orders "
                                                                     "GROUP BY amount"})
        assert r.status_code == 400 and "Gaussian DP" in r.json()["error"]["message"], r.text
        assert _budget(c)["charges"] == charges
