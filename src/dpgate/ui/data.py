"""What the pages show, computed from the gateway's JSON-ready documents (no HTTP, no HTML).

* :func:`populations_overview` — each population's cap, spend and allocations,
  the datasets (and privacy units) that spend it, and policy drift warnings;
* :class:`BurndownCache` — each population's cumulative spend over time, kept
  up to date incrementally from the ledger (only charges newer than the last
  one seen are read: :meth:`dpgate.ledger.browse.LedgerBrowsing.spend_series`);
* :func:`release_view` — a stored release as table rows with their 95 %
  half-widths and as charts;
* :func:`explanation_view` — an explained query: cost, whether it fits what is
  left, and the expected ± of each noisy output.

Numbers pass through unchanged: the pages format them, they never recompute a
privacy quantity the gateway reported (the burn-down's ε axis labels use the ledger's one
conversion, :func:`dpgate.ledger.caps.ledger_epsilon`, of the ρ shown at the cap's δ less its
selection δ: the cap's ρ is labelled with the cap's ε).
"""

from __future__ import annotations

import math
import re
import threading
import time
import zlib
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from markupsafe import Markup

from dpgate.ledger.caps import ledger_epsilon
from dpgate.ledger.entries import event_cap, event_old_cap
from dpgate.postprocess.expected import expected_accuracy
from dpgate.ui.charts import Series, bar_chart, burndown_chart, clip_text, date_ticks, fmt_number, line_chart, meter

__all__ = [
    "BurndownCache",
    "cap_text",
    "drift_warning",
    "governance_change",
    "explanation_view",
    "populations_overview",
    "release_view",
]

#: Most points drawn per burn-down line (more charges are sampled at this many instants).
BURNDOWN_POINTS = 320
#: Most bars or line points drawn in one release chart (the table has every row).
MAX_CHART_POINTS = 120
#: Most lines in one release chart (more: the chart shows the first ones, the table all).
MAX_CHART_SERIES = 8


def _number(v: Any) -> float | None:
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        v = float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text).timestamp()


def _epochs(texts: Sequence[str]) -> np.ndarray:
    """Epoch seconds of the ledger's ``created_at`` texts (UTC, ``…Z``), vectorised."""
    try:
        if all(t.endswith("Z") for t in texts):
            stamps = np.array([t[:-1] for t in texts], dtype="datetime64[us]")
            return stamps.astype(np.int64).astype(float) / 1e6
    except ValueError:
        pass
    return np.fromiter((_epoch(t) for t in texts), float, len(texts))


# ------------------------------------------------------------------------------- admin


def _unit_label(table: Mapping[str, Any]) -> str:
    """What protects a table's rows: its privacy unit column, the path to it (issue 21:
    ``o_custkey via l_orderkey -> orders.o_orderkey``), or ``record`` (each row)."""
    path = table.get("unit_path")
    if path:
        return f"{path[-1]} via {', '.join(path[:-1])}"
    return str(table.get("privacy_unit") or "record")


