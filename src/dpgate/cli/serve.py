"""``dpgate serve``: run the HTTP gateway with uvicorn.

Settings come from flags, then ``DPGATE_*`` variables, then defaults. Before
serving, the command

1. binds the address (a port already in use fails at once, with one line and
   exit status 7, before any data is loaded);
2. generates the quickstart's sample data if a policy in the policies folder
   reads from ``sample_data/usage/`` and the files are missing (so ``dpgate
   serve`` works on a fresh checkout);
3. reads the API keys file (a malformed one fails here) and, with
   ``--demo-keys``, creates the demo keys (an analyst, the dashboard's refresh job, a dashboard viewer and an admin) when the
   keys file holds no active key, and prints them once;
4. opens the gateway (policies, data, ledger, release store), printing progress,
   so that a bad policy fails here with a clear message rather than inside the
   server;

then prints where it listens (the socket is bound and listening by then) and
serves until interrupted, with the header and body read timeouts, the keep-alive
timeout and the connection cap of the settings (:mod:`dpgate.api.server`).
"""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import sys
import tomllib
from pathlib import Path

from dpgate.auth import KeyStore, Role
from dpgate.cli import exits

#: Folder (relative to the project root) of the generated quickstart data.
SAMPLE_PREFIX = "sample_data/usage/"


def _say(line: str) -> None:
    print(f"dpgate: {line}", flush=True)


def _policy_documents(policies: Path) -> list[dict]:
    """The parsed TOML of every policy file (unparsable files are left to the gateway to report)."""
    docs = []
    for path in sorted(policies.glob("*.toml")):
        try:
            docs.append(tomllib.loads(path.read_text(encoding="utf-8")))
        except (OSError, tomllib.TOMLDecodeError):
            continue
    return docs


def ensure_quickstart_data(policies: Path) -> None:
    """Generate the sample usage log if a policy reads ``sample_data/usage/…`` and a file is missing.

    The project root is the parent of the policies folder (where policy source
    paths are resolved). Prints a progress line when it generates anything.
    """
    root = policies.resolve().parent
    missing = False
    for doc in _policy_documents(policies):
        for table in (doc.get("tables") or {}).values():
            source = table.get("source") if isinstance(table, dict) else None
            if isinstance(source, str) and source.startswith(SAMPLE_PREFIX) and not (root / source).exists():
                missing = True
    if not missing:
        return
    from dpgate.sample_data import ensure_sample_data

    _say(f"sample data missing under {root / SAMPLE_PREFIX}; generating it (once)")
    ensure_sample_data(root, progress=_say)


def example_query(policies: Path, consumer: str | None) -> tuple[str, str] | None:
    """A query the demo analyst can run: ``(dataset, sql)`` on a dataset of ``policies``.

    The quickstart's weekly count on ``usage`` when that dataset exists; otherwise
    ``SELECT COUNT(*)`` on the first protected table of the first dataset whose
    allocations include ``consumer`` (or that has none). None if there is none.
    """
    candidates = []
    for doc in _policy_documents(policies):
        dataset = (doc.get("dataset") or {}).get("name")
        allocations = doc.get("allocations") or {}
        tables = doc.get("tables") or {}
        if not isinstance(dataset, str) or (allocations and consumer not in allocations):
            continue
        if dataset == "usage" and "prompts" in tables:
            return dataset, ("SELECT region, COUNT(DISTINCT user_id) AS users FROM prompts "
                             "WHERE week = 0 GROUP BY region")
        for name, table in tables.items():
            if isinstance(table, dict) and not table.get("public", False):
                candidates.append((dataset, f"SELECT COUNT(*) AS n FROM {name}"))
                break
    return candidates[0] if candidates else None


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``.

    Raises:
        OSError: the address cannot be bound (``errno.EADDRINUSE`` when taken).
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _bind_error(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"cannot listen on {host}:{port}: the address is already in use "
                "(another dpgate serve?); pick another port with --port N or DPGATE_PORT")
    if exc.errno == errno.EACCES:
        return f"cannot listen on {host}:{port}: permission denied (ports below 1024 need privileges; try --port 8000)"
    reason = exc.strerror or exc.__class__.__name__
    return f"cannot listen on {host}:{port}: {reason} (check --host / DPGATE_HOST)"


