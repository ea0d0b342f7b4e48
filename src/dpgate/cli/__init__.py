"""The ``dpgate`` command line.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``, which adds its parser and sets ``func(args, settings)
-> int`` (the exit status). Commands print human-readable tables by default and
JSON with ``--json``. A :class:`~dpgate.errors.DpgateError` is printed on stderr
as one sentence (``dpgate: error: <message> [<code>]``), or with ``--json`` as
the documented error shape ``{"error": {"code", "message", "details"}}`` on stdout
*and* stderr (so ``dpgate … --json | jq`` sees the error object too); usage errors
(``invalid_request``) and invalid settings take the same shape with ``--json``. The
exit status comes from one table, :mod:`dpgate.cli.exits`. Output cut short by
a closed pipe (``dpgate ledger show | head``) ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Sequence

from dpgate.cli import exits
from dpgate.errors import DpgateError, Internal, InvalidRequest
from dpgate.jsonsafe import json_safe

#: Sub-command modules, in help order. A module that is not present is skipped.
COMMAND_MODULES = ("serve", "query", "explain", "budget", "caps", "ledger", "accounting", "keys", "demo",
                   "datasets", "policy", "search", "proxy")


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--json``, ``--policies``, ``--home`` and ``--ledger-url`` to a sub-command parser."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--policies", help="policies folder (DPGATE_POLICIES, default ./policies)")
    parser.add_argument("--home", help="state folder (DPGATE_HOME, default ./.dpgate)")
    parser.add_argument("--ledger-url", help="sqlite:///… or postgresql://… (DPGATE_LEDGER_URL)")


def add_dialect_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--dialect NAME``: the SQL dialect of the query, in any case or by an alias
    (:func:`dpgate.sql.parse.check_dialect`); an unknown name is a usage error (exit 2)
    that lists the accepted names."""
    from dpgate.sql.parse import DIALECTS, check_dialect

    def dialect(text: str) -> str:
        try:
            return check_dialect(text)
        except DpgateError as e:
            raise argparse.ArgumentTypeError(e.message) from None

    parser.add_argument("--dialect", type=dialect, default=None, metavar="|".join(DIALECTS),
                        help="the SQL dialect the query is written in (default duckdb; any case, "
                             "aliases such as postgresql or mssql accepted)")


def settings_from_args(args: argparse.Namespace):
    """Build :class:`~dpgate.settings.Settings`: flags override ``DPGATE_*`` variables and defaults.

    Every setting with a flag (``Settings`` field metadata) is taken from the
    parsed arguments when the command has that flag and it was given.

    Raises:
        pydantic.ValidationError: a flag or variable has an invalid value.
    """
    from dpgate.settings import Settings, setting_flag

    overrides = {}
    for name in Settings.model_fields:
        flag = setting_flag(name)
        if flag is None:
            continue
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value is not None:
            overrides[name] = value
    return Settings(**overrides)


def print_json(obj) -> None:
    """Print ``obj`` as indented JSON (non-finite floats as the strings "inf", "-inf", "nan")."""
    print(json.dumps(json_safe(obj), indent=2, default=str))


def print_error(error: DpgateError, *, as_json: bool = False) -> None:
    """Print ``error``: one sentence on stderr, or with ``as_json`` the documented JSON shape
    on stdout (for ``| jq``) and on stderr (for a terminal or a log)."""
    if as_json:
        text = json.dumps(json_safe(error.to_dict()), indent=2, default=str)
        try:
            print(text, flush=True)
        except (BrokenPipeError, ValueError):  # the reader went away: stderr still gets it
            pass
        print(text, file=sys.stderr)
    else:
        print(f"dpgate: error: {error.message} [{error.code}]", file=sys.stderr)


