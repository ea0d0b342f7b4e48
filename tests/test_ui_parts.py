"""Unit tests of the web pages' parts: SVG charts, the session store and CSRF tokens, view data.

The chart tests check geometry against hand computations (where a bar's top and
its error bar's ends must be in pixels), and that text from data is escaped.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from dpgate.auth import Principal, Role
from dpgate.ui import charts
from dpgate.ui.charts import Series, bar_chart, burndown_chart, fmt_number, line_chart, meter, nice_ticks
from dpgate.ui.data import explanation_view, recent_releases, release_view
from dpgate.ui.docs import wants_html
from dpgate.ui.sessions import SessionStore, csrf_matches

SVG = "{http://www.w3.org/2000/svg}"


def _parse(svg) -> ET.Element:
    return ET.fromstring(str(svg))  # well-formed XML (so escaping did not break it)


# --------------------------------------------------------------------------- charts


def test_nice_ticks_cover_the_range_with_round_steps():
    assert nice_ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert nice_ticks(-3, 7)[0] <= -3 and nice_ticks(-3, 7)[-1] >= 7
    ticks = nice_ticks(0, 0.3111)
    steps = {round(b - a, 12) for a, b in zip(ticks, ticks[1:])}
    assert len(steps) == 1 and ticks[-1] >= 0.3111
    assert nice_ticks(5, 5) == sorted(nice_ticks(5, 5)) and len(nice_ticks(5, 5)) > 1
    assert nice_ticks(float("nan"), 1) == [0.0]


def test_fmt_number():
    assert fmt_number(1e-6) == "1e-6"
    assert fmt_number(0.3110649549) == "0.3111"
    assert fmt_number(1234567) == "1,234,567"
    assert fmt_number(1518182.0) == "1,518,182"
    assert fmt_number(float("inf")) == "∞" and fmt_number(float("nan")) == "nan"
    assert fmt_number(None) == "" and fmt_number("eu") == "eu"


def test_bar_geometry_and_error_bars_match_the_values():
    svg = bar_chart(["a", "b"], [100.0, -20.0], [10.0, 5.0], ident="t", title="T", y_label="n")
    root = _parse(svg)
    rects = [r for r in root.iter(SVG + "rect")]
    assert len(rects) == 2
    # y axis: ticks of nice_ticks(-25, 110) = -50 … 125? compute the frame the same way the chart does
    ticks = nice_ticks(-25.0, 110.0)
    y0, y1 = ticks[0], ticks[-1]

    def py(v):  # the chart's mapping, by hand: value → pixel (top margin MT, bottom margin MB)
        return charts.H - charts.MB - (v - y0) / (y1 - y0) * (charts.H - charts.MT - charts.MB)

    top_a = float(rects[0].get("y"))
    assert top_a == pytest.approx(py(100.0), abs=0.06)
    assert float(rects[0].get("height")) == pytest.approx(py(0.0) - py(100.0), abs=0.1)
    # the negative bar hangs from 0 down to -20
    assert float(rects[1].get("y")) == pytest.approx(py(0.0), abs=0.06)
    assert float(rects[1].get("height")) == pytest.approx(py(-20.0) - py(0.0), abs=0.1)
    whiskers = [p.get("d") for p in root.iter(SVG + "path") if p.get("class") == "err"]
    assert len(whiskers) == 2
    lo, hi = re.match(r"M[\d.]+,([\d.]+)V([\d.]+)", whiskers[0]).groups()
    assert float(lo) == pytest.approx(py(90.0), abs=0.06) and float(hi) == pytest.approx(py(110.0), abs=0.06)
    assert rects[0].find(SVG + "title").text == "a: 100 ± 10"


def test_chart_text_from_data_is_escaped():
    evil = "<script>alert('x')</script>"
    for svg in (bar_chart([evil], [1.0], [0.5], ident='i"d', title=evil, y_label=evil, x_label=evil),
                line_chart([Series(evil, [1, 2, 3], [1.0, 2.0, 3.0], [0.1, 0.1, 0.1])], ident="l", title=evil),
                burndown_chart([Series(evil, [0, 1], [0.0, 0.1], step=True)], Series("population", [0, 1], [0.0, 0.1]),
                               [(0, 0.3)], [(evil, 0.2)], ident="b", title=evil, t0=0, t1=10),
                meter(1, 2, label=evil)):
        text = str(svg)
        assert "<script>" not in text
        _parse(svg)  # still well-formed
        assert "&lt;script&gt;" in text or "&lt;scri" in text


def test_missing_and_non_finite_values_draw_no_bar():
    root = _parse(bar_chart(["a", "b", "c"], [None, float("nan"), 3.0], [None, 1.0, float("inf")], ident="m", title="t"))
    assert len(list(root.iter(SVG + "rect"))) == 1
    assert not [p for p in root.iter(SVG + "path") if p.get("class") == "err"]


def test_line_chart_orders_points_and_draws_one_whisker_per_point():
    s = Series("n", [0, 1, 2, 3], [5.0, 6.0, None, 8.0], [1.0, 1.0, 1.0, 1.0])
    root = _parse(line_chart([s], ident="x", title="t", x_label="week"))
    assert len(list(root.iter(SVG + "circle"))) == 3
    assert len([p for p in root.iter(SVG + "path") if p.get("class") == "err"]) == 3
    line = [p.get("d") for p in root.iter(SVG + "path") if p.get("class") != "err"][0]
    assert line.count("M") == 2  # the gap at x = 2 breaks the line


def test_burndown_zoom_leaves_out_the_cap_above_the_spend():
    args = ([Series("a", [0, 5], [0.0, 0.01], step=True)], Series("population", [0, 5], [0.0, 0.01], step=True),
            [(0, 0.3)], [("a", 0.12)])
    full = str(burndown_chart(*args, ident="f", title="t", t0=0, t1=10))
    zoomed = str(burndown_chart(*args, ident="z", title="t", t0=0, t1=10, zoom=True))
    assert 'stroke="#B00020"' in full and "cap above the chart" not in full
    assert "cap above the chart" in zoomed and 'stroke-dasharray="8 4"><title>' not in zoomed


def test_the_burn_down_cap_line_steps_at_each_recorded_cap_change(tmp_path):
    from dpgate.accounting import Cost
    from dpgate.ledger import open_ledger
    from dpgate.ui.data import BurndownCache, cap_history, governance_change

    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        led.ensure_population("p", epsilon=4.0, delta=1e-6, allocations={"a": 1.0})
        first = led.cap("p").rho_cap
        led.charge("p", "a", Cost.zcdp(0.01), purpose="q1")
        led.set_cap("p", epsilon=2.0, delta=1e-6, actor="root", reason="lower")
        second = led.cap("p").rho_cap
        led.charge("p", "a", Cost.zcdp(0.01), purpose="q2")
        led.set_cap("p", epsilon=1.0, delta=1e-6, actor="root", reason="lower again")
        third = led.cap("p").rho_cap
        events = led.events("p")
        # cap_changed stores the cap itself as `new` (population_created stores {"cap", "allocations"})
        assert [rho for _, rho in cap_history(events)] == [first, second, third]
        assert first > second > third
        chart = BurndownCache().chart(led, "p", led.spend("p").to_dict(), events)
    finally:
        led.close()
    root = _parse(chart["svg"])
    (cap,) = [p for p in root.iter(SVG + "path") if p.get("stroke") == "#B00020"]
    d = cap.get("d")
    assert d.count("V") == 2  # the line steps down at each of the two changes
    ys = [float(y) for y in re.findall(r"V([\d.]+)", d)]
    assert ys[0] < ys[1]  # each step goes down the chart's value (up the page's y)
    change = governance_change(events[-1])
    assert change["before"] == f"ε 2, δ 1e-6 (ρ {fmt_number(second)})"
    assert change["after"] == change["cap_after"] == f"ε 1, δ 1e-6 (ρ {fmt_number(third)})"
    created = governance_change(events[0])
    assert created["cap_after"] == f"ε 4, δ 1e-6 (ρ {fmt_number(first)})" and "allocations a 100 %" in created["after"]
    assert "{" not in change["before"] + change["after"] + created["after"]  # no raw JSON


def test_meter_fraction_and_colour():
    assert 'width="109.0"' in str(meter(1, 2, label="x", width=220))
    assert "#B00020" in str(meter(3, 2, label="x")) and "#8F6A00" in str(meter(0.9, 1, label="x"))
    assert "0.0 %" in str(meter(1, 0, label="x"))


# --------------------------------------------------------------------------- sessions


def _principal(key_id="k1", role=Role.ANALYST):
    return Principal(name="alice", role=role, consumer="analysts", key_id=key_id)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_sessions_expire_when_idle_and_absolutely():
    clock = Clock()
    store = SessionStore(idle_timeout_s=60, absolute_timeout_s=300, anonymous_timeout_s=30, clock=clock)
    sid, s = store.sign_in(_principal())
    for _ in range(4):  # used every 50 s: the idle timeout never bites …
        clock.t += 50
        assert store.get(sid) is s
    clock.t += 50
    assert store.get(sid) is s
    clock.t += 51  # … the absolute one does (301 s after sign-in)
    assert store.get(sid) is None
    sid2, _ = store.sign_in(_principal())
    clock.t += 61
    assert store.get(sid2) is None
    anon, _ = store.anonymous()
    clock.t += 31
    assert store.get(anon) is None


def test_sign_in_replaces_the_previous_session_and_sign_out_ends_it():
    store = SessionStore()
    anon, pre = store.anonymous()
    sid, s = store.sign_in(_principal(), previous=anon)
    assert sid != anon and s.csrf_token != pre.csrf_token
    assert store.get(anon) is None and store.get(sid) is s
    store.end(sid)
    assert store.get(sid) is None
    assert store.get(None) is None and store.get("x" * 500) is None


def test_the_store_is_bounded_and_evicts_anonymous_sessions_first():
    store = SessionStore(max_sessions=5, max_per_key=2)
    signed = [store.sign_in(_principal(key_id=f"k{i}"))[0] for i in range(3)]
    anons = [store.anonymous()[0] for _ in range(10)]
    assert len(store) == 5
    assert all(store.get(s) is not None for s in signed)  # anonymous ones went first
    assert store.get(anons[-1]) is not None and store.get(anons[0]) is None
    a, b, c = (store.sign_in(_principal(key_id="same"))[0] for _ in range(3))
    assert store.get(a) is None and store.get(b) is not None and store.get(c) is not None
    assert store.end_key("same") == 2


def test_csrf_tokens_compare_exactly():
    store = SessionStore()
    _, s = store.anonymous()
    _, other = store.anonymous()
    assert csrf_matches(s, s.csrf_token)
    assert not csrf_matches(s, other.csrf_token)
    assert not csrf_matches(s, s.csrf_token[:-1])
    assert not csrf_matches(s, "")
    assert not csrf_matches(s, None)
    assert not csrf_matches(None, s.csrf_token)
    assert not csrf_matches(s, "\udcff")  # a lone surrogate from a form does not crash
    assert len(s.csrf_token) >= 40  # 32 random bytes, URL-safe base64


def test_flash_messages_are_shown_once_and_explained_requests_remembered():
    _, s = SessionStore().anonymous()
    s.add_flash("ok", "done")
    assert s.pop_flash() == [("ok", "done")] and s.pop_flash() == []
    for i in range(40):
        s.remember_explained(f"d{i}")
    assert len(s.explained) == 16 and s.explained[-1] == "d39"


# --------------------------------------------------------------------------- view data

RELEASE = {
    "release_id": "rel_0123456789abcdef01234567",
    "dataset": "usage",
    "columns": ["region", "prompts", "avg_tokens"],
    "rows": [["eu", 100, 10.5], ["us", 90, 11.5]],
    "accuracy": {"prompts": {"ci95": 190.0}, "avg_tokens": {"ci95": 3.0, "ci95_rows": [1.0, 2.0], "approximate": True}},
}


def test_release_view_pairs_each_value_with_its_row_half_width():
    v = release_view(RELEASE)
    assert v["keys"] == ["region"] and v["values"] == ["prompts", "avg_tokens"]
    assert [h["name"] for h in v["header"]] == ["region", "prompts", "± prompts", "avg_tokens", "± avg_tokens"]
    assert [c["value"] for c in v["rows"][1]] == ["us", 90, 190.0, 11.5, 2.0]
    assert [c["column"] for c in v["charts"]] == ["prompts", "avg_tokens"] and v["charts"][1]["approximate"]
    assert release_view(RELEASE, max_charts=1)["omitted"] == 1
    numeric = {**RELEASE, "columns": ["week", "n"], "rows": [[3, 1], [1, 2], [2, 3]], "accuracy": {"n": {"ci95": 1}}}
    assert "<circle" in str(release_view(numeric)["charts"][0]["svg"])  # an ordered key: a line


def test_explanation_view_gives_the_output_half_widths():
    explanation = {
        "plan": {"table": "prompts", "primitives": [{"id": "p0", "kind": "count"}, {"id": "p1", "kind": "sum", "column": "tokens"}],
                 "outputs": [{"name": "region"}, {"name": "n", "function": "count", "primitives": ["p0"]},
                             {"name": "s", "function": "sum", "primitives": ["p1"]},
                             {"name": "a", "function": "avg", "primitives": ["p1", "p0"]}]},
        "sensitivity": {"p0": {"l1": 5, "l2": 5}, "p1": {"l1": 40000, "l2": 40000}},
        "noise_scales": {"p0": 10.0, "p1": 1000.0},
        "mechanism": "discrete_gaussian",
        "cost": {"rho": 0.01},
    }
    info = {"tables": {"prompts": {"columns": {"tokens": {"resolution": 0.5}}}}}
    from dpgate.mechanisms import ci95_halfwidth

    v = explanation_view(explanation, info, {"remaining_rho": 0.005, "population_remaining_rho": 1.0})
    out = {o["name"]: o for o in v["outputs"]}
    assert out["n"]["ci95"] == ci95_halfwidth("gaussian", 10.0)
    # a sum's noise is in resolution units: ± in tokens = half-width × 0.5
    assert out["s"]["ci95"] == pytest.approx(ci95_halfwidth("gaussian", 1000.0) * 0.5)
    assert out["a"]["ci95"] is None and "after the run" in out["a"]["note"]
    assert out["region"]["note"] == "group key (public)"
    assert v["fits"] is False  # 0.01 > 0.005 left in the allocation
    assert v["fits_note"] == ("This release costs ρ 0.01, but your allocation has only ρ 0.005 left: running it "
                              "would be refused (budget_exhausted) and charge nothing.")  # a sentence (issue 24)
    verdict = explanation_view({**explanation, "cost": {"rho": 0.004, "fits": True, "remaining_rho": 0.0527,
                                                        "consumer": "analysts"}}, info, None)
    assert verdict["fits_note"] == "This release costs ρ 0.004; allocation analysts has ρ 0.0527 left."
    assert [o["label"] for o in v["outputs"]] == ["region", "n", "s", "a"]
    assert explanation_view(explanation, info, {"remaining_rho": 0.5, "population_remaining_rho": 1.0})["fits"] is True
    assert explanation_view(explanation, info, None)["fits"] is None
    assert explanation_view({**explanation, "fits": True}, info, None)["fits"] is True  # the gateway's verdict wins


def test_explained_quantile_output_states_its_rank_error():
    explanation = {
        "plan": {"table": "prompts",
                 "primitives": [{"id": "p0", "kind": "quantile", "column": "tokens"}],
                 "outputs": [{"name": "med", "function": "quantile", "primitives": ["p0"]}]},
        "sensitivity": {}, "noise_scales": {"p0": 2.5}, "mechanism": "discrete_gaussian",
        "quantiles": {"p0": {"rank_error95": 23.4567, "rank_scale": 2.5}}, "cost": {"rho": 0.01},
    }
    out = explanation_view(explanation, {"tables": {}}, None)["outputs"][0]
    assert out["ci95"] is None
    assert "rank error of ± 23.5 ranks (95 %)" in out["note"] and "after the run" not in out["note"]


def test_quantile_release_view_has_a_rank_column_and_no_error_bars():
    release = {"release_id": "rel_q", "dataset": "d", "columns": ["region", "med"],
               "rows": [["eu", 12.5], ["us", None]],
               "accuracy": {"med": {"mechanism": "exponential_mechanism", "quantile": 0.5, "rank_error95": 7.25,
                                    "ci95": None, "approximate": False}}}
    v = release_view(release)
    assert [h["name"] for h in v["header"]] == ["region", "med", "rank error med (95 %)"]
    assert [[c["value"] for c in r] for r in v["rows"]] == [["eu", 12.5, 7.25], ["us", None, None]]
    assert v["rows"][0][2]["kind"] == "rank"
    (chart,) = v["charts"]
    assert 'class="err"' not in str(chart["svg"]) and "without error bars" in str(chart["svg"])
    assert "0.5·n ± 7.25" in chart["rank_error"] and v["ranks"]["med"] == chart["rank_error"]


def test_recent_releases_are_those_paid_by_the_consumer():
    rs = [{"release_id": "a", "paid_by": {"consumer": "analysts"}}, {"release_id": "b", "paid_by": {"consumer": "dashboard"}},
          {"release_id": "c", "charge": {"consumer": "analysts"}}]
    assert [r["release_id"] for r in recent_releases(rs, "analysts")] == ["a", "c"]
    assert recent_releases(rs, None) == []


@pytest.mark.parametrize("accept,html", [
    ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", True),
    ("*/*", False), (None, False), ("application/json", False),
    ("text/html;q=0.5, application/json", False), ("application/json;q=0.1, text/html", True),
    ("text/html;q=bogus", False),
])
def test_accept_negotiation(accept, html):
    assert wants_html(accept) is html


def test_drift_warning_reads_the_gateway_report_and_degrades():
    from dpgate.ui.data import drift_warning

    assert drift_warning({"name": "usage"}) is None  # no policy_drift field (older gateways)
    assert drift_warning({"name": "usage", "policy_drift": {"drifted": False, "differences": [], "message": ""}}) is None
    w = drift_warning({"name": "usage", "policy_drift": {"drifted": True, "differences": ["cap: a", "allocations: b"]}})
    assert w == {"dataset": "usage", "message": "cap: a; allocations: b", "differences": ["cap: a", "allocations: b"]}
    legacy = drift_warning({"name": "u", "policy_drift": {"drifted": False, "message": "re-fix the cap"}})
    assert legacy["message"] == "re-fix the cap"
    assert drift_warning({"name": "u", "policy_drift": True})["message"] == "True"


# --------------------------------------------------------------------------- issue 24: pages that read right


def test_error_bars_and_the_axis_stop_at_the_clip_range_and_say_so():
    # an AVG in [0, 10] released as 9 ± 4 and 1 ± 4: its true value cannot pass 10 or go below 0
    svg = bar_chart(["a", "b"], [9.0, 1.0], [4.0, 4.0], ident="c", title="t", y_label="avg", clip=(0.0, 10.0))
    root = _parse(svg)
    ticks = [float(t.text) for t in root.iter(SVG + "text") if t.text and re.fullmatch(r"[\d.]+", t.text)]
    assert min(ticks) == 0 and max(ticks) == 10  # nice_ticks(0, 13) would have reached 14
    frame_top, frame_bottom = charts.MT, charts.H - charts.MB
    for d in (p.get("d") for p in root.iter(SVG + "path") if p.get("class") == "err"):
        lo, hi = map(float, re.match(r"M[\d.]+,([\d.]+)V([\d.]+)", d).groups())
        assert frame_top - 0.05 <= hi <= lo <= frame_bottom + 0.05  # inside the plot: cut at 10 and at 0
    assert "error bars clipped to [0, 10]" in str(svg)
    unclipped = str(bar_chart(["a"], [5.0], [1.0], ident="u", title="t", clip=(0.0, 10.0)))
    assert "clipped" not in unclipped  # said only when a bar was cut
    # without a clip range the whisker extends past the bound, as before
    assert max(float(t.text) for t in _parse(bar_chart(["a"], [9.0], [4.0], ident="n", title="t")).iter(SVG + "text")
               if t.text and re.fullmatch(r"[\d.]+", t.text)) > 10


def test_release_view_clips_to_value_ranges_and_marks_clamped_values():
    release = {"release_id": "rel_x", "dataset": "usage", "columns": ["region", "n", "avg_tokens"],
               "rows": [["eu", 0, 8000.0], ["us", 12, 10.0]],
               "accuracy": {"n": {"ci95": 50.0}, "avg_tokens": {"ci95": 9000.0, "ci95_rows": [9000.0, 5.0],
                                                                 "approximate": True}},
               "value_ranges": {"n": {"lower": 0, "upper": None, "clamped": True, "rule": "a count is at least 0"},
                                "avg_tokens": {"lower": 0.0, "upper": 8000.0, "clamped": True,
                                               "rule": "tokens's declared bounds"}},
               "canonical_sql": 'SELECT "region", COUNT(*) AS "count", AVG("tokens") AS "avg_tokens" FROM "prompts" '
                                'WHERE "week" = 7 GROUP BY "region"'}
    v = release_view(release)
    assert [c["clip"] for c in v["charts"]] == ["≥ 0", "[0, 8,000]"]
    assert "error bars clipped to [0, 8,000]" in str(v["charts"][1]["svg"])
    cells = [[c.get("clamped") for c in row if c["kind"] == "value"] for row in v["rows"]]
    assert cells == [[True, True], [False, False]]
    assert set(v["clamped"]) == {"n", "avg_tokens"}
    assert v["title"] == "n, avg_tokens by region, where week = 7"  # the analyst's names and the filter


def test_a_single_value_is_a_number_card_and_date_keys_are_a_line():
    one = {"release_id": "rel_1", "dataset": "d", "columns": ["users"], "rows": [[1234]],
           "accuracy": {"users": {"ci95": 12.0}}, "canonical_sql": 'SELECT COUNT(*) AS "users" FROM "t"'}
    v = release_view(one)
    assert v["charts"] == [] and v["numbers"] == [{"column": "users", "value": 1234, "ci95": 12.0, "rank_error": None,
                                                   "approximate": False, "clamped": False}]
    dated = {"release_id": "rel_2", "dataset": "d", "columns": ["month", "n"],
             "rows": [["2024-03-01", 5], ["2024-01-01", 3], ["2024-02-01", 4]], "accuracy": {"n": {"ci95": 1.0}}}
    (chart,) = release_view(dated)["charts"]
    root = _parse(chart["svg"])
    assert len(list(root.iter(SVG + "circle"))) == 3  # a line with its points, in date order
    labels = [t.text for t in root.iter(SVG + "text")]
    assert "2024-01-01" in labels and "2024-03-01" in labels
    tips = [c.find(SVG + "title").text for c in root.iter(SVG + "circle")]
    assert tips[0].startswith("n, 2024-01-01: 3") and tips[-1].startswith("n, 2024-03-01: 5")


def test_value_ranges_follow_the_declared_bounds():
    from dpgate.policy import load_policy
    from dpgate.postprocess.ranges import clamped_at_bound, value_ranges
    from dpgate.sql.parse import parse_query
    from pathlib import Path

    policy = load_policy(Path(__file__).parent / "fixtures" / "policies" / "planner.toml")
    plan = parse_query("SELECT region, COUNT(*) AS n, SUM(latency) AS s, SUM(tokens) AS t, AVG(latency) AS a, "
                       "VAR_POP(latency) AS v, STDDEV(latency) AS sd, MEDIAN(tokens) AS med, SUM(tokens) * 2 AS x "
                       "FROM prompts GROUP BY region", policy)
    r = value_ranges(plan, policy)
    # latency in [-10, 100]: a variance ≤ (100 + 10)²/4 = 3025, a standard deviation ≤ 110/2 = 55 (Popoviciu)
    assert (r["a"]["lower"], r["a"]["upper"], r["a"]["clamped"]) == (-10.0, 100.0, True)
    assert (r["v"]["lower"], r["v"]["upper"]) == (0.0, 3025.0) and (r["sd"]["lower"], r["sd"]["upper"]) == (0.0, 55.0)
    assert (r["n"]["lower"], r["n"]["upper"], r["n"]["clamped"]) == (0, None, True)
    assert (r["t"]["lower"], r["t"]["upper"], r["t"]["clamped"]) == (0.0, None, False)  # tokens ≥ 0
    assert "s" not in r and "x" not in r  # latency may be negative; derived outputs have none
    assert (r["med"]["lower"], r["med"]["upper"], r["med"]["clamped"]) == (0.0, 8000.0, False)
    assert clamped_at_bound(100.0, r["a"]) and clamped_at_bound(0, r["n"]) and not clamped_at_bound(5.0, r["a"])
    assert not clamped_at_bound(8000.0, r["med"])  # a quantile on the grid's end is not a clamp


def test_the_readme_screenshots_are_the_ones_the_browser_tests_take():
    """docs/screenshots/*.png come from tests/test_ui_browser.py (docs/screenshots/regenerate.sh)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    shown = set(re.findall(r"docs/screenshots/([\w-]+)\.png", (repo / "README.md").read_text()))
    taken = set(re.findall(r'shot(?:_narrow)?\(page, f?"([\w{}\'=: -]+)"', (repo / "tests" / "test_ui_browser.py").read_text()))
    taken = {t for t in taken if "{" not in t} | {"narrow-console", "narrow-release"}
    assert shown and shown <= taken, shown - taken
    script = repo / "docs" / "screenshots" / "regenerate.sh"
    assert script.is_file() and "DPGATE_SCREENSHOT_DIR=docs/screenshots" in script.read_text()
    assert all((repo / "docs" / "screenshots" / f"{name}.png").is_file() for name in shown)
