"""The release strategy of a plan, chosen once (issue 20 step 5, DESIGN.md "Compile once").

:func:`choose` looks at a validated plan and its policy once and returns one frozen value; the
gateway dispatches on it (one runner per strategy, :mod:`dpgate.pipeline.runners`) and nothing
downstream asks again "is this public / keys only / a selection / quantiles?".

The strategies, in the order they are tried (the first that applies wins):

* :class:`ExactPublic` — every table read is public (:func:`dpgate.sql.public.reads_public_only`):
  the exact answer, free.
* :class:`PublicKeysOnly` — no aggregate and every key public
  (:func:`dpgate.sql.public.releases_public_keys_only`): the policy's key list, free, no data read.
* :class:`TopK` — keys only, ORDER BY an aggregate, LIMIT k (:func:`dpgate.sql.selection_query.recognize`):
  the exponential mechanism releases the k best keys (:mod:`dpgate.selection`).
* :class:`WithQuantiles` — at least one quantile primitive (MEDIAN, PERCENTILE, MIN/MAX):
  counts/sums noised, quantiles selected on histograms (:mod:`dpgate.quantile_release`).
  With a GROUP BY key without public keys it is :class:`QuantilesWithPartitionSelection`: the
  threshold mechanism selects the keys first, then the quantiles of the selected keys only
  (issue 21 item 8; sequential composition).
* :class:`NoisyWithPartitionSelection` — a GROUP BY key without public keys
  (:attr:`~dpgate.sql.plan.QueryPlan.selected_keys`): the threshold mechanism selects the keys
  (:mod:`dpgate.partition_selection`).
* :class:`Noisy` — everything else: one noisy vector per primitive.

A ``UNION ALL`` of aggregate queries is :class:`UnionAll`: each branch gets its own strategy by
:func:`choose` (a part that is a noisy or quantile release), and the union is one release of
several parts, charged once (issue 21 item 6; :mod:`dpgate.sql.union`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from dpgate.errors import DpgateError, UnsupportedQuery
from dpgate.policy import DatasetPolicy
from dpgate.quantile_release import without_quantiles
from dpgate.sql.parse import nothing_charged
from dpgate.sql.plan import QueryPlan
from dpgate.sql.public import reads_public_only, releases_public_keys_only
from dpgate.sql.selection_query import SelectionQuery, recognize
from dpgate.sql.union import UNION_NAMES, PartNames

__all__ = ["ExactPublic", "PublicKeysOnly", "TopK", "Noisy", "NoisyWithPartitionSelection", "WithQuantiles",
           "QuantilesWithPartitionSelection",
           "Part", "UnionAll", "Strategy", "choose", "free", "union_of", "without_quantiles"]


@dataclass(frozen=True)
class ExactPublic:
    """A plan that reads public tables only: answered exactly, no charge."""

    plan: QueryPlan
    name: str = "exact_public"


@dataclass(frozen=True)
class PublicKeysOnly:
    """A keys-only plan over public keys: the policy's key combinations, no data read, no charge."""

    plan: QueryPlan
    name: str = "public_keys_only"


@dataclass(frozen=True)
class TopK:
    """A selection query: the k best keys of a public candidate set (exponential mechanism).

    Attributes:
        plan: the plan. selection: what :func:`dpgate.sql.selection_query.recognize` found
            (utility primitive, k, direction).
    """

    plan: QueryPlan
    selection: SelectionQuery
    name: str = "top_k"


@dataclass(frozen=True)
class Noisy:
    """Counts and sums over public keys: one noisy vector per primitive."""

    plan: QueryPlan
    name: str = "noisy"


@dataclass(frozen=True)
class NoisyWithPartitionSelection:
    """Counts and sums grouped by keys without public keys, selected by the threshold mechanism.

    Attributes:
        plan: the plan. selected_keys: the group keys selected privately (in plan order).
    """

    plan: QueryPlan
    selected_keys: tuple[str, ...]
    name: str = "noisy_with_partition_selection"


@dataclass(frozen=True)
class WithQuantiles:
    """A plan with quantile primitives (and possibly counts/sums beside them).

    Attributes:
        plan: the plan. base: the plan's count/sum primitives only (what the bounded query
            computes; :func:`without_quantiles`). columns: the quantile columns, in first-use
            order (one histogram statement each).
    """

    plan: QueryPlan
    base: QueryPlan
    columns: tuple[str, ...]
    name: str = "with_quantiles"


