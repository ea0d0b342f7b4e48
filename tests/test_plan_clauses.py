"""Planner clauses that analysts' corpora use (docs/CORPUS.md): keys-only GROUP BY over public
keys, a public table read row by row, a number as a HAVING condition, CAST of a released key
in HAVING / ORDER BY, ORDER BY an expression over outputs, a per-row CAST in WHERE (TRY
semantics), a CASE key over a join referenced by its alias, raw-row refusals, selections over
computed keys, and the one message shape of nesting limits.

Planner-level tests build plans from a small policy; gateway-level tests run them on a small
synthetic CSV (no shared data) and check every refusal charges nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import sqlglot

from dpgate.errors import InvalidSql, UnknownColumn, UnsupportedQuery
from dpgate.policy import load_policy
from dpgate.postprocess import evaluate_predicate
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings
from dpgate.sql import partition_selection as selection
from dpgate.sql.parse import parse_query
from dpgate.sql.plan import DerivedOutput, KeyOutput
from dpgate.sql.public import exact_sql, public_key_columns, releases_public_keys_only
from dpgate.sql.rules import MAX_DEPTH, MAX_NESTING
from dpgate.sql.selection_query import recognize

POLICY = """
[dataset]
name = "gaps"
population = "gaps-people"
data_version = "v1"

[budget]
epsilon = 1e9
delta = 1e-6
default_query_rho = 1.0

[allocations]
analysts = 1.0

[tables.people]
source = "{dir}/people.csv"
privacy_unit = "pid"
max_groups_per_unit = 1
max_rows_per_unit = 1

[tables.people.columns]
pid     = {{ type = "int" }}
age     = {{ type = "int", lower = 0, upper = 99 }}
educ    = {{ type = "text", public_keys = ["1", "2", "3", "x"] }}
married = {{ type = "int", public_keys = [0, 1] }}
income  = {{ type = "int", lower = 0, upper = 1000 }}
city    = {{ type = "text" }}

[tables.visits]
source = "{dir}/visits.csv"
privacy_unit = "pid"
max_groups_per_unit = 4
max_rows_per_unit = 4

[tables.visits.columns]
pid  = {{ type = "int" }}
kind = {{ type = "text", public_keys = ["a", "b"] }}

[tables.cities]
source = "{dir}/cities.csv"
public = true

