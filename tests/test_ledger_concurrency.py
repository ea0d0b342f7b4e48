"""Concurrency and crash safety of the SQLite ledger: several processes and threads charging
one population at once, and a process killed with SIGKILL in the middle of a charge loop."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time


from dpgate.accounting import Cost
from dpgate.errors import BudgetExhausted
from dpgate.ledger import open_ledger
from dpgate.ledger.base import BudgetCurve, CapSpec, Totals

DELTA = 1e-6


def _charge_worker(url: str, n: int, barrier, results) -> None:
    """Child process: wait for every sibling, then try ``n`` charges of ρ = 0.001."""
    led = open_ledger(url)
    accepted = refused = 0
    barrier.wait()
    for _ in range(n):
        try:
            led.charge("p", "a", Cost.zcdp(0.001), purpose="concurrency test")
            accepted += 1
        except BudgetExhausted:
            refused += 1
    led.close()
    results.put((accepted, refused))


def test_processes_charge_exactly_the_budget(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    led = open_ledger(url)
    led.ensure_population("p", rho_cap=0.1, delta=DELTA, allocations={"a": 1.0})  # admits exactly 100
    led.close()
    # fork (where available) starts the children in milliseconds; the parent has closed its
    # ledger, and each child opens its own connections. Elsewhere: spawn.
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    barrier = ctx.Barrier(8)
    results = ctx.Queue()
    procs = [ctx.Process(target=_charge_worker, args=(url, 50, barrier, results)) for _ in range(8)]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(a for a, _ in out) == 100
    assert sum(r for _, r in out) == 300
    led = open_ledger(url)
    rep = led.spend("p")
    assert rep.spent_rho == 0.1 and rep.charges == 100 and rep.remaining_rho == 0.0
    assert len(led.entries()) == 100
    assert led.verify().ok
    led.close()


def threads_asking_half_the_cap(led) -> None:
    """8 threads each ask for half of a ρ_cap = 0.5 budget at once: exactly 2 succeed.

    Shared by the SQLite test below and the PostgreSQL one (tests/test_ledger_postgres.py).
    """
    led.ensure_population("p", rho_cap=0.5, delta=DELTA, allocations={})
    barrier = threading.Barrier(8)
    outcomes: list[bool] = []
    lock = threading.Lock()

    def go(i: int) -> None:
        barrier.wait()
        try:
            led.charge("p", f"t{i}", Cost.zcdp(0.25), purpose="half the cap")
            ok = True
        except BudgetExhausted:
            ok = False
        with lock:
            outcomes.append(ok)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == [False] * 6 + [True] * 2
    assert led.spend("p").spent_rho == 0.5
    assert led.verify().ok


def test_threads_asking_half_the_cap(tmp_path):
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    threads_asking_half_the_cap(led)
    led.close()


_LOOP = textwrap.dedent(
    """
    import sys
    from dpgate.accounting import Cost
    from dpgate.ledger import open_ledger
    led = open_ledger(sys.argv[1])
    i = 0
    while True:
        cost = Cost.zcdp(1e-6 * (1 + i % 7)) if i % 5 else Cost.pure(1e-4)
        led.charge("p", "a", cost, purpose="crash test", metadata={"i": i})
        i += 1
    """
)


def test_sigkill_mid_charge_loop_leaves_a_consistent_ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    led = open_ledger(url)
    led.ensure_population("p", epsilon=50.0, delta=DELTA, allocations={"a": 1.0})
    led.close()
    env = dict(os.environ)
    last = 0
    for round_ in range(3):
        procs = [subprocess.Popen([sys.executable, "-c", _LOOP, url], env=env) for _ in range(2)]
        try:
            reader = open_ledger(url)
            deadline = time.monotonic() + 60
            while len(reader.entries(limit=10_000)) < last + 40:  # let them commit some charges
                assert time.monotonic() < deadline, "the charging subprocesses made no progress"
                assert all(p.poll() is None for p in procs), "a charging subprocess died"
                time.sleep(0.05)
            reader.close()
        finally:
            for p in procs:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        assert all(p.returncode == -signal.SIGKILL for p in procs)
        led = open_ledger(url)
        report = led.verify()
        assert report.ok, report.problems
        entries = led.entries()
        assert len(entries) > last
        last = len(entries)
        rep = led.spend("p")
        assert rep.charges == len(entries) == report.charges
        assert rep.consumers["a"].charges == len(entries)
        # the spend equals what the committed entries add up to, exactly
        totals = Totals()
        for e in entries:
            totals = totals.add(Cost.from_dict(e["cost"]))
        assert totals.rho_value == math.fsum(e["rho"] for e in entries if e["kind"] == "zcdp")
        cap = led.events("p")[0]["new"]["cap"]
        assert rep.spent_rho == totals.rho_equivalent(BudgetCurve.of(CapSpec.from_dict(cap)))
        led.close()
