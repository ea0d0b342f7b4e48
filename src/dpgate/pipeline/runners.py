"""One runner per release strategy (issue 20 step 5, DESIGN.md "Compile once").

:func:`runner_for` maps a :mod:`~dpgate.pipeline.strategy` value to its runner; ``Gateway.query``
and ``Gateway.explain`` both go through it (one dispatch). Every runner has

* ``resolve(budget, mechanism) → ResolvedBudget`` — cheap, before the release cache lookup;
* ``calibrate(budget) → Calibrated`` — sensitivities, noise scales and the cost (reads no data);
* ``prepare(engine, salt)`` — renders every statement the release runs and has the engine check
  (bind) each, before anything is charged: a query the engine refuses costs nothing;
* ``run(engine, salt)`` — executes the prepared statements and noises the result;
* ``explain(...)`` and ``answer(...)`` — the explain document, and the release.

The charge (:meth:`Runner._charge`) refuses to happen before ``prepare`` finished and checks that
the ledger charged exactly the calibrated cost (Tumult Analytics' assertion that a measurement's
cost equals its charge); either violation is an :class:`~dpgate.errors.Internal` error. Once
charged, nothing refunds the charge (a failed execution stays charged).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping

import numpy as np

from dpgate import accounting, partition_selection, quantile_release
from dpgate.cohorts import charge_scope, scope_signature
from dpgate.errors import (Conflict, DpgateError, ExecutionError, Internal, InvalidBudget, InvalidRequest,
                           UnsupportedQuery)
from dpgate.mechanisms import calibrate as calibrate_noise, ci95_halfwidth, mechanism_name, sample
from dpgate.pipeline import documents, union_release
from dpgate.pipeline.budget import (QueryBudget, ResolvedBudget, fit, mechanism_of, refuse_without_gdp_claim,
                                    resolve, resolve_selection, stated)
from dpgate.pipeline.strategy import (ExactPublic, Noisy, NoisyWithPartitionSelection, PublicKeysOnly,
                                      QuantilesWithPartitionSelection, Strategy, TopK, UnionAll, WithQuantiles)
from dpgate.policy import DatasetPolicy
from dpgate.postprocess import finalize
from dpgate.postprocess.calibration import scales_for_ci95
from dpgate.postprocess.split import split_weights
from dpgate.postprocess.expected import accuracy_reference, column_bounds, expected_accuracy
from dpgate.releases import CacheKeys, Release
from dpgate.releases.keys import post_processing_settings
from dpgate.representable import check_representable
from dpgate import selection as top_k
from dpgate.sensitivity import sensitivities
from dpgate.sql import partition_selection as selection_plan
from dpgate.sql.bound import bounded_query, bounded_sql_template
from dpgate.sql.parse import nothing_charged
from dpgate.sql.public import MAX_PUBLIC_ROWS, exact_query, exact_sql, public_key_columns, reads_rows
from dpgate.sql.quantile import histogram_query, histogram_sql_template
from dpgate.sql.sources import plan_source
from dpgate.sql.explain import contribution, released_columns
from dpgate.sql.union import in_part

__all__ = ["RUNNERS", "Calibrated", "QueryContext", "Runner", "runner_for"]


from dpgate.pipeline.runner_base import Calibrated, QueryContext, Runner, _charged_execution  # noqa: F401 - re-exported


class ExactPublicRunner(Runner):
    """Public tables only: the exact answer of SQL generated from the plan, free."""

    def resolve(self, budget: QueryBudget | None, mechanism: str | None) -> ResolvedBudget | None:
        """None: a public-only query spends no budget."""
        return None

    def calibrate(self, budget: ResolvedBudget | None = None) -> Calibrated:
        """The zero cost (ρ = 0) of an exact public answer."""
        return Calibrated(None, accounting.Cost.zcdp(0.0), exact=True)

    def prepare(self, engine: Any, salt: int = 0) -> None:
        """Render the exact query over the public tables (a sqlglot tree; nothing to check: no charge follows)."""
        self._statement = exact_query(self.plan, self.policy)
        self._prepared = True

    def run(self, engine: Any, salt: int = 0) -> Mapping[str, Any]:
        """Execute the prepared exact query; column name → NumPy array. Raises ExecutionError (no data)."""
        try:
            return engine.execute(self._statement)
        except DpgateError:
            raise
        except Exception as exc:  # noqa: BLE001 - public data, but keep one error shape
            raise ExecutionError("executing the exact query on public tables failed") from exc

    def explain(self, shown: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        """The explain document of an exact public answer (free; the exact SQL shown)."""
        return documents.free_explain(self.ctx.dataset, self.plan, shown, public=True,
                                      exact_sql=exact_sql(self.plan, self.policy))

    def answer(self, **_: Any) -> dict[str, Any]:
        """The exact answer of a query that reads public tables only (no charge, no noise).

        Public tables hold nothing to protect (``public = true`` in the policy), so the
        release is the exact result of SQL generated from the plan
        (:func:`dpgate.sql.public.exact_sql`), marked ``exact`` and ``public`` and stored
        like any release; it is not charged and carries no accuracy entries.
        """
        plan = self.plan
        version = self.ctx.data_version()
        self.prepare(self.ctx.engine)
        values = self.run(self.ctx.engine)
        names = [o.name for o in plan.visible_outputs]
        columns = [[documents.plain(v) for v in np.asarray(values[n]).tolist()] for n in names]
        rows = [list(r) for r in zip(*columns)] if columns else []
        if reads_rows(plan) and len(rows) > MAX_PUBLIC_ROWS:
            raise UnsupportedQuery(
                f"the query reads more than {MAX_PUBLIC_ROWS:,} rows of a public table: narrow it with "
                "WHERE or LIMIT, or aggregate (nothing was charged: public data costs nothing)",
                {"rows": MAX_PUBLIC_ROWS, "charged": False})
        release = documents.free_release(self.policy, plan, rows, version, key_prefix="public", extra={
            "public": True,
            "note": "this query reads public tables only (public = true in the policy): answered "
                    "exactly and at no privacy cost",
        })
        return self.ctx.release_cache.store.put(release).to_dict(cached=False)


class PublicKeysOnlyRunner(ExactPublicRunner):
    """Keys only, every key public: the policy's key combinations, free, no data read."""

    def prepare(self, engine: Any, salt: int = 0) -> None:
        """Nothing to render: the release is the policy's key list (no data is read)."""
        self._prepared = True  # nothing to render: no data is read

    def run(self, engine: Any, salt: int = 0) -> Mapping[str, Any]:
        """The policy's public key combinations as columns (column name → array)."""
        return public_key_columns(self.plan, self.policy)

    def explain(self, shown: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        """The explain document of a keys-only release (free, no data read)."""
        return documents.free_explain(self.ctx.dataset, self.plan, shown, public=False, exact_sql=None)

    def answer(self, **_: Any) -> dict[str, Any]:
        """The release of a keys-only query whose keys are all public (no charge, no data read).

        ``SELECT educ FROM pums GROUP BY educ`` asks which keys there are; with public keys
        that is the policy's key list (every combination, as any GROUP BY over public keys
        releases it, empty groups included), which is a function of the policy alone and
        so costs nothing. Which keys occur in the data is *not* released: that would need a
        noisy count per key (ask ``COUNT(*)``) or private partition selection (keys without
        public keys). HAVING / ORDER BY / LIMIT / select-list expressions run on the keys
        (:func:`dpgate.postprocess.finalize`).
        """
        self.prepare(self.ctx.engine)
        table = finalize(self.plan, self.policy, self.run(self.ctx.engine), {}, {}, {}, mechanism="none")
        release = documents.free_release(self.policy, self.plan, [list(r) for r in table.rows],
                                         self.ctx.data_version(), key_prefix="keys",
                                         extra={"public_keys_only": True, "note": documents.KEYS_ONLY_NOTE})
        return self.ctx.release_cache.store.put(release).to_dict(cached=False)


class TopKRunner(Runner):
    """A selection query: the exponential mechanism releases the k best keys (:mod:`dpgate.selection`)."""

    strategy: TopK

    def resolve(self, budget: QueryBudget | None, mechanism: str | None = None) -> ResolvedBudget:
        """The selection's resolved budget (ρ or pure ε of the exponential mechanism; see :mod:`dpgate.selection`)."""
        return ResolvedBudget(**top_k.resolve_selection_budget(self.policy, budget))

    def calibrate(self, budget: ResolvedBudget) -> Calibrated:
        """The top-k calibration: ρ = k·ε₁²/8 for ε₁ per key (an ε-bounded-range mechanism is ε²/8-zCDP, Cesar & Rogers 2021, Sec. 3; :func:`dpgate.selection.calibrate_selection`)."""
        cal = top_k.calibrate_selection(self.strategy.selection, self.policy, budget.to_dict())
        return Calibrated(top_k.MECHANISM, cal.cost, {}, False, cal)

    def prepare(self, engine: Any, salt: int) -> None:
        """Render the bounded score query with ``salt`` and have the engine check it (before the charge)."""
        self._statement = bounded_query(self.plan, self.policy, salt=salt)
        engine.check(self._statement)
        self._prepared = True

    def run(self, engine: Any, salt: int | None = None) -> Mapping[str, Any]:
        """Execute the prepared bounded score query (after the charge); column name → array."""
        return engine.execute(self._statement)

    def explain(self, shown: Mapping[str, Any], *, budget: QueryBudget | None, consumer: str | None,
                **_: Any) -> dict[str, Any]:
        """The explain document of a top-k selection (cost, fit against the ledger; nothing charged)."""
        ledger, policy = self.ctx.ledger, self.policy
        doc = top_k.explain_selection(ledger, self.ctx.dataset, policy, self.strategy.selection, budget,
                                      lambda cost: fit(ledger, policy, cost, consumer))
        return {**doc, **shown}

    def answer(self, *, consumer: str, budget: QueryBudget | None, search_id: str | None = None,
               **_: Any) -> dict[str, Any]:
        """Charge ρ, run the bounded query, release the k selected keys; a repeat is served cached, free."""
        plan, policy, ctx = self.plan, self.policy, self.ctx
        sel = self.strategy.selection
        resolved = self.resolve(budget)
        version = ctx.data_version()
        scope = charge_scope(ctx.ledger, policy, plan)  # cohorts hook (issue 23)
        keys = CacheKeys.of(plan_hash=plan.plan_hash + scope_signature(scope),
                            noise_signature=top_k.noise_signature(sel) + scope_signature(scope),
                            data_version=version, mechanism=top_k.MECHANISM, budget=resolved.to_dict(),
                            post_processing={})
        with ctx.release_cache.flight(keys) as flight:
            hit = flight.lookup()
            if hit is not None:
                return hit.to_dict(cached=True)
            cal = self.calibrate(resolved)
            refuse_without_gdp_claim(ctx.ledger, policy, cal.cost, consumer)  # before anything else
            salt = ctx.salt_source()
            self.prepare(ctx.engine, salt)
            metadata = {"dataset": ctx.dataset, "plan_hash": plan.plan_hash, "data_version": version,
                        "kind": "selection", **({"search_id": search_id} if search_id is not None else {})}

            def compute(receipt: Any) -> Release:
                with _charged_execution(receipt):
                    values = self.run(ctx.engine, salt)
                return top_k.selection_release(policy, sel, cal.measurement, resolved.to_dict(), receipt,
                                               keys.noise, version, values)

            release, fresh = flight.run(
                charge=lambda key: self._charge(cal, consumer, key, purpose=f"selection on {ctx.dataset}: "
                                                f"{plan.canonical_sql}", metadata=metadata, scope=scope),
                compute=compute)
        return release.to_dict(cached=not fresh)


def ci95_scales(policy: DatasetPolicy, plan: Any, mech: str, resolved: ResolvedBudget, sens: Mapping[str, Any]):
    """Scales (integer units) meeting a ``ci95`` budget on every aggregate output."""
    targets = documents.cell_targets(policy, plan)
    gaussian = mechanism_name(mech) == "discrete_gaussian"
    d_in = {pid: (s.l2 if gaussian else s.l1) for pid, s in sens.items()}
    units = {p.id: documents.primitive_unit(policy, plan, p.id) for p in plan.primitives}
    return scales_for_ci95(targets, d_in, units, mechanism=mech, halfwidth=resolved.ci95,
                           expected_count=resolved.expected_count)


def budget_split_weights(policy: DatasetPolicy, plan: Any, mech: str, sens: Mapping[str, Any]) -> dict | None:
    """The c_i of a ρ/ε budget's error-minimising split (:func:`dpgate.postprocess.split.split_weights`).

    Data-independent: the outputs, the policy's bounds and resolutions, the sensitivities. None
    (equal split) when some noisy primitive belongs to no weighted output.
    """
    gaussian = mechanism_name(mech) == "discrete_gaussian"
    d_in = {pid: (s.l2 if gaussian else s.l1) for pid, s in sens.items()}
    units = {p.id: documents.primitive_unit(policy, plan, p.id) for p in plan.primitives}
    return split_weights(documents.cell_targets(policy, plan), d_in, units)


def split_description(policy: DatasetPolicy, plan: Any, m: Any, weights: Mapping[str, float] | None) -> dict[str, Any]:
    """Explain's ``primitive_split``: the rule and each noisy primitive's ρ (or ε), share and σ (or b).

    ``sigma``/``scale`` in output units (the sampler's scale × the primitive's unit).
    """
    gaussian = m.mechanism == "discrete_gaussian"
    total = m.rho if gaussian else m.epsilon
    rows = {}
    for pid, cost in m.primitive_costs.items():
        if m.scales.get(pid, 0.0) == 0:
            continue
        p = plan.primitive(pid)
        rows[pid] = {"aggregate": documents.primitive_text(p), "rho" if gaussian else "epsilon": cost,
                     "share": cost / total if total else None,
                     "sigma" if gaussian else "scale": m.scales[pid] * documents.primitive_unit(policy, plan, pid)}
    return {"rule": "equal" if weights is None else "optimal",
            "doc": "the budget is split to minimise the outputs' noise variance (docs/DESIGN_NOTES.md "
                   "\"Utility at equal privacy\"); shares and σ are calibration, not plan",
            "primitives": rows}


class NoisyRunner(Runner):
    """Counts and sums over public keys: one noisy vector per primitive."""

    #: the plan's keys are selected privately (:class:`PartitionSelectionRunner`)
    selecting = False
    #: a ρ/ε budget goes through :meth:`_measure`'s error-minimising split (explain's ``primitive_split``)
    _splits_budget = True

    def __init__(self, strategy: Strategy, ctx: QueryContext) -> None:
        super().__init__(strategy, ctx)
        self.mechanism = ""

    # ------------------------------------------------------------ budget and calibration

    def resolve(self, budget: QueryBudget | None, mechanism: str | None) -> ResolvedBudget:
        """The mechanism (remembered for :meth:`calibrate`) and the resolved budget with δ_q."""
        ledger, policy = self.ctx.ledger, self.policy
        self.mechanism = mechanism_of(policy, mechanism)
        return resolve_selection(ledger, policy, self.plan, resolve(ledger, policy, self.mechanism, budget), budget)

    def calibrate(self, budget: ResolvedBudget) -> Calibrated:
        """Calibration and sensitivities for a resolved budget; refusals cost nothing.

        A ``ci95`` budget constrains each released aggregate cell (AVG/VAR/STDDEV at the
        budget's ``expected_count``; :func:`~dpgate.postprocess.calibration.scales_for_ci95`).
        """
        plan = self.plan
        try:
            check_representable(plan, self.policy)
            cal, sens = self._measure(budget)
        except InvalidBudget as e:  # name the aggregate, not the internal primitive id
            pid = e.details.get("primitive")
            if isinstance(pid, str) and pid in {p.id for p in plan.primitives}:
                label = documents.primitive_text(plan.primitive(pid))
                e.message = e.message.replace(f"primitive {pid!r}", label)
                e.args = (e.message,)
                e.details["aggregate"] = label
            raise nothing_charged(e) from None
        selection = getattr(cal, "selection", None) if self.selecting else None
        return Calibrated(cal.mechanism, cal.cost, dict(cal.scales), bool(cal.exact), cal, sens,
                          None if selection is None else selection.delta)

    def _measure(self, budget: ResolvedBudget):
        plan, policy, mech = self.plan, self.policy, self.mechanism
        sens = sensitivities(plan, policy)
        pairs = {pid: (s.l1, s.l2) for pid, s in sens.items()}
        if self.selecting:  # issue 11: the selection histogram shares the budget
            budget_arg = ({"rho": budget.zcdp_rho()} if mech == "gaussian" else {"epsilon": budget.pure_epsilon()})
            return partition_selection.calibrate_selecting(
                plan, policy, pairs, mechanism=mech, delta=budget.selection_delta, **budget_arg), sens
        if budget.is_ci95:
            return calibrate_noise(pairs, mechanism=mech,
                                   scales=ci95_scales(policy, plan, mech, budget, sens).scales), sens
        weights = budget_split_weights(policy, plan, mech, sens)  # issue 22 item 5: error-minimising split
        if mech == "gaussian":
            # a standalone ε at the δ it is charged at → ρ by the ledger's one conversion (its cap rule)
            return calibrate_noise(pairs, mechanism=mech, rho=budget.zcdp_rho(), weights=weights), sens
        # laplace: pure ε; a ρ budget buys ε = √(2ρ) (ε-DP ⇒ ε²/2-zCDP, Bun–Steinke 2016 Prop. 1.4)
        return calibrate_noise(pairs, mechanism=mech, epsilon=budget.pure_epsilon(), weights=weights), sens

    # ------------------------------------------------------------ statements

    def _bounded(self, plan: Any, salt: int) -> tuple[Any, Any]:
        """The bounded statement in the fast form (None when the engine's load found more than one
        row per unit, or for a join) and in the general form.

        Where the engine's load found one row per privacy unit in the table, the query skips the
        per-unit aggregation (same bounded values, less work; see :mod:`dpgate.sql.bound`). A
        joined table never takes the fast path: a join can give one unit several rows even where
        each table read has one row per unit.
        """
        policy = self.policy
        unique = plan_source(plan, policy).unit_unique_possible and \
            self.ctx.engine.unit_is_unique(policy.name, plan.table)
        fast = bounded_query(plan, policy, salt=salt, unit_unique=True) if unique else None
        return fast, bounded_query(plan, policy, salt=salt)

    @staticmethod
    def _either(run: Callable[[Any], Any], fast: Any, general: Any) -> Any:
        """``run`` on the fast form; the engine refuses it with ``Conflict`` if a reload swapped in
        data without one row per unit meanwhile, and it then runs once more in the general form,
        so a reload never fails a charged query."""
        if fast is None:
            return run(general)
        try:
            return run(fast)
        except Conflict:
            return run(general)

    def prepare(self, engine: Any, salt: int) -> None:
        """Render the bounded statement and have the engine check it (before the charge)."""
        self._fast, self._general = self._bounded(self.plan, salt)
        self._either(engine.check, self._fast, self._general)
        if self.selecting:  # what select_rows reads of the plan, before the charge
            selection_plan.public_combinations(self.plan, self.policy)
        self._prepared = True

    def run(self, engine: Any, salt: int, cal: Calibrated, receipt: Any = None) -> tuple[dict, dict, dict]:
        """Execute and noise: ``(group keys, noisy values, 95 % half-widths)`` per primitive."""
        with _charged_execution(receipt):
            values = self._either(engine.execute, self._fast, self._general)
        m, plan = cal.measurement, self.plan
        if self.selecting:  # issue 11: threshold, then noise on the selected rows
            keys, noisy = partition_selection.select_rows(plan, self.policy, m, values)
        else:
            keys = {k: values[k] for k in plan.group_by}
            noisy = sample(m, {p.id: values[p.id] for p in plan.primitives})
        return keys, noisy, {pid: ci95_halfwidth(m.mechanism, s) for pid, s in m.scales.items()}

    def bounded_template(self) -> Any:
        """The bounded SQL of the count/sum primitives (salt hidden)."""
        return bounded_sql_template(self.plan, self.policy)

    # ------------------------------------------------------------ explain and answer

    def explain(self, shown: Mapping[str, Any], *, budget: QueryBudget | None, mechanism: str | None,
                consumer: str | None, trial: Callable[[Any, Any], Any] | None = None) -> dict[str, Any]:
        """Plan, bounded SQL (salt hidden), sensitivities and cost; reads no data, charges nothing."""
        plan, policy, ledger = self.plan, self.policy, self.ctx.ledger
        resolved = self.resolve(budget, mechanism)
        cal = self.calibrate(resolved)
        m, sens = cal.measurement, cal.sensitivities
        cap = ledger.cap(policy.population)
        delta = cap.rho_delta
        extra: dict[str, Any] = {}
        scope = charge_scope(ledger, policy, plan)  # cohorts hook (issue 23)
        if scope is not None:
            extra["cohorts"] = {"column": policy.cohorts.column, "drew_on": list(scope)}
        if trial is not None:  # utility trial on the proxy (issue 23 item 6): free, reads only the proxy
            extra["trial"] = trial(plan, m)
        if self.selecting:  # issue 11: threshold, δ and the units a key needs
            extra["partition_selection"] = partition_selection.describe(plan, m, resolved.selection_delta)
        if resolved.is_ci95:
            extra["accuracy_target"] = ci95_scales(policy, plan, self.mechanism, resolved, sens).describe(
                resolved.ci95, resolved.expected_count)
        elif self._splits_budget and not m.exact:
            weights = budget_split_weights(policy, plan, self.mechanism, sens)
            extra["primitive_split"] = split_description(policy, plan, m, weights)
        extra.update(_source_description(policy, plan))
        extra.update(self._quantiles_description(m))
        return {
            "dataset": self.ctx.dataset,
            "canonical_sql": plan.canonical_sql,
            "plan_hash": plan.plan_hash,
            **shown,
            "plan": plan.canonical_dict(),
            # the analyst's names of the outputs (the plan's canonical form leaves labels out)
            "columns": [o.label or o.name for o in plan.visible_outputs],
            "labels": {o.name: o.label or o.name for o in plan.outputs},
            "bounded_sql": self.bounded_template(),
            "computed_keys": [
                {"name": k.name, "expression": k.expression, "rule": k.rule, "type": k.type,
                 "domain_size": len(k.domain)}
                for k in plan.computed_keys
            ],
            "sensitivity": {pid: {"l1": s.l1, "l2": s.l2, "linf": s.linf} for pid, s in sens.items()},
            "mechanism": m.mechanism,
            "noise_scales": dict(m.scales),
            "noise_scale_units": documents.noise_scale_units(policy, plan, m.scales),
            "budget": resolved.to_dict(),
            "cost": {
                "rho": m.rho,
                "epsilon": m.epsilon,
                **stated(m.cost, delta, cap.gdp),
                **({"selection_delta": cal.selection_delta} if self.selecting else {}),
                **fit(ledger, policy, m.cost, consumer, scope,
                      selection_delta=(cal.selection_delta or 0.0) if self.selecting else 0.0),
            },
            **extra,
        }

    def _quantiles_description(self, measurement: Any) -> dict[str, Any]:
        return {}

    def _cache_keys(self, resolved: ResolvedBudget, scope: Any, version: str) -> CacheKeys:
        """Two keys: the noise key names the noisy primitives (what is charged and noised:
        table, filter, grouping, primitives, bounds, budget, mechanism, data version); the
        release key names this exact query, post-processing (outputs, HAVING, ORDER BY,
        LIMIT) and display settings included. Queries that differ only in post-processing
        share one charge."""
        plan = self.plan
        return CacheKeys.of(plan_hash=plan.plan_hash + scope_signature(scope),
                            noise_signature=documents.noise_signature(plan, cell_targets=resolved.is_ci95)
                            + scope_signature(scope),
                            data_version=version, mechanism=self.mechanism, budget=resolved.to_dict(),
                            post_processing=post_processing_settings(self.policy))

    def stored(self, budget: QueryBudget | None, mechanism: str | None) -> bool:
        """Whether a release of this plan at ``budget`` is stored (it would be served, free). Reads
        the release store only: charges nothing, draws no noise."""
        resolved = self.resolve(budget, mechanism)
        scope = charge_scope(self.ctx.ledger, self.policy, self.plan)
        keys = self._cache_keys(resolved, scope, self.ctx.data_version())
        with self.ctx.release_cache.flight(keys) as flight:
            return flight.lookup() is not None

    def answer(self, *, consumer: str, budget: QueryBudget | None, mechanism: str | None,
               **_: Any) -> dict[str, Any]:
        """The DP release of this plan, charged to ``consumer`` (see ``Gateway.query``)."""
        plan, policy, ctx = self.plan, self.policy, self.ctx
        resolved = self.resolve(budget, mechanism)
        scope = charge_scope(ctx.ledger, policy, plan)  # cohorts hook (issue 23): the cohorts this charge draws on
        version = ctx.data_version()
        budget_doc = resolved.to_dict()
        keys = self._cache_keys(resolved, scope, version)
        display = documents.labels(plan)
        with ctx.release_cache.flight(keys) as flight:
            hit = flight.lookup()
            if hit is not None:
                return self._serve(hit, keys.release, display)
            # Calibrate, render and bind before charging (reads no data): a query the engine
            # refuses whatever the data costs nothing.
            cal = self.calibrate(resolved)
            refuse_without_gdp_claim(ctx.ledger, policy, cal.cost, consumer,  # before anything else
                                     (cal.selection_delta or 0.0) if self.selecting else 0.0)
            salt = ctx.salt_source()
            self.prepare(ctx.engine, salt)
            metadata = {"dataset": ctx.dataset, "plan_hash": plan.plan_hash, "data_version": version}
            # issue 11: the δ OpenDP's threshold map gives, against the cap's selection_delta
            extra = {"selection_delta": cal.selection_delta} if self.selecting else {}
            # the document's data-independent part, built and checked before the charge
            preamble = documents.release_preamble(policy, plan, cal.measurement, budget_doc,
                                                  selecting=self.selecting)

            def compute(receipt: Any) -> Release:
                out = self.run(ctx.engine, salt, cal, receipt)
                return documents.noisy_release(policy, plan, cal.measurement, budget_doc, receipt, keys.noise,
                                               version, *out, selecting=self.selecting, preamble=preamble)

            # ---- once charged, nothing refunds the charge (a failed attempt stays charged) ----
            release, fresh = flight.run(
                charge=lambda key: self._charge(cal, consumer, key,
                                                purpose=f"query on {ctx.dataset}: {plan.canonical_sql}",
                                                metadata=metadata, scope=scope, **extra),
                compute=compute)
        if fresh:
            return release.to_dict(cached=False)
        return self._serve(release, keys.release, display)


def _source_description(policy: DatasetPolicy, plan: Any) -> dict[str, Any]:
    """Explain's ``per_unit`` (the outer row's derived ranges) or ``join`` (where bounding happens),
    from the plan's source node (:meth:`dpgate.sql.sources.Source.describe`)."""
    return plan_source(plan, policy).describe()


class PartitionSelectionRunner(NoisyRunner):
    """Counts and sums grouped by keys without public keys: the selection histogram shares the
    budget, the threshold mechanism selects the keys, the selected rows are noised
    (:mod:`dpgate.partition_selection`)."""

    selecting = True
    _splits_budget = False  # the selection histogram's share: equal (partition_selection.calibrate_selecting)


class QuantilesRunner(NoisyRunner):
    """Counts/sums noised as :class:`NoisyRunner`'s, and each quantile selected on its histogram."""

    strategy: WithQuantiles
    _splits_budget = False  # quantile_release.calibrate_plan splits by its own rule

    def _measure(self, budget: ResolvedBudget):
        sens = sensitivities(self.strategy.base, self.policy)
        pairs = {pid: (s.l1, s.l2) for pid, s in sens.items()}
        return quantile_release.calibrate_plan(self.plan, self.policy, self.mechanism, budget.to_dict(), pairs,
                                               calibrate_noise), sens

    def prepare(self, engine: Any, salt: int) -> None:
        """Render the count/sum statement and one histogram per quantile column; check each
        (the count/sum statement in its general form) before the charge."""
        base = self.strategy.base
        self._fast, self._general = self._bounded(base, salt) if base.primitives else (None, None)
        self._histograms = {c: histogram_query(self.plan, self.policy, c, salt=salt) for c in self.strategy.columns}
        for statement in ([self._general] if base.primitives else []) + list(self._histograms.values()):
            engine.check(statement)
        self._prepared = True

    def run(self, engine: Any, salt: int, cal: Calibrated, receipt: Any = None) -> tuple[dict, dict, dict]:
        """Keys, noisy values and half-widths (quantiles: the candidate index per group, rank error)."""
        plan, base, m = self.plan, self.strategy.base, cal.measurement
        keys: dict[str, Any] = {}
        noisy: dict[str, Any] = {}
        with _charged_execution(receipt):
            if base.primitives:
                values = self._either(engine.execute, self._fast, self._general)
                keys = {k: values[k] for k in plan.group_by}
                noisy = dict(sample(m.base, {p.id: values[p.id] for p in base.primitives}))
            qkeys, qnoisy = quantile_release.run(plan, self.policy, m, engine.execute, salt,
                                                 statements=self._histograms)
        noisy.update(qnoisy)
        return keys or qkeys, noisy, m.halfwidths()

    def bounded_template(self) -> Any:
        """The bounded query's SQL text with a salt placeholder (explain's template), None without count/sum primitives."""
        base = self.strategy.base
        return bounded_sql_template(base, self.policy) if base.primitives else None

    def _quantiles_description(self, measurement: Any) -> dict[str, Any]:
        # grid, scale, rank error, cost
        return {"quantiles": {pid: {**q.describe(),
                                    "histogram_sql": histogram_sql_template(self.plan, self.policy, q.column)}
                              for pid, q in measurement.quantiles.items()}}


class SelectingQuantilesRunner(QuantilesRunner):
    """Quantiles grouped by keys without public keys (issue 21 item 8): step 1, the count/sum
    statement (with the candidates' unit counts) and the threshold mechanism select the groups;
    step 2, each quantile is chosen on the selected groups' histograms only. One charge, before
    either step, for both (:func:`dpgate.quantile_release.calibrate_selecting_plan`)."""

    strategy: QuantilesWithPartitionSelection
    selecting = True

    def _measure(self, budget: ResolvedBudget):
        sens = sensitivities(self.strategy.base, self.policy)
        pairs = {pid: (s.l1, s.l2) for pid, s in sens.items()}
        return quantile_release.calibrate_selecting_plan(self.plan, self.policy, self.mechanism, budget.to_dict(),
                                                         pairs, budget.selection_delta), sens

    def prepare(self, engine: Any, salt: int) -> None:
        """Render step 1's statement (always: it counts the candidates' units) and each histogram;
        check them before the charge."""
        base = self.strategy.base
        self._fast, self._general = self._bounded(base, salt)
        self._histograms = {c: histogram_query(self.plan, self.policy, c, salt=salt) for c in self.strategy.columns}
        self._either(engine.check, self._fast, self._general)
        for statement in self._histograms.values():
            engine.check(statement)
        selection_plan.public_combinations(base, self.policy)
        self._prepared = True

    def run(self, engine: Any, salt: int, cal: Calibrated, receipt: Any = None) -> tuple[dict, dict, dict]:
        """Step 1 (selection, counts/sums noised on the selected rows), then step 2 (quantiles of
        the selected groups): keys, noisy values, half-widths."""
        m, base = cal.measurement, self.strategy.base
        with _charged_execution(receipt):
            values = self._either(engine.execute, self._fast, self._general)
        keys, noisy = partition_selection.select_rows(base, self.policy, m.base, values)
        with _charged_execution(receipt):
            noisy.update(quantile_release.run_selected(self.plan, m, engine.execute, keys, self._histograms))
        return keys, noisy, m.halfwidths()

    def bounded_template(self) -> Any:
        """Step 1's bounded SQL (salt hidden)."""
        return bounded_sql_template(self.strategy.base, self.policy)


class UnionAllRunner(Runner):
    """``UNION ALL`` of aggregate queries (:class:`~dpgate.pipeline.strategy.UnionAll`): one runner per
    part; calibrate sums the parts' costs (sequential composition), prepare prepares every part before
    the single charge, run concatenates (:mod:`dpgate.pipeline.union_release`)."""

    strategy: UnionAll

    def __init__(self, strategy: Strategy, ctx: QueryContext) -> None:
        super().__init__(strategy, ctx)
        self.parts = [runner_for(p.strategy, replace(ctx, policy=p.policy)) for p in strategy.parts]
        self.mechanism = ""

    def resolve(self, budget: QueryBudget | None, mechanism: str | None) -> ResolvedBudget:
        """The whole release's budget (what the cache key and the release state)."""
        self.mechanism = mechanism_of(self.policy, mechanism)
        if budget is not None and budget.delta is not None:
            raise nothing_charged(InvalidBudget("budget delta goes with private partition selection, which a "
                                                "UNION ALL part does not use", {"field": "delta"}))
        return resolve(self.ctx.ledger, self.policy, self.mechanism, budget)

    def part_budgets(self, whole: ResolvedBudget) -> list[QueryBudget]:
        """Each part's share of the union's budget (split by number of primitives; :func:`dpgate.pipeline.union_release.part_budgets`)."""
        return union_release.part_budgets(whole, self.mechanism, [p.plan for p in self.strategy.parts])

    def _each(self, fn: Callable[[int, Any], Any]) -> list[Any]:
        out = []
        for i, runner in enumerate(self.parts):
            try:
                out.append(fn(i, runner))
            except DpgateError as e:
                raise in_part(e, i, len(self.parts))
        return out

    def calibrate(self, budget: ResolvedBudget) -> Calibrated:
        """Each part calibrated at its share; the cost is the sum (zCDP ρ adds; pure ε adds)."""
        budgets = self.part_budgets(budget)
        self._resolved = self._each(lambda i, r: r.resolve(budgets[i], self.mechanism))
        cals = self._each(lambda i, r: r.calibrate(self._resolved[i]))
        return Calibrated(cals[0].mechanism, sum((c.cost for c in cals[1:]), cals[0].cost), {}, False, tuple(cals))

    def prepare(self, engine: Any, salt: int) -> None:
        """Every part's statements rendered and checked, before the one charge."""
        self._each(lambda i, r: r.prepare(engine, salt))
        self._prepared = True

    def run(self, engine: Any, salt: int, cal: Calibrated, receipt: Any = None) -> list[tuple[dict, dict, dict]]:
        """Each part's ``(keys, noisy values, half-widths)``, in order."""
        return [r.run(engine, salt, c, receipt) for r, c in zip(self.parts, cal.measurement)]

    def _scope(self) -> tuple[str, ...] | None:
        scopes = [charge_scope(self.ctx.ledger, p.policy, p.plan) for p in self.strategy.parts]
        return None if all(s is None for s in scopes) else tuple(sorted({c for s in scopes if s for c in s}))

    def explain(self, shown: Mapping[str, Any], *, budget: QueryBudget | None, mechanism: str | None,
                consumer: str | None, trial: Any = None, **_: Any) -> dict[str, Any]:
        """Each part's explain at its share, the split, the composition and the summed cost.

        Raises:
            InvalidRequest: ``trial`` (a proxy trial of a union is not run yet).
        """
        if trial is not None:
            raise nothing_charged(InvalidRequest("trial is not available for a UNION ALL yet: try its parts one by one",
                                                 {"reason": "union_trial"}))
        ledger, policy, parts = self.ctx.ledger, self.policy, self.strategy.parts
        resolved = self.resolve(budget, mechanism)
        cal = self.calibrate(resolved)
        budgets = self.part_budgets(resolved)
        docs = self._each(lambda i, r: {"part": i + 1, **r.explain(
            {"columns": released_columns(parts[i].plan), "contribution": contribution(parts[i].plan, parts[i].policy)},
            budget=budgets[i], mechanism=self.mechanism, consumer=consumer)})
        for d, part in zip(docs, parts):  # each part's expected ± and warnings, at the default group size
            d["column_bounds"] = column_bounds(part.policy, d["plan"])  # (issue 22 item 6) over its source
            d["accuracy_reference"] = accuracy_reference(policy, None, resolved.expected_count)
            d["expected_accuracy"] = expected_accuracy(d)
            d["warnings"] = [w["message"] for w in d["expected_accuracy"].get("warnings", [])]
        eps = [d["cost"].get("epsilon") for d in docs]
        scope = self._scope()
        return {
            "dataset": self.ctx.dataset, "union_all": True, "plan_hash": self.strategy.plan_hash,
            "canonical_sql": "\nUNION ALL\n".join(p.plan.canonical_sql for p in parts),
            "columns": list(shown.get("columns", [])),
            "contribution": {"parts": [d["contribution"] for d in docs]},
            "bounded_sql": None,  # each part's is in parts[i].bounded_sql
            # each part's primitives, named "part<i>.<id>" (the parts' own ids repeat)
            "sensitivity": {f"part{d['part']}.{k}": v for d in docs for k, v in d.get("sensitivity", {}).items()},
            "noise_scales": {f"part{d['part']}.{k}": v for d in docs for k, v in d.get("noise_scales", {}).items()},
            "mechanism": cal.mechanism, "budget": resolved.to_dict(),
            "budget_split": union_release.split_description(resolved, budgets),
            "composition": {"rule": "sequential", "note": union_release.COMPOSITION_NOTE},
            "parts": docs,
            "cost": {"rho": cal.cost.rho, "epsilon": None if None in eps else sum(eps),
                     **stated(cal.cost, ledger.cap(policy.population).rho_delta),
                     **fit(ledger, policy, cal.cost, consumer, scope)},
            **({"cohorts": {"column": policy.cohorts.column, "drew_on": list(scope)}} if scope is not None else {}),
        }

    def answer(self, *, consumer: str, budget: QueryBudget | None, mechanism: str | None,
               **_: Any) -> dict[str, Any]:
        """The union's release, charged once to ``consumer``; the same union again is served, free."""
        ctx, parts = self.ctx, self.strategy.parts
        resolved = self.resolve(budget, mechanism)
        scope = self._scope()
        version = ctx.data_version()
        budget_doc = resolved.to_dict()
        signatures = [documents.noise_signature(p.plan, cell_targets=resolved.is_ci95) for p in parts]
        keys = CacheKeys.of(plan_hash=self.strategy.plan_hash + scope_signature(scope),
                            noise_signature=union_release.noise_signature(signatures, self.strategy.plan_hash)
                            + scope_signature(scope),
                            data_version=version, mechanism=self.mechanism, budget=budget_doc,
                            post_processing=post_processing_settings(self.policy))
        with ctx.release_cache.flight(keys) as flight:
            hit = flight.lookup()
            if hit is not None:
                return union_release.served(hit.to_dict(cached=True), documents.labels(self.plan))
            cal = self.calibrate(resolved)
            salt = ctx.salt_source()
            self.prepare(ctx.engine, salt)
            metadata = {"dataset": ctx.dataset, "plan_hash": self.strategy.plan_hash, "data_version": version,
                        "union_parts": [p.plan.plan_hash for p in parts]}

            preambles = [documents.release_preamble(p.policy, p.plan, c.measurement, r.to_dict(), selecting=False)
                         for p, c, r in zip(parts, cal.measurement, self._resolved)]  # before the charge

            def compute(receipt: Any) -> Release:
                outs = self.run(ctx.engine, salt, cal, receipt)
                releases = [documents.noisy_release(p.policy, p.plan, c.measurement, r.to_dict(), receipt, keys.noise,
                                                    version, *out, selecting=False, preamble=pre)
                            for p, c, r, out, pre in zip(parts, cal.measurement, self._resolved, outs, preambles)]
                return union_release.union_document(releases, plan_hash=self.strategy.plan_hash, budget=budget_doc,
                                                    key=keys.noise)

            release, fresh = flight.run(
                charge=lambda key: self._charge(cal, consumer, key, purpose=f"query on {ctx.dataset}: UNION ALL of "
                                                f"{len(parts)} parts: " + " | ".join(p.plan.canonical_sql for p in parts),
                                                metadata=metadata, scope=scope),
                compute=compute)
        return release.to_dict(cached=False) if fresh else union_release.served(
            release.to_dict(cached=True), documents.labels(self.plan))


#: strategy → its runner: one each (a strategy without a runner fails in :func:`runner_for`).
RUNNERS: dict[type, type[Runner]] = {
    ExactPublic: ExactPublicRunner,
    PublicKeysOnly: PublicKeysOnlyRunner,
    TopK: TopKRunner,
    Noisy: NoisyRunner,
    NoisyWithPartitionSelection: PartitionSelectionRunner,
    WithQuantiles: QuantilesRunner,
    QuantilesWithPartitionSelection: SelectingQuantilesRunner,
    UnionAll: UnionAllRunner,
}


def runner_for(strategy: Strategy, ctx: QueryContext) -> Runner:
    """The runner of ``strategy`` (:data:`RUNNERS`).

    Raises:
        Internal: a strategy without a runner (a new strategy must bring one).
    """
    try:
        return RUNNERS[type(strategy)](strategy, ctx)
    except KeyError:
        raise Internal(f"no runner for the release strategy {type(strategy).__name__}") from None
