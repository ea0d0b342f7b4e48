"""``dpgate policy init SOURCE`` and ``dpgate policy import-smartnoise META.yaml``: draft a policy.

* ``init`` reads the *schema* of SOURCE — a CSV or Parquet file, a DuckDB table
  (``file.duckdb:table``) or a PostgreSQL table (``postgresql://…#schema.table``) — and writes
  ``policies/<name>.toml`` with the column types, a privacy unit (``--unit COL``,
  ``--record-level``, asked for on a terminal, else a TODO with a suggestion), and every bound,
  key list, contribution bound and the cap left as ``"TODO"``: they must not come from the data
  (see :mod:`dpgate.policy_draft`). The gateway refuses the file until no TODO is left;
  ``dpgate datasets check NAME`` lists them.
* ``import-smartnoise`` converts SmartNoise SQL metadata (YAML) into a policy, printing each
  difference of meaning (also written as comments); ``--source [TABLE=]PATH`` names the data
  (default: a CSV next to the YAML named after it or the table), ``--epsilon/--delta`` the cap.

Neither reads a data value into the draft (a CSV's types are DuckDB's sniffed types) nor
charges anything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from dpgate.cli import add_common_options, print_json
from dpgate.errors import DpgateError, InvalidRequest
from dpgate import policy_draft as drafts


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``policy init`` and ``policy import-smartnoise``."""
    p = subparsers.add_parser("policy", help="draft a policy file from a source's schema or SmartNoise metadata")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    init = sub.add_parser(
        "init", help="draft policies/<name>.toml from a source's schema (bounds and keys left as TODO)",
        description="Draft a policy from the schema of a CSV/Parquet file, a DuckDB table (file.duckdb:table) or "
                    "a PostgreSQL table (postgresql://…#schema.table). Bounds, key lists, contribution bounds and "
                    "the cap are written as TODO: they must come from domain knowledge, never from the data.")
    init.add_argument("source", help="file.csv | file.parquet | file.duckdb:table | postgresql://…#schema.table")
    init.add_argument("--name", help="dataset (and file) name; default from the file or table name")
    who = init.add_mutually_exclusive_group()
    who.add_argument("--unit", help="the privacy unit: the column that identifies one person")
    who.add_argument("--record-level", action="store_true", help="each row is one person (no privacy unit)")
    _shared(init)
    init.set_defaults(func=run_init)

    sn = sub.add_parser(
        "import-smartnoise", help="convert SmartNoise SQL metadata (YAML) into a policy, stating the differences",
        description="Convert SmartNoise SQL metadata into a dpgate policy: private_id -> privacy_unit, row_privacy "
                    "-> record-level, max_ids -> k = 1 and m = max_ids, lower/upper -> bounds. Every difference "
                    "of meaning is printed and written as a comment.")
    sn.add_argument("metadata", help="the SmartNoise metadata YAML file")
    sn.add_argument("--name", help="dataset (and file) name; default from the YAML file's name")
    sn.add_argument("--source", action="append", default=[], metavar="[TABLE=]PATH",
                    help="the data of a table (repeatable; PATH alone for a single table); default a CSV or "
                         "Parquet file next to the YAML named after it or after the table")
    _shared(sn)
    sn.set_defaults(func=run_import_smartnoise)


def _shared(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epsilon", type=float, help="the cap's ε (default: TODO, a governance decision)")
    p.add_argument("--delta", type=float, help="the cap's δ (default: TODO)")
    p.add_argument("--force", action="store_true", help="overwrite an existing policy file")
    p.add_argument("--stdout", action="store_true", help="print the draft instead of writing it")
    add_common_options(p)


# --- init ------------------------------------------------------------------------------------


def _split_source(text: str) -> tuple[str, str, str | None, str]:
    """(kind, source for the policy, connection, default name) of ``policy init``'s SOURCE."""
    if text.startswith(("postgresql://", "postgres://")):
        url, sep, relation = text.partition("#")
        if not sep or not relation:
            raise InvalidRequest("a PostgreSQL source is postgresql://…#schema.table (the table after '#')",
                                 {"source": "postgresql://…"})
        return "postgres", relation, url, relation.rsplit(".", 1)[-1]
    if text.startswith("duckdb:"):
        file, _, table = text[len("duckdb:"):].rpartition(":")
        return "duckdb_table", f"duckdb:{file}:{table}", None, table.rsplit(".", 1)[-1]
    head, sep, table = text.rpartition(":")
    if sep and head.lower().endswith((".duckdb", ".db", ".ddb")) and table:
        return "duckdb_table", f"duckdb:{head}:{table}", None, table.rsplit(".", 1)[-1]
    name = Path(text).name
    for suffix in (".csv.gz", ".tsv.gz"):
        if name.lower().endswith(suffix):
            return "file", text, None, name[: -len(suffix)]
    return "file", text, None, Path(text).stem


def _without_password(url: str) -> tuple[str, bool]:
    parts = urlsplit(url)
    if parts.password is None:
        return url, False
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment)), True


