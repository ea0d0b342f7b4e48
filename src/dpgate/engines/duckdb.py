"""The DuckDB engine: one dataset in a locked-down, embedded DuckDB database.

This is the only module of dpgate that imports DuckDB. For one dataset it

1. makes every declared table available as ``"<dataset>"."<table>"`` with only
   the declared columns (each ``TRY_CAST`` to its declared type: int → BIGINT,
   float → DOUBLE, text → VARCHAR, bool → BOOLEAN; a value that does not convert
   becomes NULL instead of failing the load) and the privacy unit column, kept
   as stored (see :mod:`dpgate.engines.base`), either

   * **in memory** (``load = "memory"``): copied once into the in-memory
     database — fastest queries, memory grows with the data; or
   * **in place** (``load = "in_place"``): a view over the files themselves
     (Parquet, CSV, or a read-only attached DuckDB file); only the columns and
     row groups a query needs are read, so memory stays bounded by the query's
     own state (its hash tables; DuckDB spills them to its temp directory above
     ``memory_limit``), not by the file. The files are pinned: each query first
     checks their size and modification time, and a changed file is refused
     (409 ``conflict``) until the dataset is reloaded.
   * ``load = "auto"`` (default): in place when the table's files total more than
     ``in_place_above_bytes`` (``DPGATE_DUCKDB_IN_PLACE_ABOVE``, 1 GB), else in memory.

   Each column declared ``unique = true`` is verified on the loaded (typed) values:
   ``count(c) = count(DISTINCT c)``, else the dataset is refused with the two counts
   (never a value). In place, the files are pinned, so the check holds for every query.

2. then locks the database down: no file system or network access
   (``enable_external_access = false``) except reading the in-place files
   themselves (``allowed_paths``), no extension auto-install/auto-load, no
   community or unsigned extensions, and ``lock_configuration = true`` so that
   no later statement can change any of that (``SET``/``RESET``/``PRAGMA`` fail);
3. executes only the gateway's generated bounded SQL, one SELECT statement, with
   a per-query timeout, and returns NumPy columns.

Sources (``TablePolicy.source``):

* ``*.csv`` (also ``.tsv``, ``.txt``, ``.csv.gz``): ``read_csv(header = true,
  all_varchar = true)`` — the dialect is auto-detected, every field is read as
  text and each declared column is then cast to its type, so a hostile
  or malformed value (``NaN``, ``inf``, ``1e300``, empty, text in a number
  column) never aborts the load or silently changes a column's type. Note
  DuckDB's casts: ``'3.7'`` → BIGINT 4 (rounded), ``'1e400'`` → DOUBLE inf (the
  bounding rewrite turns NaN/±inf into NULL before clamping).
* ``*.parquet`` (a glob is allowed; the matches at load time are pinned):
  ``read_parquet``; declared columns are ``TRY_CAST`` from their native types.
* ``duckdb:<file>:<table>``: the file is ATTACHed read-only; in memory the table
  is copied and the file DETACHed, in place it stays attached.

Thread-safety: one DuckDB database per engine; :meth:`DuckDBEngine.execute`
opens a fresh cursor per call, so concurrent queries from several threads are
safe; loading and closing hold a lock. Errors never carry data values: DuckDB
messages (which can quote a row) are replaced by the exception's class name.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Callable

import duckdb
import numpy as np

from dpgate.engines.watchdog import Watchdog
from dpgate.engines.hashing import group_hash
from dpgate.engines.unit_joins import integer_unit_joins
from dpgate.engines.base import (
    CANONICAL_INT_RE,
    EngineOptions,
    LoadReport,
    NULL_LIKE_UNITS,
    Query,
    TableInfo,
    check_unique_counts,
    check_unit_declaration,
    unique_columns,
    check_unique_units,
    file_signature,
    lossy_unit_error,
    non_canonical_unit_error,
    query_tree,
    resolve_columns,
    source_files,
    source_fingerprint,
    split_duckdb_source,
    table_error,
    table_to_columns,
)
from dpgate.errors import Conflict, ExecutionError, InvalidSql, QueryTimeout
from dpgate.policy import DatasetPolicy, TablePolicy, quote_identifier

__all__ = ["DuckDBEngine", "LOAD_MODES", "evaluate_tableless"]

CSV_SUFFIXES = (".csv", ".tsv", ".txt", ".csv.gz", ".tsv.gz")
PARQUET_SUFFIXES = (".parquet", ".parq")
#: Load modes of a DuckDB dataset (policy ``[dataset] load`` or ``DPGATE_DUCKDB_LOAD``).
LOAD_MODES = ("auto", "memory", "in_place")
_STAGE = "__dpgate_stage"

#: Settings applied after loading; ``lock_configuration`` last (it freezes the rest).
_LOCKDOWN = (
    "SET enable_external_access = false",
    "SET autoinstall_known_extensions = false",
    "SET autoload_known_extensions = false",
    "SET allow_community_extensions = false",
    "SET lock_configuration = true",
)
_INTEGER_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
                  "UINTEGER", "UBIGINT", "UHUGEINT"}
_TEXT_TYPES = {"VARCHAR"}
#: Integer types a unit declared int keeps as stored: each holds only values of BIGINT, so any two
#: compare exactly (their common type is at most BIGINT).
_NARROW_INT_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER"}
#: Exact integer types wider than BIGINT: a unit declared int stored so is cast to BIGINT after a
#: check that every id fits (compared as stored, HUGEINT with UHUGEINT goes through DOUBLE and
#: merges ids, DECIMAL(38, 0) with HUGEINT can fail: issue 19 item 2).
_WIDE_INT_TYPES = {"UBIGINT", "HUGEINT", "UHUGEINT"}


_TABLELESS = threading.local()


def _tableless_connection() -> "duckdb.DuckDBPyConnection":
    """This thread's in-memory DuckDB for :func:`evaluate_tableless`: no database file, no
    table, external access and extensions off, configuration locked, one thread. Kept per
    thread (a connection costs tens of milliseconds to open; the planner asks often)."""
    con = getattr(_TABLELESS, "con", None)
    if con is None or getattr(_TABLELESS, "pid", None) != os.getpid():  # not one inherited by a fork
        con = duckdb.connect(config={"enable_external_access": False, "threads": 1})
        for stmt in _LOCKDOWN:
            con.execute(stmt)
        _TABLELESS.con, _TABLELESS.pid = con, os.getpid()
    return con


def evaluate_tableless(sql: str) -> tuple[list[tuple], str]:
    """Run a query that reads no table (only ``range``, ``unnest``, ``VALUES`` and literals) in
    an in-memory DuckDB with no data, external access off, its configuration locked and one
    thread; for the planner, which enumerates a computed group key's domain from the policy
    (:mod:`dpgate.sql.keys`) and narrows public keys by a WHERE (:mod:`dpgate.sql.narrow`).
    The connection is kept per thread; one that failed a query is dropped.

    Returns:
        (rows, DuckDB type name of the first result column).

    Raises:
        ValueError: DuckDB refused or failed the query (its error class and first line).
    """
    con = _tableless_connection()
    try:
        cur = con.execute(sql)
        type_name = str(cur.description[0][1])
        return cur.fetchall(), type_name
    except duckdb.Error as e:
        _TABLELESS.con = None
        try:
            con.close()
        except duckdb.Error:  # pragma: no cover - closing a failed connection
            pass
        raise ValueError(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}") from None


def describe_source(source: str) -> list[tuple[str, str]]:
    """The columns of a data source as ``(name, DuckDB type)``, for drafting a policy
    (``dpgate policy init``); reads the schema, never a value into the result.

    Args:
        source: a CSV or Parquet file (or glob), or ``duckdb:<file>:<table>``.

    Types: Parquet and DuckDB tables carry their own schema; a CSV has none, so DuckDB's
    sniffer infers the types from a sample of the file (only the type names are returned).

    Raises:
        ValueError: the file is missing, of an unknown kind, or DuckDB cannot read it
            (its error class and first line).
    """
    con = duckdb.connect(config={"threads": 1})
    try:
        if source.startswith("duckdb:"):
            file, name = split_duckdb_source(source)
            if not os.path.isfile(file):
                raise ValueError(f"DuckDB file not found: {file}")
            con.execute(f"ATTACH {_sql_string(file)} AS __dpgate_source (READ_ONLY)")
            relation = ".".join(["__dpgate_source", *(quote_identifier(p) for p in name.split("."))])
        else:
            files = source_files(source)
            if not files or not all(os.path.isfile(f) for f in files):
                raise ValueError(f"data file not found: {source}")
            listed = "[" + ", ".join(_sql_string(f) for f in files) + "]"
            lower = source.lower()
            if lower.endswith(PARQUET_SUFFIXES):
                relation = f"read_parquet({listed})"
            elif lower.endswith(CSV_SUFFIXES):
                relation = f"read_csv({listed}, header = true)"
            else:
                raise ValueError(f"unknown kind of file {source!r}: expected {', '.join(CSV_SUFFIXES + PARQUET_SUFFIXES)}"
                                 " or duckdb:<file>:<table>")
        rows = con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]
    except duckdb.Error as e:
        raise ValueError(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    finally:
        con.close()


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _human_size(n: float) -> str:
    if n < 1000:
        return f"{int(n)} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if n < 1000 or unit == "GB":
            break
    return f"{n:.1f} {unit}"


def _lossy_type(duck_type: str) -> bool:
    t = duck_type.upper()
    if t in ("FLOAT", "DOUBLE", "REAL", "BOOLEAN"):
        return True
    if t.startswith("DECIMAL"):
        scale = t.rstrip(")").split(",")[-1].strip() if "," in t else "0"
        return scale not in ("0",)
    return False


class DuckDBEngine:
    """One dataset in an embedded DuckDB database, locked down after loading.

    Args:
        policy: the dataset's policy (``engine = "duckdb"``).
        options: engine settings (timeout, memory limit, threads, load mode).

    Raises:
        ValueError: a non-positive or non-finite timeout, threads < 1, an unknown load mode.
        ExecutionError: DuckDB refused the configuration.
    """

    kind = "duckdb"
    dialect = "duckdb"

    def __init__(self, policy: DatasetPolicy, options: EngineOptions | None = None) -> None:
        options = options or EngineOptions()
        timeout = float(options.timeout_s)
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout_s must be finite and > 0, got {options.timeout_s!r}")
        mode = getattr(policy, "load", None) or options.duckdb_load
        if mode not in LOAD_MODES:
            raise ValueError(f"load mode must be one of {', '.join(LOAD_MODES)}, got {mode!r}")
        config: dict[str, object] = {
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        }
        if options.duckdb_memory_limit is not None:
            config["memory_limit"] = str(options.duckdb_memory_limit)
        if options.duckdb_threads is not None:
            if int(options.duckdb_threads) < 1:
                raise ValueError(f"threads must be >= 1, got {options.duckdb_threads!r}")
            config["threads"] = int(options.duckdb_threads)
        self.policy = policy
        self.options = options
        self.timeout_s = timeout
        self.mode = mode
        try:
            self._con = duckdb.connect(":memory:", config=config)
        except duckdb.Error as e:
            raise ExecutionError(f"DuckDB refused the engine configuration ({type(e).__name__})") from None
        self._lock = threading.Lock()
        self._watchdog = Watchdog("dpgate-duckdb-timeout")  # one timer thread, started on first use
        self._locked_down = False
        self._closed = False
        self._tables: dict[str, TableInfo] = {}
        self._pinned: tuple[tuple[str, int, int], ...] = ()
        self._version: str | None = None
        self._attached = 0

    # ------------------------------------------------------------------ loading

    def load(self, progress: Callable[[str], None] | None = None) -> LoadReport:
        """Load (or map in place) every declared table once, then lock the database down.

        Args:
            progress: called with lines such as ``"loading usage.prompts (123.0 MB, in memory)…"``.

        Returns:
            A :class:`LoadReport`; its ``data_version`` is the policy's ``data_version``,
            else the :func:`~dpgate.engines.base.source_fingerprint` of its tables'
            source files (tables by name).

        Raises:
            PolicyError: a source file is missing or unreadable, of an unknown kind,
                not valid CSV/Parquet/DuckDB, lacks the unit column or a declared
                column, has ambiguous column names, or a lossy unit column (the
                message names the policy file, the source, the table and the column).
            ExecutionError: the engine was already loaded or is closed.

        On any failure the engine is closed (a half-loaded database is never used).
        """
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if self._locked_down:
                raise ExecutionError("the engine is already loaded and locked down; create a new engine")
            try:
                report = self._load_all(progress)
                for statement in _LOCKDOWN:
                    self._con.execute(statement)
            except BaseException:
                self._closed = True
                self._con.close()
                raise
            self._locked_down = True
            return report

    def _load_all(self, progress: Callable[[str], None] | None) -> LoadReport:
        policy = self.policy
        self._con.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(policy.name)}")
        files: list[str] = []
        in_place_files: list[str] = []
        for t_name in sorted(policy.tables):
            table = policy.tables[t_name]
            check_unit_declaration(table)
            t_files = self._check_files(table)
            size = sum(os.path.getsize(f) for f in t_files)
            mode = self.mode
            if mode == "auto":
                mode = "in_place" if size > self.options.in_place_above_bytes else "memory"
            if progress is not None:
                where = "in memory" if mode == "memory" else "in place"
                progress(f"loading {policy.name}.{table.name} ({_human_size(size)}, {where})…")
            unique, integer = self._load_table(table, t_files, mode)
            self._check_unique_columns(table)
            self._tables[table.name] = TableInfo(table.name, mode, unique, integer)
            files.extend(t_files)
            if mode == "in_place":
                in_place_files.extend(t_files)
        if in_place_files:
            paths = sorted(set(in_place_files))
            self._con.execute(f"SET allowed_paths = [{', '.join(_sql_string(p) for p in paths)}]")
            self._pinned = file_signature(paths)
        if policy.data_version:
            self._version, by = policy.data_version, "declared"
        else:
            self._version, by = source_fingerprint(files), "fingerprint"
        if self._pinned and file_signature([p for p, _, _ in self._pinned]) != self._pinned:
            raise table_error(next(iter(policy.tables.values())),
                              "a source file changed while it was loaded; load again")
        return LoadReport(policy.name, self.kind, self._version, by, dict(self._tables))

    @staticmethod
    def _check_files(table: TablePolicy) -> list[str]:
        files = source_files(table.source)
        missing = [f for f in files if not os.path.isfile(f)]
        if not files or missing:
            raise table_error(table, f"data source file not found: {missing[0] if missing else table.source}")
        return files

    def _source_relation(self, table: TablePolicy, files: list[str], keep_attached: bool) -> tuple[str, bool]:
        """(relation SQL, is_csv). Parquet/CSV globs read the files found at load time."""
        source = table.source
        if source.startswith("duckdb:"):
            file, name = split_duckdb_source(source)
            alias = f"__dpgate_source{self._attached}" if keep_attached else "__dpgate_source"
            if keep_attached:
                self._attached += 1
            self._con.execute(f"ATTACH {_sql_string(file)} AS {alias} (READ_ONLY)")
            parts = [quote_identifier(p) for p in name.split(".")]
            return ".".join([alias, *parts]), False
        lower = source.lower()
        listed = "[" + ", ".join(_sql_string(f) for f in files) + "]"
        if lower.endswith(PARQUET_SUFFIXES):
            return f"read_parquet({listed})", False
        if lower.endswith(CSV_SUFFIXES):
            return f"read_csv({listed}, header = true, all_varchar = true)", True
        raise table_error(
            table, f"unknown source kind {Path(source).suffix!r}: use .csv, .parquet or duckdb:<file>:<table>"
        )

    def _load_table(self, table: TablePolicy, files: list[str], mode: str) -> tuple[bool, bool]:
        """Create the table or view; returns (unit unique, unit stored as an integer)."""
        in_place = mode == "in_place"
        attached = table.source.startswith("duckdb:")
        try:
            relation, is_csv = self._source_relation(table, files, keep_attached=in_place)
            described = self._con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()
            stored = {str(row[0]): str(row[1]) for row in described}
            raw = self._csv_header(files[0], len(described)) if is_csv else list(stored)
            # DuckDB renames a CSV column whose name repeats another's up to case
            # (user_id → user_id_1): check ambiguity on the header as written, then map
            # each header name to DuckDB's column at the same position.
            by_position = dict(zip(raw, stored))
            names = {k: by_position[v] for k, v in resolve_columns(table, raw).items()}
            if is_csv and not in_place:
                # Stage the needed columns as read, then cast: DuckDB pushes a TRY_CAST down
                # into the CSV reader, which then fails on the first bad value.
                staged = ", ".join(quote_identifier(n) for n in dict.fromkeys(names.values()))
                self._con.execute(f"CREATE TEMP TABLE {_STAGE} AS SELECT {staged} FROM {relation}")
                relation = _STAGE
            select = self._projection(table, names, stored, relation, csv_in_place=is_csv and in_place)
            body = f"SELECT {', '.join(select)} FROM {relation}"
            if in_place:
                self._con.execute(f"CREATE VIEW {table.relation} AS {body}")
            else:
                self._con.execute(f"CREATE TABLE {table.relation} AS {body}")
            return self._unit_unique(table), self._unit_integer(table)
        except duckdb.Error as e:
            # DuckDB's message can quote a row of the file: keep it out of the error.
            raise table_error(
                table, f"DuckDB could not read the data source ({type(e).__name__}); check the file's format"
            ) from None
        finally:
            try:
                self._con.execute(f"DROP TABLE IF EXISTS {_STAGE}")
            except duckdb.Error:  # pragma: no cover
                pass
            if attached and not in_place:
                try:
                    self._con.execute("DETACH DATABASE IF EXISTS __dpgate_source")
                except duckdb.Error:  # pragma: no cover
                    pass

    def _csv_header(self, file: str, width: int) -> list[str]:
        """The header row of a CSV file as written (same dialect sniffing, no renaming)."""
        row = self._con.execute(
            f"SELECT * FROM read_csv({_sql_string(file)}, header = false, all_varchar = true) LIMIT 1"
        ).fetchone()
        names = [str(v) if v is not None else "" for v in (row or ())]
        return names if len(names) == width else [str(r[0]) for r in self._con.execute(
            f"DESCRIBE SELECT * FROM read_csv({_sql_string(file)}, header = true, all_varchar = true)").fetchall()]

    def _projection(self, table: TablePolicy, names: dict[str, str], stored: dict[str, str],
                    relation: str, *, csv_in_place: bool) -> list[str]:
        """The SELECT list exposing the table: declared columns cast, the unit as stored."""
        unit = table.privacy_unit
        select: list[str] = []
        for name in names:
            src_name = names[name]
            src = quote_identifier(src_name)
            if unit is not None and name.casefold() == unit.casefold():
                select.append(f"{self._unit_expression(table, name, src_name, stored, relation)} "
                              f"AS {quote_identifier(name)}")
                continue
            col = table.column(name)
            cast = (f"TRY(CAST({src} AS {col.duckdb_type}))" if csv_in_place
                    else f"TRY_CAST({src} AS {col.duckdb_type})")
            select.append(f"{cast} AS {quote_identifier(name)}")
        return select

    def _unit_expression(self, table: TablePolicy, name: str, src_name: str,
                         stored: dict[str, str], relation: str) -> str:
        """The unit column exactly as stored (see :mod:`dpgate.engines.base`)."""
        src = quote_identifier(src_name)
        stored_type = stored[src_name].upper()
        if _lossy_type(stored_type):
            raise lossy_unit_error(table, name, stored_type)
        declared = table.find_column(name)
        if stored_type not in _TEXT_TYPES:
            if declared is None or declared.type != "int" or stored_type in _NARROW_INT_TYPES:
                return src  # integers and other exact types stay native
            # a unit declared int is an exact integer of BIGINT's range on every engine, so that
            # two tables' int units compare without an implicit cast (sql/joins.py)
            if stored_type not in _WIDE_INT_TYPES and not stored_type.startswith("DECIMAL"):
                err = table_error(
                    table, f"the privacy unit column {name!r} is declared int but stored as {stored_type}: "
                    "declare it { type = \"text\" } (ids kept exactly as stored) or store it as an integer type")
                err.details["column"] = name
                raise err
            bad = self._con.execute(
                f"SELECT count(*) FROM {relation} WHERE {src} IS NOT NULL AND TRY_CAST({src} AS BIGINT) IS NULL"
            ).fetchone()[0]
            if bad:
                raise non_canonical_unit_error(table, name, int(bad))
            return f"CAST({src} AS BIGINT)"
        nulls = ", ".join(_sql_string(s) for s in NULL_LIKE_UNITS)
        guarded = f"CASE WHEN lower(trim({src})) IN ({nulls}) THEN NULL ELSE {src} END"
        if declared is None or declared.type != "int":
            return guarded
        bad = self._con.execute(
            f"SELECT count(*) FROM (SELECT {guarded} AS u FROM {relation}) "
            f"WHERE u IS NOT NULL AND (NOT regexp_full_match(u, {_sql_string(CANONICAL_INT_RE[1:-1])}) "
            "OR TRY_CAST(u AS BIGINT) IS NULL)"
        ).fetchone()[0]
        if bad:
            raise non_canonical_unit_error(table, name, int(bad))
        return f"CAST({guarded} AS BIGINT)"

    def _check_unique_columns(self, table: TablePolicy) -> None:
        """Verify each ``unique = true`` column on the loaded data: COUNT = COUNT(DISTINCT) (one scan).

        Raises:
            PolicyError: the counts differ (the counts only, never a value).
        """
        for name in unique_columns(table):
            c = quote_identifier(name)
            try:
                values, distinct = self._con.execute(
                    f"SELECT count({c}), count(DISTINCT {c}) FROM {table.relation}").fetchone()
            except duckdb.Error as e:
                raise table_error(table, f"DuckDB could not check that {name!r} is unique "
                                         f"({type(e).__name__})") from None
            check_unique_counts(table, name, values, distinct)

    def _unit_integer(self, table: TablePolicy) -> bool:
        """Whether the loaded unit column has an integer type (exact arithmetic hashing)."""
        if table.privacy_unit is None:
            return False
        rows = self._con.execute(f"DESCRIBE SELECT {quote_identifier(table.privacy_unit)} FROM {table.relation}").fetchall()
        # integers that a BIGINT holds (the hash's arithmetic casts to BIGINT)
        return str(rows[0][1]).upper() in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT",
                                            "USMALLINT", "UINTEGER")

    def _unit_unique(self, table: TablePolicy) -> bool:
        """Whether every non-NULL unit value occurs in one row at most (one scan)."""
        if table.privacy_unit is None:
            return False
        u = quote_identifier(table.privacy_unit)
        row = self._con.execute(
            f"SELECT count({u}) = count(DISTINCT {u}) FROM {table.relation}"
        ).fetchone()
        return bool(row[0])

    # ------------------------------------------------------------------ queries

    def unit_is_unique(self, table: str) -> bool:
        """True when the load found at most one row per privacy unit in ``table``."""
        info = self._tables.get(table) or next(
            (t for n, t in self._tables.items() if n.casefold() == table.casefold()), None)
        return bool(info and info.unit_unique)

    def current_version(self) -> str | None:
        """The raw data version found at load (declared or fingerprint)."""
        return self._version

    def render(self, query: Query) -> str:
        """DuckDB SQL of the bounded query (a sqlglot tree), with the portable group-choosing hash.

        The tree is rendered by sqlglot in the DuckDB dialect after the engine's transforms.

        Raises:
            ExecutionError: not a query tree (SQL text is not accepted). Conflict: the tree skips
                the per-unit aggregation on a table whose load did not find one row per unit.
        """
        tree = query_tree(query)
        check_unique_units(tree, self.policy.name, self.unit_is_unique)
        tree = integer_unit_joins(tree, self.policy, self._tables)  # issue 25 item 5
        return group_hash(tree, self.policy, self._tables, "duckdb").sql(dialect="duckdb")

    def _cursor(self) -> "duckdb.DuckDBPyConnection":
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if not self._locked_down:
                raise ExecutionError("the engine has no data yet: call load() first")
            if self._pinned and file_signature([p for p, _, _ in self._pinned]) != self._pinned:
                raise Conflict(
                    f"a data source file of dataset {self.policy.name!r} changed since it was loaded;"
                    " an admin must reload the dataset (POST /v1/admin/datasets/{name}/reload)",
                    {"dataset": self.policy.name},
                )
            return self._con.cursor()

    def check(self, query: Query) -> None:
        """Parse, bind and plan one generated SELECT without running it (``EXPLAIN``).

        Called before the ledger is charged, so that a query DuckDB cannot bind
        (a malformed rewrite, an out-of-range function argument) is refused for
        free. Reads no table data: the outcome depends only on the SQL and the schema.

        Raises:
            InvalidSql: DuckDB cannot parse or bind the SQL (class name only).
            ExecutionError: the engine is not loaded or is closed; not exactly one SELECT.
            Conflict: an in-place source file changed since the load.
        """
        sql = self.render(query)
        cursor = self._cursor()
        try:
            try:
                statements = cursor.extract_statements(sql)
            except duckdb.Error as e:
                raise InvalidSql(f"the query cannot be run: its rewrite does not parse ({type(e).__name__})") from None
            if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                raise ExecutionError("the engine executes exactly one SELECT statement")
            try:
                cursor.execute("EXPLAIN " + sql)
            except duckdb.Error as e:
                raise InvalidSql(
                    f"the query cannot be run: DuckDB refuses its rewrite ({type(e).__name__}); "
                    "check the types and arguments of the functions in WHERE"
                ) from None
        finally:
            cursor.close()

    def execute(self, query: Query) -> dict[str, np.ndarray]:
        """Run one generated SELECT and return its columns as NumPy arrays (via Arrow).

        See :func:`~dpgate.engines.base.to_numpy` for the lossless conversion
        (HUGEINT sums → ``int64`` when every value fits, else exact Python ints).

        Args:
            query: exactly one SELECT generated by the gateway (never the analyst's text).

        Returns:
            column name → 1-D array, in the result's column order.

        Raises:
            QueryTimeout: the query ran longer than ``timeout_s`` (it was interrupted).
            ExecutionError: not exactly one SELECT statement; the engine is not
                loaded or is closed; any DuckDB error (class name only, no data);
                duplicate result column names.
            Conflict: an in-place source file changed since the load.
        """
        sql = self.render(query)
        cursor = self._cursor()
        timed_out = threading.Event()

        def interrupt() -> None:
            timed_out.set()
            cursor.interrupt()

        token: int | None = None
        try:
            try:
                statements = cursor.extract_statements(sql)
            except duckdb.Error as e:
                raise ExecutionError(f"the bounded SQL does not parse ({type(e).__name__})") from None
            if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                raise ExecutionError("the engine executes exactly one SELECT statement")
            token = self._watchdog.arm(self.timeout_s, interrupt)
            try:
                result = cursor.sql(sql).to_arrow_table()
            except duckdb.Error as e:
                if timed_out.is_set() or isinstance(e, duckdb.InterruptException):
                    raise QueryTimeout(
                        f"the query ran longer than the {self.timeout_s:g} s limit and was stopped",
                        {"timeout_s": self.timeout_s},
                    ) from None
                raise ExecutionError(f"executing the bounded query failed ({type(e).__name__})") from None
        finally:
            if token is not None:
                self._watchdog.disarm(token)
            cursor.close()
        return table_to_columns(result)

    def close(self) -> None:
        """Close the database (idempotent); later calls raise ExecutionError."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._watchdog.close()
                self._con.close()

    def __enter__(self) -> "DuckDBEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
