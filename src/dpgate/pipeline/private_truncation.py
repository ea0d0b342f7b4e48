"""Private truncation in the query pipeline (issue 22 item 4): the DP choice of a query's row cap m,
charged, stored as a release of its own and reused for free, and the query then compiled with it.

The hook (:func:`for_answer`, :func:`for_explain`) runs after ``compile`` and after the private-bounds
hook, before the strategy's runner. For a query whose source reads a table declared
``max_rows_per_unit = { private = true, outer = N }`` (alone, through its unit path, or in a join):

1. **The query's rows.** The choice counts the rows the query bounds — step 1 of its bounded query:
   the source after the unit path and the joins (one unit's rows multiply there), the WHERE, the
   key filters — per (unit, group), one element per unit (:mod:`dpgate.private_truncation`). Its
   candidates run up to the m the query is compiled with before the choice (the outer limit; in a
   join the largest m of its protected tables, the join's m).
2. **Stored choice** (same dataset, histogram statement, declarations and data version): m is the
   stored release's; reuse is post-processing and free. The query runs at its whole budget.
3. **No choice yet**: ``[budget] private_bounds_share`` of the query's budget (ρ, or ε under pure DP)
   pays for the choice, the rest for the query. Before any charge: the budget form (not ``ci95``),
   the choice's rank error against ``private_bounds_max_rank_error``, the query's own calibration
   and statements at its reduced budget (with the outer m, the worst case), the histogram statement,
   the Gaussian-DP claim, and that the total fits the ledger. Then the choice is charged as its own
   ledger entry (``kind = "private_truncation"``), computed and stored (single flight), and the
   query is compiled with the chosen m on every protected table of its source and charged its own
   calibrated cost: sequential composition, adaptively through the ledger's filter.

**Each SUM's per-unit clamp τ** (:mod:`dpgate.pipeline.private_sum_clamp`) is chosen the same way,
next to m: one more choice per distinct SUM expression of the query (its own histogram statement,
charge, release and reuse); the choices still missing share ``private_bounds_share`` equally, all of
them are checked (statements, rank errors, GDP claim, the total against the ledger) before the first
charge, and the query is compiled with m and every τ.

Every release that uses a choice says so (``private_truncation``: m, the release, its cost, whether it
was charged now; ``sum_clamps``: τ per SUM, likewise). Not applied (m stays the outer limit, a bound from the policy): UNION / GROUPING
SETS queries and per-unit subqueries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from types import MappingProxyType
from typing import Any, Callable

from dpgate import accounting
from dpgate import private_truncation as choice
from dpgate.errors import Internal, InvalidBudget
from dpgate.pipeline import documents
from dpgate.pipeline import private_sum_clamp as sums
from dpgate.pipeline.private_choice import charged_choice, histogram
from dpgate.pipeline.budget import fit, refuse_without_gdp_claim, stated
from dpgate.pipeline.planning import compile_query
from dpgate.pipeline.private_bounds import Split, refuse_unless_fits, repeat_budget, split_budget
from dpgate.policy import DatasetPolicy
from dpgate.releases import CacheKeys, Release
from dpgate.releases.keys import cache_key
from dpgate.releases.model import new_release_id, now
from dpgate.render.private_truncation import BIN, COUNT, counts_tree
from dpgate.sql.bound import _counted
from dpgate.sql.parse import nothing_charged
from dpgate.sql.sources import JoinSource, TableSource, UnitPathSource, plan_source

__all__ = ["Need", "needed", "for_answer", "for_explain", "note_text"]

Compiled = tuple[DatasetPolicy, Any, Any]
Annotate = Callable[[dict[str, Any]], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Need:
    """A query that chooses its m: the declared protected tables of its source (``private`` those
    declaring private truncation), the outer m, the histogram statement and its cache keys."""

    tables: tuple[str, ...]
    private: tuple[str, ...]
    outer: int
    quantile: float
    tree: Any
    keys: CacheKeys

    @property
    def label(self) -> str:
        """``lineitem`` or ``lineitem+orders`` (the tables whose m is chosen)."""
        return "+".join(self.tables)


def _declared(source: Any) -> tuple[str, ...] | None:
    if isinstance(source, TableSource):
        return (source.table.name,)
    if isinstance(source, UnitPathSource):
        return (source.path_table.table.name,)
    if isinstance(source, JoinSource):
        out: list[str] = []
        for o in source.tables:
            if o.protected and o.declared not in out:
                out.append(o.declared)
        return tuple(out)
    return None  # a per-unit subquery: not applied (module docstring)


def needed(base: DatasetPolicy, compiled: Compiled, version: str) -> Need | None:
    """The query's private-truncation need, or None (no table of its source declares one)."""
    policy, plan, strategy = compiled
    if getattr(strategy, "parts", None):
        return None
    plan = getattr(strategy, "plan", plan)
    source = plan_source(plan, policy)
    tables = _declared(source)
    if not tables:
        return None
    private = tuple(t for t in tables if base.tables[t].private_truncation is not None)
    if not private:
        return None
    cplan, cpolicy = _counted(plan, policy)
    csrc = plan_source(cplan, cpolicy)
    outer = int(csrc.table.max_rows_per_unit)
    quantile = min(base.tables[t].private_truncation.quantile for t in private)
    tree = counts_tree(cplan, csrc.table, csrc.rows(), choice.grid(outer))
    sig = json.dumps({"kind": "private_truncation", "dataset": base.name, "statement": tree.sql(dialect="duckdb"),
                      "tables": {t: base.tables[t].to_dict() for t in tables}, "quantile": quantile},
                     sort_keys=True, default=str)
    key = cache_key("private_truncation:" + hashlib.sha256(sig.encode()).hexdigest(), version, "exponential", {})
    return Need(tables, private, outer, quantile, tree, CacheKeys(release=key, noise=key))


