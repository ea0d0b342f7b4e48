"""Problems a fresh-user trial of dpgate found (each test failed before its fix).

1. explain's "before paying" checks (bounds, AVG at n₀ rows, warnings) for joined tables and
   per-unit subqueries, whose plan names a virtual table the dataset policy does not declare.
"""

from __future__ import annotations

import pytest
from _library import csv_text, write_library
from test_explain_warnings import dg_halfwidth
from test_joins import GENRES, TABLES

from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings


@pytest.fixture
def lib(tmp_path):
    policies = write_library(tmp_path / "p", TABLES, genres_csv=csv_text("genre,category", GENRES),
                             epsilon=100000.0, members=True)
    with Gateway.open(Settings(policies=policies, home=tmp_path / "home")) as gw:
        yield gw


def _out(doc, label):
    return next(o for o in doc["expected_accuracy"]["outputs"] if o["label"] == label)


def _avg_at(doc, label, n0, hi):
    """The AVG's ± at n0 rows, (t_S + M·t_C)/(n0 − t_C), from the oracle's 97.5 % half-widths."""
    o = next(o for o in doc["plan"]["outputs"] if o["name"] == _out(doc, label)["name"])
    kinds = {p["id"]: p["kind"] for p in doc["plan"]["primitives"]}
    s = next(i for i in o["primitives"] if kinds[i] == "sum")
    c = next(i for i in o["primitives"] if kinds[i] != "sum")
    t_s, t_c = dg_halfwidth(doc["noise_scales"][s], 0.025), dg_halfwidth(doc["noise_scales"][c], 0.025)
    return (t_s + hi * t_c) / (n0 - t_c)


@pytest.mark.parametrize("sql, bounds", [
    # a public table joined on a declared column: pages keeps checkouts' bounds [0, 1000]
    ("SELECT g.category, SUM(c.pages) AS s, AVG(c.pages) AS a FROM checkouts c JOIN genres g "
     "ON g.genre = c.genre GROUP BY g.category", {"s": (0.0, 1000.0), "a": (0.0, 1000.0)}),
    # two protected tables on the unit: members' age keeps its bounds [0, 120]
    ("SELECT m.edu, AVG(m.age) AS a FROM checkouts c JOIN members m ON c.member_id = m.id GROUP BY m.edu",
     {"a": (0.0, 120.0)}),
    # a per-unit subquery: t's range is the per-unit sum's, 2 groups × 3 rows × [0, 1000]
    ("SELECT AVG(t) AS a FROM (SELECT member_id, SUM(pages) AS t FROM checkouts GROUP BY member_id) u",
     {"a": (0.0, 6000.0)}),
])
def test_explain_compares_joined_and_per_unit_outputs_with_their_bounds(lib, sql, bounds):
    doc = lib.explain("lib", sql, budget=QueryBudget(rho=0.0001), reference_rows=1000)
    for label, (lo, hi) in bounds.items():
        out = _out(doc, label)
        assert out["bounds"] == {"lower": lo, "upper": hi, "width": hi - lo}
        if out["function"] == "avg":
            assert out["ci95_at_reference_rows"] == pytest.approx(_avg_at(doc, label, 1000, hi), rel=1e-12)
    # at ρ = 1e-4 every SUM and AVG here is swamped at the default 100 rows: each is warned about
    warnings = lib.explain("lib", sql, budget=QueryBudget(rho=0.0001))["expected_accuracy"]["warnings"]
    assert sorted(w["output"] for w in warnings) == sorted(bounds)
    assert all(w["code"] == "ci95_exceeds_bounds_width" for w in warnings)
