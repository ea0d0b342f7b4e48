"""The documents of the pipeline: release documents (stored and served), explain documents, and
the identities they are stored under (split from :mod:`dpgate.service`, issue 20 step 6).

Each document is built here once, from the plan, the calibration and the receipt; the runners
(:mod:`dpgate.pipeline.runners`) only gather what goes in. Field names and their order are the
stored format (release keys and plan hashes are persisted): keep them byte-stable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, Mapping

import numpy as np

from dpgate import partition_selection
from dpgate.cohorts import release_guarantee
from dpgate.errors import Internal
from dpgate.policy import DatasetPolicy
from dpgate.postprocess import finalize, output_unit
from dpgate.postprocess.calibration import CellTarget, ci95_rules
from dpgate.postprocess.ranges import value_ranges
from dpgate.releases import NoisyPrimitives, Release, new_release_id, now
from dpgate.releases.keys import post_processing_settings
from dpgate.sql.plan import AggregateOutput, QueryPlan

#: What a keys-only release over public keys is (release note and explain message).
KEYS_ONLY_NOTE = ("keys only, all public: the release lists the policy's public key values (every "
                  "combination), not the keys present in the data; it reads no data and costs "
                  "nothing. Add COUNT(*) to learn which keys have rows")


def cell_targets(policy: DatasetPolicy, plan: QueryPlan) -> list[CellTarget]:
    """The aggregate outputs of ``plan`` as ``ci95`` targets (name, function, primitives, bounds)."""
    table = policy.table(plan.table)
    targets = []
    for o in plan.outputs:
        if isinstance(o, AggregateOutput):
            col = plan.column_policy(table, o.column) if o.column else None
            bounds = (float(col.lower), float(col.upper)) if col is not None and col.bounded else None
            targets.append(CellTarget(o.label or o.name, o.function, tuple(o.primitives), bounds))
    return targets


def primitive_unit(policy: DatasetPolicy, plan: QueryPlan, primitive_id: str) -> float:
    """Size of one integer unit of a primitive in output units (1 for counts)."""
    p = plan.primitive(primitive_id)
    table = policy.table(plan.table)
    return output_unit(p.kind, plan.column_policy(table, p.column).resolution if p.column else None)


def noise_scale_units(policy: DatasetPolicy, plan: QueryPlan, scales: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """What each ``noise_scales`` entry is measured in, and its size in the output's units.

    ``noise_scales`` holds the scale the sampler used, on the integer scale the
    bounded query computes (the σ of the discrete Gaussian, or the discrete Laplace
    scale b): for a count, in rows or units (= output units); for a ``sum``, in
    integer steps of the column's ``resolution``; for a ``sum_squares``, in steps of
    resolution²; for a quantile, the rank scale ``s_r`` in ranks. The ``accuracy``
    entries (``sigma``/``scale``, ``ci95``) are in the output's units. This document
    relates the two.

    Returns:
        primitive id → ``{"kind", "column", "in", "unit", "value_scale"}``: ``in`` says
        the unit in words, ``unit`` is the output units per integer step (1,
        resolution, resolution²; None for a quantile) and ``value_scale`` =
        scale × unit (None for a quantile: a rank scale has no value-scale figure).
    """
    out: dict[str, dict[str, Any]] = {}
    for pid, scale in scales.items():
        p = plan.primitive(pid)
        if p.kind == "quantile":
            out[pid] = {"kind": p.kind, "column": p.column, "in": "ranks (the quantile's rank scale)",
                        "unit": None, "value_scale": None}
            continue
        unit = primitive_unit(policy, plan, pid)
        if p.kind == "sum":
            words = f"integer steps of the resolution {unit:g}"
        elif p.kind == "sum_squares":
            words = f"integer steps of resolution² ({unit:g})"
        else:
            words = "rows or units counted (output units)"
        out[pid] = {"kind": p.kind, "column": p.column, "in": words, "unit": unit,
                    "value_scale": float(scale) * unit}
    return out


def primitive_sig(p) -> str:
    """A primitive's identity independent of its id: ``kind:column`` (``:alpha`` for quantiles)."""
    alpha = getattr(p, "alpha", None)
    return f"{p.kind}:{p.column or ''}" + (f":{alpha!r}" if alpha is not None else "")