def _read_columns(kind: str, source: str, connection: str | None) -> list[tuple[str, str]]:
    try:
        if kind == "postgres":
            from dpgate.engines.postgres import describe_relation

            assert connection is not None
            return describe_relation(connection, source)
        from dpgate.engines.duckdb import describe_source

        return describe_source(source)
    except ValueError as e:
        raise InvalidRequest(f"cannot read the schema of {source!r}: {e}", {"source": source}) from None


def _ask_unit(names: list[str], hint: str | None) -> tuple[str | None, bool]:
    """(unit, record_level) asked on the terminal; (None, False) leaves a TODO."""
    shown = ", ".join(names)
    default = f" [{hint}]" if hint else ""
    while True:
        answer = input(f"privacy unit — which column identifies one person? ({shown}; '-' for record-level, "
                       f"'?' to decide later){default}: ").strip()
        if not answer and hint:
            return hint, False
        if answer in ("", "?"):
            return None, False
        if answer == "-":
            return None, True
        if answer in names:
            return answer, False
        print(f"no column {answer!r}; the columns are: {shown}", file=sys.stderr)


def _policy_path(args: argparse.Namespace, settings, name: str) -> Path:
    folder = Path(settings.policies)
    path = folder / f"{name}.toml"
    if path.exists() and not args.force and not args.stdout:
        raise InvalidRequest(f"{path} exists; pass --force to overwrite it or --name for another name",
                             {"file": str(path)})
    return path


def _finish(args: argparse.Namespace, path: Path, text: str, draft: drafts.DraftPolicy) -> int:
    import tomllib

    from dpgate.policy import draft_todos

    todos = draft_todos(tomllib.loads(text))
    if args.stdout:
        sys.stdout.write(text)
        for note in draft.notes:
            print(f"dpgate: {note}", file=sys.stderr)
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if args.json:
        print_json({"file": str(path), "dataset": draft.name, "todo": [".".join(t) for t in todos],
                    "notes": draft.notes})
        return 0
    for note in draft.notes:
        print(f"note: {note}")
    if todos:
        print(f"wrote {path}: {len(todos)} value(s) are TODO (bounds, key lists, contribution bounds, the cap): "
              f"decide them from domain knowledge, never from the data; then run `dpgate datasets check "
              f"{draft.name}`")
    else:
        print(f"wrote {path}; check it with `dpgate datasets check {draft.name}`")
    return 0


