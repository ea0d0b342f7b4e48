"""The expression evaluator over released cells: one method per supported sqlglot node
(:data:`SUPPORTED_NODES`), three-valued logic, and the refusal of non-deterministic functions
(:data:`NONDETERMINISTIC_FUNCTIONS`).

The semantics are documented in :mod:`dpgate.postprocess.expressions`, whose :func:`evaluate`,
:func:`evaluate_predicate` and :func:`check_postprocess_expression` drive it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Collection, Mapping

import numpy as np
import sqlglot
from sqlglot import exp

from dpgate.sql.nondeterministic import NONDETERMINISTIC_FUNCTIONS
from dpgate.postprocess.casts import _cast, _cast_spec, _comparable, refuse_unsafe_cast
from dpgate.postprocess.vectors import (
    _I64_MIN,
    INT_LIMIT,
    ExpressionError,
    Vector,
    _common_type,
    _const,
    _convert,
    _float_result,
    _int_checked,
    _int_round_digits,
    _null,
    _round_half_away,
    _snippet,
    _trunc_digits,
)

# --- the evaluator ---------------------------------------------------------------------------------

#: (:data:`NONDETERMINISTIC_FUNCTIONS`, functions refused in post-processing because their value is
#: not a function of the release, is defined below the planner, which refuses them too:
#: :mod:`dpgate.sql.nondeterministic`.)
_NONDET_NODES: tuple[type, ...] = tuple(
    getattr(exp, name)
    for name in ("Rand", "Randn", "Uuid", "CurrentDate", "CurrentTime", "CurrentTimestamp",
                 "CurrentDatetime", "Localtime", "Localtimestamp", "CurrentTimestampLTZ",
                 "UnixSeconds", "Random")
    if hasattr(exp, name)
)
_NONDET_COLUMNS = frozenset({"SYSDATE", "CURRENT_DATE", "CURRENT_TIME", "CURRENT_TIMESTAMP",
                             "LOCALTIME", "LOCALTIMESTAMP", "SYSTIMESTAMP"})

_CMP_OPS: dict[type, Callable[[Any, Any], Any]] = {
    exp.EQ: np.equal,
    exp.NEQ: np.not_equal,
    exp.GT: np.greater,
    exp.GTE: np.greater_equal,
    exp.LT: np.less,
    exp.LTE: np.less_equal,
}


class _Evaluator:
    """Evaluates one expression tree over ``cells`` (name → Vector), all of length ``n``."""

    def __init__(self, cells: Mapping[str, Vector], n: int, *, planning: bool = False,
                 noisy: Collection[str] | None = None) -> None:
        self.cells = cells
        self.n = n
        #: planning-time check (zero rows): also refuse a CAST that could fail on a noisy value
        self.planning = planning
        #: the cells that carry noise (None: every cell)
        self.noisy = noisy

    # -- dispatch
    def ev(self, node: exp.Expression) -> Vector:
        """Evaluate ``node`` (dispatch on its sqlglot type; unsupported nodes raise ExpressionError)."""
        method = _DISPATCH.get(type(node))
        if method is None:
            _refuse(node)
        return method(self, node)

    def num(self, node: exp.Expression) -> Vector:
        """Evaluate a numeric operand (bool counts as 0/1 only through CAST; NULL literal ok)."""
        v = self.ev(node)
        if v.type in ("int", "float"):
            return v
        if v.type == "null":
            return _convert(v, "int")
        if v.type == "text" and isinstance(node, exp.Literal):
            return _cast(v, "float", None)
        raise ExpressionError(f"{_snippet(node)} is {v.type}, not a number", node)

    def truth(self, node: exp.Expression) -> tuple[np.ndarray, np.ndarray]:
        """(true, known) of a condition: bool, or a number (≠ 0 is true)."""
        v = self.ev(node)
        if v.type == "bool":
            return v.values.astype(bool) & v.valid, v.valid
        if v.type in ("int", "float"):
            return (v.values != 0) & v.valid, v.valid
        if v.type == "null":
            return np.zeros(self.n, dtype=bool), np.zeros(self.n, dtype=bool)
        raise ExpressionError(f"{_snippet(node)} is {v.type}, not a condition", node)

    # -- leaves
    def column(self, node: exp.Column) -> Vector:
        """A cell by name (unqualified)."""
        if node.args.get("table") is not None or not isinstance(node.this, exp.Identifier):
            raise ExpressionError(f"{_snippet(node)}: post-processing refers to released cells by name only",
                                  node)
        name = node.name
        if name not in self.cells:
            if name.upper() in _NONDET_COLUMNS:
                raise ExpressionError(f"non-deterministic {name.upper()} is not allowed", node)
            raise ExpressionError(f"{name!r} is not a released cell (an aggregate, a group key or an output)",
                                  node)
        return self.cells[name]

    def literal(self, node: exp.Literal) -> Vector:
        """A number (int if it fits int64, else float) or a string."""
        text = node.this
        if node.is_string:
            return _const(text, "text", self.n)
        try:
            i = int(text)
        except ValueError:
            return _const(float(text), "float", self.n)
        if abs(i) <= INT_LIMIT:
            return _const(i, "int", self.n)
        return _const(float(i), "float", self.n)

    def boolean(self, node: exp.Boolean) -> Vector:
        """TRUE / FALSE."""
        return _const(bool(node.this), "bool", self.n)

    def null(self, node: exp.Null) -> Vector:
        """NULL (type ``null``)."""
        return _null(self.n)

    def paren(self, node: exp.Paren) -> Vector:
        """( … )."""
        return self.ev(node.this)

    def pi(self, node: exp.Expression) -> Vector:
        """PI()."""
        return _const(math.pi, "float", self.n)

    # -- arithmetic
    def neg(self, node: exp.Neg) -> Vector:
        """Unary minus (int64 overflow → NULL)."""
        v = self.num(node.this)
        if v.type == "int":
            return _int_checked(-v.values, v.valid & (v.values != _I64_MIN), -v.values.astype(np.float64))
        return _float_result(-v.values, v.valid)

    def arith(self, node: exp.Expression) -> Vector:
        """+ - * / // %: ints stay ints (overflow → NULL); division by zero → NULL."""
        a, b = self.num(node.this), self.num(node.expression)
        valid = a.valid & b.valid
        op = type(node)
        ints = a.type == "int" and b.type == "int"
        if ints and (op in (exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.IntDiv)
                     or (op is exp.Div and node.args.get("typed"))):
            av = np.where(valid, a.values, 0)
            bv = np.where(valid, b.values, 1)
            af, bf = av.astype(np.float64), bv.astype(np.float64)
            with np.errstate(all="ignore"):
                if op is exp.Add:
                    return _int_checked(av + bv, valid, af + bf)
                if op is exp.Sub:
                    return _int_checked(av - bv, valid, af - bf)
                if op is exp.Mul:
                    return _int_checked(av * bv, valid, af * bf)
                zero = bv == 0
                safe = np.where(zero, 1, bv)
                ok = valid & ~zero & ~((av == _I64_MIN) & (safe == -1))
                if op is exp.Mod:
                    return _int_checked(np.fmod(av, safe), ok, np.zeros(self.n))
                q = np.floor_divide(av, safe)
                q = np.where((q * safe != av) & ((av < 0) != (safe < 0)), q + 1, q)  # toward zero
                return _int_checked(q, ok, np.zeros(self.n))
        af = np.where(valid, a.values, 0).astype(np.float64)
        bf = np.where(valid, b.values, 1).astype(np.float64)
        with np.errstate(all="ignore"):
            if op is exp.Add:
                r = af + bf
            elif op is exp.Sub:
                r = af - bf
            elif op is exp.Mul:
                r = af * bf
            else:
                valid = valid & (bf != 0)
                if op is exp.Div:
                    r = af / bf
                elif op is exp.IntDiv:
                    r = np.trunc(af / bf)
                else:  # Mod
                    r = np.fmod(af, bf)
        return _float_result(r, valid)

    def power(self, node: exp.Pow) -> Vector:
        """POWER(x, y) as a float; NaN/inf → NULL."""
        a, b = self.num(node.this), self.num(node.expression)
        with np.errstate(all="ignore"):
            r = np.power(a.values.astype(np.float64), b.values.astype(np.float64))
        return _float_result(r, a.valid & b.valid)

    def unary_math(self, node: exp.Expression) -> Vector:
        """SQRT (negative → NULL), CBRT, EXP (overflow → NULL), LN (≤ 0 → NULL)."""
        v = self.num(node.this)
        x = v.values.astype(np.float64)
        valid = v.valid
        with np.errstate(all="ignore"):
            if isinstance(node, exp.Sqrt):
                valid = valid & (x >= 0)
                r = np.sqrt(np.where(x >= 0, x, 0.0))  # NaN in DuckDB: NULL here
            elif isinstance(node, exp.Cbrt):
                r = np.cbrt(x)
            elif isinstance(node, exp.Exp):
                r = np.exp(x)
            else:  # Ln
                valid = valid & (x > 0)
                r = np.log(np.where(x > 0, x, 1.0))
        return _float_result(r, valid)

    def log(self, node: exp.Log) -> Vector:
        """LOG(x) base 10, LOG2, LOG10, LOG(b, x) as DuckDB computes them (``log10``, ``log2``,
        ``log10(x) / log10(b)``); a result that is not finite (x ≤ 0, b ≤ 0 or 1) → NULL."""
        if node.expression is None:  # LOG(x): base 10 (dialects where LOG means LN parse to Ln)
            x, base = self.num(node.this), None
        else:
            base, x = self.num(node.this), self.num(node.expression)
        xf = x.values.astype(np.float64)
        with np.errstate(all="ignore"):
            if base is None or _literal_number(node.this) == 10:
                return _float_result(np.log10(xf), x.valid)
            if _literal_number(node.this) == 2:
                return _float_result(np.log2(xf), x.valid)
            r = np.log10(xf) / np.log10(base.values.astype(np.float64))
        return _float_result(r, x.valid & base.valid)

    def _digits(self, node: exp.Expression | None) -> int | None:
        """The number of decimals of ROUND/TRUNC: an integer constant (any size: ``-400`` is
        fine), None for NULL; a cell, a non-integer or text is refused (planning time)."""
        if node is None:
            return 0
        if any(isinstance(n, exp.Column) for n in node.walk()):
            raise ExpressionError(f"the number of decimals {_snippet(node)} must be an integer constant, "
                                  "not a released value", node)
        d = _Evaluator({}, 1).ev(node)  # a constant: its one value, whatever the row count
        if d.type == "null" or (d.type == "int" and not d.valid[0]):
            return None
        if d.type != "int" or not isinstance(node, (exp.Literal, exp.Neg, exp.Paren)):
            raise ExpressionError(f"the number of decimals {_snippet(node)} must be an integer constant", node)
        return int(d.values[0])

    def round_(self, node: exp.Round) -> Vector:
        """ROUND(x[, d]) half away from zero, as DuckDB (ROUND(x, -400) = 0); ints stay ints
        (d < 0 rounds to a multiple of 10^−d; beyond int64 → NULL); ROUND(x, NULL) is NULL."""
        v = self.num(node.this)
        d = self._digits(node.args.get("decimals"))
        if d is None:
            return Vector(v.values, np.zeros(self.n, dtype=bool), v.type)
        if v.type == "int":
            return _int_round_digits(v, d, truncate=False)
        return _float_result(_round_half_away(v.values, d), v.valid)

    def trunc(self, node: exp.Expression) -> Vector:
        """TRUNC(x[, d]) toward zero, as DuckDB (ints: d < 0 truncates to a multiple of 10^−d)."""
        v = self.num(node.this)
        d = self._digits(node.args.get("decimals"))
        if d is None:
            return Vector(v.values, np.zeros(self.n, dtype=bool), v.type)
        if v.type == "int":
            return _int_round_digits(v, d, truncate=True)
        return _float_result(_trunc_digits(v.values, d), v.valid)

    def floor_ceil(self, node: exp.Expression) -> Vector:
        """FLOOR(x), CEIL(x); ints unchanged."""
        v = self.num(node.this)
        if node.args.get("decimals") is not None or node.args.get("to") is not None:
            raise ExpressionError(f"{_snippet(node)}: FLOOR/CEIL take one argument", node)
        if v.type == "int":
            return v
        fn = np.floor if isinstance(node, exp.Floor) else np.ceil
        return _float_result(fn(v.values), v.valid)

    def abs_(self, node: exp.Abs) -> Vector:
        """ABS(x)."""
        v = self.num(node.this)
        if v.type == "int":
            return _int_checked(np.abs(v.values), v.valid & (v.values != _I64_MIN), np.zeros(self.n))
        return _float_result(np.abs(v.values), v.valid)

    def sign(self, node: exp.Sign) -> Vector:
        """SIGN(x) as −1, 0, 1."""
        v = self.num(node.this)
        return Vector(np.sign(v.values).astype(np.int64), v.valid, "int")

    # -- choice
    def _unify(self, vectors: list[Vector], node: exp.Expression) -> tuple[list[Vector], str]:
        t = _common_type((v.type for v in vectors), node)
        return [_convert(v, t) for v in vectors], t

    def greatest_least(self, node: exp.Expression) -> Vector:
        """GREATEST/LEAST; NULLs ignored unless the dialect's node says otherwise."""
        args = [self.ev(node.this)] + [self.ev(e) for e in node.expressions]
        args, t = self._unify(args, node)
        ignore_nulls = node.args.get("ignore_nulls")
        ignore_nulls = True if ignore_nulls is None else bool(ignore_nulls)
        greatest = isinstance(node, exp.Greatest)
        if t == "null":
            return _null(self.n)
        valid = np.zeros(self.n, dtype=bool) if ignore_nulls else np.ones(self.n, dtype=bool)
        for a in args:
            valid = (valid | a.valid) if ignore_nulls else (valid & a.valid)
        if t in ("int", "float", "bool"):
            if t == "int":
                fill = np.iinfo(np.int64).min if greatest else np.iinfo(np.int64).max
            elif t == "float":
                fill = -np.inf if greatest else np.inf
            else:
                fill = not greatest
            stack = np.stack([np.where(a.valid, a.values, fill) for a in args])
            r = stack.max(axis=0) if greatest else stack.min(axis=0)
            return Vector(np.where(valid, r, args[0].values), valid, t)
        out = np.empty(self.n, dtype=object)
        for i in range(self.n):
            present = [a.values[i] for a in args if a.valid[i]]
            out[i] = (max(present) if greatest else min(present)) if (present and valid[i]) else None
        return Vector(out, valid, t)

    def _choose(self, conditions: list[tuple[np.ndarray, Vector]], default: Vector,
                node: exp.Expression) -> Vector:
        values = [v for _, v in conditions] + [default]
        values, t = self._unify(values, node)
        out_vals = values[-1].values.copy()
        out_valid = values[-1].valid.copy()
        taken = np.zeros(self.n, dtype=bool)
        for (cond, _), v in zip(conditions, values):
            pick = cond & ~taken
            out_vals = np.where(pick, v.values, out_vals)
            out_valid = np.where(pick, v.valid, out_valid)
            taken |= pick
        if t in ("text", "date", "timestamp"):
            out_vals = np.asarray(out_vals, dtype=object)
        return Vector(out_vals, out_valid.astype(bool), t)

    def case(self, node: exp.Case) -> Vector:
        """CASE [operand] WHEN … THEN … [ELSE …] END (the first TRUE branch; NULL conditions are not TRUE)."""
        operand = node.args.get("this")
        conditions = []
        for branch in node.args.get("ifs") or []:
            if operand is not None:
                true, _ = self._compare(exp.EQ, operand, branch.this, node)
            else:
                true, _ = self.truth(branch.this)
            conditions.append((true, self.ev(branch.args["true"])))
        default = node.args.get("default")
        return self._choose(conditions, self.ev(default) if default is not None else _null(self.n), node)

    def if_(self, node: exp.If) -> Vector:
        """IF/IIF(condition, then, else)."""
        true, _ = self.truth(node.this)
        other = node.args.get("false")
        return self._choose([(true, self.ev(node.args["true"]))],
                            self.ev(other) if other is not None else _null(self.n), node)

    def coalesce(self, node: exp.Coalesce) -> Vector:
        """COALESCE/IFNULL/NVL: the first non-NULL argument."""
        args = [self.ev(node.this)] + [self.ev(e) for e in node.expressions]
        args, t = self._unify(args, node)
        conditions = [(a.valid, a) for a in args]
        return self._choose(conditions, _convert(_null(self.n), t), node)

    def nullif(self, node: exp.Nullif) -> Vector:
        """NULLIF(a, b): NULL where a = b."""
        v = self.ev(node.this)
        equal, _ = self._compare(exp.EQ, node.this, node.expression, node)
        return Vector(v.values, v.valid & ~equal, v.type)

    # -- casts
    def cast(self, node: exp.Cast) -> Vector:
        """CAST/TRY_CAST/:: to the target's SQL type, as DuckDB converts (``casts`` module); a
        value the target cannot hold is NULL. At planning time a plain CAST that could fail on a
        noisy value, or fails on a constant, is refused (:func:`refuse_unsafe_cast`)."""
        spec = _cast_spec(node.args["to"], node)
        v = self.ev(node.this)
        if self.planning:
            refuse_unsafe_cast(node, spec, v, self.noisy, lambda e: _Evaluator({}, 1).ev(e))
        return _cast(v, spec)

    # -- comparisons and logic
    def _compare(self, op: type, left: exp.Expression, right: exp.Expression,
                 node: exp.Expression) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.ev(left), self.ev(right)
        a, b = _comparable(a, b, left, right, node)
        known = a.valid & b.valid
        fn = _CMP_OPS[op]
        if a.values.dtype.kind == "O" or b.values.dtype.kind == "O":
            if not known.any():
                return np.zeros(self.n, dtype=bool), known
            # NULL positions get a valid value of the same type (their result is masked anyway),
            # so that NumPy's object loop compares Python values without meeting None
            av, bv = _filled(a.values, known), _filled(b.values, known)
            r = np.asarray(fn(av, bv), dtype=bool)
        else:
            with np.errstate(invalid="ignore"):
                r = np.asarray(fn(a.values, b.values), dtype=bool)
        return r & known, known

    def comparison(self, node: exp.Expression) -> Vector:
        """= <> < <= > >= (NULL if either side is NULL)."""
        true, known = self._compare(type(node), node.this, node.expression, node)
        return Vector(true, known, "bool")

    def null_safe(self, node: exp.Expression) -> Vector:
        """IS [NOT] DISTINCT FROM (never NULL)."""
        a, b = self.ev(node.this), self.ev(node.expression)
        true, _ = self._compare(exp.EQ, node.this, node.expression, node)
        same = true | (~a.valid & ~b.valid)
        if isinstance(node, exp.NullSafeNEQ):
            same = ~same
        return Vector(same, np.ones(self.n, dtype=bool), "bool")

    def not_(self, node: exp.Not) -> Vector:
        """NOT (three-valued)."""
        true, known = self.truth(node.this)
        return Vector(~true & known, known, "bool")

    def and_or(self, node: exp.Expression) -> Vector:
        """AND / OR (three-valued)."""
        a, ka = self.truth(node.this)
        b, kb = self.truth(node.expression)
        true, known = _and3(a, ka, b, kb) if isinstance(node, exp.And) else _or3(a, ka, b, kb)
        return Vector(true, known, "bool")

    def in_(self, node: exp.In) -> Vector:
        """x IN (list) (three-valued)."""
        for arg in ("query", "unnest", "field"):
            if node.args.get(arg) is not None:
                raise ExpressionError(f"{_snippet(node)}: IN takes a list of values here", node)
        true = np.zeros(self.n, dtype=bool)
        unknown = np.zeros(self.n, dtype=bool)
        for e in node.expressions:
            t, k = self._compare(exp.EQ, node.this, e, node)
            true |= t
            unknown |= ~k
        return Vector(true, true | ~unknown, "bool")

    def between(self, node: exp.Between) -> Vector:
        """x BETWEEN lo AND hi."""
        if node.args.get("symmetric"):
            raise ExpressionError("BETWEEN SYMMETRIC is not supported", node)
        a, ka = self._compare(exp.GTE, node.this, node.args["low"], node)
        b, kb = self._compare(exp.LTE, node.this, node.args["high"], node)
        true, known = _and3(a, ka, b, kb)
        return Vector(true, known, "bool")

    def is_(self, node: exp.Is) -> Vector:
        """IS [NOT] NULL / TRUE / FALSE (never NULL)."""
        target = node.expression
        if isinstance(target, exp.Null):
            v = self.ev(node.this)
            r = ~v.valid
        elif isinstance(target, exp.Boolean):
            true, known = self.truth(node.this)
            r = (true if target.this else (known & ~true))
        else:
            raise ExpressionError(f"{_snippet(node)}: IS takes NULL, TRUE or FALSE", node)
        if node.args.get("negate"):
            r = ~r
        return Vector(r, np.ones(self.n, dtype=bool), "bool")

    # -- text
    def concat(self, node: exp.Expression) -> Vector:
        """|| (NULL propagates) and CONCAT (NULLs skipped where the dialect skips them)."""
        if isinstance(node, exp.DPipe):
            parts = [self.ev(node.this), self.ev(node.expression)]
            skip_nulls = False
        else:
            parts = [self.ev(e) for e in node.expressions]
            skip_nulls = bool(node.args.get("coalesce"))
        texts = [_cast(p, "text", None) for p in parts]
        valid = np.ones(self.n, dtype=bool)
        if not skip_nulls:
            for t in texts:
                valid &= t.valid
        out = np.full(self.n, "", dtype=object)
        for t in texts:  # NumPy's object loop: Python str + str per row
            out = out + np.where(t.valid, t.values, "")
        out[~valid] = None
        return Vector(out, valid, "text")

    def text_fn(self, node: exp.Expression) -> Vector:
        """UPPER, LOWER, LENGTH of text."""
        v = self.ev(node.this)
        if v.type not in ("text", "null"):
            raise ExpressionError(f"{_snippet(node)} takes text, got {v.type}", node)
        v = _convert(v, "text")
        if isinstance(node, exp.Length):
            vals = np.array([len(x) if ok else 0 for x, ok in zip(v.values, v.valid)], dtype=np.int64)
            return Vector(vals, v.valid, "int")
        fn = str.upper if isinstance(node, exp.Upper) else str.lower
        out = np.empty(self.n, dtype=object)
        out[:] = [fn(x) if ok else None for x, ok in zip(v.values, v.valid)]
        return Vector(out, v.valid, "text")


