"""Run every benchmark side by side; write the report to bench/results/ (or docs/ with --write-docs).

    python -m bench --quick        # small data, a smoke run (about 2 minutes on an idle machine)
    python -m bench --full         # the real figures: 1M, 10M, 30M (if memory allows) rows and PUMS 1.2M
    python -m bench --full --write-docs   # … and update docs/BENCHMARKS.md and docs/bench_gateway_time.png

A run leaves the working tree clean: results, the report and its plot go to the ignored
``bench/results/`` (``<mode>.json``, ``<mode>.md``, ``<mode>_gateway_time.png``); only
``--write-docs`` (or an explicit ``--doc``) rewrites a tracked file. Every step keeps its state
(ledger, release store, keys) in a temporary folder of its own, so runs can follow each other on
one checkout. A peer given no data (e.g. PUMS absent) or returning no measurement fails the run
(exit 1) instead of reporting an empty row.

Steps (each heavy step in its own subprocess, so peak RSS is per data size):
data (``bench.datagen``, generated once under ``bench/.data/``) → in-process
latency (``bench.latency``) per size → noise (``bench.noise_bench``) →
ledger (``bench/ledger_bench.py``) → planner (``bench/planner_bench.py``) →
HTTP (``bench.http_bench``) → utility (``bench.utility``) → peers
(``bench.peers``: SmartNoise SQL, Tumult Analytics, PipelineDP in their own
venvs) → report (``bench.report``). Raw results go to
``bench/results/<mode>.json``; ``--report-only`` re-renders from that file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / ".data"
RESULTS = ROOT / "bench" / "results"

#: mode → settings. Sizes: (folder, rows, units, keys) of synthetic data.
MODES: dict[str, dict[str, Any]] = {
    "quick": {
        "synthetic": [("rows_100k", 100_000, 10_000, 10)], "pums": ("pums_120k", 120_000),
        "runs": 5, "noise_runs": 1, "noise_laplace": False, "ledger_charges": 400, "planner_rows": 200_000,
        "http": {"requests": 400, "seconds": 5.0, "new_queries": 5},
        "peer_runs": {"smartnoise": 1, "pipelinedp": 1, "tumult": 1}, "peer_ks": (1,),
        "peers": ("smartnoise", "pipelinedp"), "peer_synthetic": "rows_100k", "peer_pums": "pums_120k",
        "utility_weeks_run": 0,
    },
    "full": {
        "synthetic": [("rows_1m", 1_000_000, 100_000, 10), ("rows_10m", 10_000_000, 1_000_000, 10),
                      ("rows_30m", 30_000_000, 3_000_000, 10)], "pums": ("pums_1m2", 1_200_000),
        # the 30M table is for scaling (time and RSS): k = 1 and one grouped query only
        "latency_args": {"rows_30m": ["--ks", "1", "--queries", "count_avg"]},
        "runs": 5, "noise_runs": 5, "noise_laplace": True, "ledger_charges": 4000, "planner_rows": 10_000_000,
        "http": {"requests": 3000, "seconds": 20.0, "new_queries": 20},
        "peer_runs": {"smartnoise": 3, "pipelinedp": 3, "tumult": 1}, "peer_ks": (1, 3),
        "peers": ("smartnoise", "tumult", "pipelinedp"), "peer_synthetic": "rows_1m", "peer_pums": "pums_1m2",
        "utility_weeks_run": 52,
    },
}
#: Small PUMS table for the utility experiment (the error of a count does not depend on the table's size).
UTILITY_PUMS = ("pums_120k", 120_000)


def _say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _py() -> str:
    return sys.executable


def ensure_data(folder: str, rows: int, units: int | None, keys: int | None, *, kind: str = "synthetic") -> Path | None:
    """Generate ``bench/.data/<folder>`` once (None if skipped: no PUMS source, or too little memory)."""
    from bench import datagen

    out = DATA / folder
    if (out / "manifest.json").exists():
        return out
    if kind == "pums":
        return out if datagen.generate_pums(out, rows=rows) else None
    free = datagen._available_memory()
    if rows >= 30_000_000 and free is not None and free < datagen.MIN_FREE_FOR_30M:
        _say(f"skipping {folder}: {free / 1024**3:.1f} GiB available")
        return None
    datagen.generate_synthetic(out, rows=rows, units=units, keys=keys)
    return out


def machine() -> dict[str, Any]:
    """CPU model, core count, memory, load and versions of the machine running the benchmarks."""
    info: dict[str, Any] = {"nproc": os.cpu_count(), "python": platform.python_version(),
                            "platform": platform.platform()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    info["loadavg_start"] = os.getloadavg()
    from importlib import metadata

    for pkg in ("dpgate", "duckdb", "opendp", "sqlglot", "fastapi", "uvicorn", "httpx", "numpy", "pyarrow"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return info


def _run_json(args: list[str], timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = Path(f.name)
    try:
        r = subprocess.run([_py(), "-m", *args, "--json", str(path)], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            return {"error": " | ".join(r.stderr.strip().splitlines()[-4:])[:600]}
        return json.loads(path.read_text())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    finally:
        path.unlink(missing_ok=True)


def _run_text(args: list[str], timeout: float) -> dict[str, Any]:
    try:
        r = subprocess.run([_py(), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if r.returncode != 0:
        return {"error": " | ".join(r.stderr.strip().splitlines()[-4:])[:600]}
    return {"output": r.stdout.strip()}


def run(mode: str, *, peers: bool = True, install: bool = True) -> dict[str, Any]:
    """Run every step of ``mode``; return the results document."""
    cfg = MODES[mode]
    res: dict[str, Any] = {"mode": mode, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine(),
                           "config": {k: v for k, v in cfg.items()}, "steps_s": {}}
    t_all = time.perf_counter()

    def step(name: str):
        _say(f"{name} …")
        res["steps_s"][name] = -time.perf_counter()

    def done(name: str):
        res["steps_s"][name] += time.perf_counter()
        _say(f"{name} done in {res['steps_s'][name]:.1f} s")

    step("data")
    folders = [f for f in (ensure_data(*s) for s in cfg["synthetic"]) if f is not None]
    pums = ensure_data(cfg["pums"][0], cfg["pums"][1], None, None, kind="pums")
    upums = ensure_data(*UTILITY_PUMS, None, None, kind="pums")
    done("data")

    step("latency")
    res["latency"] = {}
    for folder in folders + ([pums] if pums else []):
        _say(f"  latency on {folder.name}")
        extra = cfg.get("latency_args", {}).get(folder.name, [])
        res["latency"][folder.name] = _run_json(["bench.latency", "--data", str(folder), "--runs", str(cfg["runs"]),
                                                 *extra], timeout=5400)
    done("latency")

    step("noise")
    from bench import noise_bench

    res["noise"] = [r for r in noise_bench.measure(runs=cfg["noise_runs"])
                    if cfg["noise_laplace"] or r["mechanism"] == "discrete_gaussian"]
    done("noise")

    step("ledger")
    res["ledger"] = _run_text(["bench/ledger_bench.py", "--charges", str(cfg["ledger_charges"]), "--processes", "8"],
                              timeout=900)
    done("ledger")

    step("planner")
    res["planner"] = _run_text(["bench/planner_bench.py", "--rows", str(cfg["planner_rows"]),
                                "--units", str(cfg["planner_rows"] // 10), "--runs", "5"], timeout=1800)
    done("planner")

    step("http")
    from bench import http_bench

    try:
        res["http"] = http_bench.measure(folders[0], **cfg["http"])
    except Exception as exc:  # noqa: BLE001 - reported in the document
        res["http"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    done("http")

    step("utility")
    from bench import peers as peers_mod
    from bench import utility

    uspec = peers_mod.utility_spec(upums, run_weeks=cfg["utility_weeks_run"]) if upums else None
    try:
        res["utility"] = {"gateway": utility.measure(upums, true=uspec["true"])} if upums else {}
    except Exception as exc:  # noqa: BLE001 - reported, and fails the run (failures())
        res["utility"] = {"gateway": {"error": f"{type(exc).__name__}: {exc}"[:500]}}
    done("utility")

    res["peers"] = {}
    if peers:
        for peer in ("smartnoise", "tumult", "pipelinedp"):
            if peer not in cfg["peers"]:
                res["peers"][peer] = {"peer": peer, "skipped": f"not run in --{mode} (run --full)"}
                continue
            step(f"peer {peer}")
            if peer == "smartnoise":
                ds = peers_mod.dataset_spec(DATA / cfg["peer_pums"]) if pums else []
            else:
                ds = peers_mod.dataset_spec(DATA / cfg["peer_synthetic"], ks=cfg["peer_ks"])
            if not ds:
                res["peers"][peer] = {"peer": peer, "error": f"no data: {cfg['peer_pums'] if peer == 'smartnoise' else cfg['peer_synthetic']} "
                                      "was not generated (PUMS needs ../shared/data/smartnoise/PUMS.csv)"}
                done(f"peer {peer}")
                continue
            util = uspec if (uspec and cfg["utility_weeks_run"]) else None
            if util and peer in ("pipelinedp", "tumult"):
                util = dict(util, run_weeks=min(util["run_weeks"], 10))  # slow peers: RMSE from 10 of the 52
            res["peers"][peer] = peers_mod.run_peer(peer, ds, runs=cfg["peer_runs"][peer], utility=util,
                                                    install=install)
            if util and "utility" in res["peers"][peer]:
                res["utility"][peer] = res["peers"][peer]["utility"]
            done(f"peer {peer}")
    res["machine"]["loadavg_end"] = os.getloadavg()
    res["total_s"] = time.perf_counter() - t_all
    return res


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="small data, smoke run (default)")
    g.add_argument("--full", action="store_true", help="the real figures (tens of minutes)")
    ap.add_argument("--no-peers", action="store_true", help="skip SmartNoise, Tumult and PipelineDP")
    ap.add_argument("--no-install", action="store_true", help="do not create the peers' venvs")
    ap.add_argument("--report-only", action="store_true", help="re-render from bench/results/<mode>.json")
    ap.add_argument("--write-docs", action="store_true",
                    help="update the tracked docs/BENCHMARKS.md and docs/bench_gateway_time.png (default: write the "
                         "report to bench/results/ only)")
    ap.add_argument("--doc", type=Path, default=None, help="write the report to this Markdown file instead")
    args = ap.parse_args(argv)
    mode = "full" if args.full else "quick"
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{mode}.json"
    if args.report_only:
        res = json.loads(path.read_text())
    else:
        res = run(mode, peers=not args.no_peers, install=not args.no_install)
        path.write_text(json.dumps(res, indent=1, default=str))
        _say(f"results: {path}")
    from bench import report

    if args.write_docs:
        doc, png = args.doc or ROOT / "docs" / "BENCHMARKS.md", ROOT / "docs" / "bench_gateway_time.png"
    elif args.doc is not None:
        doc, png = args.doc, args.doc.with_name(f"{args.doc.stem}_gateway_time.png")
    else:
        doc, png = RESULTS / f"{mode}.md", RESULTS / f"{mode}_gateway_time.png"
    report.write(res, doc, png)
    _say(f"report: {doc}")
    problems = failures(res)
    for problem in problems:
        _say(f"FAILED: {problem}")
    return 1 if problems else 0


def failures(res: dict[str, Any]) -> list[str]:
    """What makes a run fail: a peer that ran on no data or measured nothing (its row would be empty),
    and the utility experiment's error. A peer that could not be installed is reported, not failed."""
    out = []
    for peer, doc in (res.get("peers") or {}).items():
        if doc.get("skipped"):
            continue
        error = doc.get("error") or ""
        if error.startswith("no data") or (not error and not doc.get("results")):
            out.append(f"peer {peer} ran on no data: {error or 'it returned no measurement'}")
    for name, doc in (res.get("utility") or {}).items():
        if isinstance(doc, dict) and doc.get("error"):
            out.append(f"utility ({name}): {doc['error']}")
    return out


if __name__ == "__main__":
    sys.exit(main())
