"""The web pages over real HTTP, as a browser without JavaScript uses them (httpx keeps the cookies).

One server (``create_app`` under uvicorn on 127.0.0.1) for the module, on a
project with the ``usage`` sample dataset and the ``hostile`` dataset whose
public keys carry markup (``_ui_support``). Covered here: sign-in and the
session cookie, CSRF and cross-site refusals, the role matrix (the API's
permissions), escaping of hostile names, SQL and reasons, explain-before-run,
the admin's cap change and ledger browser with its export, ``/`` and
``/docs`` without a CDN, HTML error pages, and page weight. The same flows in
a real browser: ``test_ui_browser.py``.
"""

from __future__ import annotations

import csv
import html
import io
import json
import re

import httpx
import pytest
from markupsafe import escape
from _api_server import LiveServer
from _ui_support import (
    XSS_REASON,
    XSS_SCRIPT,
    XSS_SQL,
    csrf_token,
    make_keys,
    make_ui_project,
    sign_in,
)

from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.service import QueryBudget
from dpgate.settings import Settings

#: Every page and the roles that may see it (the API's role table, auth.ROLE_PERMISSIONS).
PAGES = {
    "/ui/admin": {"admin"},
    "/ui/admin/ledger": {"admin"},
    "/ui/admin/ledger?show=events": {"admin"},
    "/ui/admin/ledger/export?format=csv": {"admin"},
    "/ui/dashboard": {"admin", "analyst", "dashboard"},
    "/ui/dashboard/usage": {"admin", "analyst", "dashboard"},
    "/ui/console": {"admin", "analyst"},
    "/ui/datasets": {"admin", "analyst", "dashboard", "service"},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_ui_project(tmp_path_factory.mktemp("ui-project"))


@pytest.fixture(scope="module")
def settings(project):
    return Settings(policies=project / "policies", home=project / "state")


@pytest.fixture(scope="module")
def keys(settings):
    return make_keys(settings.resolved_keys_file())


@pytest.fixture(scope="module")
def server(settings, keys):
    app = create_app(settings)
    with LiveServer(app) as live:
        gw = app.state.gateway
        # what the demo does: a dashboard refresh, two analyst queries; and one on the hostile dataset
        gw.query("usage", "SELECT region, COUNT(DISTINCT user_id) AS users FROM prompts WHERE week = 7 GROUP BY region",
                 consumer="dashboard", budget=QueryBudget(rho=0.003))
        gw.query("usage", "SELECT week, SUM(tokens) AS tokens FROM prompts WHERE week < 4 GROUP BY week",
                 consumer="analysts", budget=QueryBudget(epsilon=0.5))
        gw.query("hostile", XSS_SQL, consumer="dashboard", budget=QueryBudget(rho=0.01))
        live.app_state = app.state
        yield live


@pytest.fixture
def client(server, keys):
    """A signed-in client factory: ``client("admin")``."""
    made: list[httpx.Client] = []

    def make(role: str, **options) -> httpx.Client:
        c = sign_in(server.url, keys[role], **options)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def _inert(text: str) -> None:
    """No hostile payload appears as markup (only escaped)."""
    for payload in ("<script>window.__xss", "<img src=x onerror", "<b onmouseover"):
        assert payload not in text, f"unescaped markup {payload!r} on the page"


# --------------------------------------------------------------------------- sign-in


def test_sign_in_sets_a_strict_http_only_session_cookie(server, keys):
    with httpx.Client(base_url=server.url) as c:
        form = c.get("/ui/login")
        assert form.status_code == 200
        assert 'type="password"' in form.text and 'method="post"' in form.text
        pre = c.cookies.get("dpgate_session")
        r = c.post("/ui/login", data={"csrf_token": csrf_token(form.text), "api_key": keys["analyst"], "next": ""})
        assert r.status_code == 303 and r.headers["location"] == "/ui/console"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert "Secure" not in cookie  # plain HTTP here; see the TLS test below
        assert keys["analyst"] not in cookie and keys["analyst"] not in r.headers["location"]
        post = c.cookies.get("dpgate_session")
        assert post != pre  # a fresh session id at sign-in (no fixation)
        assert c.get("/ui/console").status_code == 200
    # the pre-sign-in id does not carry the signed-in session
    with httpx.Client(base_url=server.url, cookies={"dpgate_session": pre}) as c:
        r = c.get("/ui/console")
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")


def test_cookie_is_secure_over_tls(server, keys):
    # uvicorn trusts X-Forwarded-Proto from 127.0.0.1 (a TLS-terminating proxy in front)
    with httpx.Client(base_url=server.url, headers={"X-Forwarded-Proto": "https"}) as c:
        form = c.get("/ui/login")
        assert "Secure" in form.headers["set-cookie"]
        token = csrf_token(form.text)
        r = c.post("/ui/login", data={"csrf_token": token, "api_key": keys["admin"], "next": ""},
                   headers={"Cookie": f"dpgate_session={form.cookies['dpgate_session']}"})
        assert r.status_code == 303, r.text
        assert "Secure" in r.headers["set-cookie"] and "HttpOnly" in r.headers["set-cookie"]


def test_a_wrong_key_is_refused_without_saying_why(server):
    with httpx.Client(base_url=server.url) as c:
        form = c.get("/ui/login")
        r = c.post("/ui/login", data={"csrf_token": csrf_token(form.text), "api_key": "dpg_000000000000_" + "x" * 43})
        assert r.status_code == 401 and "invalid API key" in r.text
        assert c.get("/ui/admin").status_code == 303


def test_a_key_in_the_url_does_nothing(server, keys):
    with httpx.Client(base_url=server.url) as c:
        r = c.get("/ui/login", params={"api_key": keys["admin"]})
        assert r.status_code == 200 and keys["admin"] not in r.text
        assert c.get("/ui/admin").status_code == 303  # still not signed in


def test_sign_out_ends_the_session(server, client):
    c = client("dashboard")
    sid = c.cookies.get("dpgate_session")
    page = c.get("/ui/dashboard")
    r = c.post("/ui/logout", data={"csrf_token": csrf_token(page.text)})
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
    with httpx.Client(base_url=server.url, cookies={"dpgate_session": sid}) as old:
        assert old.get("/ui/dashboard").status_code == 303


def test_a_revoked_key_ends_its_sessions(server, settings, client):
    store = KeyStore(settings.resolved_keys_file())
    key, _ = store.add("temp-viewer", role="dashboard")
    c = sign_in(server.url, key)
    assert c.get("/ui/dashboard").status_code == 200
    store.revoke("temp-viewer")
    r = c.get("/ui/dashboard")
    assert r.status_code == 303 and "reason=revoked" in r.headers["location"]
    c.close()


def test_next_goes_only_to_local_ui_pages(server, keys):
    with httpx.Client(base_url=server.url) as c:
        r = c.get("/ui/admin/ledger?show=events")
        assert r.status_code == 303
        assert r.headers["location"] == "/ui/login?next=%2Fui%2Fadmin%2Fledger%3Fshow%3Devents"
        form = c.get(r.headers["location"])
        r = c.post("/ui/login", data={"csrf_token": csrf_token(form.text), "api_key": keys["admin"],
                                      "next": "/ui/admin/ledger?show=events"})
        assert r.headers["location"] == "/ui/admin/ledger?show=events"
    for evil in ("https://evil.example/", "//evil.example/ui", "/ui/../../evil", "/\\evil", "javascript:alert(1)"):
        with httpx.Client(base_url=server.url) as c:
            form = c.get("/ui/login")
            r = c.post("/ui/login", data={"csrf_token": csrf_token(form.text), "api_key": keys["admin"], "next": evil})
            assert r.headers["location"] == "/ui/admin", evil


# --------------------------------------------------------------------------- CSRF and cross-site


def test_forms_without_the_session_token_are_refused(server, client):
    c = client("admin")
    page = c.get("/ui/admin")
    token = csrf_token(page.text)
    cap = {"epsilon": "4", "delta": "1e-6", "reason": "csrf test"}
    for data in ({**cap}, {**cap, "csrf_token": ""}, {**cap, "csrf_token": token[:-2] + "xx"}):
        r = c.post("/ui/admin/populations/product-users/cap", data=data)
        assert r.status_code == 403 and "CSRF" in r.text, data
    # another session's token does not work here
    other = client("admin")
    other_token = csrf_token(other.get("/ui/admin").text)
    r = c.post("/ui/admin/populations/product-users/cap", data={**cap, "csrf_token": other_token})
    assert r.status_code == 403
    # a JSON body carries no form token
    r = c.post("/ui/admin/verify", json={"csrf_token": token})
    assert r.status_code == 403
    # nothing was recorded
    events = c.get("/ui/admin/ledger?show=events").text
    assert "csrf test" not in events
    # with the token it works
    assert c.post("/ui/admin/verify", data={"csrf_token": token}).status_code == 200


def test_cross_site_posts_are_refused_even_with_the_token(server, client):
    c = client("admin")
    token = csrf_token(c.get("/ui/admin").text)
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "https://evil.example"}, {"Origin": "null"}):
        r = c.post("/ui/admin/verify", data={"csrf_token": token}, headers=headers)
        assert r.status_code == 403, headers
    host = server.url.removeprefix("http://")
    ok = c.post("/ui/admin/verify", data={"csrf_token": token},
                headers={"Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"})
    assert ok.status_code == 200


