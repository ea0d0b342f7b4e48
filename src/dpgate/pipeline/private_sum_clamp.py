"""The per-unit sum clamps of private truncation in the query pipeline (issue 22 item 4): each SUM of a
query over a ``max_rows_per_unit = { private = true, … }`` table chooses τ, its per-unit total
contribution, with DP (:mod:`dpgate.private_sum_clamp`), charged as a ledger entry of its own
(``kind = "private_sum_clamp"``), stored as a release and reused for free by every later query with
the same rows and SUM on the data version; the query is then compiled with τ on its source's table
(``PrivateTruncation.sum_clamps``), so the bounded SQL clips each partial to [−τ, τ] and the SUM's
sensitivity is τ.

:mod:`dpgate.pipeline.private_truncation` drives it next to the row cap's choice: both are split
from the query's budget (``private_bounds_share`` shared equally by the choices still missing), every
refusal is checked before the first charge, then each choice is charged, run and stored, then the
query. This module holds what is particular to τ: its needs, calibration, release and the policy
with τ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from types import MappingProxyType
from typing import Any

from dpgate import accounting
from dpgate import private_sum_clamp as clamp
from dpgate.errors import Internal, InvalidBudget
from dpgate.pipeline.private_choice import charged_choice, histogram
from dpgate.pipeline import documents
from dpgate.pipeline.private_bounds import Split
from dpgate.policy import DatasetPolicy
from dpgate.releases import CacheKeys, Release
from dpgate.releases.keys import cache_key
from dpgate.releases.model import new_release_id, now
from dpgate.render.private_truncation import BIN, COUNT, totals_tree
from dpgate.sql.bound import _counted
from dpgate.sql.parse import nothing_charged
from dpgate.sql.primitives import sum_clamp
from dpgate.sql.sources import plan_source

__all__ = ["SumNeed", "needed", "calibrated", "choose", "with_clamps", "check_applied", "used", "planned",
           "note_text"]


@dataclasses.dataclass(frozen=True)
class SumNeed:
    """One SUM of the query whose per-unit clamp τ is chosen: its summed expression (``column``, as the
    plan names it), the protected tables of the source, the candidates, the histogram statement, keys."""

    column: str
    tables: tuple[str, ...]
    quantile: float
    grid: Any
    tree: Any
    keys: CacheKeys


def needed(base: DatasetPolicy, compiled: Any, version: str, tables: tuple[str, ...], quantile: float
           ) -> list[SumNeed]:
    """One :class:`SumNeed` per distinct SUM expression of the query (its counted plan over the source's
    table; ``tables``: the source's declared protected tables, as the row cap's need)."""
    policy, plan, strategy = compiled
    plan = getattr(strategy, "plan", plan)
    cplan, cpolicy = _counted(plan, policy)
    src = plan_source(cplan, cpolicy)
    table = src.table
    out: dict[str, SumNeed] = {}
    for p in cplan.primitives:
        if p.kind != "sum" or p.column in out:
            continue
        col = cplan.column_policy(table, p.column)
        lo, hi = col.fixed_point_bounds
        g = clamp.grid(max(abs(lo), abs(hi)), table.max_rows_per_unit, col.resolution or 1.0)
        tree = totals_tree(cplan, table, src.rows(), p, g)
        sig = json.dumps({"kind": "private_sum_clamp", "dataset": base.name, "statement": tree.sql(dialect="duckdb"),
                          "tables": {t: base.tables[t].to_dict() for t in tables}, "quantile": quantile},
                         sort_keys=True, default=str)
        key = cache_key("private_sum_clamp:" + hashlib.sha256(sig.encode()).hexdigest(), version, "exponential", {})
        out[p.column] = SumNeed(p.column, tables, quantile, g, tree, CacheKeys(release=key, noise=key))
    return list(out.values())


def _unit(measure: str) -> str:
    return "ρ" if measure == "zcdp" else "ε"


def calibrated(base: DatasetPolicy, needs: list[SumNeed], split: Split) -> list[Any]:
    """Each choice's calibration at ``split.share``.

    Raises:
        InvalidBudget (nothing charged): a share whose 95 % rank error exceeds
            ``private_bounds_max_rank_error`` (data-independent: the grid is the policy's).
    """
    limit = base.budget.private_bounds_max_rank_error
    out = []
    for need in needs:
        least = clamp.min_share(need.grid.size, need.quantile, split.measure, limit)
        if split.share < least:
            u = _unit(split.measure)
            raise nothing_charged(InvalidBudget(
                f"the budget is too small to choose the per-unit clamp of SUM({need.column}) privately: its share "
                f"{u} = {split.share:.6g} (private_bounds_share of the query's, shared by its private choices) "
                f"gives a 95 % rank error above {limit:g} units (private_bounds_max_rank_error); at least "
                f"{u} = {least:.6g} is needed, i.e. a query budget of {least / split.share * split.total:.6g}",
                {"reason": "private_sum_clamp_budget", "column": need.column, "share": split.share,
                 "needed": least}))
        out.append(clamp.calibrate(need.column, need.grid, need.quantile, split.measure, split.share))
    return out


def cost_of(noise: Any) -> accounting.Cost:
    """The ledger cost of one choice (ρ or pure ε)."""
    return accounting.Cost.zcdp(noise.cost) if noise.measure == "zcdp" else accounting.Cost.pure(noise.cost)


def note_text(column: str, tau: float, cost: dict[str, float], release_id: str) -> str:
    """``per-unit SUM(x) clamp τ = …, chosen privately at ρ = … in release R``."""
    what = f"ρ = {cost['rho']:.6g}" if "rho" in cost else f"ε = {cost['epsilon']:.6g}"
    return f"per-unit SUM({column}) clamp τ = {tau:g}, chosen privately at {what} in release {release_id}"


def _chosen(release: Release) -> tuple[int, float, str, dict[str, float]]:
    doc = release.document
    steps, value = doc["rows"][0]
    return int(steps), float(value), release.release_id, dict(doc["budget"])


def describe(noise: Any) -> dict[str, Any]:
    """The choice's calibration for explain and its release."""
    cands = [float(c) * noise.grid.resolution for c in noise.grid.distances]
    return {**noise.describe(), "grid": {"candidates": cands, "ratio": "√2 (⌈√2^k⌉ rows at the bound)"},
            "mechanism": "exponential mechanism (OpenDP make_noisy_max, Gumbel noise) on "
                         "make_quantile_score_candidates scores, base measure 2^-1.5i (τ^-3) over the candidates"}


def _release(base: DatasetPolicy, need: SumNeed, noise: Any, version: str, receipt: Any, tau: int) -> Release:
    rid, created, key = new_release_id(), now(), need.keys.noise
    cost = {"rho" if noise.measure == "zcdp" else "epsilon": noise.cost}
    value = tau * noise.grid.resolution
    document = {
        "release_id": rid, "dataset": base.name, "tables": list(need.tables), "kind": "private_sum_clamp",
        "column": need.column, "columns": ["tau_steps", "tau"], "rows": [[tau, value]], "accuracy": {},
        "charge": documents.charge_document(receipt), "cached": False, "data_version": version,
        "created_at": created, "plan_hash": key, "canonical_sql": None, "mechanism": "exponential",
        "budget": cost, "estimate": describe(noise), "statement": need.tree.sql(dialect="duckdb"),
        "note": note_text(need.column, value, cost, rid) + f" (the {need.quantile:g}-quantile of the units' largest "
                "|partial sum| per group in this query's rows; free to reuse for the same rows on this data version)",
        "guarantee": {"population": base.population,
                      "privacy_unit": base.tables[need.tables[0]].privacy_unit or "foreign-key path",
                      "cap": documents.enforced_cap(base, receipt)},
    }
    return Release(rid, key, base.name, key, created, document)


def choose(gw: Any, base: DatasetPolicy, need: SumNeed, noise: Any, version: str, consumer: str,
           scope: tuple[str, ...] | None) -> tuple[Release, Any]:
    """Charge, run and store one choice (single flight); ``(release, receipt or None if another paid)``."""
    def compute(receipt: Any) -> Release:
        hist = histogram(gw.engine.execute(need.tree), noise.grid.size, BIN, COUNT)
        return _release(base, need, noise, version, receipt, clamp.choose(noise, hist))

    return charged_choice(
        gw, need.keys, cost_of(noise), population=base.population, consumer=consumer,
        purpose=f"private per-unit clamp of SUM({need.column}) on {base.name}",
        metadata={"dataset": base.name, "kind": "private_sum_clamp", "column": need.column,
                  "tables": list(need.tables), "data_version": version}, scope=scope, compute=compute)


def with_clamps(policy: DatasetPolicy, chosen: dict[SumNeed, Release]) -> DatasetPolicy:
    """``policy`` with each chosen τ on every private-truncation table of the query's source."""
    if not chosen:
        return policy
    triples = tuple(sorted((n.column, _chosen(r)[0], r.release_id) for n, r in chosen.items()))
    names = {t for n in chosen for t in n.tables}
    tables = dict(policy.tables)
    for name in names:
        t = tables[name]
        if t.private_truncation is not None:
            pt = dataclasses.replace(t.private_truncation, sum_clamps=triples)
            tables[name] = dataclasses.replace(t, private_truncation=pt)
    return dataclasses.replace(policy, tables=MappingProxyType(tables))


def check_applied(compiled: Any, chosen: dict[SumNeed, Release]) -> None:
    """Raise :class:`~dpgate.errors.Internal` unless every SUM of the recompiled query holds its τ."""
    policy, plan, strategy = compiled
    cplan, cpolicy = _counted(getattr(strategy, "plan", plan), policy)
    table = plan_source(cplan, cpolicy).table
    want = {n.column: _chosen(r)[0] for n, r in chosen.items()}
    for p in cplan.primitives:
        if p.kind == "sum" and sum_clamp(table, p) != want.get(p.column):
            raise Internal("the query was not compiled with the privately chosen per-unit sum clamp",
                           {"column": p.column})


def used(chosen: dict[SumNeed, Release], paid: dict[SumNeed, Any]) -> list[dict[str, Any]]:
    """The response's ``private_truncation.sum_clamps``: τ per SUM, its release, cost, whether charged now."""
    out = []
    for need, release in chosen.items():
        steps, value, rid, cost = _chosen(release)
        receipt = paid.get(need)
        out.append({"column": need.column, "tau": value, "tau_steps": steps, "release_id": rid, **cost,
                    "charged_now": receipt is not None,
                    **({"charge_id": receipt.charge_id} if receipt is not None else {}),
                    "note": note_text(need.column, value, cost, rid)})
    return out


def planned(needs: list[SumNeed], noises: list[Any], outer_bound: dict[str, float]) -> list[dict[str, Any]]:
    """Explain's ``private_truncation.sum_clamps`` for choices still to be made."""
    return [{"status": "to be chosen before this query (a release of its own, then free for the same rows on "
                       "this data version)", "column": n.column, "quantile": n.quantile, **describe(z),
             "note": f"every ± of this explain uses τ = {outer_bound.get(n.column, 0.0):g} (m × the bound, the worst "
                     "case)"} for n, z in zip(needs, noises)]