def note_text(m: int, cost: dict[str, float], release_id: str) -> str:
    """``max_rows_per_unit m, chosen privately at ρ = … in release R`` (ε under pure DP)."""
    what = f"ρ = {cost['rho']:.6g}" if "rho" in cost else f"ε = {cost['epsilon']:.6g}"
    return f"max_rows_per_unit {m}, chosen privately at {what} in release {release_id}"


def _chosen(release: Release) -> tuple[int, str, dict[str, float]]:
    doc = release.document
    return int(doc["rows"][0][0]), release.release_id, dict(doc["budget"])


def with_m(policy: DatasetPolicy, need: Need, release: Release) -> DatasetPolicy:
    """``policy`` with m = the stored choice on every protected table of the query's source."""
    m, rid, cost = _chosen(release)
    tables = dict(policy.tables)
    for name in need.tables:
        t = tables[name]
        pt = t.private_truncation
        pt = None if pt is None else dataclasses.replace(pt, chosen_in=rid, cost=cost)
        tables[name] = dataclasses.replace(t, max_rows_per_unit=m, private_truncation=pt)
    return dataclasses.replace(policy, tables=MappingProxyType(tables))


def _recompile(gw: Any, sql: str, dialect: str | None, compiled: Compiled, need: Need, release: Release,
               clamps: dict[Any, Release] | None = None) -> Compiled:
    policy = sums.with_clamps(with_m(compiled[0], need, release), clamps or {})
    out = compile_query(policy, sql, dialect, values_of=gw._public_values_of(policy, dialect))
    cplan, cpolicy = _counted(out[1], out[0])
    if plan_source(cplan, cpolicy).table.max_rows_per_unit != _chosen(release)[0]:
        raise Internal("the query was not compiled with the privately chosen m", {"tables": list(need.tables)})
    sums.check_applied(out, clamps or {})
    return out


def _cost(noise: Any) -> accounting.Cost:
    return accounting.Cost.zcdp(noise.cost) if noise.measure == "zcdp" else accounting.Cost.pure(noise.cost)


def _scope(gw: Any, base: DatasetPolicy) -> tuple[str, ...] | None:
    column = gw.ledger.cohort_column(base.population) if hasattr(gw.ledger, "cohort_column") else None
    return None if column is None or base.cohorts is None else tuple(base.cohorts.names)


def _calibrated(base: DatasetPolicy, need: Need, split: Split) -> Any:
    limit = base.budget.private_bounds_max_rank_error
    least = choice.min_share(need.outer, need.quantile, split.measure, limit)
    unit = "ρ" if split.measure == "zcdp" else "ε"
    if split.share < least:
        raise nothing_charged(InvalidBudget(
            f"the budget is too small to choose max_rows_per_unit of {need.label} privately: its share {unit} = "
            f"{split.share:.6g} (private_bounds_share of the query's) gives a 95 % rank error above {limit:g} units "
            f"(private_bounds_max_rank_error); at least {unit} = {least:.6g} is needed, i.e. a query budget of "
            f"{least / split.share * split.total:.6g}",
            {"reason": "private_truncation_budget", "tables": list(need.tables), "share": split.share,
             "needed": least}))
    return choice.calibrate(need.label, need.outer, need.quantile, split.measure, split.share)


