"""A request's ε inside the documented range (0, 10⁴] but too small to buy any ρ at the cap's δ
is refused saying so (it used to say "rho must be finite and > 0, got 0.0")."""

from __future__ import annotations

import math

import pytest

from dpgate.errors import InvalidBudget
from dpgate.ledger.caps import FINITE_ORDERS, ledger_rho


def _floor(delta: float) -> float:  # [BBG+20] Thm. 21 at one order with RDP value 0, minimised over the grid
    return min(math.log1p(-1.0 / a) - (math.log(delta) + math.log(a)) / (a - 1.0) for a in FINITE_ORDERS)


@pytest.mark.parametrize("epsilon", [1e-320, 1e-30, 1e-4])
def test_an_epsilon_that_buys_no_rho_is_too_small(epsilon):
    with pytest.raises(InvalidBudget) as info:
        ledger_rho(epsilon, 5e-7)
    assert "is too small" in info.value.message and "rho must be finite" not in info.value.message
    assert info.value.details["field"] == "epsilon"
    assert f"{_floor(5e-7):.4g}" in info.value.message


def test_an_epsilon_above_the_floor_still_buys_rho():
    assert 0.0 < ledger_rho(0.5, 5e-7) < 0.5
    assert 0.006 < _floor(5e-7) < 0.007  # independent: log1p(-1/α) - (log δ + log α)/(α - 1) at the grid's best α
