"""Proxy answers when the budget runs out, and utility trials before spending (issue 23 items 3, 6).

A dataset may name a **proxy** (``[dataset] proxy = "usage_synthetic"``): a dataset with the
same schema whose policy declares a ``provenance`` — ``"public"`` or ``"synthetic: how it was
made"`` — and whose tables are all ``public = true`` (nothing in it needs protection; a synthetic
proxy fitted only from DP releases is post-processing, :mod:`dpgate.proxy_build`).

* **Fallback** (:func:`fallback_answer`): when a query is refused for budget
  (``budget_exhausted``) and the request allows it (``"fallback": "proxy"``; or the policy's
  ``proxy_default_for`` names the consumer and the request does not say ``"none"``), the gateway
  answers *the same plan* on the proxy: the same bounded query (contribution bounds, clamps,
  public keys, the same rewrite) rendered against the proxy's tables, without noise. The answer
  is exact with respect to the proxy, free (nothing is charged), labelled ``"source": "proxy"``,
  ``"dp": false`` (not a DP release of the protected data), with the proxy's provenance and the
  refusal it stands in for, and it is **never stored**: not in the release store, not in the
  release cache, so it is never served as a DP release (its ``release_id`` starts with
  ``proxy:`` and cannot be fetched).
* **Trial** (:func:`trial`): explain can run the plan on the proxy (free) and show what the
  answer would look like together with the ± (95 % half-width) each cell would carry at the
  requested budget — the calibrated noise scales, before anything is spent.

Joins and per-unit subqueries are answered too: their bounded query reads the declared tables
they are built from, each replaced by the proxy's table of the same name.

Not answered from a proxy (the original refusal is raised): quantile queries and keys-only
selection (``ORDER BY … LIMIT k``) queries, whose exact counterparts are different algorithms,
and queries over tables the proxy lacks.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import numpy as np
from sqlglot import exp

from dpgate.errors import BudgetExhausted, DpgateError, ExecutionError, InvalidRequest
from dpgate.policy import DatasetPolicy
from dpgate.postprocess import finalize
from dpgate.releases import now

__all__ = ["FALLBACKS", "check_fallback", "wants_proxy", "run_on_proxy", "fallback_answer", "trial"]

#: What a request's ``fallback`` may say.
FALLBACKS: tuple[str, ...] = ("proxy", "none")


def check_fallback(policy: DatasetPolicy, fallback: str | None) -> None:
    """Validate a request's ``fallback`` before anything runs.

    Raises:
        InvalidRequest: not one of :data:`FALLBACKS`, or ``"proxy"`` for a dataset without a proxy.
    """
    if fallback is None:
        return
    if fallback not in FALLBACKS:
        raise InvalidRequest(f"fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}", {"field": "fallback"})
    if fallback == "proxy" and getattr(policy, "proxy", None) is None:
        raise InvalidRequest(f"dataset {policy.name!r} names no proxy ([dataset] proxy in its policy), so a refused "
                             "query cannot fall back to one", {"field": "fallback", "dataset": policy.name})


def wants_proxy(policy: DatasetPolicy, consumer: str | None, fallback: str | None) -> bool:
    """True when a refusal should be answered from the proxy (see the module docstring)."""
    if getattr(policy, "proxy", None) is None or fallback == "none":
        return False
    return fallback == "proxy" or (consumer is not None and consumer in policy.proxy_default_for)


def _proxy_tree(gateway: Any, policy: DatasetPolicy, plan: Any) -> exp.Expression:
    """The plan's bounded query over the proxy's tables (a fresh CSPRNG salt: the proxy is public).

    Raises:
        UnsupportedQuery / ExecutionError: the plan cannot run on the proxy.
    """
    from dpgate.engines.base import relations, replace_relations
    from dpgate.sql.bound import bounded_query

    proxy = gateway.policy(policy.proxy)
    tree = bounded_query(plan, policy, salt=secrets.randbits(63))  # a fresh tree, marked
    mapping = {}
    for ds, table in relations(tree):
        if ds.casefold() != policy.name.casefold():
            continue
        if table not in proxy.tables:
            raise ExecutionError(f"proxy {proxy.name!r} has no table {table!r}", {"proxy": proxy.name})
        mapping[(ds, table)] = (lambda t=table: exp.table_(t, db=proxy.name, quoted=True))
    return replace_relations(tree, mapping)


def run_on_proxy(gateway: Any, policy: DatasetPolicy, plan: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The plan's exact bounded values on the proxy: ``(keys, values)`` by group key and primitive id.

    Raises:
        ExecutionError: the plan reads a table the proxy lacks, or is a kind the proxy does not answer
            (quantiles); the engine's errors.
    """
    from dpgate.quantile_release import has_quantiles

    if has_quantiles(plan):
        raise ExecutionError("quantile queries are not answered from a proxy", {"proxy": policy.proxy})
    values = gateway.engine.execute(_proxy_tree(gateway, policy, plan))
    keys = {k: values[k] for k in plan.group_by}
    exact = {p.id: np.asarray(values[p.id]) for p in plan.primitives}
    return keys, exact


def _labels(plan: Any) -> list[str]:
    return [o.label or o.name for o in plan.outputs if not o.hidden]


