"""The PostgreSQL engine: run the bounded query where the data lives, read-only.

One of the three modules allowed to import psycopg. For one dataset
(``[dataset] engine = "postgres"``) it

* connects with the policy's ``connection`` or ``DPGATE_CONNECTION_<DATASET>``
  (the dataset name upper-cased); every session is read-only
  (``default_transaction_read_only``, and each query runs in a ``READ ONLY``
  transaction), so even a rendering bug cannot write; use a role that can only
  ``SELECT`` the tables as well;
* **loads nothing**: :meth:`PostgresEngine.load` checks the schema only — each
  table's ``source`` (``[schema.]table``, a table or a view) exists, the privacy
  unit and every declared column exist (case-insensitively, refusing
  ambiguous names) with compatible types (see :data:`COMPATIBLE`), and the unit
  column is an integer or text type (see :mod:`dpgate.engines.base`), and every column
  declared ``unique = true`` has a valid UNIQUE or PRIMARY KEY index on exactly it (a
  count at load would prove nothing about the live data of the next query);
* renders the bounded query with sqlglot in PostgreSQL's dialect, replacing each
  ``"<dataset>"."<table>"`` by a projection of the source that casts the declared
  columns to their canonical types and applies the unit rule, and replacing what
  PostgreSQL lacks or does differently (see :meth:`PostgresEngine.render`);
* runs exactly one SELECT per query in a ``READ ONLY`` transaction with
  ``SET LOCAL statement_timeout``, through a server-side cursor (results arrive
  in batches, so a large public-key domain does not sit twice in memory) planned for
  the whole result (``cursor_tuple_fraction = 1``).

The group-choosing hash is md5 of the salted key text ordered bytewise
(``COLLATE "C"``), the fixed-point rounding is DuckDB's half-away-from-zero
computed exactly with IEEE operations, and sums of BIGINT are NUMERIC (exact),
so the exact answers equal DuckDB's on the same data. Dates and timestamps
follow DuckDB too: date parts as BIGINT (astronomical years: 1 BC is 0),
``date_trunc`` through TIMESTAMP (never the session's time zone), ISO text
(``SET LOCAL DateStyle``), ±infinity as NULL in date functions; a
``timestamp with time zone`` column is read at UTC.
"""

from __future__ import annotations

import re
import threading
import uuid
from decimal import Decimal
from typing import Any, Callable

import numpy as np
import psycopg
from psycopg import sql as pgsql
from psycopg_pool import ConnectionPool, PoolTimeout
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from dpgate.engines.hashing import group_hash
from dpgate.engines.unit_joins import integer_unit_joins
from dpgate.engines.base import (
    assumes_unique_units,
    check_unique_units,
    EngineOptions,
    LoadReport,
    Query,
    TableInfo,
    check_unit_declaration,
    unique_columns,
    lossy_unit_error,
    null_like_unit,
    object_array,
    query_tree,
    relations,
    replace_relations,
    resolve_columns,
    table_error,
    version_of_result,
)
from dpgate.engines.types import (
    datatype,
    DBL_MAX,
    dbl,
)
from dpgate.engines.predicates import (
    PredicateRewriter,
    replace_isfinite,
    replace_round,
)
from dpgate.errors import Conflict, ExecutionError, InvalidSql, PolicyError, QueryTimeout
from dpgate.policy import DatasetPolicy, TablePolicy

__all__ = ["PostgresEngine", "COMPATIBLE", "connection_for", "describe_relation"]

#: Declared type → PostgreSQL types (``format_type`` names, prefix match) it may be read from,
#: and the canonical type it is exposed as.
COMPATIBLE: dict[str, tuple[tuple[str, ...], str]] = {
    "int": (("smallint", "integer", "bigint"), "BIGINT"),
    "float": (("real", "double precision", "smallint", "integer", "bigint", "numeric"), "DOUBLE PRECISION"),
    "text": (("text", "character varying", "character", "name", "citext"), "TEXT"),
    "bool": (("boolean",), "BOOLEAN"),
    "date": (("date",), "DATE"),
    # a timestamp with time zone is read as its UTC wall-clock time (timestamps are naive UTC)
    "timestamp": (("timestamp without time zone", "timestamp with time zone"), "TIMESTAMP"),
}
_INT_UNIT = ("smallint", "integer", "bigint")
_TEXT_UNIT = ("text", "character varying", "character", "citext")
_LOSSY_UNIT = ("real", "double precision", "boolean")
_FETCH_ROWS = 10_000


