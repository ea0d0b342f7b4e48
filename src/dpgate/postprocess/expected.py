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
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from dpgate.mechanisms import ci95_halfwidth

__all__ = ["expected_accuracy", "sensitivity_unit"]

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
    return {"primitives": primitives, "outputs": outputs}
