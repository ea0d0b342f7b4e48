"""Declared tables of a policy: :class:`TablePolicy`, contribution bounds (k, m), sources, and the
privacy unit through foreign keys (:class:`UnitPath`, issue 21).

Part of :mod:`dpgate.policy`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from dpgate import limits
from dpgate.errors import UnknownColumn
from dpgate.errors import policy_error as _policy_error
from dpgate.policy.columns import _parse_column
from dpgate.policy.fields import _NAME_RE, _check_keys, _name
from dpgate.policy.private_truncation import PrivateTruncation, parse_private_truncation
from dpgate.policy.public_keys import key_domain

if TYPE_CHECKING:
    from dpgate.policy.columns import ColumnPolicy
    from dpgate.policy.public_keys import KeyTuples


#: Largest k and m accepted.
MAX_CONTRIBUTION = 1_000_000


#: Column types a foreign key of a privacy unit path may have (exact ids; no float, bool or date keys).
UNIT_PATH_KEY_TYPES: tuple[str, ...] = ("int", "text")
_HOP_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*->\s*([A-Za-z_][A-Za-z0-9_]*)\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")


@dataclass(frozen=True)
class ForeignKeyHop:
    """One step of a privacy unit path: from ``column`` of the table the step leaves, to the one
    row of ``table`` whose ``key`` equals it (written ``"column -> table.key"``).

    ``key`` is declared ``unique = true`` in ``table`` (checked when the policy loads, verified on
    the data when it loads): each row then reaches at most one row, hence one unit. A NULL (or
    dangling) ``column`` reaches no row: such a row has no unit and is dropped, as a row whose
    unit column is NULL.
    """

    column: str
    table: str
    key: str

    def __str__(self) -> str:
        return f"{self.column} -> {self.table}.{self.key}"


@dataclass(frozen=True)
class UnitPath:
    """A privacy unit reached through foreign keys (issue 21; DESIGN.md "Policy additions").

    Declared as ``privacy_unit = { path = ["l_orderkey -> orders.o_orderkey", "o_custkey"] }``:
    one or more hops ``"<column> -> <table>.<unique key>"``, each leaving the table the previous
    hop reached (the first leaves the declaring table), then the privacy unit column of the last
    table reached. That table must carry its unit as a column (the path is spelt to the end, so
    every chain is explicit); a path never visits a table twice (cycles are refused).

    Attributes:
        hops: the steps, in order (at least one).
        unit: the privacy unit column of the last table reached (its ``privacy_unit``).
    """

    hops: tuple[ForeignKeyHop, ...]
    unit: str

    @property
    def unit_table(self) -> str:
        """The table whose unit column the path ends at."""
        return self.hops[-1].table

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables the hops reach, in order."""
        return tuple(h.table for h in self.hops)

    def to_list(self) -> list[str]:
        """The policy file's spelling: ``["l_orderkey -> orders.o_orderkey", "o_custkey"]``."""
        return [str(h) for h in self.hops] + [self.unit]

    def __str__(self) -> str:
        """``l_orderkey -> orders.o_orderkey -> o_custkey``."""
        return " -> ".join(self.to_list())


