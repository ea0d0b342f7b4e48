"""Calibrating, charging and sampling DP quantiles (the mechanism side of :mod:`dpgate.quantiles`).

**Budget.** A query's budget (ρ, ε, or the policy's default ρ) is split equally over
its n noisy releases: every noisy count/sum primitive and every quantile
(``MEDIAN``, ``MIN``… each is one release). A quantile's share b is spent over the
k_eff groups one unit can touch (k_eff = min(k, key combinations), as for sums):
per group b/k_eff. Cost by composition: ρ adds ([BS16] Lemma 2.3), ε adds ([DR14]
Thm. 3.16). A ``{ci95}`` budget (a half-width in the column's units) has no
meaning for a rank error and is refused for queries with quantiles.

**Scale.** Under zCDP (mechanism ``gaussian``) the selection is OpenDP's Gumbel
report-noisy-max, the exponential mechanism: ε_g-DP with ε_g = 2Δ∞/s for score
sensitivity Δ∞ and Gumbel scale s, hence ε_g²/8-zCDP by the bounded-range
analysis (Cesar & Rogers 2021, "Bounding, Concentrating, and Truncating: Unifying
Privacy Loss Composition for Data Analytics", ALT 2021, Lemma 3.2; Durfee & Rogers
2019, NeurIPS, Lemma 3.1) — DESIGN.md "Accounting" allows ρ = ε²/8 for the
Gumbel-noise max only. So for a per-group share ρ_g: ε_g = √(8ρ_g) and
s = 2Δ∞/ε_g. Under pure DP (mechanism ``laplace``) OpenDP uses exponential noise
(permute-and-flip-equivalent), ε_g = 2Δ∞/s, so s = 2Δ∞/ε_g with ε_g the per-group
ε share. In both cases the charged cost is read back from OpenDP's privacy map of
the measurement used (``make_noisy_max(…).map(Δ∞)``) and must not exceed the share
(the scale is widened by ulps until it does not).

Δ∞ = m·max(num, den − num) in integer score units (:func:`dpgate.quantiles.score_sensitivity`);
the rank scale reported is ``s_r = s/den`` (ranks), and the rank error
``r = s_r·ln(C/0.05)`` (:func:`dpgate.quantiles.rank_error`).

[BS16] Bun & Steinke, TCC 2016. [DR14] Dwork & Roth, The Algorithmic Foundations
of Differential Privacy, 2014.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Mapping

import numpy as np

from dpgate import accounting, mechanisms
from dpgate.mechanisms import selection as selection_mechanisms
from dpgate.errors import InvalidBudget, UnsupportedQuery
from dpgate.ledger.caps import ledger_rho
from dpgate.policy import DatasetPolicy
from dpgate.quantiles import MAX_CELLS, Grid, alpha_fraction, grid_for, rank_error, score_sensitivity, scores
from dpgate.sensitivity import max_groups_changed
from dpgate.sql.plan import Primitive, QueryPlan
from dpgate.sql.quantile import histogram_query

Measure = Literal["zcdp", "pure"]


def has_quantiles(plan: QueryPlan) -> bool:
    """True when the plan releases at least one quantile."""
    return any(p.kind == "quantile" for p in plan.primitives)


def without_quantiles(plan: QueryPlan) -> QueryPlan:
    """The plan's count/sum primitives only (what :func:`dpgate.sql.bound.bounded_sql` computes)."""
    return replace(plan, primitives=tuple(p for p in plan.primitives if p.kind != "quantile"))


