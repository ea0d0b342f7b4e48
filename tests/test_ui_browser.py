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
offline. Issue 24: the burn-down steps at each of two cap changes, error bars
and axes stop at the declared bounds, every page fits a 390 px viewport with
readable chart text, an explanation names outputs by their aliases and says each
thing once, and a release is pinned to (and unpinned from) a dashboard.
Screenshots (``shot``/``shot_narrow``) go to ``DPGATE_SCREENSHOT_DIR`` (default
``.artifacts/screenshots``); ``docs/screenshots/regenerate.sh`` writes the
README's into ``docs/screenshots`` (never made by hand).
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
    page.locator("main h3 a").first.click()
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
    assert result.locator("table tbody tr").count() == 12  # weeks 0-11 (the WHERE narrows the keys), as a table too
    shot(page, "console")
    assert server.gateway.budget("usage")["consumers"]["analysts"]["spent_rho"] == pytest.approx(spent0 + 0.004)


def test_the_explanation_names_outputs_as_written_and_says_each_thing_once(new_page, keys, server):
    page = new_page()
    sign_in(page, keys["analyst"])
    page.get_by_label("Dataset").select_option("usage")
    page.get_by_label("SQL", exact=True).fill(
        "SELECT region, COUNT(*) AS n_prompts, MEDIAN(tokens) AS med_tokens FROM prompts GROUP BY region")
    page.get_by_label("Budget", exact=True).select_option("rho")
    page.get_by_label("Budget value").fill("0.002")
    page.get_by_role("button", name="Explain (free)").click()
    explanation = page.locator("section", has=page.get_by_role("heading", name="Explanation"))
    expected = explanation.locator("table").first.locator("tbody th")
    assert [expected.nth(i).inner_text() for i in range(expected.count())] == ["region", "n_prompts", "med_tokens"]
    prims = explanation.locator("table").nth(1).locator("tbody tr")
    assert prims.count() == 2  # the count and the quantile (the quantile's row was missing)
    quantile = prims.nth(1).inner_text()
    assert "quantile(tokens, 0.5)" in quantile and "rank scale" in quantile and "ranks" in quantile
    assert "rows" in prims.nth(0).inner_text()  # a sensitivity carries its unit
    text = explanation.inner_text()
    assert "This release costs ρ 0.002; allocation analysts has ρ " in text and " left." in text
    page.get_by_role("button", name="Run (charges your allocation)").click()
    result = page.locator("section", has=page.get_by_role("heading", name="Result"))
    assert result.inner_text().count("a DP quantile's accuracy is a rank error") == 1  # said once


def test_the_burn_down_steps_at_each_of_two_cap_changes(new_page, keys, server):
    page = new_page()
    sign_in(page, keys["admin"])

    def cap_path():
        section = page.locator("section", has=page.get_by_role("heading", name="Population product-users"))
        return section, section.locator("svg.chart path[stroke='#B00020']").get_attribute("d")

    section, before = cap_path()
    changes = [e for e in server.gateway.ledger_events("product-users") if e["kind"] == "cap_changed"]
    assert before.count("V") == len(changes)  # one step per change recorded so far
    for epsilon, reason in (("3.2", "first cut of the quarter"), ("3.0", "second cut of the quarter")):
        section.get_by_label("ε").fill(epsilon)
        section.get_by_label("Reason (recorded in the ledger)").fill(reason)
        section.get_by_role("button", name="Change cap").click()
        page.wait_for_load_state()
        section, _ = cap_path()
    section, after = cap_path()
    assert after.count("V") == before.count("V") + 2  # the cap line steps twice more
    steps = [float(y) for y in re.findall(r"V([\d.]+)", after)]
    assert steps[-2] < steps[-1]  # each cut moves the line down the chart (larger pixel y)
    assert server.gateway.dataset("usage")["cap"]["epsilon"] == 3.0
    events = section.locator("table").nth(2).locator("tbody tr")
    assert events.nth(0).locator("td").nth(4).inner_text().startswith("ε 3, δ 1e-6 (ρ ")  # cap after
    assert events.nth(1).locator("td").nth(4).inner_text().startswith("ε 3.2, δ 1e-6 (ρ ")
    shot(page, "admin-cap-changes", start=section)
    page.goto("/ui/admin/ledger?show=events&population=product-users")
    table = page.locator("main table").inner_text()
    assert "ε 3.2, δ 1e-6 (ρ " in table and "{" not in table  # before/after as numbers, no raw JSON
    assert not re.search(r"\d\.\d{9,}", table)  # no 17-digit floats