def connection_for(policy: DatasetPolicy, environ: dict[str, str] | Any) -> str:
    """The connection string of a PostgreSQL dataset: the policy's, else ``DPGATE_CONNECTION_<DATASET>``.

    Raises:
        PolicyError: neither is set.
    """
    if policy.connection:
        return policy.connection
    var = f"DPGATE_CONNECTION_{policy.name.upper()}"
    value = environ.get(var) if environ is not None else None
    if value:
        return value
    raise PolicyError(
        f"dataset {policy.name!r} uses the postgres engine but has no connection: set "
        f"[dataset] connection in its policy or the environment variable {var}",
        {"dataset": policy.name, "variable": var},
    )


#: A valid, immediate UNIQUE index (or PRIMARY KEY) on exactly the unit column, without a
#: predicate or expression: every committed row has a distinct unit (NULLs aside). Args:
#: the relation's oid, the unit column's stored name.
_UNIQUE_UNIT_SQL = (
    "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
    "AND a.attnum = i.indkey[0] WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid "
    "AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = %s)"
)


def _alias_derived_tables(tree: exp.Expression) -> exp.Expression:
    """Give every subquery in a FROM or JOIN an alias (``__dpg_d<i>``): PostgreSQL before
    16 refuses a derived table without one, which DuckDB and Spark accept (the quantile
    histogram's ``FROM (SELECT … QUALIFY …)`` becomes such a subquery when rendered)."""
    for i, node in enumerate(list(tree.find_all(exp.Subquery))):
        if not node.alias and isinstance(node.parent, (exp.From, exp.Join)):
            node.set("alias", exp.TableAlias(this=exp.to_identifier(f"__dpg_d{i}", quoted=True)))
    return tree


def describe_relation(conninfo: str, relation: str) -> list[tuple[str, str]]:
    """The columns of a PostgreSQL table or view as ``(name, type)`` (``format_type`` names,
    e.g. ``integer``, ``double precision``, ``text``), in column order, for drafting a policy
    (``dpgate policy init``). Reads the catalog only (no row), in a read-only session.

    Args:
        conninfo: a libpq connection string or ``postgresql://`` URL.
        relation: ``[schema.]table`` (resolved by the session's ``search_path`` when unqualified).

    Raises:
        ValueError: no connection, or no such relation (the message names it).
    """
    try:
        with psycopg.connect(conninfo, connect_timeout=10, options="-c default_transaction_read_only=on") as conn:
            oid = conn.execute("SELECT to_regclass(%s)::oid", (relation,)).fetchone()[0]
            if oid is None:
                raise ValueError(f"no table or view {relation!r} in that database")
            rows = conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (oid,)).fetchall()
    except psycopg.Error as e:
        raise ValueError(f"cannot read the schema from PostgreSQL ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:160] if str(e) else ''})") from None
    return [(str(name), str(kind)) for name, kind in rows]


def _source_parts(source: str) -> list[str]:
    return source.split(".")


def _type_matches(pg_type: str, names: tuple[str, ...]) -> bool:
    """``format_type`` name without its modifiers (``numeric(10,2)``, ``timestamp(3) without
    time zone``, ``character varying(20)``) is one of ``names``."""
    base = " ".join(re.sub(r"\(\s*\d+(\s*,\s*\d+)?\s*\)", " ", pg_type).split())
    return base in names


def _local_settings(conn: psycopg.Connection, timeout_s: float) -> None:
    """``SET LOCAL`` what a bounded query's result depends on, whatever the role's defaults:
    the statement timeout, and ISO date output (``CAST(d AS TEXT)`` of a date key is then
    ``YYYY-MM-DD``, as in DuckDB)."""
    conn.execute(pgsql.SQL("SET LOCAL statement_timeout = {}").format(pgsql.Literal(int(timeout_s * 1000))))
    conn.execute("SET LOCAL DateStyle = 'ISO, YMD'")


