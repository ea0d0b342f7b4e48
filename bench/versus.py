"""The gateway vs one peer on one data set, in rounds, as ratios measured in one run.

    python -m bench.versus --data bench/.data/pums_1m2 --peer smartnoise --rounds 3

Each round times the gateway in this process (:func:`bench.latency.measure`: ``Gateway.query``
end to end, every run charged, release cache missed; the bounded SQL as the gateway runs it
and, where the unit-unique fast path applies, in its general form too) and then the peer in
its own venv (:func:`bench.peers.run_peer`, same queries, same ε, δ). The ratio of a query in
a round is the peer's median over the gateway's median of that round, so a load change on
the shared machine between rounds moves both sides of a ratio alike; the report gives each
round's ratio and their median. Prints JSON (``--json FILE`` writes it too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import latency, peers


def _load() -> list[float]:
    try:
        return [round(x, 1) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return []


def run(data: Path, peer: str, *, rounds: int, runs: int, peer_runs: int) -> dict[str, Any]:
    """Alternate gateway and peer measurements ``rounds`` times; return per-round figures and ratios."""
    spec = peers.dataset_spec(data)
    out: dict[str, Any] = {"data": str(data), "peer": peer, "rounds": [], "load_average": {"start": _load()}}
    for r in range(rounds):
        t0 = time.perf_counter()
        gw = latency.measure(data, runs=runs)
        pr = peers.run_peer(peer, spec, runs=peer_runs)
        if "error" in pr:
            raise SystemExit(f"{peer}: {pr['error']}")
        rnd: dict[str, Any] = {"load_average": _load(), "wall_s": round(time.perf_counter() - t0, 1),
                               "peer_version": pr.get("version"), "queries": {}}
        for key, g in gw["results"].items():
            p = pr["results"].get(key)
            if p is None:
                continue
            med = g["median_ms"]
            rnd["queries"][key] = {
                "gateway_ms": round(med["gateway"], 1), "bounded_ms": round(med["bounded"], 1),
                "bounded_general_ms": round(med["bounded_general"], 1) if "bounded_general" in med else None,
                "per_unit_ms": round(med["per_unit"], 1), "raw_ms": round(med["raw"], 1),
                "unit_unique": g.get("unit_unique"), "peer_ms": round(p["median_s"] * 1e3, 1),
                "peer_over_gateway": round(p["median_s"] * 1e3 / med["gateway"], 1),
            }
        out["rounds"].append(rnd)
        print(f"[versus] round {r + 1}/{rounds}: " + ", ".join(
            f"{k.split('/')[-1]} {v['peer_over_gateway']}×" for k, v in rnd["queries"].items()), file=sys.stderr)
    keys = list(out["rounds"][0]["queries"])
    out["median_ratio"] = {k: statistics.median(rd["queries"][k]["peer_over_gateway"] for rd in out["rounds"])
                           for k in keys}
    out["load_average"]["end"] = _load()
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    ap = argparse.ArgumentParser(prog="python -m bench.versus", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a bench.datagen folder (e.g. bench/.data/pums_1m2)")
    ap.add_argument("--peer", choices=sorted(peers.PEERS), default="smartnoise")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5, help="gateway runs per query and round (after a warm-up)")
    ap.add_argument("--peer-runs", type=int, default=3, help="peer runs per query and round")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    res = run(args.data, args.peer, rounds=args.rounds, runs=args.runs, peer_runs=args.peer_runs)
    text = json.dumps(res, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
