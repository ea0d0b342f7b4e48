"""Runners (issue 20 step 5): every statement is rendered and checked before ``ledger.charge``, and the
ledger is charged exactly the calibrated cost (Tumult Analytics' assertion), for every strategy.

A spy ledger and a spy engine wrap the real ones and record one event list: ``render`` (the
bounded and histogram SQL builders, spied in :mod:`dpgate.pipeline.runners`), ``check``,
``execute`` and ``charge``. The calibrated cost is computed independently of the charge, by a
second runner's ``calibrate`` on the same plan and budget.
"""

from __future__ import annotations


import pytest

import dpgate.pipeline.runners as runners
from dpgate import accounting
from dpgate.errors import Internal
from dpgate.pipeline.budget import QueryBudget, ResolvedBudget
from dpgate.pipeline.strategy import (ExactPublic, Noisy, NoisyWithPartitionSelection, PublicKeysOnly,
                                      QuantilesWithPartitionSelection, TopK, WithQuantiles)
import _runner_spies

gw, events = _runner_spies.gw, _runner_spies.events  # the shop gateway and its event spy (fixtures)

#: strategy → a query that gets it, and its budget.
QUERIES = {
    Noisy: ("SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM orders GROUP BY region", QueryBudget(rho=0.02)),
    NoisyWithPartitionSelection: ("SELECT model, COUNT(*) AS n FROM orders GROUP BY model", QueryBudget(rho=0.02)),
    WithQuantiles: ("SELECT region, COUNT(*) AS n, MEDIAN(amount) AS m FROM orders GROUP BY region",
                    QueryBudget(rho=0.02)),
    # issue 21 item 8: the selection (ρ_sel, δ) and the quantiles' ρ, one charge for both
    QuantilesWithPartitionSelection: ("SELECT model, COUNT(*) AS n, MEDIAN(amount) AS m FROM orders GROUP BY model",
                                      QueryBudget(rho=0.02)),
    TopK: ("SELECT region FROM orders GROUP BY region ORDER BY COUNT(*) DESC LIMIT 2", QueryBudget(rho=0.02)),
    ExactPublic: ("SELECT zone, COUNT(*) AS n FROM regions GROUP BY zone", None),
    PublicKeysOnly: ("SELECT region FROM orders GROUP BY region", None),
}


def _kinds(events: list) -> list[str]:
    return [e[0] for e in events]


@pytest.mark.parametrize("kind", list(QUERIES), ids=lambda k: k.__name__)
def test_each_query_gets_the_strategy_it_is_written_for(gw, kind):
    sql, _ = QUERIES[kind]
    _, _, strategy = gw.compile("shop", sql)
    assert type(strategy) is kind


@pytest.mark.parametrize("kind", [Noisy, NoisyWithPartitionSelection, WithQuantiles, QuantilesWithPartitionSelection,
                                  TopK], ids=lambda k: k.__name__)
def test_render_and_checks_finish_before_the_charge_and_the_charge_is_the_calibrated_cost(gw, events, kind):
    sql, budget = QUERIES[kind]
    gw.query("shop", sql, consumer="default", budget=budget)
    kinds = _kinds(events)
    assert kinds.count("charge") == 1, kinds
    at = kinds.index("charge")
    before, after = kinds[:at], kinds[at + 1:]
    assert "render" in before and "check" in before, kinds
    assert "render" not in after and "check" not in after, kinds  # nothing rendered or bound after the charge
    assert "execute" in after and "execute" not in before, kinds  # no data read before the charge
    # every statement executed is one that was rendered before the charge
    rendered = [e[3] for e in events[:at] if e[0] == "render"]
    executed = [e[1][0] for e in events[at + 1:] if e[0] == "execute"]
    assert executed and all(any(s is r for r in rendered) for s in executed)
    # the charged cost equals the calibrated cost, computed again by a fresh runner
    charged = events[at][1][2]
    policy, _, strategy = gw.compile("shop", sql)
    runner = gw._runner("shop", policy, strategy)
    resolved = runner.resolve(budget, None)
    assert charged == runner.calibrate(resolved).cost
    assert charged.rho == pytest.approx(0.02, rel=1e-9)  # the requested ρ, all of it


@pytest.mark.parametrize("kind", [ExactPublic, PublicKeysOnly], ids=lambda k: k.__name__)
def test_free_strategies_never_charge(gw, events, kind):
    sql, _ = QUERIES[kind]
    doc = gw.query("shop", sql, consumer="default")
    assert "charge" not in _kinds(events) and doc["charge"] is None and doc["exact"] is True
    assert ("execute" in _kinds(events)) == (kind is ExactPublic)  # keys only reads no data


@pytest.mark.parametrize("kind", [Noisy, WithQuantiles, QuantilesWithPartitionSelection, TopK],
                         ids=lambda k: k.__name__)
def test_explain_and_query_share_the_dispatch(gw, kind):
    sql, budget = QUERIES[kind]
    doc = gw.explain("shop", sql, budget=budget)
    policy, _, strategy = gw.compile("shop", sql)
    runner = gw._runner("shop", policy, strategy)
    cal = runner.calibrate(runner.resolve(budget, None))
    assert doc["cost"]["rho"] == pytest.approx(cal.cost.rho, rel=1e-12)
    selecting = {"selection_delta": doc["budget"].get("selection_delta")} if kind is QuantilesWithPartitionSelection else {}
    assert doc["budget"] == runner.resolve(budget, None).to_dict() == {"rho": 0.02, **selecting}


def test_a_charge_before_the_checks_is_an_internal_error(gw):
    policy, _, strategy = gw.compile("shop", QUERIES[Noisy][0])
    runner = gw._runner("shop", policy, strategy)
    cal = runner.calibrate(runner.resolve(QueryBudget(rho=0.01), None))
    with pytest.raises(Internal, match="before its statements were rendered and checked"):
        runner._charge(cal, "default", "k", purpose="p", metadata={}, scope=None)
    assert gw.ledger_entries() == []


def test_a_ledger_charging_another_cost_is_an_internal_error(gw, monkeypatch):
    real = gw.ledger.charge

    def cheaper(population, consumer, cost, **kw):
        return real(population, consumer, accounting.Cost.zcdp(cost.rho / 2), **kw)

    monkeypatch.setattr(gw.ledger, "charge", cheaper)
    with pytest.raises(Internal, match="other than the calibrated"):
        gw.query("shop", QUERIES[Noisy][0], consumer="default", budget=QueryBudget(rho=0.02))


def test_every_strategy_has_its_own_runner():
    from typing import get_args

    from dpgate.pipeline.strategy import Strategy

    assert set(runners.RUNNERS) == set(get_args(Strategy))
    assert len(set(runners.RUNNERS.values())) == len(runners.RUNNERS)
    with pytest.raises(Internal, match="no runner"):
        runners.runner_for(object(), None)  # type: ignore[arg-type]


def test_the_resolved_budget_is_frozen_and_keeps_the_dict_order():
    b = ResolvedBudget(epsilon=1.0, delta=1e-6).with_selection_delta(1e-9)
    assert list(b.to_dict()) == ["epsilon", "delta", "selection_delta"]
    assert list(ResolvedBudget(ci95=2.0, expected_count=50.0).to_dict()) == ["ci95", "expected_count"]
    with pytest.raises(AttributeError):
        b.rho = 1.0  # type: ignore[misc]