@dataclass(frozen=True)
class TablePolicy:
    """One declared table: where its rows come from and how each unit's contribution is bounded.

    Attributes:
        name: table name used in SQL (``FROM name``).
        dataset: the dataset (policy) it belongs to.
        source: absolute path of a CSV/Parquet file, or ``duckdb:<abs file>:<table>``.
        privacy_unit: column identifying the privacy unit, or None for record-level
            privacy (each row is its own unit; k = m = 1), for a public table, and for a
            table whose unit is reached through foreign keys (``unit_path``).
        max_groups_per_unit: k, the most GROUP BY groups one unit may affect.
        max_rows_per_unit: m, the most rows one unit may add to one group.
        columns: declared columns by name (read-only mapping, declaration order).
        path: the policy file (for error messages).
        public: True for a public table (``public = true``: no privacy unit, nothing to
            protect): its values and keys may be read as they are (grouped by any
            column, joined, answered exactly and for free when a query reads public
            tables only). A public table is *data*, read from the policy's data
            source like any other; declaring it public is the data owner's statement
            that releasing it exactly harms no one (a catalogue, a calendar, a list of
            regions) — the gateway never makes that judgement from the data.
        key_tuples: the combinations of key columns that occur together in a public table
            (:class:`KeyTuples`): on a public table read by the gateway, one over its key
            columns; on a joined table, one per public table joined. Empty in a policy as loaded.
        unit_path: the privacy unit through foreign keys (:class:`UnitPath`, issue 21), or None.
            Such a table is protected like any other (k, m, bounds) but has no unit column of
            its own (``privacy_unit`` is None and ``record_level`` False); the planner refuses
            queries reading it, before any charge, until it joins along the path.
        private_truncation: ``max_rows_per_unit = { private = true, outer = N }`` (issue 22 item 4,
            :mod:`dpgate.policy.private_truncation`): m is then ``outer`` until a DP choice applies
            (``chosen_in`` names its release); None for a fixed m.
    """

    name: str
    dataset: str
    source: str
    privacy_unit: str | None
    max_groups_per_unit: int
    max_rows_per_unit: int
    columns: Mapping[str, ColumnPolicy]
    path: Path | None = field(default=None, compare=False)
    public: bool = False
    key_tuples: tuple[KeyTuples, ...] = field(default=(), compare=False, repr=False)
    unit_path: UnitPath | None = None
    private_truncation: PrivateTruncation | None = None

    @property
    def record_level(self) -> bool:
        """True when every row is its own privacy unit: no ``privacy_unit`` column and no
        ``unit_path`` (also True of a public table, which has neither; see :attr:`public`)."""
        return self.privacy_unit is None and self.unit_path is None

    @property
    def relation(self) -> str:
        """Quoted DuckDB name of the loaded table: ``"<dataset>"."<table>"``."""
        return f"{quote_identifier(self.dataset)}.{quote_identifier(self.name)}"

    def column(self, name: str) -> ColumnPolicy:
        """The declared column ``name`` (exact, else case-insensitive match).

        Raises:
            UnknownColumn: the table declares no such column.
        """
        col = self.find_column(name)
        if col is None:
            raise UnknownColumn(
                f"table {self.name!r} of dataset {self.dataset!r} declares no column {name!r}",
                {"dataset": self.dataset, "table": self.name, "column": name},
            )
        return col

    def find_column(self, name: str) -> ColumnPolicy | None:
        """The declared column ``name`` (exact, else case-insensitive match), or None."""
        if name in self.columns:
            return self.columns[name]
        folded = name.casefold()
        for col in self.columns.values():
            if col.name.casefold() == folded:
                return col
        return None

    def key_combinations(self, columns: Iterable[str]) -> int:
        """Number of public-key combinations of ``columns`` (1 for none): the groups released
        (several columns of one public table count their tuples, :func:`key_domain`).

        Raises:
            UnknownColumn: a column is not declared.
            ValueError: a column has no public keys.
        """
        names = list(columns)
        return math.prod(len(values) for _, values in key_domain(self, names, [self.column(n) for n in names]))

    def check_data_columns(self, available: Iterable[str]) -> None:
        """Check that the unit column and every declared column exist in the loaded data.

        For the engine, at load time. Matching is case-insensitive (DuckDB identifiers).

        Args:
            available: column names of the source as read.

        Raises:
            PolicyError: naming the file, table and the first missing column.
        """
        present = {str(n).casefold() for n in available}
        needed = ([self.privacy_unit] if self.privacy_unit else []) + list(self.columns)
        for name in needed:
            if name.casefold() not in present:
                what = "privacy unit column" if name == self.privacy_unit else "declared column"
                raise _policy_error(
                    self.path, f"{what} is missing from the data source", self.name, name
                )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (without the source path): unit, bounds, columns.

        ``public`` is True for a public table, which has no privacy unit and no
        contribution bounds: ``privacy_unit``, ``max_groups_per_unit`` and
        ``max_rows_per_unit`` are None and ``record_level`` is False (its rows are not
        protected at all; queries reading public tables only are exact and free). A table
        whose unit is reached through foreign keys has ``privacy_unit`` None, ``record_level``
        False and ``unit_path`` (:meth:`UnitPath.to_list`); the key is absent otherwise.
        """
        out = {
            "name": self.name,
            "privacy_unit": self.privacy_unit,
            "record_level": self.record_level and not self.public,
            "public": self.public,
            "max_groups_per_unit": None if self.public else self.max_groups_per_unit,
            "max_rows_per_unit": None if self.public else self.max_rows_per_unit,
            "columns": {n: c.to_dict() for n, c in self.columns.items()},
        }
        if self.unit_path is not None:  # only then: existing descriptions stay as they were
            out["unit_path"] = self.unit_path.to_list()
        if self.private_truncation is not None:  # only then (issue 22 item 4)
            out["private_truncation"] = self.private_truncation.to_dict()
        return out


def quote_identifier(name: str) -> str:
    """Quote a DuckDB identifier: ``"name"`` with embedded quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


