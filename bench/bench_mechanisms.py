"""Benchmark: wall time of the noise step (dpgate.mechanisms.sample) by vector size.

Run: ``.venv/bin/python bench/bench_mechanisms.py`` (prints a table; not a test).
One primitive per call, best of 3 runs, scale 100 in integer units.
"""

from __future__ import annotations

import time

import numpy as np

from dpgate.mechanisms import calibrate, sample


def main() -> None:
    """Print the best-of-3 wall time of sample() for 10, 1,000 and 100,000 cells per mechanism."""
    print(f"{'mechanism':<18} {'cells':>8} {'best of 3 (ms)':>15}")
    for mech in ("gaussian", "laplace"):
        cal = calibrate({"p0": (1.0, 1.0)}, mechanism=mech, scales={"p0": 100.0})
        for n in (10, 1_000, 100_000):
            values = {"p0": np.arange(n, dtype=np.int64)}
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                sample(cal, values)
                best = min(best, time.perf_counter() - start)
            print(f"{cal.mechanism:<18} {n:>8} {best * 1e3:>15.1f}")


if __name__ == "__main__":
    main()
