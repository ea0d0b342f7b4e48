"""The web pages in a real headless Chromium, driven by Playwright.

The browser is Debian's ``chromium`` (``/usr/bin/chromium``, or ``DPGATE_CHROMIUM``),
started with the flags this machine needs (no sandbox as root, no background
networking); Playwright never downloads a browser of its own. ``.ci/run``
installs both; locally the module is skipped with the reason when either is
missing. The accessibility audit uses axe-core from the npm registry, installed
by ``.ci/run`` into ``.ci/node`` (or ``DPGATE_AXE_JS``); it is skipped, with the
reason, when absent.

What a person does, in the browser: sign in as each role (once with the
keyboard only); the admin sees the burn-down of the sample population after
the demo's queries and changes a cap with a reason; a dashboard viewer sees a
chart with error bars and gets a 403 page for the admin pages; an analyst
explains, then runs a query and sees its result. Refused: forms without the
CSRF token, requests of the wrong role, and a cross-site form post from another
origin. Hostile strings (public keys, SQL, output names, a cap reason) stay
inert even with the pages' Content-Security-Policy switched off. The pages work
with JavaScript disabled, load nothing from elsewhere, and ``/docs`` renders
offline. Screenshots of the three main pages go to ``DPGATE_SCREENSHOT_DIR``
(default ``.artifacts/screenshots``; the ones in ``docs/`` were made with
``DPGATE_SCREENSHOT_DIR=docs/screenshots``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from _api_server import LiveServer
from _ui_support import XSS_REASON, XSS_SQL, make_keys, make_ui_project

from dpgate.api import create_app
from dpgate.cli.demo import DEMO_QUERIES
from dpgate.service import QueryBudget
from dpgate.settings import Settings

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("DPGATE_CHROMIUM", "/usr/bin/chromium")
#: The flags this machine needs (/work/.library/env/machines/python-svc.md): as root no sandbox, and no
#: background connections (the network is closed: they would be refused, many at a time).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
AXE_JS = Path(os.environ.get("DPGATE_AXE_JS", REPO / ".ci" / "node" / "node_modules" / "axe-core" / "axe.min.js"))
SHOTS = Path(os.environ.get("DPGATE_SCREENSHOT_DIR", REPO / ".artifacts" / "screenshots"))

sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="Playwright for Python is not installed (pip install -e '.[browser]'; .ci/run installs it)")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)", allow_module_level=True)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_ui_project(tmp_path_factory.mktemp("ui-browser"))


@pytest.fixture(scope="module")
def keys(project):
    return make_keys(Settings(policies=project / "policies", home=project / "state").resolved_keys_file())


@pytest.fixture(scope="module")
def server(project, keys):
    settings = Settings(policies=project / "policies", home=project / "state")
    app = create_app(settings)
    with LiveServer(app) as live:
        gw = app.state.gateway
        for consumer, sql, budget in DEMO_QUERIES:  # what `dpgate demo` runs
            gw.query("usage", sql, consumer=consumer, budget=QueryBudget(**budget))
        for week in range(8):  # a refresh job's weekly releases
            gw.query("usage", f"SELECT region, COUNT(DISTINCT user_id) AS users FROM prompts WHERE week = {week} "
                     "GROUP BY region", consumer="dashboard", budget=QueryBudget(rho=0.002))
        gw.query("hostile", XSS_SQL, consumer="dashboard", budget=QueryBudget(rho=0.01))
        live.gateway = gw
        yield live


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def new_page(browser, server):
    """``new_page(**context_options)``: a page in a fresh browser context (its own cookies)."""
    contexts = []

    def make(**options):
        ctx = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=server.url, **options)
        contexts.append(ctx)
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        return page

    yield make
    for ctx in contexts:
        ctx.close()


def sign_in(page, key: str, path: str = "/ui/login"):
    page.goto(path)
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()


def shot(page, name: str, height: int = 1400, start=None) -> None:
    """Save a screenshot as ``SHOTS/name.png``: ``height`` pixels (1280 wide) from the top of the
    page, or from the top of the element ``start`` (a locator)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    full = page.evaluate("document.documentElement.scrollHeight")
    top = 0
    if start is not None:
        top = max(0, int(start.evaluate("e => e.getBoundingClientRect().top + window.scrollY")) - 8)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True,
                    clip={"x": 0, "y": top, "width": 1280, "height": min(full - top, height)})


def xss_guard(page) -> list[str]:
    """Record dialogs (alert/confirm) the page opens: a hostile payload that ran would show up here."""
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    return dialogs


