"""External curves that fit are admitted (issue 9, item 6): the filter checks the orders the
cap's guarantee uses (grid orders up to α_cap, each a fixed-order Rényi filter), curves on the
caller's own order grid are mapped conservatively, refusals name the order that failed, and
the grid and α_cap are published (``GET /v1/ledger/orders``).

dp-accounting is the independent oracle for the DP-SGD curves and the RDP → (ε, δ) conversion.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _api_server import LiveServer
from _small_project import write_project

from dpgate import accounting
from dpgate.accounting import ORDERS, Cost
from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.errors import BudgetExhausted, InvalidBudget
from dpgate.ledger import open_ledger
from dpgate.service import Gateway
from dpgate.settings import Settings

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting import rdp  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant as oracle  # noqa: E402

DELTA = 1e-6
FINITE = [a for a in ORDERS if math.isfinite(a)]


def dp_sgd(q: float, sigma: float, steps: int, orders=None) -> tuple[list[float], list[float], float]:
    """(orders, curve, ε at δ = 1e-6) of a Poisson-subsampled Gaussian run, by dp-accounting
    (its default order grid unless ``orders`` is given)."""
    acc = rdp.RdpAccountant(orders=orders) if orders is not None else rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return list(map(float, acc._orders)), list(map(float, acc._rdp)), acc.get_epsilon(DELTA)


@pytest.fixture
def ledger(tmp_path):
    led = open_ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    yield led
    led.close()


def test_the_issue_dp_sgd_run_fits_a_cap_of_epsilon_10(ledger):
    # The issue's example: q = 0.01, σ = 1, 10,000 steps is (7.4, 1e-6)-DP by dp-accounting, and
    # was refused under a cap of (10, 1e-6) because every order up to 1024 was checked.
    orders, curve, eps = dp_sgd(0.01, 1.0, 10_000)
    assert eps == pytest.approx(7.4, abs=0.05)
    ledger.ensure_population("p", epsilon=10.0, delta=DELTA, allocations={})
    cap = ledger.cap("p")
    # α_cap: the grid order where the single-order conversion of α·ρ_cap meets the cap
    assert cap.alpha_cap == 4.0
    e_cap, order = oracle.compute_epsilon([4.0], [4.0 * cap.rho_cap], DELTA)
    assert e_cap == pytest.approx(10.0, rel=1e-9) and e_cap <= 10.0 + 1e-12 and order == 4.0
    # the curve is charged on dp-accounting's own grid (1.1, 1.2, …, 63, 128, …, 1024)
    receipt = ledger.charge("p", "sgd", Cost.rdp_on_orders(curve, orders), purpose="DP-SGD run")
    assert not receipt.duplicate
    rep = ledger.spend("p")
    # reported ε: the mapped curve converted on the ledger's grid; never below the oracle's
    # ε on the caller's finer grid by more than the mapping's conservatism, never above the cap
    assert eps - 1e-9 <= rep.spent_epsilon <= 10.0
    assert rep.spent_epsilon == pytest.approx(eps, rel=0.05)
    # the conversion at α_cap of what was spent stays within the cap (the filter's guarantee)
    led_curve = Cost.rdp_on_orders(curve, orders).curve
    spent_at_cap = led_curve[ORDERS.index(4.0)]
    assert oracle.compute_epsilon([4.0], [spent_at_cap], DELTA)[0] <= 10.0
    assert ledger.verify().ok


def test_a_second_run_is_refused_naming_the_order_and_by_how_much(ledger):
    orders, curve, _ = dp_sgd(0.01, 1.0, 10_000)
    ledger.ensure_population("p", epsilon=10.0, delta=DELTA, allocations={})
    ledger.charge("p", "sgd", Cost.rdp_on_orders(curve, orders), purpose="run 1")
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("p", "sgd", Cost.rdp_on_orders(curve, orders), purpose="run 2")
    d, msg = info.value.details, info.value.message
    assert d["rule"] == "renyi" and d["alpha_cap"] == 4.0
    o = d["order"]
    assert o["alpha"] == d["binding_order"] <= 4.0
    # at that order: what the run costs, what is spent, the budget α·ρ_cap and the excess
    assert o["budget"] == pytest.approx(o["alpha"] * ledger.cap("p").rho_cap)
    assert o["excess"] == pytest.approx(o["spent"] + o["request"] - o["budget"])
    assert o["excess"] > 0
    # one short sentence leads (issue 24); the order-by-order account is in the details
    assert msg.startswith("needs ") and f"Rényi order α = {o['alpha']:g}" in msg and "nothing was charged" in msg
    why = d["explanation"]
    assert f"alpha = {o['alpha']:g}" in why and "over by" in why and "alpha_cap = 4" in why
    assert len(ledger.entries()) == 1


def test_a_curve_whose_epsilon_at_delta_is_zero_is_refused_in_words_that_make_sense(ledger):
    # Fill the budget, then ask for a tiny curve: its ε at δ is 0 (within δ of perfect privacy),
    # so "needs epsilon = 0 … only epsilon = 1 remains" would be nonsense. The refusal talks
    # about the order that failed instead.
    ledger.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={})
    cap = ledger.cap("p")
    ledger.charge("p", "a", Cost.zcdp(cap.rho_cap), purpose="fill")
    tiny = Cost.rdp([1e-13] * len(ORDERS))  # 1 − e^(−1e-13) ≤ δ²: within δ of perfect privacy
    assert accounting.cost_epsilon(tiny, DELTA) == 0.0
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("p", "a", tiny, purpose="tiny")
    msg, why = info.value.message, info.value.details["explanation"]
    assert "epsilon = 0 " not in msg + why and "epsilon=0" not in msg + why and "ε 0 " not in msg
    assert "at Rényi order α = " in msg and "at Rényi order alpha = " in why and "over by" in why


def test_curves_on_the_callers_grid_are_mapped_conservatively():
    # hand-mapped: each ledger order takes the caller's value at the next caller order above it
    caller_orders = [2.0, 4.0, 8.0, 16.0, 32.0]
    caller_curve = [0.1, 0.2, 0.3, 0.9, 2.0]
    got = accounting.curve_on_grid(caller_curve, caller_orders)
    for a, v in zip(ORDERS, got):
        above = [c for o, c in zip(caller_orders, caller_curve) if o >= a]
        want = min(above) if above else math.inf
        assert v == want, (a, v, want)
    assert got[ORDERS.index(1.01)] == 0.1 and got[ORDERS.index(3.0)] == 0.2
    # a curve that decreases is refused (test_a_curve_that_decreases_is_refused_and_costs_nothing)
    with pytest.raises(ValueError):
        accounting.curve_on_grid([0.1, 0.3, 0.2, 0.9, 2.0], caller_orders)
    assert math.isinf(got[ORDERS.index(40.0)]) and math.isinf(got[-1])
    # the pure-ε order given by the caller fills every order above its last finite one
    with_inf = accounting.curve_on_grid([0.1, 0.5], [2.0, math.inf])
    assert with_inf[ORDERS.index(1024.0)] == 0.5 and with_inf[-1] == 0.5
    # the ledger's own grid maps to itself
    curve = accounting.gaussian_rdp(0.1)
    assert np.array_equal(accounting.curve_on_grid(curve, ORDERS), curve)
    for bad in ([1.0, 2.0], [2.0, 2.0], [3.0, 2.0]):
        with pytest.raises(ValueError):
            accounting.curve_on_grid([0.1, 0.2], bad)


def test_no_claim_above_alpha_cap_is_fine_below_it_is_a_clear_error(ledger):
    ledger.ensure_population("p", epsilon=10.0, delta=DELTA, allocations={})  # α_cap = 4
    # a Gaussian evaluated only up to order 8: fits (orders above α_cap are not checked)
    r = ledger.charge("p", "a", Cost.rdp_on_orders([0.01 * a for a in (2, 4, 8)], [2, 4, 8]), purpose="q")
    assert math.isinf(r.rho) and r.to_dict()["rho"] == "inf"
    assert ledger.verify().ok
    # evaluated only up to order 2: no claim at 2.25 … 4, orders the cap's guarantee uses
    with pytest.raises(InvalidBudget) as info:
        ledger.charge("p", "a", Cost.rdp_on_orders([0.02], [2.0]), purpose="q")
    assert "no claim" in info.value.message and "alpha_cap" in info.value.message
    assert info.value.details["order"]["alpha"] == 2.25
    assert len(ledger.entries()) == 1


def test_orders_are_published_to_every_role_and_external_charges_accept_the_callers_grid(tmp_path):
    settings = Settings(policies=write_project(tmp_path / "project", epsilon=10.0, analysts=1.0, dashboard=None), home=tmp_path / "state")
    store = KeyStore(settings.resolved_keys_file())
    keys = {role: store.add(f"k-{role}", role=role, consumer="analysts" if role in ("analyst", "service")
                            else None)[0]
            for role in ("analyst", "dashboard", "admin", "service")}
    orders, curve, _ = dp_sgd(0.01, 1.0, 10_000)
    with LiveServer(create_app(settings)) as server, server.client() as client:
        for role, key in keys.items():
            r = client.get("/v1/ledger/orders", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, (role, r.text)
            body = r.json()
            assert body["orders"][-1] == "inf" and body["orders"][:-1] == FINITE
            pop = body["populations"]["shoppers"]
            assert pop["alpha_cap"] == 4.0 and pop["rule"] == "alpha_cap"
            assert pop["checked_orders"] == [a for a in FINITE if a <= 4.0]
        assert client.get("/v1/ledger/orders").status_code == 401
        r = client.post("/v1/ledger/charges", headers={"Authorization": f"Bearer {keys['service']}"},
                        json={"population": "shoppers", "consumer": "analysts", "kind": "rdp",
                              "orders": orders, "curve": curve, "purpose": "DP-SGD run"})
        assert r.status_code == 201, r.text
    with Gateway.open(settings) as gw:
        (entry,) = gw.ledger_entries("shoppers")
        assert entry["metadata"]["caller_orders"] == orders  # the caller's own curve is kept
        assert entry["metadata"]["caller_curve"] == curve


@pytest.mark.parametrize("orders", [None, [1.5, 2.0, 1000.0]])
def test_a_curve_that_decreases_is_refused_and_costs_nothing(tmp_path, orders):
    # Found by a hostile trial: orders [2, 10, 1000] with ε [0.5, 2.5, 0.0] were mapped by the
    # suffix minimum to ε = 0 at every order up to 1000 — a charge made free by one bad value.
    # Rényi divergence is non-decreasing in the order (van Erven & Harremoës 2014, Thm. 3): a
    # curve that decreases is wrong somewhere, so it is refused (400), whatever its grid.
    write_project(tmp_path)
    settings = Settings(policies=tmp_path / "policies", home=tmp_path / "home")
    with Gateway.open(settings) as gw:
        population = gw.population_of(sorted(gw.policies)[0])
        consumer = sorted(gw.policies[sorted(gw.policies)[0]].allocations)[0]
        if orders is None:
            curve = [0.01 * a for a in FINITE] + [0.5]
            curve[5] = 0.0  # one order claims less than the order before it
        else:
            curve = [0.009, 0.02, 0.00001]
        before = gw.ledger.spend(population).charges
        with pytest.raises(InvalidBudget) as e:
            gw.charge_external(population, consumer, curve=curve, orders=orders, kind="rdp",
                               purpose="decreasing", actor="test")
        assert "non-decreasing" in e.value.message
        assert gw.ledger.spend(population).charges == before
    with pytest.raises(ValueError):
        accounting.curve_on_grid([0.5, 2.5, 0.0], [2, 10, 1000])
    # equal values and +inf at the top are fine
    accounting.curve_on_grid([0.5, 0.5, math.inf], [2, 10, 1000])


def test_dp_sgd_charge_shows_the_rho_the_cap_check_used_not_infinity(tmp_path, capsys):
    """``rho`` stays the stored bound over every order (∞ for this curve, so the hash chain and
    replay are unchanged); receipts and ``dpgate ledger show`` add ``rho_checked``, the ρ at the
    orders α ≤ α_cap the filter checks: max over those orders of ε(α)/α, here from dp-accounting
    evaluated on the ledger's own orders."""
    import json

    from dpgate.cli import main

    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    led = open_ledger(url)
    led.ensure_population("p", epsilon=10.0, delta=DELTA, allocations={})
    alpha_cap = led.cap("p").alpha_cap
    assert alpha_cap == 4.0
    # an accountant that stops at order 64 (as Opacus' default orders do): no claim above it, so
    # the ledger's orders 128 … 1024 hold ∞ and the stored ρ bound over every order is ∞
    orders, curve, _ = dp_sgd(0.01, 1.0, 10_000, orders=[a for a in FINITE if a <= 64])
    want = max(c / a for a, c in zip(orders, curve) if a <= alpha_cap)
    assert math.isfinite(want) and want > 0
    receipt = led.charge("p", "sgd", Cost.rdp_on_orders(curve, orders), purpose="DP-SGD run")
    led.charge("p", "q", Cost.zcdp(0.01), purpose="a query")
    led.close()
    assert math.isinf(receipt.rho)
    assert receipt.to_dict()["rho"] == "inf"
    assert receipt.to_dict()["rho_checked"] == pytest.approx(want, rel=1e-9)
    assert main(["ledger", "show", "--ledger-url", url, "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    sgd, query = entries
    assert sgd["rho"] == "inf" and sgd["rho_checked"] == pytest.approx(want, rel=1e-9)
    assert query["rho"] == query["rho_checked"] == 0.01
    assert main(["ledger", "show", "--ledger-url", url]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "DP-SGD run" in line)
    assert f"{want:.6g}*" in row and "inf" not in row
    assert "α ≤ α_cap" in out
    assert main(["ledger", "verify", "--ledger-url", url]) == 0  # nothing stored changed


def test_admin_ledger_page_shows_the_checked_rho_of_a_dp_sgd_charge(tmp_path):
    from _ui_support import sign_in

    settings = Settings(policies=write_project(tmp_path / "p"), home=tmp_path / "home")
    key = KeyStore(settings.resolved_keys_file()).add("root", role="admin")[0]
    app = create_app(settings)
    with LiveServer(app) as live:
        gw = app.state.gateway
        population = gw.policy(sorted(gw.policies)[0]).population
        cap = gw.ledger.cap(population)
        top = cap.alpha_cap if cap.alpha_cap is not None else 64
        orders = [a for a in FINITE if a <= max(top, 4.0)]
        _, curve, _ = dp_sgd(0.01, 2.0, 100, orders=orders)
        want = max(c / a for a, c in zip(orders, curve) if cap.alpha_cap is None or a <= cap.alpha_cap)
        receipt = gw.ledger.charge(population, "analysts", Cost.rdp_on_orders(curve, orders), purpose="DP-SGD run")
        assert math.isinf(receipt.rho)
        ui = sign_in(live.url, key)
        try:
            page = ui.get("/ui/admin/ledger").text
        finally:
            ui.close()
    from dpgate.ui.charts import fmt_number

    row = next(r for r in page.split("<tr>") if "DP-SGD run" in r)
    assert f">{fmt_number(want)}*</span>" in row and "α ≤ α_cap" in page


def test_a_rho_request_refused_at_a_renyi_order_is_worded_in_rho_first(ledger):
    # After an RDP curve, the binding check is at a Rényi order; a trial found the refusal of a
    # plain ρ request worded only in ε(α) terms. It now leads with the ρ requested (a zCDP
    # request costs ε(α) = ρ·α at every order, Bun & Steinke 2016 Def. 1.1).
    orders, curve, _ = dp_sgd(0.01, 1.0, 10_000)
    ledger.ensure_population("p", epsilon=10.0, delta=DELTA, allocations={})
    ledger.charge("p", "sgd", Cost.rdp_on_orders(curve, orders), purpose="run 1")
    rho = ledger.cap("p").rho_cap
    with pytest.raises(BudgetExhausted) as info:
        ledger.charge("p", "q", Cost.zcdp(rho), purpose="query")
    d, msg = info.value.details, info.value.message
    assert d["rule"] == "renyi"
    assert msg.startswith(f"needs ρ {rho:.4g}, i.e. ε(α)") and "at Rényi order α = " in msg
    assert f"the charge needs rho = {rho:.6g}" in d["explanation"]
    # the ε(α) named is ρ·α at the binding order
    assert d["order"]["request"] == pytest.approx(rho * d["order"]["alpha"], rel=1e-12)
