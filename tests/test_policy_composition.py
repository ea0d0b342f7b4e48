"""``[budget] composition`` (issue 22 item 1): parsed and validated by the policy loader, one per
population, passed to the ledger on creation, a drift notice for a population whose filter
differs, and ``dpgate caps apply`` adopting it only before the population's first charge."""

from __future__ import annotations

import math

import pytest
from test_policy import HEAD, error, table, write

from dpgate.accounting import Cost
from dpgate.errors import InvalidBudget, PolicyError
from dpgate.ledger import open_ledger
from dpgate.pipeline.admin import apply_policies, ensure_populations
from dpgate.policy import COMPOSITIONS, load_policies, load_policy

KEYLESS = 'g = { type = "text" }'  # a key column without public keys: the default reserves δ/2
GDP = HEAD.replace("default_query_rho = 0.01", 'default_query_rho = 0.01\ncomposition = "gdp"')


def test_composition_defaults_to_renyi_and_gdp_reserves_no_selection_delta(tmp_path):
    assert COMPOSITIONS == ("renyi", "gdp")
    renyi = load_policy(write(tmp_path, table(KEYLESS)))
    assert renyi.budget.composition == "renyi" and renyi.budget.selection_delta == pytest.approx(5e-7)
    gdp = load_policy(write(tmp_path, table(KEYLESS), head=GDP))
    assert gdp.budget.composition == "gdp"
    assert gdp.budget.selection_delta == 0.0 and gdp.budget.default_selection_delta == 0.0  # never selects
    assert load_policies(tmp_path / "policies")["ds"].budget.selection_delta == 0.0  # per-population default too


@pytest.mark.parametrize("value, problem", [
    ('"pld"', "composition must be one of 'renyi', 'gdp'"),
    ("1", "composition must be one of"),
    ('"GDP"', "composition must be one of"),
])
def test_other_compositions_are_refused(tmp_path, value, problem):
    head = HEAD.replace("default_query_rho = 0.01", f"default_query_rho = 0.01\ncomposition = {value}")
    assert problem in error(tmp_path, table(), head).message


def test_gdp_with_a_stated_selection_reserve_is_refused(tmp_path):
    head = GDP.replace("delta = 1e-6", "delta = 1e-6\nselection_delta = 5e-7")
    assert "admits no partition selection" in error(tmp_path, table(), head).message
    ok = GDP.replace("delta = 1e-6", "delta = 1e-6\nselection_delta = 0")
    assert load_policy(write(tmp_path, table(), head=ok)).budget.composition == "gdp"


def test_datasets_of_one_population_must_agree(tmp_path):
    write(tmp_path, table(), name="a.toml")
    write(tmp_path, table(), head=GDP.replace('name = "ds"', 'name = "ds2"'), name="b.toml")
    with pytest.raises(PolicyError) as e:
        load_policies(tmp_path / "policies")
    assert "composition" in e.value.message and "'people'" in e.value.message


def _gaussian(rho: float) -> Cost:
    return Cost.discrete_gaussian(rho, math.sqrt(2 * rho) * (1 + 5e-4))


def test_the_gateway_creates_the_population_with_it_and_caps_apply_adopts_it_before_a_charge(tmp_path):
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        gdp = {"ds": load_policy(write(tmp_path, table(), head=GDP))}
        renyi = {"ds": load_policy(write(tmp_path, table(), name="r.toml"))}
        drift = ensure_populations(ledger, gdp)["people"]
        assert drift.created and ledger.cap("people").gdp and not drift.drifted
        # a file that now states the Rényi filter: a drift notice, the ledger's holds
        drift = ensure_populations(ledger, renyi)["people"]
        assert drift.drifted and drift.composition_differs and ledger.cap("people").gdp
        assert "composition" in drift.message() and "caps apply" in drift.message()
        # no charge yet: caps apply adopts it (a recorded cap change), and back
        out = apply_policies(ledger, renyi, actor="admin", reason="renyi")
        assert out[0]["changed"] and not ledger.cap("people").gdp
        apply_policies(ledger, gdp, actor="admin", reason="gdp")
        assert ledger.cap("people").gdp
        ledger.charge("people", "a", _gaussian(0.01), purpose="t")
        with pytest.raises(InvalidBudget) as e:
            apply_policies(ledger, renyi, actor="admin", reason="renyi after a charge")
        assert "fixed before its first charge" in e.value.message
        assert ledger.cap("people").gdp
        assert apply_policies(ledger, gdp, actor="admin", reason="same")[0]["changed"] is False
        assert ledger.verify().ok
    finally:
        ledger.close()


def test_dpgate_budget_states_the_gdp_epsilon_of_the_remaining_mu(tmp_path, capsys):
    """The spend report's remaining ε of a Gaussian-DP population is the exact conversion of the
    remaining μ; oracle: the Dong–Roth–Su closed form with scipy (not ``accounting.gdp``)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    from dpgate.cli.budget import print_report

    def delta_of(mu: float, eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)

    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        ensure_populations(ledger, {"ds": load_policy(write(tmp_path, table(), head=GDP))})
        cost = _gaussian(0.01)
        ledger.charge("people", "a", cost, purpose="t")
        report = ledger.spend("people").to_dict()
    finally:
        ledger.close()
    mu_cap = brentq(lambda m: delta_of(m, 1.0) - 1e-6, 1e-3, 50.0, xtol=1e-14)
    left = math.sqrt(mu_cap ** 2 - cost.gdp_bound ** 2)
    eps_left = brentq(lambda e: delta_of(left, e) - 1e-6, 0.0, 50.0, xtol=1e-13)
    assert report["remaining"]["epsilon"] == pytest.approx(eps_left, rel=1e-6)
    assert report["remaining"]["mu"] == pytest.approx(left, rel=1e-9)
    # the Rényi figure of the remaining ρ would be another number: the test can tell them apart
    from dpgate.ledger.filter import rho_epsilon

    assert abs(rho_epsilon(report["remaining"]["rho"], 1e-6) - eps_left) > 1e-3
    print_report(report, warn=False)
    out = capsys.readouterr().out
    assert "Gaussian-DP filter (composition gdp)" in out and f"remaining epsilon = {eps_left:.4g}" in out
