"""Issue 23 on the command line: ``accounting attack``, ``caps renew``, ``ledger charge`` (DP-SGD by
parameters), ``budget`` per cohort, ``query --fallback proxy`` and ``explain --trial``."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from _budget_project import COHORTS, write_project

from dpgate import accounting
from dpgate.cli import exits, main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def where(tmp_path):
    policies = write_project(tmp_path / "project")
    return ["--policies", str(policies), "--home", str(tmp_path / "state")]


def test_accounting_attack(capsys):
    code, out, _ = run(capsys, "accounting", "attack", "--epsilon", "1", "--delta", "1e-6", "--json")
    assert code == 0
    data = json.loads(out)
    # e¹·0.01 + 1e-6 = 0.0271838 (Kairouz, Oh & Viswanath 2015, Thm. 2.1)
    assert data["dp"]["tpr"] == pytest.approx(math.e * 0.01 + 1e-6, rel=1e-12)
    code, out, _ = run(capsys, "accounting", "attack", "--epsilon", "4", "--delta", "1e-6", "--mu", "1")
    assert code == 0
    assert "TPR <= 0.09236" in out  # Φ(Φ⁻¹(0.01) + 1) = 0.092362, the GDP bound is the tightest
    code, _, err = run(capsys, "accounting", "attack", "--epsilon", "4", "--delta", "1e-6", "--fpr", "2")
    assert code == exits.USAGE and "fpr" in err


def test_caps_renew_is_refused_with_the_arithmetic(where, capsys):
    for dataset in ("shop", "club"):  # creates the populations from the policies
        assert run(capsys, "budget", dataset, *where)[0] == 0
    code, out, err = run(capsys, "caps", "renew", "--population", "plain", "--reason", "May", *where)
    assert code == exits.REFUSED
    assert "renewal_refused" in err or "refused" in err
    assert "after 12 periods" in err and "after 36 periods" in err
    code, _, err = run(capsys, "caps", "renew", "--population", "members", "--reason", "May", *where)
    assert code == exits.REFUSED and "renews only by opening new cohorts" in err


def test_ledger_charge_by_parameters_and_budget_per_cohort(where, capsys):
    assert run(capsys, "budget", "club", *where)[0] == 0
    code, out, _ = run(capsys, "ledger", "charge", "--population", "members", "--consumer", "analysts",
                       "--purpose", "fine-tune", "--q", "0.01", "--noise-multiplier", "1.1", "--steps", "100",
                       "--sampler", "poisson", "--cohort", "2026-02", "--json", *where)
    assert code == 0, out
    receipt = json.loads(out)
    assert receipt["accountant"] == "gateway" and receipt["cohorts"] == ["2026-02"]
    assert receipt["cost"]["curve"][:-1] == pytest.approx(accounting.dp_sgd_rdp(0.01, 1.1, 100, "poisson")[:-1].tolist())
    # without --cohort: every cohort the policies declare
    code, out, _ = run(capsys, "ledger", "charge", "--population", "members", "--consumer", "analysts",
                       "--purpose", "run 2", "--q", "0.5", "--noise-multiplier", "20", "--steps", "2",
                       "--sampler", "shuffle", "--json", *where)
    assert code == 0 and json.loads(out)["cohorts"] == COHORTS
    code, _, err = run(capsys, "ledger", "charge", "--population", "members", "--consumer", "analysts",
                       "--purpose", "x", "--q", "0.01", *where)
    assert code == exits.USAGE and "--noise-multiplier" in err
    code, out, _ = run(capsys, "budget", "club", *where)
    assert code == 0
    assert "per cohort of 'signup'" in out and "fresh: whole cap" not in out.split("2026-02")[1].splitlines()[0]
    assert "guarantee: per cohort" in out
    code, out, _ = run(capsys, "budget", "club", "--json", *where)
    data = json.loads(out)
    rho2 = 2 / (2 * 20**2)  # the shuffled run: 2 steps at σ = 20, no amplification
    assert data["cohorts"]["2026-01"]["spent"]["rho"] == pytest.approx(rho2, rel=1e-12)


def test_query_fallback_and_explain_trial(where, capsys):
    code, out, _ = run(capsys, "query", "--dataset", "shop", "--consumer", "analysts", "--rho", "0.2",
                       "SELECT region, COUNT(*) AS n FROM orders GROUP BY region", "--fallback", "proxy", *where)
    assert code == 0
    assert "answered instead on proxy 'shop_synthetic'" in out and "NOT a differentially private" in out
    code, out, _ = run(capsys, "explain", "--dataset", "shop", "--trial", "--rho", "0.02",
                       "SELECT region, COUNT(*) AS n FROM orders GROUP BY region", *where)
    assert code == 0
    assert "trial on proxy 'shop_synthetic'" in out and "42 ±" in out


def test_proxy_build_fits_released_marginals_and_the_proxy_serves_fallbacks(where, tmp_path, capsys):
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings

    policies, home = Path(where[1]), Path(where[3])
    with Gateway.open(Settings(policies=policies, home=home)) as gw:
        by_region = gw.query("club", "SELECT region, COUNT(*) AS n FROM orders GROUP BY region",
                             consumer="analysts", budget=QueryBudget(rho=0.02))
        by_signup = gw.query("club", "SELECT signup, COUNT(*) AS n FROM orders GROUP BY signup",
                             consumer="analysts", budget=QueryBudget(rho=0.02))
        spent = gw.ledger.spend("members").charges
    out_dir = tmp_path / "proxy"
    code, out, _ = run(capsys, "proxy", "build", "--dataset", "club", "--output", str(out_dir), "--json", *where)
    assert code == 0, out
    built = json.loads(out)
    table = built["tables"]["orders"]
    assert table["marginals"] == {"signup": by_signup["release_id"], "region": by_region["release_id"]}
    # the synthetic table reproduces each released (noisy, clamped at 0) marginal up to rounding
    import csv as _csv

    rows = list(_csv.DictReader(open(table["file"], encoding="utf-8")))
    n = len(rows)
    noisy = {r[0]: max(0, r[1]) for r in by_region["rows"]}
    for key, count in noisy.items():
        got = sum(1 for r in rows if r["region"] == key)
        assert abs(got - count * n / sum(noisy.values())) <= 1
    # building read no data and charged nothing
    with Gateway.open(Settings(policies=policies, home=home)) as gw:
        assert gw.ledger.spend("members").charges == spent
    # the built policy is a valid proxy: use it for club
    shutil.copy(built["policy_file"], policies / Path(built["policy_file"]).name)
    club = policies / "club.toml"
    club.write_text(club.read_text().replace('data_version = "v1"', 'data_version = "v1"\nproxy = "club_synthetic"'))
    with Gateway.open(Settings(policies=policies, home=home)) as gw:
        assert gw.dataset("club_synthetic")["tables"]["orders"]["public"] is True
        ans = gw.query("club", "SELECT region, COUNT(*) AS n FROM orders GROUP BY region", consumer="analysts",
                       budget=QueryBudget(rho=10.0), fallback="proxy")
        assert ans["source"] == "proxy" and ans["proxy"]["provenance"].startswith("synthetic: independent")
        assert sum(r[1] for r in ans["rows"]) == n
