"""The README's "Choosing a cap" table is what the code computes.

Each row (cap ε at δ = 1e-6, FPR = 1 %, no δ reserved for partition selection): ρ_cap is the
ledger's cap rule (:func:`dpgate.ledger.caps.validate_cap`, [BBG+20] Thm. 21 at the grid's orders),
the third column Kairouz, Oh & Viswanath 2015 Thm. 2.1 computed here by hand (e^ε·FPR + δ), the
fourth the cap's RDP bound (:func:`dpgate.attack.cap_attack_bound`, Mironov 2017 Prop. 10).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from dpgate.attack import cap_attack_bound
from dpgate.ledger.caps import validate_cap

README = Path(__file__).resolve().parents[1] / "README.md"


def _rows() -> list[list[str]]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Choosing a cap", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"^\| [\d.]+ \|", line)]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows]


def _pct(cell: str) -> float:
    return float(cell.rstrip(" %")) / 100


def test_the_cap_table_is_computed():
    rows = _rows()
    assert [r[0] for r in rows] == ["0.5", "1", "2", "4", "8"]
    for eps_text, rho_text, dp_text, rdp_text in rows:
        eps = float(eps_text)
        cap = validate_cap(eps, 1e-6)
        assert float(rho_text) == round(cap.rho_cap, 4), (eps, cap.rho_cap)
        # Thm 2.1 by hand: TPR <= e^eps * FPR + delta, capped at 1
        hand = min(1.0, math.exp(eps) * 0.01 + 1e-6)
        assert math.isclose(_pct(dp_text), hand, rel_tol=5e-3), (eps, hand)
        bound = cap_attack_bound(cap)["tightest"]["tpr"]
        assert math.isclose(_pct(rdp_text), bound, rel_tol=5e-3), (eps, bound)