def primitive_text(p) -> str:
    """A primitive as the analyst would read it: ``SUM(cost)``, ``SUM(cost²) (behind VAR/STDDEV)``, …"""
    col = p.column or "*"
    return {
        "count": "COUNT(*)",
        "count_column": f"COUNT({col})",
        "count_distinct_unit": "COUNT(DISTINCT <privacy unit>)",
        "count_distinct": f"COUNT(DISTINCT {col})",
        "sum": f"SUM({col})",
        "sum_squares": f"the sum of squares of {col} (behind VAR/STDDEV)",
        "quantile": f"the quantile of {col}",
    }.get(p.kind, f"the aggregate of {col}")


def noise_signature(plan: QueryPlan, *, cell_targets: bool = False) -> str:
    """SHA-256 of what a plan noises: table, filter, grouping, primitives, policy digest.

    Post-processing (outputs, their order and names, HAVING, ORDER BY, LIMIT) is
    left out: plans equal here are answered from the same noisy primitives. With
    ``cell_targets`` (a ``{"ci95": w}`` budget) the aggregate outputs enter too: the
    noise scales are then calibrated for those released cells (an AVG's sum gets less
    noise than a bare SUM's at the same ``w``), so noise calibrated for one set of
    outputs must not answer another.
    """
    body: dict[str, Any] = {
        "dataset": plan.dataset, "table": plan.table, "where": plan.where,
        "group_by": list(plan.group_by), "policy": getattr(plan, "policy_digest", ""),
        "primitives": sorted(primitive_sig(p) for p in plan.primitives),
    }
    if getattr(plan, "computed_keys", ()):  # what a computed key means is part of what is noised
        body["computed_keys"] = [dataclasses.asdict(k) for k in plan.computed_keys]
    if cell_targets:
        body["cells"] = sorted(f"{o.function}:{o.column or ''}" for o in plan.outputs if isinstance(o, AggregateOutput))
    payload = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return "noise:" + hashlib.sha256(payload.encode()).hexdigest()


def plain(v: Any) -> Any:
    """A JSON-ready cell of an exact public answer (NaN/±inf → None; dates as ISO text)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return v.isoformat() if hasattr(v, "isoformat") else str(v)


def array(values: list) -> np.ndarray:
    """A stored JSON list back as a NumPy vector (ints stay ints; text keys as objects)."""
    arr = np.asarray(values)
    return arr if arr.dtype.kind in "iufb" else np.asarray(values, dtype=object)


def relabel(accuracy: Mapping[str, Any], names: list[str], labels: list[str]) -> dict[str, Any]:
    """``accuracy`` (column name → entry) with each primitive column name replaced by its display label."""
    mapping = dict(zip(names, labels))
    return {mapping.get(k, k): v for k, v in accuracy.items()}


def rename(doc: dict[str, Any], display: list[str]) -> dict[str, Any]:
    """Serve a stored release under this request's output names (post-processing, free)."""
    old = doc.get("columns", [])
    if len(old) != len(display) or old == display:
        return doc
    mapping = dict(zip(old, display))
    doc["columns"] = list(display)
    if isinstance(doc.get("accuracy"), dict):
        doc["accuracy"] = {mapping.get(k, k): v for k, v in doc["accuracy"].items()}
    return doc


def labels(plan: QueryPlan) -> list[str]:
    """The analyst's names of the visible outputs, in order."""
    return [o.label or o.name for o in plan.outputs if not o.hidden]


