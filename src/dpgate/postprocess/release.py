"""The released table (:func:`finalize`), from noisy primitives:

1. **Scale** fixed-point sums back to column units: a noisy ``sum`` times the
   column's ``resolution``, a noisy ``sum_squares`` times ``resolution²``.
2. **Derive** each aggregate cell (:func:`aggregate_cell`), for every row:

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
   parts' intervals, each at 1 − 0.05/k for k parts (97.5 % for AVG's sum and
   count, 98.33 % for VAR's three parts; ``part_coverage``), so that all parts lie
   in their intervals with probability ≥ 95 % by the union bound and the derived
   value then lies in the computed range (``coverage: 0.95``, as labelled). The
   range is restricted to the values the aggregate can take ([lower, upper] for
   AVG, [0, (upper − lower)²/4] for VAR); where the parts' box misses that range
   (thin groups), the whole range is reported, never a point. Reported per
   row in ``ci95_rows`` and as the column's maximum in ``ci95``, flagged
   ``approximate: true``; it covers the noise only, not the clamping bias.
4. **Suppression** (optional): a cell whose 95 % half-width exceeds
   ``policy.budget.suppress_ci95_above`` is released as ``None``; the number of
   suppressed cells is ``accuracy[column]["suppressed"]``.
5. **HAVING** (:func:`evaluate_predicate`, on the values above, NULL-aware),
   **ORDER BY** (stable, NULLS LAST unless ``nulls_first``), **LIMIT**; hidden
   outputs (used only by HAVING/ORDER BY) are then dropped.
6. **Finite JSON**: a released number that is NaN or ±inf is released as ``None``
   (null), in cells and in accuracy alike, so a release is always strict JSON. The
   policy limits (:mod:`dpgate.limits`) already make every such number finite for
   any data; this guard is defence in depth, and since it reads only noisy values it
   is post-processing too (it cannot turn the data into an error).

A primitive of scale 0 (sensitivity 0: a constant, released exactly) has
``sigma``/``scale`` 0 and ``ci95`` 0.

Without ORDER BY, rows stay in public-key order (the bounded SQL's order).

The inverse of step 3 for a ``{"ci95": w}`` budget (which noise scales make
each *released cell* meet ``w``) is :func:`scales_for_ci95`.

References: [DR14] C. Dwork, A. Roth, The Algorithmic Foundations of Differential
Privacy, 2014. [BS16] M. Bun, T. Steinke, Concentrated Differential Privacy, TCC 2016.
[CKS20] C. Canonne, G. Kamath, T. Steinke, The Discrete Gaussian for Differential
Privacy, NeurIPS 2020. [GRS12] A. Ghosh, T. Roughgarden, M. Sundararajan,
Universally Utility-Maximizing Privacy Mechanisms, SIAM J. Comput. 2012.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from sqlglot import exp

from dpgate.errors import Internal
from dpgate.policy import DatasetPolicy, TablePolicy
from dpgate.postprocess.accuracy import (
    CellNoise,
    PrimitiveNoise,
    _accuracy_entry,
    propagate_accuracy,
    ratio_part_alpha,
)
from dpgate.postprocess.expressions import (
    ExpressionError,
    Vector,
    evaluate,
    evaluate_predicate,
    limit_rows,
    sort_rows,
)
from dpgate.quantiles import grid_for
from dpgate.sql.primitives import primitive_kind
from dpgate.sql.plan import FUNCTION_PRIMITIVES, DerivedOutput, KeyOutput, QueryPlan

_COUNTS = ("count", "count_column", "count_distinct_unit", "count_distinct")


@dataclass(frozen=True)
class ReleasedTable:
    """The post-processed release.

    Attributes:
        columns: released column names (the plan's visible outputs, canonical names).
        rows: one list per row, values as JSON-ready Python scalars (int, float,
            str, bool) or ``None`` (suppressed cell, or a NULL key).
        accuracy: released aggregate column → ``{"mechanism", "sigma" | "scale",
            "ci95", "approximate", "suppressed"}``, plus ``"ci95_rows"`` (per
            released row), ``"method"``, ``"coverage"`` and ``"inputs"`` (the parts'
            sigma/scale and ci95) for derived outputs; all in output units. Key
            columns have no entry.
    """

    columns: list[str]
    rows: list[list[Any]]
    accuracy: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(eq=False)
class ReleasedCell:
    """One released column before selection and formatting.

    Attributes:
        vector: the values (:class:`Vector`; NULL for suppressed cells).
        noise: how it depends on the noise (None: exact, e.g. a group key).
        accuracy: its accuracy entry without ``ci95``/``ci95_rows`` (None: exact).
        ci_rows: per-row 95 % half-width (None: exact, or omitted).
        digits: decimals to round floats to when released (a sum's resolution), or None.
    """

    vector: Vector
    noise: CellNoise | None = None
    accuracy: dict[str, Any] | None = None
    ci_rows: np.ndarray | None = None
    digits: int | None = None

    def accuracy_for(self, rows: np.ndarray) -> dict[str, Any] | None:
        """The accuracy entry for the released ``rows`` (indices), or None (exact).

        An entry that already states one exact ``ci95`` is returned as is;
        otherwise ``ci95`` is the largest half-width over ``rows`` and
        ``ci95_rows`` lists them per released row (None at NULL values) when the
        entry is approximate or the widths differ by row."""
        if self.accuracy is None:
            return None
        return _accuracy_entry(self.accuracy, self.ci_rows, rows)

    def values_for(self, rows: np.ndarray) -> list[Any]:
        """JSON-ready values at ``rows`` (floats rounded to ``digits`` when set)."""
        values = self.vector.take(rows).to_list()
        if self.digits is not None and self.vector.type == "float":
            values = [round(v, self.digits) if v is not None else None for v in values]
        return values


def derived_cell(expr: exp.Expression | str, cells: Mapping[str, ReleasedCell],
                 primitives: Mapping[str, PrimitiveNoise], *, rows: int | None = None,
                 dialect: str = "duckdb") -> ReleasedCell:
    """A select-list post-processing expression over released cells, with its accuracy.

    Evaluates ``expr`` (:func:`evaluate`) and propagates the accuracy of its noisy
    inputs (:func:`propagate_accuracy`). Costs nothing: it reads released values only.

    Args:
        expr: the expression, column references naming keys of ``cells``.
        cells: cell name → :class:`ReleasedCell` (aggregates from
            :func:`aggregate_cell`, keys as ``ReleasedCell(Vector.of(keys))``).
        primitives: primitive id → :class:`PrimitiveNoise`.
        rows, dialect: as for :func:`evaluate`.

    Returns:
        A :class:`ReleasedCell` (``accuracy`` None when the expression is exact).

    Raises:
        ExpressionError: as for :func:`evaluate`.
    """
    values = {name: c.vector for name, c in cells.items()}
    noise = {name: c.noise for name, c in cells.items() if c.noise is not None}
    value = evaluate(expr, values, rows=rows, dialect=dialect)
    acc = propagate_accuracy(expr, values, noise, primitives, value=value, rows=rows, dialect=dialect)
    if acc is None:
        return ReleasedCell(value)
    entry = dict(acc.entry)
    if acc.ci_rows is not None and not entry.get("approximate"):
        finite = acc.ci_rows[np.isfinite(acc.ci_rows)]
        if finite.size and float(finite.min()) == float(finite.max()):
            entry["ci95"] = float(finite[0])  # one exact half-width for every row
    return ReleasedCell(value, None, entry, acc.ci_rows)


def primitive_noise(mechanism: str, scale: float, halfwidth: float, unit: float = 1.0) -> PrimitiveNoise:
    """:class:`PrimitiveNoise` in output units from a primitive's integer-unit σ/b and 95 % half-width."""
    return PrimitiveNoise(mechanism, float(scale) * unit, float(halfwidth) * unit, float(unit))


def aggregate_cell(function: str, parts: Sequence[tuple[str, np.ndarray]], primitives: Mapping[str, PrimitiveNoise],
                   *, bounds: tuple[float, float] | None = None, clamp_counts: bool = True,
                   integer: bool = False, digits: int | None = None) -> ReleasedCell:
    """One released aggregate column from its noisy primitives (module docstring, part C, step 2).

    Args:
        function: ``count``, ``count_column``, ``count_distinct_unit``, ``sum``,
            ``avg``, ``var_pop`` or ``stddev_pop``.
        parts: (primitive id, noisy values in output units) in the order of
            :data:`dpgate.sql.plan.FUNCTION_PRIMITIVES`: (count,), (sum,),
            (sum, count_column) for AVG, (sum_squares, sum, count_column) for VAR/STDDEV.
        primitives: primitive id → :class:`PrimitiveNoise` (output units).
        bounds: the column's [lower, upper] (required for avg, var_pop, stddev_pop).
        clamp_counts: clamp noisy counts at 0.
        integer: release a sum as integers (int column, integer resolution).
        digits: decimals of a sum's resolution (power of ten below 1), or None.

    Returns:
        A :class:`ReleasedCell` with its values, :class:`CellNoise` and accuracy
        entry (``ci_rows`` per row).

    Raises:
        Internal: unknown function, wrong number of parts, missing bounds.
    """
    def direct(pid: str) -> dict[str, Any]:
        p = primitives[pid]
        return {"mechanism": p.mechanism, "sigma" if p.gaussian else "scale": p.scale, "ci95": p.ci95,
                "approximate": False}

    expected = {"avg": 2, "var_pop": 3, "stddev_pop": 3}.get(function, 1)
    if len(parts) != expected:
        raise Internal(f"{function} needs {expected} primitive(s), got {len(parts)}")
    if function in _COUNTS or function == "sum":
        (pid, raw), = parts
        v = np.asarray(raw, dtype=np.float64)
        n = len(v)
        clamped = None
        if function in _COUNTS:
            if clamp_counts:
                clamped = v < 0
                v = np.maximum(v, 0.0)
            integer = True
        vector = _number_vector(v, integer)
        return ReleasedCell(vector, CellNoise.of_primitive(pid, clamped=clamped), direct(pid),
                            np.full(n, primitives[pid].ci95), None if integer else digits)
    if bounds is None:
        raise Internal(f"{function} needs the column's bounds")
    lower, upper = float(bounds[0]), float(bounds[1])
    ids = [pid for pid, _ in parts]
    # the parts' names in ``inputs``: the primitives' kinds, the non-NULL count shown as ``count``
    names = tuple("count" if k == "count_column" else k for k in FUNCTION_PRIMITIVES[function])
    inputs = {name: direct(pid) for name, pid in zip(names, ids)}
    k = len(ids)
    # Each part's interval at 1 − 0.05/k, so that the box covers all k parts with probability
    # ≥ 95 % (union bound): the cell's ci95 is a 95 % interval, as labelled.
    alpha = ratio_part_alpha(k)
    acc = {"mechanism": inputs["count"]["mechanism"], "approximate": True, "method": "interval",
           "coverage": 0.95, "part_coverage": round(1.0 - alpha, 10), "inputs": inputs}
    if function == "avg":
        (s_id, s), (c_id, c) = ((pid, np.asarray(x, dtype=np.float64)) for pid, x in parts)
        hs, hc = primitives[s_id].halfwidth(alpha), primitives[c_id].halfwidth(alpha)
        value = np.clip(s / np.maximum(c, 1.0), lower, upper)
        lo, hi = _within(*_ratio_box(s, hs, c, hc), lower, upper)
        return ReleasedCell(Vector.of(value), CellNoise.of_interval(lo, hi, ids), acc,
                            np.maximum(hi - value, value - lo))
    if function not in ("var_pop", "stddev_pop"):
        raise Internal(f"unknown aggregate function {function!r}")
    (q_id, q), (s_id, s), (c_id, c) = ((pid, np.asarray(x, dtype=np.float64)) for pid, x in parts)
    hq, hs, hc = (primitives[pid].halfwidth(alpha) for pid in (q_id, s_id, c_id))
    bound_lo, bound_hi = _square_range(np.array([lower]), np.array([upper]))
    sq_min, sq_max = float(bound_lo[0]), float(bound_hi[0])
    var_max = (upper - lower) ** 2 / 4.0
    denom = np.maximum(c, 1.0)
    m1 = np.clip(s / denom, lower, upper)
    m2 = np.clip(q / denom, sq_min, sq_max)
    var = np.clip(m2 - m1 * m1, 0.0, var_max)
    m1_lo, m1_hi = _within(*_ratio_box(s, hs, c, hc), lower, upper)
    m2_lo, m2_hi = _within(*_ratio_box(q, hq, c, hc), sq_min, sq_max)
    m1sq_lo, m1sq_hi = _square_range(m1_lo, m1_hi)
    var_lo, var_hi = _within(m2_lo - m1sq_hi, m2_hi - m1sq_lo, 0.0, var_max)
    if function == "var_pop":
        return ReleasedCell(Vector.of(var), CellNoise.of_interval(var_lo, var_hi, ids), acc,
                            np.maximum(var_hi - var, var - var_lo))
    sd_max = (upper - lower) / 2.0
    sd = np.clip(np.sqrt(var), 0.0, sd_max)
    sd_lo, sd_hi = np.clip(np.sqrt(var_lo), 0.0, sd_max), np.clip(np.sqrt(var_hi), 0.0, sd_max)
    return ReleasedCell(Vector.of(sd), CellNoise.of_interval(sd_lo, sd_hi, ids), acc,
                        np.maximum(sd_hi - sd, sd - sd_lo))


def quantile_cell(function: str, alpha: float, values: np.ndarray, rank_scale: float, rank_error: float,
                  grid: Mapping[str, Any], mechanism: str) -> ReleasedCell:
    """A released quantile column (values in column units) with its rank-error accuracy entry.

    The accuracy is a rank error, not a σ (:mod:`dpgate.quantiles`): with probability
    ≥ 95 % the released value has α·n ± ``rank_error95`` values below it (plus the
    values within one grid step of the true quantile), n the bounded values of the
    group. ``ci95`` is None: there is no value interval to report.
    """
    entry: dict[str, Any] = {
        "mechanism": "exponential_mechanism",
        "noise": "gumbel" if mechanism == "discrete_gaussian" else "exponential",
        "quantile": float(alpha),
        "rank_scale": float(rank_scale),
        "rank_error95": float(rank_error),
        "grid": dict(grid),
        "approximate": False,
        "ci95": None,
        "accuracy": (f"with probability >= 95 % the released value has q*n +/- {rank_error:.4g} values "
                     "below it (n: the group's bounded values), plus the values within one grid step"),
    }
    if function in ("min", "max"):
        entry["estimate"] = (f"a DP {'minimum' if function == 'min' else 'maximum'} is an estimate: the "
                             f"{'0' if function == 'min' else '1'}-quantile of the clamped column, not the "
                             "true extreme")
    return ReleasedCell(Vector.of(np.asarray(values, dtype=np.float64)), None, entry, None)


def _number_vector(v: np.ndarray, integer: bool) -> Vector:
    """Float values as an int Vector when asked and exactly representable (|v| < 2^53), else float."""
    if integer and (v.size == 0 or float(np.max(np.abs(v))) < 2.0**53):
        return Vector(np.round(v).astype(np.int64), np.ones(len(v), dtype=bool), "int")
    return Vector.of(v)


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
        A :class:`ReleasedTable` (see the module docstring, part C, for each step).

    Raises:
        Internal: the inputs do not match the plan (missing primitive or key,
            vectors of different lengths, an ungrouped query with ≠ 1 row, a
            derived output on a column without bounds), or a HAVING the evaluator
            cannot evaluate.
    """
    # Non-finite intermediates cannot arise within the policy limits (dpgate.limits); should
    # one, it becomes a null cell or a null accuracy field (strict JSON), not a warning.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _finalize(plan, policy, keys, noisy, scales, halfwidths, mechanism, resolution_of)


def _finalize(plan, policy, keys, noisy, scales, halfwidths, mechanism, resolution_of) -> ReleasedTable:
    table = policy.table(plan.table)
    n = _row_count(plan, keys, noisy)
    res = resolution_of or (lambda c: plan.column_policy(table, c).resolution or 1.0)

    # Primitives in output units: values and noise.
    values: dict[str, np.ndarray] = {}
    prims: dict[str, PrimitiveNoise] = {}
    for p in plan.primitives:
        if p.id not in noisy or p.id not in scales or p.id not in halfwidths:
            raise Internal(f"post-processing is missing primitive {p.id!r}")
        kind = primitive_kind(p.kind)
        if p.kind == "quantile":  # quantiles hook: the noisy value is a candidate index
            values[p.id] = kind.finalise(noisy[p.id], table.column(p.column))
            continue
        unit = kind.output_unit(res(p.column) if p.column else None)
        values[p.id] = np.asarray(noisy[p.id]).astype(np.float64) * unit
        prims[p.id] = primitive_noise(mechanism, scales[p.id], halfwidths[p.id], unit)

    cells: dict[str, ReleasedCell] = {}
    for o in plan.outputs:
        if isinstance(o, DerivedOutput):
            continue  # below, once the cells it reads exist
        if isinstance(o, KeyOutput):
            if o.column not in keys:
                raise Internal(f"post-processing is missing the key column {o.column!r}")
            cells[o.name] = ReleasedCell(Vector.of(_objects(keys[o.column])))
            continue
        if o.function in ("quantile", "min", "max"):  # quantiles hook
            p = plan.primitive(o.primitives[0])
            cells[o.name] = quantile_cell(o.function, p.alpha, values[p.id], scales[p.id], halfwidths[p.id],
                                          grid_for(table.column(p.column)).describe(), mechanism)
            continue
        bounds = None
        if o.function in ("avg", "var_pop", "stddev_pop"):
            bounds = _bounds(table, o.column, plan)
        integer = digits = None
        if o.function == "sum":
            r = float(res(o.column))
            integer = plan.column_policy(table, o.column).type == "int" and r.is_integer()
            digits = _decimals(r)
        cells[o.name] = aggregate_cell(o.function, [(pid, values[pid]) for pid in o.primitives], prims,
                                       bounds=bounds, clamp_counts=policy.budget.clamp_counts,
                                       integer=bool(integer), digits=digits)

    # Select-list post-processing (SUM(x) * 1, ROUND(AVG(x), 1), 3 AS three): free, on the
    # released values; its accuracy propagated where that is honest (derived_cell).
    for o in plan.outputs:
        if isinstance(o, DerivedOutput):
            try:
                cells[o.name] = derived_cell(plan.derived_tree(o), cells, prims, rows=n)
            except ExpressionError as e:
                raise Internal(f"a select-list expression could not be evaluated: {e}") from None

    # Suppression (cells whose 95 % interval is wider than the policy allows).
    limit = policy.budget.suppress_ci95_above
    for c in cells.values():
        if c.accuracy is None or c.ci_rows is None:
            continue
        suppress = np.zeros(n, dtype=bool) if limit is None else c.ci_rows > float(limit)
        c.vector = Vector(c.vector.values, c.vector.valid & ~suppress, c.vector.type)
        c.accuracy["suppressed"] = int(suppress.sum())

    # HAVING, ORDER BY, LIMIT on the noisy values.
    vectors = {name: c.vector for name, c in cells.items()}
    order = np.arange(n, dtype=np.int64)
    if plan.having:
        try:
            keep = evaluate_predicate(plan.having_tree(), vectors, rows=n)
        except ExpressionError as e:
            raise Internal(f"HAVING could not be evaluated: {e}") from None
        order = order[keep]
    if plan.order_by:
        order = sort_rows([(cells[item.output].vector, item.descending, item.nulls_first)
                           for item in plan.order_by], order)
    order = limit_rows(order, plan.limit, plan.offset)

    visible = [o for o in plan.outputs if not o.hidden]
    columns = [cells[o.name].values_for(order) for o in visible]
    rows = [list(r) for r in zip(*columns)] if columns else []
    accuracy: dict[str, dict[str, Any]] = {}
    for o in visible:
        entry = cells[o.name].accuracy_for(order)
        if entry is not None:
            accuracy[o.name] = _finite_json(entry)
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
    return primitive_kind(kind).output_unit(resolution)


def _row_count(plan: QueryPlan, keys: Mapping[str, np.ndarray], noisy: Mapping[str, np.ndarray]) -> int:
    lengths = {len(v) for v in noisy.values()} | {len(v) for v in keys.values()}
    if len(lengths) > 1:
        raise Internal("post-processing got vectors of different lengths")
    n = lengths.pop() if lengths else 0
    if not plan.group_by and n != 1:
        raise Internal(f"an ungrouped query must have exactly one row, got {n}")
    return n


def _objects(values: np.ndarray) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind in "iufbM":
        return arr
    out = np.empty(len(values), dtype=object)
    out[:] = [v.item() if isinstance(v, np.generic) else v for v in np.asarray(values, dtype=object)]
    return out


def _bounds(table: TablePolicy, column: str | None, plan: QueryPlan) -> tuple[float, float]:
    col = plan.column_policy(table, column) if column else None
    if col is None or not col.bounded:
        raise Internal(f"column {column!r} has no bounds; AVG/VAR/STDDEV need them")
    return float(col.lower), float(col.upper)


def _ratio_box(s: np.ndarray, hs: float, c: np.ndarray, hc: float) -> tuple[np.ndarray, np.ndarray]:
    """Range of x/max(y, 1) over x ∈ [s − hs, s + hs], y ∈ [c − hc, c + hc] (elementwise)."""
    y_lo, y_hi = np.maximum(c - hc, 1.0), np.maximum(c + hc, 1.0)
    corners = np.stack([(s - hs) / y_lo, (s - hs) / y_hi, (s + hs) / y_lo, (s + hs) / y_hi])
    return corners.min(axis=0), corners.max(axis=0)


def _within(lo: np.ndarray, hi: np.ndarray, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """The interval ``[lo, hi]`` (per row) restricted to the range ``[a, b]`` of the true value.

    Where ``[lo, hi]`` meets ``[a, b]`` in more than a point, their intersection. Where it does
    not (it lies wholly outside, or touches ``[a, b]`` only at an end while having a width of
    its own), the parts' intervals have missed the truth — which always lies in ``[a, b]`` — and
    clipping would collapse the interval to one point, reading as an exact value: the whole
    range ``[a, b]`` is reported instead (issue 19 item 6). The coverage is unchanged: whenever
    the parts lie in their intervals ``[lo, hi]`` holds the truth and the intersection does too;
    otherwise ``[a, b]`` holds it.
    """
    clo, chi = np.clip(lo, a, b), np.clip(hi, a, b)
    failed = (hi < a) | (lo > b) | ((chi <= clo) & (hi > lo))
    return np.where(failed, a, clo), np.where(failed, b, chi)


def _square_range(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Range of x² for x ∈ [lo, hi] (elementwise)."""
    sq_lo = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(lo * lo, hi * hi))
    return sq_lo, np.maximum(lo * lo, hi * hi)


def _decimals(resolution: float) -> int | None:
    """Decimals of a power-of-ten resolution below 1 (to print 0.3, not 0.30000000000000004)."""
    if resolution >= 1 or resolution <= 0:
        return None
    exponent = math.log10(resolution)
    return -round(exponent) if abs(exponent - round(exponent)) < 1e-9 else None
