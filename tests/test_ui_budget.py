"""The admin page's budget panel (issue 23): the renewal rule, spend per cohort, the attack-bound
chart with its numbers, and the bound before and after a proposed cap."""

from __future__ import annotations

import html

import pytest
from _api_server import LiveServer
from _budget_project import write_project
from _ui_support import sign_in

from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.service import QueryBudget
from dpgate.settings import Settings


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui23")
    settings = Settings(policies=write_project(root / "project"), home=root / "state")
    admin = KeyStore(settings.resolved_keys_file()).add("root", role="admin")[0]
    app = create_app(settings)
    with LiveServer(app) as server:
        app.state.gateway.query("club", "SELECT COUNT(*) FROM orders WHERE signup = '2026-01'", consumer="analysts",
                                budget=QueryBudget(rho=0.05))
        client = sign_in(server.url, admin)
        try:
            yield client
        finally:
            client.close()


def test_the_admin_page_shows_the_renewal_rule_cohorts_and_the_attack_bound(live):
    page = live.get("/ui/admin").text
    assert "fixed cap, no renewal" in page  # population plain
    assert "per cohort" in page and "Spend per cohort of signup" in page
    assert "fresh: the whole cap" in page  # 2026-02 and 2026-03 were never charged
    assert "Membership-attack bound" in page and 'id="pop-' in page
    # the cap's bound at FPR 1 %, ε = 4, δ = 1e-6: the (ε, δ) point alone would say e⁴·0.01 = 54.6 %
    assert "not as Gaussian DP" in html.unescape(page)
    assert page.count("largest true-positive rate") >= 2  # a chart per population
    assert "No reset is offered" in page and "after 12 periods" in page


def test_the_cap_form_shows_the_bound_before_and_after(live):
    page = html.unescape(live.get("/ui/admin", params={"preview": "plain", "epsilon": "1", "delta": "1e-6"}).text)
    assert "Before: TPR ≤" in page and "After ε 1" in page
    assert "proposed cap ε 1" in page  # the proposed curve is drawn
    bad = html.unescape(live.get("/ui/admin", params={"preview": "plain", "epsilon": "-1", "delta": "1e-6"}).text)
    assert 'class="error"' in bad and "epsilon" in bad


def test_the_console_runs_a_trial_on_the_proxy_for_free(live):
    import re

    page = live.get("/ui/console", params={"dataset": "shop"}).text
    assert "Trial on the proxy (free)" in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    r = live.post("/ui/console", data={"csrf_token": token, "dataset": "shop", "dialect": "duckdb",
                                       "mechanism": "default", "budget_kind": "rho", "budget_value": "0.02",
                                       "sql": "SELECT region, COUNT(*) AS n FROM orders GROUP BY region",
                                       "action": "trial"})
    assert r.status_code == 200, r.text
    text = html.unescape(r.text)
    assert "Trial on proxy shop_synthetic" in text and "Not a release of the protected data" in text
    assert "42 ±" in text  # the proxy's exact count with the ± of ρ = 0.02
    # the club dataset has no proxy: no trial button
    assert "Trial on the proxy" not in live.get("/ui/console", params={"dataset": "club"}).text
