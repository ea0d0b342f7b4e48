"""The execution engine: a locked-down, in-memory DuckDB database holding the protected tables.

This is the only module of dpgate that imports DuckDB. It

1. loads every declared table once (:meth:`Engine.load`) into an in-memory
   database as ``"<dataset>"."<table>"`` — only the declared columns and the
   privacy unit column, each declared column converted with ``TRY_CAST`` to its
   declared type (int → BIGINT, float → DOUBLE, text → VARCHAR, bool → BOOLEAN;
   a value that does not convert becomes NULL instead of failing the load);
2. then locks the database down: no file system or network access
   (``enable_external_access = false``), no extension auto-install/auto-load, no
   community or unsigned extensions, and ``lock_configuration = true`` so that
   no later statement can change any of that (``SET``/``RESET``/``PRAGMA`` fail);
3. executes only the gateway's generated bounded SQL (:meth:`Engine.execute`),
   one SELECT statement, with a per-query timeout, and returns NumPy columns.

Sources (``TablePolicy.source``):

* ``*.csv`` (also ``.tsv``, ``.txt``, ``.csv.gz``): ``read_csv(header = true,
  all_varchar = true)`` — the dialect is auto-detected, every field is read as
  text and each declared column is then ``TRY_CAST`` to its type, so a hostile
  or malformed value (``NaN``, ``inf``, ``1e300``, empty, text in a number
  column) never aborts the load or silently changes a column's type. The unit
  column, when not declared, stays VARCHAR (``'007'`` and ``'7'`` stay distinct).
  Note DuckDB's casts: ``'3.7'`` → BIGINT 4 (rounded), ``'1e400'`` → DOUBLE inf
  (the bounding rewrite turns NaN/±inf into NULL before clamping).
* ``*.parquet`` (a glob is allowed): ``read_parquet``; declared columns are
  ``TRY_CAST`` from their native types, the unit column keeps its native type.
* ``duckdb:<file>:<table>``: the file is ATTACHed read-only, the table copied,
  the file DETACHed.

Column names are matched case-insensitively, as DuckDB identifiers are; the
loaded table uses the policy's spelling.

Thread-safety: one DuckDB database per :class:`Engine`; :meth:`execute` opens a
fresh cursor (DuckDB's per-thread connection to the same database) per call,
so concurrent queries from several threads are safe; loading and closing hold a
lock.

Errors never carry data values: DuckDB messages (which can quote a row) are
replaced by the exception's class name.
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
import threading
from pathlib import Path
from typing import Callable, Iterable, Mapping

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpgate.errors import ExecutionError, InvalidSql, PolicyError, QueryTimeout
from dpgate.policy import DatasetPolicy, TablePolicy, quote_identifier

__all__ = ["Engine", "source_fingerprint", "source_files"]

_CSV_SUFFIXES = (".csv", ".tsv", ".txt", ".csv.gz", ".tsv.gz")
_PARQUET_SUFFIXES = (".parquet", ".parq")
_ATTACH_ALIAS = "__dpgate_source"
_STAGE = "__dpgate_stage"
_CHUNK = 1 << 20

#: Settings applied after loading; ``lock_configuration`` last (it freezes the rest).
_LOCKDOWN = (
    "SET enable_external_access = false",
    "SET autoinstall_known_extensions = false",
    "SET autoload_known_extensions = false",
    "SET allow_community_extensions = false",
    "SET lock_configuration = true",
)


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _human_size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if n < 1000 or unit == "GB":
            break
    return f"{n:.1f} {unit}"


def _split_duckdb_source(source: str) -> tuple[str, str]:
    rest = source[len("duckdb:"):]
    file, _, table = rest.rpartition(":")
    return file, table


def source_files(source: str) -> list[str]:
    """The files a table source reads: the file, the glob's matches (sorted), or the DuckDB file.

    Args:
        source: ``TablePolicy.source`` (absolute path, glob, or ``duckdb:<file>:<table>``).

    Returns:
        Absolute paths, possibly empty (a glob matching nothing, or a missing file is
        returned as is, for the caller to report).
    """
    if source.startswith("duckdb:"):
        return [_split_duckdb_source(source)[0]]
    if glob.has_magic(source):
        return sorted(glob.glob(source))
    return [source]


def source_fingerprint(paths: Iterable[str | os.PathLike]) -> str:
    """SHA-256 fingerprint of the bytes of files, streamed (1 MiB chunks): the data version.

    Each file contributes its length (8 bytes, big-endian) then its bytes, in the
    order given (callers sort), so moving bytes between files changes the result.
    File names do not enter: renaming a file keeps its version.

    Args:
        paths: files to fingerprint.

    Returns:
        ``"sha256:<64 hex digits>"``.

    Raises:
        PolicyError: a file cannot be read (names the file).
    """
    h = hashlib.sha256()
    for p in paths:
        try:
            with open(p, "rb") as f:
                h.update(os.fstat(f.fileno()).st_size.to_bytes(8, "big"))
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
        except OSError as e:
            raise PolicyError(
                f"cannot read data source file {str(p)!r} to fingerprint it ({e.strerror})",
                {"file": str(p)},
            ) from None
    return "sha256:" + h.hexdigest()


class Engine:
    """An in-memory DuckDB database with the protected tables, locked down after loading.

    Args:
        timeout_s: wall-clock limit of one :meth:`execute` call, seconds (> 0).
        memory_limit: DuckDB ``memory_limit`` (e.g. ``"4GB"``), or None for DuckDB's default.
        threads: DuckDB worker threads, or None for DuckDB's default (the cores).

    Raises:
        ValueError: a non-positive or non-finite timeout, threads < 1.
        ExecutionError: DuckDB refused the configuration.
    """

    def __init__(
        self, *, timeout_s: float = 30.0, memory_limit: str | None = None, threads: int | None = None
    ) -> None:
        timeout = float(timeout_s)
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout_s must be finite and > 0, got {timeout_s!r}")
        config: dict[str, object] = {
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        }
        if memory_limit is not None:
            config["memory_limit"] = str(memory_limit)
        if threads is not None:
            if int(threads) < 1:
                raise ValueError(f"threads must be >= 1, got {threads!r}")
            config["threads"] = int(threads)
        self.timeout_s = timeout
        try:
            self._con = duckdb.connect(":memory:", config=config)
        except duckdb.Error as e:
            raise ExecutionError(f"DuckDB refused the engine configuration ({type(e).__name__})") from None
        self._lock = threading.Lock()
        self._locked_down = False
        self._closed = False

    # ------------------------------------------------------------------ loading

    def load(
        self,
        policies: Mapping[str, DatasetPolicy],
        progress: Callable[[str], None] | None = None,
    ) -> dict[str, str]:
        """Load every declared table once, then lock the database down.

        Creates ``"<dataset>"."<table>"`` (schema = dataset) with the declared
        columns (``TRY_CAST`` to their types) and the privacy unit column. Can be
        called once per engine: afterwards the database accepts no file access.

        Args:
            policies: dataset name → policy.
            progress: called with lines such as ``"loading usage.prompts (123.0 MB)…"``.

        Returns:
            dataset name → data version: the policy's ``data_version``, else
            :func:`source_fingerprint` of its tables' source files (tables by name).

        Raises:
            PolicyError: a source file is missing or unreadable, of an unknown
                kind, not valid CSV/Parquet/DuckDB, or lacks the unit column or a
                declared column (the message names the policy file, the source, the
                table and the column).
            ExecutionError: the engine was already loaded or is closed.

        On any failure the engine is closed (a half-loaded database is never used).
        """
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if self._locked_down:
                raise ExecutionError("the engine is already loaded and locked down; create a new Engine")
            try:
                versions = self._load_all(policies, progress)
                for statement in _LOCKDOWN:
                    self._con.execute(statement)
            except BaseException:
                # A half-loaded, unlocked database must not be used: close it.
                self._closed = True
                self._con.close()
                raise
            self._locked_down = True
            return versions

    def _load_all(
        self, policies: Mapping[str, DatasetPolicy], progress: Callable[[str], None] | None
    ) -> dict[str, str]:
        versions: dict[str, str] = {}
        for ds_name in sorted(policies):
            policy = policies[ds_name]
            self._con.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(policy.name)}")
            files: list[str] = []
            for t_name in sorted(policy.tables):
                table = policy.tables[t_name]
                t_files = self._check_files(table)
                if progress is not None:
                    size = sum(os.path.getsize(f) for f in t_files)
                    progress(f"loading {policy.name}.{table.name} ({_human_size(size)})…")
                self._load_table(table)
                files.extend(t_files)
            versions[ds_name] = policy.data_version or source_fingerprint(files)
        return versions

    @staticmethod
    def _check_files(table: TablePolicy) -> list[str]:
        files = source_files(table.source)
        missing = [f for f in files if not os.path.isfile(f)]
        if not files or missing:
            raise _table_error(table, f"data source file not found: {missing[0] if missing else table.source}")
        return files

    def _source_relation(self, table: TablePolicy) -> str:
        source = table.source
        if source.startswith("duckdb:"):
            file, name = _split_duckdb_source(source)
            self._con.execute(f"ATTACH {_sql_string(file)} AS {_ATTACH_ALIAS} (READ_ONLY)")
            parts = [quote_identifier(p) for p in name.split(".")]
            return ".".join([_ATTACH_ALIAS, *parts])
        lower = source.lower()
        if lower.endswith(_PARQUET_SUFFIXES):
            return f"read_parquet({_sql_string(source)})"
        if lower.endswith(_CSV_SUFFIXES):
            return f"read_csv({_sql_string(source)}, header = true, all_varchar = true)"
        raise _table_error(
            table, f"unknown source kind {Path(source).suffix!r}: use .csv, .parquet or duckdb:<file>:<table>"
        )

    def _load_table(self, table: TablePolicy) -> None:
        attached = table.source.startswith("duckdb:")
        try:
            relation = self._source_relation(table)
            described = self._con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()
            available = {str(row[0]).casefold(): str(row[0]) for row in described}
            try:
                table.check_data_columns(available.values())
            except PolicyError as e:
                raise PolicyError(
                    f"{e.message} (data source {table.source!r})", {**e.details, "source": table.source}
                ) from None
            needed = list(table.columns)
            unit = table.privacy_unit
            if unit is not None and table.find_column(unit) is None:
                needed.append(unit)
            # Stage the needed columns as read, then cast: DuckDB pushes a TRY_CAST down into the
            # CSV reader, which then fails on the first bad value instead of yielding NULL.
            staged = ", ".join(quote_identifier(available[n.casefold()]) for n in needed)
            self._con.execute(f"CREATE TEMP TABLE {_STAGE} AS SELECT {staged} FROM {relation}")
            select: list[str] = []
            for name, col in table.columns.items():
                src = quote_identifier(available[name.casefold()])
                select.append(f"TRY_CAST({src} AS {col.duckdb_type}) AS {quote_identifier(name)}")
            if unit is not None and table.find_column(unit) is None:
                select.append(f"{quote_identifier(available[unit.casefold()])} AS {quote_identifier(unit)}")
            self._con.execute(f"CREATE TABLE {table.relation} AS SELECT {', '.join(select)} FROM {_STAGE}")
        except duckdb.Error as e:
            # DuckDB's message can quote a row of the file: keep it out of the error.
            raise _table_error(
                table, f"DuckDB could not read the data source ({type(e).__name__}); check the file's format"
            ) from None
        finally:
            try:
                self._con.execute(f"DROP TABLE IF EXISTS {_STAGE}")
            except duckdb.Error:  # pragma: no cover
                pass
            if attached:
                try:
                    self._con.execute(f"DETACH DATABASE IF EXISTS {_ATTACH_ALIAS}")
                except duckdb.Error:  # pragma: no cover
                    pass

    # ------------------------------------------------------------------ queries

    def check(self, sql: str) -> None:
        """Parse, bind and plan one generated SELECT without running it (``EXPLAIN``).

        Called before the ledger is charged, so that a query DuckDB cannot bind
        (a malformed rewrite, an out-of-range function argument) is refused for
        free. Reads no table data: the outcome depends only on the SQL and the schema.

        Raises:
            InvalidSql: DuckDB cannot parse or bind the SQL (class name only).
            ExecutionError: the engine is not loaded or is closed; not exactly one SELECT.
        """
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if not self._locked_down:
                raise ExecutionError("the engine has no data yet: call load() first")
            cursor = self._con.cursor()
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

    def execute(self, sql: str) -> dict[str, np.ndarray]:
        """Run one generated SELECT and return its columns as NumPy arrays (via Arrow, no row loops).

        Column conversion (lossless):

        * integer columns without NULLs → ``int64`` arrays;
        * HUGEINT (Arrow ``decimal128(38, 0)``, e.g. SUM of BIGINT) → ``int64``
          when every value fits (a checked Arrow cast), otherwise an object array
          of exact Python ints (the mechanisms refuse |x| > 2^62 with a clear error);
        * other decimals → ``float64``; floating → ``float64`` (NULL → NaN);
        * booleans without NULLs → ``bool``;
        * everything else, and integer/boolean columns with NULLs → object arrays
          (strings, Python ints, ``None`` for NULL).

        Args:
            sql: exactly one SELECT statement, generated by the gateway (never the
                analyst's text).

        Returns:
            column name → 1-D array, in the result's column order (numeric arrays
            may be read-only zero-copy views of the Arrow result).

        Raises:
            QueryTimeout: the query ran longer than ``timeout_s`` (it was interrupted).
            ExecutionError: not exactly one SELECT statement; the engine is not
                loaded or is closed; any DuckDB error (class name only, no data);
                duplicate result column names.
        """
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if not self._locked_down:
                raise ExecutionError("the engine has no data yet: call load() first")
            cursor = self._con.cursor()
        timed_out = threading.Event()

        def interrupt() -> None:
            timed_out.set()
            cursor.interrupt()

        timer = threading.Timer(self.timeout_s, interrupt)
        timer.daemon = True
        try:
            try:
                statements = cursor.extract_statements(sql)
            except duckdb.Error as e:
                raise ExecutionError(f"the bounded SQL does not parse ({type(e).__name__})") from None
            if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                raise ExecutionError("the engine executes exactly one SELECT statement")
            timer.start()
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
            timer.cancel()
            cursor.close()
        names = list(result.column_names)
        if len(set(names)) != len(names):
            raise ExecutionError("the bounded query returned duplicate column names")
        return {name: _to_numpy(result.column(i)) for i, name in enumerate(names)}

    def close(self) -> None:
        """Close the database (idempotent); later calls raise ExecutionError."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._con.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _to_numpy(column: pa.ChunkedArray) -> np.ndarray:
    """One Arrow column → a NumPy array, losslessly (see :meth:`Engine.execute`)."""
    t = column.type
    exact_int = pa.types.is_integer(t) or (pa.types.is_decimal(t) and t.scale == 0)
    if exact_int and column.null_count == 0:
        try:
            return pc.cast(column, pa.int64(), safe=True).to_numpy()
        except (pa.ArrowInvalid, OverflowError):
            pass  # beyond int64 (HUGEINT, UBIGINT): exact Python ints below
    if exact_int:
        return _object_array([None if v is None else int(v) for v in column.to_pylist()])
    if pa.types.is_decimal(t) or pa.types.is_floating(t):
        return pc.cast(column, pa.float64()).to_numpy()
    if pa.types.is_boolean(t) and column.null_count == 0:
        return column.to_numpy()
    return _object_array(column.to_pylist())


def _object_array(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _table_error(table: TablePolicy, problem: str) -> PolicyError:
    where = []
    if table.path is not None:
        where.append(f"policy file {str(table.path)!r}")
    where.append(f"table {table.dataset}.{table.name}")
    return PolicyError(
        f"{', '.join(where)}: {problem}",
        {
            "file": str(table.path) if table.path is not None else None,
            "dataset": table.dataset,
            "table": table.name,
            "source": table.source,
            "problem": problem,
        },
    )
