"""Golden compile fixtures (issue 20 step 1, "Safety net"): risky queries → plan hash, canonical
form and the SQL every engine would run, pinned byte for byte.

For each query of :data:`QUERIES` the file ``tests/fixtures/golden/compile/<name>.json`` holds

* ``plan_hash``, ``canonical_sql`` and the canonical plan (:meth:`QueryPlan.canonical_dict`,
  what the hash is computed from), the released ``columns`` and the release strategy the planner
  picks today (``strategy``: public, public_keys_only, top_k, partition_selection, quantiles);
* ``sensitivities`` (per primitive: L1, L2, L∞, groups) and ``contribution`` (unit, k, m) as
  ``explain`` reports them;
* ``templates``: the bounded SQL template (salt shown as ``<salt>``), the quantile histogram
  templates and the exact SQL of a public-only query, as :func:`dpgate.sql.explain.explain_query`
  gives them;
* ``engines``: per engine (``duckdb``, ``postgres``, ``spark``) the statements the engine would
  run with salt 0 — ``engine.render(statement)`` of the same statements the gateway binds before
  the charge — or the refusal (error class and message) when the engine refuses in ``render``;
  tables with one row per unit also in the fast path (``engines_unit_unique``).

The renderings need no server: tests/_golden_render.py builds each engine's load state from the
policy alone (PostgreSQL's projections through the engine's own ``_check_table`` and a fake
catalogue; Spark's view names; no session, no JVM). When pyspark is not installed the Spark
rendering is skipped, not failed (``spark`` is then absent from the comparison).

Policies: the repository's ``policies/usage.toml`` (the quickstart's sample dataset) and the
corpus's ``tests/fixtures/policies/corpus/library_catalog.toml`` (two protected tables of one
population, two public tables), with its ``{library}`` placeholder replaced by ``/golden/library``
so that nothing depends on a temporary path. Planning reads no data.

**Regenerate** after an intended change (then review the diff: every changed hash and every
changed statement shows up there)::

    DPGATE_REGEN_GOLDEN=1 python -m pytest -p no:cacheprovider tests/test_compile_golden.py

Without the variable, a missing or different file fails the test. Issue 20's redesign must keep
these files byte-identical (its "Done means": every golden hash identical).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _golden_render import duckdb_engine, postgres_engine, spark_engine

from dpgate.errors import DpgateError
from dpgate.policy import DatasetPolicy, load_policy
from dpgate.sql.bound import bounded_query
from dpgate.sql.explain import explain_query
from dpgate.sql.sources import TableSource, plan_policy
from dpgate.sql.parse import parse_query
from dpgate.sql.public import exact_query, reads_public_only, releases_public_keys_only
from dpgate.sql.quantile import histogram_query

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GOLDEN = HERE / "fixtures" / "golden" / "compile"
REGEN = os.environ.get("DPGATE_REGEN_GOLDEN") == "1"

#: name → (dataset, analyst SQL). The comment says what makes the query risky.
QUERIES: dict[str, tuple[str, str]] = {
    # fast path and plain public keys
    "count_star": ("usage", "SELECT COUNT(*) FROM prompts"),
    "group_public_keys": ("usage", "SELECT region, week, COUNT(*) AS n, SUM(tokens) AS t FROM prompts "
                                   "GROUP BY region, week"),
    "where_having": ("usage", "SELECT region, AVG(duration_s) AS d FROM sessions WHERE week < 10 "
                              "GROUP BY region HAVING COUNT(*) > 5"),
    # joins: protected × protected on the unit, × a public table, a chain of both
    "join_protected_on_unit": ("library_catalog",
                               "SELECT m.gender, COUNT(*) AS n, SUM(m.books_borrowed) AS b FROM checkouts c "
                               "JOIN members m ON c.member_id = m.id GROUP BY m.gender"),
    "join_public_table": ("library_catalog",
                          "SELECT g.category, COUNT(*) AS n FROM checkouts c JOIN genres g ON c.genre = g.genre "
                          "GROUP BY g.category"),
    "join_public_table_keys": ("library_catalog",
                               "SELECT g.genre, g.category, COUNT(*) AS n FROM checkouts c JOIN genres g "
                               "ON c.genre = g.genre GROUP BY g.genre, g.category"),
    "join_chain": ("library_catalog",
                   "SELECT m.gender, g.category, COUNT(*) AS n FROM checkouts c JOIN members m ON m.id = c.member_id "
                   "JOIN genres g ON g.genre = c.genre GROUP BY m.gender, g.category"),
    "join_computed_key": ("library_catalog",
                          "SELECT CASE WHEN m.age < 20 THEN 'under 20' WHEN m.age < 40 THEN '20-39' "
                          "WHEN m.age < 60 THEN '40-59' ELSE '60+' END AS binned_age, c.genre, COUNT(*) AS n "
                          "FROM checkouts c JOIN members m ON c.member_id = m.id GROUP BY binned_age, c.genre"),
    # per-unit subqueries
    "per_unit_avg": ("usage", "SELECT AVG(total) AS avg_seconds FROM (SELECT user_id, SUM(duration_s) AS total "
                              "FROM sessions GROUP BY user_id) AS per_user"),
    "per_unit_histogram": ("usage", "SELECT LEAST(n, 20) AS sessions_per_user, COUNT(*) AS users FROM "
                                    "(SELECT user_id, COUNT(*) AS n FROM sessions GROUP BY user_id) AS per_user "
                                    "GROUP BY sessions_per_user"),
    "per_unit_having": ("usage", "SELECT COUNT(*) AS heavy_users FROM (SELECT user_id, COUNT(*) AS n FROM prompts "
                                 "WHERE region = 'eu' GROUP BY user_id) u WHERE n > 10"),
    # quantiles, MIN/MAX
    "median_by_key": ("usage", "SELECT region, MEDIAN(tokens) AS median_tokens FROM prompts GROUP BY region"),
    "percentile_within_group": ("library_catalog",
                                "SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY books_borrowed) AS p90 "
                                "FROM members"),
    "quantiles_with_count": ("usage", "SELECT region, COUNT(*) AS n, QUANTILE_CONT(duration_s, 0.25) AS q1 "
                                      "FROM sessions GROUP BY region"),
    "min_max": ("usage", "SELECT region, MIN(tokens) AS lo, MAX(tokens) AS hi FROM prompts GROUP BY region"),
    # partition selection (a key without public keys)
    "partition_selection": ("usage", "SELECT model, COUNT(*) AS n FROM prompts GROUP BY model"),
    "partition_selection_mixed": ("usage", "SELECT region, model, SUM(tokens) AS t FROM prompts "
                                           "GROUP BY region, model"),
    # COUNT(DISTINCT col)
    "count_distinct_column": ("usage", "SELECT region, COUNT(DISTINCT model) AS models FROM prompts "
                                       "GROUP BY region"),
    "count_distinct_unit": ("usage", "SELECT week, COUNT(DISTINCT user_id) AS users FROM prompts GROUP BY week"),
    # computed keys: CASE, bins, date_trunc, EXTRACT
    "computed_case": ("library_catalog",
                      "SELECT CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'mid' ELSE 'old' END AS band, "
                      "COUNT(*) AS n FROM members GROUP BY band"),
    "computed_bin": ("library_catalog", "SELECT age / 10 AS decade, COUNT(*) AS n FROM members GROUP BY decade"),
    "computed_floor_bin": ("usage", "SELECT FLOOR(week / 13) AS quarter, SUM(tokens) AS t FROM prompts "
                                    "GROUP BY quarter"),
    "computed_date_trunc": ("library_catalog",
                            "SELECT date_trunc('month', checkout_date) AS month, COUNT(*) AS n FROM checkouts "
                            "GROUP BY month ORDER BY month"),
    "computed_extract": ("library_catalog",
                         "SELECT EXTRACT(year FROM date_joined) AS year_joined, AVG(books_borrowed) AS books "
                         "FROM members GROUP BY year_joined"),
    # public-only and keys-only (free), top-k
    "public_only": ("library_catalog", "SELECT category, COUNT(*) AS n FROM genres GROUP BY category"),
    "public_only_join": ("library_catalog",
                         "SELECT g.category, COUNT(*) AS n FROM books b JOIN genres g ON b.genre = g.genre "
                         "GROUP BY g.category"),
    "keys_only": ("usage", "SELECT region, week FROM prompts GROUP BY region, week"),
    "keys_only_public_join": ("library_catalog",
                              "SELECT b.title, b.author FROM checkouts c JOIN books b ON c.isbn = b.isbn "
                              "GROUP BY b.title, b.author"),
    "top_k": ("usage", "SELECT region, SUM(tokens) AS s FROM prompts GROUP BY region ORDER BY s DESC LIMIT 3"),
    "top_k_selection": ("usage", "SELECT model, COUNT(*) AS n FROM prompts GROUP BY model ORDER BY n DESC LIMIT 5"),
}

#: Tables rendered also in the fast path (one row per unit at load: the per-unit step skipped).
UNIT_UNIQUE = {"library_catalog": ("members",), "usage": ()}


def _policies() -> dict[str, DatasetPolicy]:
    out = {"usage": load_policy(ROOT / "policies" / "usage.toml")}
    text = (HERE / "fixtures" / "policies" / "corpus" / "library_catalog.toml").read_text()
    return out | {"library_catalog": _load_text(text.replace("{library}", "/golden/library"))}


def _load_text(text: str) -> DatasetPolicy:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "library_catalog.toml"
        path.write_text(text)
        return load_policy(path)


@pytest.fixture(scope="module")
def policies() -> dict[str, DatasetPolicy]:
    return _policies()


@pytest.fixture(scope="module")
def engines(policies) -> dict[str, dict[str, Any]]:
    """dataset → {mode → {engine name → engine}} (mode "general" or "unit_unique")."""
    out: dict[str, dict[str, Any]] = {}
    for name, policy in policies.items():
        out[name] = {}
        for mode, unique in (("general", ()), ("unit_unique", UNIT_UNIQUE[name])):
            made = {"duckdb": duckdb_engine(policy, unique), "postgres": postgres_engine(policy, unique)}
            spark = spark_engine(policy, unique)
            if spark is not None:
                made["spark"] = spark
            out[name][mode] = made
    yield out
    for modes in out.values():
        for made in modes.values():
            made["duckdb"].close()


def strategy(plan, policy: DatasetPolicy) -> dict[str, Any]:
    """The release strategy the planner's flags pick today (issue 20 step 5 makes it one value)."""
    return {
        "public": reads_public_only(plan, policy),
        "public_keys_only": releases_public_keys_only(plan, policy),
        "top_k": plan.limit is not None,
        "partition_selection": list(plan.selected_keys),
        "quantiles": sorted(p.id for p in plan.primitives if p.kind == "quantile"),
        "primitives": [f"{p.id}:{p.kind}:{p.column or ''}" for p in plan.primitives],
    }


