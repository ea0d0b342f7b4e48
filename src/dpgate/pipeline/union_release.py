"""The budget split and the release document of a ``UNION ALL`` (issue 21 item 6; the runner is
:class:`dpgate.pipeline.runners.UnionAllRunner`).

Budget: the analyst's budget is for the whole release. A ρ (or Gaussian ε, turned into ρ by the
ledger's one conversion) or a Laplace pure ε is split over the parts in proportion to their
primitives (each primitive of the union gets an equal share); a ``ci95`` target applies to every
released cell, so each part is calibrated to it as a standalone query. The parts compose
sequentially: the charge is the sum of the parts' costs (zCDP ρ adds, Bun & Steinke 2016
Lemma 2.3; pure ε adds, Dwork & Roth 2014 Thm. 3.16).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Mapping, Sequence

from dpgate.pipeline.budget import QueryBudget, ResolvedBudget
from dpgate.releases import Release
from dpgate.sql.plan import QueryPlan

__all__ = ["COMPOSITION_NOTE", "noise_signature", "part_budgets", "served", "split_description", "union_document"]

#: What explain and the release say about the composition of the parts.
COMPOSITION_NOTE = (
    "parts compose sequentially: the charge is the sum of the parts' costs (zCDP ρ adds), even when "
    "their rows are disjoint; parallel composition would need the parts to partition the privacy "
    "units, which the planner cannot prove from WHERE in general")


def _shares(amount: float, plans: Sequence[QueryPlan]) -> list[float]:
    """``amount`` split in proportion to the parts' primitives, rounded so that the shares added
    left to right (as the parts' costs are) never exceed ``amount`` (a trial saw 32 parts of
    ρ = 0.0005 charge 0.0005000000000000003, so a request for exactly what was left could fail)."""
    counts = [len(p.primitives) for p in plans]
    total = sum(counts)
    shares = [amount * c / total for c in counts]
    for _ in range(256):
        added = 0.0
        for x in shares:
            added += x
        if added <= amount:
            break
        i = max(range(len(shares)), key=shares.__getitem__)
        shares[i] = math.nextafter(shares[i], 0.0)
    return shares


def part_budgets(whole: ResolvedBudget, mechanism: str, plans: Sequence[QueryPlan]) -> list[QueryBudget]:
    """Each part's standalone budget (module docstring): ``ci95`` as it is; a Laplace ε split as ε;
    everything else as ρ (``whole.zcdp_rho()``), in proportion to the parts' primitives."""
    if whole.is_ci95:
        return [QueryBudget(ci95=whole.ci95, expected_count=whole.expected_count) for _ in plans]
    if mechanism == "laplace" and whole.epsilon is not None:
        return [QueryBudget(epsilon=e) for e in _shares(whole.epsilon, plans)]
    return [QueryBudget(rho=r) for r in _shares(whole.zcdp_rho(), plans)]


def split_description(whole: ResolvedBudget, budgets: Sequence[QueryBudget]) -> dict[str, Any]:
    """Explain's ``budget_split``: the rule and each part's budget."""
    rule = ("ci95 applies to every released cell: each part is calibrated to it" if whole.is_ci95 else
            "the budget is for the whole release, split over the parts in proportion to their primitives")
    return {"rule": rule, "parts": [{k: v for k, v in vars(b).items() if v is not None} for b in budgets]}


def noise_signature(signatures: Sequence[str], plan_hash: str) -> str:
    """The union's noise signature: SHA-256 over its parts' noise signatures, in order, and the
    union's plan hash.

    A flat query found under its noise key is post-processed again for the new request; a union
    stores only its released rows (not its parts' noisy primitives), so it cannot be. The plan hash
    (every part's outputs in order, HAVING, ORDER BY, LIMIT — not the labels) is therefore part of
    the noise key: a union that differs in any of them is a new release with its own charge, never
    the stored rows of another (which a trial found served as-is, HAVING and column order ignored).
    """
    body = "\n".join(signatures) + "\n" + plan_hash
    return "union-noise:" + hashlib.sha256(body.encode()).hexdigest()