def charge_document(receipt: Any) -> dict[str, Any] | None:
    """A release's ``charge`` entry from the ledger's receipt (None: nothing was charged): its id, ρ,
    ε at δ, consumer, selection δ, the ``filter`` that admitted it (``"renyi"``/``"gdp"``) and, for
    ``"gdp"``, the release's ``gdp_mu``."""
    if receipt is None:
        return None
    return {
        "charge_id": receipt.charge_id,
        "rho": receipt.rho,
        "epsilon_at_delta": receipt.epsilon_at_delta,
        "delta": receipt.delta,
        "consumer": receipt.consumer,
        **({"selection_delta": receipt.selection_delta} if getattr(receipt, "selection_delta", 0) else {}),
        # the filter that admitted it (issue 22 item 1): "renyi", or "gdp" with the release's μ
        **({"filter": receipt.filter} if getattr(receipt, "filter", None) is not None else {}),
        **({"gdp_mu": receipt.cost.gdp_bound} if getattr(receipt, "filter", None) == "gdp" else {}),
    }


def bounds_document(table_policy: Any) -> dict[str, Any]:
    """The contribution bounds and clamp bounds a release was computed under."""
    return {
        "privacy_unit": table_policy.privacy_unit,
        "max_groups_per_unit": table_policy.max_groups_per_unit,
        "max_rows_per_unit": table_policy.max_rows_per_unit,
        "columns": {
            c: {"lower": col.lower, "upper": col.upper, "resolution": col.resolution,
                **({"private": private_bounds_document(col)} if col.private_bounds is not None else {})}
            for c, col in table_policy.columns.items() if col.bounded
        },
        **({"private_truncation": private_truncation_document(table_policy.private_truncation)}
           if getattr(table_policy, "private_truncation", None) is not None else {}),
    }


def private_truncation_document(pt: Any) -> dict[str, Any]:
    """A ``max_rows_per_unit = { private = true, … }`` table's entry in a release's bounds (issue 22 item 4):
    the outer limit and, when the release's m is a DP choice, its release, cost and a note."""
    out = pt.to_dict()
    if pt.chosen_in is not None:
        cost = dict(pt.cost or {})
        what = f"ρ = {cost['rho']:.6g}" if "rho" in cost else f"ε = {cost.get('epsilon', 0.0):.6g}"
        out["note"] = f"max_rows_per_unit chosen privately at {what} in release {pt.chosen_in}"
    return out


def private_bounds_document(col: Any) -> dict[str, Any]:
    """A ``bounds = "private"`` column's entry in a release's bounds (issue 22 item 3): the outer range and,
    when the clamp is a stored DP estimate, ``"bounds [a, b], chosen privately at ρ = … in release R"``."""
    pb = col.private_bounds
    out = {"outer": list(pb.outer), "quantile": pb.quantile, "chosen_in": pb.chosen_in}
    if pb.chosen_in is None:
        out["note"] = f"clamped to the outer range [{pb.outer[0]:g}, {pb.outer[1]:g}] (no estimate applies)"
    else:
        what = ", ".join(f"{'ρ' if k == 'rho' else 'ε'} = {v:.6g}" for k, v in (pb.cost or {}).items())
        out.update(cost=dict(pb.cost or {}), note=f"bounds [{col.lower:g}, {col.upper:g}], chosen privately at "
                                                  f"{what} in release {pb.chosen_in}")
    return out


def enforced_cap(policy: DatasetPolicy, receipt: Any) -> dict[str, Any]:
    """The cap the ledger enforced when it charged (the policy file's when the receipt has none)."""
    return receipt.cap.public() if getattr(receipt, "cap", None) is not None \
        else {"epsilon": policy.budget.epsilon, "delta": policy.budget.delta}