def _literal_number(node: exp.Expression) -> float | None:
    """The value of a number literal (LOG2/LOG10's base), else None."""
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return float(node.this)
        except ValueError:
            return None
    return None


def _filled(values: np.ndarray, known: np.ndarray) -> np.ndarray:
    """``values`` with the positions not ``known`` replaced by a known value (object arrays)."""
    if values.dtype.kind != "O" or known.all():
        return values
    out = values.copy()
    out[~known] = values[np.argmax(known)]
    return out


def _and3(a: np.ndarray, ka: np.ndarray, b: np.ndarray, kb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Three-valued AND of (true, known) pairs: false if either is known false."""
    true = a & b
    false = (ka & ~a) | (kb & ~b)
    return true, true | false


def _or3(a: np.ndarray, ka: np.ndarray, b: np.ndarray, kb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Three-valued OR: true if either is true, false only if both are known false."""
    true = a | b
    false = ka & ~a & kb & ~b
    return true, true | false


def _refuse(node: exp.Expression) -> None:
    if isinstance(node, _NONDET_NODES) or (
            isinstance(node, exp.Anonymous) and str(node.name).upper() in NONDETERMINISTIC_FUNCTIONS):
        raise ExpressionError(
            f"non-deterministic {_snippet(node)} is not allowed: a release must be a function of its "
            "noisy values alone", node)
    if isinstance(node, exp.AggFunc):
        raise ExpressionError(f"{_snippet(node)}: an aggregate of released values is not supported", node)
    if isinstance(node, exp.Window):
        raise ExpressionError(f"{_snippet(node)}: window functions are not supported", node)
    if isinstance(node, (exp.Subquery, exp.Select, exp.Exists)):
        raise ExpressionError(f"{_snippet(node)}: subqueries are not supported in post-processing", node)
    if isinstance(node, exp.Star):
        raise ExpressionError("* is not a released cell", node)
    if isinstance(node, (exp.Placeholder, exp.Parameter)):
        raise ExpressionError(f"{_snippet(node)}: query parameters are not supported", node)
    name = node.sql_name() if isinstance(node, exp.Func) else type(node).__name__
    if isinstance(node, exp.Anonymous):
        name = str(node.name).upper()
    raise ExpressionError(f"{name} ({_snippet(node)}) is not supported in post-processing", node)


_DISPATCH: dict[type, Callable[[_Evaluator, Any], Vector]] = {
    exp.Column: _Evaluator.column,
    exp.Literal: _Evaluator.literal,
    exp.Boolean: _Evaluator.boolean,
    exp.Null: _Evaluator.null,
    exp.Paren: _Evaluator.paren,
    exp.Pi: _Evaluator.pi,
    exp.Neg: _Evaluator.neg,
    exp.Add: _Evaluator.arith,
    exp.Sub: _Evaluator.arith,
    exp.Mul: _Evaluator.arith,
    exp.Div: _Evaluator.arith,
    exp.IntDiv: _Evaluator.arith,
    exp.Mod: _Evaluator.arith,
    exp.Pow: _Evaluator.power,
    exp.Sqrt: _Evaluator.unary_math,
    exp.Cbrt: _Evaluator.unary_math,
    exp.Exp: _Evaluator.unary_math,
    exp.Ln: _Evaluator.unary_math,
    exp.Log: _Evaluator.log,
    exp.Round: _Evaluator.round_,
    exp.Trunc: _Evaluator.trunc,
    exp.Floor: _Evaluator.floor_ceil,
    exp.Ceil: _Evaluator.floor_ceil,
    exp.Abs: _Evaluator.abs_,
    exp.Sign: _Evaluator.sign,
    exp.Greatest: _Evaluator.greatest_least,
    exp.Least: _Evaluator.greatest_least,
    exp.Case: _Evaluator.case,
    exp.If: _Evaluator.if_,
    exp.Coalesce: _Evaluator.coalesce,
    exp.Nullif: _Evaluator.nullif,
    exp.Cast: _Evaluator.cast,
    exp.TryCast: _Evaluator.cast,
    exp.EQ: _Evaluator.comparison,
    exp.NEQ: _Evaluator.comparison,
    exp.GT: _Evaluator.comparison,
    exp.GTE: _Evaluator.comparison,
    exp.LT: _Evaluator.comparison,
    exp.LTE: _Evaluator.comparison,
    exp.NullSafeEQ: _Evaluator.null_safe,
    exp.NullSafeNEQ: _Evaluator.null_safe,
    exp.Not: _Evaluator.not_,
    exp.And: _Evaluator.and_or,
    exp.Or: _Evaluator.and_or,
    exp.In: _Evaluator.in_,
    exp.Between: _Evaluator.between,
    exp.Is: _Evaluator.is_,
    exp.DPipe: _Evaluator.concat,
    exp.Concat: _Evaluator.concat,
    exp.Upper: _Evaluator.text_fn,
    exp.Lower: _Evaluator.text_fn,
    exp.Length: _Evaluator.text_fn,
}

#: sqlglot node types the evaluator accepts (children such as DataType and Identifier aside).
SUPPORTED_NODES: frozenset[type] = frozenset(_DISPATCH)
_STRUCTURAL = (exp.Identifier, exp.DataType, exp.DataTypeParam, exp.Var)


def _as_tree(expr: exp.Expression | str, dialect: str) -> exp.Expression:
    if isinstance(expr, exp.Expression):
        return expr
    if not isinstance(expr, str):
        raise ExpressionError(f"expected a sqlglot expression or SQL text, got {type(expr).__name__}")
    try:
        return sqlglot.parse_one(expr, read=dialect)
    except sqlglot.errors.ParseError as e:
        raise ExpressionError(f"the expression does not parse: {str(e).splitlines()[0]}") from None


def _cells_of(cells: Mapping[str, Any], rows: int | None) -> tuple[dict[str, Vector], int]:
    vectors = {name: Vector.of(v) for name, v in cells.items()}
    lengths = {len(v) for v in vectors.values()}
    if rows is not None:
        lengths.add(int(rows))
    if len(lengths) > 1:
        raise ExpressionError(f"cells have different lengths: {sorted(lengths)}")
    return vectors, (lengths.pop() if lengths else 1)
