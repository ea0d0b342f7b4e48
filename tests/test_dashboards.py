"""Curated dashboards (issue 24, item 7): releases pinned to a dataset's dashboard.

Pins live in the release store (``dashboard_pins``, SQLite and PostgreSQL), are set by the
dashboard and admin roles (``curate_dashboards``) through the gateway, the API and the pages,
and never spend budget. Every backend test runs on SQLite and on PostgreSQL (skipped without
a server).
"""

from __future__ import annotations

import os
import secrets

import httpx
import pytest
from _api_server import LiveServer
from _small_project import write_project

from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.errors import InvalidRequest, NotFound, UnknownDataset
from dpgate.releases import store as store_module
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

PG_SERVER = os.environ.get("DPGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
SQL = "SELECT region, COUNT(*) AS n FROM orders GROUP BY region"


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request, tmp_path):
    policies = write_project(tmp_path / "project")
    if request.param == "sqlite":
        yield Settings(policies=policies, home=tmp_path / "state")
        return
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = psycopg.connect(PG_SERVER, autocommit=True, connect_timeout=3)
    except psycopg.Error:
        pytest.skip("no PostgreSQL server at " + PG_SERVER.split("@")[-1])
    from psycopg import sql

    schema = "dpg_pins_" + secrets.token_hex(6)
    yield Settings(policies=policies, home=tmp_path / "state", ledger_url=f"{PG_SERVER}?schema={schema}")
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    conn.close()


def test_pins_are_stored_per_dashboard_retitled_and_removed(settings):
    with Gateway.open(settings, progress=None) as gw:
        a = gw.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        b = gw.query("shop", "SELECT COUNT(*) AS n FROM orders", consumer="analysts", budget=QueryBudget(rho=0.01))
        spent = gw.budget("shop")["spent"]["rho"]
        assert gw.dashboard_pins("shop") == []
        pin = gw.pin_release("shop", a["release_id"], title="  Orders by region ", actor="wall")
        assert pin["title"] == "Orders by region" and pin["pinned_by"] == "wall" and pin["dashboard"] == "shop"
        gw.pin_release("shop", b["release_id"], title="", actor="root")
        gw.pin_release("shop", a["release_id"], title="Orders per region", actor="wall")  # again: re-titled
        pins = gw.dashboard_pins("shop")
        assert [(p["release_id"], p["title"]) for p in pins] == [(a["release_id"], "Orders per region"),
                                                                  (b["release_id"], "")]
        assert pins[0]["release"]["rows"] == a["rows"]  # the stored release, unchanged
        assert gw.unpin_release("shop", a["release_id"]) is True
        assert gw.unpin_release("shop", a["release_id"]) is False
        assert [p["release_id"] for p in gw.dashboard_pins("shop")] == [b["release_id"]]
        assert gw.budget("shop")["spent"]["rho"] == spent  # curation spends nothing
    with Gateway.open(settings, progress=None) as gw:  # durable: another process sees them
        assert [p["release_id"] for p in gw.dashboard_pins("shop")] == [b["release_id"]]


def test_bad_pins_are_refused_with_clear_errors(settings, monkeypatch):
    with Gateway.open(settings, progress=None) as gw:
        rel = gw.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        with pytest.raises(NotFound):
            gw.pin_release("shop", "rel_nope", title="", actor="wall")
        with pytest.raises(UnknownDataset):
            gw.pin_release("nope", rel["release_id"], title="", actor="wall")
        with pytest.raises(InvalidRequest, match="longer than 200"):
            gw.pin_release("shop", rel["release_id"], title="x" * 201, actor="wall")
        monkeypatch.setattr(store_module, "MAX_PINS", 0)
        with pytest.raises(InvalidRequest, match="already has 0 pins"):
            gw.pin_release("shop", rel["release_id"], title="", actor="wall")
        assert gw.dashboard_pins("shop") == []


def test_a_release_of_another_dataset_cannot_be_pinned(tmp_path):
    policies = write_project(tmp_path / "project")
    other = (policies / "shop.toml").read_text().replace('name = "shop"', 'name = "shop2"')
    (policies / "shop2.toml").write_text(other)
    with Gateway.open(Settings(policies=policies, home=tmp_path / "state"), progress=None) as gw:
        rel = gw.query("shop2", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        with pytest.raises(InvalidRequest, match="of dataset 'shop2', not 'shop'"):
            gw.pin_release("shop", rel["release_id"], title="", actor="wall")


def test_the_api_lets_dashboard_and_admin_keys_pin_and_others_read(tmp_path):
    policies = write_project(tmp_path / "project")
    settings = Settings(policies=policies, home=tmp_path / "state")
    store = KeyStore(settings.resolved_keys_file())
    keys = {"admin": store.add("root", role="admin")[0], "dashboard": store.add("wall", role="dashboard")[0],
            "analyst": store.add("alice", role="analyst", consumer="analysts")[0],
            "service": store.add("svc", role="service", consumer="analysts")[0]}
    app = create_app(settings)
    with LiveServer(app) as live:
        rel = app.state.gateway.query("shop", SQL, consumer="analysts", budget=QueryBudget(rho=0.01))
        url = f"{live.url}/v1/dashboards/shop/pins"

        def call(role, method, path="", **kw):
            return httpx.request(method, url + path, headers={"Authorization": f"Bearer {keys[role]}"}, **kw)

        for role in ("analyst", "service"):
            r = call(role, "PUT", f"/{rel['release_id']}", json={"title": "x"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        r = call("dashboard", "PUT", f"/{rel['release_id']}", json={"title": "Orders by region"})
        assert r.status_code == 200 and r.json()["pinned_by"] == "wall"
        r = call("dashboard", "PUT", f"/{rel['release_id']}", json={"titel": "typo"})
        assert r.status_code == 400
        r = call("analyst", "GET")
        assert r.status_code == 200
        (pin,) = r.json()["pins"]
        assert pin["title"] == "Orders by region" and pin["release"]["release_id"] == rel["release_id"]
        assert call("service", "GET").status_code == 403  # service keys do not read releases
        assert call("admin", "PUT", "/rel_nope", json={}).json()["error"]["code"] == "not_found"
        assert call("admin", "DELETE", f"/{rel['release_id']}").status_code == 200
        r = call("admin", "DELETE", f"/{rel['release_id']}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
