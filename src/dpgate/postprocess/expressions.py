"""The post-processing expression evaluator (:func:`evaluate`, :func:`evaluate_predicate`,
:func:`check_postprocess_expression`, :func:`order_by`, :func:`sort_rows`,
:func:`limit_rows`). A sqlglot expression whose column references name *cells*
(released aggregates, group keys, constants) is evaluated vectorised (NumPy)
over one value per released row, with SQL NULL semantics:

* arithmetic ``+ - * / % //`` and unary minus; ``/`` is real division unless
  sqlglot marks it *typed* (integer division of integers, as PostgreSQL and
  T-SQL read ``7 / 2``); ``//`` and ``DIV`` truncate toward zero, for floats
  too (DuckDB divides DOUBLEs exactly under ``//``; we keep the operator's
  meaning), as does typed ``/``; ``%`` takes the dividend's sign;
* ``POWER``, ``SQRT``, ``CBRT``, ``EXP``, ``LN``, ``LOG(x)`` (base 10, or the
  natural log where the dialect says so), ``LOG(b, x)``, ``LOG2``, ``LOG10``,
  ``ROUND(x[, d])`` (half away from zero), ``FLOOR``, ``CEIL``, ``TRUNC(x[, d])``,
  ``ABS``, ``SIGN``, ``PI()``, ``LEAST``/``GREATEST`` (NULLs ignored where the
  dialect ignores them: DuckDB, PostgreSQL, Spark), ``CASE``, ``IF``/``IIF``,
  ``COALESCE``/``IFNULL``/``NVL``, ``NULLIF``, ``CAST``/``TRY_CAST``/``::`` to
  integer (each type's range: TINYINT holds −128 … 127), floating (FLOAT is float32),
  DECIMAL(p, s) (rounded to s digits, below 10^(p − s)), text, boolean, date and
  timestamp types, converting numbers as DuckDB does (:mod:`dpgate.postprocess.casts`),
  comparisons (also ``IS [NOT] DISTINCT FROM``), ``AND``/``OR``/
  ``NOT`` (three-valued), ``IN``, ``BETWEEN``, ``IS [NOT] NULL``/``TRUE``/``FALSE``,
  string concatenation ``||`` and ``CONCAT`` (which skips NULLs where the dialect
  does), ``UPPER``/``LOWER``/``LENGTH`` of text keys;
* NULL in, NULL out; **the evaluator is total**: division or ``%`` by zero,
  ``SQRT`` of a negative, ``LN``/``LOG`` of a non-positive, ``EXP``/``POWER``
  overflow, a value a cast's target cannot hold, an integer beyond ±9.2·10^18
  and every non-finite float (NaN, ±inf: where DuckDB returns them or raises)
  give NULL, never an error and never NaN/inf in a release. Finite results are
  DuckDB's (``LOG10``, ``LOG2``, ``LOG(b, x)`` = log10(x)/log10(b), ``ROUND``/
  ``TRUNC`` with any integer constant as decimals: ``ROUND(x, -400)`` is 0). A
  charged release therefore cannot fail in post-processing because of the
  values it got; only a malformed expression raises, and
  :func:`check_postprocess_expression` finds those at planning time, before any
  charge, together with a plain ``CAST`` of a noisy value to a type that cannot
  hold every value of its type (``CAST(AVG(x) AS TINYINT)``: ``TRY_CAST`` is
  the way) and decimals that are not an integer constant (``ROUND(x, COUNT(*))``);
* non-deterministic functions (``RANDOM``, ``RAND``, ``NOW``, ``CURRENT_DATE``,
  ``UUID``, …, see :data:`NONDETERMINISTIC_FUNCTIONS`) are refused: a release must be a function of
  its stored noisy values alone.

This is post-processing of released values ([DR14] Prop. 2.1): it costs no
privacy budget.

[DR14] C. Dwork, A. Roth, The Algorithmic Foundations of Differential Privacy, 2014.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import numpy as np
from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.postprocess.casts import _cast_target  # noqa: F401 (imported from here by dpgate.postprocess.accuracy)
from dpgate.postprocess.evaluator import (
    _DISPATCH,
    _STRUCTURAL,
    NONDETERMINISTIC_FUNCTIONS,
    SUPPORTED_NODES,
    _as_tree,
    _cells_of,
    _Evaluator,
    _refuse,
)
from dpgate.postprocess.ordering import limit_rows, order_by, sort_rows
from dpgate.postprocess.vectors import (
    INT_LIMIT,
    VALUE_TYPES,
    ExpressionError,
    Vector,
    _convert,
    _null,
)
from dpgate.postprocess.vectors import (  # noqa: F401 (imported from here by dpgate.postprocess.accuracy)
    _round_half_away,
    _snippet,
    _trunc_digits,
)

__all__ = [
    "ExpressionError",
    "INT_LIMIT",
    "NONDETERMINISTIC_FUNCTIONS",
    "SUPPORTED_NODES",
    "VALUE_TYPES",
    "Vector",
    "check_postprocess_expression",
    "evaluate",
    "evaluate_predicate",
    "limit_rows",
    "order_by",
    "sort_rows",
]


def evaluate(expr: exp.Expression | str, cells: Mapping[str, Any], *, rows: int | None = None,
             dialect: str = "duckdb") -> Vector:
    """Evaluate a post-processing expression over released cells (vectorised, SQL NULL semantics).

    Args:
        expr: a sqlglot expression (or SQL text, parsed in ``dialect``) whose column
            references name cells; unqualified names only.
        cells: cell name → 1-D values, one per released row: a :class:`Vector`, a
            NumPy array or a sequence (see :meth:`Vector.of` for NULLs and types).
        rows: number of rows; needed only when ``cells`` is empty (default 1 then).
        dialect: sqlglot dialect used to parse ``expr`` when it is text.

    Returns:
        A :class:`Vector` of the expression's values (NULL where SQL gives NULL,
        and wherever a float result is not finite).

    Raises:
        ExpressionError: an unsupported or non-deterministic construct, an unknown
            cell, operand types that do not fit, cells of different lengths. Never
            for values (division by zero and the like give NULL).
    """
    tree = _as_tree(expr, dialect)
    vectors, n = _cells_of(cells, rows)
    return _Evaluator(vectors, n).ev(tree)


def evaluate_predicate(predicate: exp.Expression | str, values: Mapping[str, Any], *,
                       rows: int | None = None, dialect: str = "duckdb") -> np.ndarray:
    """Evaluate a HAVING predicate over released (noisy) values: the rows to keep.

    SQL three-valued logic: a row is kept only where the predicate is TRUE (NULL,
    i.e. a suppressed cell, makes a comparison unknown, and unknown rows are
    dropped). Division by zero gives NULL. This is post-processing: it reads only
    noisy values and public keys.

    Args:
        predicate: a sqlglot expression or SQL text (e.g. ``plan.having``).
        values: cell name → 1-D values (see :func:`evaluate`).
        rows, dialect: as for :func:`evaluate`.

    Returns:
        Boolean array, True for rows to keep.

    Raises:
        ExpressionError (a ``ValueError``): as for :func:`evaluate`, or a predicate
            whose value is text or a date.
    """
    tree = _as_tree(predicate, dialect)
    vectors, n = _cells_of(values, rows)
    true, _ = _Evaluator(vectors, n).truth(tree)
    return np.asarray(true, dtype=bool)


def check_postprocess_expression(expr: exp.Expression, cell_names: Collection[str] | Mapping[str, str],
                                 *, dialect: str = "duckdb", noisy: Collection[str] | None = None) -> None:
    """Planning-time check of a post-processing expression (select list, HAVING, ORDER BY).

    Walks the whole tree: every node must be one the evaluator supports, every
    column reference must name a cell, and non-deterministic functions
    (:data:`NONDETERMINISTIC_FUNCTIONS`: ``RANDOM``, ``NOW``,
    ``CURRENT_DATE``, …) are refused. When ``cell_names`` maps names to value
    types (:data:`VALUE_TYPES`), the expression is also type-checked by
    evaluating it on zero rows (no data involved), so that a charged release can
    never fail in post-processing; that pass also refuses a plain ``CAST`` of a noisy
    value to a type that cannot hold every value of the operand's type (``CAST(AVG(x)
    AS TINYINT)``: the noise can take it out of range; ``TRY_CAST`` is the way, NULL when
    out of range), and a ``CAST`` of a constant that does not convert.

    Args:
        expr: the expression, with aggregates already replaced by cell references.
        cell_names: the names it may refer to, or name → value type.
        dialect: for parsing ``expr`` when it is text.
        noisy: the cells that carry noise (aggregates and what is derived from them);
            None: every cell. A CAST over public cells only (group keys) keeps TRY
            semantics.

    Raises:
        UnsupportedQuery: naming the construct (``details["construct"]``).
    """
    try:
        tree = _as_tree(expr, dialect)
        for node in tree.walk():
            if isinstance(node, _STRUCTURAL):
                continue
            if type(node) not in _DISPATCH:
                _refuse(node)
            if isinstance(node, exp.Column):
                _Evaluator({name: _null(0) for name in cell_names}, 0).column(node)
        if isinstance(cell_names, Mapping):
            typed = {}
            for name, t in cell_names.items():
                if t not in VALUE_TYPES:
                    raise ValueError(f"unknown value type {t!r} for cell {name!r}")
                typed[name] = _convert(_null(0), t) if t != "null" else _null(0)
            _Evaluator(typed, 0, planning=True, noisy=noisy).ev(tree)
    except ExpressionError as e:
        details = {"construct": e.construct} if e.construct else {}
        raise UnsupportedQuery(str(e), details) from None
