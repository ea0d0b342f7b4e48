"""``dpgate datasets check NAME`` and ``dpgate datasets reload NAME``.

* ``check [NAME]`` first lists what a draft policy (``dpgate policy init``) still leaves
  undecided: every ``"TODO"`` per table and column, with what to decide (exit 1 while any is
  left). A complete policy is then validated and its engine opened here, as the server would
  (DuckDB loads the files; PostgreSQL and Spark check the schema); it prints how it is served
  (engine, load mode per table, how its data version is known) and notes what queries cannot do
  (numeric columns without bounds, text columns without public keys). Nothing is charged and no
  query runs. Without NAME every policy file of the folder is checked.
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
    check = sub.add_parser("check", help="list a draft's TODOs, or validate a policy and open its engine here")
    check.add_argument("dataset", nargs="?", help="the dataset (default: every policy file of the folder)")
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


def _policy_files(folder) -> list[tuple[object, str | None, list[tuple[str, ...]], str | None]]:
    """(path, dataset name, TODO paths, TOML error) of every ``*.toml`` file of the folder."""
    import tomllib
    from pathlib import Path

    from dpgate.errors import PolicyError
    from dpgate.policy import draft_todos

    folder = Path(folder)
    if not folder.is_dir():
        raise PolicyError(f"policies folder {str(folder)!r} does not exist", {"file": str(folder)})
    out = []
    for path in sorted(folder.glob("*.toml")):
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as e:
            out.append((path, None, [], f"{type(e).__name__}: {e}"))
            continue
        ds = raw.get("dataset")
        name = ds.get("name") if isinstance(ds, dict) and isinstance(ds.get("name"), str) else None
        out.append((path, name, draft_todos(raw), None))
    return out


def _gaps(policy) -> list[str]:
    """What queries of a loaded policy cannot do, per table and column (notes, not failures)."""
    notes = []
    for t in policy.tables.values():
        if t.public:
            continue
        for c in t.columns.values():
            if c.type in ("int", "float") and not c.bounded:
                notes.append(f"table {t.name}, column {c.name}: no bounds: SUM/AVG/VAR/quantiles of it are refused")
            if c.type in ("date", "timestamp") and c.time_lower is None:
                notes.append(f"table {t.name}, column {c.name}: no date range: date parts and date_trunc keys refused")
            if c.type == "text" and c.public_keys is None and c.name != t.privacy_unit:
                notes.append(f"table {t.name}, column {c.name}: no public_keys: GROUP BY selects keys privately "
                             "(costs δ; rare keys are not released)")
    return notes


def _report_todos(path, name: str | None, todos, as_json: bool) -> dict:
    from dpgate.policy_draft import describe_todo

    items = []
    for t in todos:
        where, what = describe_todo(t)
        items.append({"where": where, "key": ".".join(t), "what": what})
    if not as_json:
        print(f"{path}: dataset {name or '?'} is a draft: {len(items)} value(s) still TODO")
        current = None
        for item in items:
            if item["where"] != current:
                current = item["where"]
                print(f"  {current}:")
            print(f"    {item['what']}")
        print("  decide bounds and keys from domain knowledge, never from the data (they would leak it)")
    return {"name": name, "file": str(path), "ready": False, "todo": items}


def run_check(args: argparse.Namespace, settings) -> int:
    """List a draft's TODOs (exit 1), or open the dataset's engine (progress on stdout), print the
    report and close it. Without a dataset name, every policy file of the folder."""
    from dpgate.cli import exits
    from dpgate.errors import PolicyError, UnknownDataset
    from dpgate.policy import load_policies, load_policy

    files = _policy_files(settings.policies)
    if args.dataset is not None and not any(n == args.dataset for _, n, _, _ in files):
        known = sorted(n for _, n, _, _ in files if n)
        raise UnknownDataset(f"unknown dataset {args.dataset!r}; known: {', '.join(known)}",
                             {"dataset": args.dataset, "datasets": known})
    chosen = [f for f in files if args.dataset is None or f[1] == args.dataset]
    drafts = [f for f in files if f[2]]
    reports, status = [], exits.OK
    for path, name, todos, error in chosen:
        if error:
            raise PolicyError(f"policy file {str(path)!r}: TOML syntax error: {error}", {"file": str(path)})
        if todos:
            reports.append(_report_todos(path, name, todos, args.json))
            status = exits.CHECK_FAILED
            continue
        try:
            policies = load_policies(settings.policies)
        except PolicyError as e:
            if not drafts or str(path) == e.details.get("file"):
                raise
            policies = {name: load_policy(path)}  # another file is a draft: check this one alone
            if not args.json:
                print(f"note: {', '.join(str(p) for p, *_ in drafts)} is a draft: `dpgate serve` refuses the "
                      "folder until it is completed or moved out")
        reports.append(_check_engine(args, settings, policies, name))
    if args.json:
        print_json(reports[0] if args.dataset is not None else {"datasets": reports})
    return status


def _check_cap(policy) -> None:
    """Validate the policy's cap as the gateway does at startup (``ensure_population`` →
    :func:`dpgate.ledger.caps.validate_cap`), so a cap ``serve`` refuses fails the check too.

    Raises:
        PolicyError: the cap (ε, δ, selection δ) admits no spending or is out of range.
    """
    from dpgate.errors import PolicyError
    from dpgate.ledger.caps import validate_cap

    b = policy.budget
    try:
        validate_cap(b.epsilon, b.delta, selection_delta=b.selection_delta, error=PolicyError)
    except PolicyError as e:
        raise PolicyError(f"policy file {str(policy.path)!r}: [budget] {e.message}",
                          {**e.details, "file": str(policy.path)}) from None


def _check_engine(args: argparse.Namespace, settings, policies, dataset: str) -> dict:
    from dpgate.engines import EngineOptions, EngineSet

    _check_cap(policies[dataset])

    options = EngineOptions(timeout_s=settings.query_timeout_s, duckdb_memory_limit=settings.duckdb_memory_limit,
                            duckdb_threads=settings.duckdb_threads, duckdb_load=settings.duckdb_load,
                            in_place_above_bytes=settings.duckdb_in_place_above,
                            spark_master=settings.spark_master)
    with EngineSet(options=options) as engines:
        engines.load({dataset: policies[dataset]},
                     progress=None if args.json else (lambda line: print(f"dpgate: {line}", flush=True)))
        info = engines.describe(dataset)
    view = {"name": dataset, "engine": info["engine"], "versioned_by": info["versioned_by"],
            "release_cache": "enabled" if info["versioned_by"] else "disabled (no data version)",
            "load": {t: v["load"] for t, v in info["tables"].items()}, "ready": True,
            "notes": _gaps(policies[dataset])}
    if not args.json:
        _print_view(view)
        for note in view["notes"]:
            print(f"note: {note}")
    return view


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