def populations_overview(gateway: Any) -> list[dict[str, Any]]:
    """Every population of the ledger with its spend report, datasets and warnings.

    Each item: ``name``, ``report`` (:meth:`SpendReport.to_dict`: cap, spent,
    remaining in ρ and ε, consumers), ``consumers`` (rows with a
    ``fraction`` of the allocation spent and a ``meter``), ``datasets`` (names
    with their tables' privacy units), ``units`` (distinct privacy units),
    ``alpha_cap`` (when the ledger reports one) and ``drift`` (one sentence per
    dataset whose policy file disagrees with the ledger, when the gateway
    reports ``policy_drift``).
    """
    datasets = gateway.datasets()
    by_population: dict[str, list[dict[str, Any]]] = {}
    for d in datasets:
        by_population.setdefault(d["population"], []).append(d)
    out = []
    for name in gateway.ledger.populations():
        report = gateway.ledger.spend(name).to_dict()
        consumers = []
        for cname, c in sorted(report.get("consumers", {}).items()):
            cap_rho, spent = _number(c.get("cap_rho")), _number(c.get("spent_rho")) or 0.0
            frac = spent / cap_rho if cap_rho else None
            consumers.append({**c, "name": cname, "fraction": frac,
                              "meter": meter(spent, cap_rho or 0.0, label=f"{cname} spent of its allocation")})
        cap = report.get("cap", {})
        total_frac = None
        if _number(cap.get("rho")):
            total_frac = (_number(report.get("spent", {}).get("rho")) or 0.0) / _number(cap.get("rho"))  # type: ignore[operator]
        units = sorted({_unit_label(t) for d in by_population.get(name, [])
                        for t in d.get("tables", {}).values() if not t.get("public")})
        drift = [w for d in by_population.get(name, []) if (w := drift_warning(d)) is not None]
        alpha_cap = cap.get("alpha_cap", report.get("alpha_cap"))
        out.append({
            "name": name,
            "report": report,
            "consumers": consumers,
            "fraction": total_frac,
            "meter": meter((_number(report.get("spent", {}).get("rho")) or 0.0), _number(cap.get("rho")) or 0.0,
                           label=f"{name} spent of its cap"),
            "datasets": [{"name": d["name"], "units": sorted({_unit_label(t) for t in d.get("tables", {}).values()
                                                               if not t.get("public")})}
                         for d in by_population.get(name, [])],
            "units": units,
            "alpha_cap": alpha_cap,
            "drift": drift,
        })
    return out


def drift_warning(dataset: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{"dataset", "message", "differences"}`` when the dataset's ``policy_drift`` has something
    to say (its policy file differs from the ledger's cap or allocations, or the cap needs
    re-fixing), else None. Accepts the gateway's report dict (``drifted``, ``differences``,
    ``message``) or any other truthy value (shown as text); absent: None."""
    info = dataset.get("policy_drift")
    if not info:
        return None
    if isinstance(info, Mapping):
        differences = [str(x) for x in info.get("differences") or []]
        message = str(info.get("message") or "")
        if not info.get("drifted") and not message:
            return None
        return {"dataset": dataset.get("name", ""), "message": message or "; ".join(differences),
                "differences": differences}
    return {"dataset": dataset.get("name", ""), "message": str(info), "differences": []}


@dataclass
class _Track:
    """Charge times (epoch seconds) and the cumulative ρ after each, in ``seq`` order."""

    times: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cum: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def extend(self, times: np.ndarray, rhos: np.ndarray) -> None:
        """Append charges (epoch seconds, ρ each), continuing the cumulative sum."""
        start = float(self.cum[-1]) if len(self.cum) else 0.0
        self.times = np.concatenate([self.times, times])
        self.cum = np.concatenate([self.cum, start + np.cumsum(rhos)])


@dataclass
class _Population:
    last_seq: int = 0
    total: _Track = field(default_factory=_Track)
    consumers: dict[str, _Track] = field(default_factory=dict)


class BurndownCache:
    """Per population, the cumulative ρ after each charge, overall and per consumer.

    The first chart of a population reads its charges once (one index range
    scan); later charts read only charges with a larger ``seq`` (the ledger is
    append-only and ``seq`` grows in commit order, also across replicas sharing
    a PostgreSQL ledger) and extend the cumulative sums, so a chart costs
    O(points drawn), not O(charges). Memory: about 32 bytes per charge. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._populations: dict[str, _Population] = {}

    def _refresh(self, ledger: Any, population: str) -> _Population:
        with self._lock:
            pop = self._populations.setdefault(population, _Population())
            rows = ledger.spend_series(population, after=pop.last_seq)
            if rows:
                times = _epochs([r[1] for r in rows])
                rhos = np.fromiter((r[3] for r in rows), float, len(rows))
                consumers = np.array([r[2] for r in rows], dtype=object)
                pop.total.extend(times, rhos)
                for name in dict.fromkeys(r[2] for r in rows):
                    mask = consumers == name
                    pop.consumers.setdefault(name, _Track()).extend(times[mask], rhos[mask])
                pop.last_seq = rows[-1][0]
            return pop

    def chart(self, ledger: Any, population: str, report: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
              *, now: float | None = None, zoom: bool = False) -> dict[str, Any]:
        """The burn-down of ``population``: ``{"svg": Markup, "rows": [...], "charges": n}``.

        Args:
            ledger: the ledger (``spend_series``).
            population: its name.
            report: its spend report (for the allocation caps and δ).
            events: its governance events (population_created, cap_changed) for the cap line.
            now: the right end of the time axis (epoch seconds; default: now).
            zoom: scale the y axis to the spend rather than to the cap.

        ``rows`` are the data behind the chart for a table: per consumer, the
        charges and the ρ spent.
        """
        pop = self._refresh(ledger, population)
        now = time.time() if now is None else now
        cap_steps = cap_history(events)
        first = [float(pop.total.times[0])] if len(pop.total.times) else []
        t0 = min([t for t, _ in cap_steps] + first + [now])
        t1 = max(now, float(pop.total.times[-1]) if len(pop.total.times) else now, t0 + 1.0)
        consumers_report = report.get("consumers", {})
        names = sorted(set(pop.consumers) | set(consumers_report))
        series, rows, alloc = [], [], []
        for name in names:
            track = pop.consumers.get(name, _Track())
            xs, ys = _sampled(track.times, track.cum, t0, t1)
            series.append(Series(name, xs, ys, step=True))
            cap_rho = _number(consumers_report.get(name, {}).get("cap_rho"))
            if cap_rho is not None:
                alloc.append((name, cap_rho))
            rows.append({"consumer": name, "charges": int(len(track.times)),
                         "rho": float(track.cum[-1]) if len(track.cum) else 0.0})
        xs, ys = _sampled(pop.total.times, pop.total.cum, t0, t1)
        total = Series("population", xs, ys, step=True)
        spent = float(pop.total.cum[-1]) if len(pop.total.cum) else 0.0
        delta = _number(report.get("cap", {}).get("delta"))
        right: list[tuple[float, str]] = []
        if delta:
            # ε by the ledger's one conversion at the δ charges are made at (δ less the selection δ):
            # the cap's ρ is labelled with the cap's ε
            d_rho = delta - (_number(report.get("cap", {}).get("selection_delta")) or 0.0)
            top = max(([] if zoom else [c for _, c in cap_steps]) + [spent, 1e-12])
            for frac in (0.25, 0.5, 0.75, 1.0):
                rho = top * frac
                right.append((rho, f"ε {fmt_number(ledger_epsilon(rho, d_rho), 3)}"))
        svg = burndown_chart(series, total, cap_steps, alloc, ident=f"burn-{zlib.crc32(population.encode()):08x}",
                             title=f"Budget burn-down of population {population}", t0=t0, t1=t1,
                             right_ticks=right, zoom=zoom)
        return {"svg": svg, "rows": rows, "charges": int(len(pop.total.times))}