_TABLE_KEYS = {"source", "privacy_unit", "max_groups_per_unit", "max_rows_per_unit", "columns", "public"}


def _bound_int(raw: Mapping, key: str, path: Path, table: str) -> int | None:
    v = raw.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise _policy_error(path, f"{key} must be an integer (got {v!r})", table)
    if v < 1:
        raise _policy_error(path, f"{key} must be ≥ 1 (got {v})", table)
    if v > MAX_CONTRIBUTION:
        raise _policy_error(path, f"{key} must be ≤ {MAX_CONTRIBUTION} (got {v})", table)
    return v


_RELATION_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*){0,2}$")


def _resolve_source(source: Any, path: Path, table: str, engine: str = "duckdb") -> str:
    if not isinstance(source, str) or not source.strip():
        raise _policy_error(path, "source must be a non-empty string", table)
    looks_like_path = "/" in source or "\\" in source or source.lower().endswith((".parquet", ".parq"))
    if engine == "postgres" or (engine == "spark" and not looks_like_path):
        if not _RELATION_RE.match(source):
            raise _policy_error(
                path, f"source {source!r} must be a table or view name ([schema.]table) for the "
                f"{engine} engine", table,
            )
        return source
    root = path.resolve().parent.parent
    if source.startswith("duckdb:"):
        rest = source[len("duckdb:"):]
        file, sep, tname = rest.rpartition(":")
        if not sep or not file or not tname:
            raise _policy_error(path, 'a DuckDB source must be "duckdb:<file>:<table>"', table)
        fpath = Path(file)
        if not fpath.is_absolute():
            fpath = root / fpath
        return f"duckdb:{fpath}:{tname}"
    spath = Path(source)
    if not spath.is_absolute():
        spath = root / spath
    return str(spath)


