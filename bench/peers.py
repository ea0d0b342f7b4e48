"""Peer DP tools on the same data and queries: SmartNoise SQL, Tumult Analytics, PipelineDP.

Each peer runs in its own virtual environment under ``bench/.venvs/<peer>``
(created with ``python -m venv`` and installed from PyPI with pip on first use,
so its dependencies never meet the gateway's), executing
``bench/peer_<peer>.py SPEC.json OUT.json``. The spec names the Parquet files
written by :mod:`bench.datagen`, the privacy unit, group key, value column and
bounds from the same policies the gateway uses, the queries of
:data:`bench.latency.QUERIES`, the per-query (ε, δ) (and ρ for Tumult) and the
utility experiment (52 weekly count releases under one total (ε, δ)). If a
peer cannot be installed or fails, its result says why instead of a number.

    python -m bench.peers --peer pipelinedp --data bench/.data/rows_100k
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.latency import QUERIES, QUERY_DELTA, QUERY_EPSILON, columns_of, queries_of, query_rho

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / "bench" / ".venvs"

#: peer → (pip requirements, runner script, import name checked after install).
PEERS: dict[str, tuple[list[str], str, str]] = {
    "smartnoise": (["smartnoise-sql>=1.0,<1.1", "pandas", "pyarrow"], "peer_smartnoise.py", "snsql"),
    "tumult": (["tmlt.analytics", "pandas", "pyarrow"], "peer_tumult.py", "tmlt.analytics"),
    "pipelinedp": (["pipeline-dp", "dp-accounting", "pyarrow"], "peer_pipelinedp.py", "pipeline_dp"),
}
#: Seconds allowed for installing one peer.
INSTALL_TIMEOUT_S = 900


def _say(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def venv_python(peer: str) -> Path:
    """The interpreter of ``peer``'s virtual environment (may not exist yet)."""
    return VENVS / peer / "bin" / "python"


def ensure_peer(peer: str, *, install: bool = True) -> tuple[Path | None, str | None]:
    """Return (python, None) if ``peer`` is importable in its venv, else (None, why not).

    Creates the venv and pip-installs the peer's requirements when ``install``
    is true and the import fails (bounded by :data:`INSTALL_TIMEOUT_S`).
    """
    reqs, _, module = PEERS[peer]
    py = venv_python(peer)

    def importable() -> bool:
        if not py.exists():
            return False
        r = subprocess.run([str(py), "-c", f"import {module}"], capture_output=True, timeout=300)
        return r.returncode == 0

    if importable():
        return py, None
    if not install:
        return None, f"{peer} is not installed in {py.parent.parent} (run without --no-install)"
    _say(f"installing {peer} into {py.parent.parent} (one time, about 2 minutes)")
    try:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(py.parent.parent)], check=True, capture_output=True,
                           timeout=300)
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", *reqs], capture_output=True, text=True,
                           timeout=INSTALL_TIMEOUT_S)
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"installing {peer} failed: {type(exc).__name__}: {exc}"[:400]
    if r.returncode != 0 or not importable():
        tail = " ".join(line for line in (r.stderr or "").splitlines()[-5:] if "WARNING: Location" not in line)
        return None, f"pip install {' '.join(reqs)} failed (exit {r.returncode}): {tail}"[:600]
    return py, None


def dataset_spec(data: Path, *, ks: tuple[int, ...] = (1,), queries: tuple[str, ...] = tuple(QUERIES)) -> list[dict]:
    """Peer data set entries for a ``bench.datagen`` folder: one per k (synthetic) or one (PUMS)."""
    manifest = json.loads((data / "manifest.json").read_text())
    kind = manifest["kind"]
    cols = columns_of(kind)
    if kind == "pums":
        return [{"name": manifest["dataset"], "kind": kind, "path": str((data / "pums.parquet").resolve()),
                 "rows": manifest["rows"], "units": manifest["units"],
                 "k": int(manifest.get("max_groups_per_unit", 1)), "m": int(manifest.get("max_rows_per_unit", 1)),
                 "lower": 0.0,
                 "upper": 500000.0, "keys": list(range(1, 17)), "unit": cols["unit"], "key": cols["key"],
                 "x": cols["x"], "key2": cols["key2"], "queries": list(queries_of(kind, queries))}]
    return [{"name": f"{manifest['dataset']}_k{k}", "kind": kind, "path": str((data / "events.parquet").resolve()),
             "rows": manifest["rows"], "units": manifest["units"], "k": k,
             "m": int(manifest.get("max_rows_per_unit", 5)), "lower": manifest["lower"], "upper": manifest["upper"],
             "keys": list(range(manifest["keys"])), "unit": cols["unit"], "key": cols["key"], "x": cols["x"],
             "queries": list(queries_of(kind, queries))} for k in ks]