def test_sign_in_needs_the_pre_session_token(server, keys):
    with httpx.Client(base_url=server.url) as c:  # login CSRF: no pre-session, or a wrong token
        r = c.post("/ui/login", data={"api_key": keys["admin"], "csrf_token": "x"})
        assert r.status_code == 403
        c.get("/ui/login")
        r = c.post("/ui/login", data={"api_key": keys["admin"], "csrf_token": "x"})
        assert r.status_code == 403
        assert c.get("/ui/admin").status_code == 303


# --------------------------------------------------------------------------- roles


@pytest.mark.parametrize("role", ["admin", "analyst", "dashboard", "service"])
def test_each_role_sees_exactly_its_pages(client, role):
    c = client(role)
    for path, allowed in PAGES.items():
        r = c.get(path)
        if role in allowed:
            assert r.status_code == 200, (role, path, r.text[:300])
        else:
            assert r.status_code == 403, (role, path)
            assert r.headers["content-type"].startswith("text/html")
            assert "403" in r.text and "forbidden" in r.text
    home = c.get("/ui/")
    assert home.status_code == 303
    assert home.headers["location"] == {"admin": "/ui/admin", "analyst": "/ui/console",
                                        "dashboard": "/ui/dashboard", "service": "/ui/datasets"}[role]


