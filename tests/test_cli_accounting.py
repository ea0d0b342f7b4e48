"""Tests of ``dpgate accounting epsilon|rho`` (the CLI calculator)."""

from __future__ import annotations

import json
import math

import pytest

from _api_server import rho_cap_oracle
from _oracles import ledger_epsilon as oracle_epsilon

from dpgate.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["accounting", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_epsilon_table(capsys):
    status, out, _ = run(capsys, "epsilon", "--rho", "0.25", "--delta", "1e-6")
    assert status == 0
    lines = {line.split()[0]: line.split()[1] for line in out.splitlines()[3:7]}
    # the worked example: 50 releases at σ = 10 (ρ = 0.25) at δ = 1e-6
    assert {k: lines[k] for k in ("simple", "tight", "exact")} == {"simple": "3.96692", "tight": "3.54229",
                                                                  "exact": "3.3076"}
    # the ledger's number comes first (at δ − δ/2, its grid's orders), checked against dp-accounting
    assert list(lines)[0] == "ledger"
    assert float(lines["ledger"]) == pytest.approx(oracle_epsilon(0.25, 0.5e-6), rel=1e-5)
    assert "One conversion" in out


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
    assert json.loads(out)["epsilon"] == {"ledger": "inf", "simple": "inf", "tight": "inf", "exact": "inf"}


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


def test_the_ledgers_number_is_the_caps_for_the_same_epsilon_and_delta(capsys):
    """Issue 24: the calculator shows the ρ the ledger enforces for a policy cap (ε 4, δ 1e-6): the
    cap rule at δ − δ/2 (the default selection reserve), not the textbook 0.3111 — and back."""
    status, out, _ = run(capsys, "rho", "--epsilon", "4", "--delta", "1e-6", "--json")
    data = json.loads(out)
    # dp-accounting oracle of the published rule (largest ρ whose single-order conversion meets
    # ε = 4 at δ = 5e-7, maximised over the grid): 0.294741 at α = 8
    assert data["rho_cap"]["ledger"] == pytest.approx(rho_cap_oracle(4.0, 0.5e-6), rel=1e-9)
    assert data["rho_cap"]["ledger"] == pytest.approx(0.294741, abs=1e-6) and data["alpha_cap"] == 8.0
    assert data["ledger_delta"] == 0.5e-6 and "textbook" in data["note"]
    from dpgate.ledger.caps import fix_epsilon_cap

    assert data["rho_cap"]["ledger"] == fix_epsilon_cap(4.0, 0.5e-6)[0]  # what a policy is enforced as
    status, out, _ = run(capsys, "epsilon", "--rho", repr(data["rho_cap"]["ledger"]), "--delta", "1e-6", "--json")
    back = json.loads(out)["epsilon"]
    assert back["ledger"] == pytest.approx(4.0, rel=1e-9)  # the same number both ways
    assert back["tight"] == pytest.approx(3.8816, abs=1e-4)  # the textbook conversion at δ: the 3.88 users saw
    # no selection reserve: the grid rule at the full δ
    status, out, _ = run(capsys, "rho", "--epsilon", "4", "--delta", "1e-6", "--selection-delta", "0", "--json")
    assert json.loads(out)["rho_cap"]["ledger"] == pytest.approx(rho_cap_oracle(4.0, 1e-6), rel=1e-9)
    status, _, err = run(capsys, "rho", "--epsilon", "4", "--delta", "1e-6", "--selection-delta", "1e-6")
    assert status == 2 and "selection delta" in err


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


@pytest.mark.filterwarnings("error")  # no numpy RuntimeWarning on the way to the message
@pytest.mark.parametrize(
    "argv, word",
    [
        (["epsilon", "--rho", "1e308", "--delta", "1e-6"], "rho must be a finite number in [0, 10000]"),
        (["epsilon", "--rho", "1e5", "--delta", "1e-6"], "rho must be a finite number in [0, 10000]"),
        (["epsilon", "--rho", "1", "--delta", "nan"], "delta must be a finite number in [0, 1)"),
        (["epsilon", "--sigma", "1e-300", "--delta", "1e-6"], "sigma is too small"),
        (["epsilon", "--sigma", "inf", "--delta", "1e-6"], "sigma must be a finite number"),
        (["epsilon", "--sigma", "1", "--l2-sensitivity", "nan", "--delta", "1e-6"], "l2 sensitivity"),
        (["rho", "--epsilon", "1e308", "--delta", "1e-6"], "epsilon must be a finite number in [0, 10000]"),
        (["rho", "--epsilon", "nan", "--delta", "1e-6"], "epsilon must be a finite number"),
        (["rho", "--epsilon", "1", "--delta", "1e-6", "--releases", "3", "--l2-sensitivity", "1e308"],
         "l2 sensitivity must be a finite number in (0, 1e+100]"),
        (["attack", "--epsilon", "nan", "--delta", "1e-6"], "epsilon must be a finite number"),
        (["attack", "--epsilon", "1e308", "--delta", "1e-6"], "epsilon must be a finite number in [0, 10000]"),
        (["attack", "--epsilon", "1", "--delta", "1e-6", "--rho", "inf"], "rho must be a finite number"),
        (["attack", "--epsilon", "1", "--delta", "1e-6", "--mu", "-1"], "mu must be a finite number"),
    ],
)
def test_out_of_range_input_is_a_sentence_naming_the_range(capsys, argv, word):
    status, out, err = run(capsys, *argv, "--json")
    assert status == 2  # exits.USAGE, as every invalid_budget
    error = json.loads(err)["error"]
    assert error["code"] == "invalid_budget"
    assert word in error["message"]


def test_the_top_of_the_range_still_converts(capsys):
    status, out, _ = run(capsys, "epsilon", "--rho", "1e4", "--delta", "1e-6", "--json")
    assert status == 0 and math.isfinite(json.loads(out)["epsilon"]["ledger"])