def _describe(noise: Any, need: Need) -> dict[str, Any]:
    """The choice's calibration for explain and its release (the grid: powers of 2 up to outer)."""
    return {**noise.describe(), "grid": {"candidates": list(choice.candidates(need.outer)), "ratio": 2},
            "mechanism": "exponential mechanism (OpenDP make_noisy_max, Gumbel noise) on "
                         "make_quantile_score_candidates scores, base measure 8^-i (m^-3) over the candidates"}


def _release(base: DatasetPolicy, need: Need, noise: Any, version: str, receipt: Any, m: int) -> Release:
    rid, created, key = new_release_id(), now(), need.keys.noise
    cost = {"rho" if noise.measure == "zcdp" else "epsilon": noise.cost}
    first = base.tables[need.private[0]]
    document = {
        "release_id": rid, "dataset": base.name, "tables": list(need.tables), "kind": "private_truncation",
        "columns": ["max_rows_per_unit"], "rows": [[m]], "accuracy": {},
        "charge": documents.charge_document(receipt), "cached": False, "data_version": version,
        "created_at": created, "plan_hash": key, "canonical_sql": None, "mechanism": "exponential",
        "budget": cost, "estimate": _describe(noise, need), "statement": need.tree.sql(dialect="duckdb"),
        "truncation": {"outer": need.outer, "quantile": need.quantile, "candidates": list(choice.candidates(need.outer))},
        "note": note_text(m, cost, rid) + f" (the {need.quantile:g}-quantile of the units' largest row count per "
                "group in this query's rows; free to reuse for the same rows on this data version)",
        "guarantee": {"population": base.population, "privacy_unit": first.privacy_unit or "foreign-key path",
                      "cap": documents.enforced_cap(base, receipt)},
    }
    return Release(rid, key, base.name, key, created, document)


def _choose(gw: Any, base: DatasetPolicy, need: Need, noise: Any, version: str, consumer: str
            ) -> tuple[Release, Any]:
    """Charge, run and store the choice (single flight); ``(release, receipt or None if another paid)``."""
    def compute(receipt: Any) -> Release:
        hist = histogram(gw.engine.execute(need.tree), noise.grid.size, BIN, COUNT)
        return _release(base, need, noise, version, receipt, choice.choose(noise, hist))

    return charged_choice(
        gw, need.keys, _cost(noise), population=base.population, consumer=consumer,
        purpose=f"private truncation of {need.label} on {base.name}",
        metadata={"dataset": base.name, "kind": "private_truncation", "tables": list(need.tables),
                  "data_version": version}, scope=_scope(gw, base), compute=compute)


def _used(need: Need, release: Release, receipt: Any) -> dict[str, Any]:
    m, rid, cost = _chosen(release)
    return {"tables": list(need.tables), "max_rows_per_unit": m, "outer": need.outer, "release_id": rid, **cost,
            "charged_now": receipt is not None, **({"charge_id": receipt.charge_id} if receipt is not None else {}),
            "note": note_text(m, cost, rid)}


def _sum_quantile(base: DatasetPolicy, need: Need) -> float:
    """The quantile of a SUM's per-unit clamp: the smallest ``sum_quantile`` of the private tables."""
    return min(base.tables[t].private_truncation.sum_quantile for t in need.private)


def _declares(base: DatasetPolicy) -> bool:
    return any(t.private_truncation is not None for t in base.tables.values())


def _identity(doc: dict[str, Any]) -> dict[str, Any]:
    return doc