def test_cross_role_posts_are_refused(client):
    dash = client("dashboard")
    token = csrf_token(dash.get("/ui/dashboard").text)
    r = dash.post("/ui/admin/populations/product-users/cap",
                  data={"csrf_token": token, "epsilon": "9", "delta": "1e-6", "reason": "not mine"})
    assert r.status_code == 403
    r = dash.post("/ui/console", data={"csrf_token": token, "dataset": "usage", "sql": "SELECT COUNT(*) FROM prompts",
                                       "action": "run"})
    assert r.status_code == 403
    analyst = client("analyst")
    token = csrf_token(analyst.get("/ui/console").text)
    r = analyst.post("/ui/admin/populations/product-users/cap",
                     data={"csrf_token": token, "epsilon": "9", "delta": "1e-6", "reason": "not mine"})
    assert r.status_code == 403
    assert analyst.post("/ui/admin/verify", data={"csrf_token": token}).status_code == 403
    admin = client("admin")  # admins govern budgets; they do not spend them
    token = csrf_token(admin.get("/ui/console").text)
    form = {"csrf_token": token, "dataset": "usage", "sql": "SELECT COUNT(*) AS n FROM prompts",
            "budget_kind": "default", "mechanism": "default", "dialect": "duckdb"}
    assert admin.post("/ui/console", data={**form, "action": "explain"}).status_code == 200
    assert admin.post("/ui/console", data={**form, "action": "run"}).status_code == 403
    assert "not mine" not in admin.get("/ui/admin/ledger?show=events").text


def test_pages_without_a_session_go_to_sign_in_and_posts_get_401(server):
    with httpx.Client(base_url=server.url) as c:
        for path in PAGES:
            r = c.get(path)
            assert r.status_code == 303 and r.headers["location"].startswith("/ui/login"), path
        r = c.post("/ui/admin/verify", data={"csrf_token": "x"})
        assert r.status_code in (401, 403)


# --------------------------------------------------------------------------- XSS


