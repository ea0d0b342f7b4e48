"""explain_query and ``dpgate explain``: plan, hash, bounded SQL template, sensitivities."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from dpgate.cli import main
from dpgate.errors import UnsupportedQuery
from dpgate.policy import load_policy
from dpgate.sql.explain import explain_query

FIXTURE = Path(__file__).parent / "fixtures" / "policies" / "planner.toml"
SQL = "SELECT region, COUNT(*) AS n, AVG(tokens) FROM prompts WHERE age > 30 GROUP BY region"


@pytest.fixture()
def policies(tmp_path):
    folder = tmp_path / "policies"
    folder.mkdir()
    shutil.copy(FIXTURE, folder / "planner.toml")
    return folder


def test_explain_query_describes_the_release_without_data():
    policy = load_policy(FIXTURE)
    out = explain_query(SQL, policy)
    assert out["dataset"] == "planner" and out["table"] == "prompts"
    assert out["columns"] == ["region", "n", "AVG(tokens)"]
    assert out["canonical_sql"].startswith('SELECT "region", COUNT(*) AS "count"')
    assert out["plan"]["plan_hash"] == out["plan_hash"] and len(out["plan_hash"]) == 64
    assert out["contribution"] == {"privacy_unit": "user_id", "record_level": False,
                                   "max_groups_per_unit": 2, "max_rows_per_unit": 5,
                                   "groups": 5}
    assert "<salt>" in out["bounded_sql"]
    # k_eff = 2: count l1 = 2·5; AVG(tokens) → sum (linf 5·8000) and count_column
    assert out["sensitivities"]["p0"]["l1"] == 10
    assert out["sensitivities"]["p1"]["linf"] == 40000
    json.dumps(out)  # JSON-serialisable


def test_explain_query_raises_the_refusal():
    with pytest.raises(UnsupportedQuery):
        explain_query("SELECT * FROM prompts", load_policy(FIXTURE))


def test_cli_explain_table_output(policies, capsys):
    rc = main(["explain", "--policies", str(policies), "--dataset", "planner", SQL])
    out = capsys.readouterr().out
    assert rc == 0
    assert "plan hash" in out and "canonical SQL" in out and "user_id" in out
    assert "k = 2 groups per unit" in out and "<salt>" in out
    assert re.search(r"p1 +sum +tokens +40,000 +80,000 +56,569 +steps of 1 \(tokens\)", out)  # with its unit


def test_cli_explain_json(policies, capsys):
    rc = main(["explain", "--policies", str(policies), "--dataset", "planner", "--json", SQL])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc == explain_query(SQL, load_policy(policies / "planner.toml"))


@pytest.mark.parametrize(
    "dataset, sql, code",
    [
        ("planner", "SELECT * FROM prompts", "unsupported_query"),
        ("planner", "SELECT COUNT(*) FROM prompts; DROP TABLE prompts", "invalid_sql"),
        ("planner", "SELECT COUNT(*) FROM nope", "unknown_table"),
        ("nope", "SELECT COUNT(*) FROM prompts", "unknown_dataset"),
    ],
)
def test_cli_explain_refusals(policies, capsys, dataset, sql, code):
    status = 4 if code == "unknown_dataset" else 2  # dpgate.cli.exits: not found / usage
    rc = main(["explain", "--policies", str(policies), "--dataset", dataset, sql, "--json"])
    captured = capsys.readouterr()
    assert rc == status and json.loads(captured.out) == json.loads(captured.err)  # stdout too (issue 24)
    assert json.loads(captured.err)["error"]["code"] == code
    rc = main(["explain", "--policies", str(policies), "--dataset", dataset, sql])
    captured = capsys.readouterr()
    assert rc == status and captured.err.startswith("dpgate: error: ") and f"[{code}]" in captured.err