def test_error_bars_are_clipped_to_the_declared_bounds(new_page, keys, server):
    # a tiny budget: the AVG's and the count's 95 % intervals reach far past [0, 8000] and below 0
    release = server.gateway.query(
        "usage", "SELECT region, COUNT(*) AS n, AVG(tokens) AS avg_tokens FROM prompts WHERE week = 20 GROUP BY region",
        consumer="dashboard", budget=QueryBudget(rho=0.00002))
    acc = release["accuracy"]
    assert any(v - e < 0 or v + e > 8000 for (_, _, v), e in zip(release["rows"], acc["avg_tokens"]["ci95_rows"]))
    page = new_page()
    sign_in(page, keys["dashboard"])
    page.goto(f"/ui/releases/{release['release_id']}")
    charts = page.locator("svg.chart")
    assert charts.count() == 2
    for i, (lo, hi) in enumerate(((0, None), (0, 8000))):
        chart = charts.nth(i)
        ticks = [t for t in chart.locator("text").all_text_contents() if re.fullmatch(r"−?-?[\d.,]+k?", t)]
        values = [float(t.replace("k", "e3").replace(",", "").replace("−", "-")) for t in ticks]
        assert min(values) >= lo and (hi is None or max(values) <= hi), values  # the axis stops at the bounds
        assert "error bars clipped to" in chart.inner_html()  # said in the chart's legend …
        assert chart.locator("path.err").count() == 5
    captions = page.locator("figcaption").all_inner_texts()
    assert any("clipped to [0, 8,000]" in c for c in captions) and any("clipped to ≥ 0" in c for c in captions)
    svg_box = charts.nth(1).bounding_box()
    for box in (charts.nth(1).locator("path.err").nth(j).bounding_box() for j in range(5)):
        assert box["y"] >= svg_box["y"] and box["y"] + box["height"] <= svg_box["y"] + svg_box["height"]


#: Every page, by role, for the narrow-screen test.
NARROW_PAGES = {
    None: ["/ui/login"],
    "admin": ["/ui/admin", "/ui/admin/ledger", "/ui/admin/ledger?show=events", "/ui/datasets", "/ui/dashboard",
              "/ui/dashboard/usage", "/ui/dashboard/hostile", "/ui/logout", "/ui/no-such-page"],
    "dashboard": ["/ui/dashboard/usage", "RELEASE", "/ui/admin"],
    "analyst": ["/ui/console", "CONSOLE"],
}


def _overflowing(page) -> list[str]:
    """Elements that stick out of the viewport's width (outside a scrolling table or chart box)."""
    return page.evaluate("""() => {
        const w = document.documentElement.clientWidth, out = [];
        for (const e of document.querySelectorAll('body *')) {
            if (e.closest('.scroll, figure, pre, .skip')) continue;  // scroll boxes; the skip link hides off-screen
            const r = e.getBoundingClientRect();
            if (r.width > 0 && (r.right > w + 0.5 || r.left < -0.5)) out.push(e.tagName.toLowerCase() + '.' + e.className);
        }
        return out.slice(0, 10);
    }""")


@pytest.mark.parametrize("role", list(NARROW_PAGES))
def test_every_page_fits_a_390_px_viewport(browser, server, keys, role):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, base_url=server.url, device_scale_factor=1)
    try:
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        if role:
            sign_in(page, keys[role])
        for path in NARROW_PAGES[role]:
            if path == "RELEASE":
                page.goto("/ui/dashboard/usage")
                page.locator("main h3 a").first.click()
                page.wait_for_load_state()
            elif path == "CONSOLE":
                page.goto("/ui/console?dataset=usage")
                page.get_by_label("SQL", exact=True).fill(
                    "SELECT week, COUNT(*) AS prompts, MEDIAN(tokens) AS med FROM prompts WHERE week < 6 GROUP BY week")
                page.get_by_role("button", name="Explain (free)").click()
                assert page.locator("section", has=page.get_by_role("heading", name="Explanation")).count() == 1
                sizes = (page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]"),
                         _overflowing(page))
                assert sizes[0][0] <= sizes[0][1] and not sizes[1], ("explanation", sizes)
                page.get_by_role("button", name="Run (charges your allocation)").click()
                page.wait_for_load_state()
            else:
                page.goto(path)
            where = page.url
            width, client = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
            assert width <= client, f"{where}: the page is {width} px wide in a {client} px viewport"
            assert not _overflowing(page), f"{where}: {_overflowing(page)}"
            # chart text stays readable at 1x: every tick label at least 9 px high on the screen
            small = [t for t in chart_text_sizes(page) if t[1] < 9]
            assert not small, f"{where}: chart text smaller than 9 px: {small[:5]}"
            if path in ("CONSOLE", "/ui/dashboard/usage") and role == "analyst" or path == "RELEASE":
                shot_narrow(page, f"narrow-{'console' if path == 'CONSOLE' else 'release'}")
    finally:
        ctx.close()