def test_hostile_keys_sql_and_aliases_are_escaped_everywhere(client):
    analyst = client("analyst")
    page = analyst.get("/ui/console?dataset=hostile")
    form = {"csrf_token": csrf_token(page.text), "dataset": "hostile", "sql": XSS_SQL,
            "budget_kind": "rho", "budget_value": "0.02", "mechanism": "default", "dialect": "duckdb"}
    explained = analyst.post("/ui/console", data={**form, "action": "explain"})
    assert explained.status_code == 200
    ran = analyst.post("/ui/console", data={**form, "action": "run"})
    assert ran.status_code == 200, ran.text
    for text in (page.text, explained.text, ran.text):
        _inert(text)
    assert str(escape(XSS_SCRIPT)) in ran.text  # shown, as text
    rid = re.search(r"/ui/releases/(rel_[0-9a-f]+)", ran.text).group(1)
    dash = client("dashboard")
    for path in (f"/ui/releases/{rid}", "/ui/dashboard/hostile", "/ui/datasets"):
        r = dash.get(path)
        assert r.status_code == 200
        _inert(r.text)
        assert "&lt;script&gt;window.__xss" in r.text or "&lt;img src=x" in r.text, path
    admin = client("admin")
    for path in ("/ui/admin/ledger", "/ui/admin"):
        _inert(admin.get(path).text)


def test_a_hostile_cap_reason_is_recorded_and_shown_as_text(client):
    admin = client("admin")
    token = csrf_token(admin.get("/ui/admin").text)
    r = admin.post("/ui/admin/populations/hostile-pop/cap",
                   data={"csrf_token": token, "epsilon": "1.9", "delta": "1e-6", "reason": XSS_REASON},
                   follow_redirects=True)
    assert r.status_code == 200
    _inert(r.text)
    assert str(escape(XSS_REASON)).split("&lt;b")[0] in r.text  # the flash and the events table
    events = admin.get("/ui/admin/ledger?show=events&population=hostile-pop")
    _inert(events.text)
    assert "quarterly" in events.text


def test_hostile_paths_and_parameters_come_back_escaped(client):
    c = client("admin")
    for path in ("/ui/dashboard/%3Cscript%3Ealert(1)%3C%2Fscript%3E", "/ui/releases/%3Cimg%20src%3Dx%3E",
                 "/ui/%3Cscript%3Ex%3C%2Fscript%3E"):
        r = c.get(path)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert "<script>alert" not in r.text and "<img src=x>" not in r.text
    r = c.get("/ui/admin/ledger", params={"consumer": "<script>x</script>"})
    assert r.status_code == 400 and "<script>x" not in r.text


# --------------------------------------------------------------------------- admin


def test_cap_change_needs_a_reason_and_records_an_event(client):
    admin = client("admin")
    token = csrf_token(admin.get("/ui/admin").text)
    url = "/ui/admin/populations/product-users/cap"
    for bad in ({"epsilon": "3", "delta": "1e-6", "reason": "   "}, {"epsilon": "nan", "delta": "1e-6", "reason": "x"},
                {"epsilon": "-1", "delta": "1e-6", "reason": "x"}, {"epsilon": "3", "delta": "1", "reason": "x"},
                {"epsilon": "inf", "delta": "1e-6", "reason": "x"}):
        r = admin.post(url, data={"csrf_token": token, **bad})
        assert r.status_code == 400, bad
        assert 'role="alert"' in r.text
    r = admin.post(url, data={"csrf_token": token, "epsilon": "3.5", "delta": "1e-6", "reason": "annual review"})
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/admin#pop-")
    page = admin.get("/ui/admin")
    assert "Cap of product-users changed" in page.text and "annual review" in page.text
    assert "Remaining now" in page.text
    assert page.text.count("Cap of product-users changed") == 1
    assert "Cap of product-users changed" not in admin.get("/ui/admin").text  # shown once
    events = admin.get("/ui/admin/ledger", params={"show": "events", "population": "product-users"}).text
    assert "annual review" in events and "cap_changed" in events
    r = admin.post("/ui/admin/populations/nobody/cap",
                   data={"csrf_token": token, "epsilon": "1", "delta": "1e-6", "reason": "x"})
    assert r.status_code == 404


def test_admin_page_shows_spend_allocations_and_the_burn_down(client):
    page = client("admin").get("/ui/admin").text
    assert "Population product-users" in page and "Population hostile-pop" in page
    assert "user_id" in page  # the privacy unit
    for consumer in ("analysts", "dashboard"):
        assert f'<th scope="row">{consumer}</th>' in page
    assert page.count('class="chart"') >= 2  # one burn-down per population
    assert "Budget burn-down of population product-users" in page
    assert 'stroke="#B00020"' in page  # the cap line
    zoomed = client("admin").get("/ui/admin?zoom=true").text
    assert "Scale to the cap" in zoomed