def cap_history(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """``(epoch seconds, ρ_cap)`` at the population's creation and at each recorded cap change,
    in ledger order (the cap line of the burn-down steps at each)."""
    steps: list[tuple[float, float]] = []
    for e in events:
        cap = event_cap(e)
        if cap is not None and _number(cap.get("rho_cap")) is not None and e.get("created_at"):
            steps.append((_epoch(e["created_at"]), float(cap["rho_cap"])))
    return steps


def cap_text(cap: Mapping[str, Any] | None) -> str:
    """A cap as the pages write it: ``ε 3.5, δ 1e-6 (ρ 0.2465)`` (empty for None)."""
    if not cap:
        return ""
    text = f"ε {fmt_number(_number(cap.get('epsilon')))}, δ {fmt_number(_number(cap.get('delta')))}"
    rho = _number(cap.get("rho_cap", cap.get("rho")))
    return text + (f" (ρ {fmt_number(rho)})" if rho is not None else "")


def _allocations_text(allocations: Any) -> str:
    if not isinstance(allocations, Mapping):
        return ""
    if not allocations:
        return "open (no allocations)"
    return "allocations " + ", ".join(
        f"{name} {fmt_number(share * 100, 3)} %" if _number(share) is not None else f"{name} {share}"
        for name, share in sorted(allocations.items()))


def governance_change(event: Mapping[str, Any]) -> dict[str, str]:
    """A governance event's before and after in the pages' number format (no raw JSON):
    ``{"before", "after", "cap_after"}``; ``cap_after`` is the cap in force after the event
    (empty for an allocation change)."""
    kind = event.get("kind")
    new = event.get("new") if isinstance(event.get("new"), Mapping) else {}
    old = event.get("old") if isinstance(event.get("old"), Mapping) else {}
    after_cap, before_cap = event_cap(event), event_old_cap(event)
    if kind == "population_created":
        after = "; ".join(t for t in (cap_text(after_cap), _allocations_text(new.get("allocations"))) if t)
        return {"before": "", "after": after, "cap_after": cap_text(after_cap)}
    if kind == "cap_changed":
        return {"before": cap_text(before_cap), "after": cap_text(after_cap), "cap_after": cap_text(after_cap)}
    if kind == "allocations_changed":
        return {"before": _allocations_text(old.get("allocations")),
                "after": _allocations_text(new.get("allocations")), "cap_after": ""}
    return {"before": "", "after": "", "cap_after": ""}


def _sampled(times: np.ndarray, cum: np.ndarray, t0: float, t1: float) -> tuple[list[float], list[float | None]]:
    """A cumulative step series from t0 (0) to its last charge, at most :data:`BURNDOWN_POINTS` points."""
    if len(times) == 0:
        return [t0], [0.0]
    if len(times) <= BURNDOWN_POINTS:
        return [t0, *times.tolist()], [0.0, *cum.tolist()]
    grid = np.linspace(max(t0, float(times[0])), float(times[-1]), BURNDOWN_POINTS)
    idx = np.searchsorted(times, grid, side="right") - 1
    ys = np.where(idx >= 0, cum[np.clip(idx, 0, None)], 0.0)
    return [t0, *grid.tolist()], [0.0, *ys.tolist()]


# ------------------------------------------------------------------------------- releases


def _halfwidths(accuracy: Mapping[str, Any], n: int) -> list[float | None]:
    rows = accuracy.get("ci95_rows")
    if isinstance(rows, list) and len(rows) == n:
        return [_number(v) for v in rows]
    one = _number(accuracy.get("ci95"))
    return [one] * n


def rank_error_text(entry: Mapping[str, Any]) -> str:
    """A DP quantile's accuracy in words (its ``rank_error95``, :mod:`dpgate.quantiles`)."""
    r = _number(entry.get("rank_error95"))
    q = _number(entry.get("quantile"))
    where = f"{q:g}·n" if q is not None else "q·n"
    return (f"no error bars: a DP quantile's accuracy is a rank error. With probability ≥ 95 % the released "
            f"value has {where} ± {fmt_number(r, 3)} of the group's n bounded values below it (plus the values within "
            "one grid step of the true quantile); there is no interval in the column's units"
            if r is not None else "no error bars: a DP quantile's accuracy is a rank error")


def _clip(entry: Any) -> tuple[float | None, float | None] | None:
    """A ``value_ranges`` entry as a chart's clip ``(lower, upper)``, or None."""
    if not isinstance(entry, Mapping):
        return None
    lo, hi = _number(entry.get("lower")), _number(entry.get("upper"))
    return None if lo is None and hi is None else (lo, hi)


_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?$")


def _as_days(values: Sequence[Any]) -> list[float] | None:
    """Days since 1970-01-01 of ISO date/timestamp keys (``date_trunc`` keys are released as
    ISO text), or None when some value is not one."""
    out = []
    for v in values:
        if isinstance(v, (date, datetime)):
            text = v.isoformat()
        elif isinstance(v, str) and _ISO_DATE.match(v):
            text = v
        else:
            return None
        try:
            t = datetime.fromisoformat(text.replace(" ", "T"))
        except ValueError:
            return None
        if t.tzinfo is None:
            t = t.replace(tzinfo=timezone.utc)
        out.append(t.timestamp() / 86400.0)
    return out


def _cuts(values: Sequence[float | None], errors: Sequence[float | None],
          clip: tuple[float | None, float | None]) -> bool:
    """Whether some error bar v ± e reaches past the clip range (so the chart cuts it)."""
    lo, hi = clip
    for v, e in zip(values, errors):
        if v is None or e is None or not math.isfinite(e):
            continue
        if (lo is not None and v - e < lo) or (hi is not None and v + e > hi):
            return True
    return False


def where_text(canonical_sql: str) -> str:
    """The WHERE of a release's canonical SQL without identifier quotes (``week = 7``), or ''."""
    try:
        import sqlglot
        from sqlglot import exp

        tree = sqlglot.parse_one(canonical_sql, read="duckdb")
        where = tree.args.get("where") if tree is not None else None
        if where is None:
            return ""
        plain = where.this.transform(lambda n: exp.column(n.name) if isinstance(n, exp.Column) else n)
        return plain.sql(dialect="duckdb")
    except Exception:  # noqa: BLE001 - a title helper never fails a page
        return ""


def release_title(release: Mapping[str, Any]) -> str:
    """A release's title in the analyst's words: its column names (the aliases), ``values by
    keys``, and its filter (``users by region, where week = 7``)."""
    accuracy = release.get("accuracy", {}) or {}
    columns = list(release.get("columns", []))
    values = [c for c in columns if c in accuracy]
    keys = [c for c in columns if c not in accuracy]
    title = ", ".join(values or columns) + (f" by {', '.join(keys)}" if keys and values else "")
    where = where_text(str(release.get("canonical_sql") or ""))
    if where:
        title += f", where {where if len(where) <= 80 else where[:79] + '…'}"
    return title


def release_view(release: Mapping[str, Any], *, charts: bool = True, max_charts: int | None = None) -> dict[str, Any]:
    """A release as the pages show it.

    Returns ``{"keys": [...], "values": [...], "header": [...], "rows": [...],
    "charts": [{"column", "svg", "approximate", "rank_error", "clip"}], "ranks": {column: text},
    "numbers": [{"column", "value", "ci95", "approximate", "rank_error", "clamped"}], "title",
    "omitted": n}``: ``header``/``rows`` interleave each noisy column with its ± (95 %
    half-width per row: the release's ``ci95_rows`` when present, else its ``ci95``);
    key columns are the columns without an accuracy entry (group keys are public, not
    noisy). A quantile column (MEDIAN, PERCENTILE, MIN/MAX: its accuracy entry has a
    ``rank_error95``) has no value interval: its ± column is a ``rank`` column (± ranks),
    its chart has no error bars and ``ranks`` says why in words, once. Error bars and
    axes stop at the release's ``value_ranges`` (a count at 0, an AVG at its column's
    bounds), said in the chart. A release of one row without keys is a number card
    (``numbers``), not a chart; date keys are drawn as a line over time.
    """
    from dpgate.postprocess.ranges import clamped_at_bound

    columns = list(release.get("columns", []))
    rows = [list(r) for r in release.get("rows", [])]
    accuracy = release.get("accuracy", {}) or {}
    ranges = release.get("value_ranges") or {}
    values = [c for c in columns if c in accuracy]
    keys = [c for c in columns if c not in accuracy]
    ranked = {c: _number(accuracy[c].get("rank_error95")) for c in values if "rank_error95" in accuracy[c]}
    halfwidths = {c: [None] * len(rows) if c in ranked else _halfwidths(accuracy[c], len(rows)) for c in values}
    header: list[dict[str, Any]] = []
    for c in columns:
        header.append({"name": c, "kind": "value" if c in accuracy else "key"})
        if c in ranked:
            header.append({"name": f"rank error {c} (95 %)", "kind": "rank"})
        elif c in accuracy:
            header.append({"name": f"± {c}", "kind": "ci"})
    table = []
    for i, r in enumerate(rows):
        cells = []
        for j, c in enumerate(columns):
            v = r[j] if j < len(r) else None
            cells.append({"value": v, "kind": "value" if c in accuracy else "key",
                          "clamped": c in accuracy and clamped_at_bound(v, ranges.get(c))})
            if c in ranked:
                cells.append({"value": ranked[c] if v is not None else None, "kind": "rank"})
            elif c in accuracy:
                cells.append({"value": halfwidths[c][i], "kind": "ci"})
        table.append(cells)
    numbers = []
    if not keys and len(rows) == 1:  # a single value: a number card, not a one-bar chart
        for c in values:
            v = rows[0][columns.index(c)]
            numbers.append({"column": c, "value": v, "ci95": halfwidths[c][0], "rank_error": ranked.get(c),
                            "approximate": bool(accuracy[c].get("approximate")),
                            "clamped": clamped_at_bound(v, ranges.get(c))})
    out_charts = []
    omitted = 0
    if charts and not numbers:
        for j, c in enumerate(values):
            if max_charts is not None and len(out_charts) >= max_charts:
                omitted += 1
                continue
            clip = _clip(ranges.get(c))
            svg = _release_chart(release, columns, rows, keys, c, halfwidths[c], j, ranked=c in ranked, clip=clip)
            if svg is not None:
                vals = [_number(r[columns.index(c)]) for r in rows]
                cut = clip is not None and c not in ranked and _cuts(vals, halfwidths[c], clip)
                out_charts.append({"column": c, "svg": svg, "approximate": bool(accuracy[c].get("approximate")),
                                   "rank_error": rank_error_text(accuracy[c]) if c in ranked else None,
                                   "clip": clip_text(clip) if cut else ""})
    clamped = sorted({c for row in table for c, cell in zip([h["name"] for h in header], row) if cell.get("clamped")})
    return {"keys": keys, "values": values, "header": header, "rows": table, "charts": out_charts,
            "ranks": {c: rank_error_text(accuracy[c]) for c in ranked}, "omitted": omitted, "numbers": numbers,
            "title": release_title(release),
            "clamped": {c: (ranges.get(c) or {}).get("rule", "") for c in clamped}}


def _release_chart(release: Mapping[str, Any], columns: list[str], rows: list[list[Any]], keys: list[str],
                   column: str, errs: list[float | None], j: int, *, ranked: bool = False,
                   clip: tuple[float | None, float | None] | None = None) -> Markup | None:
    ci = columns.index(column)
    ys = [_number(r[ci]) if ci < len(r) else None for r in rows]
    if not any(y is not None for y in ys):
        return None
    rid = str(release.get("release_id", "r"))[-10:]
    ident = f"c-{rid}-{j}"
    title = (f"{column}, a DP quantile: no error bars (its accuracy is a rank error)"
             if ranked else f"{column}, with 95 % error bars")
    clip = None if ranked else clip
    if not keys:
        return bar_chart([column], ys[:1], errs[:1], ident=ident, title=title, y_label=column, clip=clip)
    kidx = [columns.index(k) for k in keys]
    x_key = kidx[-1]
    xs_raw = [r[x_key] for r in rows]
    days = _as_days(xs_raw) if len(set(map(str, xs_raw))) > 1 else None
    numeric_x = days is not None or (
        all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs_raw) and len(set(xs_raw)) > 2)
    xs_num = days if days is not None else [float(x) if numeric_x else 0.0 for x in xs_raw]
    ticks = date_ticks(sorted(set(days))) if days is not None else None
    if len(keys) == 1:
        if numeric_x:
            order = sorted(range(len(rows)), key=lambda i: xs_num[i])[:MAX_CHART_POINTS]
            s = Series(column, [xs_num[i] for i in order], [ys[i] for i in order], [errs[i] for i in order])
            return line_chart([s], ident=ident, title=title, x_label=keys[0], y_label=column, clip=clip,
                              x_ticks=ticks, x_names=[str(xs_raw[i]) for i in order] if days is not None else None)
        n = min(len(rows), MAX_CHART_POINTS)
        return bar_chart([str(x) for x in xs_raw[:n]], ys[:n], errs[:n], ident=ident, title=title,
                         y_label=column, x_label=keys[0], clip=clip)
    # several keys: one line (or bar group) per combination of the other keys, x = the last key
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(r[k] for k in kidx[:-1]), []).append(i)
    if numeric_x:
        series = []
        for g, idx in list(groups.items())[:MAX_CHART_SERIES]:
            idx = sorted(idx, key=lambda i: xs_num[i])[:MAX_CHART_POINTS]
            series.append(Series(" · ".join(str(v) for v in g), [xs_num[i] for i in idx],
                                 [ys[i] for i in idx], [errs[i] for i in idx]))
        return line_chart(series, ident=ident, title=title, x_label=keys[-1], y_label=column, clip=clip,
                          x_ticks=ticks)
    n = min(len(rows), MAX_CHART_POINTS)
    labels = [" · ".join(str(rows[i][k]) for k in kidx) for i in range(n)]
    return bar_chart(labels, ys[:n], errs[:n], ident=ident, title=title, y_label=column, x_label=" · ".join(keys),
                     clip=clip)


