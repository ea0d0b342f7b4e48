"""Noise throughput: OpenDP's discrete Gaussian (and discrete Laplace) through dpgate.mechanisms.

    python -m bench.noise_bench [--cells 10,1000,100000] [--runs 5]

For each vector length n, times ``calibrate`` (σ from ρ, checked against
OpenDP's privacy map) and ``sample`` (one OpenDP measurement invoked on the
whole vector, cut into parallel slices above 8,192 cells) on an int64 vector
of counts, median of ``--runs`` runs. ρ = 0.01 per release at L2 sensitivity
1 (σ ≈ 7.07) for the Gaussian; ε = 0.1 at L1 sensitivity 1 for the Laplace.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from dpgate.mechanisms import calibrate, sample

#: Vector lengths of the standard run.
CELLS = (10, 1_000, 100_000)


def measure(cells: tuple[int, ...] = CELLS, runs: int = 5) -> list[dict]:
    """Median calibration and sampling times (ms) per length and mechanism."""
    out = []
    for mech, budget in (("gaussian", {"rho": 0.01}), ("laplace", {"epsilon": 0.1})):
        for n in cells:
            values = {"n": np.full(n, 1000, dtype=np.int64)}
            cal_ms, sample_ms = [], []
            for _ in range(runs + 1):  # first run is a warm-up
                t = time.perf_counter()
                cal = calibrate({"n": (1.0, 1.0)}, mechanism=mech, **budget)
                c = (time.perf_counter() - t) * 1e3
                t = time.perf_counter()
                noisy = sample(cal, values)
                s = (time.perf_counter() - t) * 1e3
                cal_ms.append(c)
                sample_ms.append(s)
            assert noisy["n"].shape == (n,)
            out.append({"mechanism": cal.mechanism, "cells": n, "scale": cal.scales["n"],
                        "calibrate_ms": statistics.median(cal_ms[1:]), "sample_ms": statistics.median(sample_ms[1:]),
                        "cells_per_s": n / (statistics.median(sample_ms[1:]) / 1e3),
                        "empirical_std": float(np.std(noisy["n"] - 1000)) if n >= 1000 else None})
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: print the results as JSON."""
    ap = argparse.ArgumentParser(prog="python -m bench.noise_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default=",".join(map(str, CELLS)))
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    print(json.dumps(measure(tuple(int(c) for c in args.cells.split(",")), args.runs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
