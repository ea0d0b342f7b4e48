"""HTTP latency and throughput: the real app under uvicorn vs a bare FastAPI endpoint.

    python -m bench.http_bench --data bench/.data/rows_100k [--requests 2000] [--seconds 20]

Starts, each in its own subprocess on 127.0.0.1 (a free port, loopback only):

* the gateway: ``dpgate.api.app.create_app(Settings(...))`` under uvicorn (one
  worker, as ``dpgate serve`` runs it), on a temporary project whose policy
  reads the given ``bench.datagen`` folder, with an analyst key created through
  :class:`dpgate.auth.KeyStore`;
* a bare FastAPI app with one ``GET /v1/releases/{id}`` route returning the
  same release JSON from memory (no auth, no store).

Then, with an ``httpx`` load generator in this process (bounded by a request
count and a time limit):

1. cached release fetch, ``GET /v1/releases/{id}`` with the API key:
   sequential (latency p50/p99) and with ``--concurrency`` clients
   (throughput), against both servers;
2. new queries, ``POST /v1/queries`` with a distinct budget each (a cache
   miss, charged): sequential latency p50/p99 and throughput.

Prints JSON. The load generator shares the 2 CPUs with the server, so
throughput is a lower bound for a separate client machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.latency import analyst_sql, query_rho, write_policies

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_gateway(policies: str, home: str, port: int) -> None:
    import uvicorn

    from dpgate.api.app import create_app
    from dpgate.settings import Settings

    settings = Settings(policies=Path(policies), home=Path(home), host="127.0.0.1", port=port)
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _serve_bare(payload: str, port: int) -> None:
    import uvicorn
    from fastapi import FastAPI

    body = json.loads(Path(payload).read_text())
    app = FastAPI()

    @app.get("/v1/releases/{release_id}")
    def get_release(release_id: str) -> dict[str, Any]:
        return body

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


class Server:
    """A server subprocess (``python -m bench.http_bench --serve …``) on 127.0.0.1; stopped on exit."""

    def __init__(self, args: list[str], port: int, cwd: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.http_bench", "--serve", *args, "--port", str(port)],
                                     cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(cwd / f"server-{port}.log", "w"),
                                     env=dict(os.environ))

    def wait(self, path: str, timeout_s: float = 300.0) -> None:
        """Wait until ``GET path`` answers (any status below 500)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + path, timeout=2.0).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("server did not start")

    def stop(self) -> None:
        """Terminate the subprocess (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def _summary(lat_s: list[float], wall_s: float, errors: int) -> dict[str, Any]:
    ms = [v * 1e3 for v in lat_s]
    return {"requests": len(ms), "errors": errors, "p50_ms": statistics.median(ms) if ms else None,
            "p99_ms": _pct(ms, 0.99) if ms else None, "throughput_rps": len(ms) / wall_s if wall_s else None,
            "seconds": wall_s}


async def _load(url: str, *, requests: int, seconds: float, concurrency: int, headers: dict[str, str],
                method: str = "GET", bodies: list[dict] | None = None) -> dict[str, Any]:
    """Send at most ``requests`` requests for at most ``seconds`` with ``concurrency`` workers."""
    lat: list[float] = []
    errors = 0
    counter = iter(range(requests))
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=120.0) as client:
        async def worker() -> None:
            nonlocal errors
            for i in counter:
                if time.perf_counter() > deadline:
                    return
                t = time.perf_counter()
                if method == "GET":
                    r = await client.get(url)
                else:
                    r = await client.post(url, json=bodies[i % len(bodies)] if bodies else None)
                dt = time.perf_counter() - t
                if r.status_code == 200:
                    lat.append(dt)
                else:
                    errors += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return _summary(lat, wall, errors)


def measure(data: Path, *, requests: int = 2000, seconds: float = 20.0, concurrency: int = 8,
            new_queries: int = 20) -> dict[str, Any]:
    """Run both servers and the load phases (see the module docstring); return the results."""
    from dpgate.auth import KeyStore

    tmp = Path(tempfile.mkdtemp(prefix="dpgate-http-bench-"))
    servers: list[Server] = []
    try:
        entry = write_policies(data, tmp / "policies", (1,))[0]
        home = tmp / "home"
        home.mkdir()
        key, _ = KeyStore(home / "keys.json").add("bench-analyst", role="analyst", consumer="analysts")
        headers = {"Authorization": f"Bearer {key}"}
        gw = Server(["gateway", str(tmp / "policies"), str(home)], _free_port(), tmp)
        servers.append(gw)
        t0 = time.perf_counter()
        gw.wait("/healthz")
        startup_s = time.perf_counter() - t0
        sql = analyst_sql(entry["kind"], "count_avg")
        rho = query_rho()
        r = httpx.post(gw.url + "/v1/queries", headers=headers, timeout=120.0,
                       json={"dataset": entry["dataset"], "sql": sql, "budget": {"rho": rho}})
        r.raise_for_status()
        release = r.json()
        payload = tmp / "release.json"
        payload.write_text(json.dumps(release))
        bare = Server(["bare", str(payload)], _free_port(), tmp)
        servers.append(bare)
        bare.wait("/v1/releases/x")
        path = f"/v1/releases/{release['release_id']}"
        out: dict[str, Any] = {"data": str(data), "dataset": entry["dataset"], "sql": sql, "startup_s": startup_s,
                               "concurrency": concurrency, "release_bytes": len(r.content)}
        for name, srv in (("gateway_cached", gw), ("bare_fastapi", bare)):
            asyncio.run(_load(srv.url + path, requests=min(200, requests), seconds=5, concurrency=concurrency,
                              headers=headers))  # warm-up
            out[name] = {
                "sequential": asyncio.run(_load(srv.url + path, requests=max(1, requests // 4), seconds=seconds / 2,
                                                concurrency=1, headers=headers)),
                "concurrent": asyncio.run(_load(srv.url + path, requests=requests, seconds=seconds,
                                                concurrency=concurrency, headers=headers)),
            }
        bodies = [{"dataset": entry["dataset"], "sql": sql, "budget": {"rho": rho * (1 + (i + 1) * 1e-9)}}
                  for i in range(new_queries)]
        out["gateway_new_query"] = asyncio.run(_load(gw.url + "/v1/queries", requests=new_queries,
                                                     seconds=max(seconds, 60.0), concurrency=1, headers=headers,
                                                     method="POST", bodies=bodies))
        out["cached_over_bare_throughput"] = (out["gateway_cached"]["concurrent"]["throughput_rps"]
                                              / out["bare_fastapi"]["concurrent"]["throughput_rps"])
        return out
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (``--serve`` is the internal server mode)."""
    ap = argparse.ArgumentParser(prog="python -m bench.http_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--new-queries", type=int, default=20)
    args = ap.parse_args(argv)
    if args.serve:
        if args.serve[0] == "gateway":
            _serve_gateway(args.serve[1], args.serve[2], args.port)
        else:
            _serve_bare(args.serve[1], args.port)
        return 0
    if args.data is None:
        ap.error("--data is required")
    print(json.dumps(measure(args.data, requests=args.requests, seconds=args.seconds, concurrency=args.concurrency,
                             new_queries=args.new_queries), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