def statements(plan, policy: DatasetPolicy, *, unit_unique: bool) -> list:
    """The trees the gateway hands the engine for ``plan`` with salt 0 (the runners' prepare,
    dpgate.pipeline.runners; the exact query of a public-only query; none for a keys-only query)."""
    if reads_public_only(plan, policy):
        return [exact_query(plan, policy)]
    if releases_public_keys_only(plan, policy):
        return []
    quantile_columns = list(dict.fromkeys(p.column for p in plan.primitives if p.kind == "quantile"))
    base = replace(plan, primitives=tuple(p for p in plan.primitives if p.kind != "quantile"))
    out = [bounded_query(base, policy, salt=0, unit_unique=unit_unique)] if base.primitives else []
    return out + [histogram_query(plan, policy, c, salt=0) for c in quantile_columns]


def _render(engine, tree) -> str | dict[str, str]:
    try:
        return engine.render(tree)
    except DpgateError as e:
        return {"refused": type(e).__name__, "message": e.message}


def compile_document(name: str, policies, engines) -> dict[str, Any]:
    dataset, sql = QUERIES[name]
    policy = policies[dataset]
    explained = explain_query(sql, policy)
    plan = parse_query(sql, policy)
    table_policy = plan_policy(plan, policy)
    doc: dict[str, Any] = {
        "dataset": dataset,
        "sql": sql,
        "plan_hash": explained["plan_hash"],
        "canonical_sql": explained["canonical_sql"],
        "canonical_plan": plan.canonical_dict(),
        "columns": explained["columns"],
        "strategy": strategy(plan, table_policy),
        "sensitivities": explained.get("sensitivities"),
        "contribution": explained.get("contribution"),
        "templates": {
            "bounded_sql": explained.get("bounded_sql"),
            "quantiles": explained.get("quantiles"),
            "exact_sql": explained.get("exact_sql"),
        },
        "engines": {},
    }
    for mode in ("general", "unit_unique"):
        joined = not isinstance(plan.source, TableSource)
        fast = mode == "unit_unique"
        if fast and (joined or plan.table not in UNIT_UNIQUE[dataset]):
            continue  # the gateway takes the fast path only on a unit-unique table read alone
        rendered = {engine_name: [_render(engine, s) for s in statements(plan, table_policy, unit_unique=fast)]
                    for engine_name, engine in engines[dataset][mode].items()}
        doc["engines" if not fast else "engines_unit_unique"] = rendered
    return doc