def test_ledger_browser_filters_and_pages(client, server):
    gw = server.app_state.gateway
    for i in range(7):
        gw.query("usage", f"SELECT COUNT(*) AS n FROM prompts WHERE week = {10 + i}", consumer="analysts",
                 budget=QueryBudget(rho=0.0002))
    admin = client("admin")
    first = admin.get("/ui/admin/ledger", params={"consumer": "analysts", "limit": 3})
    assert first.status_code == 200
    seqs = [int(s) for s in re.findall(r'<tr><td class="num">(\d+)</td>', first.text)]
    assert len(seqs) == 3 and seqs == sorted(seqs, reverse=True)
    older = re.search(r'href="/ui/admin/ledger\?([^"]*before=\d+[^"]*)"', first.text).group(1)
    second = admin.get("/ui/admin/ledger?" + html.unescape(older))
    seqs2 = [int(s) for s in re.findall(r'<tr><td class="num">(\d+)</td>', second.text)]
    assert seqs2 and max(seqs2) < min(seqs)
    assert "dashboard" not in re.sub(r"<(nav|header|form|select).*?</\1>", "", second.text, flags=re.S).split("<tbody>")[1]
    bad = admin.get("/ui/admin/ledger", params={"since": "yesterday"})
    assert bad.status_code == 400 and "ISO-8601" in bad.text


