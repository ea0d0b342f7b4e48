"""explain_query and ``dpgate explain``: plan, hash, bounded SQL template, sensitivities.

``dpgate explain`` goes through :meth:`dpgate.service.Gateway.explain` (issue 19, item 8),
so its tests give the planner fixture's ``prompts`` table a small Parquet file."""

from __future__ import annotations

import json
import re
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
    """The planner fixture's prompts table (the other tables have no data) over a small Parquet
    file; the gateway's state in ``tmp_path / "home"``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "policies"
    folder.mkdir()
    data = tmp_path / "prompts.parquet"
    n = 40
    pq.write_table(pa.table({
        "user_id": pa.array([i % 13 for i in range(n)], pa.int64()),
        "region": pa.array([["eu", "us", "apac", "latam", "africa"][i % 5] for i in range(n)]),
        "week": pa.array([i % 52 for i in range(n)], pa.int64()),
        "tokens": pa.array([float(i * 100) for i in range(n)]),
        "latency": pa.array([float(i % 7) for i in range(n)]),
        "age": pa.array([20 + i for i in range(n)], pa.int64()),
        "model": pa.array(["m"] * n),
        "flagged": pa.array([i % 2 == 0 for i in range(n)]),
    }), data)
    text = FIXTURE.read_text()
    text = text[: text.index("[tables.pums]")].replace('source = "data/prompts.parquet"', f'source = "{data}"')
    (folder / "planner.toml").write_text(text)
    return folder


def _home(policies: Path) -> list[str]:
    return ["--home", str(policies.parent / "home")]


def test_explain_query_describes_the_release_without_data():
    policy = load_policy(FIXTURE)
    out = explain_query(SQL, policy)
    assert out["dataset"] == "planner" and out["table"] == "prompts"
    assert out["columns"] == ["region", "n", "AVG(tokens)"]
    assert out["canonical_sql"].startswith('SELECT "region", COUNT(*) AS "count"')
    assert out["plan"]["plan_hash"] == out["plan_hash"] and len(out["plan_hash"]) == 64
    assert out["contribution"] == {"privacy_unit": "user_id", "record_level": False,
                                   "max_groups_per_unit": 2, "max_rows_per_unit": 5,
                                   "groups": 5, "selected_keys": []}
    assert "<salt>" in out["bounded_sql"]
    # k_eff = 2: count l1 = 2·5; AVG(tokens) → sum (linf 5·8000) and count_column
    assert out["sensitivities"]["p0"]["l1"] == 10
    assert out["sensitivities"]["p1"]["linf"] == 40000
    json.dumps(out)  # JSON-serialisable


def test_explain_query_raises_the_refusal():
    with pytest.raises(UnsupportedQuery):
        explain_query("SELECT * FROM prompts", load_policy(FIXTURE))


def test_cli_explain_table_output(policies, capsys):
    rc = main(["explain", "--policies", str(policies), "--dataset", "planner", SQL, *_home(policies)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "plan hash" in out and "canonical SQL" in out and "user_id" in out
    assert "k = 2 groups per unit" in out and "<salt>" in out
    assert re.search(r"p1 +sum +tokens +40,000 +80,000 +56,569 +steps of 1 \(tokens\)", out)  # with its unit
    assert "cost          ρ 0.001" in out  # the policy's default_query_rho


def test_cli_explain_json_is_the_gateways_document(policies, capsys):
    """``dpgate explain --json`` prints what ``POST /v1/queries/explain`` answers (same path)."""
    from dpgate.jsonsafe import json_safe
    from dpgate.service import Gateway
    from dpgate.settings import Settings

    rc = main(["explain", "--policies", str(policies), "--dataset", "planner", "--json", SQL, *_home(policies)])
    doc = json.loads(capsys.readouterr().out)
    with Gateway.open(Settings(policies=policies, home=policies.parent / "home")) as gw:
        want = json.loads(json.dumps(json_safe(gw.explain("planner", SQL, consumer="analysts" if "analysts" in gw.policy("planner").allocations else None)), default=str))
    assert rc == 0 and doc == want
    assert doc["columns"] == ["region", "n", "AVG(tokens)"]
    assert doc["contribution"]["max_groups_per_unit"] == 2 and doc["contribution"]["groups"] == 5


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
    rc = main(["explain", "--policies", str(policies), "--dataset", dataset, sql, "--json", *_home(policies)])
    captured = capsys.readouterr()
    assert rc == status and json.loads(captured.out) == json.loads(captured.err)  # stdout too (issue 24)
    assert json.loads(captured.err)["error"]["code"] == code
    rc = main(["explain", "--policies", str(policies), "--dataset", dataset, sql, *_home(policies)])
    captured = capsys.readouterr()
    last = captured.err.splitlines()[-1]  # after the loading lines (stderr: stdout holds the explanation)
    assert rc == status and captured.out == "" and last.startswith("dpgate: error: ") and f"[{code}]" in last


def test_explain_query_of_privately_selected_keys():
    """A key without public keys: the groups are chosen by partition selection (counting the
    key combinations raised ValueError)."""
    out = explain_query("SELECT model, COUNT(*) FROM prompts GROUP BY model", load_policy(FIXTURE))
    assert out["contribution"]["groups"] is None and out["contribution"]["selected_keys"] == ["model"]
