"""Draft policy files: from a source's schema (``dpgate policy init``) or from SmartNoise metadata
(``dpgate policy import-smartnoise``). Pure: the CLI reads the schema (through the engines) or
the YAML and passes plain values here; this module writes TOML text.

**Why a draft leaves every bound and key list as a TODO.** A bound or a key list computed from
the rows (their min, max or distinct values) depends on the very records the policy protects:
one person's extreme value moves the max, one person's rare category appears in the list, and
both are then published with every release (and enforced as a clamp). Bounds and keys must come
from what is known without looking at the data — a form's valid range, a code book, a public
list. So :func:`draft_policy` writes them as the string ``"TODO"`` (:data:`dpgate.policy.TODO`),
and a policy with any ``"TODO"`` left is refused by :func:`dpgate.policy.load_policy`;
``dpgate datasets check`` lists what is missing (:func:`describe_todo`). Only facts that do
not depend on the rows are filled in: column names, types, a boolean's domain {true, false}.

SmartNoise metadata (``snsql``'s YAML: collection → schema → table → columns and table options)
maps as :func:`from_smartnoise` documents; each difference is written as a comment in the
policy and returned as a note for the CLI to print.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from dpgate.errors import InvalidRequest
from dpgate.policy import TODO

__all__ = ["DraftColumn", "DraftTable", "DraftPolicy", "column_type", "suggest_unit", "draft_policy",
           "from_smartnoise", "describe_todo", "TODO"]

# --- types ----------------------------------------------------------------------------------

_DUCKDB_TYPES = (
    (re.compile(r"^(U?(TINY|SMALL|BIG|HUGE)?INT(EGER)?|INT[1248]|INT128|LONG|SHORT)$"), "int"),
    (re.compile(r"^(FLOAT[48]?|REAL|DOUBLE|DECIMAL(\(.*\))?|NUMERIC(\(.*\))?)$"), "float"),
    (re.compile(r"^(VARCHAR(\(.*\))?|TEXT|STRING|CHAR(\(.*\))?|BPCHAR|UUID)$"), "text"),
    (re.compile(r"^(BOOL|BOOLEAN|LOGICAL)$"), "bool"),
    (re.compile(r"^DATE$"), "date"),
    (re.compile(r"^(TIMESTAMP|DATETIME|TIMESTAMP WITH TIME ZONE|TIMESTAMPTZ|TIMESTAMP_(S|MS|NS|US))$"), "timestamp"),
)
_POSTGRES_TYPES = (
    (re.compile(r"^(smallint|integer|bigint|int[248]?)$"), "int"),
    (re.compile(r"^(real|double precision|float[48]?|numeric(\(.*\))?|decimal(\(.*\))?)$"), "float"),
    (re.compile(r"^(text|character varying(\(.*\))?|varchar(\(.*\))?|character(\(.*\))?|char(\(.*\))?|citext|"
                r"uuid|name)$"), "text"),
    (re.compile(r"^boolean$"), "bool"),
    (re.compile(r"^date$"), "date"),
    (re.compile(r"^timestamp( without time zone| with time zone)?(\(\d+\))?$|^timestamptz$"), "timestamp"),
)


def column_type(native: str, dialect: str = "duckdb") -> str | None:
    """The policy type (int, float, text, bool, date, timestamp) of a native column type, or None
    when there is none (lists, structs, blobs, intervals, times: such a column is left out).

    Args:
        native: the type name DuckDB (``DESCRIBE``) or PostgreSQL (``format_type``) reports.
        dialect: ``"duckdb"`` or ``"postgres"``.
    """
    text = native.strip()
    table = _POSTGRES_TYPES if dialect == "postgres" else _DUCKDB_TYPES
    probe = text.lower() if dialect == "postgres" else text.upper()
    for pattern, kind in table:
        if pattern.match(probe):
            return kind
    return None


_UNIT_NAME = re.compile(
    r"^(.*_)?(user|person|people|patient|customer|client|member|account|employee|student|device|household|"
    r"individual|subject|respondent|author|owner|visitor)(_?(id|key|no|number))?$|^(pid|uid|person|userid)$",
    re.IGNORECASE)


def suggest_unit(names: Iterable[str]) -> str | None:
    """A column whose *name* suggests it identifies the protected person (``user_id``,
    ``patient_id``, ``pid``, ``DeviceID``…), or None. Only names are looked at; the choice is the
    policy author's (the privacy unit decides whom the guarantee protects)."""
    names = list(names)
    for name in names:
        if _UNIT_NAME.match(name.replace(" ", "_")) or _UNIT_NAME.match(_snake(name)):
            return name
    for name in names:
        if re.search(r"(^|_)id$", _snake(name)):
            return name
    return None


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