def utility_spec(pums: Path, *, weeks: int = 52, run_weeks: int = 52, epsilon: float = 4.0,
                 delta: float = 1e-6) -> dict[str, Any]:
    """The utility experiment on a PUMS folder: ``weeks`` count releases by ``educ`` under one (ε, δ).

    ``run_weeks`` of them are actually run (each with the per-release budget of
    a ``weeks``-release plan), which estimates the same RMSE with fewer runs.
    True counts come from the Parquet file.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    manifest = json.loads((pums / "manifest.json").read_text())
    t = pq.read_table(pums / "pums.parquet", columns=["educ"])
    vc = pc.value_counts(t.column("educ")).to_pylist()
    true = {int(d["values"]): int(d["counts"]) for d in vc}
    keys = list(range(1, 17))
    return {"path": str((pums / "pums.parquet").resolve()), "unit": "pid", "key": "educ", "keys": keys,
            "rows": manifest["rows"], "true": {str(k): true.get(k, 0) for k in keys}, "weeks": weeks,
            "run_weeks": run_weeks, "epsilon": epsilon, "delta": delta}


def run_peer(peer: str, datasets: list[dict], *, runs: int, utility: dict | None = None, install: bool = True,
             timeout_s: float = 3600.0) -> dict[str, Any]:
    """Run ``peer`` on ``datasets`` (see :func:`dataset_spec`); return its JSON result or ``{"error": …}``."""
    t0 = time.perf_counter()
    if not datasets:
        return {"peer": peer, "error": "no data: the peer was given no data set"}
    py, why = ensure_peer(peer, install=install)
    if py is None:
        return {"peer": peer, "error": why}
    spec = {"datasets": datasets, "runs": runs, "epsilon": QUERY_EPSILON, "delta": QUERY_DELTA, "rho": query_rho(),
            "utility": utility}
    with tempfile.TemporaryDirectory(prefix=f"dpgate-peer-{peer}-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, PYSPARK_PYTHON=str(py), PYSPARK_DRIVER_PYTHON=str(py), SPARK_LOCAL_IP="127.0.0.1",
                   PYTHONWARNINGS="ignore")
        _say(f"running {peer} on {', '.join(d['name'] for d in datasets)} ({runs} runs per query)")
        try:
            r = subprocess.run([str(py), str(ROOT / "bench" / PEERS[peer][1]), str(spec_path), str(out_path)],
                               capture_output=True, text=True, timeout=timeout_s, env=env, cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"peer": peer, "error": f"did not finish within {timeout_s:.0f} s"}
        if r.returncode != 0 or not out_path.exists():
            tail = " | ".join((r.stderr or "").strip().splitlines()[-6:])
            return {"peer": peer, "error": f"runner exited {r.returncode}: {tail}"[:800]}
        out = json.loads(out_path.read_text())
    out["wall_s"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: run one peer and print its JSON result."""
    ap = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", choices=sorted(PEERS), required=True)
    ap.add_argument("--data", type=Path, action="append", required=True)
    ap.add_argument("--ks", default="1")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--utility", type=Path, help="a PUMS folder for the 52-release utility experiment")
    ap.add_argument("--run-weeks", type=int, default=52)
    ap.add_argument("--no-install", action="store_true")
    args = ap.parse_args(argv)
    ds = [d for folder in args.data for d in dataset_spec(folder, ks=tuple(int(k) for k in args.ks.split(",")))]
    util = utility_spec(args.utility, run_weeks=args.run_weeks) if args.utility else None
    print(json.dumps(run_peer(args.peer, ds, runs=args.runs, utility=util, install=not args.no_install), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