def _merge_accuracy(columns: Sequence[str], docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-column accuracy over the concatenated rows: per-row lists concatenated; a number that
    differs between parts is the largest (conservative); other differing values from the first part.
    Each part's own accuracy stays in ``parts``."""
    out: dict[str, Any] = {}
    for c in columns:
        entries = [(d.get("accuracy") or {}).get(c) for d in docs]  # under the union's names
        if all(e is None for e in entries):
            continue
        merged: dict[str, Any] = {}
        for e, d in zip(entries, docs):
            rows = len(d["rows"])
            for k, v in (e or {}).items():
                if isinstance(v, list):
                    merged.setdefault(k, [])
                    merged[k].extend(v)
                elif k not in merged:
                    merged[k] = v
                elif isinstance(v, (int, float)) and isinstance(merged[k], (int, float)) \
                        and not isinstance(v, bool):
                    merged[k] = max(merged[k], v)
            for k in merged:  # a part without this per-row entry: None for its rows
                if isinstance(merged[k], list) and not isinstance((e or {}).get(k), list):
                    merged[k].extend([None] * rows)
        out[c] = merged
    return out


def _by_position(doc: Mapping[str, Any], columns: Sequence[str] | None = None) -> dict[str, Any]:
    """A part's accuracy under the union's column names (the first part's), column by column: a
    part's own labels (``COUNT(*)``) name nothing in the union."""
    names = list(columns) if columns is not None else None
    own = doc.get("accuracy") or {}
    if names is None:
        return own
    return {names[j]: own[c] for j, c in enumerate(doc["columns"]) if c in own and j < len(names)}


_PART_FIELDS = ("table", "plan_hash", "canonical_sql", "mechanism", "noise_scales", "noise_scale_units", "budget",
                "bounds", "value_ranges", "accuracy")


def union_document(part_releases: Sequence[Release], *, plan_hash: str, budget: Mapping[str, Any],
                   key: str) -> Release:
    """The union's release from its parts' releases (each made by
    :func:`dpgate.pipeline.documents.noisy_release` with the one receipt): the first part's columns,
    the parts' rows in order, the merged accuracy, and ``parts`` (each part's plan, budget, noise
    and accuracy). The noisy primitives are not kept (a repeat of the same union is served as stored)."""
    first = part_releases[0].document
    columns = list(first["columns"])
    docs = [{**r.document, "accuracy": _by_position(r.document, columns)} for r in part_releases]
    document = {
        **{k: first[k] for k in ("release_id", "dataset", "charge", "cached", "data_version", "created_at",
                                 "mechanism", "post_processing", "guarantee") if k in first},
        "table": first["table"],
        "tables": list(dict.fromkeys(d["table"] for d in docs)),
        "columns": columns,
        "rows": [list(r) for d in docs for r in d["rows"]],
        "accuracy": _merge_accuracy(columns, docs),
        "plan_hash": plan_hash,
        "canonical_sql": "\nUNION ALL\n".join(d["canonical_sql"] for d in docs),
        # each part's scales, named "part<i>.<id>" as explain names them (the parts' ids repeat)
        "noise_scales": {f"part{i + 1}.{k}": v for i, d in enumerate(docs) for k, v in (d.get("noise_scales") or {}).items()},
        "budget": dict(budget),
        "union_all": True,
        "composition": {"rule": "sequential", "note": COMPOSITION_NOTE},
        "parts": [{"part": i + 1, "rows": len(d["rows"]), **{k: d[k] for k in _PART_FIELDS if k in d}}
                  for i, d in enumerate(docs)],
    }
    head = part_releases[0]
    return Release(head.release_id, key, head.dataset, plan_hash, head.created_at, document, None)


def served(doc: dict[str, Any], display: Sequence[str]) -> dict[str, Any]:
    """A stored union release under this request's column names (the first part's labels; labels
    are not in the plan hash, so a union that differs only in them is the same release)."""
    old = list(doc.get("columns", []))
    if len(old) != len(display) or old == list(display):
        return doc
    mapping = dict(zip(old, display))
    doc["columns"] = list(display)
    doc["accuracy"] = {mapping.get(k, k): v for k, v in (doc.get("accuracy") or {}).items()}
    doc["parts"] = [{**p, "accuracy": {mapping.get(k, k): v for k, v in (p.get("accuracy") or {}).items()}}
                    for p in doc.get("parts", [])]
    return doc
