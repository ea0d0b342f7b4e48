"""UNION ALL of aggregate queries as one release of several parts (issue 21 item 6).

Each part is planned, bounded and calibrated like a standalone query; the release is the
concatenation of the parts' rows; the charge is ONE ledger charge whose cost is the sum of the parts'
standalone costs at their share of the budget (sequential composition: zCDP ρ adds). The shares are
computed here by hand (the budget split over the parts' primitives), and the parts' standalone
costs from standalone explains of each part's own SQL, independently of the union's runner.
"""

from __future__ import annotations


import pytest
from _api_server import LiveServer, assert_error, make_project
import _runner_spies
from _runner_spies import exact_bounded_parts, neighbour_shop
from test_pipeline_runners import _kinds

import dpgate.pipeline.runners as runners
from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.errors import InvalidSql, UnsupportedQuery
from dpgate.pipeline.budget import QueryBudget
from dpgate.pipeline.strategy import UnionAll
from dpgate.settings import Settings

gw, events = _runner_spies.gw, _runner_spies.events  # the shop gateway and its event spy (fixtures)

LOW = "SELECT 'low' AS grp, COUNT(*) AS n, SUM(amount) AS s FROM orders WHERE amount < 50"
HIGH = "SELECT 'high', COUNT(*), SUM(amount) FROM orders WHERE amount >= 50"
EU = "SELECT 'eu', COUNT(*), SUM(amount) FROM orders WHERE region = 'eu'"
UNION = f"{LOW} UNION ALL {HIGH} UNION ALL {EU}"
#: standalone equivalents of the parts (the first part's labels; labels do not change a cost)
PARTS = [LOW, HIGH.replace("'high',", "'high' AS grp,"), EU.replace("'eu',", "'eu' AS grp,")]


def _no_trace(gw) -> None:
    assert gw.ledger_entries() == []


def test_a_union_all_is_one_strategy_of_standalone_parts(gw):
    _, _, strategy = gw.compile("shop", UNION)
    assert isinstance(strategy, UnionAll) and len(strategy.parts) == 3
    for part, sql in zip(strategy.parts, PARTS):
        _, plan, _ = gw.compile("shop", sql)
        assert part.plan.plan_hash == plan.plan_hash  # each part is planned like the standalone query
    assert strategy.plan_hash.startswith("union:")


@pytest.mark.parametrize("budget,mechanism", [(QueryBudget(rho=0.03), None), (QueryBudget(epsilon=0.3), "laplace"),
                                              (QueryBudget(epsilon=2.0), None)])
def test_the_charge_is_the_sum_of_the_parts_standalone_charges(gw, budget, mechanism):
    # 2 primitives per part (COUNT, SUM) → each part gets a third of the budget (by hand)
    if budget.rho is not None:
        shares = [QueryBudget(rho=0.01)] * 3
    elif mechanism == "laplace":
        shares = [QueryBudget(epsilon=0.1)] * 3
    else:  # a Gaussian ε is ρ by the ledger's conversion at the cap's δ, split as ρ
        from dpgate.ledger.base import ledger_rho
        rho = ledger_rho(2.0, gw.ledger.cap("shoppers").rho_delta)
        shares = [QueryBudget(rho=rho / 3)] * 3
    standalone = [gw.explain("shop", sql, budget=b, mechanism=mechanism)["cost"] for sql, b in zip(PARTS, shares)]
    doc = gw.explain("shop", UNION, budget=budget, mechanism=mechanism)
    release = gw.query("shop", UNION, consumer="default", budget=budget, mechanism=mechanism)
    assert len(gw.ledger_entries()) == 1  # ONE charge
    if mechanism == "laplace":  # pure ε adds (the charge is stated as its ε at δ = 0)
        assert doc["cost"]["epsilon"] == pytest.approx(sum(c["epsilon"] for c in standalone), rel=1e-12)
        assert doc["cost"]["epsilon"] == pytest.approx(0.3, rel=1e-12)
        assert release["charge"]["epsilon_at_delta"] == pytest.approx(0.3, rel=1e-12)
    else:  # zCDP ρ adds
        assert doc["cost"]["rho"] == pytest.approx(sum(c["rho"] for c in standalone), rel=1e-12)
        assert release["charge"]["rho"] == pytest.approx(sum(c["rho"] for c in standalone), rel=1e-12)
    for part, sql, b in zip(release["parts"], PARTS, shares):
        alone = gw.explain("shop", sql, budget=b, mechanism=mechanism)["budget"]
        assert part["budget"].keys() == alone.keys()
        assert all(part["budget"][k] == pytest.approx(v, rel=1e-12) for k, v in alone.items())


