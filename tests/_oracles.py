"""Independent oracles for the ledger's one conversion (not a test module).

The ledger converts ρ (or an RDP curve) to (ε, δ) by its cap rule: Balle et al. 2020, Thm. 21 at
each finite order of its grid, the smallest value (``dpgate.ledger.caps.ledger_epsilon``). The
oracle computes the same with dp-accounting's RDP conversion (``compute_epsilon``, the same
theorem, an independent implementation) on the grid's finite orders.
"""

from __future__ import annotations

import math
from typing import Sequence

from dpgate.accounting import ORDERS

FINITE = [a for a in ORDERS if math.isfinite(a)]


def ledger_epsilon(rho_or_curve: float | Sequence[float], delta: float) -> float:
    """ε at δ of a total ρ (curve α·ρ) or of a curve on ``ORDERS``, by dp-accounting."""
    from dp_accounting.rdp import rdp_privacy_accountant as oracle

    if isinstance(rho_or_curve, (int, float)):
        if rho_or_curve <= 0:
            return 0.0
        orders, rdp = FINITE, [a * float(rho_or_curve) for a in FINITE]
    else:
        pairs = [(a, v) for a, v in zip(ORDERS, rho_or_curve) if math.isfinite(a) and math.isfinite(v)]
        orders, rdp = [a for a, _ in pairs], [v for _, v in pairs]
    return float(oracle.compute_epsilon(orders, rdp, delta)[0])
