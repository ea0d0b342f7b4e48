"""Every entry point agrees on a policy's cap: ``dpgate datasets check`` refuses what ``serve``
refuses (δ = 0, a cap that admits no spending), and the policy load refuses a
``default_query_rho`` beyond the request limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpgate.cli import exits, main
from dpgate.errors import InvalidBudget, PolicyError
from dpgate.ledger.caps import validate_cap
from dpgate.limits import MAX_QUERY_RHO
from dpgate.pipeline.budget import QueryBudget
from dpgate.policy import load_policy

REPO = Path(__file__).resolve().parents[1]


def _project(tmp_path: Path, old: str, new: str) -> Path:
    (tmp_path / "policies").mkdir()
    text = (REPO / "policies" / "usage.toml").read_text()
    assert old in text
    (tmp_path / "policies" / "usage.toml").write_text(text.replace(old, new, 1))
    return tmp_path / "policies"


def _check(capsys, policies: Path, tmp_path: Path) -> tuple[int, str]:
    code = main(["datasets", "check", "usage", "--policies", str(policies), "--home", str(tmp_path / "home")])
    return code, capsys.readouterr().err


def test_the_request_limit_is_the_policy_limit():
    assert QueryBudget.MAX_RHO == MAX_QUERY_RHO == 1e4


@pytest.mark.parametrize("line, problem", [
    ("delta = 0", "delta must be in (0, 1)"),
    ("default_query_rho = 1e9", "default_query_rho must be > 0 and at most 10000"),
])
def test_datasets_check_refuses_what_serve_refuses(tmp_path, capsys, line, problem):
    key = line.split(" =")[0]
    text = (REPO / "policies" / "usage.toml").read_text()
    old = next(raw for raw in text.splitlines() if raw.startswith(key + " ="))
    policies = _project(tmp_path, old, line)
    with pytest.raises(PolicyError, match=r"delta must be in \(0, 1\)|at most 10000"):
        load_policy(policies / "usage.toml")
    code, err = _check(capsys, policies, tmp_path)
    assert code == exits.exit_status(PolicyError("x")) != exits.OK
    assert problem in err
    if key == "delta":  # the ledger (what serve runs) refuses the same cap
        with pytest.raises(InvalidBudget, match=r"delta must be in \(0, 1\)"):
            validate_cap(1.0, 0.0)


def test_datasets_check_refuses_a_cap_that_admits_no_spending(tmp_path, capsys):
    text = (REPO / "policies" / "usage.toml").read_text()
    old = next(raw for raw in text.splitlines() if raw.startswith("epsilon ="))
    policies = _project(tmp_path, old, "epsilon = 1e-300")
    load_policy(policies / "usage.toml")  # the load alone cannot tell (the curve is the ledger's)
    with pytest.raises(InvalidBudget, match="admits no spending"):
        validate_cap(1e-300, load_policy(policies / "usage.toml").budget.delta)
    code, err = _check(capsys, policies, tmp_path)
    assert code != exits.OK
    assert "admits no spending" in err and "usage.toml" in err