def test_the_release_is_the_concatenation_and_a_repeat_is_free(gw):
    r = gw.query("shop", UNION, consumer="default", budget=QueryBudget(rho=0.03))
    assert r["columns"] == ["grp", "n", "s"]
    assert [row[0] for row in r["rows"]] == ["low", "high", "eu"]
    assert r["union_all"] is True and r["composition"]["rule"] == "sequential"
    assert [p["rows"] for p in r["parts"]] == [1, 1, 1]
    # the top-level scales are the parts' own, named as explain names them (was {})
    assert r["noise_scales"] == {f"part{p['part']}.{k}": v for p in r["parts"] for k, v in p["noise_scales"].items()}
    assert r["noise_scales"] == gw.explain("shop", UNION, budget=QueryBudget(rho=0.03))["noise_scales"]
    assert len(r["noise_scales"]) >= 3
    again = gw.query("shop", UNION, consumer="default", budget=QueryBudget(rho=0.03))
    assert again["cached"] is True and again["charge"] is None and again["rows"] == r["rows"]
    assert len(gw.ledger_entries()) == 1
    renamed = gw.query("shop", UNION.replace("AS grp, COUNT(*) AS n", "AS bucket, COUNT(*) AS rows_"),
                       consumer="default", budget=QueryBudget(rho=0.03))  # labels only: the same release
    assert renamed["cached"] is True and renamed["rows"] == r["rows"] and renamed["columns"] == ["bucket", "rows_", "s"]
    assert set(renamed["accuracy"]) == {"rows_", "s"} and set(renamed["parts"][1]["accuracy"]) == {"rows_", "s"}
    assert len(gw.ledger_entries()) == 1
    other = gw.query("shop", f"{LOW} UNION ALL {HIGH}", consumer="default", budget=QueryBudget(rho=0.03))
    assert other["cached"] is False and len(gw.ledger_entries()) == 2  # the key covers every part



@pytest.mark.parametrize("removed", [0, 1, 2, 5])
def test_removing_one_unit_moves_each_part_by_at_most_its_sensitivity(gw, tmp_path, removed):
    with neighbour_shop(tmp_path, removed) as nb:
        doc = gw.explain("shop", UNION, budget=QueryBudget(rho=0.03))
        full, neighbour = exact_bounded_parts(gw, UNION), exact_bounded_parts(nb, UNION)
    moved = False
    for part, a, b in zip(doc["parts"], full, neighbour):
        for pid in a:
            l1 = part["sensitivity"][pid]["l1"]
            diff = sum(abs(x - y) for x, y in zip(a[pid], b[pid]))
            assert diff <= l1 + 1e-9, (part["part"], pid, diff, l1)
            moved = moved or diff > 0
    assert moved  # the removed unit was counted somewhere (the check can fail)


@pytest.mark.parametrize("sql,part,match", [
    (f"{LOW} UNION ALL SELECT 'x', COUNT(*) FROM orders", 2, "has 2 columns, part 1 has 3"),
    (f"{LOW} UNION ALL SELECT region, COUNT(*), SUM(amount) FROM orders GROUP BY region "
     "UNION ALL SELECT 1, COUNT(*), SUM(amount) FROM orders", 3, "column 1 .grp. of part 3"),
    (f"{LOW} UNION ALL SELECT 'x', COUNT(*), SUM(nope) FROM orders", 2, "part 2 of 2 of the UNION ALL"),
    (f"{LOW} UNION ALL SELECT model, COUNT(*), SUM(amount) FROM orders GROUP BY model", 2, "partition selection"),
    (f"{LOW} UNION ALL SELECT zone, COUNT(*) AS n, COUNT(*) AS m FROM regions GROUP BY zone", 2, "public tables only"),
])
def test_a_refused_part_is_named_and_nothing_is_charged_or_read(gw, events, sql, part, match):
    with pytest.raises(Exception) as info:
        gw.query("shop", sql, consumer="default", budget=QueryBudget(rho=0.03))
    err = info.value
    assert err.details.get("part") == part and err.details.get("charged") is False, err.details
    assert __import__("re").search(match, err.message), err.message
    assert "nothing was charged" in err.message
    assert "charge" not in _kinds(events) and "execute" not in _kinds(events)
    _no_trace(gw)