# --- the draft ------------------------------------------------------------------------------


@dataclass
class DraftColumn:
    """One column of a draft table.

    Attributes:
        name: as in the data.
        type: the policy type, or None when the native type has none (written as a comment).
        native: the source's own type name (shown in the comment).
        lower, upper: known bounds (SmartNoise metadata), else None (→ TODO for int, float,
            date and timestamp columns).
        public_keys: a known key list, else None (→ TODO for text and int columns, [true, false]
            for bool).
        comment: extra words for the line's comment.
        todo: True (``policy init``): undecided bounds and keys are written as TODO; False
            (an import whose format already decided them): they are left out.
    """

    name: str
    type: str | None
    native: str = ""
    lower: Any = None
    upper: Any = None
    public_keys: Any = None
    comment: str = ""
    todo: bool = True


@dataclass
class DraftTable:
    """One table of a draft.

    Attributes:
        name: the table name queries use (a plain identifier).
        source: the ``source`` value as written in the file (a path relative to the project
            root, an absolute path, ``duckdb:<file>:<table>``, or ``[schema.]table`` for
            PostgreSQL), or None (→ TODO).
        columns: in source order.
        unit: the privacy unit column; None → a TODO (or record-level with ``record_level``).
        unit_hint: a suggested unit, written in the TODO's comment.
        record_level: each row is one person (no ``privacy_unit`` line).
        max_groups_per_unit, max_rows_per_unit: k and m, or None (→ TODO).
        comments: lines written above the table (differences from the source format…).
    """

    name: str
    source: str | None
    columns: list[DraftColumn]
    unit: str | None = None
    unit_hint: str | None = None
    record_level: bool = False
    max_groups_per_unit: int | None = None
    max_rows_per_unit: int | None = None
    comments: list[str] = field(default_factory=list)


@dataclass
class DraftPolicy:
    """A whole draft: ``[dataset]``, ``[budget]``, ``[allocations]`` and the tables."""

    name: str
    tables: list[DraftTable]
    population: str | None = None
    epsilon: float | None = None
    delta: float | None = None
    engine: str = "duckdb"
    connection: str | None = None
    clamp_counts: bool | None = None
    header: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(name: str) -> str:
    """A TOML key: bare when possible, else a basic string."""
    return name if _BARE_KEY.match(name) else json.dumps(name, ensure_ascii=False)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("a policy value must be finite")
        text = repr(v)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} in a policy")


_WHY_BOUNDS = "lower/upper: the valid range, from domain knowledge (delete both if it is never summed)"
_WHY_KEYS = "public_keys: a public list of keys or delete it (GROUP BY then selects keys privately)"
_WHY_DATES = "lower/upper: the date range, from domain knowledge (delete both if unused)"


def _column_line(col: DraftColumn, unit_candidate: bool = False) -> str:
    """One ``[tables.T.columns]`` line; ``unit_candidate``: the suggested privacy unit (no bounds
    are asked of it: a privacy unit column is never summed)."""
    if col.type is None:
        return f"# {_key(col.name)}: the source type {col.native or '?'} has no policy type; left out (queries cannot name it)"
    parts = [f"type = {_value(col.type)}"]
    why: list[str] = []
    known = col.lower is not None and col.upper is not None
    if unit_candidate:
        pass  # an identifier: no bounds to decide, whatever the data's type
    elif col.type in ("int", "float", "date", "timestamp") and (known or col.todo):
        lo = col.lower if known else TODO
        hi = col.upper if known else TODO
        if col.type == "float":
            lo, hi = (float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x for x in (lo, hi))
        parts += [f"lower = {_value(lo)}", f"upper = {_value(hi)}"]
        if not known:
            why.append(_WHY_DATES if col.type in ("date", "timestamp") else _WHY_BOUNDS)
    elif col.type in ("int", "float"):
        why.append("no bounds: SUM/AVG/VAR/quantiles of it are refused until you add lower/upper")
    if col.type == "bool":
        parts.append(f"public_keys = {_value(list(col.public_keys) if col.public_keys else [True, False])}")
        if not col.public_keys:
            why.append("a boolean's domain is public without looking at the data")
    elif col.type in ("text", "int") and not unit_candidate:
        keys = col.public_keys
        if keys is not None:
            parts.append(f"public_keys = {_value(keys)}")
        elif col.todo:
            parts.append(f"public_keys = {_value(TODO)}")
            why.append(_WHY_KEYS)
        elif col.type == "text":
            why.append("no public_keys: GROUP BY selects keys privately (add the list if it is public)")
    if col.comment:
        why.append(col.comment)
    native = f"{col.native}: " if col.native else ""
    return f"{_key(col.name)} = {{ {', '.join(parts)} }}" + (f"  # {native}{'; '.join(why)}" if why or native else "")


