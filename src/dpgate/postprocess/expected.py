"""What an explained query will be: each noisy primitive with its sensitivity *in units*, and
each released output with its expected 95 % half-width, named as the analyst named it.

Read from :meth:`dpgate.service.Gateway.explain`'s document only (no data, no charge); the
console (:func:`dpgate.ui.data.explanation_view`) and ``dpgate explain`` show the same.

* **Sensitivities carry their unit.** The bounded query computes integers: a count in rows
  (or privacy units, or distinct values), a ``sum`` in integer steps of the column's
  ``resolution``, a ``sum_squares`` in steps of resolution². ``l1``/``l2`` are in those steps
  (what the noise is calibrated on); ``l1_value``/``l2_value`` multiply by the step
  (``noise_scale_units[p].unit``) to give the column's own units. A quantile's sensitivity is
  its score sensitivity (counts per candidate), with its rank scale and 95 % rank error.
* **Expected ± per output.** A count's or sum's half-width is the mechanism's exact 95 %
  half-width of its noise scale (:func:`dpgate.mechanisms.ci95_halfwidth`), times the step;
  a ``{"ci95": w}`` budget's ``accuracy_target`` gives each cell's bound (AVG/VAR/STDDEV at the
  stated ``expected_count``); otherwise AVG/VAR/STDDEV intervals depend on the noisy values
  and are known after the run; a quantile states its rank error instead of a value interval.
* **Compared with the bounds, before paying** (issue 22 item 6; data-independent: the policy's
  bounds, the budget and a stated group size n₀, ``reference_rows``: the budget's
  ``expected_count``, else :data:`DEFAULT_REFERENCE_ROWS`). Each output over a bounded column
  carries ``bounds`` ``{lower, upper, width}`` (W = upper − lower). A ``warnings`` entry is
  added when the noise would swamp the answer:

  - a count whose ± ≥ n₀ (a group of n₀ rows cannot be told from an empty one), or whose ±
    exceeds the policy's ``suppress_ci95_above`` (every cell would be suppressed);
  - a SUM whose ± exceeds n₀·W, the width of the range a sum over n₀ rows can take;
  - an AVG whose ± at n₀ rows exceeds W. With S, C the sum and count, t_S, t_C their
    97.5 % half-widths (:func:`dpgate.mechanisms.ci_halfwidth` at α = 0.025, so both hold
    with probability ≥ 95 % by the union bound) and M = max(|lower|, |upper|) (the sum is of
    the clamped raw values), a group of n > t_C rows has
    |(S + e_S)/(C + e_C) − S/C| = |e_S − (S/C)·e_C| / (n + e_C) ≤ (t_S + M·t_C)/(n − t_C),
    so the AVG's ± at n₀ is at most that, and it is within W once
    n ≥ t_C + (t_S + M·t_C)/W (``rows_for_ci95_within_width``). VAR/STDDEV are not checked.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from dpgate.errors import DpgateError, InvalidRequest
from dpgate.mechanisms import ci95_halfwidth, ci_halfwidth

__all__ = ["DEFAULT_REFERENCE_ROWS", "expected_accuracy", "sensitivity_unit"]

#: The group size n₀ (rows) at which explain compares each output's ± with its bounds when the
#: budget names no ``expected_count`` (module docstring).
DEFAULT_REFERENCE_ROWS = 100.0
_COUNTS = ("count", "count_column", "count_distinct_unit", "count_distinct")

_COUNT_UNITS = {"count": "rows", "count_column": "rows", "count_distinct_unit": "privacy units",
                "count_distinct": "distinct values"}


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def sensitivity_unit(kind: str, column: str | None, step: float | None) -> str:
    """The unit a primitive's sensitivity and noise scale are in, in words: ``rows``,
    ``privacy units``, ``steps of 1 (tokens)``, ``steps of 0.25 (latency²)``, ``counts per candidate``."""
    if kind in _COUNT_UNITS:
        return _COUNT_UNITS[kind]
    if kind == "quantile":
        return "counts per candidate (score)"
    square = "²" if kind == "sum_squares" else ""
    return f"steps of {step:g} ({column}{square})" if step is not None else f"steps ({column}{square})"


def _label(p: Mapping[str, Any]) -> str:
    kind, col = str(p.get("kind", "")), p.get("column")
    if kind == "quantile":
        return f"quantile({col}, {p.get('alpha')})"
    return f"{kind}({col or '*'})"


def expected_accuracy(explanation: Mapping[str, Any]) -> dict[str, Any]:
    """The primitives and outputs of an explained query (module docstring).

    Returns:
        ``{"primitives": [{id, kind, column, label, unit, l1, l2, l1_value, l2_value, scale,
        scale_value, ci95, rank_error95}], "outputs": [{name, label, function, ci95,
        approximate, note}]}``; numbers are None where they do not apply. ``ci95`` and the
        ``*_value`` figures are in the output's (column's) units, ``l1``/``l2``/``scale`` in
        the unit ``unit`` names.
    """
    if not explanation.get("plan") and isinstance(explanation.get("parts"), list):
        return _of_parts(explanation["parts"])
    plan = explanation.get("plan") or {}
    prims = {p.get("id"): p for p in plan.get("primitives", [])}
    sens = explanation.get("sensitivity") or explanation.get("sensitivities") or {}
    scales = explanation.get("noise_scales") or {}
    units = explanation.get("noise_scale_units") or {}
    quantiles = explanation.get("quantiles") or {}
    labels = explanation.get("labels") or {}
    mech = "laplace" if "laplace" in str(explanation.get("mechanism") or "") else "gaussian"
    primitives, ci_by_id = [], {}
    for pid, p in prims.items():
        kind, column = str(p.get("kind", "")), p.get("column")
        entry: dict[str, Any] = {"id": pid, "kind": kind, "column": column or "", "label": _label(p),
                                 "l1": None, "l2": None, "l1_value": None, "l2_value": None,
                                 "scale": _number(scales.get(pid)), "scale_value": None, "ci95": None,
                                 "rank_error95": None}
        if kind == "quantile":
            q = quantiles.get(pid) if isinstance(quantiles.get(pid), Mapping) else {}
            entry.update(unit=sensitivity_unit(kind, column, None), l1=_number(q.get("score_sensitivity")),
                         scale=_number(q.get("rank_scale", scales.get(pid))),
                         rank_error95=_number(q.get("rank_error95")))
            primitives.append(entry)
            continue
        step = _number((units.get(pid) or {}).get("unit"))
        step = 1.0 if step is None and kind in _COUNT_UNITS else step
        s = sens.get(pid) or {}
        l1, l2 = _number(s.get("l1")), _number(s.get("l2"))
        entry.update(unit=sensitivity_unit(kind, column, step), l1=l1, l2=l2)
        if step is not None:
            entry.update(l1_value=None if l1 is None else l1 * step, l2_value=None if l2 is None else l2 * step)
            if entry["scale"] is not None:
                entry["scale_value"] = entry["scale"] * step
                try:
                    entry["ci95"] = float(ci95_halfwidth(mech, entry["scale"])) * step
                except Exception:  # noqa: BLE001 - a display helper never fails the explanation
                    entry["ci95"] = None
        ci_by_id[pid] = entry["ci95"]
        primitives.append(entry)
    target = ((explanation.get("accuracy_target") or {}).get("cells") or {})
    outputs = []
    for o in plan.get("outputs", []):
        if o.get("hidden"):
            continue
        name = o.get("name")
        ids = list(o.get("primitives") or [])
        fn = o.get("function")
        out = {"name": name, "label": labels.get(name) or name, "function": fn, "ci95": None,
               "approximate": False, "note": ""}
        cell = target.get(out["label"], target.get(name))  # the target's cells are named as released
        cell = cell if isinstance(cell, Mapping) else None
        if "expression" in o:
            out["note"] = "computed from released values after the run (post-processing)"
        elif not ids and o.get("column") in (plan.get("selected_keys") or ()):
            out["note"] = ("group key chosen by private partition selection: only keys that enough units "
                           "share are released")
        elif not ids:
            out["note"] = "group key (public)"
        elif fn in ("quantile", "min", "max"):
            rank = primitives[[p["id"] for p in primitives].index(ids[0])]["rank_error95"] if ids[0] in prims else None
            out["note"] = ("a DP quantile: no value interval; its accuracy is a rank error of "
                           f"± {rank:.3g} ranks (95 %)" if rank is not None
                           else "a DP quantile: its accuracy is a rank error")
        elif cell is not None and _number(cell.get("ci95_at_most")) is not None:
            out["ci95"] = _number(cell.get("ci95_at_most"))
            out["approximate"] = fn not in ("count", "count_column", "count_distinct_unit", "count_distinct", "sum")
            out["note"] = str(cell.get("rule") or "")
        elif len(ids) == 1:
            out["ci95"] = ci_by_id.get(ids[0])
        else:
            kinds = " and ".join(str(prims.get(i, {}).get("kind", i)).replace("count_column", "count") for i in ids)
            out["note"] = f"derived from noisy {kinds}: ± known after the run"
        outputs.append(out)
    warnings = _bounds_checks(explanation, prims, primitives, outputs, plan, mech)
    return {"primitives": primitives, "outputs": outputs, "warnings": warnings,
            "reference_rows": _reference_rows(explanation)}


def _of_parts(parts: list[Any]) -> dict[str, Any]:
    """A UNION ALL's (issue 21 item 6): each part's primitives, outputs and warnings, marked with
    ``part`` (1-based); a warning's message starts with "part i: "."""
    out: dict[str, Any] = {"primitives": [], "outputs": [], "warnings": [], "reference_rows": DEFAULT_REFERENCE_ROWS}
    for i, part in enumerate(parts, start=1):
        acc = part.get("expected_accuracy") or expected_accuracy(part)
        out["primitives"] += [{**p, "part": i} for p in acc.get("primitives", [])]
        out["outputs"] += [{**o, "part": i} for o in acc.get("outputs", [])]
        out["warnings"] += [{**w, "part": i, "message": f"part {i}: {w.get('message', '')}"}
                            for w in acc.get("warnings", [])]
        out["reference_rows"] = acc.get("reference_rows", out["reference_rows"])
    return out


