"""Private bounds in the query pipeline (issue 22 item 3): which clamps a query needs, their DP
estimate (charged, stored as a release of its own, reused for free), and the policy the query is
then compiled against.

The hook (:func:`for_answer`, :func:`for_explain`) runs after ``compile`` and before the strategy's
runner. For a query whose aggregates (SUM, AVG, VAR, STDDEV, quantiles) read a
``bounds = "private"`` column of a protected table:

1. **Stored estimate** (same dataset, table, column declaration and data version): the column's
   clamp is the stored release's ``[lower, upper]``; the query is compiled again against that
   policy and runs at its whole budget. Reusing a release is post-processing: free.
2. **No estimate yet**: the query's budget is split — ``private_bounds_share`` of it (ρ, or ε under
   pure DP; several missing columns share it equally) for the estimates, the rest for the query.
   Everything is checked *before any charge*: the budget form (a ``ci95`` target cannot pay for an
   estimate), each estimate's rank error against ``private_bounds_max_rank_error``, the query's own
   calibration and statements at its reduced budget (with the outer range), the estimate's
   statement, the Gaussian-DP claim, and whether the *total* fits the ledger. Then each estimate is
   charged as an **explicit separate ledger charge** (purpose ``private bounds …``, metadata
   ``kind = "private_bounds"``), computed and stored (single flight on its key: two concurrent
   first queries pay once), and the query is compiled against the estimated clamp and charged
   its own calibrated cost. The charges compose sequentially (ρ adds, Bun & Steinke 2016 Lemma
   2.3; ε adds): the query's clamp is chosen adaptively from the estimate's output, which is what
   the ledger's adaptive filter is proven for. Separate charges because the query's calibration
   (its sensitivity) depends on the estimate, so its cost cannot be known before the estimate.

Explain states the estimate and its cost and gives every ± at the query's reduced budget with
the *outer* range (the worst case) when no estimate is stored; with one stored it explains the
query against it.

Joins, per-unit subqueries and path tables clamp a private column to its outer range (no estimate
is made for them yet).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable

import sqlglot
from sqlglot import exp

from dpgate import accounting
from dpgate import private_bounds as estimate
from dpgate.errors import BudgetExhausted, InvalidBudget, UnsupportedQuery
from dpgate.pipeline import documents
from dpgate.pipeline.budget import QueryBudget, fit, mechanism_of, refuse_without_gdp_claim, resolve, stated
from dpgate.pipeline.planning import compile_query
from dpgate.policy import ColumnPolicy, DatasetPolicy, TablePolicy
from dpgate.pipeline.private_choice import charged_choice, histogram
from dpgate.releases import CacheKeys, Release
from dpgate.releases.keys import cache_key
from dpgate.releases.model import new_release_id, now
from dpgate.render.private_bounds import BIN, COUNT, histogram_tree
from dpgate.sql.parse import nothing_charged

__all__ = ["CLAMPED_KINDS", "Need", "needed", "for_answer", "for_explain", "note_text"]

#: Primitive kinds whose value depends on the column's clamp.
CLAMPED_KINDS = frozenset({"sum", "sum_squares", "quantile"})

Compiled = tuple[DatasetPolicy, Any, Any]
Annotate = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Need:
    """A ``bounds = "private"`` column whose clamp a query needs (``col`` as declared: outer range)."""

    table: str
    column: str
    col: ColumnPolicy


# ---------------------------------------------------------------- which columns


def _names_in(text: str, table: TablePolicy) -> set[str]:
    col = table.find_column(text)
    if col is not None:
        return {col.name}
    try:
        tree = sqlglot.parse_one(text, read="duckdb")
    except sqlglot.errors.ParseError:  # pragma: no cover - the planner generated it
        return set()
    return {c.name for c in (table.find_column(x.name) for x in tree.find_all(exp.Column)) if c is not None}


def _plans(strategy: Any) -> list[Any]:
    parts = getattr(strategy, "parts", None)
    return [p.plan for p in parts] if parts else [strategy.plan]


def needed(base: DatasetPolicy, plans: Iterable[Any]) -> list[Need]:
    """The private-bounds columns the plans' clamped aggregates read, on the dataset's own protected tables.

    Raises:
        UnsupportedQuery: a plan groups by a private-bounds column (directly, or a key enumerated
            from its range): a group key's domain comes from the policy, never from a data-chosen clamp.
    """
    out: dict[tuple[str, str], Need] = {}
    for plan in plans:
        table = base.tables.get(plan.table)
        if table is None or table.public or table.unit_path is not None:
            continue  # a join, per-unit or path table: the outer range (module docstring)
        private = {c.name for c in table.columns.values() if c.private_bounds is not None}
        if not private:
            continue
        keyed = {c for k in plan.group_by for c in _names_in(k, table)} & private
        keyed |= {c for k in plan.computed_keys if k.rule == "enumerated"
                  for c in _names_in(k.expression, table)} & private
        if keyed:
            raise nothing_charged(UnsupportedQuery(
                f"column {sorted(keyed)[0]!r} has bounds = \"private\" and cannot be a group key (its keys would "
                "follow from a clamp chosen from the data); group by a CASE of it with literal results instead",
                {"reason": "private_bounds_group_key", "column": sorted(keyed)[0]}))
        for p in plan.primitives:
            if p.kind in CLAMPED_KINDS and p.column is not None:
                for name in sorted(_names_in(p.column, table) & private):
                    out.setdefault((table.name, name), Need(table.name, name, table.columns[name]))
    return list(out.values())


# ---------------------------------------------------------------- the stored estimate


def _keys(base: DatasetPolicy, need: Need, version: str) -> CacheKeys:
    table = base.tables[need.table]
    sig = json.dumps({"kind": "private_bounds", "dataset": base.name, "table": need.table,
                      "unit": table.privacy_unit, "column": need.col.to_dict()}, sort_keys=True, default=str)
    key = cache_key("private_bounds:" + hashlib.sha256(sig.encode()).hexdigest(), version, "exponential", {})
    return CacheKeys(release=key, noise=key)


def note_text(lower: float, upper: float, cost: dict[str, float], release_id: str) -> str:
    """``bounds [a, b], chosen privately at ρ = … in release R`` (ε under pure DP)."""
    what = f"ρ = {cost['rho']:.6g}" if "rho" in cost else f"ε = {cost['epsilon']:.6g}"
    return f"bounds [{lower:g}, {upper:g}], chosen privately at {what} in release {release_id}"


def _chosen(release: Release) -> tuple[float, float, str, dict[str, float]]:
    doc = release.document
    lower, upper = doc["rows"][0]
    return float(lower), float(upper), release.release_id, dict(doc["budget"])


def with_bounds(policy: DatasetPolicy, chosen: dict[Need, Release]) -> DatasetPolicy:
    """``policy`` with each needed column clamped to its stored estimate (``chosen_in`` naming the release)."""
    tables = dict(policy.tables)
    for need, release in chosen.items():
        lower, upper, rid, cost = _chosen(release)
        t = tables[need.table]
        col = t.columns[need.column]
        pb = dataclasses.replace(col.private_bounds, chosen_in=rid, cost=cost)
        cols = dict(t.columns)
        cols[need.column] = dataclasses.replace(col, lower=lower, upper=upper, private_bounds=pb)
        tables[need.table] = dataclasses.replace(t, columns=MappingProxyType(cols))
    return dataclasses.replace(policy, tables=MappingProxyType(tables))


def _recompile(gw: Any, dataset: str, sql: str, dialect: str | None, chosen: dict[Need, Release]) -> Compiled:
    policy = with_bounds(gw._with_public_table_keys(gw.policy(dataset)), chosen)
    return compile_query(policy, sql, dialect, values_of=gw._public_values_of(policy, dialect))


# ---------------------------------------------------------------- budget split


@dataclass(frozen=True)
class Split:
    """The budget of a query that estimates ``n`` clamps first."""

    measure: estimate.Measure
    share: float  # ρ (zcdp) or ε (pure) of each estimate
    main: QueryBudget  # the query's own budget
    total: float  # ρ or ε of the whole request


def split_budget(gw: Any, base: DatasetPolicy, budget: QueryBudget | None, mechanism: str | None, n: int) -> Split:
    """``private_bounds_share`` of the request's ρ (Gaussian) or ε (Laplace) for the ``n`` estimates, the rest for the query.

    Raises:
        InvalidBudget: a ``ci95`` budget (nothing to take a share of; nothing charged).
    """
    if budget is not None and budget.ci95 is not None:
        raise nothing_charged(InvalidBudget(
            "a ci95 budget cannot pay for estimating private bounds (its cost depends on the clamp): send a "
            "query with a rho or epsilon budget first, which estimates and stores them", {"reason": "private_bounds_ci95"}))
    mech = mechanism_of(base, mechanism)
    resolved = resolve(gw.ledger, base, mech, budget)
    s = base.budget.private_bounds_share
    delta = budget.delta if budget is not None else None
    if mech == "gaussian":
        total = resolved.zcdp_rho()
        return Split("zcdp", s * total / n, QueryBudget(rho=(1 - s) * total, delta=delta), total)
    total = resolved.pure_epsilon()
    return Split("pure", s * total / n, QueryBudget(epsilon=(1 - s) * total, delta=delta), total)


def _calibrated(base: DatasetPolicy, needs: list[Need], split: Split) -> list[estimate.BoundsNoise]:
    out = []
    limit = base.budget.private_bounds_max_rank_error
    unit = "ρ" if split.measure == "zcdp" else "ε"
    for need in needs:
        least = estimate.min_share(need.col, split.measure, limit)
        if split.share < least:
            raise nothing_charged(InvalidBudget(
                f"the budget is too small to estimate the private bounds of {need.table}.{need.column}: its share "
                f"{unit} = {split.share:.6g} (private_bounds_share of the query's) gives a 95 % rank error above "
                f"{limit:g} units (private_bounds_max_rank_error); at least {unit} = {least:.6g} is needed, i.e. a "
                f"query budget of {least / split.share * split.total:.6g}",
                {"reason": "private_bounds_budget", "column": need.column, "share": split.share, "needed": least}))
        out.append(estimate.calibrate(need.col, split.measure, split.share))
    return out


def _cost(noise: estimate.BoundsNoise) -> accounting.Cost:
    return accounting.Cost.zcdp(noise.cost) if noise.measure == "zcdp" else accounting.Cost.pure(noise.cost)


def _scope(gw: Any, base: DatasetPolicy) -> tuple[str, ...] | None:
    """Every cohort (the estimate reads the whole table), or None without cohorts in the ledger."""
    column = gw.ledger.cohort_column(base.population) if hasattr(gw.ledger, "cohort_column") else None
    return None if column is None or base.cohorts is None else tuple(base.cohorts.names)


# ---------------------------------------------------------------- the estimate


def _release(base: DatasetPolicy, need: Need, noise: estimate.BoundsNoise, key: str, version: str,
             receipt: Any, bounds: tuple[float, float]) -> Release:
    table = base.tables[need.table]
    rid, created = new_release_id(), now()
    cost = {"rho" if noise.measure == "zcdp" else "epsilon": noise.cost}
    document = {
        "release_id": rid, "dataset": base.name, "table": need.table, "kind": "private_bounds",
        "column": need.column, "columns": ["lower", "upper"], "rows": [list(bounds)], "accuracy": {},
        "charge": documents.charge_document(receipt), "cached": False, "data_version": version,
        "created_at": created, "plan_hash": key, "canonical_sql": None,
        "mechanism": "exponential", "budget": cost, "estimate": noise.describe(),
        "bounds": {"outer": list(need.col.private_bounds.outer), "quantile": need.col.private_bounds.quantile,
                   "resolution": need.col.resolution},
        "note": note_text(*bounds, cost, rid) + f" (the {need.col.private_bounds.quantile:g}-quantile of the "
                "units' largest distance from the outer range's point nearest 0; free to reuse on this data version)",
        "guarantee": {"population": base.population, "privacy_unit": table.privacy_unit or "record",
                      "cap": documents.enforced_cap(base, receipt)},
    }
    return Release(rid, key, base.name, key, created, document)


def _estimate(gw: Any, base: DatasetPolicy, need: Need, noise: estimate.BoundsNoise, tree: Any, version: str,
              consumer: str) -> tuple[Release, Any]:
    """Charge, run and store one estimate (single flight); ``(release, receipt or None if another paid)``."""
    keys = _keys(base, need, version)

    def compute(receipt: Any) -> Release:
        hist = histogram(gw.engine.execute(tree), noise.grid.size, BIN, COUNT)
        _, bounds = estimate.choose(noise, hist)
        return _release(base, need, noise, keys.noise, version, receipt, bounds)

    return charged_choice(
        gw, keys, _cost(noise), population=base.population, consumer=consumer,
        purpose=f"private bounds of {need.table}.{need.column} on {base.name}",
        metadata={"dataset": base.name, "kind": "private_bounds", "table": need.table, "column": need.column,
                  "data_version": version}, scope=_scope(gw, base), compute=compute)


def _found(gw: Any, base: DatasetPolicy, needs: list[Need], version: str) -> dict[Need, Release | None]:
    return {n: gw.release_cache.store.find(_keys(base, n, version).noise) for n in needs}


def _describe_used(chosen: dict[Need, Release], paid: dict[Need, Any]) -> dict[str, Any]:
    out = {}
    for need, release in chosen.items():
        lower, upper, rid, cost = _chosen(release)
        receipt = paid.get(need)
        out[f"{need.table}.{need.column}"] = {
            "lower": lower, "upper": upper, "outer": list(need.col.private_bounds.outer), "release_id": rid,
            **cost, "charged_now": receipt is not None,
            **({"charge_id": receipt.charge_id} if receipt is not None else {}),
            "note": note_text(lower, upper, cost, rid)}
    return out


# ---------------------------------------------------------------- the hooks


def _identity(doc: dict[str, Any]) -> dict[str, Any]:
    return doc


def for_answer(gw: Any, dataset: str, sql: str, dialect: str | None, compiled: Compiled, *,
               budget: QueryBudget | None, mechanism: str | None, consumer: str,
               then: Callable[[QueryBudget | None, accounting.Cost], None] | None = None
               ) -> tuple[Compiled, QueryBudget | None, Annotate]:
    """``(compiled, budget, annotate)`` for the runner's ``answer``: estimates made (and charged) first
    when missing (module docstring). ``annotate`` adds ``private_bounds`` to the response.

    ``then(budget_left, estimates_cost)``, when given, is the next private choice's check before the
    estimates are charged (:func:`dpgate.pipeline.private_truncation.check_next`): a refusal of the
    next choice then comes before any charge, not after the estimates'.

    Raises:
        before any charge: UnsupportedQuery, InvalidBudget, BudgetExhausted and the runner's own refusals
        at the reduced budget; after an estimate's charge: what the query itself raises (the estimate stays
        stored and is reused for free).
    """
    base = gw.policy(dataset)
    needs = needed(gw._with_public_table_keys(base), _plans(compiled[2]))
    if not needs:
        return compiled, budget, _identity
    version = gw._data_version(dataset)
    found = _found(gw, base, needs, version)
    missing = [n for n in needs if found[n] is None]
    paid: dict[Need, Any] = {}
    if missing:
        split = split_budget(gw, base, budget, mechanism, len(missing))
        noises = _calibrated(base, missing, split)
        trees = [histogram_tree(base.tables[n.table], n.col, z.grid) for n, z in zip(missing, noises)]
        _check_before_charge(gw, dataset, compiled, split, noises, trees, consumer, mechanism, then)
        for need, noise, tree in zip(missing, noises, trees):
            found[need], receipt = _estimate(gw, base, need, noise, tree, version, consumer)
            if receipt is not None:
                paid[need] = receipt
        if paid:
            budget = split.main
    chosen = {n: r for n, r in found.items() if r is not None}
    used = _describe_used(chosen, paid)
    recompiled = _recompile(gw, dataset, sql, dialect, chosen)
    if not missing:
        budget = repeat_budget(gw, dataset, base, recompiled, budget, mechanism, len(needs))

    def annotate(doc: dict[str, Any]) -> dict[str, Any]:
        return {**doc, "private_bounds": used}
    return recompiled, budget, annotate


def repeat_budget(gw: Any, dataset: str, base: DatasetPolicy, compiled: Compiled, budget: QueryBudget | None,
                  mechanism: str | None, n: int) -> QueryBudget | None:
    """The budget a repeated request is answered at (``n`` shares were taken): the request that paid for the estimates ran
    at its reduced budget (``split_budget``), so the same request again — same SQL, budget and
    data version — finds that release stored and is served it, free (README: repeating a request
    costs nothing). Any other request runs at its whole budget. Reads the store only."""
    if budget is not None and budget.ci95 is not None:
        return budget  # a ci95 budget never paid for an estimate
    policy, _, strategy = compiled
    runner = gw._runner(dataset, policy, strategy)
    stored = getattr(runner, "stored", None)
    if stored is None:
        return budget
    reduced = split_budget(gw, base, budget, mechanism, n).main
    return reduced if stored(reduced, mechanism) else budget


def _check_before_charge(gw: Any, dataset: str, compiled: Compiled, split: Split, noises: list, trees: list,
                         consumer: str, mechanism: str | None,
                         then: Callable[[QueryBudget | None, accounting.Cost], None] | None = None) -> None:
    """Everything that can refuse the request, before the estimates' charges (module docstring)."""
    policy, _, strategy = compiled
    base = gw.policy(dataset)
    runner = gw._runner(dataset, policy, strategy)
    cal = runner.calibrate(runner.resolve(split.main, mechanism))
    runner.prepare(gw.engine, gw._salt_source())
    for tree in trees:
        gw.engine.check(tree)
    costs = [_cost(z) for z in noises]
    for c in costs:
        refuse_without_gdp_claim(gw.ledger, base, c, consumer)
    refuse_unless_fits(gw, base, sum(costs[1:], costs[0]) + cal.cost, consumer, "its private bounds' estimate")
    if then is not None:
        then(split.main, sum(costs[1:], costs[0]))