[tables.cities.columns]
name   = {{ type = "text" }}
region = {{ type = "text" }}
"""

N = 600
#: One row per person: educ "n/a" (outside the public keys, not a number) for every 7th.
PEOPLE = [(pid, 18 + pid % 80, "n/a" if pid % 7 == 0 else str(1 + pid % 3), pid % 2, (pid * 37) % 1001,
           "c" + str(pid % 4)) for pid in range(N)]
CITIES = [("Zurich", "ch"), ("Aarau", "ch"), ("Lyon", "fr")]


def _write(root: Path) -> Path:
    (root / "people.csv").write_text("pid,age,educ,married,income,city\n" + "".join(
        ",".join(map(str, r)) + "\n" for r in PEOPLE))
    (root / "visits.csv").write_text("pid,kind\n" + "".join(
        f"{pid},{'a' if pid % 3 else 'b'}\n" for pid in range(N)))
    (root / "cities.csv").write_text("name,region\n" + "".join(f"{a},{b}\n" for a, b in CITIES))
    policies = root / "policies"
    policies.mkdir()
    (policies / "gaps.toml").write_text(POLICY.format(dir=root))
    return policies / "gaps.toml"


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory) -> Path:
    return _write(tmp_path_factory.mktemp("gaps"))


@pytest.fixture(scope="module")
def policy(policy_file):
    return load_policy(policy_file)


@pytest.fixture
def gw(policy_file, tmp_path):
    g = Gateway.open(Settings(policies=policy_file.parent, home=tmp_path / "home"))
    yield g
    g.close()


def plan(sql, policy):
    return parse_query(sql, policy)


def ask(gw, sql):
    return gw.query("gaps", sql, consumer="analysts", budget=QueryBudget(rho=QueryBudget.MAX_RHO))


def refused_free(gw, sql, cls=UnsupportedQuery):
    """The refusal of ``sql`` (class ``cls``), checking that the ledger did not move."""
    before = len(gw.ledger_entries())
    with pytest.raises(cls) as e:
        ask(gw, sql)
    assert len(gw.ledger_entries()) == before
    assert e.value.details.get("charged") is False and "nothing was charged" in e.value.message
    return e.value


def within(released, exact, acc):
    scale = acc.get("sigma", acc.get("scale"))
    return abs(released - exact) <= 5 * scale + 1e-9


# --- keys only --------------------------------------------------------------------------------


def test_keys_only_over_public_keys_is_planned_without_primitives(policy):
    p = plan("SELECT educ FROM people GROUP BY educ", policy)
    assert p.primitives == () and releases_public_keys_only(p, policy)
    assert [list(v) for v in public_key_columns(p, policy).values()] == [["1", "2", "3", "x"]]
    two = plan("SELECT married AS m, educ FROM people GROUP BY married, educ ORDER BY married DESC", policy)
    cols = public_key_columns(two, policy)
    assert list(zip(cols["educ"], cols["married"])) == [(e, m) for e in ["1", "2", "3", "x"] for m in [0, 1]]
    # a key without public keys is still selected privately: a hidden noisy count, not free
    sel = plan("SELECT city FROM people GROUP BY city", policy)
    assert sel.primitives and not releases_public_keys_only(sel, policy)


def test_keys_only_release_is_the_public_key_list_and_free(gw):
    before = len(gw.ledger_entries())
    r = ask(gw, "SELECT married AS m, educ FROM people WHERE age > 90 GROUP BY married, educ "
                "ORDER BY married DESC, educ")
    assert r["charge"] is None and r["exact"] and r["public_keys_only"]
    assert r["columns"] == ["m", "educ"]
    assert r["rows"] == [[m, e] for m in (1, 0) for e in ["1", "2", "3", "x"]]
    assert len(gw.ledger_entries()) == before
    ex = gw.explain("gaps", "SELECT educ FROM people GROUP BY educ")
    assert ex["cost"]["rho"] == 0 and ex["public_keys_only"]
    # post-processing on the keys: HAVING and ORDER BY a cast of the text key (TRY semantics)
    r = ask(gw, "SELECT educ FROM people GROUP BY educ HAVING CAST(educ AS INTEGER) >= 2 "
                "ORDER BY CAST(educ AS INTEGER) DESC")
    assert r["rows"] == [["3"], ["2"]] and r["charge"] is None


def test_raw_rows_of_a_protected_table_are_refused_before_naming_columns(policy, gw):
    # an undeclared column in a raw-row query: the shape is what is refused (no unknown_column)
    with pytest.raises(UnsupportedQuery, match="raw column 'name'.*never released"):
        plan("SELECT name FROM people WHERE age > 95", policy)
    with pytest.raises(UnsupportedQuery, match="raw column 'age'"):
        plan("SELECT age FROM people", policy)
    with pytest.raises(UnsupportedQuery, match="computes no aggregate"):
        plan("SELECT 1 FROM people", policy)
    with pytest.raises(UnknownColumn):  # with an aggregate, the column is resolved as usual
        plan("SELECT name, COUNT(*) FROM people GROUP BY name", policy)
    refused_free(gw, "SELECT name FROM people WHERE age > 95")


def test_a_public_table_alone_is_read_row_by_row_exactly_and_free(policy, gw):
    p = plan("SELECT name, region FROM cities ORDER BY name", policy)
    assert p.group_by == () and all(isinstance(o, KeyOutput) for o in p.outputs)
    assert "GROUP BY" not in exact_sql(p, policy)
    r = ask(gw, "SELECT name, region FROM cities ORDER BY name")
    assert r["rows"] == [list(c) for c in sorted(CITIES)] and r["charge"] is None and r["exact"]
    r = ask(gw, "SELECT region FROM cities ORDER BY region DESC")  # rows, duplicates kept
    assert r["rows"] == [["fr"], ["ch"], ["ch"]]


# --- HAVING -----------------------------------------------------------------------------------


def test_a_number_as_a_having_condition_is_compared_with_zero(policy):
    p = plan("SELECT married, COUNT(*) AS n FROM people GROUP BY married HAVING married", policy)
    assert p.having == '"married" <> 0'
    q = plan("SELECT married, COUNT(*) AS n FROM people GROUP BY married HAVING n > 10 OR NOT married", policy)
    keep = evaluate_predicate(q.having, {"married": np.array([0, 1, 1]), "count": np.array([3.0, 30.0, 5.0])})
    assert keep.tolist() == [True, True, False]
    assert plan("SELECT married, COUNT(*) AS n FROM people GROUP BY married HAVING married <> 0",
                policy).plan_hash == p.plan_hash
    with pytest.raises(UnsupportedQuery, match="must be a condition"):
        plan("SELECT educ, COUNT(*) AS n FROM people GROUP BY educ HAVING educ", policy)


def test_cast_of_a_released_key_in_having_has_try_semantics(policy):
    p = plan("SELECT educ, COUNT(*) AS n FROM people GROUP BY educ HAVING CAST(educ AS INTEGER) > 1", policy)
    keys = np.array(["1", "2", "3", "x"], dtype=object)
    assert evaluate_predicate(p.having, {"educ": keys, "count": np.ones(4)}).tolist() == [False, True, True, False]
    q = plan("SELECT educ, COUNT(*) FROM people GROUP BY educ HAVING (COUNT(*) / CAST(educ AS INTEGER)) > 5",
             policy)
    assert q.having is not None
    with pytest.raises(UnsupportedQuery, match="CAST to DECIMAL"):
        plan("SELECT educ, COUNT(*) FROM people GROUP BY educ HAVING CAST(educ AS DECIMAL(4, 1)) > 1", policy)


def test_having_on_released_values_over_the_gateway(gw):
    r = ask(gw, "SELECT married, COUNT(*) AS n FROM people GROUP BY married HAVING married")
    assert [row[0] for row in r["rows"]] == [1]
    assert within(r["rows"][0][1], sum(1 for p in PEOPLE if p[3] == 1), r["accuracy"]["n"])
    r = ask(gw, "SELECT educ, COUNT(*) AS n FROM people GROUP BY educ HAVING CAST(educ AS INTEGER) > 2")
    assert [row[0] for row in r["rows"]] == ["3"]  # 'x' does not convert: NULL, not kept, no error


# --- ORDER BY expressions --------------------------------------------------------------------------


def test_order_by_an_expression_is_a_hidden_post_processing_output(policy):
    p = plan("SELECT educ, COUNT(*) AS n FROM people GROUP BY educ ORDER BY CAST(educ AS INTEGER) DESC", policy)
    derived = [o for o in p.outputs if isinstance(o, DerivedOutput)]
    assert len(derived) == 1 and derived[0].hidden and p.order_by[0].output == derived[0].name
    assert [o.name for o in p.visible_outputs] == ["educ", "count"]
    # titles first in ORDER BY: gender is the alias of sex
    q = plan("SELECT married AS gender, educ AS m FROM people GROUP BY married, educ "
             "ORDER BY (CAST(gender AS INTEGER) + 5) DESC", policy)
    assert '"married"' in [o for o in q.outputs if isinstance(o, DerivedOutput)][0].expression
    with pytest.raises(UnsupportedQuery, match="(?i)random"):
        plan("SELECT COUNT(*) FROM people ORDER BY random()", policy)
    with pytest.raises(UnsupportedQuery, match="raw column"):
        plan("SELECT COUNT(*) FROM people ORDER BY age + 1", policy)


def test_order_by_expressions_sort_the_release(gw):
    r = ask(gw, "SELECT educ, COUNT(*) AS n FROM people GROUP BY educ ORDER BY CAST(educ AS INTEGER) DESC")
    assert [row[0] for row in r["rows"]] == ["3", "2", "1", "x"]  # NULL (x) last, as DuckDB sorts
    assert r["columns"] == ["educ", "n"]
    # no GROUP BY: an expression over released aggregates
    r = ask(gw, "SELECT COUNT(*) AS N, SUM(income) AS S FROM people ORDER BY 2 * S / ((N + 300.11) / 2) DESC")
    assert len(r["rows"]) == 1 and r["columns"] == ["N", "S"]
    assert within(r["rows"][0][0], N, r["accuracy"]["N"])


def test_post_processing_errors_name_the_analysts_titles_not_internal_names(gw):
    e = refused_free(gw, "SELECT CASE WHEN age < 20 THEN 'a' ELSE 'b' END AS bin, COUNT(*) FROM people "
                         "GROUP BY bin ORDER BY bin + 1")
    assert "bin" in e.message and not re.search(r"\bg\d+\b", e.message + str(e.details)), e.message


# --- WHERE: a per-row CAST ---------------------------------------------------------------------------


def test_a_per_row_cast_in_where_runs_as_try_cast(policy):
    p = plan("SELECT COUNT(*) FROM people WHERE age > 70 AND CAST(educ AS INTEGER) < 2", policy)
    assert "TRY_CAST" in p.where and "CAST(\"educ\"" not in p.where.replace("TRY_CAST", "")
    assert p.plan_hash == plan("SELECT COUNT(*) FROM people WHERE age > 70 AND TRY_CAST(educ AS INT) < 2",
                               policy).plan_hash
    with pytest.raises(UnsupportedQuery, match="CAST"):  # a constant's cast is not per row: refused
        plan("SELECT COUNT(*) FROM people WHERE income > 'nan'::DOUBLE", policy)


def test_a_cast_that_fails_on_some_rows_filters_them_after_the_charge(gw):
    r = ask(gw, "SELECT COUNT(*) AS c FROM people WHERE age > 70 AND CAST(educ AS INTEGER) < 2")
    exact = sum(1 for p in PEOPLE if p[1] > 70 and p[2] != "n/a" and int(p[2]) < 2)
    assert r["charge"] is not None and within(r["rows"][0][0], exact, r["accuracy"]["c"])


@pytest.mark.parametrize("engine", ["postgres", "spark"])
def test_engines_without_try_refuse_a_text_cast_before_the_charge(engine):
    if engine == "spark":  # the Spark engine imports pyspark (the dpgate[spark] extra)
        pytest.importorskip("pyspark", reason="pyspark not installed (pip install 'dpgate[spark]')")
        from dpgate.engines.spark import _SparkPredicates as Rewriter
    else:
        from dpgate.engines.postgres import _PgPredicates as Rewriter

    from dpgate.sql.node_types import annotate

    # the planner types each node once (sql.node_types); the engines read those types
    tree = annotate(sqlglot.parse_one('TRY(TRY_CAST("educ" AS INT) < 2)', read="duckdb"),
                    lambda name: {"educ": "text"}.get(name, "?"))
    with pytest.raises(UnsupportedQuery, match="not supported in WHERE"):
        Rewriter(engine).rewrite(tree.copy())


# --- joins: a CASE key referenced by its alias ----------------------------------------------------


def test_a_case_key_over_a_unit_join_is_grouped_by_its_alias(policy, gw):
    sql = ("SELECT CASE WHEN p.age < 40 THEN 'young' ELSE 'old' END AS binned_age, v.kind, COUNT(*) AS n "
           "FROM visits v JOIN people p ON v.pid = p.pid GROUP BY binned_age, v.kind")
    p = plan(sql, policy)
    assert len(p.computed_keys) == 1 and p.computed_keys[0].domain == ("young", "old")
    r = ask(gw, sql)
    exact = {}
    for pid, age, *_ in PEOPLE:
        key = ("young" if age < 40 else "old", "a" if pid % 3 else "b")
        exact[key] = exact.get(key, 0) + 1
    assert {(a, k) for a, k, _ in r["rows"]} == set(exact)
    assert all(within(n, exact[(a, k)], r["accuracy"]["n"]) for a, k, n in r["rows"])


# --- selections and partition selection over computed keys ---------------------------------------


def test_computed_keys_with_a_selected_key(policy, gw):
    sql = "SELECT FLOOR(age / 10) * 10 AS decade, city, COUNT(*) AS n FROM people GROUP BY decade, city"
    p = plan(sql, policy)
    assert selection.public_combinations(p, policy) == len(p.computed_keys[0].domain)
    r = ask(gw, sql)  # failed with unknown_column 'g0' after the charge
    assert r["charge"] is not None and r["rows"] and r["columns"] == ["decade", "city", "n"]
    # a selection (keys only, ORDER BY an aggregate, LIMIT) over a key without public keys
    sel = ("SELECT FLOOR(age / 10) * 10 AS decade, city FROM people GROUP BY decade, city "
           "ORDER BY COUNT(*) DESC LIMIT 1")
    with pytest.raises(UnsupportedQuery, match="city has no public keys") as e:
        recognize(plan(sel, policy), policy)
    assert e.value.details["reason"] == "no_public_candidates"
    e = refused_free(gw, sel)
    assert "g0" not in e.message
    # over a computed key alone it selects
    r = ask(gw, "SELECT FLOOR(age / 10) * 10 AS decade FROM people GROUP BY decade ORDER BY COUNT(*) DESC LIMIT 1")
    assert r["columns"] == ["decade"] and len(r["rows"]) == 1


# --- nesting limits: one message shape ---------------------------------------------------------------

_NESTING = re.compile(r"^the query nests (expressions|conditions|subqueries) (\d+|more than \d+) levels deep; "
                      r"the planner accepts at most \d+ \(.+\) \(nothing was charged\)$")


@pytest.mark.parametrize("sql, limit", [
    ("SELECT COUNT(*) FROM people WHERE " + "(" * 3000 + "age > 1" + ")" * 3000, MAX_NESTING),  # the parser
    ("SELECT COUNT(*) FROM people WHERE " + " + ".join(["age"] * 400) + " > 1", MAX_NESTING),  # check_nesting
    ("SELECT COUNT(*) FROM " + "(SELECT * FROM " * (MAX_DEPTH + 2) + "people" + ") s" * (MAX_DEPTH + 2),
     MAX_DEPTH),  # nested subqueries
])
def test_nesting_limits_have_one_message_shape(policy, gw, sql, limit):
    with pytest.raises(UnsupportedQuery) as e:
        plan(sql, policy)
    assert _NESTING.match(e.value.message), e.value.message
    assert e.value.details["reason"] == "nesting" and e.value.details["max"] == limit
    assert not isinstance(e.value, InvalidSql)
    refused_free(gw, sql)


#: Queries whose expression depth (dpgate.sql.rules.expression_depth) is exactly n, one per
#: construct that costs the parser or the planner most per level (measured: nested ABS in a WHERE
#: is the costliest, ~50 frames per level, as the planner parses its canonical SQL again with each
#: ABS in TRY(…)).
_W = "SELECT COUNT(*) FROM people WHERE "
_AT_DEPTH = {
    "parentheses": lambda n: _W + "(" * (n - 1) + "age > 1" + ")" * (n - 1),
    "NOT": lambda n: _W + "NOT " * (n - 1) + "age > 1",
    "ABS in WHERE": lambda n: _W + "ABS(" * (n - 1) + "age" + ")" * (n - 1) + " > 3",
    "+ chain in WHERE": lambda n: _W + "age + " * (n - 1) + "1 > 3",
    "LEAST in WHERE": lambda n: _W + "LEAST(" * (n - 1) + "age" + ", 5)" * (n - 1) + " > 3",
    "ABS in SUM": lambda n: "SELECT SUM(" + "ABS(" * (n - 1) + "age" + ")" * (n - 1) + ") FROM people",
    "ABS in HAVING": lambda n: ("SELECT educ, COUNT(*) AS c FROM people GROUP BY educ HAVING "
                                + "ABS(" * (n - 1) + "c" + ")" * (n - 1) + " > 3"),
    "ABS in a per-unit WHERE": lambda n: ("SELECT COUNT(*) FROM (SELECT pid, COUNT(*) AS c FROM people WHERE "
                                          + "ABS(" * (n - 1) + "age" + ")" * (n - 1) + " > 3 GROUP BY pid) u"),
    "merged projections": lambda n: ("SELECT COUNT(*) FROM " + "(SELECT ABS(age) AS age FROM " * (n - 1)
                                     + "people" + ") s" * (n - 1) + " WHERE age > 1"),
}


def _from_a_deep_caller(frames: int, fn):
    """``fn()`` called ``frames`` Python frames deep (an HTTP server's stack is ~10; 300 is ample)."""
    return fn() if frames <= 0 else _from_a_deep_caller(frames - 1, fn)


@pytest.mark.parametrize("construct", sorted(_AT_DEPTH))
def test_the_stated_nesting_limit_is_the_enforced_one(policy, construct):
    # Issue 19 item 11: the message said "more than 200 levels" where the parser refused ~45
    # parentheses. At MAX_NESTING levels every construct is planned, from a caller 300 frames
    # deep; at MAX_NESTING + 1 it is refused by the rule, naming the depth and the limit.
    from dpgate.sql.rules import expression_depth

    make = _AT_DEPTH[construct]
    ok = make(MAX_NESTING)
    if construct not in ("merged projections", "ABS in a per-unit WHERE"):  # rewritten before the check
        assert expression_depth(sqlglot.parse_one(ok, read="duckdb")) == MAX_NESTING
    _from_a_deep_caller(300, lambda: plan(ok, policy))
    with pytest.raises(UnsupportedQuery) as e:
        _from_a_deep_caller(300, lambda: plan(make(MAX_NESTING + 1), policy))
    assert e.value.message.startswith(
        f"the query nests expressions {MAX_NESTING + 1} levels deep; the planner accepts at most {MAX_NESTING} (")
    assert e.value.details == {"reason": "nesting", "kind": "expressions", "depth": MAX_NESTING + 1,
                               "max": MAX_NESTING, "charged": False}


def test_a_chain_of_conditions_has_its_own_limit(policy):
    from dpgate.sql.rules import MAX_TREE_DEPTH

    chain = lambda n: _W + " AND ".join(f"age > {i}" for i in range(n))  # noqa: E731 - tree depth n + 4
    _from_a_deep_caller(300, lambda: plan(chain(MAX_TREE_DEPTH - 4), policy))
    with pytest.raises(UnsupportedQuery) as e:
        plan(chain(MAX_TREE_DEPTH - 3), policy)
    assert e.value.details["kind"] == "conditions" and e.value.details["depth"] == MAX_TREE_DEPTH + 1
    assert "IN (…)" in e.value.message


def test_explain_of_a_keys_only_query(policy):
    from dpgate.sql.explain import explain_query

    d = explain_query("SELECT educ FROM people GROUP BY educ", policy)
    assert d["public_keys_only"] and d["bounded_sql"] is None and d["sensitivities"] == {}
    assert "public_keys_only" not in explain_query("SELECT educ, COUNT(*) FROM people GROUP BY educ", policy)


def test_a_keys_only_release_does_not_depend_on_the_data(policy_file, tmp_path):
    # neighbouring datasets (one unit removed, here: every unit with educ '3') give the same release
    root = tmp_path / "fewer"
    root.mkdir()
    (root / "policies").mkdir()
    people = (policy_file.parent.parent / "people.csv").read_text().splitlines()
    (root / "people.csv").write_text("\n".join([people[0]] + [r for r in people[1:] if r.split(",")[2] != "3"]) + "\n")
    for name in ("visits.csv", "cities.csv"):
        (root / name).write_text((policy_file.parent.parent / name).read_text())
    (root / "policies" / "gaps.toml").write_text(POLICY.format(dir=root))
    sql = "SELECT educ, married FROM people GROUP BY educ, married ORDER BY educ DESC"
    rows = []
    for folder in (policy_file.parent, root / "policies"):
        g = Gateway.open(Settings(policies=folder, home=tmp_path / f"home{len(rows)}"))
        try:
            rows.append(ask(g, sql)["rows"])
        finally:
            g.close()
    assert rows[0] == rows[1] and ["3", 0] in rows[1]


@pytest.mark.parametrize("sql, text", [
    ("SELECT educ, COUNT(*) AS n FROM people GROUP BY educ HAVING educ", "must be a condition"),
    ("SELECT educ, COUNT(*) FROM people GROUP BY educ HAVING CAST(educ AS DECIMAL(4, 1)) > 1", "CAST to DECIMAL"),
    ("SELECT COUNT(*) FROM people WHERE income > 'nan'::DOUBLE", "CAST"),
    ("SELECT COUNT(*) FROM people WHERE CAST(educ AS DECIMAL(4, 1)) > 1", "TRY_CAST to DECIMAL"),
    ("SELECT educ, COUNT(*) AS n FROM people GROUP BY educ ORDER BY educ * 2", "educ is text"),
    ("SELECT COUNT(*) FROM people ORDER BY age + 1", "raw column"),
    ("SELECT age FROM people", "raw column 'age'"),
])
def test_refusals_of_these_clauses_charge_nothing(gw, sql, text):
    e = refused_free(gw, sql)
    assert text in e.message, e.message


def test_a_row_by_row_read_of_a_public_table_is_capped(policy, gw, monkeypatch):
    import dpgate.pipeline.runners as runners
    import dpgate.sql.public as public

    p = plan("SELECT name FROM cities", policy)
    assert exact_sql(p, policy).endswith(f"LIMIT {public.MAX_PUBLIC_ROWS + 1}")
    assert exact_sql(plan("SELECT name FROM cities LIMIT 2", policy), policy).endswith("LIMIT 2")
    monkeypatch.setattr(public, "MAX_PUBLIC_ROWS", 2)
    monkeypatch.setattr(runners, "MAX_PUBLIC_ROWS", 2)
    with pytest.raises(UnsupportedQuery, match="more than 2 rows"):
        ask(gw, "SELECT name FROM cities")
    assert ask(gw, "SELECT name FROM cities ORDER BY name LIMIT 2")["rows"] == [["Aarau"], ["Lyon"]]