@pytest.mark.parametrize("sql,match", [
    (f"{LOW} UNION {HIGH}", "UNION ALL"),
    (f"{LOW} UNION ALL {HIGH} ORDER BY 2", "ORDER BY over a UNION ALL"),
    (f"{LOW} UNION ALL {HIGH} LIMIT 1", "LIMIT over a UNION ALL"),
    (f"{LOW} INTERSECT {HIGH}", "INTERSECT"),
])
def test_union_distinct_and_post_processing_over_the_union_are_refused(gw, events, sql, match):
    with pytest.raises(UnsupportedQuery, match=match) as info:
        gw.query("shop", sql, consumer="default")
    assert info.value.details.get("charged") is False
    assert "charge" not in _kinds(events) and "execute" not in _kinds(events)
    _no_trace(gw)


def test_parse_query_still_plans_one_select_only(gw):
    from dpgate.sql.parse import parse_statement
    with pytest.raises(UnsupportedQuery, match="UNION"):
        parse_statement(f"{LOW} UNION ALL {HIGH}")
    with pytest.raises(InvalidSql):
        gw.query("shop", "", consumer="default")


def test_every_part_is_rendered_and_checked_before_the_one_charge(gw, events):
    budget = QueryBudget(rho=0.03)
    gw.query("shop", UNION, consumer="default", budget=budget)
    kinds = _kinds(events)
    assert kinds.count("charge") == 1, kinds
    at = kinds.index("charge")
    assert kinds[:at].count("render") >= 3 and kinds[:at].count("check") >= 3, kinds
    assert "render" not in kinds[at + 1:] and "check" not in kinds[at + 1:]
    assert "execute" not in kinds[:at] and kinds[at + 1:].count("execute") == 3
    rendered = [e[3] for e in events[:at] if e[0] == "render"]
    executed = [e[1][0] for e in events[at + 1:] if e[0] == "execute"]
    assert all(any(s is r for r in rendered) for s in executed)
    charged = events[at][1][2]
    policy, _, strategy = gw.compile("shop", UNION)
    fresh = gw._runner("shop", policy, strategy)
    assert charged == fresh.calibrate(fresh.resolve(budget, None)).cost
    assert charged.rho == pytest.approx(0.03, rel=1e-9)  # the whole budget, no more


def test_a_failed_part_prepare_charges_nothing(gw, monkeypatch):
    real = runners.NoisyRunner.prepare
    calls = []

    def failing(self, engine, salt):
        calls.append(1)
        if len(calls) == 3:
            raise UnsupportedQuery("the engine refuses this statement")
        return real(self, engine, salt)

    monkeypatch.setattr(runners.NoisyRunner, "prepare", failing)
    with pytest.raises(UnsupportedQuery, match="part 3 of 3"):
        gw.query("shop", UNION, consumer="default", budget=QueryBudget(rho=0.03))
    _no_trace(gw)


def test_explain_states_the_composition_and_the_split(gw):
    doc = gw.explain("shop", f"{LOW} UNION ALL SELECT 'all', COUNT(*), SUM(amount) FROM orders",
                     budget=QueryBudget(rho=0.04))
    assert "parts compose sequentially" in doc["composition"]["note"]
    assert "disjoint" in doc["composition"]["note"]
    assert doc["budget"] == {"rho": 0.04}
    assert doc["budget_split"]["parts"] == [{"rho": 0.02}, {"rho": 0.02}]
    assert [p["part"] for p in doc["parts"]] == [1, 2]
    assert doc["parts"][0]["plan_hash"] == gw.explain("shop", LOW)["plan_hash"]
    assert doc["columns"] == ["grp", "n", "s"] and doc["cost"]["fits"] is True
    assert set(doc["sensitivity"]) == {"part1.p0", "part1.p1", "part2.p0", "part2.p1"}
    assert doc["parts"][1]["expected_accuracy"]["outputs"]


def test_ci95_applies_to_every_cell_of_every_part(gw):
    sql = ("SELECT 'eu' AS g, COUNT(*) AS n FROM orders WHERE region = 'eu' UNION ALL "
           "SELECT 'us', COUNT(*) FROM orders WHERE region = 'us'")
    r = gw.query("shop", sql, consumer="default", budget=QueryBudget(ci95=20.0))
    alone = gw.explain("shop", "SELECT 'eu' AS g, COUNT(*) AS n FROM orders WHERE region = 'eu'",
                       budget=QueryBudget(ci95=20.0))
    for part in r["parts"]:
        assert part["accuracy"]["n"]["ci95"] <= 20.0 and part["budget"]["ci95"] == 20.0
    assert r["accuracy"]["n"]["ci95"] <= 20.0
    assert r["accuracy"]["n"]["sigma"] == max(p["accuracy"]["n"]["sigma"] for p in r["parts"])
    assert r["charge"]["rho"] == pytest.approx(2 * alone["cost"]["rho"], rel=1e-12)  # each part at the target


