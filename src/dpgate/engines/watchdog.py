"""Deadlines for running statements: one timer thread per engine instead of one per statement.

``threading.Timer`` starts a new OS thread for every statement; on a 2-core machine under load
that start alone measured ~2 ms of a fast-path query's ~17 ms (``python -m bench.overhead
--profile 60``). :class:`Watchdog` keeps one daemon thread (started on the first
:meth:`Watchdog.arm`, never at import) that sleeps until the earliest deadline and calls its
callback unless it was disarmed first.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from typing import Callable

__all__ = ["Watchdog"]


class Watchdog:
    """Calls ``callback()`` once ``timeout_s`` seconds after :meth:`arm` unless :meth:`disarm` came first.

    Thread-safe; callbacks run on the watchdog's own thread and must be quick (an interrupt).
    :meth:`close` stops the thread (idempotent); arming a closed watchdog raises RuntimeError.
    """

    def __init__(self, name: str = "dpgate-watchdog") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._armed: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def arm(self, timeout_s: float, callback: Callable[[], None]) -> int:
        """Schedule ``callback`` in ``timeout_s`` seconds (monotonic clock); returns a token for :meth:`disarm`."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the watchdog is closed")
            token = next(self._ids)
            heapq.heappush(self._heap, (time.monotonic() + timeout_s, token, callback))
            self._armed.add(token)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            elif self._heap[0][1] == token:
                self._cond.notify()  # the new deadline is the earliest: wake the thread to re-sleep
            return token

    def disarm(self, token: int) -> bool:
        """Cancel a scheduled callback; True if it had not run (it never will), False if it already ran."""
        with self._cond:
            if token in self._armed:
                self._armed.discard(token)
                return True
            return False

    def close(self) -> None:
        """Stop the thread; pending callbacks never run."""
        with self._cond:
            self._closed = True
            self._armed.clear()
            self._heap.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    # drop disarmed entries at the top so they do not hold the sleep
                    while self._heap and self._heap[0][1] not in self._armed:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                    else:
                        self._cond.wait(max(0.0, self._heap[0][0] - time.monotonic()))
                if self._closed:
                    return
                _, token, callback = heapq.heappop(self._heap)
                due = token in self._armed
                self._armed.discard(token)
            if due:
                try:
                    callback()
                except Exception:  # noqa: BLE001 - an interrupt that fails must not stop the watchdog
                    pass