def _dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_enough_risky_queries():
    assert len(QUERIES) >= 25


def compare(name: str, doc: dict[str, Any], stored: dict[str, Any]) -> None:
    """AssertionError naming what changed: the hash, the canonical SQL, an engine's SQL, or the rest."""
    stored = json.loads(json.dumps(stored))
    if "spark" not in doc["engines"]:  # pyspark not installed: compare the other engines
        for key in ("engines", "engines_unit_unique"):
            (stored.get(key) or {}).pop("spark", None)
    assert stored["plan_hash"] == doc["plan_hash"], f"{name}: the plan hash changed"
    assert stored["canonical_sql"] == doc["canonical_sql"], f"{name}: the canonical SQL changed"
    for key in ("engines", "engines_unit_unique"):
        for engine_name, rendered in (doc.get(key) or {}).items():
            assert (stored.get(key) or {}).get(engine_name) == rendered, f"{name}: the {engine_name} SQL changed ({key})"
    assert json.loads(_dumps(doc)) == stored, f"{name}: the golden document changed"


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_compile_golden(name, policies, engines):
    doc = compile_document(name, policies, engines)
    path = GOLDEN / f"{name}.json"
    if REGEN:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(_dumps(doc))
    assert path.exists(), f"missing {path}; run with DPGATE_REGEN_GOLDEN=1 and review the diff"
    compare(name, doc, json.loads(path.read_text()))


