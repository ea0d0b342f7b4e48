"""The worked example of docs/SEARCHES.md, end to end (issue 15): three DP-SGD fine-tunes charged by
their RDP curves, a private selection on the validation table, the whole search against the cap.

Every number printed in the doc is asserted here, and the final ε is checked against dp-accounting
(the RDP curves add order by order; RDP → (ε, δ) by its conversion on the same orders).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpgate import accounting
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings
from tests._eval_project import write_eval_project

rdp = pytest.importorskip("dp_accounting.rdp.rdp_privacy_accountant")

FINITE = [a for a in accounting.ORDERS if math.isfinite(a)]
RUNS = (("a", 1.0), ("b", 1.1), ("c", 1.3))  # candidate, noise multiplier; q = 0.01, 1000 steps
BEST = "SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC LIMIT 1"


def dpsgd(sigma: float) -> list[float]:
    """The training job's own accountant: Poisson-subsampled Gaussian, q = 0.01, 1000 steps."""
    return [float(v) * 1000 for v in rdp._compute_rdp_poisson_subsampled_gaussian(0.01, sigma, FINITE)]


def test_worked_example(tmp_path):
    # no partition selection in this population (selection_delta = 0): ε is stated at the full δ = 1e-6
    policies = write_eval_project(tmp_path, epsilon=8.0, candidates=("a", "b", "c"), selection_delta=0.0)
    with Gateway.open(Settings(policies=policies, home=tmp_path / "home")) as gw:
        sid = gw.create_search({
            "purpose": "fine-tune: pick one of three",
            "candidates": [{"name": c, "config": {"noise_multiplier": s, "sampling_rate": 0.01, "steps": 1000}}
                           for c, s in RUNS],
            "training": {"name": "support-chats-2026-11", "population": "eval-users"},
            "validation": {"name": "evals/eval", "population": "eval-users"},
            "selection": "private",
        }, consumer="training", actor="ml-team")["search_id"]
        alone = []
        for c, s in RUNS:
            r = gw.charge_external("eval-users", "training", curve=dpsgd(s), orders=FINITE, purpose=f"DP-SGD {c}",
                                   actor="ml-team", search_id=sid, candidate=c, outcome="completed")
            alone.append(r["epsilon_at_delta"])
        assert alone == pytest.approx([2.437, 1.981, 1.442], abs=5e-4)  # each run alone, at δ = 1e-6
        rel = gw.query("evals", BEST, consumer="training", budget=QueryBudget(epsilon=1.0), search_id=sid)
        assert rel["charge"]["rho"] == pytest.approx(0.125, rel=1e-12)  # ε = 1: ρ = 1²/8
        rec = gw.close_search(sid, selected=rel["rows"][0][0], artifacts=[f"s3://models/ft-{rel['rows'][0][0]}"],
                              selection_release=rel["release_id"], actor="ml-team")
        after = [s["accountant"]["search"]["by_population"]["eval-users"]["epsilon_at_delta"]
                 for s in rec["steps"][:4]]
        assert after == pytest.approx([2.437, 3.021, 3.334, 4.209], abs=5e-4)
        total = rec["totals"]["by_population"]["eval-users"]
        curve = np.sum([dpsgd(s) for _, s in RUNS], axis=0) + np.array(FINITE) / 8.0
        oracle, _ = rdp.compute_epsilon(FINITE, curve, 1e-6)
        assert total["epsilon_at_delta"] == pytest.approx(oracle, rel=1e-6)
        assert total["epsilon_at_delta"] == pytest.approx(4.209, abs=5e-4)
        assert sum(alone) + 2.419 > 8.2  # summing per-release ε would claim more than the cap's 8
        report = gw.budget("evals")
        assert report["cap"]["epsilon"] == 8.0 and report["spent"]["epsilon"] == pytest.approx(4.209, abs=5e-4)
        assert rec["replay"]["ok"] and rec["status"] == "closed"
