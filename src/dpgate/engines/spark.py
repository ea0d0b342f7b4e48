"""The Spark engine: run the bounded query with Spark SQL, on a laptop or a cluster.

The only module of dpgate that imports pyspark (an optional extra:
``pip install 'dpgate[spark]'``; Spark needs Java 17+). For one dataset
(``[dataset] engine = "spark"``) it

* uses the process's Spark session (``DPGATE_SPARK_MASTER``, default ``local[*]``;
  the first Spark dataset creates it, later ones share it);
* exposes each table's ``source`` — a table of the session's catalog, or a Parquet
  path or glob (the files matched at load time are pinned: a changed file is
  refused until the dataset is reloaded) — as a temporary view
  ``__dpg_<dataset>__<table>`` projecting the declared columns cast to their
  canonical types (int → BIGINT, float → DOUBLE, text → STRING, bool → BOOLEAN,
  date → DATE, timestamp → TIMESTAMP_NTZ: naive, a TIMESTAMP column read in the
  session's UTC) and the privacy unit as stored (see :mod:`dpgate.engines.base`); loading checks
  the schema only (no copy), plus one uniqueness scan of the unit for Parquet files and one
  ``count = count(DISTINCT)`` scan per column declared ``unique = true`` (Parquet files are
  pinned, so it holds for every query; a catalog table is checked at load only — the next
  load re-checks it);
* renders the bounded query in Spark's dialect with sqlglot (see
  :meth:`SparkEngine.render`) and runs it with a timeout (the job group is
  interrupted), collecting the small result through Arrow.

The data version of Parquet files is their fingerprint (as DuckDB's); a catalog
table needs ``data_version`` or ``version_sql``, otherwise the release cache is
off for the dataset.
"""

from __future__ import annotations

import glob as globlib
import os
import threading
import uuid
from typing import Callable

import numpy as np
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
import sqlglot
from sqlglot import exp

from dpgate.engines.hashing import group_hash
from dpgate.engines.base import (
    check_unique_units,
    EngineOptions,
    LoadReport,
    Query,
    TableInfo,
    check_unique_counts,
    check_unit_declaration,
    unique_columns,
    file_signature,
    lossy_unit_error,
    null_like_unit,
    query_tree,
    relations,
    replace_relations,
    resolve_columns,
    source_fingerprint,
    table_error,
    table_to_columns,
    version_of_result,
)
from dpgate.engines.types import (
    datatype,
    dbl,
)
from dpgate.engines.predicates import (
    PredicateRewriter,
    replace_isfinite,
    replace_round,
)
from dpgate.errors import Conflict, ExecutionError, InvalidSql, PolicyError, QueryTimeout
from dpgate.policy import DatasetPolicy, TablePolicy
from dpgate.rendered import type_of

__all__ = ["SparkEngine", "spark_session", "COMPATIBLE"]

#: Declared type → Spark types (``simpleString`` prefixes) it may be read from, and the
#: canonical type it is exposed as.
COMPATIBLE: dict[str, tuple[tuple[str, ...], str]] = {
    "int": (("tinyint", "smallint", "int", "bigint"), "BIGINT"),
    "float": (("float", "double", "tinyint", "smallint", "int", "bigint", "decimal"), "DOUBLE"),
    "text": (("string", "varchar", "char"), "STRING"),
    "bool": (("boolean",), "BOOLEAN"),
    "date": (("date",), "DATE"),
    # timestamps are naive (UTC): a TIMESTAMP (local time zone) is read in the session's UTC
    "timestamp": (("timestamp_ntz", "timestamp"), "TIMESTAMP_NTZ"),
}
_LOSSY_UNIT = ("float", "double", "boolean")

_SESSION_LOCK = threading.Lock()
_SESSIONS: dict[str, SparkSession] = {}


def spark_session(master: str) -> SparkSession:
    """The process's Spark session for ``master`` (created once; UTC, Arrow on, quiet logs).

    ANSI SQL mode stays on (Spark 4's default): an overflow outside the WHERE raises,
    as in DuckDB, instead of wrapping silently.
    """
    with _SESSION_LOCK:
        session = _SESSIONS.get(master)
        if session is None:
            session = (
                SparkSession.builder.master(master).appName("dpgate")
                .config("spark.sql.session.timeZone", "UTC")
                .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", str(max(2, (os.cpu_count() or 2) * 2)))
                .getOrCreate()
            )
            session.sparkContext.setLogLevel("ERROR")
            _SESSIONS[master] = session
        return session


