"""Ledger throughput: charges per second on SQLite, from one process and from several.

Usage::

    python bench/ledger_bench.py [--charges N] [--processes P] [--synchronous full|normal]
                                 [--dir DIR]

Each run makes a fresh ledger in a temporary folder (or ``--dir``), one population with a
budget no run can exhaust, and times N charges of ``Cost.zcdp(1e-6)`` (the zCDP filter
path), N/4 charges of ``Cost.pure(1e-4)`` (the Rényi filter path, one process), then N
charges split over P processes started together (each charge is one ``BEGIN IMMEDIATE``
transaction, committed with the chosen ``synchronous`` level), then ``spend()`` and
``verify()`` on the result. Prints a table. Not a test: timings depend on the disk's
fsync latency (``synchronous=full``, the default, fsyncs every commit).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from dpgate.accounting import Cost  # noqa: E402
from dpgate.ledger import open_ledger  # noqa: E402


def _worker(url: str, n: int, barrier, queue) -> None:
    led = open_ledger(url)
    cost = Cost.zcdp(1e-6)
    barrier.wait()
    t0 = time.perf_counter()
    for _ in range(n):
        led.charge("bench", "c", cost, purpose="bench")
    queue.put((t0, time.perf_counter()))
    led.close()


def _fresh(folder: Path, name: str, sync: str) -> str:
    url = f"sqlite:///{folder / name}?synchronous={sync}"
    led = open_ledger(url)
    led.ensure_population("bench", rho_cap=1e9, delta=1e-6, allocations={})
    led.charge("bench", "c", Cost.zcdp(1e-6), purpose="warm-up")  # caches, first fsync
    led.close()
    return url


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--charges", type=int, default=4000, help="charges per run (default 4000)")
    ap.add_argument("--processes", type=int, default=8, help="processes of the parallel run (default 8)")
    ap.add_argument("--synchronous", default="full", choices=["full", "normal", "off"],
                    help="SQLite synchronous level (default full: durable on power loss)")
    ap.add_argument("--dir", help="folder for the database files (default: a temporary folder)")
    args = ap.parse_args(argv)
    folder = Path(args.dir or tempfile.mkdtemp(prefix="dpgate-ledger-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        # one process, zCDP filter
        url = _fresh(folder, "one.sqlite", args.synchronous)
        led = open_ledger(url)
        cost = Cost.zcdp(1e-6)
        t0 = time.perf_counter()
        for _ in range(args.charges):
            led.charge("bench", "c", cost, purpose="bench")
        dt = time.perf_counter() - t0
        rows.append(("1 process, zCDP", args.charges, dt))
        # one process, Rényi filter (RDP curves)
        pure = Cost.pure(1e-4)
        n_rdp = max(1, args.charges // 4)
        t0 = time.perf_counter()
        for _ in range(n_rdp):
            led.charge("bench", "c", pure, purpose="bench")
        rows.append(("1 process, RDP curve", n_rdp, time.perf_counter() - t0))
        t0 = time.perf_counter()
        led.spend("bench")
        t_spend = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = led.verify()
        t_verify = time.perf_counter() - t0
        assert report.ok, report.problems
        led.close()

        # P processes
        url = _fresh(folder, "many.sqlite", args.synchronous)
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        barrier = ctx.Barrier(args.processes)
        queue = ctx.Queue()
        per = args.charges // args.processes
        procs = [ctx.Process(target=_worker, args=(url, per, barrier, queue)) for _ in range(args.processes)]
        for p in procs:
            p.start()
        spans = [queue.get() for _ in procs]
        for p in procs:
            p.join()
        start = min(s for s, _ in spans)
        end = max(e for _, e in spans)
        rows.append((f"{args.processes} processes, zCDP", per * args.processes, end - start))
        led = open_ledger(url)
        assert led.spend("bench").charges == per * args.processes + 1
        led.close()
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)

    print(f"SQLite ledger, synchronous={args.synchronous}, {os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}")
    print(f"{'run':<24} {'charges':>8} {'seconds':>8} {'charges/s':>10}")
    for name, n, dt in rows:
        print(f"{name:<24} {n:>8} {dt:>8.2f} {n / dt:>10.0f}")
    print(f"spend() on {report.charges} charges: {t_spend * 1e3:.2f} ms; "
          f"verify(): {t_verify:.2f} s ({report.entries / t_verify:.0f} entries/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