class _PgPredicates(PredicateRewriter):
    """TRY semantics on PostgreSQL (which raises on integer and float overflow)."""

    _INT_MIN, _INT_MAX = -2**63, 2**63 - 1

    def int_arith(self, op, a, b):
        """Computed in NUMERIC, NULL outside the 64-bit range (DuckDB's TRY on overflow)."""
        num = datatype("numeric")
        na = exp.Cast(this=a, to=num)
        if op is exp.Neg:
            r: exp.Expression = exp.Neg(this=na)
        elif op is exp.Abs:
            r = exp.Abs(this=na)
        else:
            r = op(this=na, expression=exp.Cast(this=b, to=num))
        ok = exp.Between(this=r.copy(), low=exp.Literal.number(self._INT_MIN), high=exp.Literal.number(self._INT_MAX))
        return exp.Case(ifs=[exp.If(this=ok, true=exp.Cast(this=r, to=datatype("bigint")))])

    def float_arith(self, op, a, b):
        """IEEE result without PostgreSQL's overflow/underflow errors (see below)."""
        # PostgreSQL raises when a finite product/sum overflows (or a product of non-zero
        # numbers underflows to 0); DuckDB returns ±inf (or 0). Decide in advance, with a
        # 2**-50 relative margin so the exact operation is never reached when it would raise.
        nan = dbl(float("nan"))
        inf = dbl(float("inf"))
        margin = dbl(1 - 2.0 ** -50)

        def special(*xs):
            conds = []
            for x in xs:
                conds.append(exp.EQ(this=x.copy(), expression=nan.copy()))
                conds.append(exp.EQ(this=exp.Abs(this=x.copy()), expression=inf.copy()))
            return exp.or_(*conds)

        sa, sb = exp.Sign(this=a.copy()), exp.Sign(this=b.copy())
        if op is exp.Mul:
            zero = exp.or_(exp.EQ(this=a.copy(), expression=dbl(0.0)), exp.EQ(this=b.copy(), expression=dbl(0.0)))
            over = exp.and_(
                exp.GT(this=exp.Abs(this=b.copy()), expression=dbl(1.0)),
                exp.GT(this=exp.Abs(this=a.copy()),
                       expression=exp.Mul(this=exp.Div(this=dbl(DBL_MAX), expression=exp.Abs(this=b.copy())),
                                          expression=margin.copy())),
            )
            # A product rounds to 0 iff |a·b| <= 2**-1075 (ties to even). Then |a| < 1 (as
            # |b| >= 2**-1074), so |a|·2**100 is exact and finite, and 2**-975 / |b| neither
            # overflows nor underflows; the margin flags the boundary band as 0 (never an error).
            scaled = exp.Mul(this=exp.Abs(this=a.copy()), expression=dbl(2.0 ** 100))
            limit = exp.Mul(this=exp.Div(this=dbl(2.0 ** -975), expression=exp.Abs(this=b.copy())),
                            expression=dbl(1 + 2.0 ** -50))
            product = exp.Mul(this=a.copy(), expression=b.copy())
            signed_zero = exp.Mul(this=exp.Mul(this=sa.copy(), expression=sb.copy()), expression=dbl(0.0))
            tiny = exp.Case(ifs=[exp.If(this=exp.LTE(this=scaled, expression=limit), true=signed_zero)],
                            default=product.copy())
            small = exp.and_(exp.LT(this=exp.Abs(this=b.copy()), expression=dbl(1.0)),
                             exp.LT(this=exp.Abs(this=a.copy()), expression=dbl(1.0)))
            return exp.Case(ifs=[
                exp.If(this=exp.or_(special(a, b), zero), true=product.copy()),
                exp.If(this=over, true=exp.Mul(this=exp.Mul(this=sa.copy(), expression=sb.copy()), expression=inf.copy())),
                exp.If(this=small, true=tiny),
            ], default=product)
        same_sign = (exp.EQ(this=sa.copy(), expression=sb.copy()) if op is exp.Add
                     else exp.EQ(this=sa.copy(), expression=exp.Neg(this=sb.copy())))
        over = exp.and_(
            same_sign,
            exp.GT(this=exp.Abs(this=a.copy()),
                   expression=exp.Mul(this=exp.Paren(this=exp.Sub(this=dbl(DBL_MAX), expression=exp.Abs(this=b.copy()))),
                                      expression=margin.copy())),
        )
        return exp.Case(ifs=[
            exp.If(this=special(a, b), true=op(this=a.copy(), expression=b.copy())),
            exp.If(this=over, true=exp.Mul(this=sa.copy(), expression=inf.copy())),
        ], default=op(this=a.copy(), expression=b.copy()))

    def like(self, op, a, pattern):
        """``ESCAPE ''``: no escape character, as in DuckDB."""
        return exp.Escape(this=op(this=a, expression=pattern), expression=exp.Literal.string(""))

    def compare_text(self, node):
        """Bytewise order (``COLLATE "C"``), as DuckDB's default collation."""
        def c(x):
            return exp.Collate(this=x, expression=exp.to_identifier("C", quoted=True))

        node.set("this", c(node.this))
        return node

    def ends_with(self, a, b):
        """``right(a, length(b)) = b`` (PostgreSQL has no ends_with)."""
        return exp.EQ(this=exp.Right(this=a, expression=exp.Length(this=b.copy())), expression=b)

    def contains(self, a, b):
        """``strpos(a, b) > 0``."""
        return exp.GT(this=exp.StrPosition(this=a, substr=b), expression=exp.Literal.number(0))

    # dates: PostgreSQL stores 4713 BC to 5874897 AD (dates) and 4713 BC to 294276 AD
    # (timestamps), plus ±infinity; DuckDB's TIMESTAMP ends in 294247 AD.
    WINDOW_YEARS = (-4711, 294246)

    def temporal_literal(self, year, month, day, t, *, start):
        """PostgreSQL writes 1 BC (astronomical year 0) as ``0001-… BC``."""
        if year >= 1:
            return super().temporal_literal(year, month, day, t, start=start)
        text = f"{1 - year:04d}-{month:02d}-{day:02d}" + (
            "" if t == "date" else " 00:00:00" if start else " 23:59:59.999999") + " BC"
        return exp.Cast(this=exp.Literal.string(text), to=self.temporal_datatype(t))

    def extract(self, part, a, t):
        """PostgreSQL's EXTRACT is NUMERIC (fractional seconds, ±Infinity for infinite dates,
        an error for the hour of a date) and has no year 0 (1 BC is −1; DuckDB's 0): cast to
        BIGINT, whole seconds, years before 1 AD shifted by one, NULL for ±infinity."""
        value = super().extract(part, a, t)
        if t == "date" and part in ("hour", "minute", "second"):
            return value
        if part == "year":
            value = exp.Case(ifs=[exp.If(this=exp.LT(this=value.copy(), expression=exp.Literal.number(0)),
                                         true=exp.Add(this=value.copy(), expression=exp.Literal.number(1)))],
                             default=value)
        kind = "DATE" if t == "date" else "TIMESTAMP"
        finite = exp.and_(
            exp.GT(this=a.copy(), expression=exp.Cast(this=exp.Literal.string("-infinity"),
                                                       to=datatype(kind))),
            exp.LT(this=a.copy(), expression=exp.Cast(this=exp.Literal.string("infinity"),
                                                       to=datatype(kind))))
        return self.guarded(finite, value)

    def date_trunc(self, unit, a, t):
        """``date_trunc`` of a date through a TIMESTAMP (PostgreSQL would pick TIMESTAMPTZ, in the
        session's time zone), NULL outside the window (the cast of a later date would raise)."""
        ts = exp.Cast(this=a.copy(), to=datatype("timestamp")) if t == "date" else a.copy()
        return self.guarded(self.window(a, t), exp.TimestampTrunc(this=ts, unit=exp.var(unit.upper())))


