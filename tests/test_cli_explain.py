"""``dpgate explain`` goes through the gateway's explain, as ``POST /v1/queries/explain`` does
(issue 19, item 8): joins and per-unit subqueries were answered ``unknown_table`` by the CLI
(it planned against the policy's declared tables only) while HTTP explain worked.

The corpus's library (members, checkouts and the public ``books``/``genres`` catalog,
``tests/corpus/library.py``) with 200 members; each test has its own gateway state.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpgate.cli import exits, main
from dpgate.jsonsafe import json_safe
from dpgate.service import Gateway
from dpgate.settings import Settings
from tests.corpus.harness import POLICY_DIR
from tests.corpus.library import write_library

JOIN_PUBLIC = "SELECT g.category, COUNT(*) AS n FROM checkouts c JOIN genres g ON c.genre = g.genre GROUP BY g.category"
JOIN_PROTECTED = ("SELECT m.gender, COUNT(*) AS n FROM checkouts c JOIN members m ON c.member_id = m.id "
                  "GROUP BY m.gender")
PER_UNIT = ("SELECT AVG(n) AS avg_checkouts FROM (SELECT member_id, COUNT(*) AS n FROM checkouts "
            "GROUP BY member_id) AS per_member")


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("library")
    write_library(root / "data", members=200)
    (root / "policies").mkdir()
    text = (POLICY_DIR / "library_catalog.toml").read_text().replace("{library}", str(root / "data"))
    (root / "policies" / "library_catalog.toml").write_text(text)
    return root / "policies"


def _explain(capsys, policies: Path, home: Path, sql: str, *flags: str) -> tuple[int, str, str]:
    code = main(["explain", "--dataset", "library_catalog", "--policies", str(policies), "--home", str(home),
                 *flags, sql])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("sql, shows", [
    (JOIN_PUBLIC, "join          checkouts ⋈ genres: after the join"),
    (JOIN_PROTECTED, "join          checkouts ⋈ members: after the join"),
    (PER_UNIT, "per unit      checkouts (unit member_id): before the inner aggregates"),
])
def test_cli_explains_joins_and_per_unit_queries(library, tmp_path, capsys, sql, shows):
    code, out, err = _explain(capsys, library, tmp_path / "home", sql)
    assert code == 0, err
    assert shows in out
    assert "privacy unit  member_id" in out and "bounded SQL (salt hidden):" in out
    assert out.startswith("dataset       library_catalog")  # loading lines go to stderr
    assert "cost          ρ " in out and "fits          yes" in out


@pytest.mark.parametrize("sql", [JOIN_PUBLIC, JOIN_PROTECTED, PER_UNIT])
def test_cli_explain_json_is_the_http_document(library, tmp_path, capsys, sql):
    """The ``--json`` document is :meth:`Gateway.explain`'s, as the HTTP endpoint answers it."""
    code, out, err = _explain(capsys, library, tmp_path / "home", sql, "--json")
    assert code == 0, err
    with Gateway.open(Settings(policies=library, home=tmp_path / "home")) as gw:
        want = json.loads(json.dumps(json_safe(gw.explain("library_catalog", sql, consumer=_analysts(gw, "library_catalog"))), default=str))
    assert json.loads(out) == want
    assert want["contribution"]["privacy_unit"] == "member_id"


def test_cli_explain_budget_and_consumer_flags(library, tmp_path, capsys):
    """The budget flags are ``dpgate query``'s; the fit is checked against ``--consumer``."""
    code, out, err = _explain(capsys, library, tmp_path / "home", JOIN_PUBLIC, "--json", "--rho", "0.5",
                              "--consumer", "analysts")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["cost"]["rho"] == pytest.approx(0.5) and doc["budget"] == {"rho": 0.5}
    assert "consumer 'analysts'" in doc["cost"]["message"]
    code, _, err = _explain(capsys, library, tmp_path / "home", JOIN_PUBLIC, "--rho", "-1")
    assert code == exits.USAGE and "[invalid_budget]" in err


def test_cli_explain_refusals_of_joins_are_sentences(library, tmp_path, capsys):
    code, out, err = _explain(capsys, library, tmp_path / "home",
                              "SELECT g.nope, COUNT(*) FROM checkouts c JOIN genres g ON c.genre = g.genre GROUP BY 1")
    assert code != 0 and out == ""
    assert err.splitlines()[-1].startswith("dpgate: error: ") and "[unknown_column]" in err
    # a typo in the dataset answers before any data is loaded
    code = main(["explain", "--dataset", "library_catalg", "--policies", str(library), "--home",
                 str(tmp_path / "home"), JOIN_PUBLIC])
    err = capsys.readouterr().err
    assert code == exits.NOT_FOUND and "did you mean 'library_catalog'" in err


@pytest.mark.parametrize("sql", [JOIN_PROTECTED, PER_UNIT])
def test_the_planners_explain_reads_joins_and_per_unit_tables(library, sql):
    """:func:`dpgate.sql.explain.explain_query` (the policy alone, no data) resolves the plan's
    joined or per-unit table too (it raised unknown_table)."""
    from dpgate.policy import load_policy
    from dpgate.sql.explain import explain_query

    doc = explain_query(sql, load_policy(library / "library_catalog.toml"))
    assert doc["contribution"]["privacy_unit"] == "member_id" and doc["sensitivities"]


def test_cli_explains_privately_selected_keys(library, tmp_path, capsys):
    """A key without public keys (private partition selection) has no fixed number of groups:
    the contribution says which keys are selected (counting them raised ValueError → 500)."""
    sql = "SELECT title, COUNT(*) AS n FROM checkouts GROUP BY title"
    code, out, err = _explain(capsys, library, tmp_path / "home", sql)
    assert code == 0, err
    assert "groups of title selected privately" in out and "partition selection" in out
    code, out, err = _explain(capsys, library, tmp_path / "home", sql, "--json")
    doc = json.loads(out)
    assert doc["contribution"]["groups"] is None and doc["contribution"]["selected_keys"] == ["title"]


def _analysts(gw, dataset: str) -> str | None:
    """The consumer ``dpgate explain`` checks the cost against by default (analysts, when the
    dataset has that allocation)."""
    return "analysts" if "analysts" in gw.policy(dataset).allocations else None
