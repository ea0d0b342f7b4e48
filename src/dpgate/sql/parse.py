"""Parse an analyst's SQL with sqlglot (DuckDB dialect), check it against an allow-list
and build the canonical :class:`~dpgate.sql.plan.QueryPlan`.

Accepted shape (DESIGN.md, "SQL the gateway answers")::

    SELECT <group keys>, <aggregates> FROM <table> [WHERE <row predicate>]
    [GROUP BY <group keys>] [HAVING <predicate>] [ORDER BY <outputs>] [LIMIT n]

* Exactly one statement, a plain SELECT over one declared table (optionally
  qualified by the dataset name, optionally aliased), read in one of
  :data:`DIALECTS` (default DuckDB). Anything that sqlglot can only parse as an
  opaque ``Command`` is refused. CTEs and subqueries in FROM that only filter,
  project and compute row expressions over one table are inlined first by
  :mod:`dpgate.sql.rules` (same plan and plan hash as the flat query); other
  subqueries are refused.
* Aggregates: ``COUNT(*)``, ``COUNT(<literal>)``, ``COUNT(<unit>)`` (all three count
  rows; rows with a NULL unit are dropped), ``COUNT(col)`` (non-NULL, finite
  values), ``COUNT(DISTINCT <unit>)``, ``SUM``, ``AVG``/``MEAN``, ``VAR_POP`` and
  its aliases ``VARIANCE``/``VAR_SAMP``, ``STDDEV_POP`` and ``STDDEV``/``STDDEV_SAMP``.
  The argument is a bare declared column; SUM/AVG/VAR/STDDEV need clamp bounds.
  DuckDB's ``VARIANCE``/``STDDEV`` are sample statistics; the DP release estimates
  the *population* statistic in every case (with noise of order 1/n the
  difference is immaterial, and the population form is the one with a simple
  sensitivity).
* Row predicate (WHERE): comparisons, ``IN``, ``BETWEEN``, ``IS [NOT] NULL``,
  ``IS [NOT] TRUE/FALSE``, ``IS [NOT] DISTINCT FROM``, ``[NOT] LIKE``/``ILIKE``
  (no ESCAPE), ``AND``/``OR``/``NOT``, ``+ - *`` and unary minus, ``||``, over declared
  columns and finite literals, and these functions, chosen because they are
  deterministic and cannot fail on any data value: LOWER, UPPER, LENGTH, TRIM,
  LTRIM, RTRIM, CONCAT, STARTS_WITH, ENDS_WITH, CONTAINS, ABS, ROUND (constant
  digits), FLOOR, CEIL, SIGN, COALESCE/IFNULL, NULLIF, GREATEST, LEAST, TRY_CAST to
  BIGINT/INTEGER/DOUBLE/VARCHAR/BOOLEAN, and TRY. Operands are type-checked against
  the policy's column types (a failing implicit cast would be an error *after* the
  charge). Every ``+ - *``, unary minus and ABS is wrapped in DuckDB's ``TRY(…)``, so
  an integer or DECIMAL overflow gives NULL instead of an error. A CAST of a column is
  read as TRY_CAST (a value that does not convert filters its row out). Division, modulo,
  CASE and every other function are refused.
* GROUP BY: bare declared columns (by name, SELECT alias or position); columns
  without public keys are selected by private partition selection
  (:mod:`dpgate.sql.partition_selection`). Every non-aggregate SELECT item must be a group key; a group key that
  is not selected is a hidden key output.
* HAVING / ORDER BY / LIMIT: post-processing over the outputs (aliases, positions,
  group keys or the aggregate expressions themselves; an aggregate that only they
  use becomes a hidden output; an ORDER BY expression a hidden derived output). A
  number as a HAVING condition means ``<> 0``; CAST of a released value has TRY
  semantics. LIMIT is a non-negative integer literal.
* Keys only (GROUP BY, no aggregate): over public keys the plan has no primitive (its
  release is the public key list, free); over keys without public keys a hidden
  count drives partition selection. Without GROUP BY, a protected table's rows are
  refused (before its columns are resolved); a public table's rows are read exactly.

Canonical form: identifiers resolve case-insensitively to the declared names;
predicates are simplified by ``sqlglot.optimizer.simplify`` (which sorts and
deduplicates AND/OR operands and puts columns left of constants), ``IN`` lists are
sorted and deduplicated, numeric literals are normalised (``1.0`` → ``1``); labels
(aliases) do not enter the plan hash.

Every refusal raises before anything is executed, with a message that quotes the
offending construct and never contains data.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Mapping

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError, TokenError

from dpgate.errors import DpgateError, InvalidRequest, InvalidSql, UnknownColumn, UnknownTable, UnsupportedQuery
from dpgate.policy import (
    MAX_SQUARED_STEPS,
    ColumnPolicy,
    DatasetPolicy,
    TablePolicy,
    key_domain,
    quote_identifier,
)
from dpgate.sql import partition_selection as selection
from dpgate.sql.keys import KeyDomain, canonical_date_key, derive_key_domain, width_bucket_to_case
from dpgate.sql.joins import JOIN_MARK, rewrite_joins
from dpgate.sql.narrow import narrow_keys
from dpgate.sql.quantile import QUANTILE_FUNCTIONS, is_quantile_call, quantile_call, quantile_name, quantile_sql
from dpgate.sql.rules import MAX_NESTING, apply_statement_rules, inline_ctes, parser_nesting_refusal
from dpgate.sql.per_unit import rewrite_per_unit
from dpgate.sql.bind import (
    AGGREGATES,
    SOURCE,
    Binder,
    canonical_columns,
    canonical_value,
    canonicalize_literals,
    derived_value,
    number,
    plan_where,
    simplify_tree,
    only_args,
    real_args,
    snippet,
    unbounded_message,
    unsupported,
)
from dpgate.sql.plan import (
    FUNCTION_PRIMITIVES,
    AggregateOutput,
    ComputedKey,
    DerivedOutput,
    DerivedValue,
    KeyOutput,
    OrderItem,
    Output,
    Primitive,
    QueryPlan,
)

# Short local names (the statement-level code below predates dpgate.sql.bind).
_number = number
_canonical_columns = canonical_columns
_canonicalize_literals = canonicalize_literals
_simplify = simplify_tree

DIALECT = "duckdb"
#: SQL dialects an analyst may write in (sqlglot dialect names); the plan is the same
#: whatever the dialect, and only SQL generated from the plan (DuckDB) is executed.
DIALECTS = ("duckdb", "postgres", "bigquery", "spark", "tsql", "mysql", "snowflake", "trino")
#: Other names of :data:`DIALECTS` accepted in any case (product names; sqlglot itself knows
#: only the lower-case names of :data:`DIALECTS`).
DIALECT_ALIASES = {"postgresql": "postgres", "pg": "postgres", "sqlserver": "tsql", "mssql": "tsql",
                   "sparksql": "spark", "databricks": "spark", "googlesql": "bigquery"}
#: Longest SQL text accepted (characters).
MAX_SQL_LENGTH = 100_000
#: Most key combinations (public keys × computed-key domains) one query may release: the
#: same limit as one computed key's domain (``sql.keys.MAX_DOMAIN``), so that combining keys
#: cannot get around it. Checked before the charge: a release of millions of noisy cells
#: takes minutes of sampling and makes every page that shows it heavy.
MAX_GROUPS = 100_000
#: Most syntax-tree nodes in one query (planning cost stays bounded).
MAX_NODES = 20_000
_NUMERIC = ("int", "float")
_INT_RE = re.compile(r"^\d+$")

# --- statement-level ---------------------------------------------------------------------

_SELECT_ARGS = {"expressions", "from_", "from", "where", "group", "having", "order", "limit"}
_SELECT_ARG_NAMES = {
    "with_": "WITH (common table expressions)",
    "distinct": "SELECT DISTINCT",
    "joins": "JOIN",
    "laterals": "LATERAL",
    "qualify": "QUALIFY",
    "windows": "WINDOW clauses",
    "offset": "OFFSET",
    "sample": "USING SAMPLE / TABLESAMPLE",
    "into": "SELECT INTO",
    "pivots": "PIVOT",
    "prewhere": "PREWHERE",
    "connect": "CONNECT BY",
    "locks": "FOR UPDATE",
    "settings": "SETTINGS",
    "exclude": "EXCLUDE",
    "kind": "SELECT AS STRUCT/VALUE",
}

# Constructs refused wherever they appear, with the message naming them.
_STRUCTURAL = {
    exp.Subquery: "subqueries are not supported",
    exp.Select: "subqueries are not supported",
    exp.Exists: "subqueries (EXISTS) are not supported",
    exp.Join: "JOIN is not supported",
    exp.Lateral: "LATERAL is not supported",
    exp.Unnest: "UNNEST is not supported",
    exp.Window: "window functions (OVER …) are not supported",
    exp.With: "WITH (common table expressions) is not supported",
    exp.CTE: "WITH (common table expressions) is not supported",
    exp.SetOperation: "set operations (UNION / INTERSECT / EXCEPT) are not supported",
    exp.Placeholder: "query parameters are not supported",
    exp.Parameter: "query parameters are not supported",
    exp.TableSample: "TABLESAMPLE / USING SAMPLE is not supported",
}

_AGGREGATES = AGGREGATES  # sql.bind's list
_AGG_FUNCTION = {
    exp.Sum: "sum",
    exp.Avg: "avg",
    exp.Variance: "var_pop",
    exp.VariancePop: "var_pop",
    exp.Stddev: "stddev_pop",
    exp.StddevPop: "stddev_pop",
    exp.StddevSamp: "stddev_pop",
}
_AGG_SQL = {
    "count": "COUNT(*)",
    "count_column": "COUNT({c})",
    "count_distinct_unit": "COUNT(DISTINCT {c})",
    "count_distinct": "COUNT(DISTINCT {c})",
    "sum": "SUM({c})",
    "avg": "AVG({c})",
    "var_pop": "VAR_POP({c})",
    "stddev_pop": "STDDEV_POP({c})",
}
#: Aggregates sqlglot reads as anonymous functions, by lower-case name: MEAN (DuckDB),
#: VAR (T-SQL, SmartNoise), VARP and STDEVP (T-SQL's population forms).
_ANON_AGGREGATES = {"mean": "avg", "var": "var_pop", "varp": "var_pop", "stdevp": "stddev_pop"}
_snippet = snippet  # the construct as SQL text, a call quoted as written (sql.bind)


def _label(node: exp.Expression) -> str:
    """A released column's default title: the item in DuckDB's spelling (as before)."""
    text = " ".join(node.sql(dialect=DIALECT, comments=False).split())
    return text if len(text) <= 200 else text[:199] + "…"


# the binder's message helpers, under the names this module has always used
_unsupported, _real_args, _only_args = unsupported, real_args, only_args


#: Statement keywords sqlglot may parse as a generic ``Command`` (named in refusals).
_STATEMENT_WORDS = frozenset(
    "ALTER ANALYZE ATTACH CALL CHECKPOINT COMMENT COPY CREATE DELETE DESCRIBE DETACH DROP EXECUTE "
    "EXPLAIN EXPORT FORCE GRANT IMPORT INSERT INSTALL LOAD MERGE PRAGMA PREPARE RESET REVOKE SET "
    "SHOW SUMMARIZE TRUNCATE UPDATE USE VACUUM".split()
)


def check_dialect(dialect: str | None) -> str:
    """The dialect name to read analyst SQL with (``None`` → ``duckdb``).

    Any case and surrounding blanks are accepted (``"DuckDB"``, ``" Postgres "``), and the
    aliases of :data:`DIALECT_ALIASES` (``postgresql``, ``mssql``, ``databricks``, …). The one
    normaliser of the API, the CLI and the UI.

    Raises:
        InvalidRequest: not one of :data:`DIALECTS` or an alias (the message lists them).
    """
    if dialect is None:
        return DIALECT
    name = dialect.strip().lower() if isinstance(dialect, str) else dialect
    name = DIALECT_ALIASES.get(name, name)
    if name not in DIALECTS:
        raise InvalidRequest(
            f"unknown SQL dialect {str(dialect)[:40]!r}: use one of {', '.join(DIALECTS)} (any case; also "
            f"{', '.join(sorted(DIALECT_ALIASES))})",
            {"dialect": str(dialect), "dialects": list(DIALECTS), "aliases": dict(DIALECT_ALIASES)},
        )
    return name


def parse_statement(sql: str, dialect: str | None = None) -> exp.Select:
    """Parse SQL text into exactly one sqlglot SELECT.

    Args:
        sql: the analyst's SQL text.
        dialect: one of :data:`DIALECTS` (default ``duckdb``): how to read the text.

    Raises:
        InvalidRequest: an unknown dialect.
        InvalidSql: not a string, too long, does not parse, or not exactly one statement.
        UnsupportedQuery: a statement other than SELECT (sqlglot ``Command`` included)
            or a set operation.
    """
    if not isinstance(sql, str):
        raise InvalidSql("the SQL must be a string")
    if len(sql) > MAX_SQL_LENGTH:
        raise InvalidSql(f"the SQL is longer than {MAX_SQL_LENGTH} characters")
    if "\x00" in sql:
        raise InvalidSql("the SQL contains a NUL character")
    try:
        statements = [s for s in sqlglot.parse(sql, read=check_dialect(dialect)) if s is not None]
    except ParseError as exc:
        err = exc.errors[0] if exc.errors else {}
        description = str(err.get("description") or "syntax error")
        if "<" in description or "'this'" in description:  # parser internals, not for users
            description = "syntax error"
        near = str(err.get("highlight") or "").strip()[:40]
        raise InvalidSql(
            f"the SQL does not parse: {description}"
            + (f" near {near!r}" if near else "")
            + f" (line {err.get('line', '?')}, column {err.get('col', '?')})",
            {"line": err.get("line"), "column": err.get("col")},
        ) from None
    except (TokenError, SqlglotError) as exc:
        raise InvalidSql(f"the SQL does not parse: {str(exc).splitlines()[0][:200]}") from None
    except RecursionError:  # sqlglot's parser recursed past Python's limit
        raise parser_nesting_refusal(sql, check_dialect(dialect)) from None
    if not statements:
        raise InvalidSql("no SQL statement was given")
    if len(statements) > 1:
        raise InvalidSql(
            f"exactly one statement is allowed; found {len(statements)}",
            {"statements": len(statements)},
        )
    stmt = statements[0]
    if isinstance(stmt, exp.Command):
        word = str(stmt.this).split()[0].upper() if str(stmt.this).strip() else "this"
        if word.isalpha() and word in _STATEMENT_WORDS:
            raise _unsupported(f"{word} statements are not supported: only a single SELECT is", stmt)
        raise InvalidSql("the SQL does not parse: expected a single SELECT statement")
    if isinstance(stmt, exp.SetOperation):
        raise _unsupported(
            f"set operations ({stmt.key.upper()}) are not supported: only a single SELECT is",
            stmt,
        )
    if isinstance(stmt, exp.Subquery):
        raise _unsupported("subqueries are not supported: only a single plain SELECT is", stmt)
    if not isinstance(stmt, exp.Select):
        if stmt.key.upper() in _STATEMENT_WORDS or isinstance(stmt, (exp.DDL, exp.DML, exp.Query, exp.Values)):
            raise _unsupported(
                f"{stmt.key.upper()} statements are not supported: only a single SELECT is", stmt
            )
        raise InvalidSql("the SQL does not parse: expected a single SELECT statement")
    return plain_divisions(stmt)


def plain_divisions(tree: exp.Expression) -> exp.Expression:
    """Drop sqlglot's NULL-safe mark from every ``a / b`` (in place; returns ``tree``).

    Spark, Databricks and MySQL read ``a / b`` as a NULL-safe division (NULL when b = 0):
    sqlglot marks the node ``safe`` and renders it for DuckDB as ``a / NULLIF(b, 0)``, which the
    planner then refused as a crash (``ValueError: NULLIF(…) is not a bounded numeric
    expression``, HTTP 500; issue 19, item 7). The planner admits a division only where it
    cannot divide by zero — inside an aggregate when the divisor's range, from the policy's
    bounds, excludes 0 (:meth:`dpgate.sql.bind.Binder._divide`: the same interval analysis
    for every dialect); division in WHERE is refused; post-processing (HAVING, ORDER BY) divides
    by zero as NULL. Where a division runs, the NULL-safe and the plain division are therefore
    the same, and the query gets the plan (and plan hash) of its DuckDB spelling.

    Likewise a division that a dialect types (PostgreSQL, T-SQL, Trino: integer by integer is
    truncated; :func:`dpgate.sql.bind._check_typed_division`) is a fraction when an operand is a
    decimal literal (``age / 2.0``, ``10.0 / (age + 1)``: NUMERIC or DECIMAL division there): its
    mark is dropped here, before ``2.0`` is canonicalised to ``2`` (which made the planner refuse
    it as an integer division).
    """
    for node in tree.find_all(exp.Div):
        if node.args.get("safe"):
            node.set("safe", None)
        if node.args.get("typed") and any(_decimal_literal(x) for x in (node.this, node.expression)):
            node.set("typed", None)
    return tree


def _decimal_literal(node: exp.Expression) -> bool:
    """A numeric literal written with a fraction or an exponent (``2.0``, ``1e3``), maybe negated
    or parenthesised."""
    while isinstance(node, (exp.Paren, exp.Neg)):
        node = node.this
    return isinstance(node, exp.Literal) and not node.is_string and any(c in str(node.this) for c in ".eE")


# --- scope and column resolution ------------------------------------------------------------


@dataclass
class _Scope:
    policy: DatasetPolicy
    table: TablePolicy
    qualifiers: set[str]

    def resolve(self, node: exp.Column) -> str:
        """Declared column name (or the unit column's name) that ``node`` refers to."""
        if isinstance(node.this, exp.Star):
            raise _unsupported("SELECT * is not supported: name group keys and aggregates", node)
        if node.args.get("catalog") is not None:
            raise UnknownTable(f"unknown table reference in {_snippet(node)!r}",
                               {"column": _snippet(node)})
        db = node.args.get("db")
        if db is not None and db.name.casefold() != self.policy.name.casefold():
            raise UnknownTable(f"unknown dataset {db.name!r} in {_snippet(node)!r}",
                               {"dataset": db.name})
        tbl = node.args.get("table")
        if tbl is not None and tbl.name.casefold() not in self.qualifiers:
            raise UnknownTable(
                f"unknown table or alias {tbl.name!r} in {_snippet(node)!r}", {"table": tbl.name}
            )
        col = self.table.find_column(node.name)
        if col is not None:
            return col.name
        unit = self.table.privacy_unit
        if unit is not None and node.name.casefold() == unit.casefold():
            return unit
        raise UnknownColumn(
            f"table {self.table.name!r} declares no column {node.name!r}",
            {"table": self.table.name, "column": node.name},
        )

    def is_unit(self, name: str) -> bool:
        """True when ``name`` is the table's privacy unit column (case-insensitive)."""
        unit = self.table.privacy_unit
        return unit is not None and name.casefold() == unit.casefold()

    def declared(self, node: exp.Column) -> ColumnPolicy:
        """The declared column for ``node`` (UnknownColumn for an undeclared unit column)."""
        name = self.resolve(node)
        col = self.table.find_column(name)
        if col is None:
            raise UnknownColumn(
                f"the privacy unit column {name!r} is not declared in the policy's columns; "
                f"it can only be used in COUNT(DISTINCT {name}) and COUNT({name})",
                {"table": self.table.name, "column": name},
            )
        return col


def _resolve_from(stmt: exp.Select, policy: DatasetPolicy) -> tuple[TablePolicy, set[str]]:
    frm = stmt.args.get("from_") or stmt.args.get("from")
    if frm is None:
        raise UnsupportedQuery("a FROM clause naming one declared table is required")
    tbl = frm.this
    if isinstance(tbl, (exp.Subquery, exp.Select)):
        raise _unsupported("subqueries in FROM are not supported", tbl)
    if not isinstance(tbl, exp.Table) or not isinstance(tbl.this, exp.Identifier):
        inner = tbl.this if isinstance(tbl, exp.Table) else tbl
        raise _unsupported(
            f"table functions such as {_snippet(inner)} are not supported: name a declared table",
            inner,
        )
    extra = _real_args(tbl) - {"this", "db", "alias"}
    if extra:
        raise _unsupported(
            f"table modifiers ({', '.join(sorted(extra))}) are not supported in {_snippet(tbl)}",
            tbl,
        )
    db = tbl.args.get("db")
    if db is not None and db.name.casefold() != policy.name.casefold():
        raise UnknownTable(
            f"unknown dataset {db.name!r}: this query runs on dataset {policy.name!r}",
            {"dataset": db.name},
        )
    table = policy.table(tbl.name)
    qualifiers = {table.name.casefold()}
    alias = tbl.args.get("alias")
    if alias is not None:
        if _real_args(alias) - {"this"}:
            raise _unsupported("column aliases on the table are not supported", alias)
        qualifiers.add(alias.name.casefold())
    return table, qualifiers


def refuse_unit_path_tables(stmt: exp.Expression, policy: DatasetPolicy) -> None:
    """Refuse a query that reads a table whose privacy unit is a foreign-key path (issue 21 hook).

    Run once per query, after the CTEs are inlined and before any other rewrite, over every
    table the statement names (FROM, JOIN, subqueries): such a table has no unit column of its
    own (:attr:`~dpgate.policy.TablePolicy.unit_path`), and the planner does not yet join along
    the path to attach the unit to each row before bounding. Belongs with table resolution
    (``sql/resolve.py`` of the compile-once plan), where it becomes that join.

    Raises:
        UnsupportedQuery: ``details = {"reason": "unit_path", "table", "unit_path", "construct"}``.
    """
    for node in stmt.find_all(exp.Table):
        if not isinstance(node.this, exp.Identifier):
            continue
        table = policy.tables.get(node.name) or next(
            (t for t in policy.tables.values() if t.name.casefold() == node.name.casefold()), None)
        if table is not None and table.unit_path is not None:
            raise UnsupportedQuery(
                f"table {table.name!r} reaches its privacy unit through foreign keys ({table.unit_path}): "
                "queries over such tables are planned (issue 21: the gateway will join along the path to "
                "attach the unit to every row before bounding) and refused until then",
                {"reason": "unit_path", "table": table.name, "unit_path": table.unit_path.to_list(),
                 "construct": _snippet(node)})


def _check_structure(stmt: exp.Select) -> None:
    for key in _real_args(stmt) - _SELECT_ARGS:
        name = _SELECT_ARG_NAMES.get(key, key.upper())
        raise _unsupported(f"{name} is not supported", stmt.args[key] if isinstance(
            stmt.args[key], exp.Expression) else None)
    for node in stmt.walk():
        if node is stmt:
            continue
        for cls, message in _STRUCTURAL.items():
            if isinstance(node, cls):
                raise _unsupported(f"{message}: {_snippet(node)}", node)
        if isinstance(node, exp.Command):  # pragma: no cover - defensive
            raise _unsupported("commands are not supported", node)


# --- aggregates, outputs ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Agg:
    function: str
    column: str | None
    alpha: float | None = None  # quantiles only (dpgate.sql.quantile)
    derived: DerivedValue | None = None  # an aggregated expression (dpgate.sql.bind)


def _unparen(node: exp.Expression) -> exp.Expression:
    """``node`` without enclosing parentheses (``((SUM(x)))`` → ``SUM(x)``)."""
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _is_aggregate(node: exp.Expression) -> bool:
    if isinstance(node, _AGGREGATES):
        return True
    if isinstance(node, exp.Anonymous) and node.name.lower() in _ANON_AGGREGATES:
        return True
    if isinstance(node, exp.Filter):  # agg(x) FILTER (WHERE p)
        return _is_aggregate(node.this) and not is_quantile_call(node.this)
    return is_quantile_call(node)  # quantiles hook (dpgate.sql.quantile)


# --- quantiles hook: MEDIAN, PERCENTILE_*, QUANTILE_*, APPROX_QUANTILE, MIN, MAX ------------


def _quantile_aggregate(node: exp.Expression, scope: _Scope) -> _Agg:
    """(quantile|min|max, column, α) of a quantile aggregate over a bounded numeric column."""
    function, arg, alpha = quantile_call(node)
    if isinstance(arg, exp.Distinct):
        raise _unsupported(f"{_snippet(node)}: DISTINCT is not supported in quantiles", node)
    if not isinstance(arg, exp.Column):
        raise _unsupported(
            f"expressions inside aggregates are not supported: {_snippet(node)} "
            "(the argument must be a bare declared column)", node)
    name = scope.resolve(arg)
    if scope.is_unit(name):
        raise _unsupported(f"{_snippet(node)}: aggregating the privacy unit column is not allowed", node)
    col = scope.table.column(name)
    if col.type not in _NUMERIC:
        raise _unsupported(f"{_snippet(node)}: column {name!r} is {col.type}, not numeric", node)
    if not col.bounded and not scope.table.public:
        raise _unsupported(
            f"{_snippet(node)}: column {name!r} has no bounds in the policy (a DP quantile, "
            "minimum or maximum picks from candidates spanning [lower, upper]: declare them)", node)
    return _Agg(function, name, float(alpha))


def _is_constant(node: exp.Expression) -> bool:
    if isinstance(node, exp.Paren):
        return _is_constant(node.this)
    if isinstance(node, exp.Neg):
        return _is_constant(node.this)
    return isinstance(node, (exp.Literal, exp.Null, exp.Boolean))


def _aggregate(node: exp.Expression, scope: _Scope) -> _Agg:
    """Map an aggregate call to (function, column or derived value), refusing anything outside
    the subset. ``agg(x) FILTER (WHERE p)`` is ``agg(CASE WHEN p THEN x END)``; COUNT(*) with a
    FILTER counts the rows where p holds."""
    if isinstance(node, exp.Filter):
        return _filtered(node, scope)
    if is_quantile_call(node):
        return _quantile_aggregate(node, scope)
    table = scope.table
    if isinstance(node, exp.Count):
        _only_args(node, {"this", "big_int"})
        arg = node.this
        if arg is None or isinstance(arg, exp.Star):
            if isinstance(arg, exp.Star) and _real_args(arg):
                raise _unsupported(f"{_snippet(node)} is not supported", node)
            return _Agg("count", None)
        if isinstance(arg, exp.Distinct):
            items = arg.expressions
            if len(items) == 1 and isinstance(items[0], exp.Column):
                if scope.is_unit(scope.resolve(items[0])):
                    return _Agg("count_distinct_unit", None)
                # issue 11: any other declared column; each unit adds at most m distinct values
                # per group (sql/bound.py)
                return _Agg("count_distinct", scope.declared(items[0]).name)
            raise _unsupported(
                f"{_snippet(node)}: COUNT(DISTINCT …) takes one bare declared column", node)
        if isinstance(arg, exp.Literal) or (isinstance(arg, exp.Neg) and _is_constant(arg)):
            return _Agg("count", None)
        if isinstance(arg, (exp.Null,)):
            raise _unsupported("COUNT(NULL) is 0 on any data: there is nothing to release "
                               "(nothing was charged)", node)
        if isinstance(arg, exp.Column):
            name = scope.resolve(arg)
            if scope.is_unit(name):
                return _Agg("count", None)  # rows with a NULL unit are dropped
            return _Agg("count_column", name)
        return _expression_aggregate("count_column", arg, node, scope)
    if isinstance(node, exp.ApproxDistinct):  # APPROX_COUNT_DISTINCT: the DP estimate of COUNT(DISTINCT)
        _only_args(node, {"this"})
        arg = node.this
        if isinstance(arg, exp.Column):
            if scope.is_unit(scope.resolve(arg)):
                return _Agg("count_distinct_unit", None)
            return _Agg("count_distinct", scope.declared(arg).name)
        raise _unsupported(f"{_snippet(node)} takes one bare declared column", node)
    if isinstance(node, exp.Anonymous):
        function = _ANON_AGGREGATES[node.name.lower()]
        if len(node.expressions) != 1:
            raise _unsupported(f"{_snippet(node)} takes exactly one column", node)
        arg = node.expressions[0]
    else:
        _only_args(node, {"this"})
        function = _AGG_FUNCTION[type(node)]
        arg = node.this
    if isinstance(arg, exp.Distinct):
        raise _unsupported(
            f"{_snippet(node)}: DISTINCT inside SUM/AVG/VAR/STDDEV is not supported: the set of distinct values is shared by all privacy units, so "
            "contribution bounding cannot cap what one unit adds to it (write it without "
            "DISTINCT; COUNT(DISTINCT <privacy unit>) is supported)",
            node,
        )
    if not isinstance(arg, exp.Column):
        return _expression_aggregate(function, arg, node, scope)
    name = scope.resolve(arg)
    if scope.is_unit(name):
        raise _unsupported(
            f"{_snippet(node)}: aggregating the privacy unit column is not allowed "
            f"(only COUNT(DISTINCT {name}))",
            node,
        )
    col = table.column(name)
    if col.type not in _NUMERIC:
        raise _unsupported(f"{_snippet(node)}: column {name!r} is {col.type}, not numeric", node)
    if table.public:  # public tables hook: answered exactly, nothing to bound
        return _Agg(function, name)
    if not col.bounded:
        raise _unsupported(
            f"{_snippet(node)}: column {name!r} has no bounds in the policy "
            "(declare lower and upper to SUM/AVG/VAR/STDDEV it)",
            node,
        )
    if function in ("var_pop", "stddev_pop") and max(map(abs, col.fixed_point_bounds)) > (
        MAX_SQUARED_STEPS
    ):
        raise _unsupported(
            f"{_snippet(node)}: the clamp of {name!r} spans more than 2**31 steps of its "
            "resolution, so its squares would overflow 64-bit integers (the policy needs a "
            "coarser resolution)",
            node,
        )
    return _Agg(function, name)


def _check_squares(function: str, bounds: tuple[int, int], name: str, node: exp.Expression) -> None:
    if function in ("var_pop", "stddev_pop") and max(map(abs, bounds)) > MAX_SQUARED_STEPS:
        raise _unsupported(
            f"{_snippet(node)}: the clamp of {name!r} spans more than 2**31 steps of its "
            "resolution, so its squares would overflow 64-bit integers (the policy needs a "
            "coarser resolution)",
            node,
        )


def _filtered(node: exp.Filter, scope: _Scope) -> _Agg:
    """``agg(x) FILTER (WHERE p)`` as the aggregate of ``CASE WHEN p THEN x END``."""
    inner, where = node.this, node.args.get("expression")
    if not _is_aggregate(inner) or not isinstance(where, exp.Where):
        raise _unsupported(f"FILTER is only supported on an aggregate: {_snippet(node)}", node)
    cond = where.this
    if isinstance(inner, exp.Count):
        _only_args(inner, {"this", "big_int"})
        arg = inner.this
        if isinstance(arg, exp.Distinct):
            raise _unsupported(f"COUNT(DISTINCT …) with FILTER is not supported: {_snippet(node)}",
                               node)
        if arg is None or isinstance(arg, exp.Star) or _is_constant(arg) and not isinstance(
                arg, exp.Null):
            value: exp.Expression = exp.Literal.number(1)
        elif isinstance(arg, exp.Column) and scope.is_unit(scope.resolve(arg)):
            value = exp.Literal.number(1)
        else:
            value = arg.copy()
        case = exp.Case(ifs=[exp.If(this=cond.copy(), true=value)])
        return _expression_aggregate("count_column", case, node, scope)
    if isinstance(inner, exp.Anonymous):
        function = _ANON_AGGREGATES[inner.name.lower()]
        if len(inner.expressions) != 1:
            raise _unsupported(f"{_snippet(inner)} takes exactly one column", inner)
        arg = inner.expressions[0]
    else:
        _only_args(inner, {"this"})
        function = _AGG_FUNCTION[type(inner)]
        arg = inner.this
    if isinstance(arg, exp.Distinct):
        raise _unsupported(f"{_snippet(node)}: DISTINCT is only supported in COUNT(DISTINCT "
                           "<privacy unit>)", node)
    case = exp.Case(ifs=[exp.If(this=cond.copy(), true=arg.copy())])
    return _expression_aggregate(function, case, node, scope)


def _expression_aggregate(function: str, arg: exp.Expression, node: exp.Expression,
                          scope: _Scope) -> _Agg:
    """An aggregate of a row expression: bind it, derive its range from the policy's bounds,
    and make the range the clamp of the per-row value (the sensitivity follows from it)."""
    if any(isinstance(n, exp.Column) and isinstance(n.this, exp.Star) for n in arg.walk()):
        raise _unsupported(f"{_snippet(node)} is not supported", node)
    if isinstance(arg, exp.Star):
        raise _unsupported(f"{_snippet(node)} is not supported", node)
    e, tree = canonical_value(arg, scope)
    if e.kind == "column" and e.type != "bool":
        # A spelling of a bare column (``(x)``, ``x + 0`` after simplification).
        col = scope.table.column(e.column)
        if function == "count_column":
            return _Agg("count_column", col.name)
        if col.type in _NUMERIC and col.bounded:
            _check_squares(function, col.fixed_point_bounds, col.name, node)
            return _Agg(function, col.name)
    if e.type not in ("int", "float", "bool"):
        raise _unsupported(
            f"{_snippet(node)}: the argument is a {e.type} value; aggregates take numbers "
            "(booleans count as 0/1)", node)
    if e.unbounded() is not None or e.range is None:
        raise _unsupported(unbounded_message(e, node), node)
    d = derived_value(e, tree)
    text = e.text()
    value = DerivedValue(text, d.type, d.lower, d.upper, d.resolution, str(e.range))
    _check_squares(function, value.column_policy().fixed_point_bounds, text, node)
    return _Agg(function, text, derived=value)


@dataclass
class _Out:
    kind: str  # "key" | "agg"
    column: str | None
    function: str | None
    label: str
    hidden: bool
    name: str = ""
    alpha: float | None = None  # quantiles only
    derived: DerivedValue | None = None
    tree: exp.Expression | None = None  # kind "expr": the item over placeholder columns
    refs: dict[str, "_Out"] | None = None  # kind "expr": placeholder → output


class _Outputs:
    """Outputs in SELECT order, then hidden ones; resolves references from HAVING/ORDER BY."""

    def __init__(self, scope: _Scope, group_by: list[str], keys: "_Keys | None" = None) -> None:
        self.scope = scope
        self.group_by = group_by
        self.keys = keys if keys is not None else _Keys(list(group_by), [])
        self.items: list[_Out] = []

    def key_type(self, name: str) -> str:
        """The type of group key ``name`` (a declared column or a computed key)."""
        return self.keys.column(name, self.scope.table).type

    def add_key(self, column: str, label: str, hidden: bool = False) -> _Out:
        """Append a group-key output."""
        out = _Out("key", column, None, label, hidden)
        self.items.append(out)
        return out

    def add_agg(self, agg: _Agg, label: str, hidden: bool = False) -> _Out:
        """Append an aggregate output."""
        out = _Out("agg", agg.column, agg.function, label, hidden, alpha=agg.alpha,
                   derived=agg.derived)
        self.items.append(out)
        return out

    def add_expression(self, node: exp.Expression, label: str, *, hidden: bool = False,
                       clause: str = "SELECT") -> _Out:
        """Append a post-processing item: an expression over aggregates, group keys and
        constants (``SUM(age) * 1``, ``3``), evaluated on the released values. A hidden one
        is what an ``ORDER BY`` expression sorts by (``clause`` decides how names resolve:
        in ORDER BY, output titles first)."""
        refs: dict[str, _Out] = {}

        def resolve(n: exp.Expression) -> exp.Expression:
            if _is_aggregate(n) or isinstance(n, exp.Column):
                key = f"__out{len(refs)}"
                refs[key] = self.reference(n, clause)
                return exp.column(key, quoted=True)
            return n

        tree = node.copy().transform(resolve, copy=False)
        out = _Out("expr", None, None, label, hidden, tree=tree, refs=refs)
        self.items.append(out)
        return out

    def find_agg(self, agg: _Agg) -> _Out:
        """The first output computing ``agg``, else a new hidden one."""
        for out in self.items:
            if (out.kind == "agg" and out.function == agg.function and out.column == agg.column
                    and out.alpha == agg.alpha):
                return out
        return self.add_agg(agg, _agg_label(agg, self.scope), hidden=True)

    def find_key(self, column: str) -> _Out:
        """The output of group key ``column``."""
        for out in self.items:
            if out.kind == "key" and out.column == column:
                return out
        raise KeyError(column)  # pragma: no cover - every group key has an output

    def by_label(self, name: str, node: exp.Expression) -> _Out | None:
        """The visible output labelled ``name`` (UnsupportedQuery if ambiguous), or None."""
        hits = [o for o in self.items if not o.hidden and o.label.casefold() == name.casefold()]
        distinct = {id(o) for o in hits}
        if len(distinct) > 1:
            raise _unsupported(f"output name {name!r} is ambiguous", node)
        return hits[0] if hits else None

    def reference(self, node: exp.Expression, clause: str) -> _Out:
        """The output a HAVING/ORDER BY operand refers to."""
        if _is_aggregate(node):
            return self.find_agg(_aggregate(node, self.scope))
        if isinstance(node, exp.Column):
            if node.args.get("table") is None and node.args.get("db") is None:
                if clause == "ORDER BY":
                    out = self.by_label(node.name, node)
                    if out is not None:
                        return out
                col = self.scope.table.find_column(node.name)
                if col is not None and col.name in self.group_by:
                    return self.find_key(col.name)
                out = self.by_label(node.name, node)
                if out is not None:
                    return out
            name = self.scope.resolve(node)
            if name in self.group_by:
                return self.find_key(name)
            raise _unsupported(
                f"{clause} can only refer to group keys and aggregates; {_snippet(node)} is "
                "a raw column",
                node,
            )
        key = self.keys.match(node, self.scope)
        if key is not None:
            return self.find_key(key.name)
        raise _unsupported(f"{_snippet(node)} is not supported in {clause}", node)

    def check_labels(self) -> None:
        """Refuse two released columns with the same title (case-insensitive).

        A release is a table whose columns (and their accuracy entries) are keyed by
        title: two columns titled ``v`` would leave one column's accuracy reported for
        both. The same computation repeated under one title (``SELECT COUNT(*), COUNT(*)``)
        is fine: its values and accuracy are the same. Raises UnsupportedQuery naming the
        title.
        """
        seen: dict[str, _Out] = {}
        for out in self.items:
            if out.hidden:
                continue
            first = seen.setdefault(out.label.casefold(), out)
            same = first is out or ((first.kind, first.column, first.function) == (
                out.kind, out.column, out.function) and out.kind != "expr")
            if not same:
                raise UnsupportedQuery(
                    f"two output columns are named {out.label!r}: give each column of the "
                    "SELECT list its own name (an alias, AS …)",
                    {"construct": out.label},
                )

    def assign_names(self) -> None:
        """Give every output its canonical name (``count``, ``sum_x``…; ``_2``… on a clash)."""
        taken: set[str] = set()
        for out in self.items:
            if out.kind == "key":
                base = out.column
            elif out.kind == "expr":
                base = "expr"
            elif out.function in ("count",):
                base = "count"
            elif out.function == "count_distinct_unit":
                base = f"count_distinct_{self.scope.table.privacy_unit}"
            elif out.derived is not None:
                base = f"{'count' if out.function == 'count_column' else out.function}_expr"
            elif out.function == "count_column":
                base = f"count_{out.column}"
            elif out.function in QUANTILE_FUNCTIONS:
                base = quantile_name(out.function, out.alpha, out.column)
            else:
                base = f"{out.function}_{out.column}"
            name, i = base, 2
            while name.casefold() in taken:
                name = f"{base}_{i}"
                i += 1
            taken.add(name.casefold())
            out.name = name


def _agg_sql(function: str, column: str | None, scope: _Scope, alpha: float | None = None) -> str:
    if function in QUANTILE_FUNCTIONS:
        return quantile_sql(function, alpha, quote_identifier(column))
    if function == "count_distinct_unit":
        column = scope.table.privacy_unit
    if column and column not in scope.table.columns and column != scope.table.privacy_unit:
        return _AGG_SQL[function].format(c=column)  # a derived value: canonical SQL text
    return _AGG_SQL[function].format(c=quote_identifier(column) if column else "")


def _agg_label(agg: _Agg, scope: _Scope) -> str:
    if agg.function in QUANTILE_FUNCTIONS:
        return quantile_sql(agg.function, agg.alpha, agg.column)
    col = agg.column if agg.function != "count_distinct_unit" else scope.table.privacy_unit
    return _AGG_SQL[agg.function].format(c=col or "")


# --- HAVING ---------------------------------------------------------------------------------------


def _plan_having(
    node: exp.Expression | None, outputs: _Outputs
) -> tuple[exp.Expression | None, dict[str, _Out]]:
    """Type-check HAVING and resolve its operands to outputs.

    Returns a copy over Column(<placeholder>) nodes and the placeholder → output map.
    """
    if node is None:
        return None, {}
    refs: dict[str, _Out] = {}

    def reference_type(n: exp.Expression) -> str:
        out = outputs.reference(n, "HAVING")
        if out.kind == "key":
            return outputs.key_type(out.column)
        return "float"

    binder = Binder(reference_type, "HAVING", is_aggregate=_is_aggregate)
    node = _as_condition(node, binder)
    binder.check_predicate(node)

    def resolve(n: exp.Expression) -> exp.Expression:
        if _is_aggregate(n) or isinstance(n, exp.Column):
            key = f"__out{len(refs)}"
            refs[key] = outputs.reference(n, "HAVING")
            return exp.column(key, quoted=True)
        return n

    return node.copy().transform(resolve, copy=False), refs


def _as_condition(node: exp.Expression, binder: Binder) -> exp.Expression:
    """``node`` with each number used as a condition spelled ``(x) <> 0``.

    SQL engines read a number in a condition as true when it is not 0 (DuckDB's
    ``HAVING married`` for an integer key ``married``, SmartNoise's test suite); the
    binder wants booleans, so an operand of AND/OR/NOT (or the whole HAVING) whose type
    is int or float is compared with 0. Same rows, one canonical form.
    """

    def fix(n: exp.Expression) -> exp.Expression:
        inner = _unparen(n)
        if isinstance(inner, (exp.And, exp.Or)):
            out = inner.copy()
            out.set("this", fix(inner.this))
            out.set("expression", fix(inner.expression))
            return out
        if isinstance(inner, exp.Not):
            return exp.Not(this=fix(inner.this))
        try:
            numeric = binder.type(n) in _NUMERIC
        except (UnsupportedQuery, UnknownColumn, UnknownTable):
            return n  # the binder's own check names the problem
        if numeric:
            return exp.NEQ(this=exp.Paren(this=n.copy()), expression=exp.Literal.number(0))
        return n

    return fix(node)


def _nondeterministic(node: exp.Expression) -> bool:
    """True when ``node`` calls a function whose value is not a function of the release
    (random numbers, the clock: :data:`dpgate.postprocess.expressions.NONDETERMINISTIC_FUNCTIONS`)."""
    from dpgate.postprocess.expressions import NONDETERMINISTIC_FUNCTIONS

    return any(isinstance(n, exp.Func) and (n.sql_name().upper() in NONDETERMINISTIC_FUNCTIONS
                                            or str(n.name).upper() in NONDETERMINISTIC_FUNCTIONS)
               for n in node.walk())


def _finish_expression(tree: exp.Expression, refs: dict[str, _Out]) -> str:
    """Canonical SQL of a select-list post-processing item over output names."""

    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in refs:
            return exp.column(refs[node.name].name, quoted=True)
        return node

    tree = _canonicalize_literals(tree.transform(rename, copy=True))
    return tree.sql(dialect=DIALECT, comments=False)


def _finish_having(tree: exp.Expression | None, refs: dict[str, _Out]) -> str | None:
    if tree is None:
        return None

    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in refs:
            return exp.column(refs[node.name].name, quoted=True)
        return node

    tree = tree.transform(rename, copy=True)
    tree = _canonicalize_literals(tree)
    tree = _simplify(tree)
    tree = _canonicalize_literals(tree)
    if isinstance(tree, exp.Boolean) and tree.this:
        return None
    return tree.sql(dialect=DIALECT, comments=False)


# --- the planner ------------------------------------------------------------------------------------


def _primitive_prefix(table: TablePolicy) -> str:
    names = {c.casefold() for c in table.columns}
    if table.privacy_unit:
        names.add(table.privacy_unit.casefold())
    prefix = "p"
    while any(re.fullmatch(re.escape(prefix) + r"\d+", n) for n in names):
        prefix = "_" + prefix
    return prefix


@dataclass
class _Keys:
    """The GROUP BY keys: declared columns (policy order), then computed keys (canonical order)."""

    columns: list[str]
    computed: list[ComputedKey]

    @property
    def names(self) -> list[str]:
        """Every group key's name, in release order."""
        return self.columns + [k.name for k in self.computed]

    def match(self, node: exp.Expression, scope: _Scope) -> ComputedKey | None:
        """The computed key whose expression ``node`` spells, or None."""
        if not self.computed or _is_aggregate(node) or node.find(*_AGGREGATES):
            return None
        try:
            text = _key_tree(node, scope).sql(dialect=DIALECT, comments=False)
        except (UnsupportedQuery, UnknownColumn, UnknownTable):
            return None
        return next((k for k in self.computed if k.expression == text), None)

    def column(self, name: str, table: TablePolicy) -> ColumnPolicy:
        """The group key ``name`` as a column (a computed key's domain as its public keys)."""
        for k in self.computed:
            if k.name == name:
                return k.as_column()
        return table.column(name)


def refuse_key_without_public_keys(name: str, item: exp.Expression) -> None:
    """The refusal of a GROUP BY on a declared column without public keys.

    The one place where keys that the policy does not list are refused; private partition
    selection (issue 11) replaces it.

    Raises:
        UnsupportedQuery: always.
    """
    raise _unsupported(
        f"GROUP BY {name} needs public keys in the policy (private partition selection "
        "is not supported yet)",
        item,
    )


def _key_tree(node: exp.Expression, scope: _Scope) -> exp.Expression:
    """A computed key's canonical tree: declared names, canonical literals, simplified.

    Raises:
        UnsupportedQuery: the expression reads the privacy unit.
        UnknownColumn, UnknownTable: an undeclared name.
    """
    for col in node.find_all(exp.Column):
        if isinstance(col.this, exp.Star):
            raise _unsupported(f"{_snippet(node)} is not a group key", node)
        if scope.is_unit(scope.resolve(col)):
            raise _unsupported(
                f"GROUP BY {_snippet(node)}: the privacy unit ({scope.resolve(col)}) may not "
                "appear in a group key",
                node,
            )
    tree = _canonical_columns(width_bucket_to_case(_unparen(node)), scope.resolve)
    tree = _canonicalize_literals(tree)
    tree = _simplify(tree)
    tree = _canonicalize_literals(tree)
    return _unparen(canonical_date_key(_unparen(tree)))


def _key_prefix(table: TablePolicy) -> str:
    names = {c.casefold() for c in table.columns}
    if table.privacy_unit:
        names.add(table.privacy_unit.casefold())
    prefix = "g"
    while any(re.fullmatch(re.escape(prefix) + r"\d+", n) for n in names):
        prefix = "_" + prefix
    return prefix


def _group_by(stmt: exp.Select, scope: _Scope) -> _Keys:
    group = stmt.args.get("group")
    if group is None:
        return _Keys([], [])
    extra = _real_args(group) - {"expressions"}
    if extra:
        what = {"all": "GROUP BY ALL", "rollup": "ROLLUP", "cube": "CUBE",
                "grouping_sets": "GROUPING SETS"}.get(sorted(extra)[0], sorted(extra)[0].upper())
        raise UnsupportedQuery(f"{what} is not supported: list the group keys",
                               {"construct": what})
    if not group.expressions:
        raise InvalidSql("the SQL does not parse: GROUP BY needs at least one group key")
    selects = stmt.expressions
    cols: list[str] = []
    computed: dict[str, tuple[KeyDomain, exp.Expression]] = {}
    for item in group.expressions:
        if isinstance(item, (exp.Rollup, exp.Cube, exp.GroupingSets)):
            raise _unsupported(f"{item.key.upper()} is not supported: list the group keys", item)
        target = _unparen(item)
        if isinstance(target, exp.Literal) and not target.is_string:
            pos = _number(target)
            if not isinstance(pos, int) or not 1 <= pos <= len(selects):
                raise _unsupported(f"GROUP BY position {target.this} is not in the SELECT list",
                                   item)
            target = _unparen(selects[pos - 1].unalias())
        elif isinstance(target, exp.Column) and target.args.get("table") is None:
            if scope.table.find_column(target.name) is None and not scope.is_unit(target.name):
                for s in selects:
                    if isinstance(s, exp.Alias) and s.alias.casefold() == target.name.casefold():
                        target = _unparen(s.this)
                        break
        if isinstance(target, exp.Column):
            name = scope.resolve(target)
            if scope.is_unit(name):
                raise _unsupported(
                    f"GROUP BY the privacy unit ({name}) is never allowed: it would release "
                    "per-unit values",
                    target,
                )
            scope.table.column(name)  # declared (UnknownColumn otherwise)
            # issue 11 hook: a key without public keys is selected privately
            # (sql/partition_selection.py); a public table's key-less columns are keyed by their values
            if name not in cols:
                cols.append(name)
            continue
        if _is_aggregate(target) or target.find(*_AGGREGATES):
            raise _unsupported(f"GROUP BY {_snippet(target)}: a group key cannot contain an "
                               "aggregate", target)
        tree = _key_tree(target, scope)
        typer = Binder(lambda c: scope.declared(c).type)
        domain = derive_key_domain(tree, scope.table.columns, check_predicate=typer.check_predicate,
                                   shown=target)
        text = domain.expression.sql(dialect=DIALECT, comments=False)
        computed.setdefault(text, (domain, target))
    order = list(scope.table.columns)
    prefix = _key_prefix(scope.table)
    keys = [
        ComputedKey(f"{prefix}{i}", text, d.type, d.domain, d.rule, d.inputs)
        for i, (text, (d, _)) in enumerate(sorted(computed.items()))
    ]
    return _Keys(sorted(cols, key=order.index), keys)


def _policy_digest(table: TablePolicy, columns: set[str], tuples: Mapping[str, tuple] | None = None) -> str:
    payload = {
        "privacy_unit": table.privacy_unit,
        "max_groups_per_unit": table.max_groups_per_unit,
        "max_rows_per_unit": table.max_rows_per_unit,
        "columns": {n: table.columns[n].to_dict() for n in sorted(columns)},
    }
    if table.public:
        payload["public"] = True
    if tuples:  # keys from several columns of one public table: the tuples released (issue 19)
        payload["key_tuples"] = {
            names: hashlib.sha256(json.dumps(values, default=str).encode()).hexdigest()
            for names, values in tuples.items()}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def parse_query(sql: str, policy: DatasetPolicy, *, dialect: str | None = None,
                statement: exp.Select | None = None) -> QueryPlan:
    """Parse, validate and plan one aggregate query against a dataset's policy.

    Args:
        sql: the analyst's SQL text (DuckDB dialect, one SELECT statement).
        policy: the dataset's policy (tables, privacy unit, bounds, public keys).
        dialect: how to read ``sql`` (one of :data:`DIALECTS`; default ``duckdb``). The
            plan, its hash and the executed SQL do not depend on it.
        statement: ``parse_statement(sql, dialect)`` when the caller has already parsed the
            text (the gateway does, for its selection check): the text is then not parsed
            again. The tree is planned in place (the caller must not reuse it).

    Returns:
        The frozen, canonical :class:`QueryPlan` (nothing is executed).

    Raises:
        InvalidSql: the text does not parse or is not exactly one statement.
        UnsupportedQuery: a construct outside the supported subset (the message quotes
            it; ``details["construct"]`` carries it when there is one node to blame).
        UnknownTable: the table (or a qualifier) is not declared.
        UnknownColumn: a column is not declared.
    """
    token = SOURCE.set(sql if isinstance(sql, str) else None)
    try:
        stmt = parse_statement(sql, dialect) if statement is None else statement
        if sum(1 for _ in stmt.walk()) > MAX_NODES:
            raise UnsupportedQuery(f"the query is too large (more than {MAX_NODES} syntax nodes)")
        try:
            stmt = inline_ctes(stmt)
            refuse_unit_path_tables(stmt, policy)  # unit-path hook (issue 21): not joined along the path yet
            # per-unit hook (dpgate.sql.per_unit): FROM (SELECT unit, aggregates … GROUP BY unit)
            stmt, policy = rewrite_per_unit(stmt, policy)
            stmt = apply_statement_rules(stmt)
            stmt, policy = rewrite_joins(stmt, policy)  # joins hook (dpgate.sql.joins): one joined table
            return _plan(stmt, policy)
        except RecursionError:  # within the nesting limits: only from a caller already very deep
            raise UnsupportedQuery(
                "the query is nested too deeply to be planned from this caller (Python's recursion "
                f"limit); every query with at most {MAX_NESTING} levels of expressions is planned from "
                "a caller up to 300 frames deep", {"reason": "nesting", "kind": "recursion",
                                                   "depth": None, "max": MAX_NESTING}) from None
    except DpgateError as e:
        raise nothing_charged(e)
    finally:
        SOURCE.reset(token)


def nothing_charged(e: DpgateError) -> DpgateError:
    """``e`` with "(nothing was charged)" appended and ``details.charged`` False: for a refusal
    raised while planning, before any charge (the planner's and the gateway's plan checks)."""
    if "nothing was charged" not in e.message:
        e.message = f"{e.message} (nothing was charged)"
        e.args = (e.message,)
    e.details.setdefault("charged", False)
    return e


def _plan(stmt: exp.Select, policy: DatasetPolicy) -> QueryPlan:
    if sum(1 for _ in stmt.walk()) > MAX_NODES:
        raise UnsupportedQuery(f"the query is too large (more than {MAX_NODES} syntax nodes)")
    _check_structure(stmt)
    table, qualifiers = _resolve_from(stmt, policy)
    scope = _Scope(policy, table, qualifiers)

    selects = stmt.expressions
    if not selects:
        raise InvalidSql("the SELECT list is empty")
    _refuse_raw_rows(stmt, table)
    keys = _group_by(stmt, scope)
    group_by = keys.names
    outputs = _Outputs(scope, group_by, keys)
    raw_rows = table.public and not group_by and not _has_aggregate(stmt)
    for item in selects:
        label = item.alias if isinstance(item, exp.Alias) else None
        node = _unparen(item.unalias())
        if isinstance(node, exp.Star) or (
            isinstance(node, exp.Column) and isinstance(node.this, exp.Star)
        ):
            raise _unsupported("SELECT * is not supported: name group keys and aggregates", node)
        if isinstance(node, exp.Column):
            name = scope.resolve(node)
            if scope.is_unit(name):
                raise _unsupported(
                    f"selecting the privacy unit column ({name}) is never allowed", node
                )
            if name not in group_by and not raw_rows:
                raise _unsupported(
                    f"raw column {node.name!r} in SELECT: every non-aggregate item must be a "
                    "GROUP BY key (with public keys)",
                    node,
                )
            outputs.add_key(name, label or node.name)
        elif keys.match(node, scope) is not None:
            outputs.add_key(keys.match(node, scope).name, label or _label(node))
        elif _is_aggregate(node):
            outputs.add_agg(_aggregate(node, scope), label or _label(node))
        elif isinstance(node, exp.AggFunc):
            raise _unsupported(
                f"aggregate {_snippet(node)} is not supported (COUNT, SUM, AVG, VAR_POP, "
                "STDDEV_POP and their aliases are)",
                node,
            )
        elif (any(_is_aggregate(n) for n in node.walk()) or not any(
                isinstance(n, exp.Column) for n in node.walk())) and not _nondeterministic(node):
            # post-processing over released values (sql.plan.DerivedOutput), checked before the
            # charge by the gateway (dpgate.postprocess.check_postprocess_expression)
            outputs.add_expression(node, label or _label(node))
        elif isinstance(node, exp.Func) and not node.find(*_AGGREGATES):
            raise _unsupported(f"function {_snippet(node)} is not allowed in SELECT", node)
        else:
            raise _unsupported(
                f"{_snippet(node)} in SELECT: items must be group keys or aggregates (arithmetic "
                "on released values can be done after the release)",
                node,
            )
    for name in group_by:
        if not any(o.kind == "key" and o.column == name for o in outputs.items):
            outputs.add_key(name, name, hidden=True)

    where_node = stmt.args.get("where")
    where = plan_where(where_node.this if where_node is not None else None, scope)
    having_tree, having_refs = _plan_having(
        stmt.args["having"].this if stmt.args.get("having") else None, outputs
    )
    order_refs = _order_by(stmt, outputs)
    limit = _limit(stmt)
    # selection hook (issue 15): an aggregate named only in ORDER BY counts (a keys-only
    # selection query, dpgate.sql.selection_query); checked after ORDER BY is resolved.
    if not any(o.kind == "agg" for o in outputs.items) and not selection.selected_columns(table, group_by):
        # keys only: the key combinations are public (the policy's public keys, computed keys'
        # domains, a public table's values), so the plan has no primitive and its release
        # costs nothing (service.Gateway._public_keys_release); a public table alone may also
        # be read row by row (sql/public.py). Without GROUP BY there is nothing to release.
        if not group_by and not raw_rows:
            raise UnsupportedQuery("the query computes no aggregate (COUNT, SUM, AVG, …)")
    elif not any(o.kind == "agg" for o in outputs.items):
        # issue 11 hook: keys only, selected privately — a hidden count of units is the
        # selection's own noisy count (no charge of its own; sql/partition_selection.py)
        agg = _Agg("count", None) if table.record_level else _Agg("count_distinct_unit", None)
        outputs.add_agg(agg, _agg_label(agg, scope), hidden=True)

    selected_keys = selection.selected_columns(table, group_by)  # issue 11 hook
    for n in selected_keys:
        if (col := table.find_column(n)) is not None and col.type == "float":
            # the group-choosing hash reads a float key's ordinal among its public keys
            # (sql/bound.py): without them there is none, and an exact double is a poor key
            raise UnsupportedQuery(
                f"GROUP BY {n}: a float column without public keys cannot be a group key (private "
                "partition selection takes int, text, bool and date keys); declare its public_keys, "
                "or group by a condition or a CASE with literal results over it")
    public_keys = [n for n in group_by if n not in selected_keys]
    # a WHERE on a key column narrows its released keys, evaluated on the public key list
    # alone (issue 24; sql/narrow.py); several columns of one public table then release the
    # table's tuples among the narrowed keys (issue 19 item 5)
    narrowed = () if table.public else narrow_keys(
        where, table, [n for n in keys.columns if n not in selected_keys])
    narrowed_of = {k.column: k for k in narrowed}

    def key_column(n: str) -> ColumnPolicy:
        col = keys.column(n, table)
        return col if n not in narrowed_of else replace(col, public_keys=narrowed_of[n].public_keys)

    domain = [] if table.public else key_domain(table, public_keys, [key_column(n) for n in public_keys])
    n_groups = math.prod(len(values) for _, values in domain)
    if n_groups > MAX_GROUPS:
        raise UnsupportedQuery(
            f"the GROUP BY releases {n_groups:,} key combinations (the product of its keys' "
            f"domains), more than {MAX_GROUPS:,}; group by fewer or coarser keys "
            "(nothing was charged)",
            {"groups": n_groups},
        )
    # several columns of one public table (issue 19 item 5): the tuples that occur in it
    tuples = {",".join(public_keys[i] for i in block): values for block, values in domain if len(block) > 1}
    for names, values in tuples.items():
        if not values:
            raise UnsupportedQuery(
                f"no row of the public table has values of {names} among their public keys: the GROUP "
                "BY would release nothing (nothing was charged)", {"columns": names.split(",")})

    outputs.check_labels()
    outputs.assign_names()
    prefix = _primitive_prefix(table)
    primitives: dict[tuple[str, str | None, float | None], Primitive] = {}
    plan_outputs: list[Output] = []
    for out in outputs.items:
        if out.kind == "key":
            plan_outputs.append(KeyOutput(out.name, out.column, out.hidden, out.label))
            continue
        if out.kind == "expr":
            plan_outputs.append(DerivedOutput(out.name, _finish_expression(out.tree, out.refs or {}),
                                              out.hidden, out.label))
            continue
        ids = []
        for kind in FUNCTION_PRIMITIVES[out.function]:
            column = out.column if kind not in ("count", "count_distinct_unit") else None
            alpha = out.alpha if kind == "quantile" else None
            key = (kind, column, alpha)
            if key not in primitives:
                primitives[key] = Primitive(f"{prefix}{len(primitives)}", kind, column, alpha)
            ids.append(primitives[key].id)
        plan_outputs.append(
            AggregateOutput(out.name, out.function, out.column, tuple(ids), out.hidden, out.label)
        )
    having = _finish_having(having_tree, having_refs)
    order_by = tuple(OrderItem(o.name, desc, nf) for o, desc, nf in order_refs)
    # Policy settings the plan depends on: columns of the final (simplified) predicate, group
    # keys and aggregated columns.
    referenced = set(keys.columns) | {o.column for o in outputs.items if o.column in table.columns}
    for key in keys.computed:
        referenced.update(key.inputs)
    values: dict[str, DerivedValue] = {}
    for o in outputs.items:
        if o.derived is not None:
            values.setdefault(o.derived.expression, o.derived)
            referenced.update(c.name for c in sqlglot.parse_one(o.derived.expression,
                                                                 read=DIALECT).find_all(exp.Column))
    if where is not None:
        referenced.update(c.name for c in sqlglot.parse_one(where, read=DIALECT).find_all(exp.Column))

    plan = QueryPlan(
        dataset=policy.name,
        table=table.name,
        where=where,
        group_by=tuple(group_by),
        primitives=tuple(primitives.values()),
        outputs=tuple(plan_outputs),
        having=having,
        order_by=order_by,
        limit=limit,
        policy_digest=_policy_digest(table, referenced, tuples),
        values=tuple(values.values()),
        selected_keys=selected_keys,
        computed_keys=tuple(keys.computed),
        narrowed_keys=narrowed,
    )
    if plan.computed_keys and any(p.kind == "quantile" for p in plan.primitives):
        raise UnsupportedQuery(
            "quantiles grouped by a computed key are not supported yet: group by declared "
            "columns with public keys, or release COUNT/SUM/AVG per computed key",
            {"construct": plan.computed_keys[0].expression},
        )
    return _with_canonical_sql(plan, scope)


def _has_aggregate(stmt: exp.Select) -> bool:
    """True when the SELECT list, HAVING or ORDER BY calls an aggregate."""
    parts = list(stmt.expressions) + [stmt.args.get(k) for k in ("having", "order")]
    return any(_is_aggregate(n) or isinstance(n, exp.AggFunc)
               for part in parts if part is not None for n in part.walk())


def _refuse_raw_rows(stmt: exp.Select, table: TablePolicy) -> None:
    """Refuse, before any column is resolved, a query over a protected table that has
    neither GROUP BY nor an aggregate but selects a column: it asks for rows, and rows are
    never released (a misspelt column there is still a request for rows).

    Raises:
        UnsupportedQuery: naming the first selected column.
    """
    if table.public or stmt.args.get("group") is not None or _has_aggregate(stmt):
        return
    for item in stmt.expressions:
        for col in item.find_all(exp.Column):
            if isinstance(col.this, exp.Star):
                return  # SELECT t.*: its own message
            raise _unsupported(
                f"raw column {col.name!r} in SELECT: the query computes no aggregate, and rows of a "
                "protected table are never released; aggregate it (COUNT, SUM, AVG, …) or GROUP BY "
                "a key with public keys",
                col,
            )


def _order_by(stmt: exp.Select, outputs: _Outputs) -> list[tuple[_Out, bool, bool]]:
    order = stmt.args.get("order")
    if order is None:
        return []
    _only_args(order, {"expressions"})
    visible = [o for o in outputs.items if not o.hidden]
    items = []
    for ordered in order.expressions:
        _only_args(ordered, {"this", "desc", "nulls_first"})
        node = ordered.this
        if isinstance(node, exp.Literal) and not node.is_string:
            pos = _number(node)
            if not isinstance(pos, int) or not 1 <= pos <= len(visible):
                raise _unsupported(f"ORDER BY position {node.this} is not in the SELECT list", node)
            out = visible[pos - 1]
        else:
            try:
                out = outputs.reference(node, "ORDER BY")
            except UnsupportedQuery:
                # an expression over outputs (CAST(educ AS INTEGER), 2 * s / n): a hidden
                # post-processing output to sort by (free; checked before the charge)
                if (isinstance(node, exp.Column) or _is_aggregate(node) or _nondeterministic(node)
                        or not isinstance(node, (exp.Binary, exp.Unary, exp.Func, exp.Paren, exp.Case))):
                    raise
                out = outputs.add_expression(node, _label(node), hidden=True, clause="ORDER BY")
        items.append((out, bool(ordered.args.get("desc")), bool(ordered.args.get("nulls_first"))))
    return items


def _limit(stmt: exp.Select) -> int | None:
    limit = stmt.args.get("limit")
    if limit is None:
        return None
    _only_args(limit, {"expression"})
    node = limit.expression
    if not (isinstance(node, exp.Literal) and not node.is_string and _INT_RE.match(str(node.this))):
        raise _unsupported(f"LIMIT must be a non-negative integer literal, not {_snippet(node)}",
                           node)
    value = int(node.this)
    if value >= 2**63:
        raise _unsupported("LIMIT is outside the 64-bit range", node)
    return value


def _with_canonical_sql(plan: QueryPlan, scope: _Scope) -> QueryPlan:
    exprs: dict[str, str] = {}
    key_sql = {k.name: k.expression for k in plan.computed_keys}
    for out in plan.outputs:
        if isinstance(out, KeyOutput):
            exprs[out.name] = key_sql.get(out.column) or quote_identifier(out.column)
        elif isinstance(out, AggregateOutput):
            alpha = plan.primitive(out.primitives[0]).alpha if out.function in QUANTILE_FUNCTIONS else None
            exprs[out.name] = _agg_sql(out.function, out.column, scope, alpha)
    for out in plan.outputs:  # post-processing items, over the others' SQL
        if isinstance(out, DerivedOutput):
            tree = sqlglot.parse_one(out.expression, read=DIALECT).transform(
                lambda n: sqlglot.parse_one(exprs[n.name], read=DIALECT)
                if isinstance(n, exp.Column) and n.name in exprs else n)
            exprs[out.name] = tree.sql(dialect=DIALECT)
    items = []
    for out in plan.visible_outputs:
        text = exprs[out.name]
        if not (isinstance(out, KeyOutput) and out.name == out.column
                and out.column not in key_sql):
            text += f" AS {quote_identifier(out.name)}"
        items.append(text)
    source = (plan.table[len(JOIN_MARK):] if plan.table.startswith(JOIN_MARK)  # joins hook
              else quote_identifier(plan.table))
    sql = f"SELECT {', '.join(items)} FROM {source}"
    if plan.where:
        sql += f" WHERE {plan.where}"
    if plan.group_by:
        sql += " GROUP BY " + ", ".join(key_sql.get(c) or quote_identifier(c) for c in plan.group_by)
    if plan.having:
        tree = sqlglot.parse_one(plan.having, read=DIALECT)

        def expand(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Column) and node.name in exprs:
                return sqlglot.parse_one(exprs[node.name], read=DIALECT)
            return node

        sql += " HAVING " + tree.transform(expand).sql(dialect=DIALECT)
    if plan.order_by:
        parts = []
        for item in plan.order_by:
            out = plan.output(item.output)
            text = quote_identifier(out.name) if not out.hidden else exprs[out.name]
            text += " DESC" if item.descending else ""
            text += " NULLS FIRST" if item.nulls_first else ""
            parts.append(text)
        sql += " ORDER BY " + ", ".join(parts)
    if plan.limit is not None:
        sql += f" LIMIT {plan.limit}"
    return replace(plan, canonical_sql=sql)