def release_preamble(policy: DatasetPolicy, plan: QueryPlan, cal: Any, budget: Mapping[str, Any], *,
                     selecting: bool) -> dict[str, Any]:
    """The data-independent part of a noisy release's document, built **before the charge**.

    Everything here follows from the plan, the policy and the calibration (mechanism, noise
    scales, budget, bounds, value ranges, post-processing settings, the partition-selection
    composition), none of it from the data; it is built and checked as strict JSON before the
    ledger is charged, so that a document the release store cannot write fails for free instead
    of after the charge (the totality rule of issue 20: every check completes before
    ``ledger.charge``).

    Args:
        cal: the mechanism-side calibration (``mechanism``, ``scales``; the threshold's with
            ``selecting``). budget: the resolved budget's dict form.
        selecting: the plan selects keys privately (adds ``partition_selection``).

    Raises:
        Internal: a field is not strict JSON (a NaN, an infinity, a non-JSON object): a
            programming error, refused before anything is charged.
    """
    table_policy = policy.table(plan.table)
    preamble = {
        "mechanism": cal.mechanism,
        "noise_scales": dict(cal.scales),
        "noise_scale_units": noise_scale_units(policy, plan, cal.scales),
        "budget": dict(budget, **({"accuracy_target": ci95_rules(
            cell_targets(policy, plan), budget["ci95"], budget.get("expected_count"))}
            if "ci95" in budget else {})),
        "bounds": bounds_document(table_policy),
        # the range each aggregate's true value lies in, and whether the value is clamped to it
        # (issue 24: error bars clipped to the declared bounds, clamped values marked)
        "value_ranges": value_ranges(plan, policy),
        "post_processing": post_processing_settings(policy),
        **({"partition_selection": partition_selection.describe(plan, cal, budget["selection_delta"])}
           if selecting else {}),
    }
    check_json(preamble)
    return preamble


