"""The ``dpgate`` command line.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func(args, settings)
-> int`` (the exit status). Commands print human-readable tables by default and
JSON with ``--json``. A :class:`~dpgate.errors.DpgateError` is printed as the
documented error shape on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Sequence

from dpgate.errors import DpgateError

#: Sub-command modules, in help order. A module that is not present is skipped.
COMMAND_MODULES = ("serve", "query", "explain", "budget", "ledger", "accounting", "keys", "demo",
                   "datasets")


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--json``, ``--policies``, ``--home`` and ``--ledger-url`` to a sub-command parser."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--policies", help="policies folder (DPGATE_POLICIES, default ./policies)")
    parser.add_argument("--home", help="state folder (DPGATE_HOME, default ./.dpgate)")
    parser.add_argument("--ledger-url", help="sqlite:///… or postgresql://… (DPGATE_LEDGER_URL)")


def settings_from_args(args: argparse.Namespace):
    """Build :class:`~dpgate.settings.Settings`: flags override ``DPGATE_*`` variables and defaults."""
    from dpgate.settings import Settings

    overrides = {}
    for flag in ("policies", "home", "ledger_url", "host", "port"):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[flag] = value
    return Settings(**overrides)


def print_json(obj) -> None:
    """Print ``obj`` as indented JSON (non-finite floats as strings)."""
    print(json.dumps(obj, indent=2, default=str))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a plain aligned text table."""
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for j, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="dpgate", description="Differentially private SQL gateway with a privacy-budget ledger."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"dpgate.cli.{name}")
        except ModuleNotFoundError as exc:  # a command not built yet
            if exc.name == f"dpgate.cli.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpgate`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
        return int(args.func(args, settings) or 0)
    except DpgateError as exc:
        print(json.dumps(exc.to_dict(), indent=2, default=str), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