def for_answer(gw: Any, dataset: str, sql: str, dialect: str | None, compiled: Compiled, *,
               budget: Any, mechanism: str | None, consumer: str) -> tuple[Compiled, Any, Annotate]:
    """``(compiled, budget, annotate)`` for the runner's ``answer``: the row cap's choice and each SUM's
    per-unit clamp (:mod:`dpgate.pipeline.private_sum_clamp`) made (and charged) first when missing
    (module docstring); ``annotate`` adds ``private_truncation`` to the response.

    Raises:
        before any charge: InvalidBudget, BudgetExhausted and the runner's own refusals at the reduced
        budget; after the choices' charges: what the query itself raises (the choices stay stored).
    """
    base = gw.policy(dataset)
    if not _declares(base):  # the common case: nothing to look at, the data version is not read
        return compiled, budget, _identity
    version = gw._data_version(dataset)
    need = needed(base, compiled, version)
    if need is None:
        return compiled, budget, _identity
    clamp_needs = sums.needed(base, compiled, version, need.private, _sum_quantile(base, need))
    release = gw.release_cache.store.find(need.keys.noise)
    clamps = {c: gw.release_cache.store.find(c.keys.noise) for c in clamp_needs}
    missing = [c for c in clamp_needs if clamps[c] is None]
    receipt, paid = None, {}
    if release is None or missing:
        split = split_budget(gw, base, budget, mechanism, (release is None) + len(missing))
        noise = _calibrated(base, need, split) if release is None else None
        noises = sums.calibrated(base, missing, split)
        _check_before_charge(gw, dataset, compiled, split, noise, need, consumer, mechanism, missing, noises)
        if release is None:
            release, receipt = _choose(gw, base, need, noise, version, consumer)
        for c, z in zip(missing, noises):
            clamps[c], paid_c = sums.choose(gw, base, c, z, version, consumer, _scope(gw, base))
            if paid_c is not None:
                paid[c] = paid_c
        if receipt is not None or paid:
            budget = split.main
    used = {**_used(need, release, receipt), "sum_clamps": sums.used(clamps, paid)}
    recompiled = _recompile(gw, sql, dialect, compiled, need, release, clamps)
    if receipt is None and not paid:
        budget = repeat_budget(gw, dataset, base, recompiled, budget, mechanism, 1 + len(clamp_needs))

    def annotate(doc: dict[str, Any]) -> dict[str, Any]:
        return {**doc, "private_truncation": used}
    return recompiled, budget, annotate


def check_next(gw: Any, dataset: str, compiled: Compiled, *, mechanism: str | None, consumer: str
               ) -> Callable[[Any, accounting.Cost], None]:
    """The check private bounds run before charging their estimates when the same request then needs
    private truncation's choices (:func:`dpgate.pipeline.private_bounds.for_answer`'s ``then``): called
    with the budget left after the estimates' share and the estimates' cost, it refuses — before any
    charge — choices that would not fit (InvalidBudget: the reduced budget cannot be split again;
    BudgetExhausted: estimates + choices + query exceed what is left). Without a missing choice it does
    nothing. The checks are data-independent (policy, budget, ledger), as each choice's own."""
    def check(budget_left: Any, prior: accounting.Cost) -> None:
        base = gw.policy(dataset)
        if not _declares(base):
            return
        version = gw._data_version(dataset)
        need = needed(base, compiled, version)
        if need is None:
            return
        clamp_needs = sums.needed(base, compiled, version, need.private, _sum_quantile(base, need))
        release = gw.release_cache.store.find(need.keys.noise)
        missing = [c for c in clamp_needs if gw.release_cache.store.find(c.keys.noise) is None]
        if release is not None and not missing:
            return
        split = split_budget(gw, base, budget_left, mechanism, (release is None) + len(missing))
        costs = ([_cost(_calibrated(base, need, split))] if release is None else []) + \
            [sums.cost_of(z) for z in sums.calibrated(base, missing, split)]
        policy, _, strategy = compiled
        runner = gw._runner(dataset, policy, strategy)
        cal = runner.calibrate(runner.resolve(split.main, mechanism))
        refuse_unless_fits(gw, base, sum(costs, prior) + cal.cost, consumer,
                           "its private bounds' estimate and private truncation")
    return check


def _check_before_charge(gw: Any, dataset: str, compiled: Compiled, split: Split, noise: Any, need: Need,
                         consumer: str, mechanism: str | None, missing: list, noises: list) -> None:
    """Everything that can refuse the request, before the first choice's charge (module docstring):
    the query's calibration and statements at its reduced budget, every choice's statement, the
    Gaussian-DP claim of each charge and that their total fits the ledger."""
    policy, _, strategy = compiled
    base = gw.policy(dataset)
    runner = gw._runner(dataset, policy, strategy)
    cal = runner.calibrate(runner.resolve(split.main, mechanism))
    runner.prepare(gw.engine, gw._salt_source())
    costs = []
    if noise is not None:
        gw.engine.check(need.tree)
        costs.append(_cost(noise))
    for c, z in zip(missing, noises):
        gw.engine.check(c.tree)
        costs.append(sums.cost_of(z))
    for cost in costs:
        refuse_without_gdp_claim(gw.ledger, base, cost, consumer)
    refuse_unless_fits(gw, base, sum(costs[1:], costs[0]) + cal.cost, consumer, "its private truncation")