def chart_text_sizes(page) -> list[tuple[str, float]]:
    """(text, font size in screen pixels) of every text of every chart on the page: its font size
    in the chart's user units times the chart's scale on the screen (viewBox to displayed width)."""
    return [tuple(x) for x in page.evaluate("""() => [...document.querySelectorAll('svg.chart text')].map(t => {
        const svg = t.closest('svg'), scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
        return [t.textContent, parseFloat(getComputedStyle(t).fontSize) * scale]; })""")]


def shot_narrow(page, name: str, height: int = 1600) -> None:
    """A 390 px wide screenshot of the top of the page (``SHOTS/name.png``)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    full = page.evaluate("document.documentElement.scrollHeight")
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True,
                    clip={"x": 0, "y": 0, "width": 390, "height": min(full, height)})


def test_chart_text_is_readable_at_1x_on_a_desktop(new_page, keys):
    page = new_page(device_scale_factor=1)
    sign_in(page, keys["dashboard"])
    page.goto("/ui/dashboard/usage")
    sizes = chart_text_sizes(page)
    assert sizes and min(s for _, s in sizes) >= 10, min(sizes, key=lambda t: t[1])


def test_pinning_a_release_to_a_dashboard(new_page, keys, server):
    server.gateway.query("usage", "SELECT COUNT(DISTINCT user_id) AS active_users FROM prompts WHERE week = 30",
                         consumer="dashboard", budget=QueryBudget(rho=0.002))
    page = new_page()
    sign_in(page, keys["dashboard"])
    page.goto("/ui/dashboard/usage")
    assert page.get_by_role("heading", name="Pinned").count() == 0
    # the newest card: a single value, shown as a number card (not a one-bar chart)
    card = page.locator("section.card", has=page.get_by_role("heading", name="active_users, where week = 30"))
    assert card.locator(".number .big").count() == 1 and card.locator("svg.chart").count() == 0
    weekly = page.locator("section.card", has=page.get_by_role("heading", name="users by region, where week = 3"))
    release_id = weekly.locator("input[name=release_id]").get_attribute("value")
    weekly.get_by_label("Title on the dashboard (optional)").fill("Weekly active users <b>by region</b>, week 3")
    weekly.get_by_role("button", name="Pin").click()
    page.wait_for_load_state()
    assert "Pinned" in page.locator(".flash.ok").inner_text()
    pinned = page.locator("h2:text-is('Pinned') + .cards section.card")
    assert pinned.count() == 1
    assert pinned.locator("h3").inner_text() == "Weekly active users <b>by region</b>, week 3"  # escaped text
    assert pinned.locator("input[name=release_id]").get_attribute("value") == release_id
    assert "pinned by wall" in pinned.inner_text()
    assert page.locator("main h3").first.inner_text().startswith("Weekly active users")  # pinned first
    assert server.gateway.dashboard_pins("usage")[0]["release_id"] == release_id
    shot(page, "dashboard-pinned")
    # an analyst sees it pinned but cannot curate (no form; a forged POST is refused)
    analyst = new_page()
    sign_in(analyst, keys["analyst"])
    analyst.goto("/ui/dashboard/usage")
    assert analyst.locator("h2:text-is('Pinned') + .cards h3").inner_text().startswith("Weekly active users")
    assert analyst.locator("form.pin").count() == 0
    token = analyst.locator("input[name=csrf_token]").first.get_attribute("value")
    r = analyst.request.post("/ui/dashboard/usage/pins", form={"csrf_token": token, "release_id": release_id,
                                                              "action": "unpin"})
    assert r.status == 403 and server.gateway.dashboard_pins("usage")
    # unpin
    pinned.get_by_role("button", name="Unpin").click()
    page.wait_for_load_state()
    assert page.get_by_role("heading", name="Pinned").count() == 0 and not server.gateway.dashboard_pins("usage")


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
    page.locator("main h3 a").first.click()
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
    table = page.locator("details", has=page.locator("summary", has_text="Table")).first
    table.locator("summary").click()  # <details> opens without script
    assert table.locator("table").is_visible()
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