def _looks_like_path(source: str) -> bool:
    return "/" in source or "\\" in source or source.lower().endswith((".parquet", ".parq"))


def _type_matches(spark_type: str, names: tuple[str, ...]) -> bool:
    return spark_type.split("(")[0] in names


class _SparkPredicates(PredicateRewriter):
    """TRY semantics on Spark: integer overflow → NULL with ``try_*``; doubles are IEEE already."""

    def int_arith(self, op, a, b):
        """``try_add``/``try_subtract``/``try_multiply``: NULL on 64-bit overflow."""
        if op is exp.Neg:
            return exp.Anonymous(this="try_subtract", expressions=[exp.Literal.number(0), a])
        if op is exp.Abs:
            return exp.Case(ifs=[exp.If(this=exp.EQ(this=a.copy(), expression=exp.Literal.number(-2**63)),
                                        true=exp.Null())], default=exp.Abs(this=a))
        name = {exp.Add: "try_add", exp.Sub: "try_subtract", exp.Mul: "try_multiply"}[op]
        return exp.Anonymous(this=name, expressions=[a, b])

    def like(self, op, a, pattern):
        """A literal pattern with its backslashes doubled (Spark escapes with one)."""
        # Spark's LIKE escapes with a backslash; DuckDB's has no escape character: a
        # literal pattern gets its backslashes doubled (each then matches itself).
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise self.refuse(op(this=a, expression=pattern))
        return op(this=a, expression=exp.Literal.string(pattern.this.replace("\\", "\\\\")))

    # dates: Spark's DATE holds ±5.8 million years, its timestamps (µs in 64 bits) ±290,000:
    # reading a later date as a timestamp raises an overflow (date_trunc, + INTERVAL, <).
    WINDOW_YEARS = (-290000, 290000)

    def temporal_datatype(self, t):
        """DATE, or TIMESTAMP_NTZ (naive, as the views expose timestamps)."""
        return datatype("timestamp_ntz" if t == "timestamp" else "date")

    def extract(self, part, a, t):
        """Spark's DOW counts Sunday as 1 (DuckDB 0), its ISO day of the week is DAYOFWEEK_ISO,
        its SECOND a DECIMAL with the fraction: DuckDB's BIGINT values."""
        if t == "date" and part in ("hour", "minute", "second"):
            return super().extract(part, a, t)
        name = {"dow": "DOW", "isodow": "DAYOFWEEK_ISO", "doy": "DOY"}.get(part, part.upper())
        value: exp.Expression = exp.Extract(this=exp.var(name), expression=a)
        if part == "dow":
            value = exp.Sub(this=value, expression=exp.Literal.number(1))
        if part == "second":
            value = exp.Floor(this=value)
        return exp.Cast(this=value, to=datatype("bigint"))

    def date_as_timestamp(self, a):
        """A date read as TIMESTAMP_NTZ inside the window (a later date would overflow)."""
        return self.guarded(self.window(a, "date"),
                            exp.Cast(this=a.copy(), to=self.temporal_datatype("timestamp")))

    def floor_ceil(self, op, a, t):
        """FLOOR/CEIL of a double kept a double (Spark returns BIGINT)."""
        if t != "float":
            return op(this=a)
        # Spark's FLOOR/CEIL of a double return BIGINT (saturating); DuckDB's a double.
        keep = exp.Not(this=exp.LT(this=exp.Abs(this=a.copy()), expression=dbl(4503599627370496.0)))
        return exp.Case(ifs=[exp.If(this=keep, true=a.copy())],
                        default=exp.Cast(this=op(this=a), to=datatype("double")))


def _float_sum(node: exp.Sum) -> bool:
    """True for a sum of doubles: ``CAST(SUM(x) AS DOUBLE)`` (how :mod:`dpgate.sql.per_unit` writes
    the inner SUM of a float column) or a sum whose argument the planner typed ``float``."""
    parent = node.parent
    if isinstance(parent, exp.Cast) and parent.to.is_type(exp.DataType.Type.DOUBLE):
        return True
    return type_of(node.this) == "float"