def _parse_table(name: str, raw: Any, path: Path, dataset: str, engine: str = "duckdb") -> TablePolicy:
    _name(name, "table name", path, name)
    if not isinstance(raw, dict):
        raise _policy_error(path, "a table must be a TOML table", name)
    _check_keys(raw, _TABLE_KEYS, path, "the table", name)
    source = _resolve_source(raw.get("source"), path, name, engine)
    unit = raw.get("privacy_unit")
    unit_path: UnitPath | None = None
    k = _bound_int(raw, "max_groups_per_unit", path, name)
    truncation = parse_private_truncation(raw.get("max_rows_per_unit"), path, name, MAX_CONTRIBUTION)
    if truncation is not None:  # issue 22 item 4: m is the outer limit until a DP choice applies
        if raw.get("public", False) is True or raw.get("privacy_unit") is None:
            raise _policy_error(path, "max_rows_per_unit = { private = true, … } needs a privacy_unit (a record-level "
                                      "or public table has no unit whose rows could be counted)", name)
        raw = {**raw, "max_rows_per_unit": truncation.outer}
    m = _bound_int(raw, "max_rows_per_unit", path, name)
    public = raw.get("public", False)
    if not isinstance(public, bool):
        raise _policy_error(path, f"public must be true or false (got {public!r})", name)
    if public:
        for key in ("privacy_unit", "max_groups_per_unit", "max_rows_per_unit"):
            if raw.get(key) is not None:
                raise _policy_error(
                    path, f"a public table has no {key}: public = true declares that the table "
                    "holds nothing to protect (drop one of the two)", name)
    if unit is None:
        for key, v in (("max_groups_per_unit", k), ("max_rows_per_unit", m)):
            if v not in (None, 1):
                raise _policy_error(
                    path,
                    f"{key} = {v} needs a privacy_unit column (without one, every row is its "
                    "own unit and k = m = 1)",
                    name,
                )
        k = m = 1
    else:
        if isinstance(unit, dict):  # a privacy unit through foreign keys (issue 21)
            unit_path = _parse_unit_path(unit, path, name)
            unit = None
        elif not isinstance(unit, str) or not unit:
            raise _policy_error(
                path,
                "privacy_unit must be a column name, or { path = [\"<column> -> <table>.<key>\", …, "
                "\"<unit column>\"] } for a unit reached through foreign keys; omit the key for "
                "record-level privacy",
                name,
            )
        elif "\x00" in unit:
            raise _policy_error(path, "privacy_unit must not contain NUL", name)
        k = 1 if k is None else k
        m = 1 if m is None else m
    raw_cols = raw.get("columns", {})
    if not isinstance(raw_cols, dict):
        raise _policy_error(path, "columns must be a TOML table", name)
    columns: dict[str, ColumnPolicy] = {}
    folded: dict[str, str] = {}
    for cname, craw in raw_cols.items():
        col = _parse_column(cname, craw, path, name)
        if cname.casefold() in folded:
            raise _policy_error(
                path,
                f"columns {folded[cname.casefold()]!r} and {cname!r} differ only in case "
                "(DuckDB identifiers are case-insensitive)",
                name,
                cname,
            )
        folded[cname.casefold()] = cname
        if unit is not None and cname.casefold() == unit.casefold() and col.public_keys is not None:
            raise _policy_error(
                path, "the privacy unit column cannot have public keys (grouping by the unit "
                "is never allowed)", name, cname,
            )
        if col.bounded and m * max(map(abs, col.fixed_point_bounds)) > limits.MAX_STEPS:
            raise _policy_error(
                path,
                f"one unit may add max_rows_per_unit × max(|lower|, |upper|) / resolution = "
                f"{m} × {max(map(abs, col.fixed_point_bounds))} steps to a group's sum, more "
                "than 2**62 (the exact per-group aggregates could then overflow on some data); "
                "lower max_rows_per_unit, tighten the bounds or coarsen the resolution",
                name,
                cname,
            )
        columns[cname] = col
    return TablePolicy(
        name=name,
        dataset=dataset,
        source=source,
        privacy_unit=unit,
        max_groups_per_unit=k,
        max_rows_per_unit=m,
        columns=MappingProxyType(columns),
        path=path,
        public=public,
        unit_path=unit_path,
        private_truncation=truncation,
    )