class PostgresEngine:
    """One dataset whose tables live in PostgreSQL; queries run there, read-only.

    Args:
        policy: the dataset's policy (``engine = "postgres"``).
        options: engine settings (``timeout_s`` becomes ``statement_timeout``; ``environ``
            holds ``DPGATE_CONNECTION_<DATASET>``).

    Raises:
        PolicyError: no connection string.
    """

    kind = "postgres"
    dialect = "postgres"

    def __init__(self, policy: DatasetPolicy, options: EngineOptions | None = None) -> None:
        self.policy = policy
        self.options = options or EngineOptions()
        self.timeout_s = float(self.options.timeout_s)
        self._conninfo = connection_for(policy, self.options.environ)
        self._pool: ConnectionPool | None = None
        self._tables: dict[str, TableInfo] = {}
        self._projections: dict[tuple[str, str], exp.Expression] = {}
        #: table name → (quoted source relation, stored unit column) for tables whose
        #: unit column had a unique index at load (re-checked by every fast-path query).
        self._unique_sources: dict[str, tuple[str, str]] = {}
        self._version: str | None = None
        self._versioned_by: str | None = None
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ connections

    def _open_pool(self) -> ConnectionPool:
        def configure(conn: psycopg.Connection) -> None:
            conn.read_only = True
            conn.autocommit = False

        try:
            pool = ConnectionPool(
                self._conninfo, min_size=1, max_size=4, open=False, configure=configure,
                kwargs={"options": "-c default_transaction_read_only=on", "connect_timeout": 10,
                        "application_name": "dpgate"},
                name=f"dpgate-{self.policy.name}",
            )
            pool.open(wait=True, timeout=15)
        except (psycopg.Error, PoolTimeout) as e:
            raise PolicyError(
                f"dataset {self.policy.name!r}: cannot connect to PostgreSQL ({type(e).__name__}); "
                "check its connection string and that the server is up",
                {"dataset": self.policy.name},
            ) from None
        return pool

    def _conn(self):
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if self._pool is None:
                raise ExecutionError("the engine has no data yet: call load() first")
            pool = self._pool
        return pool.connection(timeout=self.timeout_s)

    # ------------------------------------------------------------------ loading

    def load(self, progress: Callable[[str], None] | None = None) -> LoadReport:
        """Check every table's schema (no data is copied); see the module docstring.

        Returns:
            A :class:`LoadReport`: ``data_version`` is the declared one, or None
            (``versioned_by = "version_sql"``: evaluated per query; or None: release
            cache off). A table's ``unit_unique`` comes from a valid UNIQUE or PRIMARY
            KEY index on exactly the unit column of a table (not a view or materialized
            view): a schema fact that holds whatever the data becomes, re-checked under
            a lock in every query that relies on it.

        Raises:
            PolicyError: unreachable server, missing table/column, ambiguous column
                names, incompatible types, lossy unit type, a failing ``version_sql``.
        """
        with self._lock:
            if self._closed:
                raise ExecutionError("the engine is closed")
            if self._pool is not None:
                raise ExecutionError("the engine is already loaded; create a new engine")
        pool = self._open_pool()
        try:
            with pool.connection() as conn:
                for name in sorted(self.policy.tables):
                    table = self.policy.tables[name]
                    if progress is not None:
                        progress(f"checking {self.policy.name}.{table.name} (PostgreSQL {table.source})…")
                    self._check_table(conn, table)
                    conn.rollback()
            if self.policy.data_version:
                self._version, self._versioned_by = self.policy.data_version, "declared"
            elif self.policy.version_sql:
                self._versioned_by = "version_sql"
                with self._lock:
                    self._pool = pool
                self._version = None
                self._run_version_sql()
        except BaseException:
            with self._lock:
                self._pool = None
            pool.close()
            raise
        with self._lock:
            self._pool = pool
        return LoadReport(self.policy.name, self.kind, self._version, self._versioned_by, dict(self._tables))

    def _check_table(self, conn: psycopg.Connection, table: TablePolicy) -> None:
        check_unit_declaration(table)
        ident = pgsql.Identifier(*_source_parts(table.source))
        try:
            row = conn.execute(
                "SELECT c.oid, c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)",
                (ident.as_string(conn),),
            ).fetchone()
        except psycopg.Error as e:
            raise table_error(table, f"cannot look up the PostgreSQL source ({type(e).__name__})") from None
        if row is None:
            raise table_error(table, f"PostgreSQL table or view {table.source!r} not found (or not visible to this role)")
        oid, relkind = row
        cols = conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnum FROM pg_attribute a "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (oid,),
        ).fetchall()
        stored = {str(n): str(t) for n, t, _ in cols}
        try:
            conn.execute(pgsql.SQL("SELECT * FROM {} LIMIT 0").format(ident))
        except psycopg.Error as e:
            raise table_error(table, f"the role cannot read {table.source!r} ({type(e).__name__})") from None
        names = resolve_columns(table, list(stored))
        unit = table.privacy_unit
        select: list[exp.Expression] = []
        for name, src_name in names.items():
            src = exp.column(src_name, quoted=True)
            pg_type = stored[src_name]
            if unit is not None and name.casefold() == unit.casefold():
                value = self._unit_expression(table, name, pg_type, src)
            else:
                col = table.column(name)
                if col.type not in COMPATIBLE:  # a type the policy knows and this engine does not
                    err = table_error(table, f"column {name!r} is declared {col.type}, which the PostgreSQL engine "
                                             f"does not read (it reads {', '.join(COMPATIBLE)})")
                    err.details["column"] = name
                    raise err
                allowed, target = COMPATIBLE[col.type]
                if not _type_matches(pg_type, allowed):
                    err = table_error(table, f"column {name!r} is stored as {pg_type}, which is not compatible "
                                             f"with its declared type {col.type} (allowed: {', '.join(allowed)})")
                    err.details["column"] = name
                    raise err
                if col.type == "timestamp" and _type_matches(pg_type, ("timestamp with time zone",)):
                    src = exp.AtTimeZone(this=src, zone=exp.Literal.string("UTC"))
                value = exp.Cast(this=src, to=exp.DataType.build(target, dialect="postgres"))
                if col.type == "float" and _type_matches(pg_type, ("numeric",)):
                    # a NUMERIC beyond the double range would raise when cast: NULL instead
                    ok = exp.LT(this=exp.Abs(this=src.copy()), expression=exp.Literal.number("1e308"))
                    value = exp.Case(ifs=[exp.If(this=ok, true=value)])
            select.append(exp.alias_(value, name, quoted=True))
        source_table = exp.Table(
            this=exp.to_identifier(_source_parts(table.source)[-1], quoted=True),
            db=exp.to_identifier(_source_parts(table.source)[-2], quoted=True) if len(_source_parts(table.source)) > 1 else None,
            catalog=exp.to_identifier(_source_parts(table.source)[-3], quoted=True) if len(_source_parts(table.source)) > 2 else None,
        )
        self._projections[(self.policy.name, table.name)] = exp.select(*select).from_(source_table)
        unique = False
        if unit is not None and relkind in ("r", "p"):  # tables: LOCK TABLE works (not on a matview)
            unique = conn.execute(
                _UNIQUE_UNIT_SQL,
                (oid, names[next(n for n in names if n.casefold() == unit.casefold())]),
            ).fetchone()[0]
            if unique:
                self._unique_sources[table.name] = (ident.as_string(conn), names[
                    next(n for n in names if n.casefold() == unit.casefold())])
        for name in unique_columns(table):  # a live source: uniqueness must be a schema fact
            if relkind not in ("r", "p") or not conn.execute(_UNIQUE_UNIT_SQL, (oid, names[name])).fetchone()[0]:
                err = table_error(table, f"column {name!r} is declared unique (unique = true) but "
                                         f"{table.source!r} has no valid UNIQUE or PRIMARY KEY index on exactly "
                                         "that column: on a live source only an index keeps it unique; "
                                         "add one (or drop the declaration)")
                err.details["column"] = name
                raise err
        integer = unit is not None and self._unit_integer_type(stored[names[next(n for n in names if n.casefold() == unit.casefold())]])
        self._tables[table.name] = TableInfo(table.name, "live", bool(unique), integer)

    @staticmethod
    def _unit_integer_type(pg_type: str) -> bool:
        return _type_matches(pg_type, _INT_UNIT)

    def _unit_expression(self, table: TablePolicy, name: str, pg_type: str, src: exp.Expression) -> exp.Expression:
        declared = table.find_column(name)
        if _type_matches(pg_type, _LOSSY_UNIT) or (
            _type_matches(pg_type, ("numeric",)) and not re.search(r"numeric\(\d+,0\)", pg_type.replace(" ", ""))
        ):
            raise lossy_unit_error(table, name, pg_type)
        if _type_matches(pg_type, _TEXT_UNIT):
            if declared is not None and declared.type == "int":
                err = table_error(
                    table, f"the privacy unit column {name!r} is declared int but stored as {pg_type}: "
                    "a live source cannot be checked once for canonical integers; declare it "
                    "{ type = \"text\" } (ids kept exactly as stored) or store it as an integer type")
                err.details["column"] = name
                raise err
            return null_like_unit(src)
        return src

    # ------------------------------------------------------------------ versions

    def _run_version_sql(self) -> str:
        text = self.policy.version_sql or ""
        if not _one_select(text):
            raise PolicyError(f"dataset {self.policy.name!r}: version_sql must be exactly one SELECT",
                              {"dataset": self.policy.name})
        try:
            with self._conn() as conn:
                with conn.transaction():
                    _local_settings(conn, self.timeout_s)
                    cur = conn.execute(text)
                    rows = cur.fetchall()
        except psycopg.errors.QueryCanceled:
            raise QueryTimeout(f"version_sql of dataset {self.policy.name!r} ran longer than "
                               f"{self.timeout_s:g} s", {"dataset": self.policy.name}) from None
        except psycopg.Error as e:
            raise PolicyError(f"dataset {self.policy.name!r}: version_sql failed ({type(e).__name__})",
                              {"dataset": self.policy.name}) from None
        return version_of_result(rows)

    def current_version(self) -> str | None:
        """The raw data version now: ``version_sql``'s result hashed (``"sha256:…"``), else
        the declared version (or None)."""
        if self._versioned_by == "version_sql":
            return self._run_version_sql()
        return self._version

    def unit_is_unique(self, table: str) -> bool:
        """True when the unit column has a UNIQUE/PRIMARY KEY constraint of its own."""
        info = self._tables.get(table) or next(
            (t for n, t in self._tables.items() if n.casefold() == table.casefold()), None)
        return bool(info and info.unit_unique)

    # ------------------------------------------------------------------ rendering

    def render(self, query: Query) -> str:
        """The bounded query in PostgreSQL's dialect.

        Transforms of the DuckDB-dialect query (besides sqlglot's own, e.g. ``QUALIFY``
        → a ``row_number()`` subquery, ``//`` → ``DIV``, ``range(a, b)`` →
        ``generate_series``):

        * ``hash(…)`` → md5 of the salted key text, ``COLLATE "C"`` (bytewise order);
        * ``isfinite(x)`` → ``x > -inf AND x < inf``;
        * ``ROUND(x)`` of the fixed-point step → exact half-away-from-zero (PostgreSQL
          rounds doubles half to even);
        * ``TRY(p)`` → p with every operation that could raise made total
          (:class:`_PgPredicates`); constructs it cannot make total are refused
          (UnsupportedQuery, before the charge);
        * each ``"<dataset>"."<table>"`` → the typed projection of its source.

        Raises:
            ExecutionError: not one SELECT, or a table of another dataset.
            UnsupportedQuery: a WHERE construct this engine cannot run with TRY semantics.
        """
        tree = query_tree(query)
        check_unique_units(tree, self.policy.name, self.unit_is_unique)
        foreign = {r for r in relations(tree) if r not in self._projections}
        if foreign:
            raise ExecutionError("the query reads a table this engine does not hold")
        tree = integer_unit_joins(tree, self.policy, self._tables)  # issue 25 item 5
        tree = group_hash(tree, self.policy, self._tables, "postgres")
        tree = _PgPredicates("postgres").rewrite(tree)
        tree = replace_isfinite(tree)
        tree = replace_round(tree)
        tree = _hashable_null_safe_joins(tree)
        for gs in list(tree.find_all(exp.GenerateSeries)):
            table = gs.parent
            if isinstance(table, exp.Table) and not table.alias:
                table.set("alias", exp.TableAlias(this=exp.to_identifier("__dpg_r"),
                                                  columns=[exp.to_identifier("range")]))
        tree = replace_relations(tree, {k: (lambda v=v: v.copy()) for k, v in self._projections.items()})
        return _alias_derived_tables(tree).sql(dialect="postgres")

    # ------------------------------------------------------------------ queries

    def check(self, query: Query) -> None:
        """``EXPLAIN`` the rendered query (plans it; reads no rows). Before the charge.

        Raises:
            InvalidSql: PostgreSQL refuses the rewrite. UnsupportedQuery: see :meth:`render`.
        """
        text = self.render(query)
        try:
            with self._conn() as conn:
                with conn.transaction():
                    _local_settings(conn, self.timeout_s)
                    conn.execute("EXPLAIN " + text)
        except psycopg.errors.QueryCanceled:
            raise QueryTimeout(f"planning the query took longer than {self.timeout_s:g} s",
                               {"timeout_s": self.timeout_s}) from None
        except psycopg.Error as e:
            raise InvalidSql(
                f"the query cannot be run: PostgreSQL refuses its rewrite ({type(e).__name__})"
            ) from None
        except PoolTimeout:
            raise ExecutionError("no PostgreSQL connection became free in time") from None

    def execute(self, query: Query) -> dict[str, np.ndarray]:
        """Run the bounded query (one SELECT, READ ONLY, ``statement_timeout``) and return its columns.

        Integer and NUMERIC(scale 0) columns become ``int64`` arrays when every value
        fits (object arrays of exact ints otherwise, or with NULLs); floats ``float64``.

        Raises:
            QueryTimeout: ``statement_timeout`` cancelled it. ExecutionError: any other
                error (class name only, no data).
        """
        text = self.render(query)
        unique_tables = sorted(name for ds, name in relations(query) if ds == self.policy.name) \
            if assumes_unique_units(query) else []
        try:
            with self._conn() as conn:
                with conn.transaction():
                    _local_settings(conn, self.timeout_s)
                    # the whole result is read: plan the cursor for all rows, not PostgreSQL's default
                    # first 10 % (which picks nested loops; a partition selection over the reddit
                    # table's 98,000 rows then ran for minutes)
                    conn.execute("SET LOCAL cursor_tuple_fraction = 1.0")
                    for name in unique_tables:
                        self._recheck_unique(conn, name)
                    with conn.cursor(name=f"dpgate_{uuid.uuid4().hex[:12]}") as cur:
                        cur.itersize = _FETCH_ROWS
                        cur.execute(text)
                        names = [d.name for d in cur.description]
                        columns: list[list[Any]] = [[] for _ in names]
                        while batch := cur.fetchmany(_FETCH_ROWS):
                            for row in batch:
                                for i, v in enumerate(row):
                                    columns[i].append(v)
        except psycopg.errors.QueryCanceled:
            raise QueryTimeout(
                f"the query ran longer than the {self.timeout_s:g} s limit and was stopped",
                {"timeout_s": self.timeout_s},
            ) from None
        except psycopg.Error as e:
            raise ExecutionError(f"executing the bounded query failed ({type(e).__name__})") from None
        except PoolTimeout:
            raise ExecutionError("no PostgreSQL connection became free in time") from None
        if len(set(names)) != len(names):
            raise ExecutionError("the bounded query returned duplicate column names")
        return {n: _column(v) for n, v in zip(names, columns)}

    def _recheck_unique(self, conn: psycopg.Connection, table: str) -> None:
        """Inside the query's transaction: lock the source (ACCESS SHARE, which a DROP INDEX
        waits for) and check that its unit column still has the unique index found at load.

        A query rendered without the per-unit aggregation is correct only while each unit
        has one row; a dropped constraint followed by duplicate rows must not reach it.

        Raises:
            Conflict: the index is gone (an admin must reload the dataset).
        """
        info = self._unique_sources.get(table) or next(
            (v for n, v in self._unique_sources.items() if n.casefold() == table.casefold()), None)
        ok = False
        if info is not None:
            relation, unit = info
            conn.execute(f"LOCK TABLE {relation} IN ACCESS SHARE MODE")
            ok = bool(conn.execute(_UNIQUE_UNIT_SQL.replace("i.indrelid = %s", "i.indrelid = to_regclass(%s)"),
                                   (relation, unit)).fetchone()[0])
        if not ok:
            raise Conflict(
                f"the unique index on the privacy unit of {self.policy.name}.{table} found at load is "
                "gone; an admin must reload the dataset", {"dataset": self.policy.name, "table": table})

    def close(self) -> None:
        """Close the connection pool (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def _column(values: list[Any]) -> np.ndarray:
    """A result column → NumPy, losslessly (exact ints from NUMERIC sums)."""
    if values and all(isinstance(v, (int, Decimal)) and not isinstance(v, bool) for v in values):
        if all(isinstance(v, int) or v == v.to_integral_value() for v in values):
            ints = [int(v) for v in values]
            if all(-2**63 <= v < 2**63 for v in ints):
                return np.asarray(ints, dtype=np.int64)
            return object_array(ints)
        return np.asarray([float(v) for v in values], dtype=np.float64)
    if values and all(isinstance(v, float) for v in values):
        return np.asarray(values, dtype=np.float64)
    if values and all(isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=bool)
    return object_array([int(v) if isinstance(v, Decimal) and v == v.to_integral_value() else v for v in values])


def _one_select(text: str) -> bool:
    """True when ``text`` is exactly one SELECT (or WITH … SELECT) in PostgreSQL's grammar."""
    try:
        statements = [s for s in sqlglot.parse(text, read="postgres") if s is not None]
    except (SqlglotError, RecursionError, ValueError):
        return False
    return len(statements) == 1 and isinstance(statements[0], exp.Query)


