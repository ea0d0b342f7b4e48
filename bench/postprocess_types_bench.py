"""Typed post-processing (casts, ROUND/TRUNC digits, LOG10) over 100,000 released rows.

Prints the best of 5 runs per expression, in ms. To compare with another checkout, run this
script alternately under each (``PYTHONPATH=<other>/src python bench/postprocess_types_bench.py``
then ``python bench/postprocess_types_bench.py``, twice), so both see the same machine load.
"""

from __future__ import annotations

import time

import numpy as np

from dpgate.postprocess import evaluate

EXPRESSIONS = ["ROUND(x, 2)", "CAST(x AS INTEGER)", "TRY_CAST(x AS DECIMAL(10,2))", "ROUND(c, -2)", "LOG10(x)"]


def main(rows: int = 100_000, runs: int = 5) -> None:
    """Time each expression of :data:`EXPRESSIONS` over ``rows`` noisy floats ``x`` and ints ``c``."""
    rng = np.random.default_rng(0)
    cells = {"x": rng.normal(1000, 300, rows), "c": np.round(rng.normal(5000, 100, rows)).astype(np.int64)}
    out = []
    for e in EXPRESSIONS:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            evaluate(e, cells)
            times.append(time.perf_counter() - t0)
        out.append(f"{e}={min(times) * 1e3:.2f}ms")
    print(" ".join(out))


if __name__ == "__main__":
    main()