def _parse_unit_path(raw: Mapping[str, Any], path: Path, table: str) -> UnitPath:
    """The syntax of ``privacy_unit = { path = [...] }`` (the tables it names: :func:`_check_unit_paths`)."""
    _check_keys(raw, {"path"}, path, "privacy_unit", table)
    steps = raw.get("path")
    if not isinstance(steps, list) or not all(isinstance(x, str) for x in steps):
        raise _policy_error(path, "privacy_unit.path must be a list of strings: "
                                  "[\"<column> -> <table>.<key>\", …, \"<unit column>\"]", table)
    if len(steps) < 2:
        raise _policy_error(path, "privacy_unit.path needs at least one hop \"<column> -> <table>.<key>\" "
                                  "and then the unit column of the table it reaches (a unit column of this "
                                  "table is written privacy_unit = \"<column>\")", table)
    hops = []
    for i, step in enumerate(steps[:-1]):
        m = _HOP_RE.match(step)
        if m is None:
            raise _policy_error(path, f"privacy_unit.path step {i + 1} ({step!r}) must read "
                                      "\"<column> -> <table>.<key>\"", table)
        hops.append(ForeignKeyHop(*m.groups()))
    last = steps[-1].strip()
    if not _NAME_RE.match(last):
        raise _policy_error(path, f"the last element of privacy_unit.path ({steps[-1]!r}) must be the unit "
                                  f"column of table {hops[-1].table!r} (a plain column name)", table)
    return UnitPath(tuple(hops), last)


def _find_table(tables: Mapping[str, TablePolicy], name: str) -> TablePolicy | None:
    if name in tables:
        return tables[name]
    return next((t for t in tables.values() if t.name.casefold() == name.casefold()), None)


def _check_unit_paths(tables: Mapping[str, TablePolicy], path: Path) -> None:
    """Every privacy unit path names declared tables and columns, through unique keys of one
    type with their foreign keys, without visiting a table twice, to the unit column of a
    protected table that carries it. One clear line per problem (:class:`PolicyError`)."""
    for table in tables.values():
        up = table.unit_path
        if up is None:
            continue
        here, seen = table, [table.name.casefold()]
        for i, hop in enumerate(up.hops, 1):
            where = f"privacy_unit.path step {i} ({hop})"
            fk = here.find_column(hop.column)
            if fk is None:
                raise _policy_error(path, f"{where}: table {here.name!r} declares no column {hop.column!r} "
                                          f"(declare it in [tables.{here.name}.columns])", table.name)
            target = _find_table(tables, hop.table)
            if target is None:
                raise _policy_error(path, f"{where}: no table {hop.table!r} is declared", table.name)
            if target.name.casefold() in seen:
                raise _policy_error(path, f"{where}: the path returns to table {target.name!r}; cycles are "
                                          "refused (a unit path visits each table once)", table.name)
            key = target.find_column(hop.key)
            if key is None:
                raise _policy_error(path, f"{where}: table {target.name!r} declares no column {hop.key!r}",
                                    table.name)
            if not key.unique:
                raise _policy_error(path, f"{where}: {target.name}.{key.name} is not declared unique "
                                          "(unique = true): a key that repeats would attribute one row to "
                                          "several units", table.name)
            if fk.type not in UNIT_PATH_KEY_TYPES or fk.type != key.type:
                raise _policy_error(path, f"{where}: {here.name}.{fk.name} ({fk.type}) and "
                                          f"{target.name}.{key.name} ({key.type}) must both be int or both "
                                          "text", table.name)
            here = target
            seen.append(target.name.casefold())
        if here.public:
            raise _policy_error(path, f"privacy_unit.path ends at public table {here.name!r}, which has no "
                                      "privacy unit", table.name)
        if here.unit_path is not None:
            raise _policy_error(path, f"privacy_unit.path ends at table {here.name!r}, whose unit is itself a "
                                      "path: spell the whole chain to the table that carries the unit column",
                                table.name)
        if here.privacy_unit is None:
            raise _policy_error(path, f"privacy_unit.path ends at table {here.name!r}, which is record-level "
                                      "(no privacy_unit column)", table.name)
        if up.unit.casefold() != here.privacy_unit.casefold():
            raise _policy_error(path, f"privacy_unit.path ends at {here.name}.{up.unit}, which is not the "
                                      f"privacy unit of {here.name!r} ({here.privacy_unit})", table.name)
