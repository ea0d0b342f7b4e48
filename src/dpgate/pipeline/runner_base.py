"""The base of the runners (issue 20 step 5): :class:`Calibrated` (what a strategy costs and
how it is noised), :class:`QueryContext` (what a runner may use of the gateway) and
:class:`Runner` (the charge that refuses to run before ``prepare`` or at a cost other than the
calibrated one). The runners themselves are in :mod:`dpgate.pipeline.runners`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from dpgate import accounting
from dpgate.errors import DpgateError, ExecutionError, Internal
from dpgate.pipeline import documents
from dpgate.pipeline.strategy import Strategy
from dpgate.policy import DatasetPolicy
from dpgate.releases import Release
from dpgate.releases.keys import post_processing_settings

__all__ = ["Calibrated", "QueryContext", "Runner"]


@dataclass(frozen=True)
class Calibrated:
    """A calibrated release, before the charge.

    Attributes:
        mechanism: the mechanism's name as releases state it (None: exact, no noise).
        cost: what the ledger is charged (zero for an exact release).
        scales: primitive id → noise scale (integer units; quantiles: rank scale).
        exact: True when nothing is noised and nothing is charged.
        measurement: the mechanism side's calibration (:class:`dpgate.mechanisms.Calibration`,
            :class:`dpgate.quantile_release.PlanCalibration`,
            :class:`dpgate.selection.SelectionCalibration`), None for a free release.
        sensitivities: primitive id → :class:`dpgate.sensitivity.Sensitivity`.
        selection_delta: δ the threshold mechanism spends (partition selection), else None.
    """

    mechanism: str | None
    cost: accounting.Cost
    scales: Mapping[str, float] = field(default_factory=dict)
    exact: bool = False
    measurement: Any = None
    sensitivities: Mapping[str, Any] = field(default_factory=dict)
    selection_delta: float | None = None

    def describe(self) -> dict[str, Any]:
        """``{mechanism, noise_scales, exact, cost: {rho, epsilon}}`` (JSON-ready)."""
        m = self.measurement
        return {"mechanism": self.mechanism, "noise_scales": dict(self.scales), "exact": self.exact,
                "cost": {"rho": getattr(m, "rho", 0.0 if m is None else None),
                         "epsilon": getattr(m, "epsilon", 0.0 if m is None else None)}}


@dataclass(frozen=True)
class QueryContext:
    """What a runner may use, given explicitly (no gateway internals).

    Attributes:
        dataset: the dataset queried. policy: the policy the plan reads (a join's for a join).
        ledger: the budget ledger. engine: the dataset's engine (``check``, ``execute``,
        ``unit_is_unique``). release_cache: the release cache (its ``store`` stores releases).
        data_version: the published data version a release is cached under (called per query).
        salt_source: draws the secret salt of the bounding rewrite.
    """

    dataset: str
    policy: DatasetPolicy
    ledger: Any
    engine: Any
    release_cache: Any
    data_version: Callable[[], str]
    salt_source: Callable[[], int]


@contextmanager
def _charged_execution(receipt: Any) -> Iterator[None]:
    """Engine failures after the charge as one :class:`ExecutionError` naming the charge (no data in
    the message); dpgate's own errors (a :class:`~dpgate.errors.QueryTimeout`) pass with
    ``details.charged`` (False: an exact release, ``receipt`` None) and ``details.charge_id`` added."""
    charged = {"charged": receipt is not None,
               **({"charge_id": receipt.charge_id} if receipt is not None else {})}
    try:
        yield
    except DpgateError as exc:
        for k, v in charged.items():
            exc.details.setdefault(k, v)
        raise
    except Exception as exc:  # noqa: BLE001 - no data in the message
        raise ExecutionError("executing the bounded query failed; the charge stays",
                             {"charge_id": receipt and receipt.charge_id, "charged": receipt is not None}) from exc


class Runner:
    """The common part of every runner: the charge and its two assertions (module docstring)."""

    def __init__(self, strategy: Strategy, ctx: QueryContext) -> None:
        self.strategy = strategy
        self.plan = strategy.plan
        self.ctx = ctx
        self.policy = ctx.policy
        self._prepared = False

    def prepare(self, engine: Any, salt: int) -> None:  # pragma: no cover - every runner has one
        """Render every statement of the strategy and have ``engine`` check each one (before the charge).

        Raises: what the engine's ``check`` raises (InvalidSql, UnsupportedQuery: nothing is charged).
        """
        raise NotImplementedError

    def _charge(self, cal: Calibrated, consumer: str, release_key: str, *, purpose: str,
                metadata: Mapping[str, Any], scope: tuple[str, ...] | None, **extra: Any) -> Any:
        """Charge ``cal.cost`` under the attempt's single-flight key (None for an exact release).

        Raises:
            Internal: called before :meth:`prepare` finished, or the ledger charged another cost.
            BudgetExhausted and the ledger's errors.
        """
        if not self._prepared:
            raise Internal("a release was about to be charged before its statements were rendered and checked")
        if cal.exact:
            return None
        receipt = self.ctx.ledger.charge(self.policy.population, consumer, cal.cost, purpose=purpose[:500],
                                         release_key=release_key, metadata=dict(metadata), **extra,
                                         **({"cohorts": scope} if scope is not None else {}))
        charged = getattr(receipt, "cost", None)
        if charged is not None and not getattr(receipt, "duplicate", False) and charged != cal.cost:
            raise Internal("the ledger charged a cost other than the calibrated one",
                           {"charge_id": getattr(receipt, "charge_id", None)})
        return receipt

    def _serve(self, hit: Release, key: str, display: list[str]) -> dict[str, Any]:
        """Serve a stored release for this plan at no cost.

        The same query (same plan hash) under the same display settings gets the stored
        release under this request's column labels. A query that differs in
        post-processing — outputs, HAVING, ORDER BY, LIMIT, or the policy's display
        settings since the release was made — gets a new release derived from the stored
        noisy primitives with the rules in force now (post-processing: free, Dwork & Roth
        2014 Prop. 2.1), stored under its own key and pointing at the release it was
        derived from.
        """
        same = hit.plan_hash == self.plan.plan_hash and hit.post_processing == post_processing_settings(self.policy)
        if same or hit.noisy is None:
            return documents.rename(hit.to_dict(cached=True), display)
        stored = self.ctx.release_cache.store.put(documents.derived_release(hit, self.policy, self.plan, key))
        return documents.rename(stored.to_dict(cached=True), display)