def draft_policy(draft: DraftPolicy) -> str:
    """The TOML text of ``draft``: every undecided value is ``"TODO"`` with a comment saying what
    to decide and why it must not come from the data. The text is a valid TOML document; the
    policy loads once no TODO is left (:func:`dpgate.policy.draft_todos`)."""
    out: list[str] = [f"# {line}" if line else "#" for line in draft.header]
    out += [
        "#",
        "# Every \"TODO\" below is a decision the gateway must not take from the data: a bound or a",
        "# key list computed from the rows (min, max, distinct values) depends on the people the",
        "# policy protects (one person's extreme value moves the max, one rare category appears in",
        "# the list) and would be published with every release. Take them from domain knowledge",
        "# (a form's valid range, a code book, a public list). Until none is left the gateway refuses",
        f"# this file; `dpgate datasets check {draft.name}` lists what is missing.",
        "# Relative source paths resolve against the project root: the folder that holds policies/.",
        "",
        "[dataset]",
        f"name = {_value(draft.name)}",
        f"population = {_value(draft.population or draft.name)}"
        "  # the people the data is about: datasets about the same people must name the same population",
    ]
    if draft.engine != "duckdb":
        out.append(f"engine = {_value(draft.engine)}")
    if draft.connection:
        out.append(f"connection = {_value(draft.connection)}"
                   "  # or leave it out and set DPGATE_CONNECTION_<DATASET> (keeps passwords out of the file)")
    out += ["", "[budget]                     # the published guarantee of the population: a governance decision"]
    out.append(f"epsilon = {_value(TODO if draft.epsilon is None else float(draft.epsilon))}"
               + ("  # the cap's total ε, e.g. 1.0" if draft.epsilon is None else ""))
    out.append(f"delta = {_value(TODO if draft.delta is None else float(draft.delta))}"
               + ("  # the cap's δ, e.g. 1e-6: well below 1 / the number of people" if draft.delta is None else ""))
    out.append("default_query_rho = 0.001    # ρ (zCDP) of a query that names no budget")
    if draft.clamp_counts is not None:
        out.append(f"clamp_counts = {_value(draft.clamp_counts)}")
    out += ["", "[allocations]                # shares of the cap per consumer (API keys name their consumer); sum <= 1",
            "analysts = 1.0"]
    for table in draft.tables:
        out += ["", *[f"# {c}" for c in table.comments], f"[tables.{_key(table.name)}]"]
        out.append(f"source = {_value(table.source or TODO)}"
                   + ("  # a CSV/Parquet path, duckdb:<file>:<table>, or [schema.]table for PostgreSQL"
                      if table.source is None else ""))
        if table.record_level:
            out.append("# no privacy_unit: record-level privacy (each row is one person); k = m = 1")
        else:
            if table.unit:
                out.append(f"privacy_unit = {_value(table.unit)}  # the column that identifies one person")
            else:
                hint = (f'suggested: "{table.unit_hint}" (its name looks like an identifier); '
                        if table.unit_hint else "")
                out.append(f"privacy_unit = {_value(TODO)}  # {hint}the column that identifies one person "
                           "(delete the line for record-level privacy: each row one person)")
            k, m = table.max_groups_per_unit, table.max_rows_per_unit
            out.append(f"max_groups_per_unit = {_value(TODO if k is None else k)}"
                       "  # k: groups one person may add rows to in one query (contribution bounding)")
            out.append(f"max_rows_per_unit = {_value(TODO if m is None else m)}"
                       "  # m: rows one person may add to one group; more are dropped at random")
        out += ["", f"[tables.{_key(table.name)}.columns]"]
        for col in table.columns:
            if table.unit and col.name == table.unit:
                out.append(f"# {_key(col.name)}: the privacy unit, not declared as a column (never grouped by or summed)")
                continue
            candidate = not table.unit and not table.record_level and col.name == table.unit_hint
            line = _column_line(col, unit_candidate=candidate)
            if candidate:
                line += ("  #" if "  # " not in line else ";") + " if this is the privacy unit, delete this line"
            out.append(line)
    return "\n".join(out) + "\n"


