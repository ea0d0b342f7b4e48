"""``dpgate search`` and ``dpgate query --search-id`` in-process (issue 15)."""

from __future__ import annotations

import json

from dpgate.cli import main
from tests._eval_project import write_eval_project

BEST = "SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC LIMIT 1"


def test_search_create_query_show_close(tmp_path, monkeypatch, capsys):
    policies = write_eval_project(tmp_path, epsilon=8.0)
    monkeypatch.setenv("DPGATE_POLICIES", str(policies))
    monkeypatch.setenv("DPGATE_HOME", str(tmp_path / "home"))
    spec = {"purpose": "cli search", "candidates": [{"name": n} for n in "abcde"],
            "training": {"name": "ft", "population": "eval-users"},
            "validation": {"name": "evals/eval", "population": "eval-users"}, "selection": "private"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["search", "create", "--file", str(tmp_path / "spec.json"), "--consumer", "training", "--json"]) == 0
    sid = json.loads(capsys.readouterr().out)["search_id"]
    # another consumer may not pay for the search's steps; by default its own consumer (training) pays
    assert main(["query", "--dataset", "evals", "--epsilon", "1", "--search-id", sid, "--consumer", "analysts",
                 BEST, "--json"]) != 0
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid_request"
    assert main(["query", "--dataset", "evals", "--epsilon", "1", "--search-id", sid, BEST, "--json"]) == 0
    release = json.loads(capsys.readouterr().out)
    assert release["charge"]["rho"] == 0.125  # ε = 1, bounded range: 1²/8
    assert main(["search", "show", sid]) == 0
    out = capsys.readouterr().out
    assert "replay: ok" in out and "selection" in out and "ρ 0.125" in out
    assert main(["searches", "list"]) == 0
    assert sid in capsys.readouterr().out
    assert main(["search", "list", "--consumer", "analysts", "--json"]) == 0  # the operator filters by owner
    assert json.loads(capsys.readouterr().out) == {"searches": []}
    assert main(["search", "list", "--consumer", "training", "--json"]) == 0
    assert [s["search_id"] for s in json.loads(capsys.readouterr().out)["searches"]] == [sid]
    assert main(["search", "close", sid, "--selected", release["rows"][0][0], "--selection-release",
                 release["release_id"], "--artifact", "s3://models/x"]) == 0
    assert "closed" in capsys.readouterr().out
    # closed: a second close is a conflict, with the documented error shape under --json
    status = main(["search", "close", sid, "--selected", release["rows"][0][0], "--selection-release",
                   release["release_id"], "--json"])
    assert status != 0
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "conflict"


def test_unprivatised_data_dependent_stopping_is_refused_by_the_cli(tmp_path, monkeypatch, capsys):
    policies = write_eval_project(tmp_path, epsilon=8.0)
    monkeypatch.setenv("DPGATE_POLICIES", str(policies))
    monkeypatch.setenv("DPGATE_HOME", str(tmp_path / "home"))
    spec = {"purpose": "x", "candidates": [{"name": "a"}], "training": {"name": "ft", "population": "eval-users"},
            "validation": {"name": "v", "population": "eval-users"}, "selection": "private",
            "stopping": "data-dependent"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["search", "create", "--file", str(tmp_path / "spec.json"), "--consumer", "training"]) != 0
    assert "privatised" in capsys.readouterr().err