def test_golden_files_are_exactly_the_queries():
    """No stale fixture: every file is a query of :data:`QUERIES` (a renamed query leaves none)."""
    assert {p.stem for p in GOLDEN.glob("*.json")} == set(QUERIES)


@pytest.mark.parametrize("what, mutate", [
    ("plan hash", lambda d: d.__setitem__("plan_hash", "0" * 64)),
    ("canonical SQL", lambda d: d.__setitem__("canonical_sql", d["canonical_sql"] + " ")),
    ("duckdb SQL", lambda d: d["engines"]["duckdb"].__setitem__(0, d["engines"]["duckdb"][0].replace("30", "31", 1))),
    ("postgres SQL", lambda d: d["engines"]["postgres"].__setitem__(0, d["engines"]["postgres"][0] + " ")),
    ("golden document", lambda d: d["strategy"].__setitem__("top_k", True)),
])
def test_a_changed_hash_or_statement_fails(what, mutate, policies, engines):
    """The comparison can fail: one perturbed field of a stored file is reported by name."""
    doc = compile_document("join_chain", policies, engines)
    stored = json.loads((GOLDEN / "join_chain.json").read_text())
    compare("join_chain", doc, stored)
    mutate(stored)
    with pytest.raises(AssertionError, match=what):
        compare("join_chain", doc, stored)


def test_rendering_spark_sql_starts_no_spark(policies, engines):
    """The Spark renderings are built without a session: no SparkContext, no JVM (fast tier)."""
    pyspark = pytest.importorskip("pyspark")
    if any("spark" not in made for modes in engines.values() for made in modes.values()):
        pytest.skip("the Spark engine module does not import (pyspark missing)")
    before = pyspark.SparkContext._active_spark_context  # another test file in this process may have one
    for name in ("join_chain", "median_by_key", "public_only"):
        compile_document(name, policies, engines)
    assert pyspark.SparkContext._active_spark_context is before  # rendering started none
    assert all(engine["spark"]._spark is None for modes in engines.values() for engine in modes.values())