def check_json(document: Mapping[str, Any]) -> None:
    """Raise :class:`~dpgate.errors.Internal` unless ``document`` is strict JSON (what the release
    store writes: ``json.dumps(..., allow_nan=False)``)."""
    try:
        json.dumps(document, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise Internal(f"the release document is not JSON ({type(e).__name__}); nothing was charged") from None


def noisy_release(policy: DatasetPolicy, plan: QueryPlan, cal: Any, budget: Mapping[str, Any], receipt: Any,
                  key: str, version: str, keys: Mapping[str, Any], noisy: Mapping[str, Any],
                  halfwidths: Mapping[str, float], *, selecting: bool,
                  preamble: Mapping[str, Any] | None = None) -> Release:
    """The release of a noisy plan: its document and its noisy primitives (stored, never served).

    Args:
        cal: the mechanism-side calibration (``mechanism``, ``scales``; the threshold's with
            ``selecting``). budget: the resolved budget's dict form. receipt: the ledger's (None:
            an exact release, nothing charged). key: the noise cache key. version: the data version.
        keys, noisy, halfwidths: group keys, noisy integer values and 95 % half-widths per primitive.
        selecting: the plan selects keys privately (adds ``partition_selection``).
        preamble: :func:`release_preamble`'s document, built before the charge (None: built here).
    """
    sig = {p.id: primitive_sig(p) for p in plan.primitives}
    if preamble is None:
        preamble = release_preamble(policy, plan, cal, budget, selecting=selecting)
    table = finalize(plan, policy, keys, noisy, cal.scales, halfwidths, mechanism=cal.mechanism)
    table_policy = policy.table(plan.table)
    release_id, created = new_release_id(), now()
    document = {
        "release_id": release_id,
        "dataset": policy.name,
        "table": plan.table,
        "columns": labels(plan),
        "rows": [list(r) for r in table.rows],
        "accuracy": relabel(table.accuracy, list(table.columns), labels(plan)),
        "charge": charge_document(receipt),
        "cached": False,
        "data_version": version,
        "created_at": created,
        "plan_hash": plan.plan_hash,
        "canonical_sql": plan.canonical_sql,
        **preamble,
        # the published guarantee: the cap the ledger enforced when it charged this release
        "guarantee": {
            "population": policy.population,
            "privacy_unit": table_policy.privacy_unit or "record",
            "cap": enforced_cap(policy, receipt),
            **release_guarantee(policy, receipt),  # issue 23: renewal rule, cohorts drawn on
        },
    }
    # the noisy primitives themselves (DP outputs), so that queries differing only in
    # post-processing are answered from them for free; stored, never served
    primitives = NoisyPrimitives(
        keys={c: np.asarray(v).tolist() for c, v in keys.items()},
        values={sig[pid]: [int(x) for x in np.asarray(v).tolist()] for pid, v in noisy.items()},
        scales={sig[pid]: float(s) for pid, s in cal.scales.items()},
        halfwidths={sig[pid]: float(h) for pid, h in halfwidths.items()},
    )
    return Release(release_id, key, policy.name, plan.plan_hash, created, document, primitives)


def derived_release(hit: Release, policy: DatasetPolicy, plan: QueryPlan, key: str) -> Release:
    """A new release for ``plan`` from a stored release's noisy primitives, with the
    post-processing rules in force now (free: Dwork & Roth 2014 Prop. 2.1), pointing at the
    release it was derived from. ``hit.noisy`` must be set."""
    settings = post_processing_settings(policy)
    noisy = hit.noisy
    ids = {primitive_sig(p): p.id for p in plan.primitives}
    keys = {c: array(v) for c, v in noisy.keys.items()}
    values = {ids[s]: array(v) for s, v in noisy.values.items()}
    scales = {ids[s]: float(v) for s, v in noisy.scales.items()}
    halfwidths = {ids[s]: float(v) for s, v in noisy.halfwidths.items()}
    table = finalize(plan, policy, keys, values, scales, halfwidths, mechanism=hit.document["mechanism"])
    names = labels(plan)
    doc = dict(hit.document)
    release_id, created = new_release_id(), now()
    doc.update({
        "release_id": release_id,
        "columns": names,
        "rows": [list(r) for r in table.rows],
        "accuracy": relabel(table.accuracy, list(table.columns), names),
        "created_at": created,
        "plan_hash": plan.plan_hash,
        "canonical_sql": plan.canonical_sql,
        "noise_scales": scales,
        "noise_scale_units": noise_scale_units(policy, plan, scales),
        "post_processing": settings,
        "derived_from": hit.release_id,
    })
    return Release(release_id, key, policy.name, plan.plan_hash, created, doc, noisy)


def free_release(policy: DatasetPolicy, plan: QueryPlan, rows: list[list[Any]], version: str, *,
                 key_prefix: str, extra: Mapping[str, Any]) -> Release:
    """An exact release that costs nothing (public data or public keys only), to store.

    ``version`` is the data version read before the rows were; ``extra`` adds the kind's own
    fields (``public`` or ``public_keys_only``, and a ``note``).
    """
    release_id, created = new_release_id(), now()
    document = {
        "release_id": release_id,
        "dataset": policy.name,
        "table": plan.table,
        "columns": [o.label or o.name for o in plan.visible_outputs],
        "rows": rows,
        "accuracy": {},
        "charge": None,
        "cached": False,
        "exact": True,
        **extra,
        "data_version": version,
        "created_at": created,
        "plan_hash": plan.plan_hash,
        "canonical_sql": plan.canonical_sql,
        "mechanism": None,
        "noise_scales": {},
        "budget": None,
        "guarantee": {"population": policy.population, "public_data": True},
    }
    key = f"{key_prefix}:{plan.plan_hash}:{version}:{release_id}"
    return Release(release_id, key, policy.name, plan.plan_hash, created, document, None)


def free_explain(dataset: str, plan: QueryPlan, shown: Mapping[str, Any], *, public: bool,
                 exact_sql: Any) -> dict[str, Any]:
    """Explain's document of a free release (public tables only, or public keys only)."""
    kind = {"public": True} if public else {"public_keys_only": True}
    message = ("reads public tables only: answered exactly, no charge" if public else KEYS_ONLY_NOTE)
    return {"dataset": dataset, "canonical_sql": plan.canonical_sql, "plan_hash": plan.plan_hash, **shown,
            "plan": plan.canonical_dict(), **kind, "exact_sql": exact_sql,
            "bounded_sql": None, "sensitivity": {}, "mechanism": None, "noise_scales": {},
            "budget": None, "cost": {"rho": 0.0, "epsilon": 0.0, "epsilon_at_delta": 0.0, "fits": True,
                                     "message": message}}
