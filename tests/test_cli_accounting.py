"""Tests of ``dpgate accounting epsilon|rho`` (the CLI calculator)."""

from __future__ import annotations

import json
import math

import pytest

from dpgate.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["accounting", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_epsilon_table(capsys):
    status, out, _ = run(capsys, "epsilon", "--rho", "0.25", "--delta", "1e-6")
    assert status == 0
    lines = {line.split()[0]: line.split()[1] for line in out.splitlines()[3:]}
    # the worked example: 50 releases at σ = 10 (ρ = 0.25) at δ = 1e-6
    assert lines == {"simple": "3.96692", "tight": "3.54229", "exact": "3.3076"}


def test_epsilon_json_from_sigma(capsys):
    status, out, _ = run(capsys, "epsilon", "--sigma", "10", "--releases", "50", "--delta", "1e-6", "--json")
    assert status == 0
    data = json.loads(out)
    assert data["rho"] == pytest.approx(0.25)  # 50 · 1²/(2·10²)
    # simple: 0.25 + 2√(0.25 ln 1e6)
    assert data["epsilon"]["simple"] == pytest.approx(0.25 + 2 * math.sqrt(0.25 * math.log(1e6)), rel=1e-12)
    assert round(data["epsilon"]["tight"], 4) == 3.5423
    assert round(data["epsilon"]["exact"], 4) == 3.3076


def test_epsilon_delta_zero_is_inf_in_strict_json(capsys):
    status, out, _ = run(capsys, "epsilon", "--rho", "1", "--delta", "0", "--json")
    assert status == 0
    assert json.loads(out)["epsilon"] == {"simple": "inf", "tight": "inf", "exact": "inf"}


def test_rho_json_with_releases(capsys):
    status, out, _ = run(
        capsys, "rho", "--epsilon", "4", "--delta", "1e-6", "--releases", "52", "--share", "0.6", "--json"
    )
    assert status == 0
    data = json.loads(out)
    # (√(ln 1e6 + 4) − √(ln 1e6))² = 0.253936; 60 % over 52 releases → σ = 13.0632
    assert round(data["rho_cap"]["simple"], 6) == 0.253936
    assert round(data["per_release"]["simple"]["sigma"], 4) == 13.0632
    assert data["rho_cap"]["simple"] < data["rho_cap"]["tight"] < data["rho_cap"]["exact"]


def test_rho_table(capsys):
    status, out, _ = run(capsys, "rho", "--epsilon", "4", "--delta", "1e-6")
    assert status == 0
    assert "simple      0.253936" in out


@pytest.mark.parametrize(
    "argv, word",
    [
        (["epsilon", "--rho", "-1", "--delta", "1e-6"], "rho"),
        (["epsilon", "--rho", "0.1", "--delta", "1.5"], "delta"),
        (["epsilon", "--delta", "1e-6"], "--rho"),
        (["epsilon", "--rho", "0.1", "--sigma", "3", "--delta", "1e-6"], "--sigma"),
        (["rho", "--epsilon", "0", "--delta", "1e-6"], "epsilon"),
        (["rho", "--epsilon", "4", "--delta", "1e-6", "--share", "1.5"], "share"),
    ],
)
def test_bad_input_is_an_error_shape(capsys, argv, word):
    status, out, err = run(capsys, *argv, "--json")
    assert status == 2
    assert json.loads(out) == json.loads(err)  # on stdout too, for `| jq` (issue 24)
    error = json.loads(err)["error"]
    assert error["code"] == "invalid_budget"
    assert word in error["message"]