@dataclass(frozen=True)
class QuantileNoise:
    """The calibrated selection of one quantile primitive.

    Attributes:
        primitive: primitive id. column: the declared column. alpha: the quantile.
        num, den: α as an exact fraction. grid: the candidates.
        measure: ``"zcdp"`` (Gumbel) or ``"pure"`` (exponential noise).
        score_scale: OpenDP's noise scale on the integer scores.
        rank_scale: the same in ranks (score_scale / den).
        score_sensitivity: Δ∞ of the integer scores (one unit, one group).
        groups: k_eff, groups one unit can change.
        cost_per_group: OpenDP's privacy map at Δ∞ (ρ or ε).
        cost: groups × cost_per_group.
        rank_error95: r = rank_scale·ln(C/0.05).
    """

    primitive: str
    column: str
    alpha: float
    num: int
    den: int
    grid: Grid
    measure: Measure
    score_scale: float
    rank_scale: float
    score_sensitivity: int
    groups: int
    cost_per_group: float
    cost: float
    rank_error95: float

    def describe(self) -> dict[str, Any]:
        """JSON form for explain."""
        return {
            "column": self.column, "quantile": self.alpha, "grid": self.grid.describe(),
            "mechanism": "exponential_mechanism (OpenDP make_noisy_max, "
                         + ("Gumbel noise, rho = eps^2/8" if self.measure == "zcdp" else "exponential noise, pure eps")
                         + ")",
            "score_sensitivity": self.score_sensitivity, "score_scale": self.score_scale,
            "rank_scale": self.rank_scale, "rank_error95": self.rank_error95,
            "groups_per_unit": self.groups,
            ("rho" if self.measure == "zcdp" else "epsilon"): self.cost,
        }


def calibrate_quantile(p: Primitive, plan: QueryPlan, policy: DatasetPolicy, measure: Measure,
                       share: float) -> QuantileNoise:
    """Scale and cost of one quantile for its budget ``share`` (ρ or ε; module docstring).

    Raises:
        InvalidBudget: a share so small that the scale is not finite.
    """
    table = policy.table(plan.table)
    grid = grid_for(table.column(p.column))
    num, den = alpha_fraction(repr(p.alpha))
    k_eff = max_groups_changed(plan, policy)
    delta_inf = score_sensitivity(num, den, table.max_rows_per_unit)
    per_group = share / k_eff
    eps_g = math.sqrt(8.0 * per_group) if measure == "zcdp" else per_group
    scale = 2.0 * delta_inf / eps_g if eps_g > 0 else math.inf
    if not math.isfinite(scale) or scale <= 0:
        raise InvalidBudget(f"the budget is too small for the quantile of {p.column!r}",
                            {"primitive": p.id})
    scale, mapped = selection_mechanisms.noisy_max_within(measure, scale, delta_inf, per_group)
    rank_scale = scale / den
    return QuantileNoise(p.id, p.column, float(p.alpha), num, den, grid, measure, scale, rank_scale,
                         delta_inf, k_eff, mapped, k_eff * mapped, rank_error(rank_scale, grid.size))


@dataclass(frozen=True)
class PlanCalibration:
    """The calibration of a plan with quantiles: the count/sum part and the quantiles.

    Duck-types :class:`dpgate.mechanisms.Calibration` where the runners read it
    (``mechanism``, ``scales``, ``cost``, ``rho``, ``epsilon``, ``exact``).
    ``scales`` maps quantile primitives to their rank scale.
    """

    mechanism: str
    base: mechanisms.Calibration | None
    quantiles: dict[str, QuantileNoise]
    cost: accounting.Cost
    rho: float | None
    epsilon: float | None
    scales: dict[str, float] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        """Never exact: a quantile always costs something."""
        return False

    @property
    def selection(self) -> Any:
        """The threshold mechanism of a plan with privately selected keys (its ρ/ε is in ``base``'s
        cost), None otherwise (:func:`calibrate_selecting_plan`)."""
        return getattr(self.base, "selection", None)

    @property
    def reused(self) -> tuple[str, ...]:
        """Count primitives released from the threshold mechanism's own noisy counts."""
        return tuple(getattr(self.base, "reused", ()))

    def composition(self) -> dict[str, Any]:
        """The two steps of a selecting plan and how they compose (explain's and the release's
        ``partition_selection.composition``): the selection with the plan's counts/sums, (ρ_sel, δ)
        (or (ε_sel, δ)), then the quantiles of the selected groups, ρ_q (or ε_q); sequential
        composition, ρ = ρ_sel + ρ_q ([BS16] Lemma 2.3; ε adds, [DR14] Thm. 3.16), δ the selection's
        (the quantile step adds none)."""
        unit = "rho" if self.rho is not None else "epsilon"
        sel = self.base.rho if unit == "rho" else self.base.epsilon
        quant = math.fsum(q.cost for q in self.quantiles.values())
        return {
            "rule": "sequential",
            "steps": [
                {"step": "partition_selection", unit: sel, "delta": self.selection.delta,
                 "primitives": [pid for pid in self.base.scales], "note": "the threshold mechanism on the "
                 "candidates' unit counts (and the noisy counts/sums of the selected groups)"},
                {"step": "quantiles", unit: quant, "delta": 0.0, "primitives": list(self.quantiles),
                 "note": "one exponential mechanism per quantile and selected group; the histograms of "
                 "groups the selection did not release are never scored"},
            ],
            unit: self.rho if unit == "rho" else self.epsilon,
            "delta": self.selection.delta,
            "note": f"charged once, before any noise is drawn, for both steps: ({unit}_sel + {unit}_q, delta) "
                    "by sequential composition (Bun & Steinke 2016 Lemma 2.3; the quantile step is "
                    "adaptive on the selected keys, which are a DP output)",
        }

    def halfwidths(self) -> dict[str, float]:
        """Quantile primitive → rank error (ranks); count/sum primitive → 95 % half-width."""
        out = {pid: mechanisms.ci95_halfwidth(self.base.mechanism, s) for pid, s in self.base.scales.items()} \
            if self.base is not None else {}
        out.update({pid: q.rank_error95 for pid, q in self.quantiles.items()})
        return out


