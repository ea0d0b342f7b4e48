"""Post-processing: turn noisy primitives into the released table.

Everything here reads only noisy values, public keys and the policy, so by the
post-processing property of differential privacy ([DR14] Prop. 2.1; zCDP is
closed under post-processing too, [BS16]) it costs no privacy budget. The steps of :func:`finalize`:

1. **Scale** fixed-point sums back to column units: a noisy ``sum`` times the
   column's ``resolution``, a noisy ``sum_squares`` times ``resolution²``.
2. **Derive** each output (for every row, i.e. public-key combination):

   * counts (``count``, ``count_column``, ``count_distinct_unit``): the noisy
     integer, clamped at 0 when ``policy.budget.clamp_counts`` (default);
   * ``sum``: noisy sum × resolution (an int for int columns of integer
     resolution; rounded to the resolution's decimals when it is a power of ten);
   * ``avg`` = S / max(C, 1) with S the noisy sum, C the noisy non-NULL count
     (the denominator floored at 1), clamped to [lower, upper];
   * ``var_pop`` = E[x²] − E[x]² with E[x] = S / max(C, 1) clamped to
     [lower, upper] and E[x²] = Q / max(C, 1) clamped to the range of x² on
     [lower, upper], the result clamped to [0, (upper − lower)²/4] (the largest
     variance of a distribution on [lower, upper], Popoviciu's inequality);
   * ``stddev_pop`` = √var_pop clamped to [0, (upper − lower)/2].
3. **Accuracy** per released aggregate column (output units): the mechanism,
   ``sigma`` (discrete Gaussian) or ``scale`` (discrete Laplace), ``ci95``
   (half-width of a 95 % interval for the noise). For counts and sums the
   interval is the mechanism's exact one (``approximate: false``). For AVG,
   VAR_POP and STDDEV_POP ``ci95`` is conservative interval arithmetic over the
   parts' 95 % intervals (each part in its interval ⇒ the derived value in the
   computed range; joint coverage ≥ 1 − Σ 5 % by the union bound), reported per
   row in ``ci95_rows`` and as the column's maximum in ``ci95``, flagged
   ``approximate: true``; it covers the noise only, not the clamping bias.
4. **Suppression** (optional): a cell whose 95 % half-width exceeds
   ``policy.budget.suppress_ci95_above`` is released as ``None``; the number of
   suppressed cells is ``accuracy[column]["suppressed"]``.
5. **HAVING** (:func:`dpgate.sql.plan.evaluate_predicate`, on the values above,
   NULL-aware), **ORDER BY** (stable, NULLS LAST unless ``nulls_first``), **LIMIT**;
   hidden outputs (used only by HAVING/ORDER BY) are then dropped.
6. **Finite JSON**: a released number that is NaN or ±inf is released as ``None``
   (null), in cells and in accuracy alike, so a release is always strict JSON. The
   policy limits (:mod:`dpgate.limits`) already make every such number finite for
   any data; this guard is defence in depth, and since it reads only noisy values it
   is post-processing too (it cannot turn the data into an error).

A primitive of scale 0 (sensitivity 0: a constant, released exactly) has
``sigma``/``scale`` 0 and ``ci95`` 0.

Without ORDER BY, rows stay in public-key order (the bounded SQL's order).

References: [DR14] C. Dwork, A. Roth, The Algorithmic Foundations of Differential
Privacy, 2014. [BS16] M. Bun, T. Steinke, Concentrated Differential Privacy, TCC 2016.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from dpgate.errors import Internal
from dpgate.policy import DatasetPolicy, TablePolicy
from dpgate.sql.plan import FUNCTION_PRIMITIVES, AggregateOutput, KeyOutput, QueryPlan, evaluate_predicate

__all__ = ["ReleasedTable", "finalize", "output_unit"]

_COUNTS = ("count", "count_column", "count_distinct_unit")


@dataclass(frozen=True)
class ReleasedTable:
    """The post-processed release.

    Attributes:
        columns: released column names (the plan's visible outputs, canonical names).
        rows: one list per row, values as JSON-ready Python scalars (int, float,
            str, bool) or ``None`` (suppressed cell, or a NULL key).
        accuracy: released aggregate column → ``{"mechanism", "sigma" | "scale",
            "ci95", "approximate", "suppressed"}``, plus ``"ci95_rows"`` (per
            released row) and ``"inputs"`` (the parts' sigma/scale and ci95) for
            derived outputs; all in output units. Key columns have no entry.
    """

    columns: list[str]
    rows: list[list[Any]]
    accuracy: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _Column:
    values: np.ndarray  # float (NaN = NULL) for aggregates; object for keys
    ci_rows: np.ndarray | None = None  # per-row 95 % half-width (aggregates)
    accuracy: dict[str, Any] | None = None
    as_int: bool = False
    digits: int | None = None


def finalize(
    plan: QueryPlan,
    policy: DatasetPolicy,
    keys: Mapping[str, np.ndarray],
    noisy: Mapping[str, np.ndarray],
    scales: Mapping[str, float],
    halfwidths: Mapping[str, float],
    *,
    mechanism: str,
    resolution_of: Callable[[str], float] | None = None,
) -> ReleasedTable:
    """Compute the released table from noisy primitives (post-processing; costs nothing).

    Args:
        plan: the query plan.
        policy: the dataset policy (bounds, resolutions, ``budget.clamp_counts``,
            ``budget.suppress_ci95_above``).
        keys: group-key column → public key values, one per row, in the bounded
            SQL's order (empty for an ungrouped query).
        noisy: primitive id → noisy integer vector (integer units), one cell per row.
        scales: primitive id → σ (discrete Gaussian) or b (discrete Laplace), integer units.
        halfwidths: primitive id → 95 % half-width of its noise, integer units
            (:func:`dpgate.mechanisms.ci95_halfwidth`).
        mechanism: ``"discrete_gaussian"`` or ``"discrete_laplace"`` (reported; picks
            the ``sigma``/``scale`` key).
        resolution_of: optional override column → resolution; default: the policy's.

    Returns:
        A :class:`ReleasedTable` (see the module docstring for each step).

    Raises:
        Internal: the inputs do not match the plan (missing primitive or key,
            vectors of different lengths, an ungrouped query with ≠ 1 row, a
            derived output on a column without bounds).
    """
    # Non-finite intermediates cannot arise within the policy limits; should one, it becomes
    # a null cell (step 6), not a warning.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _finalize(plan, policy, keys, noisy, scales, halfwidths, mechanism, resolution_of)


def _finalize(plan, policy, keys, noisy, scales, halfwidths, mechanism, resolution_of) -> ReleasedTable:
    table = policy.table(plan.table)
    n = _row_count(plan, keys, noisy)
    res = resolution_of or (lambda c: table.column(c).resolution or 1.0)
    scale_key = "sigma" if "gaussian" in mechanism else "scale"

    # Primitives in output units: value, noise scale and 95 % half-width.
    prim: dict[str, tuple[np.ndarray, float, float]] = {}
    for p in plan.primitives:
        if p.id not in noisy or p.id not in scales or p.id not in halfwidths:
            raise Internal(f"post-processing is missing primitive {p.id!r}")
        unit = output_unit(p.kind, res(p.column) if p.column else None)
        raw = np.asarray(noisy[p.id])
        prim[p.id] = (raw.astype(np.float64) * unit, float(scales[p.id]) * unit, float(halfwidths[p.id]) * unit)

    def direct(pid: str) -> dict[str, Any]:
        _, s, h = prim[pid]
        return {"mechanism": mechanism, scale_key: s, "ci95": h, "approximate": False}

    cols: dict[str, _Column] = {}
    for o in plan.outputs:
        if isinstance(o, KeyOutput):
            if o.column not in keys:
                raise Internal(f"post-processing is missing the key column {o.column!r}")
            cols[o.name] = _Column(_objects(keys[o.column]))
            continue
        cols[o.name] = _aggregate(o, table, prim, res, direct, policy.budget.clamp_counts, n)

    # Suppression (cells whose 95 % interval is wider than the policy allows).
    limit = policy.budget.suppress_ci95_above
    for c in cols.values():
        if c.accuracy is None:
            continue
        suppress = np.zeros(n, dtype=bool) if limit is None else c.ci_rows > float(limit)
        c.values = np.where(suppress, np.nan, c.values)
        c.accuracy["suppressed"] = int(suppress.sum())

    # HAVING, ORDER BY, LIMIT on the noisy values.
    order = np.arange(n)
    if plan.having:
        try:
            keep = evaluate_predicate(plan.having, {name: c.values for name, c in cols.items()})
        except ValueError as e:
            raise Internal(f"HAVING could not be evaluated: {e}") from None
        order = order[np.asarray(keep, dtype=bool)]
    for item in reversed(plan.order_by):
        order = _stable_sort(order, cols[item.output].values, item.descending, item.nulls_first)
    if plan.limit is not None:
        order = order[: plan.limit]

    visible = [o for o in plan.outputs if not o.hidden]
    rows = [[_cell(cols[o.name], i) for o in visible] for i in order.tolist()]
    accuracy: dict[str, dict[str, Any]] = {}
    for o in visible:
        c = cols[o.name]
        if c.accuracy is None:
            continue
        acc = dict(c.accuracy)
        if acc["approximate"]:
            kept = c.ci_rows[order]
            acc["ci95_rows"] = [float(v) for v in kept]
            acc["ci95"] = float(np.nanmax(kept)) if kept.size and not np.isnan(kept).all() else None
        accuracy[o.name] = _finite_json(acc)
    return ReleasedTable(columns=[o.name for o in visible], rows=rows, accuracy=accuracy)


def _finite_json(value: Any) -> Any:
    """``value`` with every NaN/±inf float replaced by None (dicts and lists walked)."""
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_json(v) for v in value]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return None
    return value


def output_unit(kind: str, resolution: float | None) -> float:
    """Size of one integer unit of a primitive in output units (the one definition).

    Args:
        kind: the primitive's kind (:data:`~dpgate.sql.plan.PrimitiveKind`).
        resolution: its column's resolution (ignored for counts; None counts as 1).

    Returns:
        1 for counts (rows, units), ``resolution`` for a fixed-point ``sum``,
        ``resolution²`` for a ``sum_squares``.
    """
    r = 1.0 if resolution is None else float(resolution)
    if kind == "sum":
        return r
    if kind == "sum_squares":
        return r * r
    return 1.0


def _row_count(plan: QueryPlan, keys: Mapping[str, np.ndarray], noisy: Mapping[str, np.ndarray]) -> int:
    lengths = {len(v) for v in noisy.values()} | {len(v) for v in keys.values()}
    if len(lengths) > 1:
        raise Internal("post-processing got vectors of different lengths")
    n = lengths.pop() if lengths else 0
    if not plan.group_by and n != 1:
        raise Internal(f"an ungrouped query must have exactly one row, got {n}")
    return n


def _objects(values: np.ndarray) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = [v.item() if isinstance(v, np.generic) else v for v in np.asarray(values, dtype=object)]
    return out


def _bounds(table: TablePolicy, column: str | None) -> tuple[float, float]:
    col = table.column(column) if column else None
    if col is None or not col.bounded:
        raise Internal(f"column {column!r} has no bounds; AVG/VAR/STDDEV need them")
    return float(col.lower), float(col.upper)


def _ratio_box(s: np.ndarray, hs: float, c: np.ndarray, hc: float) -> tuple[np.ndarray, np.ndarray]:
    """Range of x/max(y, 1) over x ∈ [s − hs, s + hs], y ∈ [c − hc, c + hc] (elementwise)."""
    y_lo, y_hi = np.maximum(c - hc, 1.0), np.maximum(c + hc, 1.0)
    corners = np.stack([(s - hs) / y_lo, (s - hs) / y_hi, (s + hs) / y_lo, (s + hs) / y_hi])
    return corners.min(axis=0), corners.max(axis=0)


def _square_range(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Range of x² for x ∈ [lo, hi] (elementwise)."""
    sq_lo = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(lo * lo, hi * hi))
    return sq_lo, np.maximum(lo * lo, hi * hi)


def _aggregate(
    o: AggregateOutput,
    table: TablePolicy,
    prim: Mapping[str, tuple[np.ndarray, float, float]],
    res: Callable[[str], float],
    direct: Callable[[str], dict[str, Any]],
    clamp_counts: bool,
    n: int,
) -> _Column:
    fn = o.function
    if fn in _COUNTS:
        (pid,) = o.primitives
        v, _, h = prim[pid]
        if clamp_counts:
            v = np.maximum(v, 0.0)
        return _Column(v, np.full(n, h), direct(pid), as_int=True)
    if fn == "sum":
        (pid,) = o.primitives
        v, _, h = prim[pid]
        r = float(res(o.column))
        col = table.column(o.column)
        as_int = col.type == "int" and float(r).is_integer()
        return _Column(v, np.full(n, h), direct(pid), as_int=as_int, digits=_decimals(r))

    lower, upper = _bounds(table, o.column)
    inputs = {prim_kind: direct(pid) for prim_kind, pid in zip(_part_names(fn), o.primitives)}
    acc = {"mechanism": inputs["count"]["mechanism"], "approximate": True, "inputs": inputs}
    if fn == "avg":
        sum_id, count_id = o.primitives
        (s, _, hs), (c, _, hc) = prim[sum_id], prim[count_id]
        value = np.clip(s / np.maximum(c, 1.0), lower, upper)
        lo, hi = _ratio_box(s, hs, c, hc)
        lo, hi = np.clip(lo, lower, upper), np.clip(hi, lower, upper)
        return _Column(value, np.maximum(hi - value, value - lo), acc)

    # var_pop / stddev_pop from (sum_squares, sum, count_column).
    sq_id, sum_id, count_id = o.primitives
    (q, _, hq), (s, _, hs), (c, _, hc) = prim[sq_id], prim[sum_id], prim[count_id]
    bound_lo, bound_hi = _square_range(np.array([lower]), np.array([upper]))
    sq_min, sq_max = float(bound_lo[0]), float(bound_hi[0])
    var_max = (upper - lower) ** 2 / 4.0
    denom = np.maximum(c, 1.0)
    m1 = np.clip(s / denom, lower, upper)
    m2 = np.clip(q / denom, sq_min, sq_max)
    var = np.clip(m2 - m1 * m1, 0.0, var_max)
    m1_lo, m1_hi = (np.clip(x, lower, upper) for x in _ratio_box(s, hs, c, hc))
    m2_lo, m2_hi = (np.clip(x, sq_min, sq_max) for x in _ratio_box(q, hq, c, hc))
    m1sq_lo, m1sq_hi = _square_range(m1_lo, m1_hi)
    var_lo = np.clip(m2_lo - m1sq_hi, 0.0, var_max)
    var_hi = np.clip(m2_hi - m1sq_lo, 0.0, var_max)
    if fn == "var_pop":
        return _Column(var, np.maximum(var_hi - var, var - var_lo), acc)
    sd_max = (upper - lower) / 2.0
    sd = np.clip(np.sqrt(var), 0.0, sd_max)
    sd_lo, sd_hi = np.clip(np.sqrt(var_lo), 0.0, sd_max), np.clip(np.sqrt(var_hi), 0.0, sd_max)
    return _Column(sd, np.maximum(sd_hi - sd, sd - sd_lo), acc)


def _part_names(fn: str) -> tuple[str, ...]:
    """Names of a derived output's parts in ``accuracy[...]["inputs"]``: its primitives'
    kinds (:data:`~dpgate.sql.plan.FUNCTION_PRIMITIVES`), the non-NULL count shown as ``count``."""
    return tuple("count" if k == "count_column" else k for k in FUNCTION_PRIMITIVES[fn])


def _decimals(resolution: float) -> int | None:
    """Decimals of a power-of-ten resolution below 1 (to print 0.3, not 0.30000000000000004)."""
    if resolution >= 1 or resolution <= 0:
        return None
    exponent = math.log10(resolution)
    return -round(exponent) if abs(exponent - round(exponent)) < 1e-9 else None


def _cell(c: _Column, i: int) -> Any:
    v = c.values[i]
    if c.accuracy is None:
        return v
    if v is None or not math.isfinite(float(v)):  # NULL, suppressed, or (guard) non-finite
        return None
    if c.as_int:
        return int(round(float(v)))
    if c.digits is not None:
        return round(float(v), c.digits)
    return float(v)


def _stable_sort(order: np.ndarray, values: np.ndarray, descending: bool, nulls_first: bool) -> np.ndarray:
    """Stable sort of row indices ``order`` by ``values`` (NULL = None or NaN) with SQL NULL placement."""
    items = order.tolist()
    null = [i for i in items if _is_null(values[i])]
    present = [i for i in items if not _is_null(values[i])]
    present = sorted(present, key=lambda i: values[i], reverse=descending)  # sorted() is stable
    return np.array(null + present if nulls_first else present + null, dtype=np.int64)


def _is_null(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))
