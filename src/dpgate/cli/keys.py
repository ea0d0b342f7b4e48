"""``dpgate keys add|list|revoke``: manage the API keys of the HTTP gateway.

Keys are stored as SHA-256 digests in ``Settings.resolved_keys_file()``
(default ``$DPGATE_HOME/keys.json``, mode 0600); ``add`` prints the key once.
A running server picks up changes without a restart.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dpgate.auth import ROLE_PERMISSIONS, KeyStore, Role


def _store(args: argparse.Namespace, settings) -> KeyStore:
    path = Path(args.keys_file) if getattr(args, "keys_file", None) else settings.resolved_keys_file()
    return KeyStore(path)


def known_consumers(policies: Path) -> set[str] | None:
    """The consumers the policies in ``policies`` allocate budget to.

    None when some policy has no ``[allocations]`` (its population is open to any
    consumer). Raises PolicyError when the folder is missing or a policy is invalid.
    """
    from dpgate.errors import PolicyError
    from dpgate.policy import load_policies

    if not Path(policies).is_dir():
        raise PolicyError(
            f"cannot check --consumer: policies folder {str(policies)!r} does not exist; pass --policies DIR "
            "(or --no-consumer-check for a key made before its policy)",
            {"policies": str(policies)},
        )
    names: set[str] = set()
    for policy in load_policies(policies).values():
        if not policy.allocations:
            return None
        names.update(policy.allocations)
    return names


def _add(args: argparse.Namespace, settings) -> int:
    from dpgate.cli import print_json

    store = _store(args, settings)
    known = None
    if args.consumer is not None and not args.no_consumer_check:
        known = known_consumers(Path(settings.policies))
    key, record = store.add(args.name, role=args.role, consumer=args.consumer, known_consumers=known)
    if args.json:
        print_json({**record.public_dict(), "key": key, "keys_file": str(store.path)})
    else:
        consumer = f", consumer {record.consumer}" if record.consumer else ""
        print(f"created API key {record.name!r} (role {record.role}{consumer}, id {record.key_id})")
        print(f"  {key}")
        print(f"store it now: it is shown only once (only its SHA-256 digest is kept in {store.path})")
    return 0


def _list(args: argparse.Namespace, settings) -> int:
    from dpgate.cli import print_json, print_table

    store = _store(args, settings)
    records = store.records(include_revoked=args.all)
    if args.json:
        print_json({"keys_file": str(store.path), "keys": [r.public_dict() for r in records]})
        return 0
    if not records:
        print(f"no API keys in {store.path}; create one with: dpgate keys add NAME --role analyst --consumer C")
        return 0
    rows = [
        [r.name, r.role, r.consumer or "-", r.key_id, r.created_at, r.revoked_at or "active"] for r in records
    ]
    print_table(["name", "role", "consumer", "key id", "created", "status"], rows)
    return 0


def _revoke(args: argparse.Namespace, settings) -> int:
    from dpgate.cli import print_json

    store = _store(args, settings)
    record = store.revoke(args.name)
    if args.json:
        print_json(record.public_dict())
    else:
        print(f"revoked API key {record.name!r} (id {record.key_id}) at {record.revoked_at}")
    return 0


def register(subparsers) -> None:
    """Add the ``keys`` command and its ``add``, ``list`` and ``revoke`` sub-commands."""
    roles = "; ".join(
        f"{role.value}: {', '.join(sorted(p.value for p in perms))}" for role, perms in ROLE_PERMISSIONS.items()
    )
    parser = subparsers.add_parser(
        "keys",
        help="manage API keys of the HTTP gateway",
        description=f"Manage API keys (stored as SHA-256 digests). Roles: {roles}.",
    )
    sub = parser.add_subparsers(dest="keys_command", metavar="ACTION")
    sub.required = True

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
        p.add_argument("--home", help="state folder holding keys.json (DPGATE_HOME, default ./.dpgate)")
        p.add_argument("--keys-file", help="API keys file (DPGATE_KEYS_FILE, default $DPGATE_HOME/keys.json)")

    add = sub.add_parser("add", help="create a key and print it once")
    add.add_argument("name", help="unique name of the key (the actor in governance events)")
    add.add_argument("--role", required=True, choices=[r.value for r in Role])
    add.add_argument("--consumer", help="allocation the key spends (required for analyst and service keys); "
                     "checked against the policies' [allocations]")
    add.add_argument("--policies", help="policies folder to check --consumer against (DPGATE_POLICIES, default ./policies)")
    add.add_argument("--no-consumer-check", action="store_true",
                     help="do not check --consumer against the policies (e.g. keys made before the policy)")
    common(add)
    add.set_defaults(func=_add)

    lst = sub.add_parser("list", help="list keys (never the secrets)")
    lst.add_argument("--all", action="store_true", help="include revoked keys")
    common(lst)
    lst.set_defaults(func=_list)

    rev = sub.add_parser("revoke", help="revoke a key by name")
    rev.add_argument("name")
    common(rev)
    rev.set_defaults(func=_revoke)