def calibrate_plan(plan: QueryPlan, policy: DatasetPolicy, mechanism: str, resolved: Mapping[str, Any],
                   pairs: Mapping[str, tuple[float, float]],
                   calibrate: Callable[..., mechanisms.Calibration]) -> PlanCalibration:
    """Split the query's budget over its count/sum primitives and its quantiles (module docstring).

    Args:
        plan, policy: the query plan and its policy.
        mechanism: ``"gaussian"`` (zCDP; quantiles with Gumbel noise) or ``"laplace"`` (pure ε).
        resolved: the resolved budget (``{rho}``, ``{epsilon[, delta]}``; ``{ci95}`` refused).
        pairs: (Δ1, Δ2) of the count/sum primitives.
        calibrate: :func:`dpgate.mechanisms.calibrate`.

    Raises:
        InvalidBudget: a ``ci95`` budget; a budget too small.
        UnsupportedQuery: groups × candidates above :data:`dpgate.quantiles.MAX_CELLS`.
    """
    gaussian, measure, total = _total_budget(mechanism, resolved)
    table = policy.table(plan.table)
    groups = plan.key_combinations(table)
    qprims = [p for p in plan.primitives if p.kind == "quantile"]
    for p in qprims:
        cells = groups * grid_for(table.column(p.column)).size
        if cells > MAX_CELLS:
            raise UnsupportedQuery(
                f"the quantile of {p.column!r} would score {cells} (group, candidate) pairs, more than "
                f"{MAX_CELLS}: group by fewer keys or coarsen the column's resolution",
                {"cells": cells, "max": MAX_CELLS})
    noisy = [pid for pid, (l1, l2) in pairs.items() if (l2 if gaussian else l1) > 0]
    n = len(noisy) + len(qprims)
    share = total / n
    base = None
    if pairs:
        if noisy:
            base = calibrate(pairs, mechanism=mechanism, **({"rho": share * len(noisy)} if gaussian
                                                           else {"epsilon": share * len(noisy)}))
        else:
            base = calibrate(pairs, mechanism=mechanism, scales={})
    quantiles = {p.id: calibrate_quantile(p, plan, policy, measure, share) for p in qprims}
    spent = math.fsum([q.cost for q in quantiles.values()]
                      + ([(base.rho if gaussian else base.epsilon) or 0.0] if base is not None else []))
    spent = max(spent, total) if noisy or quantiles else spent
    scales = dict(base.scales) if base is not None else {}
    scales.update({pid: q.rank_scale for pid, q in quantiles.items()})
    mech = base.mechanism if base is not None else mechanisms.mechanism_name(mechanism)
    return PlanCalibration(mech, base, quantiles,
                           accounting.Cost.zcdp(spent) if gaussian else accounting.Cost.pure(spent),
                           spent if gaussian else None, None if gaussian else spent, scales)