def for_explain(gw: Any, dataset: str, sql: str, dialect: str | None, compiled: Compiled, *,
                budget: Any, mechanism: str | None, consumer: str | None) -> tuple[Compiled, Any, Annotate]:
    """``(compiled, budget, annotate)`` for the runner's ``explain`` (reads no data, charges nothing).

    With every choice stored: the query compiled with them, its whole budget. Otherwise the query at
    its reduced budget with the outer m and no τ (the worst case ±); ``annotate`` adds
    ``private_truncation`` (what will be chosen, at what cost) and puts the total in ``cost``
    (``cost.query`` the query's part).
    """
    base = gw.policy(dataset)
    version = gw._data_version(dataset) if _declares(base) else ""
    need = needed(base, compiled, version) if _declares(base) else None
    if need is None:
        return compiled, budget, _identity
    clamp_needs = sums.needed(base, compiled, version, need.private, _sum_quantile(base, need))
    release = gw.release_cache.store.find(need.keys.noise)
    clamps = {c: gw.release_cache.store.find(c.keys.noise) for c in clamp_needs}
    missing = [c for c in clamp_needs if clamps[c] is None]
    if release is not None and not missing:
        used = {**_used(need, release, None), "sum_clamps": sums.used(clamps, {})}
        return (_recompile(gw, sql, dialect, compiled, need, release, clamps), budget,
                lambda doc: {**doc, "private_truncation": used})
    split = split_budget(gw, base, budget, mechanism, (release is None) + len(missing))
    noise = _calibrated(base, need, split) if release is None else None
    noises = sums.calibrated(base, missing, split)
    planned = _planned(base, need, noise, release, missing, noises)
    costs = ([_cost(noise)] if noise is not None else []) + [sums.cost_of(z) for z in noises]
    extra = sum(costs[1:], costs[0])
    pure = (noise.cost if noise is not None else 0.0) + sum(z.cost for z in noises)

    if release is not None:  # the stored m applies; the ± use τ = m × the bound until τ is chosen
        compiled = _recompile(gw, sql, dialect, compiled, need, release)

    def annotate(doc: dict[str, Any]) -> dict[str, Any]:
        cost = dict(doc.get("cost") or {})
        query_part = {k: cost.get(k) for k in ("rho", "epsilon")}
        zcdp = split.measure == "zcdp" and cost.get("rho") is not None
        query_cost = accounting.Cost.zcdp(cost["rho"]) if zcdp else accounting.Cost.pure(cost.get("epsilon") or 0.0)
        total = extra + query_cost
        cap = gw.ledger.cap(base.population)
        cost.update({"rho": total.rho_bound() if split.measure == "zcdp" else None,
                     "epsilon": None if split.measure == "zcdp" else pure + (cost.get("epsilon") or 0.0),
                     "query": query_part, "private_truncation": noise.cost if noise is not None else 0.0,
                     "private_sum_clamps": [z.cost for z in noises],
                     **stated(total, cap.rho_delta, cap.gdp), **fit(gw.ledger, base, total, consumer, _scope(gw, base))})
        return {**doc, "cost": cost, "private_truncation": planned}
    return compiled, split.main, annotate


def _planned(base: DatasetPolicy, need: Need, noise: Any, release: Release | None, missing: list,
             noises: list) -> dict[str, Any]:
    """Explain's ``private_truncation`` while a choice is missing (the row cap's, each SUM's τ)."""
    if noise is not None:
        out = {"status": "to be chosen before this query (a release of its own, then free for the same rows on "
                         "this data version)", "tables": list(need.tables), "outer": need.outer,
               "quantile": need.quantile, "share": base.budget.private_bounds_share, **_describe(noise, need),
               "note": f"every ± of this explain uses m = {need.outer} (the outer limit, the worst case)"}
    else:
        out = _used(need, release, None)
    worst = {c.column: c.grid.distances[-1] * c.grid.resolution for c in missing}
    return {**out, "sum_clamps": sums.planned(missing, noises, worst)}