# --------------------------------------------------------------------------- each role


@pytest.mark.parametrize("role,home,heading", [
    ("admin", "/ui/admin", "Privacy budget spend"),
    ("analyst", "/ui/console", "Query console"),
    ("dashboard", "/ui/dashboard", "Dashboards"),
    ("service", "/ui/datasets", "Datasets and their guarantees"),
])
def test_sign_in_as_each_role(new_page, keys, server, role, home, heading):
    page = new_page()
    sign_in(page, keys[role])
    assert urlsplit(page.url).path == home
    assert page.get_by_role("heading", level=1).inner_text() == heading
    assert page.locator(".who").inner_text().startswith(
        {"admin": "root", "analyst": "alice", "dashboard": "wall", "service": "trainer"}[role])
    cookie = next(c for c in page.context.cookies() if c["name"] == "dpgate_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert keys[role] not in page.url
    page.get_by_role("button", name="Sign out").click()
    assert urlsplit(page.url).path == "/ui/login"
    page.goto(home)
    assert urlsplit(page.url).path == "/ui/login"  # the session ended


def test_keyboard_only_sign_in_and_navigation(new_page, keys):
    page = new_page()
    page.goto("/ui/login")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "dpgate"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "api_key"
    page.keyboard.type(keys["admin"])
    page.keyboard.press("Enter")
    page.wait_for_url("**/ui/admin")
    # Tab walks the skip link, the brand, then the navigation links in order
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    seen = []
    for _ in range(4):
        page.keyboard.press("Tab")
        seen.append(page.evaluate("document.activeElement.textContent"))
    assert seen == ["Spend", "Ledger", "Dashboards", "Console"]
    page.keyboard.press("Enter")
    page.wait_for_url("**/ui/console")


# --------------------------------------------------------------------------- admin


def test_admin_sees_the_burn_down_and_changes_a_cap(new_page, keys, server):
    page = new_page()
    sign_in(page, keys["admin"])
    section = page.locator("section", has=page.get_by_role("heading", name="Population product-users"))
    chart = section.locator("svg.chart")
    assert chart.count() == 1 and chart.is_visible()
    assert chart.locator("title").first.text_content() == "Budget burn-down of population product-users"
    assert chart.locator("path[stroke='#B00020']").count() == 1  # the cap line
    box = chart.bounding_box()
    assert box["width"] > 400 and box["height"] > 150
    # the table behind the chart: the demo's charges by consumer
    rows = section.locator("table").nth(1).locator("tbody tr")
    counts = {rows.nth(i).locator("th").inner_text(): int(rows.nth(i).locator("td").first.inner_text())
              for i in range(rows.count())}
    assert counts["analysts"] == 2 and counts["dashboard"] == 1 + 8
    shot(page, "admin", start=section)
    # change the cap, with a reason
    section.get_by_label("ε").fill("3.5")
    section.get_by_label("Reason (recorded in the ledger)").fill("quarterly review: lower the cap")
    section.get_by_role("button", name="Change cap").click()
    page.wait_for_load_state()
    flash = page.locator(".flash.ok")
    assert "Cap of product-users changed from ε 4" in flash.inner_text()
    assert "quarterly review: lower the cap" in flash.inner_text() and "Remaining now" in flash.inner_text()
    events = page.locator("section", has=page.get_by_role("heading", name="Population product-users")) \
        .locator("table").nth(2)
    assert "quarterly review: lower the cap" in events.locator("tbody tr").first.inner_text()
    assert server.gateway.dataset("usage")["cap"]["epsilon"] == 3.5
    # the ledger browser shows the event; verify runs
    page.get_by_role("link", name="Ledger").first.click()
    page.get_by_label("Show").select_option("events")
    page.get_by_role("button", name="Apply").click()
    assert "quarterly review: lower the cap" in page.locator("table").inner_text()
    page.goto("/ui/admin")
    page.get_by_role("button", name="Verify the ledger").click()
    assert "The ledger verifies" in page.locator("main").inner_text()


# --------------------------------------------------------------------------- dashboard


def test_dashboard_viewer_sees_error_bars_and_no_admin_pages(new_page, keys, server):
    page = new_page()
    sign_in(page, keys["dashboard"])
    page.get_by_role("link", name="usage").click()
    page.wait_for_url("**/ui/dashboard/usage")
    chart = page.locator("svg.chart").first
    assert chart.is_visible()
    assert chart.locator("rect").count() == 5  # one bar per region
    assert chart.locator("path.err").count() == 5  # each with its 95 % error bar
    shot(page, "dashboard")
    for path in ("/ui/admin", "/ui/admin/ledger", "/ui/console"):
        response = page.goto(path)
        assert response.status == 403
        assert page.get_by_role("heading", level=1).inner_text() == "403 · Forbidden"
    # a release's own page: its guarantee
    page.goto("/ui/dashboard/usage")
    page.locator("main h2 a").first.click()
    text = page.locator("main").inner_text()
    for fact in ("Population", "product-users", "Privacy unit", "user_id", "Mechanism", "Charge"):
        assert fact in text


# --------------------------------------------------------------------------- console


def test_analyst_explains_then_runs(new_page, keys, server):
    page = new_page()
    sign_in(page, keys["analyst"])
    spent0 = server.gateway.budget("usage")["consumers"]["analysts"]["spent_rho"]
    page.get_by_label("Dataset").select_option("usage")
    page.get_by_label("SQL", exact=True).fill(
        "SELECT week, COUNT(*) AS prompts, AVG(tokens) AS avg_tokens FROM prompts WHERE week < 12 GROUP BY week")
    page.get_by_label("Budget", exact=True).select_option("rho")
    page.get_by_label("Budget value").fill("0.004")
    page.get_by_role("button", name="Explain (free)").click()
    explanation = page.locator("section", has=page.get_by_role("heading", name="Explanation"))
    assert explanation.count() == 1, page.locator("main").inner_text()[:2000]
    assert "Fits what is left" in explanation.inner_text()
    assert "ρ 0.004" in explanation.inner_text()
    assert server.gateway.budget("usage")["consumers"]["analysts"]["spent_rho"] == spent0  # explain is free
    page.get_by_role("button", name="Run (charges your allocation)").click()
    result = page.locator("section", has=page.get_by_role("heading", name="Result"))
    assert "Charged ρ 0.004" in result.inner_text()
    assert result.locator("svg.chart").count() == 2 and result.locator("path.err").count() > 0
    assert result.locator("table tbody tr").count() == 52  # every public week, as a table too
    shot(page, "console")
    assert server.gateway.budget("usage")["consumers"]["analysts"]["spent_rho"] == pytest.approx(spent0 + 0.004)


# --------------------------------------------------------------------------- refused requests


def test_requests_without_the_csrf_token_or_of_the_wrong_role_are_refused(new_page, keys, server):
    admin = new_page()
    sign_in(admin, keys["admin"])
    # the browser's cookies, but no form token
    r = admin.request.post("/ui/admin/populations/product-users/cap",
                           form={"epsilon": "1", "delta": "1e-6", "reason": "no token"})
    assert r.status == 403
    viewer = new_page()
    sign_in(viewer, keys["dashboard"])
    token = viewer.locator("input[name=csrf_token]").first.get_attribute("value")
    r = viewer.request.post("/ui/admin/populations/product-users/cap",
                            form={"csrf_token": token, "epsilon": "1", "delta": "1e-6", "reason": "wrong role"})
    assert r.status == 403
    r = viewer.request.post("/ui/console", form={"csrf_token": token, "dataset": "usage", "action": "run",
                                                 "sql": "SELECT COUNT(*) FROM prompts"})
    assert r.status == 403
    events = [e["reason"] for e in server.gateway.ledger_events("product-users")]
    assert "no token" not in events and "wrong role" not in events


def test_a_cross_site_form_post_is_refused(new_page, keys, server):
    page = new_page()
    sign_in(page, keys["admin"])
    before = server.gateway.dataset("usage")["cap"]
    # another site's page that posts the cap form to the gateway as soon as it loads
    evil = (f'<form id="f" method="post" action="{server.url}/ui/admin/populations/product-users/cap">'
            '<input name="epsilon" value="100"><input name="delta" value="0.5">'
            '<input name="reason" value="cross-site"><input name="csrf_token" value="guess"></form>'
            '<script>document.getElementById("f").submit()</script>')
    page.route("http://evil.example/**", lambda route: route.fulfill(body=evil, content_type="text/html"))
    with page.expect_navigation(url=f"{server.url}/**"):
        page.goto("http://evil.example/attack")
    assert page.locator("main").inner_text().startswith(("401", "403"))
    assert server.gateway.dataset("usage")["cap"] == before


# --------------------------------------------------------------------------- stored XSS


def test_stored_xss_is_inert_even_without_the_csp(new_page, keys, server):
    # bypass_csp: only the escaping protects; a payload that ran would set window.__xss or open a dialog
    analyst = new_page(bypass_csp=True)
    dialogs = xss_guard(analyst)
    sign_in(analyst, keys["analyst"])
    analyst.goto("/ui/console?dataset=hostile")
    analyst.get_by_label("SQL", exact=True).fill(XSS_SQL)
    analyst.get_by_role("button", name="Explain (free)").click()
    analyst.get_by_role("button", name="Run (charges your allocation)").click()
    assert "<script>window.__xss='script'</script>" in analyst.locator("main").inner_text()  # shown as text
    assert analyst.evaluate("window.__xss") is None
    admin = new_page(bypass_csp=True)
    dialogs += xss_guard(admin)
    sign_in(admin, keys["admin"])
    section = admin.locator("section", has=admin.get_by_role("heading", name="Population hostile-pop"))
    section.get_by_label("ε").fill("1.5")
    section.get_by_label("Reason (recorded in the ledger)").fill(XSS_REASON)
    section.get_by_role("button", name="Change cap").click()
    admin.wait_for_load_state()
    assert XSS_REASON.split("<b")[0] in admin.locator(".flash.ok").inner_text()
    for page, paths in ((admin, ["/ui/admin", "/ui/admin/ledger", "/ui/admin/ledger?show=events", "/ui/datasets",
                                 "/ui/dashboard/hostile"]),
                        (analyst, ["/ui/console?dataset=hostile", "/ui/dashboard/hostile"])):
        for path in paths:
            page.goto(path)
            page.mouse.move(10, 10)
            for b in page.locator("main b").all():  # hover anything bold: an onmouseover must not run
                b.hover()
            assert page.evaluate("window.__xss") is None, path
            assert page.locator("main script, main img[src=x]").count() == 0, path
    page = new_page(bypass_csp=True)
    sign_in(page, keys["dashboard"])
    page.goto("/ui/dashboard/hostile")
    page.locator("main h2 a").first.click()
    assert page.evaluate("window.__xss") is None
    assert not dialogs


# --------------------------------------------------------------------------- offline, no JavaScript


def test_pages_work_without_javascript_and_load_nothing_from_elsewhere(new_page, keys, server):
    page = new_page(java_script_enabled=False)
    hosts = set()
    page.on("request", lambda req: hosts.add(urlsplit(req.url).netloc))
    sign_in(page, keys["admin"])
    assert page.locator("svg.chart").count() >= 2  # charts are server-drawn SVG
    page.goto("/ui/admin/ledger")
    page.get_by_role("link", name="JSON lines").count()
    page.goto("/ui/dashboard/usage")
    assert page.locator("path.err").count() > 0
    page.locator("summary").first.click()  # <details> opens without script
    assert page.locator("details table").first.is_visible()
    assert hosts == {urlsplit(server.url).netloc}


def test_docs_render_offline(new_page, server):
    page = new_page()
    hosts = set()
    page.on("request", lambda req: hosts.add(urlsplit(req.url).netloc))
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto("/docs")
    page.wait_for_selector(".opblock", timeout=60_000)
    text = page.locator("#swagger-ui").inner_text()
    assert "/v1/queries" in text and "dpgate" in text
    assert hosts == {urlsplit(server.url).netloc}
    assert not errors
    # a browser at / lands on the UI
    page.goto("/")
    assert urlsplit(page.url).path == "/ui/login"


# --------------------------------------------------------------------------- accessibility


@pytest.mark.parametrize("role,paths", [
    (None, ["/ui/login"]),
    ("admin", ["/ui/admin", "/ui/admin/ledger", "/ui/admin/ledger?show=events"]),
    ("dashboard", ["/ui/dashboard/usage", "/ui/datasets"]),
    ("analyst", ["/ui/console"]),
])
def test_accessibility_audit(new_page, keys, role, paths):
    if not AXE_JS.is_file():
        pytest.skip(f"axe-core not found at {AXE_JS} (npm install --prefix .ci/node axe-core; .ci/run installs it)")
    page = new_page(bypass_csp=True)  # the audit's script is injected into pages that allow none
    if role:
        sign_in(page, keys[role])
    for path in paths:
        page.goto(path)
        if path == "/ui/console":
            page.get_by_role("button", name="Explain (free)").click()
        page.add_script_tag(path=str(AXE_JS))
        result = page.evaluate("""async () => {
            const r = await axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa', 'best-practice']}});
            return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                           nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}));
        }""")
        assert result == [], f"{path}: " + "; ".join(f"{v['id']} ({v['impact']}): {v['help']} at {v['nodes']}"
                                                     for v in result)
        assert re.search(r"\S", page.title())