def _total_budget(mechanism: str, resolved: Mapping[str, Any]) -> tuple[bool, Measure, float]:
    """(Gaussian?, the quantiles' measure, the query's total ρ or ε) of a resolved budget.

    Raises:
        InvalidBudget: a ``ci95`` budget; a total that is not finite and > 0.
    """
    if "ci95" in resolved:
        raise InvalidBudget(
            "a ci95 budget is a half-width in the column's units; a DP quantile (MEDIAN, PERCENTILE, "
            "MIN, MAX) reports a rank error instead: give rho or epsilon for this query")
    gaussian = mechanisms.mechanism_name(mechanism) == "discrete_gaussian"
    if gaussian:
        total = (ledger_rho(resolved["epsilon"], resolved["delta"])  # the ledger's one conversion
                 if "epsilon" in resolved else float(resolved["rho"]))
    else:
        total = resolved["epsilon"] if "epsilon" in resolved else math.sqrt(2.0 * resolved["rho"])
    if not (math.isfinite(total) and total > 0):
        raise InvalidBudget(f"the budget must be finite and > 0, got {total!r}")
    return gaussian, ("zcdp" if gaussian else "pure"), total


def calibrate_selecting_plan(plan: QueryPlan, policy: DatasetPolicy, mechanism: str, resolved: Mapping[str, Any],
                             pairs: Mapping[str, tuple[float, float]], delta: float) -> PlanCalibration:
    """Calibrate quantiles grouped by privately selected keys (issue 21 item 8): selection first.

    The budget (total ρ, or ε) is split equally over n = c + 1 + q releases: the plan's c own
    noisy count/sum primitives, the selection histogram (the threshold mechanism's unit counts,
    (ℓ0, ℓ2, ℓ∞) = (k, √k, 1); :func:`dpgate.partition_selection.calibrate_selecting`, which also
    fixes T for δ_q) and the q quantiles (each over k_eff = k groups one unit can change,
    :func:`calibrate_quantile`). Step 1 costs (ρ_sel, δ) with ρ_sel = (c + 1)·ρ/n; step 2 costs
    ρ_q = Σ over quantiles of k·ε_g²/8 ≤ q·ρ/n. Sequential composition ([BS16] Lemma 2.3): the
    charge is (max(ρ_sel + ρ_q, ρ), δ) — the whole requested ρ, as :func:`calibrate_plan` — paid
    once before either step draws noise (:meth:`PlanCalibration.composition`).

    Args:
        plan: a plan with quantiles and :attr:`~dpgate.sql.plan.QueryPlan.selected_keys`.
        pairs: (Δ1, Δ2) of its count/sum primitives (k_eff = k). delta: δ_q
            (:func:`dpgate.partition_selection.selection_budget`).
    Raises:
        InvalidBudget: a ``ci95`` budget; a budget or δ too small.
    """
    from dpgate import partition_selection  # the selection's calibration (it never imports this module)
    from dpgate.sql.partition_selection import reused_primitives

    gaussian, measure, total = _total_budget(mechanism, resolved)
    base_plan = without_quantiles(plan)
    reused = reused_primitives(base_plan, policy)
    own = [pid for pid, (l1, l2) in pairs.items() if pid not in reused and (l2 if gaussian else l1) > 0]
    qprims = [p for p in plan.primitives if p.kind == "quantile"]
    share = total / (len(own) + 1 + len(qprims))
    first = share * (len(own) + 1)
    base = partition_selection.calibrate_selecting(base_plan, policy, pairs, mechanism=mechanism, delta=delta,
                                                   **({"rho": first} if gaussian else {"epsilon": first}))
    quantiles = {p.id: calibrate_quantile(p, plan, policy, measure, share) for p in qprims}
    spent = math.fsum([q.cost for q in quantiles.values()] + [(base.rho if gaussian else base.epsilon) or 0.0])
    spent = max(spent, total)
    scales = dict(base.scales)
    scales.update({pid: q.rank_scale for pid, q in quantiles.items()})
    return PlanCalibration(base.mechanism, base, quantiles,
                           accounting.Cost.zcdp(spent) if gaussian else accounting.Cost.pure(spent),
                           spent if gaussian else None, None if gaussian else spent, scales)


