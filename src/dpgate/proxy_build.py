"""``dpgate proxy build``: a synthetic proxy fitted from stored releases only (issue 23 item 3).

A proxy built from already-released DP values is post-processing (Dwork & Roth 2014, Prop. 2.1):
it reads the release store and the policy — never the protected data — and costs nothing.

**Method: independent one-way marginals.** For each protected table, every stored release of
``SELECT k, COUNT(*) … FROM t GROUP BY k`` (no WHERE, one declared key with public keys) gives
a noisy marginal of column ``k``; the newest one per column is used. Negative noisy counts are
set to 0. The synthetic table has ``rows`` rows (default: the mean of the marginals' totals) and
each marginal is laid out by largest-remainder apportionment, so every released marginal is
reproduced up to rounding. Columns are then interleaved by fixed strides coprime with the number
of rows (deterministic: no randomness is drawn), which makes them close to independent.

**What it preserves**: each released one-way count marginal of a column with public keys (as
released: noise included), and the row total. **What it does not**: any joint distribution or
correlation between columns (they are independent by construction), the number of rows per
unit (each synthetic row is its own unit), and columns without a released marginal — those get
a constant (the midpoint of numeric bounds, the lower date bound, ``False``) or, with public
keys, an even spread over the keys; free text columns get ``"synthetic"``. Use it for utility
trials and as a fallback whose answers are labelled ``dp: false``; do not read more into it.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from dpgate.errors import InvalidRequest
from dpgate.policy import DatasetPolicy, TablePolicy

__all__ = ["Marginal", "FittedTable", "fit_marginals", "synthesize", "write_proxy"]

#: Strides used to interleave the columns (primes; one is skipped when it divides the row count).
_STRIDES = (1, 7919, 104729, 1299709, 15485863, 179424673, 2038074743, 22801763489)


@dataclass(frozen=True)
class Marginal:
    """A released one-way count marginal: ``counts[key]`` from release ``release_id``."""

    column: str
    counts: Mapping[Any, float]
    release_id: str


@dataclass
class FittedTable:
    """What :func:`fit_marginals` found for one table."""

    table: str
    marginals: dict[str, Marginal] = field(default_factory=dict)


def _marginal_of(release: Any, policy: DatasetPolicy) -> tuple[str, str, Marginal] | None:
    """(table, column, marginal) when ``release`` is a one-key COUNT(*) over the whole table."""
    import dpgate.pipeline.planning  # noqa: F401 - installs the planner's table-less evaluator
    from dpgate.sql.parse import parse_query
    from dpgate.sql.plan import AggregateOutput, KeyOutput

    doc = release.document
    sql = doc.get("canonical_sql")
    if not sql or doc.get("source") == "proxy" or doc.get("exact") or doc.get("kind") == "selection":
        return None
    try:
        plan = parse_query(sql, policy)
    except Exception:  # noqa: BLE001 - a release of an older policy, a join …: not a marginal
        return None
    if plan.where is not None or len(plan.group_by) != 1 or plan.computed_keys or plan.selected_keys:
        return None
    if plan.having or plan.limit is not None or plan.offset:
        return None
    table = policy.tables.get(plan.table)
    if table is None or table.public:
        return None
    column = plan.group_by[0]
    col = table.find_column(column)
    if col is None or col.public_keys is None:
        return None
    visible = [o for o in plan.outputs if not o.hidden]
    key_i = next((i for i, o in enumerate(visible) if isinstance(o, KeyOutput)), None)
    count_i = next((i for i, o in enumerate(visible) if isinstance(o, AggregateOutput) and o.function == "count"),
                   None)
    if key_i is None or count_i is None:
        return None
    counts: dict[Any, float] = {}
    for row in doc.get("rows", []):
        value = row[count_i]
        counts[row[key_i]] = max(0.0, float(value)) if isinstance(value, (int, float)) else 0.0
    return plan.table, col.name, Marginal(col.name, counts, release.release_id)


def fit_marginals(policy: DatasetPolicy, releases: Iterable[Any]) -> dict[str, FittedTable]:
    """The newest released one-way count marginal per (protected table, column).

    Args:
        policy: the protected dataset's policy.
        releases: its stored releases, newest first (:meth:`ReleaseStore.list`).
    """
    out = {t.name: FittedTable(t.name) for t in policy.tables.values() if not t.public}
    for release in releases:
        found = _marginal_of(release, policy)
        if found is None:
            continue
        table, column, marginal = found
        out[table].marginals.setdefault(column, marginal)
    return out


def _apportion(weights: list[float], n: int) -> list[int]:
    """Largest-remainder apportionment of ``n`` items by ``weights`` (even when all are 0)."""
    total = sum(weights)
    if total <= 0:
        weights, total = [1.0] * len(weights), float(len(weights))
    quotas = [w * n / total for w in weights]
    counts = [math.floor(q) for q in quotas]
    rest = n - sum(counts)
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[:rest]:
        counts[i] += 1
    return counts


def _constant(col: Any) -> Any:
    if col.type in ("int", "float") and col.bounded:
        mid = (col.lower + col.upper) / 2
        return int(round(mid)) if col.type == "int" else mid
    if col.type in ("date", "timestamp") and col.time_lower is not None:
        return col.time_lower.isoformat()
    if col.type == "bool":
        return False
    if col.type in ("int", "float"):
        return 0
    return "synthetic"


def synthesize(table: TablePolicy, fitted: FittedTable, rows: int | None = None) -> tuple[list[str], list[list[Any]]]:
    """The synthetic rows of one table: ``(header, rows)``, the unit column first (``syn-<i>``).

    Raises:
        InvalidRequest: ``rows`` < 1.
    """
    if rows is None:
        totals = [sum(m.counts.values()) for m in fitted.marginals.values()]
        rows = max(1, int(round(sum(totals) / len(totals)))) if totals else 100
    if rows < 1:
        raise InvalidRequest("rows must be at least 1", {"field": "rows"})
    names = list(table.columns)
    unit = table.privacy_unit or "record_id"
    columns: dict[str, list[Any]] = {}
    strides = iter(s for s in _STRIDES if math.gcd(s, rows) == 1)
    for name in names:
        col = table.columns[name]
        marginal = fitted.marginals.get(name)
        if marginal is None and col.public_keys is None:
            columns[name] = [_constant(col)] * rows
            continue
        keys = list(col.public_keys) if marginal is None else list(marginal.counts)
        weights = [1.0] * len(keys) if marginal is None else [marginal.counts[k] for k in keys]
        laid: list[Any] = []
        for key, count in zip(keys, _apportion(weights, rows)):
            laid.extend([key] * count)
        stride = next(strides, 1)
        columns[name] = [laid[(i * stride) % rows] for i in range(rows)]
    header = [unit] + names
    body = [[f"syn-{i}"] + [columns[n][i] for n in names] for i in range(rows)]
    return header, body


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_proxy(policy: DatasetPolicy, releases: Iterable[Any], out_dir: Path, *, name: str | None = None,
                rows: int | None = None) -> dict[str, Any]:
    """Fit and write a proxy: ``out_dir/<name>/<table>.csv`` and the policy ``out_dir/<name>.toml``.

    The policy names the protected dataset's population and cap (a proxy is never charged),
    declares every table ``public = true`` with the protected columns' types and the unit as a
    text column, and states its provenance.

    Returns:
        ``{name, policy_file, tables: {table: {file, rows, marginals: {column: release_id}}},
        provenance, preserves, does_not_preserve}``.
    """
    name = name or f"{policy.name}_synthetic"
    fitted = fit_marginals(policy, releases)
    data_dir = Path(out_dir) / name
    data_dir.mkdir(parents=True, exist_ok=True)
    tables: dict[str, Any] = {}
    sources = sorted({m.release_id for f in fitted.values() for m in f.marginals.values()})
    provenance = (f"synthetic: independent one-way marginals fitted by dpgate proxy build from {len(sources)} stored "
                  f"DP release(s) of dataset {policy.name!r} (post-processing; preserves each released count "
                  "marginal, not the joint distribution)")
    budget = policy.budget
    lines = [
        "# Written by `dpgate proxy build`: a synthetic proxy fitted from stored releases only.",
        "[dataset]",
        f"name = {_toml(name)}",
        f"population = {_toml(policy.population)}",
        f"data_version = {_toml('proxy-build:' + ','.join(sources)[:200])}",
        f"provenance = {_toml(provenance)}",
        "",
        "[budget]  # the protected dataset's cap (a proxy is never charged: every table is public)",
        f"epsilon = {_toml(budget.epsilon)}",
        f"delta = {_toml(budget.delta)}",
        f"default_query_rho = {_toml(budget.default_query_rho)}",
        f"selection_delta = {_toml(budget.selection_delta)}",
        "",
    ]
    if policy.allocations:
        lines.append("[allocations]")
        lines += [f"{_toml(k)} = {_toml(v)}" for k, v in policy.allocations.items()]
        lines.append("")
    for table in policy.tables.values():
        if table.public:
            continue
        header, body = synthesize(table, fitted[table.name], rows)
        path = data_dir / f"{table.name}.csv"
        with path.open("w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(header)
            w.writerows(body)
        tables[table.name] = {"file": str(path), "rows": len(body),
                              "marginals": {c: m.release_id for c, m in fitted[table.name].marginals.items()}}
        lines += [f"[tables.{table.name}]", f"source = {_toml(path.resolve().as_posix())}", "public = true", "",
                  f"[tables.{table.name}.columns]", f"{header[0]} = {{ type = \"text\" }}"]
        lines += [f"{c} = {{ type = {_toml(col.type)} }}" for c, col in table.columns.items()]
        lines.append("")
    policy_file = Path(out_dir) / f"{name}.toml"
    policy_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"name": name, "policy_file": str(policy_file), "tables": tables, "provenance": provenance,
            "preserves": "each released one-way COUNT(*) marginal of a column with public keys (rounded), and the "
                         "row total",
            "does_not_preserve": "joint distributions and correlations between columns, rows per unit, and columns "
                                 "without a released marginal (constants or an even spread over public keys)"}