# ------------------------------------------------------------------------------- explain


_UNIT_KINDS = {"sum": 1, "sum_squares": 2}


def explanation_view(explanation: Mapping[str, Any], dataset_info: Mapping[str, Any],
                     remaining: Mapping[str, Any] | None) -> dict[str, Any]:
    """An explained query for the console.

    Args:
        explanation: :meth:`Gateway.explain`'s document.
        dataset_info: :meth:`Gateway.dataset`'s document (column resolutions, used when the
            explanation has no ``noise_scale_units``).
        remaining: the caller's allocation from the budget report (``remaining_rho``,
            ``remaining_epsilon``, ``consumer``), and ``population_remaining_rho``; None when
            the caller has no allocation (e.g. an admin).

    Returns:
        ``{"primitives": [...], "outputs": [...], "cost": …, "fits": True/False/None,
        "fits_note": str}``: primitives and outputs as
        :func:`dpgate.postprocess.expected.expected_accuracy` gives them (outputs named by
        the analyst's aliases, ``label``; sensitivities with their unit; quantiles with their
        score sensitivity, rank scale and rank error). ``fits`` is the gateway's verdict
        (``cost.fits``) when it gives one, else whether the cost's ρ is within both the
        allocation's and the population's remaining ρ (the ledger's filter decides at run
        time); ``fits_note`` says it in a sentence.
    """
    plan = explanation.get("plan", {}) or {}
    doc = dict(explanation)
    if not doc.get("noise_scale_units"):  # older gateways: the step from the column's resolution
        table = (dataset_info.get("tables", {}) or {}).get(plan.get("table"), {})
        cols = table.get("columns", {}) if isinstance(table, Mapping) else {}
        steps = {}
        for p in plan.get("primitives", []):
            power = _UNIT_KINDS.get(str(p.get("kind")), 0)
            res = _number((cols.get(p.get("column")) or {}).get("resolution")) if power else None
            steps[p.get("id")] = {"unit": (res or 1.0) ** power}
        doc["noise_scale_units"] = steps
    expected = expected_accuracy(doc)
    cost = explanation.get("cost", {}) or {}
    rho = _number(cost.get("rho"))
    fits = explanation.get("fits", cost.get("fits"))
    left = _number(cost.get("remaining_rho"))
    holder = f"allocation {cost['consumer']}" if cost.get("consumer") else "the population"
    if not isinstance(fits, bool):
        fits, left = None, None
        if remaining is not None and rho is not None:
            mine = _number(remaining.get("remaining_rho"))
            pop = _number(remaining.get("population_remaining_rho"))
            named = f"allocation {remaining['consumer']}" if remaining.get("consumer") else "your allocation"
            candidates = [(v, n) for v, n in ((mine, named), (pop, "the population")) if v is not None]
            if candidates:
                left, holder = min(candidates, key=lambda c: c[0])
                fits = rho <= left * (1 + 1e-12)
    fits_note = ""
    if rho is not None and left is not None and fits is not None:
        if fits:
            fits_note = f"This release costs ρ {fmt_number(rho)}; {holder} has ρ {fmt_number(left)} left."
        else:
            fits_note = (f"This release costs ρ {fmt_number(rho)}, but {holder} has only ρ {fmt_number(left)} "
                         "left: running it would be refused (budget_exhausted) and charge nothing.")
    return {"primitives": expected["primitives"], "outputs": expected["outputs"], "cost": cost, "fits": fits,
            "fits_note": fits_note}


def recent_releases(releases: Iterable[Mapping[str, Any]], consumer: str | None, limit: int = 10) -> list[dict[str, Any]]:
    """The newest releases paid by ``consumer``'s allocation (at most ``limit``)."""
    out = []
    for r in releases:
        paid = r.get("paid_by") or r.get("charge") or {}
        if consumer is not None and paid.get("consumer") == consumer:
            out.append(dict(r))
            if len(out) >= limit:
                break
    return out