class _UsageError(Exception):
    """A command-line usage error (argparse's ``error``), raised instead of exiting so that
    ``main`` can print it in the shape ``--json`` asks for."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser, self.message = parser, message


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors reach ``main`` as :class:`_UsageError`."""

    def error(self, message: str):  # type: ignore[override]
        """Raise :class:`_UsageError` (argparse would print and exit 2)."""
        raise _UsageError(self, message)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a plain aligned text table."""
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for j, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))


#: Options accepted before the sub-command too: (flag, dest of the top-level copy).
_GLOBAL_OPTIONS = (("--json", "_global_json"), ("--policies", "_global_policies"), ("--home", "_global_home"),
                   ("--ledger-url", "_global_ledger_url"))


def _merge_global_options(args: argparse.Namespace) -> None:
    """Give the sub-command the options written before it, unless it was given its own."""
    for flag, dest in _GLOBAL_OPTIONS:
        value = getattr(args, dest, None)
        name = flag.lstrip("-").replace("-", "_")
        if value and not getattr(args, name, None):
            setattr(args, name, value)
        if hasattr(args, dest):
            delattr(args, dest)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available sub-command registered."""
    parser = _Parser(
        prog="dpgate", description="Differentially private SQL gateway with a privacy-budget ledger."
    )
    # the common options may also come before the sub-command (`dpgate --home H ledger show`);
    # they get their own dests because a sub-command's defaults would overwrite them
    for flag, dest in _GLOBAL_OPTIONS:
        if flag == "--json":
            parser.add_argument(flag, dest=dest, action="store_true", help="print JSON instead of a table")
        else:
            parser.add_argument(flag, dest=dest, metavar=flag.lstrip("-").replace("-", "_").upper(),
                                help="as the sub-command's option of that name (either place works)")
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


def _settings_error(exc: Exception) -> str:
    """One sentence naming the settings that failed validation (no values echoed)."""
    from dpgate.settings import Settings, setting_flag

    names = []
    for err in getattr(exc, "errors", lambda: [])():
        field = str(err.get("loc", ("?",))[0])
        flag = setting_flag(field) if field in Settings.model_fields else None
        env = f"DPGATE_{field.upper()}"
        names.append(f"{flag} / {env}: {err.get('msg', 'invalid')}" if flag else f"{env}: {err.get('msg', 'invalid')}")
    return "invalid setting " + "; ".join(names or ["(unknown)"])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpgate`` console script; returns the exit status (:mod:`dpgate.cli.exits`)."""
    from pydantic import ValidationError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        if "--json" in argv:
            print_error(InvalidRequest(f"{exc.parser.prog}: {exc.message}", {"usage": exc.parser.format_usage().strip()}),
                        as_json=True)
        else:
            exc.parser.print_usage(sys.stderr)
            print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
        raise SystemExit(exits.USAGE)  # as argparse does (callers of main() see the same)
    _merge_global_options(args)
    as_json = bool(getattr(args, "json", False))
    try:
        try:
            settings = settings_from_args(args)
        except ValidationError as exc:
            if as_json:
                print_error(InvalidRequest(_settings_error(exc), {"kind": "settings"}), as_json=True)
            else:
                print(f"dpgate: error: {_settings_error(exc)}", file=sys.stderr)
            return exits.CONFIGURATION
        status = int(args.func(args, settings) or 0)
        sys.stdout.flush()
        return status
    except DpgateError as exc:
        print_error(exc, as_json=as_json)
        return exits.exit_status(exc)
    except BrokenPipeError:
        # the reader went away (`dpgate ledger show | head`): stop quietly, as Unix tools do
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return exits.BROKEN_PIPE
    except KeyboardInterrupt:
        return exits.INTERRUPTED
    except Exception as exc:  # a defect: one line (as over HTTP: `internal`), not a traceback
        err = Internal(f"internal error ({type(exc).__name__}); if a charge was made it stays "
                       "(see `dpgate ledger show`); set DPGATE_DEBUG=1 for the traceback")
        if os.environ.get("DPGATE_DEBUG") == "1":
            raise
        print_error(err, as_json=as_json)
        return exits.FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