def test_a_with_before_the_union_is_given_to_every_part(gw):
    sql = ("WITH o AS (SELECT * FROM orders WHERE amount > 10) SELECT 'a' AS g, COUNT(*) AS n FROM o WHERE amount < 50 "
           "UNION ALL SELECT 'b', COUNT(*) FROM o WHERE amount >= 50")
    _, _, strategy = gw.compile("shop", sql)
    _, alone, _ = gw.compile("shop", "SELECT 'a' AS g, COUNT(*) AS n FROM orders WHERE amount > 10 AND amount < 50")
    assert strategy.parts[0].plan.plan_hash == alone.plan_hash


# ---------------------------------------------------------------- HTTP API

@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("union_project"))


def test_the_http_api_answers_explains_and_refuses_a_union(project, tmp_path):
    settings = Settings(policies=project / "policies", home=tmp_path / "state")
    key = KeyStore(settings.resolved_keys_file()).add("alice", role="analyst", consumer="analysts")[0]
    sql = ("SELECT 'eu' AS region, COUNT(*) AS n FROM prompts WHERE region = 'eu' "
           "UNION ALL SELECT 'us', COUNT(*) FROM prompts WHERE region = 'us'")
    with LiveServer(create_app(settings)) as live, live.client(key) as client:
        e = client.post("/v1/queries/explain", json={"dataset": "usage", "sql": sql, "budget": {"rho": 0.01}})
        assert e.status_code == 200, e.text
        assert e.json()["composition"]["rule"] == "sequential" and len(e.json()["parts"]) == 2
        r = client.post("/v1/queries", json={"dataset": "usage", "sql": sql, "budget": {"rho": 0.01}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["columns"] == ["region", "n"] and [row[0] for row in body["rows"]] == ["eu", "us"]
        assert body["charge"]["rho"] == pytest.approx(e.json()["cost"]["rho"], rel=1e-12)
        bad = client.post("/v1/queries", json={"dataset": "usage", "budget": {"rho": 0.01},
                                               "sql": sql.replace("COUNT(*) FROM prompts WHERE region = 'us'",
                                                                  "COUNT(*), 1 FROM prompts WHERE region = 'us'")})
        details = assert_error(bad, 400, "unsupported_query")
        assert details["part"] == 2 and details["charged"] is False
        budget = client.get("/v1/datasets/usage/budget").json()
        assert budget["charges"] == 1


def test_dpgate_explain_prints_each_part_and_the_one_charge(gw, capsys):
    from dpgate.cli.explain import print_explanation

    print_explanation(gw.explain("shop", UNION, budget=QueryBudget(rho=0.03)))
    out = capsys.readouterr().out
    assert out.count("--- part ") == 3 and "parts compose sequentially" in out
    assert "--- the release (one charge) ---" in out and "ρ 0.03" in out


def test_a_quantile_part_and_a_grouped_part_are_released_together(gw):
    sql = ("SELECT region, COUNT(*) AS n, MEDIAN(amount) AS m FROM orders GROUP BY region "
           "UNION ALL SELECT 'all', COUNT(*), MEDIAN(amount) FROM orders")
    doc = gw.explain("shop", sql, budget=QueryBudget(rho=0.04))
    assert [p["budget"]["rho"] for p in doc["parts"]] == pytest.approx([0.02, 0.02])
    assert all("quantiles" in p for p in doc["parts"])
    r = gw.query("shop", sql, consumer="default", budget=QueryBudget(rho=0.04))
    assert [row[0] for row in r["rows"]] == ["eu", "us", "apac", "all"]
    assert all(0 <= row[2] <= 100 for row in r["rows"])
    assert r["charge"]["rho"] == pytest.approx(0.04, rel=1e-9) and len(gw.ledger_entries()) == 1


def test_explain_warns_before_paying_for_each_part(gw):
    # a SUM of amounts in [0, 100] at ρ = 1e-6: its ± swamps any group of 100 rows (issue 22 item 6)
    doc = gw.explain("shop", UNION, budget=QueryBudget(rho=1e-6))
    assert doc["warnings"] and all(w.startswith("part ") for w in doc["warnings"])
    assert {o["part"] for o in doc["expected_accuracy"]["outputs"]} == {1, 2, 3}
    assert doc["parts"][0]["warnings"]
    quiet = gw.explain("shop", UNION, budget=QueryBudget(rho=0.3))
    assert len(quiet["warnings"]) < len(doc["warnings"])
