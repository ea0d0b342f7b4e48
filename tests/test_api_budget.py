"""Issue 23 over HTTP: fallback and trial, renewal refused, cap preview, the published guarantee,
DP-SGD charges by parameters, spend per cohort. The error shape is the documented one."""

from __future__ import annotations

import math

import pytest
from _api_server import LiveServer, assert_error
from _budget_project import COHORTS, write_project

from dpgate import accounting
from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.settings import Settings

BY_REGION = "SELECT region, COUNT(*) AS n FROM orders GROUP BY region"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("api23")
    settings = Settings(policies=write_project(root / "project"), home=root / "state")
    store = KeyStore(settings.resolved_keys_file())
    keys = {"analyst": store.add("alice", role="analyst", consumer="analysts")[0],
            "admin": store.add("root", role="admin")[0],
            "service": store.add("trainer", role="service", consumer="analysts")[0]}
    with LiveServer(create_app(settings)) as server:
        yield server, keys


def test_fallback_trial_and_their_validation(live):
    server, keys = live
    with server.client(keys["analyst"]) as c:
        r = c.post("/v1/queries", json={"dataset": "shop", "sql": BY_REGION, "budget": {"rho": 1e6 / 1e6 * 0.2}})
        assert_error(r, 409, "budget_exhausted")
        r = c.post("/v1/queries", json={"dataset": "shop", "sql": BY_REGION, "budget": {"rho": 0.2},
                                        "fallback": "proxy"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["source"] == "proxy" and body["dp"] is False and body["charge"] is None
        assert body["proxy"]["provenance"].startswith("synthetic:")
        assert c.get(f"/v1/releases/{body['release_id']}").status_code == 404
        assert_error(c.post("/v1/queries", json={"dataset": "shop", "sql": BY_REGION, "trial": True}), 400,
                     "invalid_request")
        assert_error(c.post("/v1/queries/explain", json={"dataset": "shop", "sql": BY_REGION, "fallback": "proxy"}),
                     400, "invalid_request")
        assert_error(c.post("/v1/queries", json={"dataset": "shop", "sql": BY_REGION, "fallback": "sometimes"}),
                     400, "invalid_request")
        r = c.post("/v1/queries/explain", json={"dataset": "shop", "sql": BY_REGION, "budget": {"rho": 0.02},
                                                "trial": True})
        assert r.status_code == 200, r.text
        assert r.json()["trial"]["rows"] == [["eu", 42], ["us", 39], ["apac", 39]]
        assert r.json()["trial"]["accuracy"]["n"]["sigma"] == pytest.approx(15.0)


def test_renewal_is_refused_and_the_cap_preview_shows_before_and_after(live):
    server, keys = live
    with server.client(keys["admin"]) as c:
        details = assert_error(c.post("/v1/admin/populations/plain/renew", json={"reason": "new month"}), 409,
                               "renewal_refused")
        assert [a["periods"] for a in details["renewal"]["after"]] == [12, 36]
        cap = c.get("/v1/datasets/shop").json()["cap"]
        twelve = accounting.periods_epsilon(cap["rho"], 12, cap["delta"] - cap["selection_delta"])
        assert details["renewal"]["after"][0]["epsilon"] == pytest.approx(twelve, rel=1e-12)
        details = assert_error(c.post("/v1/admin/populations/members/renew", json={"reason": "new month"}), 409,
                               "renewal_refused")
        assert details["cohort_column"] == "signup"
        assert_error(c.post("/v1/admin/populations/nobody/renew", json={"reason": "x"}), 404, "unknown_population")
        r = c.get("/v1/admin/populations/plain/cap-preview", params={"epsilon": 8, "delta": 1e-6})
        assert r.status_code == 200, r.text
        pv = r.json()
        assert pv["before"]["cap"]["epsilon"] == 4.0 and pv["after"]["cap"]["epsilon"] == 8.0
        # e⁸·0.01 > 1, so the second face binds: 1 − e⁻⁸·(1 − δ − 0.01) = 0.99967 — the point says little
        after = pv["after"]["attack_bound"]
        assert after["dp"]["tpr"] == pytest.approx(1 - math.exp(-8) * (0.99 - 1e-6), rel=1e-12)
        assert after["tightest"]["tpr"] < 0.9 * after["dp"]["tpr"]  # the ρ the ledger enforces says more
    with server.client(keys["analyst"]) as c:
        assert_error(c.post("/v1/admin/populations/plain/renew", json={"reason": "x"}), 403, "forbidden")


def test_the_dataset_document_publishes_renewal_attack_bound_proxy_and_cohorts(live):
    server, keys = live
    with server.client(keys["analyst"]) as c:
        shop = c.get("/v1/datasets/shop").json()
        assert shop["renewal"].startswith("fixed cap, no renewal")
        assert shop["proxy"]["dataset"] == "shop_synthetic" and shop["proxy"]["default_for"] == ["dashboard"]
        bound = shop["attack_bound"]["cap"]
        assert bound["fpr"] == 0.01 and len(bound["fprs"]) == len(bound["dp"]["curve"])
        club = c.get("/v1/datasets/club").json()
        assert club["cohorts"]["column"] == "signup" and set(club["cohorts"]["spend"]) == set(COHORTS)
        budget = c.get("/v1/datasets/club/budget").json()
        assert budget["cohort_column"] == "signup" and budget["cohorts"]["2026-02"]["fresh"] is True


def test_dp_sgd_charges_over_http(live):
    server, keys = live
    with server.client(keys["service"]) as c:
        run = {"q": 0.02, "noise_multiplier": 2.0, "steps": 50, "sampler": "poisson"}
        r = c.post("/v1/ledger/charges", json={"population": "members", "dp_sgd": run, "purpose": "run",
                                                "cohorts": ["2026-03"]})
        assert r.status_code == 201, r.text
        assert r.json()["accountant"] == "gateway" and r.json()["cohorts"] == ["2026-03"]
        assert_error(c.post("/v1/ledger/charges", json={"population": "members", "purpose": "run",
                                                         "dp_sgd": {**run, "sampler": "random"}}), 400,
                     "invalid_request")
        assert_error(c.post("/v1/ledger/charges", json={"population": "members", "purpose": "run", "rho": 0.1,
                                                         "dp_sgd": run}), 400, "invalid_request")
        shuffled = accounting.dp_sgd_rdp(0.02, 2.0, 50, "poisson").tolist()
        body = {"population": "members", "purpose": "undercounted", "curve": ["inf" if v == float("inf") else v
                                                                              for v in shuffled],
                "dp_sgd": {**run, "sampler": "shuffle"}}
        assert_error(c.post("/v1/ledger/charges", json=body), 400, "invalid_budget")
