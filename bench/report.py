"""Render the results of ``python -m bench`` as Markdown and a PNG plot.

:func:`write` replaces the part of ``docs/BENCHMARKS.md`` between
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` (appending it when the
markers are absent), so sections written by others (ledger, planner) stay.
The ledger and planner outputs of this run are included in the generated part
only when the document has no section of its own for them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
QUERY_LABEL = {"count": "COUNT(*)", "count_avg": "GROUP BY key: COUNT(*), AVG(x)", "sum": "GROUP BY key: SUM(x)"}
PEER_LABEL = {"smartnoise": "SmartNoise SQL", "tumult": "Tumult Analytics", "pipelinedp": "PipelineDP"}


def _f(v: float | None, nd: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}"


def _rows_label(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


def _latency_entries(res: dict) -> list[dict]:
    out = []
    for folder, doc in res.get("latency", {}).items():
        for key, e in (doc.get("results") or {}).items():
            out.append({**e, "folder": folder, "load_s": doc.get("load_s"), "rss": doc.get("peak_rss_mb")})
    return out


def _gateway_ms(res: dict, folder: str, dataset: str, query: str) -> float | None:
    doc = res.get("latency", {}).get(folder, {})
    e = (doc.get("results") or {}).get(f"{dataset}/{query}")
    return e["median_ms"]["gateway"] if e else None


def aims(res: dict) -> list[tuple[str, str, str]]:
    """(aim, status, evidence) rows; status is "met", "not met" or "not measured"."""
    rows = []
    quick = res["mode"] == "quick"
    note = " (quick run: smaller data than the aim names)" if quick else ""
    lat = res.get("latency", {})
    # 1. gateway ≤ 3× per-unit on 10M rows
    folder = "rows_10m" if "rows_10m" in lat else next((f for f in lat if f.startswith("rows_")), None)
    ents = [e for e in _latency_entries(res) if e["folder"] == folder]
    if ents:
        worst = max(ents, key=lambda e: e["gateway_over_per_unit"])
        detail = ", ".join(f"k={e['k']} {e['query']}: {e['gateway_over_per_unit']:.2f}×" for e in ents)
        rows.append((f"gateway ≤ 3× raw per-unit aggregation on 10M rows [{folder}]{note}",
                     "met" if worst["gateway_over_per_unit"] <= 3 else "not met", detail))
    else:
        rows.append(("gateway ≤ 3× raw per-unit aggregation on 10M rows", "not measured", "no latency results"))
    # 2/3. peers
    for peer, factor, what in (("smartnoise", 20, "the 1.2M PUMS table"), ("tumult", 100, "1M rows / 100k units"),
                               ("pipelinedp", 100, "1M rows / 100k units")):
        p = res.get("peers", {}).get(peer, {})
        label = f"per query ≥ {factor}× faster than {PEER_LABEL[peer]} on {what}{note}"
        if not p or p.get("error") or p.get("skipped"):
            rows.append((label, "not measured", p.get("error") or p.get("skipped") or "not run"))
            continue
        ratios = []
        for key, r in p.get("results", {}).items():
            ds, q = key.split("/")
            folder = _folder_of(res, ds)
            g = _gateway_ms(res, folder, ds, q) if folder else None
            if g:
                ratios.append((key, r["median_s"] * 1e3 / g))
        if not ratios:
            rows.append((label, "not measured", "no comparable query"))
            continue
        worst = min(ratios, key=lambda t: t[1])
        rows.append((label, "met" if worst[1] >= factor else "not met",
                     ", ".join(f"{k}: {v:.0f}×" for k, v in ratios)))
    # 4. HTTP
    h = res.get("http", {})
    if "cached_over_bare_throughput" in h:
        v = h["cached_over_bare_throughput"]
        rows.append(("cached release fetch ≥ 70 % of bare FastAPI throughput", "met" if v >= 0.7 else "not met",
                     f"{100 * v:.0f} % ({_f(h['gateway_cached']['concurrent']['throughput_rps'])} vs "
                     f"{_f(h['bare_fastapi']['concurrent']['throughput_rps'])} requests/s at concurrency "
                     f"{h['concurrency']})"))
    else:
        rows.append(("cached release fetch ≥ 70 % of bare FastAPI throughput", "not measured", h.get("error", "")))
    # 5. noise
    n = [r for r in res.get("noise", []) if r["mechanism"] == "discrete_gaussian" and r["cells"] == 100_000]
    if n:
        s = n[0]["sample_ms"] / 1e3
        rows.append(("noise for 100,000 cells ≤ 1 s (discrete Gaussian)", "met" if s <= 1 else "not met",
                     f"{s:.2f} s ({_f(n[0]['cells_per_s'], 0)} cells/s)"))
    else:
        rows.append(("noise for 100,000 cells ≤ 1 s", "not measured", ""))
    return rows


def _folder_of(res: dict, dataset: str) -> str | None:
    for folder, doc in res.get("latency", {}).items():
        if any(k.split("/")[0] == dataset for k in (doc.get("results") or {})):
            return folder
    return None


def plot(res: dict, png: Path) -> bool:
    """Write the PNG (gateway vs raw by size; gateway vs peers); False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    ents = [e for e in _latency_entries(res) if e["k"] == 1 and e["kind"] == "synthetic"]
    sizes = sorted({e["rows"] for e in ents})
    ax = axes[0]
    width = 0.2
    for qi, q in enumerate(("count", "count_avg", "sum")):
        for si, series in enumerate(("raw", "per_unit", "bounded", "gateway")):
            ys = [next((e["median_ms"][series] for e in ents if e["rows"] == s and e["query"] == q), float("nan"))
                  for s in sizes]
            xs = [i * 4 + qi + (si - 1.5) * width for i in range(len(sizes))]
            ax.bar(xs, ys, width, color=f"C{si}", label=series.replace("_", "-") if qi == 0 else None)
    ax.set_xticks([i * 4 + qi for i in range(len(sizes)) for qi in range(3)],
                  [f"{_rows_label(s)} rows\n{q}" for s in sizes for q in ("count", "count+avg", "sum")], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median ms per query (log)")
    ax.set_title("k = 1: COUNT | COUNT+AVG | SUM per size")
    ax.legend(fontsize=8)
    ax = axes[1]
    labels, vals, colors = [], [], []
    for peer in ("smartnoise", "tumult", "pipelinedp"):
        p = res.get("peers", {}).get(peer, {})
        for key, r in (p.get("results") or {}).items():
            ds, q = key.split("/")
            folder = _folder_of(res, ds)
            g = _gateway_ms(res, folder, ds, q) if folder else None
            if g:
                labels += [f"{ds}\n{q}\ndpgate", f"{ds}\n{q}\n{peer}"]
                vals += [g, r["median_s"] * 1e3]
                colors += ["C3", {"smartnoise": "C4", "tumult": "C5", "pipelinedp": "C6"}[peer]]
    if vals:
        ax.bar(range(len(vals)), vals, color=colors)
        ax.set_xticks(range(len(vals)), labels, fontsize=5, rotation=90)
        ax.set_yscale("log")
        ax.set_ylabel("median ms per query (log)")
        ax.set_title("dpgate (red) vs peers, same data and queries")
    else:
        ax.text(0.5, 0.5, "no peer results", ha="center")
    fig.suptitle(f"dpgate benchmarks ({res['mode']} run, {res['machine'].get('nproc')} CPUs)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def render(res: dict, *, include_ledger: bool, include_planner: bool, png_name: str | None) -> str:
    """The generated Markdown section (between the markers)."""
    m = res["machine"]
    L: list[str] = []
    a = L.append
    a(f"## Side-by-side benchmarks (`python -m bench --{res['mode']}`)\n")
    a(f"Run {res['started']}, {res['total_s'] / 60:.1f} min in total. Generated by `bench/report.py` from "
      f"`bench/results/{res['mode']}.json`; everything between the `bench:begin/end` markers is rewritten "
      "by the next run.\n")
    if res["mode"] == "quick":
        a("**This is a quick run** (small data, few runs, Tumult skipped): a smoke test of the harness, not the "
          "figures the aims refer to. Run `python -m bench --full` for those.\n")
    a("### Machine\n")
    a("| | |\n|---|---|")
    a(f"| CPU | {m.get('cpu', '?')} × {m.get('nproc')} |")
    a(f"| memory | {m.get('memory_gib', '?')} GiB |")
    a(f"| OS | {m.get('platform')} |")
    a(f"| Python | {m.get('python')} |")
    a("| versions | " + ", ".join(f"{k} {m[k]}" for k in ("dpgate", "duckdb", "opendp", "sqlglot", "fastapi",
                                                        "uvicorn", "numpy", "pyarrow") if k in m) + " |")
    la, lb = m.get("loadavg_start"), m.get("loadavg_end")
    a(f"| load average (1/5/15 min) | start {', '.join(f'{x:.1f}' for x in la)}; end "
      f"{', '.join(f'{x:.1f}' for x in lb) if lb else '?'} |")
    a("")
    a("The machine is shared (other work ran at the same time; see the load average): absolute times are "
      "noisy, ratios measured interleaved on the same connection are the more stable figures. Nothing is "
      "tuned for the benchmark: default settings, the DuckDB default thread count.\n")
    a("### Commands\n")
    a("```\n.venv/bin/python -m pip install -e '.[bench]'     # matplotlib, httpx, psutil\n"
      f".venv/bin/python -m bench --{res['mode']}\n```\n")
    a("Data: `bench/datagen.py` (deterministic; heavy-tailed rows per unit, Pareto 1.2; 10 public keys; "
      "x in [0, 100]; the PUMS-like table is a bootstrap of PUMS.csv with one row per person). Peers run in "
      "their own venvs under `bench/.venvs/` (created on first use).\n")

    a("### Aims\n")
    a("| aim | status | figures |\n|---|---|---|")
    for aim, status, ev in aims(res):
        a(f"| {aim} | **{status}** | {ev} |")
    a("")

    a("### Query latency in-process (median ms)\n")
    a("`gateway` = `Gateway.query` end to end (parse, plan, calibrate, durable ledger charge, bounded SQL, "
      "OpenDP noise, post-processing, release stored); each run has a distinct ρ·(1 + i·10⁻⁹), so the "
      "release cache always misses and every run is charged. `bounded` = the bounded SQL alone; `raw` = the "
      "same aggregate without bounding; `per-unit` = the raw `GROUP BY unit, key` aggregation "
      "(re-aggregated per key, so no large result is fetched). All on the gateway's DuckDB connection "
      "(`gw.engine.execute`), interleaved, "
      f"{res['config']['runs']} runs after a warm-up. Per query ε = 1, δ = 1e-6 (ρ ≈ 0.0244).\n")
    a("| data | k | m | query | gateway | bounded | raw | per-unit | gateway / per-unit | gateway / raw |")
    a("|---|---|---|---|---|---|---|---|---|---|")
    for e in _latency_entries(res):
        md = e["median_ms"]
        a(f"| {e['folder']} ({_rows_label(e['rows'])} rows, {_rows_label(e['units'])} units) | {e['k']} | {e['m']} | "
          f"{QUERY_LABEL[e['query']]} | {_f(md['gateway'])} | {_f(md['bounded'])} | {_f(md['raw'])} | "
          f"{_f(md['per_unit'])} | {e['gateway_over_per_unit']:.2f} | {e['gateway_over_raw']:.1f} |")
    errs = {f: d["error"] for f, d in res.get("latency", {}).items() if d.get("error")}
    for f, err in errs.items():
        a(f"\n{f}: failed — {err}")
    a("")

    a("### Scaling (one process per size)\n")
    a("| data | rows | units | load (s) | peak RSS (MiB) | gateway COUNT+AVG k=1 (ms) | gateway SUM k=3 (ms) |")
    a("|---|---|---|---|---|---|---|")
    for folder, doc in res.get("latency", {}).items():
        if doc.get("error"):
            continue
        r = doc["results"]
        first = next(iter(r.values()))
        ca = next((e["median_ms"]["gateway"] for e in r.values() if e["k"] == 1 and e["query"] == "count_avg"), None)
        s3 = next((e["median_ms"]["gateway"] for e in r.values() if e["k"] == 3 and e["query"] == "sum"), None)
        a(f"| {folder} | {first['rows']:,} | {first['units']:,} | {_f(doc['load_s'], 2)} | {_f(doc['peak_rss_mb'], 0)} |"
          f" {_f(ca)} | {_f(s3)} |")
    a("\nPeak RSS is the benchmark process's `ru_maxrss` (DuckDB holds the tables in memory; both k policies "
      "load their own copy of the table).\n")

    a("### Peers (same data, same queries, same ε)\n")
    a("| peer | version | one-time costs (s) | data | query | median per query (s) | dpgate (s) | dpgate faster by |")
    a("|---|---|---|---|---|---|---|---|")
    for peer in ("smartnoise", "tumult", "pipelinedp"):
        p = res.get("peers", {}).get(peer, {})
        if not p or p.get("error") or p.get("skipped"):
            a(f"| {PEER_LABEL[peer]} | – | – | – | – | {p.get('error') or p.get('skipped') or 'not run'} | – | – |")
            continue
        once = [f"import {p.get('import_s', 0):.1f}"]
        if "spark_startup_s" in p:
            once.append(f"Spark start {p['spark_startup_s']:.1f}")
        once += [f"load {k} {v:.1f}" for k, v in p.get("load_s", {}).items()]
        for key, r in p.get("results", {}).items():
            ds, q = key.split("/")
            folder = _folder_of(res, ds)
            g = _gateway_ms(res, folder, ds, q) if folder else None
            a(f"| {PEER_LABEL[peer]} | {p.get('version')} | {'; '.join(once)} | {ds} | {QUERY_LABEL[q]} | "
              f"{r['median_s']:.3f} | {_f(g / 1e3 if g else None, 3)} | {_f(r['median_s'] * 1e3 / g if g else None, 0)}× |")
            once = [""]
        for key, err in (p.get("errors") or {}).items():
            a(f"| {PEER_LABEL[peer]} | {p.get('version')} | | {key} | | failed: {err[:200]} | | |")
    a("\nSettings: SmartNoise SQL with its pandas reader (`snsql.from_df`: the DataFrame is copied into an "
      "in-memory SQLite database once — the one-time load), `max_ids` = k·m, `censor_dims: False` (public keys, "
      "as in dpgate). Tumult Analytics: Spark `local[2]`, `AddRowsWithID` with `MaxGroupsPerID(k)` and "
      "`MaxRowsPerGroupPerID(m)` (`MaxRowsPerID(k·m)` for the ungrouped count), `RhoZCDPBudget` with dpgate's ρ; "
      "COUNT + AVG is two Tumult queries (ρ/2 each), both timed. PipelineDP: `LocalBackend`, public partitions, "
      "`max_partitions_contributed` = k, `max_contributions_per_partition` = m, Gaussian noise, "
      "`NaiveBudgetAccountant` at (ε, δ) per query; reading the Parquet file into Python tuples is its one-time "
      "load. Runs per peer query: " + ", ".join(f"{PEER_LABEL[k]} {v}" for k, v in res["config"]["peer_runs"].items())
      + " (median).\n")

    a("### Utility: 52 weekly count releases under one total (ε = 4, δ = 1e-6)\n")
    a("`SELECT educ, COUNT(*) … GROUP BY educ` (16 public keys) on the 120k-row PUMS table (one row per person; the "
      "error of a count does not depend on the table size). RMSE over all cells of the releases run, against the "
      "exact counts; no clamping.\n")
    a("| tool | how the total is split | per-release noise | releases run | RMSE |\n|---|---|---|---|---|")
    u = res.get("utility", {})
    g = u.get("gateway")
    if g:
        a(f"| dpgate | ledger zCDP filter, ρ_cap = {g['rho_cap']:.4f} (read from the ledger: its cap rule at δ − {g.get('selection_delta', 0):g}), "
          f"ρ_cap/52 each; the 53rd release was {'refused' if g['release_53_refused'] else 'NOT refused'} | "
          f"discrete Gaussian σ = {g['noise_sigma']:.2f} | {g['releases_run']} | **{g['rmse']:.2f}** |")
    for peer in ("smartnoise", "tumult", "pipelinedp"):
        r = u.get(peer)
        p = res.get("peers", {}).get(peer, {})
        if r:
            if peer == "smartnoise":
                how = (f"own odometer (KOV15 Thm 3.5): ε = {r['epsilon_per_release']:.4f} per release composes to "
                       f"({r['composed'][0]:.3f}, {r['composed'][1]:.1e})")
                noise = f"discrete Laplace b = {r['noise_scale']:.2f} (σ = {r['noise_scale'] * math.sqrt(2):.2f})"
            elif peer == "tumult":
                how = f"RhoZCDPBudget ρ = {r['rho_total']:.4f} (BS16 Prop 1.3 conversion), ρ/52 each"
                noise = f"discrete Gaussian σ = {r['noise_sigma']:.2f}"
            else:
                how = "PLDBudgetAccountant(4, 1e-6) over 52 declared aggregations"
                noise = f"Gaussian σ = {_f(r.get('noise_sigma'), 2)}"
            a(f"| {PEER_LABEL[peer]} | {how} | {noise} | {r['releases_run']} | **{r['rmse']:.2f}** |")
        else:
            why = (p.get("errors") or {}).get("utility") or p.get("error") or p.get("skipped") or "not run"
            a(f"| {PEER_LABEL[peer]} | – | – | – | {why} |")
    if g:
        a(f"\nFor reference: a history of continuous Gaussians with the same total ρ_cap would be "
          f"({g['exact_gaussian_epsilon']:.2f}, 1e-6)-DP exactly (Balle–Wang 2018), which is why an exact/PLD "
          "accountant can afford a little less noise than the zCDP filter for pure-Gaussian histories.\n")

    h = res.get("http", {})
    a("### HTTP (loopback, uvicorn, one worker)\n")
    if h.get("error"):
        a(f"failed: {h['error']}\n")
    elif h:
        a(f"Load generator: `httpx` in the benchmark process (bounded: {h['gateway_cached']['concurrent']['requests']} "
          f"requests or the time limit), sharing the 2 CPUs with the server; release of {h['release_bytes']} bytes "
          f"(`{h['sql']}` on {h['dataset']}). Gateway start-up (load data, open ledger): {h['startup_s']:.1f} s.\n")
        a("| endpoint | clients | requests | p50 (ms) | p99 (ms) | throughput (req/s) |\n|---|---|---|---|---|---|")
        for name, label in (("gateway_cached", "dpgate `GET /v1/releases/{id}` (cached release, API key)"),
                            ("bare_fastapi", "bare FastAPI route returning the same JSON")):
            for mode, c in (("sequential", 1), ("concurrent", h["concurrency"])):
                s = h[name][mode]
                a(f"| {label} | {c} | {s['requests']} | {_f(s['p50_ms'], 2)} | {_f(s['p99_ms'], 2)} | "
                  f"{_f(s['throughput_rps'])} |")
        s = h["gateway_new_query"]
        a(f"| dpgate `POST /v1/queries` (new query, charged, cache miss) | 1 | {s['requests']} | {_f(s['p50_ms'], 2)} | "
          f"{_f(s['p99_ms'], 2)} | {_f(s['throughput_rps'])} |")
        a("")

    a("### Noise (OpenDP samplers through `dpgate.mechanisms`)\n")
    a("| mechanism | cells | scale | calibrate (ms) | sample (ms) | cells/s |\n|---|---|---|---|---|---|")
    for r in res.get("noise", []):
        a(f"| {r['mechanism']} | {r['cells']:,} | {r['scale']:.2f} | {_f(r['calibrate_ms'], 2)} | "
          f"{_f(r['sample_ms'], 2)} | {_f(r['cells_per_s'], 0)} |")
    a(f"\nMedian of {res['config']['noise_runs']} run(s).\n")

    if include_ledger:
        a("### Ledger (`bench/ledger_bench.py`, this run)\n")
        a("```\n" + res.get("ledger", {}).get("output", res.get("ledger", {}).get("error", "not run")) + "\n```\n")
    if include_planner:
        a("### Planner (`bench/planner_bench.py`, this run)\n")
        a("```\n" + res.get("planner", {}).get("output", res.get("planner", {}).get("error", "not run")) + "\n```\n")

    if png_name:
        a(f"![gateway time]({png_name})\n")
    a("### Known gaps\n")
    a("- Timings come from a shared 2-CPU machine with other jobs running (see the load average); "
      "repeat on an idle machine for publishable figures.")
    a("- Peers get fewer runs per query than dpgate (they are 2–4 orders of magnitude slower).")
    a("- PipelineDP's and Tumult's utility RMSE is estimated from 10 of the 52 planned releases (each release "
      "has the budget of a 52-release plan and the same noise, so the estimate is unbiased, just noisier).")
    a("- Tumult gets one run per query (Spark jobs of tens of seconds on this machine).")
    a("- The HTTP load generator runs on the same CPUs as the server, so requests/s are lower bounds.")
    return "\n".join(L) + "\n"


def write(res: dict[str, Any], doc: Path, png: Path) -> None:
    """Render ``res`` into ``doc`` (between the markers) and ``png``."""
    existing = doc.read_text() if doc.exists() else ""
    outside = existing
    if BEGIN in existing and END in existing:
        outside = existing.split(BEGIN)[0] + existing.split(END, 1)[1]
    low = outside.lower()
    include_ledger = "## ledger" not in low and "# ledger" not in low
    include_planner = "## planner" not in low and "# planner" not in low
    made = plot(res, png)
    body = render(res, include_ledger=include_ledger, include_planner=include_planner,
                  png_name=png.name if made else None)
    block = f"{BEGIN}\n{body}{END}"
    if BEGIN in existing and END in existing:
        new = existing.split(BEGIN)[0] + block + existing.split(END, 1)[1]
    elif existing:
        new = existing.rstrip() + "\n\n" + block + "\n"
    else:
        new = "# Benchmarks\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(new)