# --- what a TODO is about -------------------------------------------------------------------

_TODO_WHY = {
    "epsilon": "the cap's total ε (a governance decision)",
    "delta": "the cap's δ (a governance decision; well below 1 / the number of people)",
    "source": "where the table's data is",
    "privacy_unit": "the column that identifies one person (or delete the line: record-level)",
    "max_groups_per_unit": "k, the groups one person may contribute to (contribution bound)",
    "max_rows_per_unit": "m, the rows one person may contribute per group (contribution bound)",
    "lower": "the lower bound (domain knowledge, never the data's minimum)",
    "upper": "the upper bound (domain knowledge, never the data's maximum)",
    "public_keys": "the public key list (never the data's distinct values), or delete it for private selection",
}


def describe_todo(path: Sequence[str]) -> tuple[str, str]:
    """``(where, what)`` of a TODO key path from :func:`dpgate.policy.draft_todos`, e.g.
    ``("table people, column age", "lower: the lower bound (…)")``."""
    parts = list(path)
    key = parts[-1] if parts else "?"
    if len(parts) >= 5 and parts[0] == "tables" and parts[2] == "columns":
        where = f"table {parts[1]}, column {parts[3]}"
    elif len(parts) >= 3 and parts[0] == "tables":
        where = f"table {parts[1]}"
    else:
        where = f"[{'.'.join(parts[:-1])}]" if len(parts) > 1 else "(top level)"
    return where, f"{key}: {_TODO_WHY.get(key, 'to be decided')}"


# --- SmartNoise metadata --------------------------------------------------------------------

#: SmartNoise table options (snsql metadata) and what becomes of them.
SMARTNOISE_TABLE_OPTIONS = frozenset({
    "max_ids", "row_privacy", "rows", "censor_dims", "clamp_counts", "clamp_columns", "sample_max_ids",
    "use_dpsu", "tau", "delta", "max_contrib"})
_SN_TYPES = {"int": "int", "integer": "int", "float": "float", "double": "float", "string": "text", "str": "text",
             "boolean": "bool", "bool": "bool", "datetime": "timestamp", "date": "date", "key": "text"}
_IDENT = re.compile(r"[^A-Za-z0-9_]")


def _identifier(name: str) -> str:
    text = _IDENT.sub("_", name).strip("_") or "t"
    return "t_" + text if text[0].isdigit() else text


def _tables_of(meta: Mapping[str, Any]) -> list[tuple[str, str, str, Mapping[str, Any]]]:
    """(collection, schema, table, table mapping) for every table of a SmartNoise document."""
    found = []
    for collection, schemas in meta.items():
        if collection == "engine" and not isinstance(schemas, Mapping):
            continue
        if not isinstance(schemas, Mapping):
            raise InvalidRequest(f"SmartNoise metadata: {collection!r} is not a collection of schemas")
        for schema, tables in schemas.items():
            if not isinstance(tables, Mapping):
                raise InvalidRequest(f"SmartNoise metadata: {collection}.{schema} is not a schema of tables")
            for table, spec in tables.items():
                if not isinstance(spec, Mapping):
                    raise InvalidRequest(f"SmartNoise metadata: {collection}.{schema}.{table} is not a table")
                found.append((str(collection), str(schema), str(table), spec))
    if not found:
        raise InvalidRequest("SmartNoise metadata declares no table (expected collection → schema → table → columns)")
    return found


