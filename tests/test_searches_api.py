"""The search and selection endpoints over real HTTP (issue 15): real app, SQLite ledger."""

from __future__ import annotations

import pytest
from _api_server import LiveServer, assert_error

from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.settings import Settings
from tests._eval_project import write_eval_project

BEST = "SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC LIMIT 1"


@pytest.fixture()
def setup(tmp_path):
    settings = Settings(policies=write_eval_project(tmp_path, epsilon=8.0), home=tmp_path / "state")
    store = KeyStore(settings.resolved_keys_file())
    keys = {
        "analyst": store.add("alice", role="analyst", consumer="analysts")[0],
        "ml": store.add("ml-analyst", role="analyst", consumer="training")[0],  # the search's own consumer
        "service": store.add("trainer", role="service", consumer="training")[0],
        "dashboard": store.add("wall", role="dashboard")[0],
        "admin": store.add("root", role="admin")[0],
    }
    with LiveServer(create_app(settings)) as live:
        yield live, keys


def test_a_search_through_the_api(setup):
    live, keys = setup
    body = {"purpose": "pick a fine-tune", "candidates": [{"name": "a"}, {"name": "c", "config": {"lr": 0.001}}],
            "training": {"name": "ft", "population": "eval-users"},
            "validation": {"name": "evals/eval", "population": "eval-users"}, "selection": "private"}
    with live.client(keys["service"]) as svc, live.client(keys["ml"]) as analyst, \
            live.client(keys["dashboard"]) as dash:
        r = svc.post("/v1/searches", json=body)
        assert r.status_code == 201, r.text
        sid = r.json()["search_id"]
        assert r.json()["consumer"] == "training"
        r = svc.post("/v1/ledger/charges", json={"population": "eval-users", "kind": "zcdp", "rho": 0.05,
                                                 "purpose": "fine-tune a", "search_id": sid, "candidate": "a",
                                                 "outcome": "failed"})
        assert r.status_code == 201, r.text
        assert r.json()["search_step"] == 1
        r = analyst.post("/v1/queries/explain", json={"dataset": "evals", "sql": BEST, "budget": {"epsilon": 1.0}})
        assert r.status_code == 200, r.text
        assert r.json()["cost"]["rho"] == pytest.approx(1.0 / 8)  # ε²/8, bounded range
        r = analyst.post("/v1/queries", json={"dataset": "evals", "sql": BEST, "budget": {"epsilon": 1.0},
                                              "search_id": sid})
        assert r.status_code == 200, r.text
        rel = r.json()
        assert rel["selection"]["scores_released"] is False and rel["accuracy"] == {}
        r = analyst.get(f"/v1/searches/{sid}")
        assert r.status_code == 200 and r.json()["replay"]["ok"] and len(r.json()["steps"]) == 2
        assert_error(dash.get(f"/v1/searches/{sid}"), 403, "forbidden")
        assert_error(svc.post("/v1/searches", json={**body, "stopping": "data-dependent"}), 400, "invalid_request")
        assert_error(svc.post("/v1/searches", json={**body, "scores": [0.9]}), 400, "invalid_request")
        assert_error(analyst.get("/v1/searches/srch_missing"), 404, "not_found")
        selected = rel["rows"][0][0]
        close = {"selected": selected, "artifacts": ["s3://m"], "selection_release": rel["release_id"]}
        if selected in ("a", "c"):
            r = svc.post(f"/v1/searches/{sid}/close", json=close)
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "closed"
            assert_error(svc.post(f"/v1/searches/{sid}/close", json=close), 409, "conflict")
        r = svc.get("/v1/searches")
        assert r.status_code == 200 and [s["search_id"] for s in r.json()["searches"]] == [sid]


def test_a_selection_without_public_candidates_is_refused_over_http(setup):
    live, keys = setup
    with live.client(keys["analyst"]) as analyst:
        r = analyst.post("/v1/queries", json={"dataset": "evals",
                                              "sql": "SELECT split FROM eval GROUP BY split ORDER BY COUNT(*) DESC LIMIT 1"})
        assert_error(r, 400, "unsupported_query")
        assert r.json()["error"]["details"]["reason"] == "no_public_candidates"
        r = analyst.get("/v1/datasets/evals/budget")
        assert r.json()["spent"]["rho"] == 0
