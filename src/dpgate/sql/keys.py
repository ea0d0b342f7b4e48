"""Computed group keys: the domain of a GROUP BY expression, derived from the policy alone.

A computed key (``GROUP BY CASE WHEN age < 30 THEN 'young' ELSE 'old' END``,
``GROUP BY FLOOR(age / 10) * 10``, ``GROUP BY age // 10``, ``GROUP BY width_bucket(age, 0,
100, 10)``, ``GROUP BY age > 90``) is released like a column with public keys: every key of
its domain is released, empty groups as noisy zeros, rows whose key is outside the domain
are dropped. Releasing the full domain is what makes the set of released keys public (it
depends on the policy and the query, never on data), so no partition selection is needed
(Wilson et al. 2020, PoPETs 2020(2), §3: keys known in advance need no thresholding).

The domain follows from the policy by one of three rules (:func:`derive_key_domain`):

* ``case_literals`` — a ``CASE``/``IF`` whose results are all literals: the literals in
  order of appearance, plus NULL when there is no ``ELSE`` (or a result is NULL). The
  conditions are row predicates, type-checked like WHERE.
* ``predicate`` — a boolean expression: ``false``, ``true`` (a NULL result, from a NULL
  input, is dropped).
* ``enumerated`` — any other allowed expression over columns whose own domain is finite in
  the policy: bounded ``int`` columns (every integer in ``[lower, upper]``) and columns with
  public keys. The expression is evaluated by DuckDB (in memory, no data, external access
  off; the evaluator the pipeline installs, :mod:`dpgate.sql.evaluation`) on every combination of input values plus NULL — at most
  :data:`MAX_ENUMERATION` — and its distinct non-NULL values, ascending, are the domain.
  Evaluating it on every admitted input also proves that it cannot fail on any row that
  passes the input filter (an error would be a failure after the charge). Rows whose input
  value lies outside its declared domain are dropped by the bounding rewrite.
* ``listed`` — a key over a column without a finite domain in the policy (text without public
  keys: ``SUBSTRING(c_phone, 1, 2)``) that the query itself restricts to literals, by a
  top-level WHERE conjunct ``<key> IN ('13', '31', …)`` or ``<key> = '13'``: the literals,
  distinct and ascending, are the domain. The keys then come from the query text, which is
  public, never from data (as an analyst-given key set: Tumult Analytics' ``KeySet``,
  Wilson et al. 2020 §3); the WHERE drops every other row anyway. Only functions that cannot
  fail on any value of their inputs' declared types are admitted (:data:`_TOTAL`), since no
  enumeration can check the expression on every admitted input.

The bounding rewrite groups each unit's rows by the computed value itself, so the
contribution bounds (k keys, m rows per key) apply to the computed key: relabelling many
input values into one key cannot multiply a unit's contribution to it.

Domains larger than :data:`MAX_DOMAIN` keys are refused with a hint. The semantics of the
expression are DuckDB's; an engine that evaluates it differently can only drop rows or
release zeros for keys it never produces — never release a key outside the domain.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Callable, Mapping

from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.policy import ColumnPolicy, quote_identifier as q
from dpgate.sql import evaluation
from dpgate.sql.literals import text_slice_problem

#: Most keys a computed key's domain may have (the groups it releases).
MAX_DOMAIN = 100_000
#: Most input combinations evaluated to enumerate a domain (planning time stays bounded).
MAX_ENUMERATION = 1_000_000
_INT_RE = re.compile(r"^-?\d+$")

#: Row-expression nodes a computed key may use (deterministic, no subqueries or aggregates).
_ALLOWED = (
    exp.Column, exp.Identifier, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Neg,
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Floor, exp.Ceil, exp.Round,
    exp.Abs, exp.Sign, exp.Least, exp.Greatest, exp.Coalesce, exp.Nullif, exp.Cast,
    exp.TryCast, exp.DataType, exp.Case, exp.If, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT,
    exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.And, exp.Or, exp.Not, exp.Is, exp.In,
    exp.Between, exp.Like, exp.ILike, exp.Lower, exp.Upper, exp.Trim, exp.Length,
    exp.Concat, exp.DPipe, exp.Substring, exp.StartsWith, exp.EndsWith, exp.Try,
    # dates: parts and truncation (the domain is enumerated from the declared ISO bounds)
    exp.Extract, exp.Var, exp.TimestampTrunc, exp.DateTrunc, exp.Year, exp.Quarter, exp.Month,
    exp.Day, exp.DayOfWeek, exp.DayOfYear, exp.DayOfMonth, exp.Hour, exp.WeekOfYear,
)
#: Parts a timestamp may be read at inside a key (coarser than an hour: enumerated hourly).
_HOURLY = {"year", "quarter", "month", "week", "day", "dow", "isodow", "doy", "hour"}
_PREDICATES = (
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.And, exp.Or, exp.Not, exp.Is, exp.In, exp.Between, exp.Like, exp.ILike,
    exp.StartsWith, exp.EndsWith,
)
_INT_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
              "UINTEGER", "UBIGINT", "UHUGEINT"}
_FLOAT_TYPES = {"FLOAT", "DOUBLE", "REAL"}


@dataclass(frozen=True)
class KeyDomain:
    """A computed key's canonical expression and domain (see the module docstring).

    Attributes:
        expression: the canonical tree (declared column names, quoted).
        type: ``int`` | ``float`` | ``text`` | ``bool``.
        domain: the released values in release order (None: the NULL group).
        rule: ``case_literals`` | ``predicate`` | ``enumerated`` | ``listed``.
        inputs: declared columns read, in the table's declaration order.
    """

    expression: exp.Expression
    type: str
    domain: tuple
    rule: str
    inputs: tuple[str, ...]


def _snippet(node: exp.Expression, limit: int = 80) -> str:
    text = " ".join(node.sql(dialect="duckdb", comments=False).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _refuse(message: str, node: exp.Expression) -> UnsupportedQuery:
    return UnsupportedQuery(message, {"construct": _snippet(node)})


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


# --- normalisation -----------------------------------------------------------------------------


def width_bucket_to_case(tree: exp.Expression) -> exp.Expression:
    """Rewrite ``width_bucket(x, lo, hi, n)`` (PostgreSQL/BigQuery semantics: bucket 0 below
    ``lo``, ``n + 1`` at or above ``hi``, else ``floor((x − lo)·n / (hi − lo)) + 1``) into the
    CASE DuckDB evaluates, for constant ``lo < hi`` and a positive integer ``n``.

    Raises:
        UnsupportedQuery: non-constant or invalid bounds or bucket count.
    """

    def number(node: exp.Expression | None) -> float | None:
        node = _unparen(node) if node is not None else None
        neg = False
        if isinstance(node, exp.Neg):
            neg, node = True, _unparen(node.this)
        if not (isinstance(node, exp.Literal) and not node.is_string):
            return None
        v = float(node.this)
        return -v if neg else v

    def fix(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.WidthBucket):
            return node
        x = node.this
        lo, hi, n = (number(node.args.get(k)) for k in ("min_value", "max_value", "num_buckets"))
        if lo is None or hi is None or n is None or not lo < hi or n < 1 or not n.is_integer():
            raise _refuse(f"{_snippet(node)}: width_bucket needs constant bounds lo < hi and a "
                          "positive integer number of buckets", node)
        lo_l, hi_l = node.args["min_value"].copy(), node.args["max_value"].copy()
        n_l = exp.Literal.number(int(n))
        inner = exp.Add(
            this=exp.Cast(this=exp.Floor(this=exp.Div(
                this=exp.Mul(this=exp.Paren(this=exp.Sub(this=x.copy(), expression=lo_l.copy())),
                             expression=n_l.copy()),
                expression=exp.Paren(this=exp.Sub(this=hi_l.copy(), expression=lo_l.copy())))),
                to=exp.DataType.build("BIGINT")),
            expression=exp.Literal.number(1))
        return exp.Case(ifs=[
            exp.If(this=exp.LT(this=x.copy(), expression=lo_l.copy()), true=exp.Literal.number(0)),
            exp.If(this=exp.GTE(this=x.copy(), expression=hi_l.copy()),
                   true=exp.Literal.number(int(n) + 1)),
        ], default=inner)

    return tree.transform(fix, copy=True)


# --- the three rules ---------------------------------------------------------------------------


def _literal_value(node: exp.Expression) -> tuple[object, str] | None:
    """(value, type) of a literal result, or None if ``node`` is not a literal."""
    node = _unparen(node)
    if isinstance(node, exp.Null):
        return None, "null"
    if isinstance(node, exp.Boolean):
        return bool(node.this), "bool"
    neg = False
    if isinstance(node, exp.Neg):
        neg, node = True, _unparen(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return (None, "") if neg else (str(node.this), "text")
        text = str(node.this)
        value: int | float = int(text) if _INT_RE.match(text) else float(text)
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return (-value if neg else value), ("int" if isinstance(value, int) else "float")
    return None


def _case_literals(node: exp.Expression, check_predicate: Callable[[exp.Expression], None]
                   ) -> tuple[tuple, str] | None:
    """Domain and type of a CASE/IF with literal results, or None if a result is not literal."""
    if isinstance(node, exp.If):
        branches = [(node.this, node.args.get("true"))]
        default = node.args.get("false")
        subject = None
    elif isinstance(node, exp.Case):
        branches = [(i.this, i.args.get("true")) for i in node.args.get("ifs") or []]
        default = node.args.get("default")
        subject = node.this
    else:
        return None
    results = [r for _, r in branches] + ([default] if default is not None else [])
    values = [_literal_value(r) if r is not None else (None, "null") for r in results]
    if any(v is None or v[1] == "" for v in values):
        return None
    for cond, _ in branches:
        check_predicate(exp.EQ(this=subject.copy(), expression=cond.copy())
                        if subject is not None else cond)
    types = {t for _, t in values if t != "null"}
    if not types:
        raise _refuse(f"{_snippet(node)}: every result is NULL, so the key has no values", node)
    if types <= {"int", "float"}:
        ktype = "float" if "float" in types else "int"
    elif len(types) == 1:
        ktype = types.pop()
    else:
        raise _refuse(f"{_snippet(node)}: the results mix types ({', '.join(sorted(types))}); "
                      "a group key needs results of one type", node)
    domain: list = []
    seen: set = set()
    has_null = default is None
    for value, t in values:
        if t == "null":
            has_null = True
            continue
        if ktype == "float":
            value = float(value)
        key = (type(value) is bool, value)
        if key not in seen:
            seen.add(key)
            domain.append(value)
    if has_null:
        domain.append(None)
    return tuple(domain), ktype


def _input_domain(col: ColumnPolicy) -> tuple[str, int] | None:
    """(DuckDB relation of the column's admitted values, count), or None if not finite."""
    name = q(col.name)
    if col.public_keys is not None:
        keys = col.public_keys
        if isinstance(keys, range):
            return (f"SELECT CAST(range AS BIGINT) AS {name} FROM range({keys.start}, {keys.stop})",
                    len(keys))
        lits = ", ".join(_sql_literal(k, col.type) for k in keys)
        return f"SELECT CAST(unnest([{lits}]) AS {col.duckdb_type}) AS {name}", len(keys)
    if col.type == "int" and col.bounded:
        lo, hi = int(col.lower), int(col.upper)
        return f"SELECT CAST(range AS BIGINT) AS {name} FROM range({lo}, {hi + 1})", hi - lo + 1
    if col.type == "bool":
        return f"SELECT unnest([FALSE, TRUE]) AS {name}", 2
    if col.type == "date" and col.time_bounded:
        lo, hi = col.time_lower, col.time_upper
        return (f"SELECT CAST(range AS DATE) AS {name} FROM range(DATE '{lo.isoformat()}', "
                f"DATE '{hi.isoformat()}' + INTERVAL 1 DAY, INTERVAL 1 DAY)",
                (hi - lo).days + 1)
    if col.type == "timestamp" and col.time_bounded:
        # Hourly: the caller admits a timestamp only inside an hour-or-coarser date part or
        # date_trunc, whose value is the same for every instant of an hour.
        lo = col.time_lower.replace(minute=0, second=0, microsecond=0)
        hi = col.time_upper
        hours = int((hi - lo).total_seconds() // 3600) + 1
        return (f"SELECT range AS {name} FROM range(TIMESTAMP '{lo.isoformat(sep=' ')}', "
                f"TIMESTAMP '{hi.isoformat(sep=' ')}' + INTERVAL 1 MICROSECOND, INTERVAL 1 HOUR)",
                hours)
    return None


def _date_parts_canonical(tree: exp.Expression) -> exp.Expression:
    """``date_part('x', d)`` → ``EXTRACT(x FROM d)`` (one spelling; sqlglot names the rest)."""

    def fix(node: exp.Expression) -> exp.Expression:
        if (isinstance(node, exp.Anonymous) and node.name.lower() in ("date_part", "datepart")
                and len(node.expressions) == 2
                and isinstance(node.expressions[0], (exp.Literal, exp.Var))):
            return exp.Extract(this=exp.var(node.expressions[0].name.upper()),
                               expression=node.expressions[1])
        return node

    return tree.transform(fix, copy=True)


def canonical_date_key(tree: exp.Expression) -> exp.Expression:
    """Dates in a key, one spelling: ``date_part('x', d)`` → ``EXTRACT(x FROM d)``, and a
    ``date_trunc(unit, d)`` key released as ISO text: ``CAST(CAST(… AS DATE) AS VARCHAR)``
    ('YYYY-MM-DD') for a day or coarser, ``CAST(… AS VARCHAR)`` for an hour. Idempotent."""
    tree = _date_parts_canonical(tree)
    top = _unparen(tree)
    if isinstance(top, (exp.TimestampTrunc, exp.DateTrunc)):
        unit = top.args.get("unit")
        name = unit.name.lower() if unit is not None else ""
        inner = (exp.Cast(this=top, to=exp.DataType(this=exp.DataType.Type.DATE, nested=False))
                 if name in ("year", "quarter", "month", "week", "day") else top)
        return exp.Cast(this=inner, to=exp.DataType(this=exp.DataType.Type.VARCHAR, nested=False))
    return tree


def _check_hourly(tree: exp.Expression, columns: Mapping[str, ColumnPolicy],
                  shown: exp.Expression) -> None:
    """A timestamp column may only be read through an hour-or-coarser part or date_trunc."""
    from dpgate.sql.bind import _PART_FUNCS

    for col in tree.find_all(exp.Column):
        c = columns.get(col.name)
        if c is None or c.type != "timestamp":
            continue
        parent = col.parent
        while isinstance(parent, exp.Paren):
            parent = parent.parent
        unit = None
        if isinstance(parent, exp.Extract):
            unit = parent.this.name.lower()
        elif isinstance(parent, (exp.TimestampTrunc, exp.DateTrunc)):
            u = parent.args.get("unit")
            unit = u.name.lower() if u is not None else None
        elif type(parent) in _PART_FUNCS:
            unit = _PART_FUNCS[type(parent)]
        if unit not in _HOURLY:
            raise _refuse(
                f"GROUP BY {_snippet(shown)}: a timestamp column may appear in a group key only "
                "inside date_trunc('year'|'quarter'|'month'|'week'|'day'|'hour', …) or "
                "EXTRACT(year|quarter|month|week|day|dow|doy|hour FROM …)", shown)


def _sql_literal(value: object, ctype: str) -> str:
    if value is None:
        return "NULL"
    if ctype == "text":
        return "'" + str(value).replace("'", "''") + "'"
    if ctype == "bool":
        return "TRUE" if value else "FALSE"
    if ctype == "int":
        return str(int(value))
    return repr(float(value))


def _enumerate(expression_sql: str, relations: tuple[str, ...]) -> tuple[tuple, str]:
    """Distinct non-NULL values (ascending) and DuckDB type name of ``expression_sql`` over the
    cross product of ``relations`` (each plus a NULL row), by the installed evaluator
    (:mod:`dpgate.sql.evaluation`)."""
    evaluator = evaluation.installed()
    if evaluator is None:
        evaluation.evaluate_tableless("")  # raises NoEvaluator
    return _enumerate_with(expression_sql, relations, evaluator)


@functools.lru_cache(maxsize=512)
def _enumerate_with(expression_sql: str, relations: tuple[str, ...], evaluate_tableless
                    ) -> tuple[tuple, str]:
    """:func:`_enumerate` by ``evaluate_tableless``. Cached: pure in its arguments."""
    parts = [f"(({r}) UNION ALL SELECT NULL) AS __dpg_i{i}" for i, r in enumerate(relations)]
    source = " CROSS JOIN ".join(parts) if parts else "(SELECT 1) AS __dpg_i"
    sql = (f"SELECT DISTINCT {expression_sql} AS v FROM {source} "
           f"ORDER BY v NULLS LAST LIMIT {MAX_DOMAIN + 2}")
    rows, type_name = evaluate_tableless(sql)
    return tuple(r[0] for r in rows if r[0] is not None), type_name


def _enumerated(tree: exp.Expression, columns: Mapping[str, ColumnPolicy], inputs: list[str],
                shown: exp.Expression) -> tuple[tuple, str]:
    relations = []
    total = 1
    for name in inputs:
        col = columns[name]
        dom = _input_domain(col)
        if dom is None:
            raise _refuse(
                f"GROUP BY {_snippet(shown)}: its keys do not follow from the policy, because "
                f"column {name!r} has neither public keys nor integer bounds (a computed key "
                "may be a CASE with literal results, a condition, an expression over "
                "bounded int columns and columns with public keys, or a text key the WHERE "
                "restricts to literals: WHERE <key> IN ('a', 'b'))",
                shown,
            )
        relations.append(dom[0])
        total *= dom[1] + 1
    if total > MAX_ENUMERATION:
        raise _refuse(
            f"GROUP BY {_snippet(shown)}: its inputs admit {total:,} value combinations, more "
            f"than {MAX_ENUMERATION:,} to enumerate; narrow the columns' bounds in the policy or "
            "group by a CASE with literal results",
            shown,
        )
    try:
        values, type_name = _enumerate(tree.sql(dialect="duckdb"), tuple(relations))
    except ValueError as e:
        raise _refuse(
            f"GROUP BY {_snippet(shown)} fails for some value the policy admits, so it could "
            f"fail on data after the charge ({e})",
            shown,
        ) from None
    base = type_name.split("(")[0].upper()
    if base in _INT_TYPES:
        ktype = "int"
        values = tuple(int(v) for v in values)
    elif base in _FLOAT_TYPES or base == "DECIMAL":
        ktype = "float"
        values = tuple(float(v) if isinstance(v, Decimal) else float(v) for v in values)
        if any(not math.isfinite(v) for v in values):
            raise _refuse(f"GROUP BY {_snippet(shown)} takes non-finite values", shown)
    elif base == "VARCHAR":
        ktype = "text"
    elif base == "BOOLEAN":
        ktype = "bool"
    else:
        raise _refuse(f"GROUP BY {_snippet(shown)}: keys of type {type_name} are not supported "
                      "(int, float, text or boolean)", shown)
    return values, ktype


#: Nodes of a ``listed`` key: total on every value of the inputs' declared types (text functions
#: with literal arguments; no arithmetic, which could overflow, and no casts, which could fail).
_TOTAL = (exp.Column, exp.Identifier, exp.Literal, exp.Paren, exp.Substring, exp.Left,
          exp.Lower, exp.Upper, exp.Trim, exp.Concat, exp.DPipe)


def _listed(tree: exp.Expression, columns: Mapping[str, ColumnPolicy], inputs: list[str],
            listed: tuple[exp.Expression, ...], shown: exp.Expression) -> tuple[tuple, str]:
    """The ``listed`` rule's (domain, type): the query's literals for a key without a finite
    input domain (module docstring).

    Raises:
        UnsupportedQuery: a node outside :data:`_TOTAL`, a non-literal argument, a key that is not
            text, or a literal of another type than the key.
    """
    for node in tree.walk():
        problem = text_slice_problem(node) if isinstance(node, (exp.Substring, exp.Left)) else None
        if problem:
            raise _refuse(f"GROUP BY {_snippet(shown)}: {_snippet(node, 40)}: {problem}", shown)
        if not isinstance(node, _TOTAL):
            raise _refuse(
                f"GROUP BY {_snippet(shown)}: a key over {', '.join(map(repr, inputs))} (no public keys) takes "
                f"its keys from the WHERE's IN list only when it uses text functions (SUBSTRING, LEFT, "
                f"LOWER, UPPER, TRIM, ||) with literal arguments; {_snippet(node, 40)} is not one", shown)
    relations = tuple(f"SELECT CAST(NULL AS {columns[n].duckdb_type}) AS {q(n)}" for n in inputs)
    evaluator = evaluation.installed()
    if evaluator is None:
        evaluation.evaluate_tableless("")  # raises NoEvaluator
    _, type_name = _enumerate_with(tree.sql(dialect="duckdb"), relations, evaluator)
    if type_name.split("(")[0].upper() != "VARCHAR":
        raise _refuse(f"GROUP BY {_snippet(shown)}: keys listed in the WHERE are supported for text keys only "
                      f"(this key is {type_name})", shown)
    values = set()
    for lit in listed:
        if isinstance(lit, exp.Null):
            continue  # IN (NULL) matches no row
        if not (isinstance(lit, exp.Literal) and lit.is_string):
            raise _refuse(f"GROUP BY {_snippet(shown)}: the WHERE lists {_snippet(lit, 40)} for this text key; "
                          "list quoted text literals", shown)
        values.add(lit.this)
    return tuple(sorted(values)), "text"


def _is_float(node: exp.Expression, columns: Mapping[str, ColumnPolicy]) -> bool:
    """True when ``node`` is certainly a float: a decimal literal, a cast to a float type or a
    declared float column (so that a dialect's integer division cannot apply to it)."""
    if isinstance(node, exp.Literal) and not node.is_string:
        return any(ch in node.this for ch in ".eE")
    if isinstance(node, exp.Cast):
        return node.to.this in (exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT, exp.DataType.Type.DECIMAL)
    if isinstance(node, exp.Column):
        col = columns.get(node.name)
        return col is not None and col.type == "float"
    return False


def derive_key_domain(tree: exp.Expression, columns: Mapping[str, ColumnPolicy], *,
                      check_predicate: Callable[[exp.Expression], None],
                      shown: exp.Expression | None = None,
                      listed: tuple[exp.Expression, ...] | None = None) -> KeyDomain:
    """The domain of a computed GROUP BY key (module docstring).

    Args:
        tree: the key expression over declared columns (canonical: declared names, no
            qualifiers; the privacy unit already refused by the caller).
        columns: the table's declared columns by name, in declaration order.
        check_predicate: type-checks a row predicate (as WHERE), raising UnsupportedQuery.
        shown: the analyst's expression, quoted in refusals (default ``tree``).
        listed: the literals a top-level WHERE conjunct restricts the key to (``key IN (…)``,
            ``key = …``), or None; used (rule ``listed``) only when an input has no finite domain.

    Raises:
        UnsupportedQuery: a construct a key may not use, a domain that does not follow from
            the policy, more than :data:`MAX_DOMAIN` keys, or an expression that fails on
            an admitted value; the message quotes the expression and says what would work.
    """
    shown = shown if shown is not None else tree
    tree = canonical_date_key(width_bucket_to_case(tree))
    for node in tree.walk():
        if isinstance(node, exp.AggFunc):
            raise _refuse(f"GROUP BY {_snippet(shown)}: a group key cannot contain an aggregate",
                          shown)
        if not isinstance(node, _ALLOWED):
            raise _refuse(
                f"GROUP BY {_snippet(shown)}: {_snippet(node, 40)} is not allowed in a group key "
                "(CASE, comparisons, + - * / // %, FLOOR, CEIL, ROUND, ABS, LEAST, GREATEST, "
                "COALESCE, CAST, width_bucket and text functions are)",
                shown,
            )
        if isinstance(node, exp.Div) and node.args.get("typed") and not any(
                _is_float(_unparen(side), columns) for side in (node.this, node.expression)):
            # read from a dialect where int / int is an integer (PostgreSQL, T-SQL, Trino): DuckDB,
            # which runs the key, would divide as floats and release other keys
            raise _refuse(
                f"GROUP BY {_snippet(shown)}: in this dialect {_snippet(node, 40)} may divide two "
                "integers as integers (truncated), which dpgate does not compute; write "
                "FLOOR(CAST(x AS DOUBLE) / 10) for integer bins", shown)
    order = list(columns)
    inputs = sorted({c.name for c in tree.find_all(exp.Column)}, key=order.index)
    top = _unparen(tree)
    case = _case_literals(top, check_predicate)
    if case is not None:
        domain, ktype = case
        rule = "case_literals"
    elif isinstance(top, _PREDICATES):
        check_predicate(top)
        domain, ktype, rule = (False, True), "bool", "predicate"
    elif listed is not None and any(_input_domain(columns[c]) is None for c in inputs):
        domain, ktype = _listed(tree, columns, inputs, listed, shown)
        rule = "listed"
    else:
        _check_hourly(tree, columns, shown)
        domain, ktype = _enumerated(tree, columns, inputs, shown)
        rule = "enumerated"
    if not domain:
        raise _refuse(f"GROUP BY {_snippet(shown)} takes no non-NULL value on the policy's "
                      "domain", shown)
    if len(domain) > MAX_DOMAIN:
        raise _refuse(
            f"GROUP BY {_snippet(shown)} has more than {MAX_DOMAIN:,} keys; use coarser bins "
            "(e.g. FLOOR(x / 1000)) or a CASE with a few literal results",
            shown,
        )
    return KeyDomain(tree, ktype, tuple(domain), rule, tuple(inputs))