def test_ledger_export_streams_every_matching_entry(client, server):
    admin = client("admin")
    gw = server.app_state.gateway
    expected = [e for e in gw.ledger_entries() if e["population"] == "product-users"]
    r = admin.get("/ui/admin/ledger/export", params={"format": "jsonl", "population": "product-users"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    assert "attachment" in r.headers["content-disposition"]
    rows = [json.loads(line) for line in r.text.splitlines()]
    assert [e["seq"] for e in rows] == [e["seq"] for e in expected]  # oldest first, all of them
    r = admin.get("/ui/admin/ledger/export", params={"format": "csv", "show": "charges"})
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert len(table) == len(gw.ledger_entries())
    # SQL in a purpose cannot become a spreadsheet formula
    assert all(not row["purpose"].startswith(("=", "+", "-", "@")) for row in table)
    events = admin.get("/ui/admin/ledger/export", params={"format": "csv", "show": "events"})
    assert "population_created" in events.text


def test_csv_cells_that_look_like_formulas_are_quoted():
    from dpgate.ui.pages import _csv_cell

    assert _csv_cell("=HYPERLINK(\"x\")") == "'=HYPERLINK(\"x\")"
    assert _csv_cell("@SUM(A1)") == "'@SUM(A1)"
    assert _csv_cell("query on usage") == "query on usage"
    assert _csv_cell(-1.5) == -1.5
    assert _csv_cell({"a": 1}) == '{"a": 1}'


def test_verify_shows_its_result(client):
    admin = client("admin")
    r = admin.post("/ui/admin/verify", data={"csrf_token": csrf_token(admin.get("/ui/admin").text)})
    assert r.status_code == 200 and "The ledger verifies" in r.text


# --------------------------------------------------------------------------- dashboard and console


def test_dashboard_shows_stored_releases_with_error_bars_and_spends_nothing(client, server):
    before = server.app_state.gateway.budget("usage")
    r = client("dashboard").get("/ui/dashboard/usage")
    assert r.status_code == 200
    assert 'class="chart"' in r.text and 'class="err"' in r.text  # charts with 95 % error bars
    assert "<table>" in r.text and "± users" in r.text  # and the same numbers as a table
    after = server.app_state.gateway.budget("usage")
    assert after["spent"] == before["spent"] and after["charges"] == before["charges"]
    rid = re.search(r"/ui/releases/(rel_[0-9a-f]+)", r.text).group(1)
    page = client("dashboard").get(f"/ui/releases/{rid}").text
    for fact in ("Population", "product-users", "Privacy unit", "user_id", "Cap", "Mechanism", "Charge", "Clamp of"):
        assert fact in page, fact
    assert client("dashboard").get("/ui/dashboard/nope").status_code == 404


def test_console_explains_first_then_runs(client, server):
    analyst = client("analyst")
    page = analyst.get("/ui/console")
    sql = "SELECT region, COUNT(*) AS prompts FROM prompts WHERE week = 30 GROUP BY region"
    form = {"csrf_token": csrf_token(page.text), "dataset": "usage", "sql": sql, "budget_kind": "rho",
            "budget_value": "0.002", "mechanism": "default", "dialect": "duckdb"}
    spent0 = server.app_state.gateway.budget("usage")["consumers"]["analysts"]["spent_rho"]
    r = analyst.post("/ui/console", data={**form, "action": "run"})
    assert r.status_code == 400 and "explain this query first" in r.text
    r = analyst.post("/ui/console", data={**form, "action": "explain"})
    assert r.status_code == 200
    assert "Fits what is left" in r.text and "ρ 0.002" in r.text
    assert "± 62" in r.text or "±" in r.text  # expected half-width per cell
    assert server.app_state.gateway.budget("usage")["consumers"]["analysts"]["spent_rho"] == spent0  # free
    r = analyst.post("/ui/console", data={**form, "sql": sql + " ", "action": "run"})  # changed: explain again
    assert r.status_code == 200  # trailing space is stripped: the same request
    r2 = analyst.post("/ui/console", data={**form, "sql": sql.replace("30", "31"), "action": "run"})
    assert r2.status_code == 400 and "explain this query first" in r2.text
    assert "Result" in r.text and "Charged" in r.text and 'class="chart"' in r.text
    spent1 = server.app_state.gateway.budget("usage")["consumers"]["analysts"]["spent_rho"]
    assert spent1 == pytest.approx(spent0 + 0.002)
    again = analyst.post("/ui/console", data={**form, "action": "run"})
    assert "cost 0" in again.text  # served from the release store
    assert "Recent releases paid by analysts" in again.text


def test_console_errors_are_shown_on_the_form(client):
    analyst = client("analyst")
    token = csrf_token(analyst.get("/ui/console").text)
    base = {"csrf_token": token, "dataset": "usage", "budget_kind": "default", "mechanism": "default",
            "dialect": "duckdb", "action": "explain"}
    r = analyst.post("/ui/console", data={**base, "sql": "SELECT * FROM prompts"})
    assert r.status_code == 400 and "unsupported_query" in r.text and "SELECT * FROM prompts" in r.text
    r = analyst.post("/ui/console", data={**base, "sql": "SELECT COUNT(*) FROM prompts", "budget_kind": "rho",
                                          "budget_value": "-1"})
    assert r.status_code == 400 and "invalid_budget" in r.text  # the API's code for a bad budget
    for bad in ("nan", "inf", "x"):
        r = analyst.post("/ui/console", data={**base, "sql": "SELECT COUNT(*) FROM prompts", "budget_kind": "rho",
                                              "budget_value": bad})
        assert r.status_code == 400 and "invalid_budget" in r.text, bad
    r = analyst.post("/ui/console", data={**base, "sql": "SELECT COUNT(*) FROM prompts", "dataset": "<x>"})
    assert r.status_code == 400 and "<x>" not in r.text
    r = analyst.post("/ui/console", data={**base, "sql": "SELECT COUNT(*) FROM prompts", "budget_kind": "rho",
                                          "budget_value": "50", "action": "explain"})
    assert r.status_code == 200 and "Does not fit what is left" in r.text


def test_the_pin_form_needs_the_csrf_token_and_the_curate_permission(client, server):
    gw = server.app_state.gateway
    release_id = gw.releases("usage", limit=1)[0]["release_id"]
    url = "/ui/dashboard/usage/pins"
    wall = client("dashboard")
    r = wall.post(url, data={"release_id": release_id, "action": "pin", "title": "no token"})
    assert r.status_code == 403 and gw.dashboard_pins("usage") == []
    token = csrf_token(wall.get("/ui/dashboard/usage").text)
    r = wall.post(url, data={"csrf_token": token, "release_id": release_id, "action": "pin", "title": XSS_SCRIPT})
    assert r.status_code == 303 and r.headers["location"] == "/ui/dashboard/usage"
    page = wall.get("/ui/dashboard/usage").text
    _inert(page)
    assert str(escape(XSS_SCRIPT)) in page and "<h2>Pinned</h2>" in page  # the title, escaped
    assert [p["title"] for p in gw.dashboard_pins("usage")] == [XSS_SCRIPT]
    for bad in ({"release_id": "", "action": "pin"}, {"release_id": release_id, "action": "drop"},
                {"release_id": release_id, "action": "pin", "title": "x" * 201}):
        assert wall.post(url, data={"csrf_token": token, **bad}).status_code == 400
    analyst = client("analyst")
    a_token = csrf_token(analyst.get("/ui/dashboard/usage").text)
    assert 'class="row pin"' not in analyst.get("/ui/dashboard/usage").text  # no form without the permission
    r = analyst.post(url, data={"csrf_token": a_token, "release_id": release_id, "action": "unpin"})
    assert r.status_code == 403 and gw.dashboard_pins("usage")
    r = wall.post(url, data={"csrf_token": token, "release_id": release_id, "action": "unpin"})
    assert r.status_code == 303 and gw.dashboard_pins("usage") == []


# --------------------------------------------------------------------------- / and /docs


def test_root_sends_browsers_to_the_ui_and_clients_to_an_index(server):
    with httpx.Client(base_url=server.url) as c:
        r = c.get("/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
        assert r.status_code == 303 and r.headers["location"] == "/ui/"
        for accept in ("*/*", "application/json", None):
            r = c.get("/", headers={"Accept": accept} if accept else {})
            assert r.status_code == 200 and r.json()["links"]["docs"] == "/docs", accept
        assert "Accept" in r.headers["vary"]
        r = c.get("/ui")
        assert r.status_code == 307 and r.headers["location"] == "/ui/"


def test_a_trailing_slash_is_a_404_in_the_error_shape_not_a_redirect(server):
    # a trial found POST /v1/queries/ answered 307 with an empty body
    with httpx.Client(base_url=server.url) as c:
        for method, path in (("POST", "/v1/queries/"), ("GET", "/v1/datasets/"), ("GET", "/healthz/")):
            r = c.request(method, path, json={"dataset": "usage", "sql": "SELECT COUNT(*) FROM prompts"})
            assert r.status_code == 404, (method, path)
            assert r.json()["error"]["code"] == "not_found", (method, path)


def test_docs_load_swagger_ui_from_this_server(server):
    with httpx.Client(base_url=server.url) as c:
        r = c.get("/docs")
        assert r.status_code == 200
        assert "http://" not in r.text and "https://" not in r.text  # nothing from a CDN
        for src in re.findall(r'(?:src|href)="(/[^"]+)"', r.text):
            asset = c.get(src)
            assert asset.status_code == 200, src
        assert "SwaggerUIBundle" in c.get("/ui/static/swagger-init.js").text
        bundle = c.get("/docs/static/swagger-ui-bundle.js", headers={"Accept-Encoding": "gzip"})
        assert bundle.headers["content-encoding"] == "gzip" and "SwaggerUIBundle" in bundle.text
        assert int(bundle.headers["content-length"]) < len(bundle.content) / 3  # sent compressed
        plain = c.get("/docs/static/swagger-ui-bundle.js", headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers and plain.content == bundle.content
        assert c.get("/docs/static/../../etc/passwd").status_code == 404
        assert c.get("/docs/static/redoc.standalone.js").status_code == 404  # an allow-list
        assert c.get("/openapi.json").status_code == 200
        assert "/ui" not in json.dumps(c.get("/openapi.json").json()["paths"])  # pages are not API


def test_api_errors_stay_json_and_ui_errors_are_html(server):
    with httpx.Client(base_url=server.url) as c:
        r = c.get("/v1/nope")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = c.get("/ui/nope")
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")


# --------------------------------------------------------------------------- headers and weight


def test_pages_send_a_strict_content_security_policy(client):
    r = client("admin").get("/ui/admin")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp  # no script at all
    assert "frame-ancestors 'none'" in csp
    assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
    assert "<script" not in r.text and " style=" not in r.text  # nothing the policy would block


@pytest.mark.parametrize("role,path", [("admin", "/ui/admin"), ("admin", "/ui/admin/ledger"),
                                       ("dashboard", "/ui/dashboard/usage"), ("analyst", "/ui/console")])
def test_pages_weigh_less_than_300_kb_with_their_assets(client, role, path):
    c = client(role)
    r = c.get(path)
    total = len(r.content)
    for src in set(re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', r.text)):
        total += len(c.get(src).content)
    assert total < 300_000, (path, total)


def test_policy_drift_is_shown_when_the_gateway_reports_it(client, server, monkeypatch):
    gw = server.app_state.gateway
    original = gw.datasets

    def drifted():
        out = original()
        for d in out:
            d["policy_drift"] = {"drifted": d["name"] == "usage",
                                 "differences": ["cap: the policy file states epsilon = 4 <b>"] if d["name"] == "usage" else [],
                                 "message": "the policy file differs from the ledger <i>" if d["name"] == "usage" else ""}
        return out

    monkeypatch.setattr(gw, "datasets", drifted)
    admin = client("admin")
    page = admin.get("/ui/admin").text
    assert "Policy file of dataset usage: the policy file differs from the ledger &lt;i&gt;" in page
    assert "Policy file of dataset hostile" not in page  # drifted: false and no message
    assert "the policy file differs from the ledger &lt;i&gt;" in admin.get("/ui/datasets").text
    monkeypatch.setattr(gw, "datasets", original)
    # back to the gateway's own report: the injected messages are gone (a cap changed by an
    # earlier test of this server is real drift and may be shown, as it should)
    assert "the policy file differs from the ledger &lt;i&gt;" not in admin.get("/ui/admin").text


def test_a_cap_below_the_spend_is_said_so(client, server, monkeypatch):
    gw = server.app_state.gateway
    original = gw.set_cap

    def set_cap(population, **kw):  # the ledger's report of where the population stands (when it gives one)
        out = original(population, **kw)
        return {**out, "exhausted": True, "message": f"the cap of {population!r} is now below what was spent <x>"}

    monkeypatch.setattr(gw, "set_cap", set_cap)
    admin = client("admin")
    token = csrf_token(admin.get("/ui/admin").text)
    r = admin.post("/ui/admin/populations/hostile-pop/cap", follow_redirects=True,
                   data={"csrf_token": token, "epsilon": "0.01", "delta": "1e-6", "reason": "incident"})
    assert 'class="flash warn"' in r.text and "is now below what was spent &lt;x&gt;" in r.text
    monkeypatch.setattr(gw, "set_cap", original)
    admin.post("/ui/admin/populations/hostile-pop/cap",
               data={"csrf_token": token, "epsilon": "2", "delta": "1e-6", "reason": "restore"})


def test_console_accepts_dialect_names_in_any_case(client):
    analyst = client("analyst")
    token = csrf_token(analyst.get("/ui/console").text)
    base = {"csrf_token": token, "dataset": "usage", "budget_kind": "default", "mechanism": "default",
            "action": "explain", "sql": 'SELECT "region", COUNT(*) AS n FROM prompts GROUP BY region'}
    for name in ("Postgres", "PostgreSQL", "DuckDB"):
        r = analyst.post("/ui/console", data={**base, "dialect": name})
        assert r.status_code == 200, (name, r.text[-2000:])
    r = analyst.post("/ui/console", data={**base, "dialect": "Oracle9"})
    assert r.status_code == 400 and "unknown SQL dialect" in r.text
    assert "postgres" in r.text and "tsql" in r.text and "snowflake" in r.text


def test_quantile_release_shows_its_rank_error_not_error_bars(client, server):
    """A MEDIAN release: the release page and the dashboard show the rank error in words
    (``rank_error95``), and the quantile's chart has no error bars; the COUNT next to it keeps its ±."""
    gw = server.app_state.gateway
    r = gw.query("usage", "SELECT region, MEDIAN(tokens) AS med, COUNT(*) AS n FROM prompts GROUP BY region",
                 consumer="dashboard", budget=QueryBudget(rho=0.02))
    rank = r["accuracy"]["med"]["rank_error95"]
    shown = f"{rank:.3g}"
    page = client("dashboard").get(f"/ui/releases/{r['release_id']}").text
    assert "rank error med (95 %)" in page and "± med" not in page and "± n" in page
    assert "ranks</td>" in page and "a DP quantile&#39;s accuracy is a rank error" in page
    assert f"± {shown} of the group" in page
    figures = re.findall(r"<figure>.*?</figure>", page, flags=re.S)
    med = [f for f in figures if "med:" in f or "med (" in f]
    count = [f for f in figures if "n: 95 % error bars" in f]
    assert len(med) == 1 and 'class="err"' not in med[0] and "without error bars" in med[0]
    assert len(count) == 1 and 'class="err"' in count[0]
    dash = client("dashboard").get("/ui/dashboard/usage").text
    card = next(s for s in re.findall(r'<section class="card".*?</section>', dash, flags=re.S) if r["release_id"] in s)
    assert "a DP quantile&#39;s accuracy is a rank error" in card and f"± {shown} of the group" in card