def _hashable_null_safe_joins(tree: exp.Expression) -> exp.Expression:
    """Join conditions ``a IS NOT DISTINCT FROM b`` → ``(a IS NULL) = (b IS NULL) AND
    COALESCE(CAST(a AS TEXT), '') = COALESCE(CAST(b AS TEXT), '')``.

    The same rows match (both NULL, or both non-NULL with equal values: the two sides of one
    condition have one declared type, whose text form is one-to-one), but PostgreSQL can run
    equalities of expressions as a hash join, while ``IS NOT DISTINCT FROM`` forces a nested
    loop: quadratic in the number of groups (a partition selection over 98,000 reddit rows ran
    for minutes). Only ON clauses of joins are rewritten; other uses keep their form.
    """
    for join in list(tree.find_all(exp.Join)):
        on = join.args.get("on")
        if on is None:
            continue
        for node in list(on.find_all(exp.NullSafeEQ)):
            a, b = node.this, node.expression
            text = lambda e: exp.func("COALESCE", exp.cast(e.copy(), "TEXT"), exp.Literal.string(""))  # noqa: E731
            node.replace(exp.Paren(this=exp.and_(
                exp.EQ(this=exp.Paren(this=exp.Is(this=a.copy(), expression=exp.Null())),
                       expression=exp.Paren(this=exp.Is(this=b.copy(), expression=exp.Null()))),
                exp.EQ(this=text(a), expression=text(b)))))
    return tree

