"""The release strategy chosen once per plan (issue 20 step 5): :func:`dpgate.pipeline.strategy.choose`.

Over the golden compile queries (tests/fixtures/golden/compile/*.json: their SQL and policies) and a
few selection queries. Two independent expectations: a table written by hand, and the strategy
flags pinned in each golden file (``strategy``: public, public_keys_only, quantiles,
partition_selection), which the planner computed with the old per-place detection.
"""

from __future__ import annotations

import json

import pytest
from test_compile_golden import GOLDEN, QUERIES, _policies

from dpgate.errors import UnsupportedQuery
from dpgate.pipeline.strategy import (ExactPublic, Noisy, NoisyWithPartitionSelection, PublicKeysOnly, TopK,
                                      WithQuantiles, choose, free)
from dpgate.sql.sources import plan_policy
from dpgate.sql.parse import parse_query

#: golden query → the strategy it must get (by hand, from what each query releases).
EXPECTED = {
    "public_only": ExactPublic, "public_only_join": ExactPublic,
    "keys_only": PublicKeysOnly,
    "median_by_key": WithQuantiles, "min_max": WithQuantiles, "percentile_within_group": WithQuantiles,
    "quantiles_with_count": WithQuantiles,
    "partition_selection": NoisyWithPartitionSelection, "partition_selection_mixed": NoisyWithPartitionSelection,
    # the released COUNT makes it an ordinary query (a selection releases keys only)
    "top_k_selection": NoisyWithPartitionSelection,
    # a public table's key-less columns get their keys from its data in the gateway; planned
    # against the file alone they are selected privately
    "join_chain": NoisyWithPartitionSelection, "join_public_table": NoisyWithPartitionSelection,
    "join_public_table_keys": NoisyWithPartitionSelection, "keys_only_public_join": NoisyWithPartitionSelection,
    "top_k": Noisy,  # releases SUM(tokens): LIMIT is post-processing
}


@pytest.fixture(scope="module")
def policies():
    return _policies()


def _choose(policies, dataset: str, sql: str):
    policy = policies[dataset]
    plan = parse_query(sql, policy)
    return plan, choose(plan, plan_policy(plan, policy))


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_golden_queries_get_their_strategy(name, policies):
    plan, strategy = _choose(policies, *QUERIES[name])
    assert type(strategy) is EXPECTED.get(name, Noisy)
    assert strategy.plan is plan


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_strategy_agrees_with_the_pinned_flags(name, policies):
    flags = json.loads((GOLDEN / f"{name}.json").read_text())["strategy"]
    _, strategy = _choose(policies, *QUERIES[name])
    if flags["public"]:
        want = ExactPublic
    elif flags["public_keys_only"]:
        want = PublicKeysOnly
    elif flags["quantiles"]:
        want = WithQuantiles
    elif flags["partition_selection"]:
        want = NoisyWithPartitionSelection
    else:
        want = Noisy
    assert type(strategy) is want
    assert free(strategy) == (flags["public"] or flags["public_keys_only"])


def test_quantiles_carry_their_base_plan_and_columns(policies):
    plan, s = _choose(policies, *QUERIES["quantiles_with_count"])
    assert isinstance(s, WithQuantiles)
    assert s.columns == ("duration_s",)
    assert [p.kind for p in s.base.primitives] == [p.kind for p in plan.primitives if p.kind != "quantile"]
    assert s.base.primitives and all(p.kind != "quantile" for p in s.base.primitives)
    _, only = _choose(policies, *QUERIES["median_by_key"])
    assert only.base.primitives == ()


def test_partition_selection_names_its_keys(policies):
    _, s = _choose(policies, *QUERIES["partition_selection_mixed"])
    assert isinstance(s, NoisyWithPartitionSelection) and s.selected_keys == ("model",)


def test_a_selection_query_is_top_k(policies):
    _, s = _choose(policies, "usage", "SELECT region FROM prompts GROUP BY region ORDER BY COUNT(*) DESC LIMIT 2")
    assert isinstance(s, TopK)
    assert s.selection.k == 2 and s.selection.descending and s.selection.utility.kind == "count"
    assert not free(s)


def test_a_selection_over_private_keys_is_refused_free(policies):
    with pytest.raises(UnsupportedQuery) as e:
        _choose(policies, "usage", "SELECT model FROM prompts GROUP BY model ORDER BY COUNT(*) DESC LIMIT 2")
    assert "nothing was charged" in e.value.message
    assert e.value.details["charged"] is False and e.value.details["reason"] == "no_public_candidates"


def test_strategies_are_frozen(policies):
    _, s = _choose(policies, *QUERIES["count_star"])
    with pytest.raises(AttributeError):
        s.plan = None  # type: ignore[misc]
