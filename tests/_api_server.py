"""Test support for the HTTP API tests: a real uvicorn server on loopback around the real app.

Not a test module (leading underscore). Nothing here is mocked: the app is
``dpgate.api.create_app(settings)`` and its lifespan opens the real
``Gateway`` (policies, DuckDB, SQLite ledger, OpenDP) on a temporary project.
"""

from __future__ import annotations

import atexit
import math
import queue
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from scipy.optimize import brentq, minimize_scalar

REPO = Path(__file__).resolve().parents[1]


#: The sample data, generated once per test process and copied into each project (it is
#: deterministic: ``dpgate.sample_data`` gives byte-identical files for its defaults).
_SAMPLE_ROOT: Path | None = None


def _sample_root() -> Path:
    global _SAMPLE_ROOT
    if _SAMPLE_ROOT is None:
        from dpgate.sample_data import ensure_sample_data

        root = Path(tempfile.mkdtemp(prefix="dpgate-test-sample-"))
        atexit.register(shutil.rmtree, root, True)
        ensure_sample_data(root)
        _SAMPLE_ROOT = root
    return _SAMPLE_ROOT


def make_project(root: Path) -> Path:
    """A temporary project: ``policies/usage.toml`` copied from the repo and the sample data
    (a copy of this process's one generated set, :func:`_sample_root`)."""
    from dpgate.sample_data import SAMPLE_DIR, ensure_sample_data

    (root / "policies").mkdir(parents=True)
    shutil.copy(REPO / "policies" / "usage.toml", root / "policies" / "usage.toml")
    shutil.copytree(_sample_root() / SAMPLE_DIR, root / SAMPLE_DIR)
    ensure_sample_data(root)  # both files are there: nothing is generated
    return root


class LiveServer:
    """Run an ASGI app with uvicorn on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, app, *, startup_timeout_s: float = 120.0) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # log_config=None: uvicorn's default config binds its log handlers to the sys.stderr/stdout
        # of the moment, which inside a capsys test is that test's capture; closed after the test,
        # every later uvicorn log line in the process failed with "I/O operation on closed file".
        # Without it uvicorn's loggers propagate to the root logger (pytest's log capture).
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", log_config=None))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.startup_timeout_s = startup_timeout_s

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start in time")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def client(self, key: str | None = None, *, header: str = "bearer") -> httpx.Client:
        """An httpx client for the server, sending ``key`` as a bearer token or ``X-API-Key``."""
        headers = {}
        if key is not None:
            headers = {"Authorization": f"Bearer {key}"} if header == "bearer" else {"X-API-Key": key}
        return httpx.Client(base_url=self.url, headers=headers, timeout=120.0)


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    """Check the one documented error shape; return ``details``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["details"], dict)
    assert "Traceback" not in response.text
    return body["error"]["details"]


# --- independent privacy oracles (no dpgate code) ------------------------------------------


def cks_epsilon(rho: float, delta: float) -> float:
    """ε of ρ-zCDP at δ by Canonne, Kamath & Steinke 2020, Cor. 13, minimised numerically.

    ε = inf_{α>1} αρ + (log(1/δ) + (α−1)·log(1 − 1/α) − log α)/(α − 1); minimised over
    t = log(α − 1) with scipy (the objective is unimodal in α).
    """
    L = math.log(1.0 / delta)

    def f(t: float) -> float:
        a = 1.0 + math.exp(t)
        return a * rho + (L + (a - 1.0) * math.log1p(-1.0 / a) - math.log(a)) / (a - 1.0)

    res = minimize_scalar(f, bounds=(-20.0, 20.0), method="bounded", options={"xatol": 1e-12})
    return float(res.fun)


def rho_cap_oracle(epsilon: float, delta: float) -> float:
    """ρ_cap of a cap (ε, δ) by the ledger's published rule (DESIGN.md, Accounting): the largest
    ρ whose RDP value α·ρ converts to ε at one order α of the ledger's grid, maximised over
    the grid's orders. The conversion at each order is dp-accounting's (an independent oracle);
    the root is found by bisection."""
    import math

    from dp_accounting.rdp import rdp_privacy_accountant as oracle

    from dpgate.accounting import ORDERS

    best = 0.0
    for alpha in (a for a in ORDERS if math.isfinite(a)):
        conv = lambda r: oracle.compute_epsilon([alpha], [alpha * r], delta)[0] - epsilon  # noqa: E731
        if conv(1e-12) >= 0:
            continue
        best = max(best, brentq(conv, 1e-12, 100.0, xtol=1e-15, rtol=1e-13))
    return best


# --- `dpgate serve` as a subprocess ----------------------------------------------------------

ANALYST_KEY_RE = r"^\s*analyst\s+\S+\s+consumer=\S+\s+(dpg_[0-9a-f]{12}_[A-Za-z0-9_-]+)\s*$"


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (small race until the server binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """``dpgate serve`` in a child process; collects its output lines in a background thread."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self._queue: "queue.Queue[str | None]" = queue.Queue()
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for_line(self, pattern: str, timeout_s: float) -> "re.Match[str]":
        """Block until an output line matches ``pattern`` (regex); raise with the output otherwise."""
        regex = re.compile(pattern)
        for line in self.lines:
            if m := regex.search(line):
                return m
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if m := regex.search(line):
                return m
        raise AssertionError(f"no line matching {pattern!r}; output so far:\n" + "\n".join(self.lines))

    def stop(self, timeout_s: float = 30.0) -> int:
        """Ask the server to stop (SIGTERM, then SIGKILL after ``timeout_s``); return its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        while not self._queue.empty():
            line = self._queue.get_nowait()
            if line is not None:
                self.lines.append(line)
        return self.proc.returncode


def wait_healthy(url: str, timeout_s: float, proc: ServeProcess | None = None) -> None:
    """Poll ``GET url/healthz`` until it answers 200 (bounded by ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError("the server exited:\n" + "\n".join(proc.lines))
        try:
            if httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url}/healthz did not answer within {timeout_s}s")