class SparkEngine:
    """One dataset read by Spark SQL (catalog tables or Parquet files).

    Args:
        policy: the dataset's policy (``engine = "spark"``).
        options: engine settings (``spark_master``, ``timeout_s``).
    """

    kind = "spark"
    dialect = "spark"

    def __init__(self, policy: DatasetPolicy, options: EngineOptions | None = None) -> None:
        self.policy = policy
        self.options = options or EngineOptions()
        self.timeout_s = float(self.options.timeout_s)
        self._spark: SparkSession | None = None
        self._tables: dict[str, TableInfo] = {}
        self._views: dict[tuple[str, str], str] = {}
        self._pinned: tuple[tuple[str, int, int], ...] = ()
        self._version: str | None = None
        self._versioned_by: str | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._tag = uuid.uuid4().hex[:8]

    # ------------------------------------------------------------------ loading

    def load(self, progress: Callable[[str], None] | None = None) -> LoadReport:
        """Check each table's schema and register its typed view (no data is copied).

        Raises:
            PolicyError: missing table/files/columns, ambiguous names, incompatible or
                lossy types, a failing ``version_sql``.
        """
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if self._spark is not None:
                raise ExecutionError("the engine is already loaded; create a new engine")
        try:
            spark = spark_session(self.options.spark_master)
        except Exception as e:  # noqa: BLE001 - the JVM did not start
            raise PolicyError(f"dataset {self.policy.name!r}: Spark did not start ({type(e).__name__}); "
                              "check Java 17+ and DPGATE_SPARK_MASTER", {"dataset": self.policy.name}) from None
        files: list[str] = []
        all_files = True
        for name in sorted(self.policy.tables):
            table = self.policy.tables[name]
            if progress is not None:
                progress(f"checking {self.policy.name}.{table.name} (Spark {table.source})…")
            t_files = self._register(spark, table)
            if t_files is None:
                all_files = False
            else:
                files.extend(t_files)
        if files:
            self._pinned = file_signature(sorted(set(files)))
        with self._lock:
            self._spark = spark
        if self.policy.data_version:
            self._version, self._versioned_by = self.policy.data_version, "declared"
        elif self.policy.version_sql:
            self._versioned_by = "version_sql"
            self._run_version_sql()
        elif all_files:
            self._version, self._versioned_by = source_fingerprint(files), "fingerprint"
        return LoadReport(self.policy.name, self.kind, self._version, self._versioned_by, dict(self._tables))

    def _register(self, spark: SparkSession, table: TablePolicy) -> list[str] | None:
        """Register the typed view of one table; returns its pinned files (None: a catalog table)."""
        check_unit_declaration(table)
        files: list[str] | None = None
        try:
            if _looks_like_path(table.source):
                files = sorted(globlib.glob(table.source)) if globlib.has_magic(table.source) else [table.source]
                missing = [f for f in files if not os.path.isfile(f)]
                if not files or missing:
                    raise table_error(table, f"Parquet file not found: {missing[0] if missing else table.source}")
                df = spark.read.parquet(*files)
            else:
                df = spark.table(table.source)
        except PySparkException as e:
            raise table_error(table, f"Spark cannot read {table.source!r} ({type(e).__name__})") from None
        stored = {f.name: f.dataType.simpleString() for f in df.schema.fields}
        names = resolve_columns(table, list(stored))
        unit = table.privacy_unit
        select: list[str] = []
        for name, src_name in names.items():
            src = exp.column(src_name, quoted=True)
            st = stored[src_name]
            if unit is not None and name.casefold() == unit.casefold():
                value = self._unit_expression(table, name, st, src)
            else:
                col = table.column(name)
                if col.type not in COMPATIBLE:  # a type the policy knows and this engine does not
                    err = table_error(table, f"column {name!r} is declared {col.type}, which the Spark engine "
                                             f"does not read (it reads {', '.join(COMPATIBLE)})")
                    err.details["column"] = name
                    raise err
                allowed, target = COMPATIBLE[col.type]
                if not _type_matches(st, allowed):
                    err = table_error(table, f"column {name!r} is stored as {st}, which is not compatible "
                                             f"with its declared type {col.type} (allowed: {', '.join(allowed)})")
                    err.details["column"] = name
                    raise err
                value = exp.Cast(this=src, to=exp.DataType.build(target, dialect="spark"))
            select.append(exp.alias_(value, name, quoted=True).sql(dialect="spark"))
        view = f"__dpg_{self.policy.name}__{table.name}__{self._tag}"
        try:
            df.selectExpr(*select).createOrReplaceTempView(view)
        except PySparkException as e:
            raise table_error(table, f"Spark refused the table's projection ({type(e).__name__})") from None
        self._views[(self.policy.name, table.name)] = view
        unique = False
        if unit is not None and files is not None:
            u = exp.column(unit, quoted=True).sql(dialect="spark")
            row = spark.sql(f"SELECT count({u}) = count(DISTINCT {u}) AS ok FROM `{view}`").collect()[0]
            unique = bool(row["ok"])
        for name in unique_columns(table):  # count = count distinct over the registered view
            c = exp.column(name, quoted=True).sql(dialect="spark")
            try:
                row = spark.sql(f"SELECT count({c}) AS n, count(DISTINCT {c}) AS d FROM `{view}`").collect()[0]
            except PySparkException as e:
                raise table_error(table, f"Spark could not check that {name!r} is unique ({type(e).__name__})") from None
            check_unique_counts(table, name, row["n"], row["d"])
        integer = False
        if unit is not None:
            ut = stored[names[next(n for n in names if n.casefold() == unit.casefold())]].replace(" ", "")
            integer = ut.split("(")[0] in ("tinyint", "smallint", "int", "bigint")
        self._tables[table.name] = TableInfo(table.name, "in_place" if files is not None else "live", unique, integer)
        return files

    def _unit_expression(self, table: TablePolicy, name: str, spark_type: str, src: exp.Expression) -> exp.Expression:
        declared = table.find_column(name)
        base = spark_type.split("(")[0]
        if base in _LOSSY_UNIT or (base == "decimal" and not spark_type.replace(" ", "").endswith(",0)")):
            raise lossy_unit_error(table, name, spark_type)
        if base in ("string", "varchar", "char"):
            if declared is not None and declared.type == "int":
                err = table_error(
                    table, f"the privacy unit column {name!r} is declared int but stored as {spark_type}; "
                    "declare it { type = \"text\" } (ids kept exactly as stored) or store it as an integer")
                err.details["column"] = name
                raise err
            return null_like_unit(src)
        return src

    # ------------------------------------------------------------------ versions

    def _run_version_sql(self) -> str:
        text = self.policy.version_sql or ""
        try:
            if not isinstance(sqlglot.parse_one(text, read="spark"), exp.Query):
                raise ValueError("not a SELECT")
        except Exception:  # noqa: BLE001
            raise PolicyError(f"dataset {self.policy.name!r}: version_sql must be exactly one SELECT",
                              {"dataset": self.policy.name}) from None
        try:
            rows = self._with_timeout(lambda s: [tuple(r) for r in s.sql(text).collect()])
        except (ExecutionError, QueryTimeout):
            raise PolicyError(f"dataset {self.policy.name!r}: version_sql failed",
                              {"dataset": self.policy.name}) from None
        return version_of_result(rows)

    def current_version(self) -> str | None:
        """The raw data version now (``version_sql`` evaluated; else the one found at load)."""
        if self._versioned_by == "version_sql":
            return self._run_version_sql()
        return self._version

    def unit_is_unique(self, table: str) -> bool:
        """True when the load scan found one row per unit (Parquet files, pinned)."""
        info = self._tables.get(table) or next(
            (t for n, t in self._tables.items() if n.casefold() == table.casefold()), None)
        return bool(info and info.unit_unique)

    # ------------------------------------------------------------------ rendering

    def render(self, query: Query) -> str:
        """The bounded query in Spark SQL.

        Transforms (besides sqlglot's own, e.g. ``QUALIFY`` → a ``row_number()``
        subquery, ``//`` → ``DIV``, ``concat`` NULL handling, LIKE escapes):

        * ``hash(…)`` → md5 of the salted key text (Spark compares strings bytewise); a per-unit
          subquery's row hash reads parts whose text is the same on every engine
          (:mod:`dpgate.sql.per_unit`), so Spark keeps DuckDB's rows;
        * ``isfinite(x)`` → ``x > -inf AND x < inf``; ``ROUND(x)`` → exact half away from zero;
        * ``SUM(x)`` → ``SUM(CAST(x AS DECIMAL(38, 0)))`` (DuckDB's HUGEINT: a BIGINT sum
          of fixed-point values can exceed 64 bits), except a sum of doubles (a per-unit
          subquery's inner ``CAST(SUM(x) AS DOUBLE)`` of a float column, :func:`_float_sum`),
          which the cast would round to integers;
        * ``range(a, b)`` key lists → Spark's ``range`` table function;
        * ``TRY(p)`` → integer arithmetic through ``try_add``/``try_subtract``/``try_multiply``,
          FLOOR/CEIL of doubles kept double (:class:`_SparkPredicates`); unsupported
          constructs are refused before the charge;
        * ``"<dataset>"."<table>"`` → the table's typed temporary view.
        """
        tree = query_tree(query)
        check_unique_units(tree, self.policy.name, self.unit_is_unique)
        foreign = {r for r in relations(tree) if r not in self._views}
        if foreign:
            raise ExecutionError("the query reads a table this engine does not hold")
        tree = group_hash(tree, self.policy, self._tables, "spark")
        tree = _SparkPredicates("spark").rewrite(tree)
        tree = replace_isfinite(tree)
        tree = replace_round(tree)
        for s in list(tree.find_all(exp.Sum)):
            if not _float_sum(s):
                s.set("this", exp.Cast(this=s.this, to=datatype("decimal(38, 0)")))
        for gs in list(tree.find_all(exp.GenerateSeries)):
            table = gs.parent
            if isinstance(table, exp.Table):
                end = gs.args["end"]
                stop = end if gs.args.get("is_end_exclusive") else exp.Add(this=end, expression=exp.Literal.number(1))
                rng = exp.Table(this=exp.Anonymous(this="range", expressions=[gs.args["start"], stop]))
                sub = exp.select(exp.alias_(exp.column("id"), "range")).from_(rng)
                table.replace(exp.Subquery(this=sub, alias=exp.TableAlias(this=exp.to_identifier("__dpg_r"))))
        views = {k: (lambda v=v: exp.Table(this=exp.to_identifier(v, quoted=True))) for k, v in self._views.items()}
        tree = replace_relations(tree, views)
        return tree.sql(dialect="spark")

    # ------------------------------------------------------------------ queries

    def _session(self) -> SparkSession:
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if self._spark is None:
                raise ExecutionError("the engine has no data yet: call load() first")
            spark = self._spark
        if self._pinned and file_signature([p for p, _, _ in self._pinned]) != self._pinned:
            raise Conflict(
                f"a data source file of dataset {self.policy.name!r} changed since it was loaded;"
                " an admin must reload the dataset", {"dataset": self.policy.name})
        return spark

    def _with_timeout(self, fn):
        spark = self._session() if self._spark is not None else spark_session(self.options.spark_master)
        tag = f"dpgate-{self._tag}-{uuid.uuid4().hex[:8]}"
        timed_out = threading.Event()

        def interrupt() -> None:
            timed_out.set()
            try:
                spark.interruptTag(tag)
            except Exception:  # noqa: BLE001
                pass

        spark.addTag(tag)
        timer = threading.Timer(self.timeout_s, interrupt)
        timer.daemon = True
        timer.start()
        try:
            return fn(spark)
        except PySparkException as e:
            if timed_out.is_set():
                raise QueryTimeout(f"the query ran longer than the {self.timeout_s:g} s limit and was stopped",
                                   {"timeout_s": self.timeout_s}) from None
            raise ExecutionError(f"executing the bounded query failed ({type(e).__name__})") from None
        except Exception as e:  # noqa: BLE001 - py4j errors
            if timed_out.is_set():
                raise QueryTimeout(f"the query ran longer than the {self.timeout_s:g} s limit and was stopped",
                                   {"timeout_s": self.timeout_s}) from None
            raise ExecutionError(f"executing the bounded query failed ({type(e).__name__})") from None
        finally:
            timer.cancel()
            try:
                spark.removeTag(tag)
            except Exception:  # noqa: BLE001
                pass

    def check(self, query: Query) -> None:
        """Analyse the rendered query (Spark resolves and plans ``spark.sql`` eagerly; no job runs).

        Raises:
            InvalidSql: Spark refuses the rewrite. UnsupportedQuery: see :meth:`render`.
            Conflict: a pinned Parquet file changed.
        """
        text = self.render(query)
        spark = self._session()
        try:
            spark.sql(text)
        except PySparkException as e:
            raise InvalidSql(f"the query cannot be run: Spark refuses its rewrite ({type(e).__name__})") from None

    def execute(self, query: Query) -> dict[str, np.ndarray]:
        """Run the bounded query and return its columns (exact ints from DECIMAL(38, 0) sums).

        Raises:
            QueryTimeout: interrupted after ``timeout_s``. ExecutionError: any other error.
            Conflict: a pinned Parquet file changed.
        """
        text = self.render(query)
        self._session()
        result = self._with_timeout(lambda s: s.sql(text).toArrow())
        return table_to_columns(result)

    def close(self) -> None:
        """Drop the dataset's temporary views (the shared session stays for other datasets)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            spark, self._spark = self._spark, None
        if spark is not None:
            for view in self._views.values():
                try:
                    spark.catalog.dropTempView(view)
                except Exception:  # noqa: BLE001
                    pass