def _reference_rows(explanation: Mapping[str, Any]) -> float:
    ref = explanation.get("accuracy_reference") or {}
    return _number(ref.get("rows")) or DEFAULT_REFERENCE_ROWS


def _bounds_checks(explanation: Mapping[str, Any], prims: Mapping[Any, Any], primitives: list[dict[str, Any]],
                   outputs: list[dict[str, Any]], plan: Mapping[str, Any], mech: str) -> list[dict[str, Any]]:
    """Add ``bounds`` (and the AVG figures) to ``outputs``; return the warnings (module docstring)."""
    ref = explanation.get("accuracy_reference") or {}
    n0 = _reference_rows(explanation)
    suppress = _number(ref.get("suppress_ci95_above"))
    bounds_of = explanation.get("column_bounds") or {}
    by_id = {p["id"]: p for p in primitives}
    by_name = {o.get("name"): o for o in plan.get("outputs", [])}
    warnings: list[dict[str, Any]] = []

    def warn(out: Mapping[str, Any], code: str, message: str) -> None:
        warnings.append({"output": out["label"], "code": code, "message": message})

    def part_ci(pid: Any) -> float | None:  # 97.5 % half-width in output units
        p = by_id.get(pid) or {}
        scale, value = p.get("scale"), p.get("scale_value")
        if not scale or value is None:
            return None
        step = value / scale
        try:
            return float(ci_halfwidth(mech, scale, 0.025)) * step
        except Exception:  # noqa: BLE001 - a display helper never fails the explanation
            return None

    for out in outputs:
        o = by_name.get(out["name"]) or {}
        fn, ids = out.get("function"), list(o.get("primitives") or [])
        b = bounds_of.get(o.get("column")) if o.get("column") else None
        lo, hi = (_number(b.get("lower")), _number(b.get("upper"))) if isinstance(b, Mapping) else (None, None)
        width = None if lo is None or hi is None else hi - lo
        out["bounds"] = None if width is None else {"lower": lo, "upper": hi, "width": width}
        ci = out.get("ci95")
        if fn in _COUNTS and ci is not None:
            if suppress is not None and ci > suppress:
                warn(out, "suppressed", f"{out['label']}: the count's ± {ci:.4g} exceeds the policy's "
                     f"suppress_ci95_above ({suppress:g}): every cell would be suppressed")
            elif ci >= n0:
                warn(out, "count_ci95_above_reference", f"{out['label']}: the count's ± {ci:.4g} is at least "
                     f"{n0:g} rows: a group of {n0:g} rows cannot be told from an empty one at this budget")
        elif fn == "sum" and ci is not None and width is not None:
            out["range_at_reference_rows"] = n0 * width
            if ci > n0 * width:
                warn(out, "ci95_exceeds_bounds_width", f"{out['label']}: the sum's ± {ci:.4g} exceeds "
                     f"{n0:g} × the bounds' width {width:g} (the whole range of a sum over {n0:g} rows)")
        elif fn == "avg" and width is not None and len(ids) == 2:
            kinds = {str(prims.get(i, {}).get("kind")): i for i in ids}
            count_id = next((i for k, i in kinds.items() if k in _COUNTS), None)
            t_s, t_c = part_ci(kinds.get("sum")), part_ci(count_id)
            if t_s is None or t_c is None:
                continue
            m = max(abs(lo), abs(hi))
            at_n0 = (t_s + m * t_c) / (n0 - t_c) if n0 > t_c else math.inf
            out["ci95_at_reference_rows"] = at_n0
            out["rows_for_ci95_within_width"] = t_c + (t_s + m * t_c) / width if width > 0 else None
            if at_n0 > width > 0:  # bounds of zero width: the average is the bound, released exactly
                warn(out, "ci95_exceeds_bounds_width",
                     f"{out['label']}: the average's ± in a group of {n0:g} rows is up to "
                     f"{at_n0:.4g}, more than the bounds' width {width:g} ([{lo:g}, {hi:g}]); a group needs "
                     f"about {out['rows_for_ci95_within_width']:.4g} rows for a ± within it")
    return warnings


