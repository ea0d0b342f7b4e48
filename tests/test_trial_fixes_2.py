"""Problems the fresh-user trial of 2026-12-03 found (each test failed before its fix).

F1 (Laplace quantiles over selected keys: 500 after the charge) is in test_quantile_selection.py,
F2/F3 (private bounds: the default resolution, the paying request repeated) in
test_private_bounds.py, the CLI's one-line internal error in test_cli_newuser.py. Here:

* F7 — ``COUNT(*) / 0`` is NULL on any data: refused before the charge, as ``COUNT(NULL)`` is.
* F8 — a policy's ``[budget] epsilon`` has an upper limit (ε = 1e308 loaded, then overflowed).
* F9 — an unknown consumer is refused by explain and by a query whose release is stored.
* F10 — ``dpgate explain --mechanism laplace`` states the pure-ε cost (it printed "cost 0").
"""

from __future__ import annotations

import pytest
from _api_server import make_project

from dpgate.cli import main
from dpgate.errors import PolicyError, UnknownConsumer, UnsupportedQuery
from dpgate.policy import load_policies
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("trial2"))


@pytest.fixture()
def gw(project, tmp_path):
    with Gateway.open(Settings(policies=project / "policies", home=tmp_path / "state")) as g:
        yield g


def _charges(gw: Gateway) -> int:
    return sum(1 for e in gw.ledger_entries() if e.get("type") == "charge")


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) / 0 FROM prompts",
    "SELECT COUNT(*) // 0.0 AS r FROM prompts",
    "SELECT region, SUM(tokens) % (0) AS r FROM prompts GROUP BY region",
    "SELECT COUNT(*) / -0 FROM prompts",
])
def test_a_division_by_a_literal_zero_is_refused_before_the_charge(gw, sql):
    with pytest.raises(UnsupportedQuery, match="division by zero") as e:
        gw.query("usage", sql, consumer="analysts", budget=QueryBudget(rho=0.001))
    assert e.value.details["reason"] == "division_by_zero"
    assert _charges(gw) == 0


def test_a_division_by_a_nonzero_literal_or_a_released_value_is_answered(gw):
    out = gw.query("usage", "SELECT COUNT(*) / 2 AS half, SUM(tokens) / COUNT(*) AS r FROM prompts",
                   consumer="analysts", budget=QueryBudget(rho=0.001))
    assert out["columns"] == ["half", "r"] and _charges(gw) == 1


@pytest.mark.parametrize("epsilon, ok", [("1e308", False), ("1e13", False), ("1e12", True), ("4.0", True)])
def test_a_policy_cap_epsilon_has_an_upper_limit(project, tmp_path, epsilon, ok):
    text = (project / "policies" / "usage.toml").read_text()
    assert "epsilon = 4.0" in text
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "usage.toml").write_text(text.replace("epsilon = 4.0", f"epsilon = {epsilon}", 1)
                                       .replace('source = "sample_data', f'source = "{project}/sample_data'))
    if ok:
        assert load_policies(folder)["usage"].budget.epsilon == float(epsilon)
    else:
        with pytest.raises(PolicyError, match="epsilon must be > 0 and at most 1e"):
            load_policies(folder)


def test_an_unknown_consumer_is_refused_by_explain_and_by_a_stored_release(gw):
    sql = "SELECT region, COUNT(*) AS n FROM prompts GROUP BY region"
    with pytest.raises(UnknownConsumer, match="no allocation for consumer 'nobody'"):
        gw.explain("usage", sql, consumer="nobody")
    gw.query("usage", sql, consumer="analysts", budget=QueryBudget(rho=0.001))
    assert gw.query("usage", sql, consumer="analysts", budget=QueryBudget(rho=0.001))["cached"]
    with pytest.raises(UnknownConsumer) as e:  # the stored release is not served to a typo either
        gw.query("usage", sql, consumer="nobody", budget=QueryBudget(rho=0.001))
    assert e.value.details["consumers"] == ["analysts", "dashboard"]
    assert gw.explain("usage", sql, consumer="dashboard")["cost"]["fits"] is True
    assert _charges(gw) == 1


def test_explain_states_a_laplace_cost_as_pure_epsilon(project, tmp_path, capsys):
    # --rho 0.002 under Laplace: ε = √(2ρ) = √0.004 = 0.063246 (the request's ρ read as ε²/2)
    code = main(["--policies", str(project / "policies"), "--home", str(tmp_path / "s"), "explain",
                 "--dataset", "usage", "--mechanism", "laplace", "--rho", "0.002", "SELECT COUNT(*) FROM prompts"])
    out = capsys.readouterr().out
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("cost "))
    assert line.split()[1:4] == ["pure", "ε", "0.06325;"], line


# --- F4: m rows' worth rounded, not truncated -------------------------------------------------------

_F4_POLICY = """
[dataset]
name = "visits"
population = "patients"
[budget]
epsilon = 1.0
delta = 1e-6
default_query_rho = 0.01
[tables.visits]
source = "{src}"
privacy_unit = "pid"
max_groups_per_unit = 1
max_rows_per_unit = 4
[tables.visits.columns]
x = {{ type = "int", lower = -1, upper = 1 }}
"""