def _allocations(policies: Path) -> list[str]:
    names: list[str] = []
    for doc in _policy_documents(policies):
        for name in (doc.get("allocations") or {}):
            if name not in names:
                names.append(name)
    return names


def create_demo_keys(store: KeyStore, policies: Path) -> list[tuple[str, str, str | None, str]] | None:
    """Create ``demo-analyst``, ``demo-dashboard``, ``demo-admin`` (and ``demo-refresh``) keys.

    Only when the store has no active key. The analyst's consumer is the allocation
    ``analysts`` if a policy declares it, else the first declared allocation other
    than ``dashboard``. When a policy declares a ``dashboard`` allocation,
    ``demo-refresh`` is an analyst-role key whose consumer is ``dashboard``: the job
    that refreshes the dashboard's releases (dashboard-role keys only read them).

    Returns:
        ``[(role, name, consumer, key), …]`` for the created keys, or None when the
        store already held keys (nothing is created).
    """
    if store.records():
        return None
    allocations = _allocations(policies)
    if "analysts" in allocations or not allocations:
        analyst_consumer = "analysts"
    else:
        analyst_consumer = next((a for a in allocations if a != "dashboard"), allocations[0])
    created = []
    keys = [
        (Role.ANALYST, "demo-analyst", analyst_consumer),
        (Role.DASHBOARD, "demo-dashboard", None),
        (Role.ADMIN, "demo-admin", None),
    ]
    if "dashboard" in allocations:
        # the dashboard's refresh job: runs the dashboard's queries, paid from its allocation
        keys.append((Role.ANALYST, "demo-refresh", "dashboard"))
    for role, name, consumer in keys:
        key, _record = store.add(name, role=role, consumer=consumer)
        created.append((role.value, name, consumer, key))
    return created


def _serve(args: argparse.Namespace, settings) -> int:
    policies = Path(settings.policies)
    if not policies.is_dir():
        from dpgate.errors import PolicyError

        raise PolicyError(
            f"policies folder {policies} does not exist (set --policies or DPGATE_POLICIES)",
            {"policies": str(policies)},
        )
    base = f"http://{settings.host}:{settings.port}"
    try:
        sock = bind(settings.host, settings.port)
    except (OSError, UnicodeError) as exc:
        message = _bind_error(settings.host, settings.port, exc) if isinstance(exc, OSError) else \
            f"cannot listen on {settings.host}:{settings.port}: invalid host name"
        print(f"dpgate: error: {message}", file=sys.stderr, flush=True)
        return exits.CONFIGURATION
    try:
        return _serve_on(sock, args, settings, policies, base)
    finally:
        sock.close()


def _serve_on(sock: socket.socket, args: argparse.Namespace, settings, policies: Path, base: str) -> int:
    """Everything after the bind: data, keys, gateway, then uvicorn on ``sock``."""
    import uvicorn

    from dpgate.api import create_app
    from dpgate.api.server import uvicorn_config
    from dpgate.service import Gateway

    ensure_quickstart_data(policies)

    store = KeyStore(settings.resolved_keys_file())
    store.records()  # a malformed keys file fails here, at start-up, not on the first request
    if args.demo_keys:
        created = create_demo_keys(store, policies)
        if created is None:
            _say(f"{store.path} already holds API keys; no demo keys created (see: dpgate keys list)")
        else:
            print(f"demo API keys (shown once; only their SHA-256 digests are kept in {store.path}):")
            for role, name, consumer, key in created:
                print(f"  {role:<10} {name:<15} consumer={consumer or '-':<10} {key}")
            print("for the README's walkthrough:")
            for role, name, consumer, key in created:
                print(f"  export {name.removeprefix('demo-').upper()}={key}")
            _, _, analyst_consumer, analyst_key = created[0]
            example = example_query(policies, analyst_consumer)
            if example is not None:
                dataset, sql = example
                print("try:")
                print(
                    f"  curl -s {base}/v1/queries -H 'Authorization: Bearer {analyst_key}' "
                    "-H 'Content-Type: application/json' \\\n"
                    f"    -d '{{\"dataset\": \"{dataset}\", \"sql\": \"{sql}\"}}'",
                )
            sys.stdout.flush()
    elif not store.records():
        _say(f"no API keys in {store.path}: create one with 'dpgate keys add NAME --role analyst "
             "--consumer C', or restart with --demo-keys")

    _say(f"opening policies in {policies.resolve()}")
    gateway = Gateway.open(settings, progress=_say)
    # uvicorn shuts down gracefully on SIGTERM and then re-raises the signal with the handler
    # that was installed before it: make that a clean exit (status 0) that closes the gateway.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        app = create_app(settings, gateway=gateway, keys=store)
        server = uvicorn.Server(uvicorn_config(app, settings, log_level=args.log_level))
        _say(f"listening on {base} (API docs: {base}/docs); Ctrl-C to stop")
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        gateway.close()
        _say("stopped")
    return 0


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)