def run_init(args: argparse.Namespace, settings) -> int:
    """Read SOURCE's schema and write the draft (see the module docstring)."""
    kind, source, connection, default_name = _split_source(args.source)
    name = drafts.dataset_name(args.name or default_name)
    policies = Path(settings.policies)
    project_root = policies.resolve().parent
    read_from = source
    if kind == "file":
        read_from = str(Path(source).expanduser().resolve())
        written = drafts.relative_source(Path(read_from), project_root)
    elif kind == "duckdb_table":
        file, _, table = source[len("duckdb:"):].rpartition(":")
        abs_file = Path(file).expanduser().resolve()
        read_from = f"duckdb:{abs_file}:{table}"
        written = f"duckdb:{drafts.relative_source(abs_file, project_root)}:{table}"
    else:
        written = source
    columns = _read_columns(kind, read_from, connection)
    if not columns:
        raise InvalidRequest(f"{args.source!r} has no columns", {"source": args.source})
    dialect = "postgres" if kind == "postgres" else "duckdb"
    draft_columns = [drafts.DraftColumn(n, drafts.column_type(t, dialect), native=t) for n, t in columns]
    names = [n for n, _ in columns]
    hint = drafts.suggest_unit(names)
    unit, record_level = args.unit, bool(args.record_level)
    if unit is not None and unit not in names:
        raise InvalidRequest(f"--unit {unit!r} is not a column of the source; its columns: {', '.join(names)}",
                             {"unit": unit, "columns": names})
    path = _policy_path(args, settings, name)
    if unit is None and not record_level and sys.stdin.isatty() and sys.stdout.isatty() and not args.json:
        unit, record_level = _ask_unit(names, hint)
    header = [f"Draft policy for {args.source if kind != 'postgres' else written}, written by `dpgate policy init`",
              "from the source's schema only: column names and types (a CSV's types are DuckDB's sniffed",
              "types: check them); no value of the data is in this file."]
    notes = []
    conn_written = None
    if connection is not None:
        conn_written, had_password = _without_password(connection)
        if had_password:
            notes.append(f"the connection's password is not written into the file: set DPGATE_CONNECTION_"
                         f"{name.upper()} to the full connection string (or add it to {conn_written})")
    table = drafts.DraftTable(drafts.dataset_name(default_name), written, draft_columns, unit=unit,
                              unit_hint=hint, record_level=record_level)
    draft = drafts.DraftPolicy(name=name, tables=[table], epsilon=args.epsilon, delta=args.delta,
                               engine="postgres" if kind == "postgres" else "duckdb", connection=conn_written,
                               header=header, notes=notes)
    return _finish(args, path, drafts.draft_policy(draft), draft)


# --- import-smartnoise -------------------------------------------------------------------------


def _load_yaml(path: Path):
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        raise InvalidRequest("reading SmartNoise metadata needs PyYAML: pip install pyyaml") from None
    try:
        with path.open("r", encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except OSError as e:
        raise InvalidRequest(f"cannot read {path}: {e.strerror}", {"file": str(path)}) from None
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InvalidRequest(f"{path} is not valid YAML ({first})", {"file": str(path)}) from None


def _sources(args: argparse.Namespace, meta_path: Path, tables: list[str], project_root: Path) -> dict[str, str | None]:
    given: dict[str, str] = {}
    for item in args.source:
        table, sep, path = item.partition("=")
        if not sep:
            if len(tables) != 1:
                raise InvalidRequest(f"--source {item!r}: the metadata has {len(tables)} tables; write TABLE=PATH",
                                     {"tables": tables})
            table, path = tables[0], item
        if table not in tables:
            raise InvalidRequest(f"--source {item!r}: no table {table!r} in the metadata; its tables: "
                                 f"{', '.join(tables)}", {"tables": tables})
        given[table] = path
    out: dict[str, str | None] = {}
    for table in tables:
        if table in given:
            out[table] = drafts.relative_source(Path(given[table]).expanduser().resolve(), project_root)
            continue
        stems = ([meta_path.stem] if len(tables) == 1 else []) + [table]
        found = next((meta_path.parent / f"{s}{ext}" for s in stems for ext in (".csv", ".parquet")
                      if (meta_path.parent / f"{s}{ext}").is_file()), None)
        out[table] = drafts.relative_source(found, project_root) if found else None
    return out


def run_import_smartnoise(args: argparse.Namespace, settings) -> int:
    """Convert the metadata and write the policy (see the module docstring)."""
    meta_path = Path(args.metadata).expanduser()
    meta = _load_yaml(meta_path)
    if not isinstance(meta, dict):
        raise InvalidRequest(f"{meta_path} is not SmartNoise metadata (expected collection → schema → table)",
                             {"file": str(meta_path)})
    name = drafts.dataset_name(args.name or meta_path.stem)
    project_root = Path(settings.policies).resolve().parent
    try:
        tables = [t for _, _, t, _ in drafts._tables_of(meta)]
    except DpgateError as e:
        raise InvalidRequest(f"{meta_path}: {e.message}", {"file": str(meta_path)}) from None
    sources = _sources(args, meta_path.resolve(), tables, project_root)
    try:
        draft = drafts.from_smartnoise(meta, name=name, sources=sources, epsilon=args.epsilon, delta=args.delta)
    except DpgateError as e:
        raise InvalidRequest(f"{meta_path}: {e.message}", {"file": str(meta_path)}) from None
    draft.header.insert(1, f"Source: {meta_path.name}.")
    path = _policy_path(args, settings, name)
    return _finish(args, path, drafts.draft_policy(draft), draft)