@dataclass(frozen=True)
class QuantilesWithPartitionSelection:
    """Quantiles (and possibly counts/sums) grouped by keys without public keys (issue 21 item 8).

    Step 1, the threshold mechanism selects the groups (with the count/sum primitives noised on
    them, as :class:`NoisyWithPartitionSelection`); step 2, each quantile is chosen on the selected
    groups' histograms only. One charge covers both (sequential composition:
    :func:`dpgate.quantile_release.calibrate_selecting_plan`).

    Attributes:
        plan: the plan. base: its count/sum primitives only (step 1's bounded query, which also
            counts the candidates' units). columns: the quantile columns, in first-use order.
        selected_keys: the group keys selected privately (in plan order).
    """

    plan: QueryPlan
    base: QueryPlan
    columns: tuple[str, ...]
    selected_keys: tuple[str, ...]
    name: str = "quantiles_with_partition_selection"


@dataclass(frozen=True)
class Part:
    """One branch of a ``UNION ALL``: the policy it is planned against, its plan and its strategy."""

    policy: DatasetPolicy
    plan: QueryPlan
    strategy: "Strategy"


@dataclass(frozen=True)
class UnionAll:
    """``UNION ALL`` of aggregate queries: one release of several parts, charged once, the parts
    composed sequentially (zCDP ρ adds; Bun & Steinke 2016 Lemma 2.3) even when their rows are
    disjoint (parallel composition needs the parts to partition the privacy units, which the
    planner cannot prove from WHERE in general).

    Attributes:
        parts: the branches, in order (each a :class:`Noisy` or :class:`WithQuantiles` part).
        plan_hash: the union's hash over its parts' plan hashes (:func:`dpgate.sql.union.union_hash`).
    """

    parts: tuple[Part, ...]
    plan_hash: str
    name: str = "union_all"

    @property
    def plan(self) -> QueryPlan:
        """The first part's plan (whose labels name the union's columns, as in SQL)."""
        return self.parts[0].plan


#: Part strategies a union may hold (free parts, selections and private partition selection are
#: not combined into one charge yet).
UNION_PARTS = (Noisy, WithQuantiles)


def union_of(parts: tuple[Part, ...], plan_hash: str, names: PartNames = UNION_NAMES) -> UnionAll:
    """The :class:`UnionAll` of ``parts``.

    Raises:
        UnsupportedQuery: a part whose strategy is not one of :data:`UNION_PARTS`, naming the part.
    """
    why = {ExactPublic: "reads public tables only (send it alone: it is exact and free)",
           PublicKeysOnly: "releases public keys only (send it alone: it is free)",
           TopK: "is a selection query (ORDER BY an aggregate, LIMIT k)",
           NoisyWithPartitionSelection: "groups by keys without public keys (private partition selection)",
           QuantilesWithPartitionSelection: "groups by keys without public keys (private partition selection)"}
    for i, part in enumerate(parts):
        if not isinstance(part.strategy, UNION_PARTS):
            raise nothing_charged(UnsupportedQuery(
                f"{names.of(i + 1, len(parts))} {why.get(type(part.strategy), 'is not a noisy release')}"
                f": {names.whole} combines counts, sums and quantiles over public keys",
                {names.detail: i + 1, "reason": "union_part", "strategy": part.strategy.name}))
    return UnionAll(parts, plan_hash)


Strategy = Union[ExactPublic, PublicKeysOnly, TopK, Noisy, NoisyWithPartitionSelection, WithQuantiles,
                 QuantilesWithPartitionSelection, UnionAll]


def choose(plan: QueryPlan, policy: DatasetPolicy) -> Strategy:
    """The release strategy of ``plan`` (module docstring; the first that applies).

    Args:
        plan: a validated plan (:func:`dpgate.sql.parse.parse_query`).
        policy: the policy the plan was planned against (a joined table's, for joins).
    Returns:
        One of the strategy values, each carrying what its runner needs.
    Raises:
        UnsupportedQuery: the plan has a selection's shape but cannot be answered as one
            (:func:`dpgate.sql.selection_query.recognize`); the refusal says nothing was charged.
    """
    if reads_public_only(plan, policy):
        return ExactPublic(plan)
    if releases_public_keys_only(plan, policy):
        return PublicKeysOnly(plan)
    try:
        selection = recognize(plan, policy)
    except DpgateError as e:
        raise nothing_charged(e)
    if selection is not None:
        return TopK(plan, selection)
    quantile_columns = tuple(dict.fromkeys(p.column for p in plan.primitives if p.kind == "quantile"))
    if quantile_columns and plan.selected_keys:
        return QuantilesWithPartitionSelection(plan, without_quantiles(plan), quantile_columns,
                                               tuple(plan.selected_keys))
    if quantile_columns:
        return WithQuantiles(plan, without_quantiles(plan), quantile_columns)
    if plan.selected_keys:
        return NoisyWithPartitionSelection(plan, tuple(plan.selected_keys))
    return Noisy(plan)


def free(strategy: Strategy) -> bool:
    """True for the strategies that read no protected data and cost nothing."""
    return isinstance(strategy, (ExactPublic, PublicKeysOnly))
