"""The engines' statement watchdog (src/dpgate/engines/watchdog.py): one timer thread, exact semantics."""

from __future__ import annotations

import threading
import time

import pytest

from dpgate.engines.watchdog import Watchdog


def test_a_deadline_fires_once_and_a_disarmed_one_never():
    w = Watchdog()
    fired: list[str] = []
    done = threading.Event()
    w.arm(0.05, lambda: (fired.append("late"), done.set()))
    early = w.arm(0.01, lambda: fired.append("cancelled"))
    assert w.disarm(early) is True
    assert done.wait(2.0)
    time.sleep(0.05)
    assert fired == ["late"]
    w.close()


def test_an_earlier_deadline_armed_later_wakes_the_thread():
    w = Watchdog()
    order: list[int] = []
    both = threading.Event()
    w.arm(1.0, lambda: (order.append(2), both.set()))
    t0 = time.monotonic()
    first = threading.Event()
    w.arm(0.02, lambda: (order.append(1), first.set()))
    assert first.wait(0.8), "the thread kept sleeping until the later deadline"
    assert time.monotonic() - t0 < 0.8
    assert both.wait(2.0)
    assert order == [1, 2]
    w.close()


def test_disarm_after_firing_says_so_and_close_stops_everything():
    w = Watchdog()
    ran = threading.Event()
    token = w.arm(0.0, ran.set)
    assert ran.wait(2.0)
    assert w.disarm(token) is False
    pending = threading.Event()
    w.arm(0.05, pending.set)
    w.close()
    assert not pending.wait(0.2)
    with pytest.raises(RuntimeError):
        w.arm(0.1, lambda: None)


def test_no_thread_before_the_first_deadline():
    before = {t.name for t in threading.enumerate()}
    w = Watchdog(name="dpgate-watchdog-test-idle")
    assert "dpgate-watchdog-test-idle" not in {t.name for t in threading.enumerate()} - before
    w.close()


def test_a_failing_callback_does_not_stop_the_watchdog():
    w = Watchdog()
    ok = threading.Event()

    def boom() -> None:
        raise RuntimeError("interrupt of a closed cursor")

    w.arm(0.0, boom)
    w.arm(0.02, ok.set)
    assert ok.wait(2.0)
    w.close()