def register(subparsers) -> None:
    """Add the ``serve`` command."""
    parser = subparsers.add_parser(
        "serve",
        help="run the HTTP gateway",
        description="Run the HTTP gateway (uvicorn). Generates the quickstart's sample data if it is "
        "missing; with --demo-keys, creates and prints demo API keys when the keys file has none.",
    )
    parser.add_argument("--host", help="bind address (DPGATE_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="bind port (DPGATE_PORT, default 8000)")
    parser.add_argument("--policies", help="policies folder (DPGATE_POLICIES, default ./policies)")
    parser.add_argument("--home", help="state folder: ledger, releases, keys (DPGATE_HOME, default ./.dpgate)")
    parser.add_argument("--ledger-url", help="sqlite:///… or postgresql://… (DPGATE_LEDGER_URL)")
    parser.add_argument("--keys-file", help="API keys file (DPGATE_KEYS_FILE, default $DPGATE_HOME/keys.json)")
    parser.add_argument("--query-timeout", type=float, metavar="SECONDS",
                        help="per-query engine timeout (DPGATE_QUERY_TIMEOUT_S, default 30)")
    parser.add_argument("--max-body-bytes", type=int, metavar="BYTES",
                        help="largest request body (DPGATE_MAX_BODY_BYTES, default 65536)")
    parser.add_argument("--http-header-timeout", type=float, metavar="SECONDS",
                        help="time to send a request's headers, then 408 (DPGATE_HTTP_HEADER_TIMEOUT_S, default 10)")
    parser.add_argument("--http-body-timeout", type=float, metavar="SECONDS",
                        help="time to send a request's body, then 408 (DPGATE_HTTP_BODY_TIMEOUT_S, default 10)")
    parser.add_argument("--http-keep-alive", type=float, metavar="SECONDS",
                        help="idle keep-alive connections closed after (DPGATE_HTTP_KEEP_ALIVE_S, default 5)")
    parser.add_argument("--http-max-connections", type=int, metavar="N",
                        help="open connections above which requests get 503 (DPGATE_HTTP_MAX_CONNECTIONS, "
                             "default 1000)")
    parser.add_argument("--ledger-wait", type=float, metavar="SECONDS",
                        help="wait for the ledger before 503 ledger_unavailable (DPGATE_LEDGER_WAIT_S, default 2)")
    parser.add_argument("--duckdb-memory-limit", metavar="SIZE",
                        help="DuckDB memory_limit, e.g. 4GB (DPGATE_DUCKDB_MEMORY_LIMIT)")
    parser.add_argument("--duckdb-threads", type=int, metavar="N", help="DuckDB threads (DPGATE_DUCKDB_THREADS)")
    parser.add_argument("--duckdb-load", choices=["auto", "memory", "in_place"],
                        help="DuckDB files in memory or in place (DPGATE_DUCKDB_LOAD, default auto)")
    parser.add_argument("--duckdb-in-place-above", type=int, metavar="BYTES",
                        help="auto: in place above this size (DPGATE_DUCKDB_IN_PLACE_ABOVE, default 1e9)")
    parser.add_argument("--spark-master", metavar="URL", help="Spark master (DPGATE_SPARK_MASTER, default local[*])")
    parser.add_argument(
        "--demo-keys",
        action="store_true",
        help="create and print an analyst, a dashboard and an admin key if the keys file has none",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"], help="uvicorn log level"
    )
    parser.set_defaults(func=_serve)