@pytest.mark.parametrize("sql, expected", [
    # unit 1: 10 rows, two 1s → 4 × 0.2 = 0.8 → 1 (truncated: 0); unit 2: 10 rows of 1 → 4;
    # unit 3: three rows (≤ m) [1, 0, 1] → 2; unit 4: 10 rows, three −1s → 4 × −0.3 = −1.2 → −1
    # (half away from zero; truncated toward zero: −1 as well); unit 5: 8 rows, one −1 and five 1s
    # → 4 × 0.5 = 2 exactly. Total 1 + 4 + 2 − 1 + 2 = 8 (before: 0 + 4 + 2 − 1 + 2 = 7).
    ("SELECT SUM(x) AS s FROM visits", 8),
    # the 0/1 expression the trial used: unit 4 has no positive row, unit 5 five of eight →
    # 4 × 5/8 = 2.5 → 3 (half away); 1 + 4 + 2 + 0 + 3 = 10 (before: 0 + 4 + 2 + 0 + 2 = 8)
    ("SELECT SUM(CASE WHEN x > 0 THEN 1 ELSE 0 END) AS s FROM visits", 10),
])
def test_a_heavy_units_sum_is_m_times_its_mean_rounded_not_truncated(tmp_path, sql, expected):
    """Trial finding F4 (2026-12-03): ``(SUM·m) // COUNT`` truncated m rows' worth, biasing sums of
    small values down (a SUM of a 0/1 expression by ~40σ on the trial's data)."""
    import dpgate.pipeline.planning  # noqa: F401 - installs the planner's table-less evaluator
    from dpgate.engines.duckdb import DuckDBEngine
    from dpgate.policy import load_policy
    from dpgate.sql.bound import bounded_query
    from dpgate.sql.parse import parse_query
    from dpgate.sql.sources import plan_policy

    rows = ([(1, 1)] * 2 + [(1, 0)] * 8 + [(2, 1)] * 10 + [(3, 1), (3, 0), (3, 1)]
            + [(4, -1)] * 3 + [(4, 0)] * 7 + [(5, -1)] + [(5, 1)] * 5 + [(5, 0)] * 2)
    src = tmp_path / "visits.csv"
    src.write_text("pid,x\n" + "".join(f"{p},{x}\n" for p, x in rows))
    (tmp_path / "visits.toml").write_text(_F4_POLICY.format(src=src))
    engine = DuckDBEngine(load_policy(tmp_path / "visits.toml"))
    engine.load()
    try:
        plan = parse_query(sql, engine.policy)
        out = engine.execute(bounded_query(plan, plan_policy(plan, engine.policy), salt=3))
        sums = [v for k, v in out.items() if k.startswith("p")]
        assert [int(v[0]) for v in sums] == [expected]
    finally:
        engine.close()


# --- trial 3 (2026-12-03): a NULL inside a per-unit subquery was clamped to the lower bound --------

_NULL_POLICY = """
[dataset]
name = "nul"
population = "units"
[budget]
epsilon = 1.0
delta = 1e-6
default_query_rho = 0.01
[tables.t]
source = "{src}"
privacy_unit = "uid"
max_groups_per_unit = 1
max_rows_per_unit = 4
[tables.t.columns]
x = {{ type = "{ctype}", lower = -100, upper = 100 }}
"""


@pytest.mark.parametrize("ctype", ["int", "float"])
@pytest.mark.parametrize("sql, expected", [
    # unit 1: x = [5, NULL] → SUM 5, MIN 5; unit 2: [NULL] → NULL (left out); unit 3: [−3] → −3.
    # Unguarded, GREATEST(NULL, −100) = −100 (DuckDB skips NULL arguments): −95, −100, −3.
    ("SELECT SUM(s) AS v FROM (SELECT uid, SUM(x) AS s FROM t GROUP BY uid) u", 2),
    ("SELECT SUM(m) AS v FROM (SELECT uid, MIN(x) AS m FROM t GROUP BY uid) u", 2),
    ("SELECT COUNT(*) AS v FROM (SELECT uid, SUM(x) AS s FROM t GROUP BY uid) u WHERE s IS NULL", 1),
])
def test_a_null_inside_a_per_unit_subquery_is_left_out_not_the_lower_bound(tmp_path, ctype, sql, expected):
    import dpgate.pipeline.planning  # noqa: F401 - installs the planner's table-less evaluator
    from dpgate.engines.duckdb import DuckDBEngine
    from dpgate.policy import load_policy
    from dpgate.sql.bound import bounded_query
    from dpgate.sql.parse import parse_query
    from dpgate.sql.sources import plan_policy

    src = tmp_path / "t.csv"
    src.write_text("uid,x\n1,5\n1,\n2,\n3,-3\n")
    (tmp_path / "nul.toml").write_text(_NULL_POLICY.format(src=src, ctype=ctype))
    engine = DuckDBEngine(load_policy(tmp_path / "nul.toml"))
    engine.load()
    try:
        plan = parse_query(sql, engine.policy)
        out = engine.execute(bounded_query(plan, plan_policy(plan, engine.policy), salt=5))
        (pid, value), = [(k, v) for k, v in out.items() if k.startswith("p")]
        prim = next(p for p in plan.primitives if p.id == pid)
        unit = 1.0 if prim.kind == "count" else plan_policy(plan, engine.policy).table(plan.table).column(
            prim.column).resolution  # a sum is released in fixed-point steps of its column
        assert round(float(value[0]) * unit, 6) == expected
    finally:
        engine.close()
