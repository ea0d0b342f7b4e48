"""``dpgate proxy build --dataset NAME --output DIR [--name N] [--rows R]``: fit a synthetic proxy
from the dataset's stored releases only (post-processing: reads no protected data, charges
nothing; :mod:`dpgate.proxy_build` says what it preserves).

Writes ``DIR/<name>.toml`` (a policy: every table public, the provenance stated) and
``DIR/<name>/<table>.csv``. To use it, copy the policy into the policies folder and add
``proxy = "<name>"`` to the protected dataset's ``[dataset]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dpgate.cli import add_common_options, print_json, print_table


def register(subparsers) -> None:
    """Add ``proxy build``."""
    parser = subparsers.add_parser("proxy", help="build a synthetic proxy from stored releases (free)",
                                   description=__doc__.splitlines()[0])
    actions = parser.add_subparsers(dest="proxy_action", metavar="ACTION")
    actions.required = True
    build = actions.add_parser("build", help="fit independent one-way marginals of stored count releases")
    build.add_argument("--dataset", required=True)
    build.add_argument("--output", required=True, help="folder for the policy file and the CSVs")
    build.add_argument("--name", help="the proxy dataset's name (default: <dataset>_synthetic)")
    build.add_argument("--rows", type=int, help="rows per table (default: the marginals' mean total)")
    add_common_options(build)
    build.set_defaults(func=cmd_build)


def cmd_build(args: argparse.Namespace, settings) -> int:
    """Fit and write the proxy; print what it used and what it preserves."""
    from dpgate.errors import UnknownDataset
    from dpgate.ledger import open_ledger
    from dpgate.policy import load_policies
    from dpgate.proxy_build import write_proxy
    from dpgate.releases import open_release_store

    policies = load_policies(settings.policies)
    if args.dataset not in policies:
        raise UnknownDataset.named(args.dataset, policies)
    ledger = open_ledger(settings.resolved_ledger_url(), create=False)
    try:
        store = open_release_store(ledger)
        try:
            releases = store.list(args.dataset, limit=100_000)
        finally:
            store.close()
    finally:
        ledger.close()
    out = write_proxy(policies[args.dataset], releases, Path(args.output), name=args.name, rows=args.rows)
    if args.json:
        print_json(out)
        return 0
    print(f"wrote {out['policy_file']} ({out['provenance']})")
    rows = [[t, v["rows"], ", ".join(f"{c} ← {r}" for c, r in v["marginals"].items()) or "(none: constants)"]
            for t, v in out["tables"].items()]
    print_table(["table", "rows", "marginals used (column ← release)"], rows)
    print(f"preserves: {out['preserves']}; does not preserve: {out['does_not_preserve']}.")
    print(f"use it: copy the policy into the policies folder and add proxy = \"{out['name']}\" to "
          f"[dataset] of {args.dataset!r}")
    return 0


__all__ = ["register", "cmd_build"]