def refuse_unless_fits(gw: Any, base: DatasetPolicy, total: accounting.Cost, consumer: str, what: str) -> None:
    """Raise :class:`~dpgate.errors.BudgetExhausted` (nothing charged) unless the query's cost and
    its private choice's, ``total``, fit together what is left (:func:`~dpgate.pipeline.budget.fit`),
    before either is charged. ``what`` names the choice in the message."""
    verdict = fit(gw.ledger, base, total, consumer, _scope(gw, base))
    if not verdict["fits"]:
        raise BudgetExhausted(f"the query and {what} do not fit: {verdict['message']} (nothing was charged)",
                              {"population": base.population, "consumer": consumer, "charged": False,
                               "requested": {"rho": total.rho_bound()}, "remaining": {"rho": verdict["remaining_rho"]}})


def for_explain(gw: Any, dataset: str, sql: str, dialect: str | None, compiled: Compiled, *,
                budget: QueryBudget | None, mechanism: str | None, consumer: str | None
                ) -> tuple[Compiled, QueryBudget | None, Annotate]:
    """``(compiled, budget, annotate)`` for the runner's ``explain`` (reads no data, charges nothing).

    With every needed estimate stored: the query compiled against them, its whole budget. Otherwise
    the query at its reduced budget with the outer range (the worst case ±), and ``annotate`` adds
    ``private_bounds`` (what will be estimated, at what cost and rank error) and puts the total in
    ``cost`` (``cost.rho`` / ``cost.epsilon`` the whole request; ``cost.query`` the query's part).
    """
    base = gw.policy(dataset)
    needs = needed(gw._with_public_table_keys(base), _plans(compiled[2]))
    if not needs:
        return compiled, budget, _identity
    found = _found(gw, base, needs, gw._data_version(dataset))
    missing = [n for n in needs if found[n] is None]
    if not missing:
        used = _describe_used(found, {})  # type: ignore[arg-type]
        return (_recompile(gw, dataset, sql, dialect, found), budget,  # type: ignore[arg-type]
                lambda doc: {**doc, "private_bounds": used})
    split = split_budget(gw, base, budget, mechanism, len(missing))
    noises = _calibrated(base, missing, split)
    plans = {f"{n.table}.{n.column}": {
        "status": "to be estimated before this query (a release of its own, then free on this data version)",
        "outer": list(n.col.private_bounds.outer), "quantile": n.col.private_bounds.quantile,
        "share": base.budget.private_bounds_share / len(missing), **z.describe(),
        "note": (f"every ± of this explain uses the outer range [{n.col.lower:g}, {n.col.upper:g}] (the worst "
                 "case); the estimated clamp is usually far tighter")}
        for n, z in zip(missing, noises)}
    costs = [_cost(z) for z in noises]
    extra = sum(costs[1:], costs[0])

    def annotate(doc: dict[str, Any]) -> dict[str, Any]:
        cost = dict(doc.get("cost") or {})
        query_part = {k: cost.get(k) for k in ("rho", "epsilon")}
        query_cost = accounting.Cost.zcdp(cost["rho"]) if split.measure == "zcdp" and cost.get("rho") is not None \
            else accounting.Cost.pure(cost.get("epsilon") or 0.0)
        total = extra + query_cost
        cap = gw.ledger.cap(base.population)
        cost.update({"rho": total.rho_bound() if split.measure == "zcdp" else None,
                     "epsilon": None if split.measure == "zcdp" else sum(z.cost for z in noises) + (cost.get("epsilon") or 0.0),
                     "query": query_part, "private_bounds": [z.cost for z in noises],
                     **stated(total, cap.rho_delta, cap.gdp), **fit(gw.ledger, base, total, consumer, _scope(gw, base))})
        return {**doc, "cost": cost, "private_bounds": plans}
    return compiled, split.main, annotate
