"""The group-choosing hash of a bounded query, made portable across engines.

The planner orders each unit's groups by DuckDB's ``hash(unit, keys…, salt)`` (which k groups
a unit keeps: :mod:`dpgate.sql.bound`); every engine replaces it by a hash with the same
semantics everywhere: keyed integer arithmetic when the unit and keys are integers
(:func:`arithmetic_group_hash`), else md5 of their text (:func:`portable_group_hash`).
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Callable, Mapping

from sqlglot import exp

from dpgate.engines.base import relations
from dpgate.engines.types import column_types, datatype
from dpgate.policy import DatasetPolicy

if TYPE_CHECKING:
    from dpgate.engines.base import TableInfo

__all__ = ["HASH_PRIME", "NULL_TEXT", "arithmetic_group_hash", "group_hash", "has_group_hash", "integer_hash_inputs",
           "portable_group_hash"]


def _is_hash_call(node: exp.Expression) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.this).lower() == "hash"


def portable_group_hash(tree: exp.Expression, *, collate_c: bool = False) -> exp.Expression:
    """Replace DuckDB's ``hash(a, b, …)`` by ``md5(CAST(a AS TEXT) || ':' || CAST(b AS TEXT) …)``.

    The group-choosing order (which k groups a unit keeps) then has the same
    semantics on every engine: md5 is standard and the text of an integer or a
    string is the same everywhere, so exact answers agree for any k. (The text of
    a *float* group key is not: ``1.0`` vs ``1``; so the planner's render hashes a
    float key's public-key ordinal instead, ``dpgate.sql.bound._hash_key``.) ``collate_c`` orders the hex digests bytewise
    where the database collation might not (PostgreSQL).

    A NULL input hashes as the text :data:`NULL_TEXT` (DuckDB's own ``hash`` hashes NULL too): the
    md5 of a concatenation with a NULL is NULL, which sorts after every digest, so before
    2026-12-04 a unit never kept its NULL-key group when it had k others (a biased answer, found by
    a trial: ``GROUP BY CASE … END`` without ELSE). A key whose text is ``NULL_TEXT`` ties with
    NULL; ties are broken by the keys, so it only changes which groups a unit keeps, not the bounds.
    """

    def fix(node: exp.Expression) -> exp.Expression:
        if not _is_hash_call(node):
            return node
        parts: list[exp.Expression] = []
        for i, arg in enumerate(node.expressions):
            if i:
                parts.append(exp.Literal.string(":"))
            text: exp.Expression = exp.Cast(this=arg.copy(), to=datatype("varchar"))
            if not isinstance(arg, exp.Literal):  # a NULL key is a key: its own text, not a NULL digest
                text = exp.Coalesce(this=text, expressions=[exp.Literal.string(NULL_TEXT)])
            parts.append(text)
        digest: exp.Expression = exp.MD5(this=exp.Concat(expressions=parts))
        if collate_c:
            digest = exp.Collate(this=digest, expression=exp.to_identifier("C", quoted=True))
        return digest

    return tree.transform(fix, copy=False)


#: The text a NULL hash input is read as (:func:`portable_group_hash`).
NULL_TEXT = "\\N"

#: The Mersenne prime 2**31 − 1: the modulus of the arithmetic group hash (every product of
#: two residues is below 2**62, so BIGINT arithmetic is exact on every engine; 128-bit
#: division is slow in DuckDB).
HASH_PRIME = 2**31 - 1


def _salt_constants(salt: int) -> list[int]:
    """Six constants in [1, 2**31 − 1) derived from the release's secret salt (SHA-256)."""
    out = []
    for i in range(6):
        digest = hashlib.sha256(f"dpgate-group-hash:{salt}:{i}".encode()).digest()
        out.append(1 + int.from_bytes(digest[:16], "big") % (HASH_PRIME - 2))
    return out


def arithmetic_group_hash(tree: exp.Expression, dialect: str, integer_columns: set[str]) -> exp.Expression:
    """Replace ``hash(u, g…, salt)`` by a keyed arithmetic hash when u and every g are integers.

    With P = 2**31 − 1 and constants s1, t1, s2, b_i, s3 derived from the salt::

        x = ((u mod P) + P) mod P;  y = (s1·x + t1) mod P;  y = (y² + s2) mod P
        z = (y + Σ (b_i · (((g_i mod P) + P) mod P) mod P)) mod P;  h = (z² + s3) mod P

    computed in BIGINT (every intermediate value is below 2**63: exact on every engine,
    no overflow), so every engine computes the same h. A NULL key g_i is read as the residue t1
    (before 2026-12-04 it made h NULL, so a unit's NULL-key group sorted last and was never kept
    when it had k others). Ties (probability ≈ n²/2**32 for a
    unit in n groups) are broken by the keys, as before. The squarings make the order of one unit's groups depend non-linearly on the
    unit. Cheaper than md5 of text (:func:`portable_group_hash`), which remains the
    fallback for text units or keys. The choice, like md5's, depends only on the unit's
    own rows and the salt (what the sensitivity needs); randomness quality only affects
    which k groups are kept. ``integer_columns`` holds the generated names (``__dpg_u``,
    ``__dpg_g0`` …) known to be integers (or booleans).
    """
    wide = datatype("bigint")
    prime = exp.Literal.number(HASH_PRIME)

    def w(e: exp.Expression) -> exp.Expression:
        return exp.Cast(this=e, to=wide.copy())

    def mod(e: exp.Expression) -> exp.Expression:
        return exp.Mod(this=exp.Paren(this=e), expression=prime.copy())

    def residue(e: exp.Expression) -> exp.Expression:
        return mod(exp.Add(this=mod(w(e)), expression=prime.copy()))

    def fix(node: exp.Expression) -> exp.Expression:
        if not _is_hash_call(node):
            return node
        *cols, salt = node.expressions
        if not (isinstance(salt, exp.Literal) and not salt.is_string and re.fullmatch(r"\d+", salt.this)):
            return node
        if not cols or not all(isinstance(c, exp.Column) and c.name in integer_columns for c in cols):
            return node
        s1, t1, s2, s3, *bs = _salt_constants(int(salt.this))
        lit = exp.Literal.number
        y = mod(exp.Add(this=exp.Mul(this=lit(s1), expression=residue(cols[0].copy())), expression=lit(t1)))
        y = mod(exp.Add(this=exp.Mul(this=y, expression=y.copy()), expression=lit(s2)))
        z: exp.Expression = y
        for i, g in enumerate(cols[1:]):
            b = bs[i % len(bs)] + i  # distinct per key position
            # a NULL key is read as the residue t1 (a salt constant), not a NULL hash (which sorts last)
            r = exp.Coalesce(this=residue(g.copy()), expressions=[lit(t1)])
            z = exp.Add(this=z, expression=mod(exp.Mul(this=lit(b), expression=r)))
        z = mod(z)
        return mod(exp.Add(this=exp.Mul(this=z, expression=z.copy()), expression=lit(s3)))

    return tree.transform(fix, copy=False)


def integer_hash_inputs(tree: exp.Expression, policy: DatasetPolicy, unit_is_integer: Callable[[str], bool]
                        ) -> set[str]:
    """Generated names (``__dpg_u``, ``__dpg_g<i>``) bound to integer (or boolean) columns.

    Read from the ``… AS "__dpg_u"`` / ``… AS "__dpg_g<i>"`` projections of the bounded
    query: a key column of declared type int or bool; the unit column when the engine
    found it stored as an integer type.
    """
    types = column_types(policy, tree)
    tables = [name for ds, name in relations(tree) if ds == policy.name]
    out: set[str] = set()
    for alias in tree.find_all(exp.Alias):
        name = alias.alias
        col = alias.this
        if not isinstance(col, exp.Column):
            continue
        if name == "__dpg_u" and tables and all(unit_is_integer(t) for t in tables):
            out.add(name)
        elif re.fullmatch(r"__dpg_g\d+", name) and types.get(col.name.casefold()) == "int":
            out.add(name)
    return out


def group_hash(tree: exp.Expression, policy: DatasetPolicy, tables: Mapping[str, "TableInfo"], dialect: str
               ) -> exp.Expression:
    """Make the group-choosing hash portable: arithmetic when the unit and keys are integers,
    md5 of the key text otherwise (bytewise order on PostgreSQL)."""
    def unit_integer(name: str) -> bool:
        info = tables.get(name) or next((t for n, t in tables.items() if n.casefold() == name.casefold()), None)
        return bool(info and info.unit_integer)

    ints = integer_hash_inputs(tree, policy, unit_integer)
    tree = arithmetic_group_hash(tree, dialect, ints)
    return portable_group_hash(tree, collate_c=(dialect == "postgres"))


def has_group_hash(tree: exp.Expression) -> bool:
    """True when the tree contains DuckDB's ``hash(…)`` (see :func:`portable_group_hash`)."""
    return any(_is_hash_call(n) for n in tree.find_all(exp.Anonymous))