def from_smartnoise(meta: Mapping[str, Any], *, name: str, sources: Mapping[str, str | None],
                    epsilon: float | None = None, delta: float | None = None) -> DraftPolicy:
    """A draft policy from SmartNoise SQL metadata (the YAML ``snsql`` reads), as a mapping.

    Mapping (each difference is written as a comment and returned in ``notes``):

    * the column with ``private_id: true`` → ``privacy_unit``; ``row_privacy: true`` or no
      private_id column → record-level privacy (each row one person).
    * ``max_ids`` (SmartNoise: the rows one person may have in the whole table, default 1) →
      k = 1 and m = max_ids. SmartNoise bounds a person's rows in the table; dpgate bounds the
      groups a person adds to (k) and the rows per group (m). k·m = max_ids keeps SmartNoise's
      sensitivity of a COUNT(*) (max_ids); k = 1 means that in a GROUP BY query dpgate keeps one
      group per person (chosen at random) where SmartNoise keeps up to max_ids rows across
      groups. Raise k (with m = ⌈max_ids / k⌉) if people spread over groups.
    * ``lower``/``upper`` (or the older ``min``/``max``) → the column's bounds (as declared in
      the metadata: a policy decision made there, not read from the data here).
    * ``type``: int, float, string → text, boolean → bool, datetime → timestamp.
    * ``censor_dims`` (drop rare keys) → nothing to set: a GROUP BY on a column without
      ``public_keys`` always selects keys privately (OpenDP's threshold), and with
      ``censor_dims: false`` SmartNoise would publish the keys found in the data, which dpgate
      never does. ``cardinality`` (a count) is not a key list: public_keys stay a TODO.
    * ``clamp_counts`` → ``[budget] clamp_counts`` (dpgate: per dataset, default true;
      SmartNoise: per table, default false); when the tables disagree, dpgate's default is kept.
    * ``clamp_columns: false`` (trust the data to lie within the bounds) is not followed: dpgate
      always clamps. ``sample_max_ids`` → dpgate always bounds by a salted random choice.
      ``use_dpsu`` → dpgate's own partition selection. ``rows`` (a public row count) → unused.
    * SmartNoise names tables ``schema.table`` (``FROM PUMS.PUMS``); dpgate by the table alone
      (``FROM PUMS``); a name that repeats across schemas becomes ``schema_table``.
    * the metadata holds no cap: ``epsilon``/``delta`` are the arguments, else TODO.

    Args:
        meta: the parsed YAML document.
        name: the dataset name.
        sources: table name → the ``source`` to write (None → TODO).
        epsilon, delta: the cap, or None (TODO).

    Raises:
        InvalidRequest: not SmartNoise metadata (the message says what was expected).
    """
    tables = _tables_of(meta)
    counts: dict[str, int] = {}
    for _, _, t, _ in tables:
        counts[t] = counts.get(t, 0) + 1
    notes: list[str] = []
    drafts: list[DraftTable] = []
    clamp_values = []
    for collection, schema, table, spec in tables:
        tname = _identifier(table if counts[table] == 1 else f"{schema}_{table}")
        comments = [f"SmartNoise table {'.'.join(p for p in (collection, schema, table) if p)}"
                    f" — query it as FROM {tname}"]
        columns: list[DraftColumn] = []
        unit = None
        for cname, cspec in spec.items():
            if cname in SMARTNOISE_TABLE_OPTIONS or not isinstance(cspec, Mapping):
                continue
            raw_type = str(cspec.get("type", "")).lower()
            ctype = _SN_TYPES.get(raw_type)
            lower = cspec.get("lower", cspec.get("min"))
            upper = cspec.get("upper", cspec.get("max"))
            col = DraftColumn(str(cname), ctype, native=f"SmartNoise {raw_type or 'no type'}", todo=False)
            if cspec.get("private_id") in (True, "true", "True"):
                if unit is None:
                    unit = col.name
                    if lower is not None or upper is not None:
                        comments.append(f"{cname}: its bounds in the metadata are dropped (the privacy unit is "
                                        "never summed)")
                else:
                    comments.append(f"{cname}: a second private_id column; dpgate has one privacy unit per "
                                    f"table ({unit}), so {cname} is an ordinary column")
            if ctype in ("int", "float") and lower is not None and upper is not None:
                col.lower, col.upper = lower, upper
                col.comment = "bounds from the SmartNoise metadata"
            if ctype in ("int", "float") and (lower is None) != (upper is None):
                col.comment = "the metadata gives one bound only; dpgate needs both"
            if cspec.get("cardinality") is not None and ctype in ("text", "int"):
                col.comment = (f"SmartNoise cardinality {cspec['cardinality']} is a count, not a key list; "
                               "list the public keys or delete public_keys (private selection)")
            if ctype is None:
                col.native = f"SmartNoise type {raw_type or '(none)'}"
            for extra in ("nullable", "missing_value", "sensitivity"):
                if extra in cspec:
                    comments.append(f"{cname}: SmartNoise {extra} = {cspec[extra]!r} has no dpgate equivalent "
                                    "(NULLs never count in a column aggregate; the sensitivity follows from "
                                    "the bounds)")
            columns.append(col)
        row_privacy = bool(spec.get("row_privacy", False))
        record_level = row_privacy or unit is None
        if row_privacy and unit is not None:
            comments.append(f"row_privacy is true: record-level privacy, although {unit} is marked private_id")
            unit = None
        elif unit is None:
            comments.append("no private_id column: record-level privacy (each row is one person)")
        max_ids = spec.get("max_ids", 1)
        k = m = None
        if not record_level:
            if not isinstance(max_ids, int) or isinstance(max_ids, bool) or max_ids < 1:
                raise InvalidRequest(f"SmartNoise metadata: {table}: max_ids must be a positive integer "
                                     f"(got {max_ids!r})")
            k, m = 1, max_ids
            if max_ids > 1:
                comments.append(f"max_ids = {max_ids} (SmartNoise: rows per person in the table) -> k = 1 group, "
                                f"m = {max_ids} rows per group: the same COUNT(*) sensitivity; in a GROUP BY "
                                "dpgate keeps one group per person (at random), SmartNoise up to max_ids rows "
                                "across groups; raise k (m = max_ids / k) if people spread over groups")
            else:
                comments.append("max_ids = 1 -> k = m = 1: one row per person, the same bound")
        if spec.get("censor_dims") is False:
            comments.append("censor_dims = false: not followed; a GROUP BY on a column without public_keys "
                            "always selects keys privately")
        if spec.get("clamp_columns") is False:
            comments.append("clamp_columns = false: not followed; dpgate always clamps to the bounds")
        if "clamp_counts" in spec:
            clamp_values.append(bool(spec["clamp_counts"]))
        if spec.get("use_dpsu"):
            comments.append("use_dpsu: dpgate selects keys with its own threshold mechanism")
        source = sources.get(table, sources.get(tname))
        drafts.append(DraftTable(tname, source, columns, unit=None if record_level else unit,
                                 record_level=record_level, max_groups_per_unit=k, max_rows_per_unit=m,
                                 comments=comments))
        notes += [f"{tname}: {c}" for c in comments[1:]]
    clamp = None
    if clamp_values and all(v == clamp_values[0] for v in clamp_values):
        clamp = clamp_values[0]
        notes.append(f"clamp_counts = {str(clamp).lower()} (SmartNoise's, per table) -> [budget] clamp_counts "
                     "(dpgate's, per dataset)")
    elif clamp_values:
        notes.append("the tables disagree on clamp_counts: dpgate's default (true) is kept for the dataset")
    if epsilon is None or delta is None:
        notes.append("the metadata holds no cap: [budget] epsilon/delta are TODO (or pass --epsilon/--delta)")
    header = ["Converted from SmartNoise SQL metadata by `dpgate policy import-smartnoise`.",
              "Each difference from SmartNoise's meaning is stated in a comment above its table."]
    return DraftPolicy(name=name, tables=drafts, epsilon=epsilon, delta=delta, clamp_counts=clamp,
                       header=header, notes=notes)


def relative_source(path: Path, project_root: Path) -> str:
    """``path`` as a policy ``source``: relative to the project root when inside it, else absolute."""
    path = Path(path).resolve()
    try:
        return path.relative_to(project_root.resolve()).as_posix()
    except ValueError:
        return str(path)


def dataset_name(text: str) -> str:
    """A dataset name (a plain identifier) from a file or table name."""
    return _identifier(text)
