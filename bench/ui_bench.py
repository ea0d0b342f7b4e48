"""Web pages: server time and page weight with a ledger of 100,000 entries.

Usage::

    python bench/ui_bench.py [--entries 100000] [--repeat 30] [--dir DIR] [--json FILE]

Builds a project in a temporary folder (or ``--dir``, reused when it already
holds a ledger of the requested size): the ``usage`` policy and its generated
sample data, a SQLite ledger filled with ``--entries`` charges of the
``product-users`` population (alternating the ``dashboard`` and ``analysts``
allocations; written with ``?synchronous=off`` to fill quickly — reading is
what is measured), a dozen stored releases and one cap change. Then, in-process
(``httpx.ASGITransport`` on the real application: no network, so the time is
the server's: routing, session, gateway reads, templates), signs in as an admin,
a dashboard viewer and an analyst and requests each page ``--repeat`` times.

Prints, per page: the first request (the burn-down's series are read from the
ledger once per process, then incrementally), the median and the 95th
percentile of the rest, the median CPU time of the process per request (the
server's work, less sensitive than wall time to other jobs on a shared
machine), and the page's weight: its HTML plus the assets it links
(stylesheet, icon). Not a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import httpx  # noqa: E402

from dpgate.accounting import Cost  # noqa: E402
from dpgate.api import create_app  # noqa: E402
from dpgate.auth import KeyStore  # noqa: E402
from dpgate.sample_data import ensure_sample_data  # noqa: E402
from dpgate.service import Gateway, QueryBudget  # noqa: E402
from dpgate.settings import Settings  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
POPULATION = "product-users"


def _project(root: Path, entries: int) -> Settings:
    (root / "policies").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "policies" / "usage.toml", root / "policies" / "usage.toml")
    ensure_sample_data(root)
    home = root / "state"
    settings = Settings(policies=root / "policies", home=home,
                        ledger_url=f"sqlite:///{(home / 'ledger.sqlite').resolve()}?synchronous=off")
    marker = home / f"filled-{entries}"
    if marker.exists():
        return settings
    shutil.rmtree(home, ignore_errors=True)
    with Gateway.open(settings) as gw:
        t0 = time.perf_counter()
        cost = Cost.zcdp(1e-6)  # 100,000 × 1e-6 = 0.1 ρ: fits the 0.311 cap
        for i in range(entries - 1):
            consumer = "dashboard" if i % 2 else "analysts"
            gw.ledger.charge(POPULATION, consumer, cost, purpose=f"bench charge {i}")
            if (i + 1) % 20_000 == 0:
                print(f"  {i + 1:,} charges ({(i + 1) / (time.perf_counter() - t0):,.0f}/s)", file=sys.stderr)
        for week in range(10):
            gw.query("usage", f"SELECT region, COUNT(DISTINCT user_id) AS users FROM prompts WHERE week = {week} "
                     "GROUP BY region", consumer="dashboard", budget=QueryBudget(rho=0.0005))
        gw.query("usage", "SELECT week, COUNT(*) AS prompts, AVG(tokens) AS avg_tokens FROM prompts GROUP BY week",
                 consumer="analysts", budget=QueryBudget(rho=0.001))
        gw.set_cap(POPULATION, epsilon=4.5, delta=1e-6, actor="bench", reason="bench: raise the cap")
    marker.write_text("ok")
    return settings


async def _sign_in(app, base: str, key: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base, timeout=600)
    form = await client.get("/ui/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', form.text).group(1)
    r = await client.post("/ui/login", data={"csrf_token": token, "api_key": key})
    assert r.status_code == 303, r.text
    return client


async def _weight(client: httpx.AsyncClient, html: str) -> int:
    total = len(html.encode())
    for src in sorted(set(re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', html))):
        total += len((await client.get(src)).content)
    return total


async def _measure(settings: Settings, repeat: int) -> list[dict]:
    store = KeyStore(settings.resolved_keys_file())
    keys = {role: store.add(f"bench-{role}-{time.time_ns()}", role=role,
                            consumer="analysts" if role == "analyst" else None)[0]
            for role in ("admin", "dashboard", "analyst")}
    gw = Gateway.open(settings)
    try:
        app = create_app(settings, gateway=gw)
        base = "http://bench"
        clients = {role: await _sign_in(app, base, key) for role, key in keys.items()}
        release_id = gw.releases("usage", limit=1)[0]["release_id"]
        ledger_total = len(gw.ledger.spend_series(POPULATION)) + len(gw.ledger_events())
        mid = gw.ledger.spend_series(POPULATION)[len(gw.ledger.spend_series(POPULATION)) // 2]
        pages = [
            ("admin", "/ui/admin", "spend + burn-down"),
            ("admin", "/ui/admin?zoom=true", "burn-down zoomed"),
            ("admin", "/ui/admin/ledger", "ledger, newest page"),
            ("admin", f"/ui/admin/ledger?before={mid[0]}", "ledger, a page in the middle"),
            ("admin", "/ui/admin/ledger?consumer=analysts&limit=100", "ledger, consumer filter"),
            ("admin", f"/ui/admin/ledger?until={mid[1][:19]}", "ledger, time filter (half the ledger newer)"),
            ("admin", "/ui/admin/ledger?show=events", "governance events"),
            ("dashboard", "/ui/dashboard/usage", "dashboard, 12 releases"),
            ("dashboard", f"/ui/releases/{release_id}", "one release"),
            ("analyst", "/ui/console", "console"),
            ("analyst", "/ui/datasets", "datasets"),
        ]
        out = []
        for role, path, what in pages:
            client = clients[role]
            times, cpu = [], []
            for i in range(repeat + 1):
                t0, c0 = time.perf_counter(), time.process_time()
                r = await client.get(path)
                times.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.process_time() - c0) * 1000)
                assert r.status_code == 200, (path, r.status_code, r.text[:300])
            weight = await _weight(client, r.text)
            rest = sorted(times[1:])
            out.append({"page": path, "what": what, "first_ms": times[0], "median_ms": statistics.median(rest),
                        "p95_ms": rest[int(0.95 * (len(rest) - 1))], "cpu_ms": statistics.median(cpu[1:]),
                        "html_bytes": len(r.content), "weight_bytes": weight})
        for c in clients.values():
            await c.aclose()
        print(f"ledger entries: {ledger_total:,}", file=sys.stderr)
        return out
    finally:
        gw.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=100_000, help="ledger charges (default 100000)")
    ap.add_argument("--repeat", type=int, default=30, help="timed requests per page (default 30)")
    ap.add_argument("--dir", help="project folder (default: a temporary one); reused when already filled")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    tmp = None
    root = Path(args.dir) if args.dir else Path(tmp := tempfile.mkdtemp(prefix="dpgate-ui-bench-"))
    try:
        print(f"project in {root}; filling the ledger ({args.entries:,} entries) if needed", file=sys.stderr)
        settings = _project(root, args.entries)
        rows = asyncio.run(_measure(settings, args.repeat))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average at the end: {load:.1f} on {os.cpu_count()} cores")
    print("| page | what | first request (ms) | median (ms) | p95 (ms) | CPU median (ms) | HTML (KB) "
          "| with assets (KB) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| `{r['page']}` | {r['what']} | {r['first_ms']:.1f} | {r['median_ms']:.1f} | {r['p95_ms']:.1f} "
              f"| {r['cpu_ms']:.1f} | {r['html_bytes'] / 1000:.1f} | {r['weight_bytes'] / 1000:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
