"""``dpgate search``: tuning/selection search records (issue 15), on the ledger's database.

* ``dpgate search create --file SPEC.json --consumer C`` — declare a search (the JSON body of
  ``POST /v1/searches``); charges nothing; prints its id.
* ``dpgate search list [--population P]`` — searches, newest first.
* ``dpgate search show ID`` — every step with the accountant's state after it, the totals of the
  whole search (ρ and ε) and the replay against the ledger (exit 1 if it fails).
* ``dpgate search close ID --selected NAME [--artifact ID]… [--selection-release REL]`` — record
  the selected candidate and artifacts; a closed search cannot be reopened.

Charges of a search are posted by training jobs (``POST /v1/ledger/charges`` with ``search_id``);
a selection query joins one with ``dpgate query --search-id ID``. ``dpgate searches`` is an alias.

The CLI reads the ledger's database directly: it is the operator's view, like an admin key (every
consumer's searches; ``list --consumer C`` shows one consumer's). Over HTTP a search belongs to its
consumer: other consumers' keys get 404 ``not_found`` for it.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
from pathlib import Path
from typing import Any

from dpgate.cli import add_common_options, print_json, print_table


def register(subparsers: Any) -> None:
    """Add ``search create|list|show|close``."""
    parser = subparsers.add_parser("search", aliases=["searches"], help="tuning/selection search records",
                                   description="Search records: candidates, charges (retries included), the "
                                               "selection and the selected artifact, replayable against the ledger.")
    actions = parser.add_subparsers(dest="search_action", metavar="ACTION")
    actions.required = True
    create = actions.add_parser("create", help="declare a search from a JSON file (charges nothing)")
    create.add_argument("--file", required=True, help="JSON declaration (the body of POST /v1/searches)")
    create.add_argument("--consumer", required=True, help="the allocation the search's charges spend")
    create.add_argument("--actor", help="who declares it (default: cli:<user>@<host>)")
    add_common_options(create)
    create.set_defaults(func=cmd_create)
    lst = actions.add_parser("list", help="searches, newest first")
    lst.add_argument("--population")
    lst.add_argument("--consumer", help="only the searches this consumer owns")
    lst.add_argument("--limit", type=int, default=100)
    add_common_options(lst)
    lst.set_defaults(func=cmd_list)
    show = actions.add_parser("show", help="one search: steps, accountant state, totals, replay")
    show.add_argument("search_id")
    add_common_options(show)
    show.set_defaults(func=cmd_show)
    close = actions.add_parser("close", help="record the selected candidate and artifacts (final)")
    close.add_argument("search_id")
    close.add_argument("--selected", required=True, help="the selected candidate's name")
    close.add_argument("--artifact", action="append", default=[], help="an artifact id (repeatable)")
    close.add_argument("--selection-release", help="private selection: the selection release in this search")
    close.add_argument("--note")
    close.add_argument("--actor", help="who closes it (default: cli:<user>@<host>)")
    add_common_options(close)
    close.set_defaults(func=cmd_close)


def _actor(args: argparse.Namespace) -> str:
    if getattr(args, "actor", None):
        return args.actor
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in this environment
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


class _Open:
    """The ledger (populations ensured from the policy files) and its search records."""

    def __init__(self, settings: Any) -> None:
        from dpgate.ledger import open_ledger
        from dpgate.policy import load_policies
        from dpgate.searches import Searches, open_search_store
        from dpgate.service import ensure_populations

        settings.home.mkdir(parents=True, exist_ok=True)
        self.ledger = open_ledger(settings.resolved_ledger_url())
        try:
            ensure_populations(self.ledger, load_policies(Path(settings.policies)))
            self.searches = Searches(self.ledger, open_search_store(self.ledger))
        except BaseException:
            self.ledger.close()
            raise

    def __enter__(self):
        return self.searches

    def __exit__(self, *exc: object) -> None:
        self.searches.store.close()
        self.ledger.close()


def cmd_create(args: argparse.Namespace, settings: Any) -> int:
    """Declare a search from ``--file``."""
    from dpgate.errors import InvalidRequest

    try:
        spec = json.loads(Path(args.file).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"cannot read the search declaration: {exc}", {"file": args.file}) from None
    if not isinstance(spec, dict):
        raise InvalidRequest("the search declaration must be a JSON object", {"file": args.file})
    spec.pop("consumer", None)
    with _Open(settings) as searches:
        rec = searches.create(spec, consumer=args.consumer, actor=_actor(args))
    if args.json:
        print_json(rec)
    else:
        print(f"search {rec['search_id']} declared ({len(rec['candidates'])} candidates, selection on "
              f"{rec['selection']} data); charge its runs with search_id = {rec['search_id']}")
    return 0


def cmd_list(args: argparse.Namespace, settings: Any) -> int:
    """Print the searches."""
    with _Open(settings) as searches:
        items = searches.list(args.population, limit=args.limit, consumer=args.consumer)
    if args.json:
        print_json({"searches": items})
        return 0
    print_table(["search", "population", "consumer", "created", "purpose"],
                [[s["search_id"], s["population"], s["consumer"], s["created_at"], s["purpose"]] for s in items])
    return 0


def _state(acc: dict[str, Any]) -> str:
    parts = [f"{pop}: ρ {v['rho']:.4g}, ε {v['epsilon_at_delta']:.4g} at δ {v['delta']:g}"
             for pop, v in acc.get("by_population", {}).items()]
    return "; ".join(parts) or "-"


def cmd_show(args: argparse.Namespace, settings: Any) -> int:
    """Print one search with every step; exit 1 if it does not replay."""
    with _Open(settings) as searches:
        rec = searches.get(args.search_id)
    if args.json:
        print_json(rec)
        return 0 if rec["replay"]["ok"] else 1
    print(f"search {rec['search_id']} ({rec['status']}): {rec['purpose']}")
    print(f"training {rec['training']['name']} ({rec['training']['population']}), validation "
          f"{rec['validation']['name']} ({rec['validation']['population'] or 'public'}), people: {rec['people']}, "
          f"selection on {rec['selection']} data, stopping: {rec['stopping']}")
    rows = []
    for s in rec["steps"]:
        what = s.get("candidate") or ", ".join(map(str, s.get("selected", []))) or s.get("selected") or ""
        cost = "0 (post-processing)" if s.get("cost") == {"rho": 0.0} else s.get("charge_id")
        rows.append([s["step"], s.get("step_kind") or s["kind"], what, s.get("outcome") or "", cost,
                     _state(s["accountant"]["search"])])
    print_table(["step", "kind", "candidate / selected", "outcome", "charge", "search so far"], rows)
    print(f"total: {_state(rec['totals'])}")
    print("replay: " + ("ok (every step recomputes from the ledger)" if rec["replay"]["ok"]
                        else "PROBLEMS: " + "; ".join(rec["replay"]["problems"])))
    return 0 if rec["replay"]["ok"] else 1


def cmd_close(args: argparse.Namespace, settings: Any) -> int:
    """Close a search with its selected candidate and artifacts."""
    with _Open(settings) as searches:
        rec = searches.close(args.search_id, selected=args.selected, artifacts=list(args.artifact),
                             selection_release=args.selection_release, note=args.note, actor=_actor(args))
    if args.json:
        print_json(rec)
    else:
        print(f"search {rec['search_id']} closed: selected {args.selected}; total {_state(rec['totals'])}")
    return 0


__all__ = ["register", "cmd_create", "cmd_list", "cmd_show", "cmd_close"]