def _relabel(accuracy: dict[str, Any], columns: list[str], labels: list[str]) -> dict[str, Any]:
    names = dict(zip(columns, labels))
    return {names.get(k, k): v for k, v in accuracy.items()}


def _json(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def fallback_answer(gateway: Any, dataset: str, sql: str, *, consumer: str | None, dialect: str | None,
                    fallback: str | None, refusal: BudgetExhausted) -> dict[str, Any] | None:
    """The proxy's answer standing in for ``refusal``, or None when the request does not fall back.

    Returns:
        ``{release_id: "proxy:…", source: "proxy", dp: false, exact: true, stored: false, dataset, proxy
        {dataset, provenance}, columns, rows, accuracy: {}, charge: None, cached: false, refused {code,
        message, details}, created_at, plan_hash, canonical_sql, note}``.

    Raises:
        BudgetExhausted: the original refusal, with ``details.proxy`` saying why the proxy could not
            answer (a quantile or selection query, a table the proxy lacks).
    """
    policy = gateway.policy(dataset)
    if not wants_proxy(policy, consumer, fallback):
        return None
    proxy = gateway.policy(policy.proxy)
    from dpgate.pipeline.strategy import TopK, UnionAll

    # the policy the plan reads: a joined or per-unit subquery's virtual table is in it, not in ``policy``
    read, plan, strategy = gateway.compile(dataset, sql, dialect)
    try:
        if isinstance(strategy, TopK):
            raise ExecutionError("keys-only selection queries (ORDER BY … LIMIT k) are not answered from a proxy")
        if isinstance(strategy, UnionAll):
            raise ExecutionError("a UNION ALL is not answered from a proxy yet: send its parts one by one")
        keys, exact = run_on_proxy(gateway, read, plan)
        zero = {p.id: 0.0 for p in plan.primitives}
        table = finalize(plan, read, keys, exact, zero, zero, mechanism="discrete_gaussian")
    except DpgateError as exc:
        refusal.details["proxy"] = {"dataset": proxy.name, "answered": False, "reason": exc.message}
        raise refusal from None
    labels = _labels(plan)
    return {
        "release_id": "proxy:" + secrets.token_hex(12),
        "source": "proxy",
        "dp": False,
        "exact": True,
        "stored": False,
        "dataset": dataset,
        "proxy": {"dataset": proxy.name, "provenance": proxy.provenance},
        "columns": labels,
        "rows": [[_json(v) for v in r] for r in table.rows],
        "accuracy": {},
        "charge": None,
        "cached": False,
        "data_version": None,
        "created_at": now(),
        "plan_hash": plan.plan_hash,
        "canonical_sql": plan.canonical_sql,
        "refused": {"code": refusal.code, "message": refusal.message, "details": refusal.details},
        "note": (f"the budget refused this query on {dataset!r}; this is the same plan answered exactly on the proxy "
                 f"{proxy.name!r} ({proxy.provenance}). It is not a differentially private release of the protected "
                 "data (dp = false), cost nothing, and is not stored"),
        "guarantee": {"population": policy.population, "dp": False, "source": "proxy"},
    }


def trial(gateway: Any, policy: DatasetPolicy, plan: Any, cal: Any) -> dict[str, Any]:
    """A utility trial: the plan on the proxy (free) with each cell's ± at the calibrated budget.

    Args:
        cal: the query's calibration (noise scales per primitive, mechanism).

    Returns:
        ``{source: "proxy", dp: false, proxy {dataset, provenance}, columns, rows, accuracy, note}`` — the
        rows are exact on the proxy; ``accuracy`` is what the DP release would state (95 % half-widths
        at the requested budget, same suppression rules).

    Raises:
        InvalidRequest: the dataset names no proxy, or the plan is a kind the proxy does not answer.
    """
    from dpgate.mechanisms import ci95_halfwidth

    if getattr(policy, "proxy", None) is None:
        raise InvalidRequest(f"dataset {policy.name!r} names no proxy ([dataset] proxy), so a trial has nothing to "
                             "run on", {"field": "trial"})
    proxy = gateway.policy(policy.proxy)
    try:
        keys, exact = run_on_proxy(gateway, policy, plan)
    except ExecutionError as exc:
        raise InvalidRequest(f"no trial on the proxy: {exc.message}", {"field": "trial"}) from None
    scales = dict(getattr(cal, "scales", {}) or {})
    halfwidths = {pid: ci95_halfwidth(cal.mechanism, s) for pid, s in scales.items()}
    table = finalize(plan, policy, keys, exact, scales, halfwidths, mechanism=cal.mechanism)
    labels = _labels(plan)
    return {
        "source": "proxy",
        "dp": False,
        "proxy": {"dataset": proxy.name, "provenance": proxy.provenance},
        "columns": labels,
        "rows": [[_json(v) for v in r] for r in table.rows],
        "accuracy": _relabel(dict(table.accuracy), list(table.columns), labels),
        "note": ("what the answer would look like: exact values of the same plan on the proxy, with the ± (95 % "
                 "half-width) each cell of the DP release would carry at the requested budget. Free: nothing was "
                 "charged and the protected data was not read"),
    }