def check_reference_rows(reference_rows: Any) -> None:
    """Validate an explain request's ``reference_rows`` (None: the default).

    Raises:
        InvalidRequest: not a number of rows in (1, 1e15].
    """
    if reference_rows is not None and (isinstance(reference_rows, bool) or not isinstance(
            reference_rows, (int, float)) or not 1 < reference_rows <= 1e15):
        raise InvalidRequest("reference_rows must be a number of rows > 1 (and ≤ 1e15)",
                             {"field": "reference_rows"})


def accuracy_reference(policy: Any, reference_rows: float | None, expected_count: float | None) -> dict[str, Any]:
    """The group size (rows) each output's ± is compared with — ``reference_rows``, else the
    budget's ``expected_count``, else :data:`DEFAULT_REFERENCE_ROWS` — and the policy's
    ``suppress_ci95_above`` (data-independent)."""
    rows = reference_rows if reference_rows is not None else \
        expected_count if expected_count is not None else DEFAULT_REFERENCE_ROWS
    return {"rows": float(rows), "suppress_ci95_above": policy.budget.suppress_ci95_above}


def column_bounds(policy: Any, plan: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{column: {lower, upper}}`` of the bounded numeric columns the plan document's outputs
    read, from ``policy``: the policy the plan was compiled against, which declares its table (for
    a join, per-unit subquery or unit path, the source's view, :func:`dpgate.sql.sources.plan_policy`:
    a per-unit column's range is its per-unit range); empty when it does not declare the table
    (the document's table name is never parsed back into a source)."""
    out: dict[str, dict[str, float]] = {}
    try:
        name = str(plan.get("table"))
        table = policy.table(name)
    except DpgateError:
        return out
    for o in plan.get("outputs", []):
        col = table.find_column(o["column"]) if o.get("column") and hasattr(table, "find_column") else None
        if col is not None and col.bounded and col.type in ("int", "float"):
            out[o["column"]] = {"lower": float(col.lower), "upper": float(col.upper)}
    return out
