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

This module is the text entry: dialects, :func:`parse_statement` and :func:`parse_query`, which
hands the tree to the compiler, :func:`dpgate.sql.compile.compile_statement` (rules, allow-list,
scope, binding, plan; DESIGN.md, "Compile once"). The names the planner's steps moved to their
own modules are still importable from here.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError, TokenError

from dpgate.errors import DpgateError, InvalidRequest, InvalidSql
from dpgate.policy import DatasetPolicy
from dpgate.sql.allow_list import MAX_NODES, check_structure  # noqa: F401 - re-exported (the allow-list)
from dpgate.sql.bind import SOURCE, unsupported
from dpgate.sql.compile import MAX_GROUPS, compile_statement  # noqa: F401 - re-exported
from dpgate.sql.group_keys import refuse_key_without_public_keys  # noqa: F401 - re-exported
from dpgate.sql.plan import QueryPlan
from dpgate.sql.resolve import QueryScope, refuse_unit_path_tables  # noqa: F401 - re-exported
from dpgate.sql.rules import parser_nesting_refusal

#: The planner's scope under its old name (:class:`dpgate.sql.resolve.QueryScope`).
_Scope = QueryScope
_unsupported = unsupported

DIALECT = "duckdb"  # the dialect of SQL generated from the plan

#: SQL dialects an analyst may write in (sqlglot dialect names); the plan is the same
#: whatever the dialect, and only SQL generated from the plan (DuckDB) is executed.
DIALECTS = ("duckdb", "postgres", "bigquery", "spark", "tsql", "mysql", "snowflake", "trino")

#: Other names of :data:`DIALECTS` accepted in any case (product names; sqlglot itself knows
#: only the lower-case names of :data:`DIALECTS`).
DIALECT_ALIASES = {"postgresql": "postgres", "pg": "postgres", "sqlserver": "tsql", "mssql": "tsql",
                   "sparksql": "spark", "databricks": "spark", "googlesql": "bigquery"}

#: Longest SQL text accepted (characters).
MAX_SQL_LENGTH = 100_000


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


def parse_statement(sql: str, dialect: str | None = None, *, allow_union: bool = False) -> exp.Select:
    """Parse SQL text into exactly one sqlglot SELECT.

    Args:
        sql: the analyst's SQL text.
        dialect: one of :data:`DIALECTS` (default ``duckdb``): how to read the text.
        allow_union: return a top-level ``UNION ALL`` tree as it is (issue 21 item 6: the gateway
            plans each branch, :mod:`dpgate.sql.union`); ``UNION`` (distinct) is still refused.

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
    if allow_union and isinstance(stmt, exp.Union) and not stmt.args.get("distinct"):
        return plain_divisions(stmt)
    if isinstance(stmt, exp.Union) and stmt.args.get("distinct"):
        raise _unsupported("set operations (UNION) are not supported: UNION deduplicates noisy rows; write UNION "
                           "ALL for one release of several parts", stmt)
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



def parse_query(sql: str, policy: DatasetPolicy, *, dialect: str | None = None,
                statement: exp.Select | None = None) -> QueryPlan:
    """Parse, validate and plan one aggregate query against a dataset's policy.

    The text entry of the compiler: :func:`parse_statement`, then
    :func:`dpgate.sql.compile.compile_statement` (rules, allow-list, resolve, bind, plan).

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

    Every refusal's message ends with "(nothing was charged)" (:func:`nothing_charged`).
    """
    token = SOURCE.set(sql if isinstance(sql, str) else None)
    try:
        stmt = parse_statement(sql, dialect) if statement is None else statement
        return compile_statement(stmt, policy)
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