def _key_value(v: Any) -> Any:
    """A group-key value comparable across result sets (NULL, NaN and NaT are one NULL group)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def selected_histograms(result: Mapping[str, np.ndarray], plan: QueryPlan, keys: Mapping[str, np.ndarray],
                        candidates: int) -> np.ndarray:
    """The (released groups × candidates) count matrix of a selecting plan's histogram statement.

    ``keys`` are the groups the threshold mechanism released (:func:`dpgate.partition_selection.select_rows`),
    row r of the matrix is group r; the result's rows of any other group are dropped here, before
    any quantile is scored (the quantile step never sees an unselected group). A released group
    without values of the column has a zero row.
    """
    names = list(plan.group_by)
    index = {tuple(_key_value(v) for v in row): i
             for i, row in enumerate(zip(*(np.asarray(keys[c], dtype=object).tolist() for c in names)))}
    out = np.zeros((len(np.asarray(keys[names[0]])), candidates), dtype=np.int64)
    b = np.asarray(result["__dpg_b"], dtype=np.int64).tolist()
    c = np.asarray(result["__dpg_n"], dtype=np.int64).tolist()
    rows = zip(*(np.asarray(result[k], dtype=object).tolist() for k in names))
    for key, bi, ci in zip(rows, b, c):
        i = index.get(tuple(_key_value(v) for v in key))
        if i is not None and 0 <= bi < candidates:
            out[i, bi] += ci
    return out


def run_selected(plan: QueryPlan, cal: PlanCalibration, execute: Callable[[Any], Mapping[str, np.ndarray]],
                 keys: Mapping[str, np.ndarray], statements: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Step 2 of a selecting plan: each quantile chosen on the released groups' histograms only.

    Args:
        keys: the released groups (step 1's keys). statements: column → its histogram statement,
            rendered and checked before the charge.
    Returns: primitive id → candidate index per released group (in ``keys`` order).
    """
    by_column: dict[str, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    for pid, q in cal.quantiles.items():
        if q.column not in by_column:
            by_column[q.column] = selected_histograms(execute(statements[q.column]), plan, keys, q.grid.size)
        hist = by_column[q.column]
        out[pid] = select(q, hist) if hist.shape[0] else np.zeros(0, dtype=np.int64)
    return out


def histograms(result: Mapping[str, np.ndarray], n_groups: int, candidates: int) -> np.ndarray:
    """The (groups × candidates) count matrix from :func:`dpgate.sql.quantile.histogram_sql`'s result."""
    r = np.asarray(result["__dpg_r"], dtype=np.int64)
    b = np.asarray(result["__dpg_b"], dtype=np.int64)
    c = np.asarray(result["__dpg_n"], dtype=np.int64)
    keep = b >= 0
    flat = np.bincount(r[keep] * candidates + b[keep], weights=c[keep], minlength=n_groups * candidates)
    return np.rint(flat).astype(np.int64).reshape(n_groups, candidates)


def group_keys(result: Mapping[str, np.ndarray], plan: QueryPlan) -> dict[str, np.ndarray]:
    """Group-key vectors (one entry per group, public-key order) from a histogram result."""
    r = np.asarray(result["__dpg_r"], dtype=np.int64)
    first = np.flatnonzero(np.r_[True, r[1:] != r[:-1]]) if r.size else np.array([], dtype=np.int64)
    return {k: np.asarray(result[k])[first] for k in plan.group_by}


def select(noise: QuantileNoise, hist: np.ndarray) -> np.ndarray:
    """Candidate index per group, each chosen by OpenDP's noisy max on that group's scores."""
    return np.array([selection_mechanisms.noisy_argmin(noise.measure, noise.score_scale, scores(row, noise.num, noise.den))
                     for row in hist], dtype=np.int64)


def run(plan: QueryPlan, policy: DatasetPolicy, cal: PlanCalibration, execute: Callable[[Any], Mapping[str, np.ndarray]],
        salt: int, statements: Mapping[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Execute each quantile column's histogram statement and select every quantile.

    Args:
        statements: column → its histogram statement, rendered (and checked) before the charge
            (:class:`dpgate.pipeline.runners.QuantilesRunner`); None: rendered here with ``salt``.
    Returns (group keys, primitive id → candidate index per group).
    """
    table = policy.table(plan.table)
    n_groups = plan.key_combinations(table)
    by_column: dict[str, Mapping[str, np.ndarray]] = {}
    out: dict[str, np.ndarray] = {}
    keys: dict[str, np.ndarray] = {}
    for pid, q in cal.quantiles.items():
        if q.column not in by_column:
            statement = statements[q.column] if statements is not None else \
                histogram_query(plan, policy, q.column, salt=salt)
            by_column[q.column] = execute(statement)
            keys = keys or group_keys(by_column[q.column], plan)
        hist = histograms(by_column[q.column], n_groups, q.grid.size)
        out[pid] = select(q, hist)
    return keys, out
