"""``dpgate datasets check NAME`` and ``dpgate datasets reload NAME``.

* ``check`` opens one dataset's engine here, as the server would (DuckDB loads
  the files; PostgreSQL and Spark check the schema), and prints how it is served:
  engine, load mode per table and how its data version is known. Nothing is
  charged and no query runs. Use it to validate a policy or a connection.
* ``reload`` asks the running server to load a dataset's data again
  (``POST /v1/admin/datasets/NAME/reload`` with an admin key): new data version,
  old releases still served as they were.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request

from dpgate.cli import add_common_options, print_json, print_table
from dpgate.errors import DpgateError, InvalidRequest


class _RemoteError(DpgateError):
    """An error answered by the server (its code and status are kept)."""

    def __init__(self, status: int, body: dict) -> None:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(err.get("message", f"the server answered HTTP {status}"), err.get("details", {}))
        self.code = err.get("code", "internal")
        self.http_status = status


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``datasets`` sub-command with ``check`` and ``reload``."""
    p = subparsers.add_parser("datasets", help="check a dataset's engine, or reload its data in the server")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    check = sub.add_parser("check", help="open one dataset's engine here and print how it is served")
    check.add_argument("dataset")
    add_common_options(check)
    check.set_defaults(func=run_check)
    reload = sub.add_parser("reload", help="reload a dataset's data in the running server (admin key)")
    reload.add_argument("dataset")
    reload.add_argument("--url", help="server URL (default http://DPGATE_HOST:DPGATE_PORT)")
    reload.add_argument("--key", help="admin API key (default: $DPGATE_API_KEY)")
    add_common_options(reload)
    reload.set_defaults(func=run_reload)


def _print_view(view: dict) -> None:
    version = view.get("data_version") or f"by {view.get('versioned_by') or 'nothing'}"
    print(f"dataset {view['name']}: engine {view.get('engine')}, data version {version}, "
          f"release cache {view.get('release_cache')}")
    print_table(["table", "load"], [[t, mode] for t, mode in sorted((view.get("load") or {}).items())])


def run_check(args: argparse.Namespace, settings) -> int:
    """Open the dataset's engine (progress on stdout), print the report, close it."""
    from dpgate.engines import EngineOptions, EngineSet
    from dpgate.errors import UnknownDataset
    from dpgate.policy import load_policies

    policies = load_policies(settings.policies)
    if args.dataset not in policies:
        raise UnknownDataset(f"unknown dataset {args.dataset!r}; known: {', '.join(sorted(policies))}",
                             {"dataset": args.dataset, "datasets": sorted(policies)})
    options = EngineOptions(timeout_s=settings.query_timeout_s, duckdb_memory_limit=settings.duckdb_memory_limit,
                            duckdb_threads=settings.duckdb_threads, duckdb_load=settings.duckdb_load,
                            in_place_above_bytes=settings.duckdb_in_place_above,
                            spark_master=settings.spark_master)
    with EngineSet(options=options) as engines:
        engines.load({args.dataset: policies[args.dataset]},
                     progress=None if args.json else (lambda line: print(f"dpgate: {line}", flush=True)))
        info = engines.describe(args.dataset)
    view = {"name": args.dataset, "engine": info["engine"], "versioned_by": info["versioned_by"],
            "release_cache": "enabled" if info["versioned_by"] else "disabled (no data version)",
            "load": {t: v["load"] for t, v in info["tables"].items()}}
    if args.json:
        print_json(view)
    else:
        _print_view(view)
    return 0


def run_reload(args: argparse.Namespace, settings) -> int:
    """POST the reload to the server; print the dataset view it answers."""
    key = args.key or os.environ.get("DPGATE_API_KEY")
    if not key:
        raise InvalidRequest("an admin API key is needed: pass --key or set DPGATE_API_KEY")
    url = (args.url or f"http://{settings.host}:{settings.port}").rstrip("/")
    request = urllib.request.Request(
        f"{url}/v1/admin/datasets/{urllib.request.quote(args.dataset, safe='')}/reload",
        method="POST", data=b"", headers={"Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=3600) as response:
            view = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read() or b"{}")
        except ValueError:
            body = {}
        raise _RemoteError(e.code, body) from None
    except urllib.error.URLError as e:
        raise InvalidRequest(f"cannot reach the server at {url} ({e.reason}); is `dpgate serve` running?",
                             {"url": url}) from None
    if args.json:
        print_json(view)
    else:
        _print_view(view)
    return 0
