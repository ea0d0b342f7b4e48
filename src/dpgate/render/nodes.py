"""Small sqlglot node builders shaped exactly as sqlglot's DuckDB parser builds them.

Each builder returns the node the DuckDB parser would return for the SQL in its docstring
(so that every engine renders a built tree as it rendered the parsed text), without parsing:
``DataType.build("varchar")`` and ``exp.select("…")`` parse their string arguments.
"""

from __future__ import annotations

from typing import Iterable

from sqlglot import exp

_TYPES = {"BIGINT": exp.DataType.Type.BIGINT, "DOUBLE": exp.DataType.Type.DOUBLE,
          "VARCHAR": exp.DataType.Type.TEXT, "TEXT": exp.DataType.Type.TEXT,
          "BOOLEAN": exp.DataType.Type.BOOLEAN, "DATE": exp.DataType.Type.DATE,
          "TIMESTAMP": exp.DataType.Type.TIMESTAMPNTZ, "HUGEINT": exp.DataType.Type.INT128}


def dtype(name: str) -> exp.DataType:
    """``BIGINT``, ``DOUBLE``, ``VARCHAR``, ``BOOLEAN``, ``DATE``, ``TIMESTAMP`` or ``HUGEINT``."""
    return exp.DataType(this=_TYPES[name.upper()], nested=False)


def ident(name: str, quoted: bool = True) -> exp.Identifier:
    """An identifier node (quoted by default)."""
    return exp.Identifier(this=name, quoted=quoted)


def col(name: str, table: str | None = None) -> exp.Column:
    """``"table"."name"`` (or ``"name"``)."""
    return exp.Column(this=ident(name), table=ident(table) if table is not None else None)


def num(value: int | str) -> exp.Expression:
    """An integer (or numeric text such as ``1.5e0``); negative values as ``-(n)``, as parsed."""
    text = str(value)
    if text.startswith("-"):
        return exp.Neg(this=exp.Literal.number(text[1:]))
    return exp.Literal.number(text)


def lit(value, ctype: str) -> exp.Expression:
    """A policy value of type ``ctype`` as the text builder's ``_literal`` writes it."""
    if value is None:
        return exp.Null()
    if ctype == "text":
        return exp.Literal.string(str(value))
    if ctype == "bool":
        return exp.Boolean(this=bool(value))
    if ctype == "int":
        return num(int(value))
    text = repr(float(value))
    if "inf" in text or "nan" in text:
        raise ValueError(f"no SQL literal for {text}")
    return num(text if "e" in text else text + "e0")


def cast(this: exp.Expression, to: str) -> exp.Cast:
    """``CAST(this AS to)``; ``to`` a type name (built without parsing)."""
    return exp.Cast(this=this, to=dtype(to))


def alias(this: exp.Expression, name: str) -> exp.Alias:
    """``this AS <quoted name>``."""
    return exp.Alias(this=this, alias=ident(name))


def least(a: exp.Expression, b: exp.Expression) -> exp.Least:
    """``LEAST(a, b)`` ignoring NULLs (DuckDB's semantics)."""
    return exp.Least(this=a, expressions=[b], ignore_nulls=True)


def greatest(a: exp.Expression, b: exp.Expression) -> exp.Greatest:
    """``GREATEST(a, b)`` ignoring NULLs (DuckDB's semantics)."""
    return exp.Greatest(this=a, expressions=[b], ignore_nulls=True)


def count(this: exp.Expression | None = None) -> exp.Count:
    """``COUNT(*)`` (no argument) or ``COUNT(this)``."""
    return exp.Count(this=this if this is not None else exp.Star(), big_int=True)


def coalesce0(this: exp.Expression) -> exp.Coalesce:
    """``COALESCE(this, 0)``."""
    return exp.Coalesce(this=this, expressions=[num(0)])


def not_null(this: exp.Expression) -> exp.Not:
    """``this IS NOT NULL``."""
    return exp.Not(this=exp.Is(this=this, expression=exp.Null()))


def is_null(this: exp.Expression) -> exp.Is:
    """``this IS NULL``."""
    return exp.Is(this=this, expression=exp.Null())


def anonymous(name: str, *args: exp.Expression) -> exp.Anonymous:
    """A call DuckDB's parser leaves anonymous (``hash``, ``isfinite``)."""
    return exp.Anonymous(this=name, expressions=list(args))


def case_when(cond: exp.Expression, then: exp.Expression, default: exp.Expression | None = None) -> exp.Case:
    """``CASE WHEN cond THEN then [ELSE default] END``."""
    return exp.Case(ifs=[exp.If(this=cond, true=then)], default=default)


def conjunction(conditions: Iterable[exp.Expression], kind: type = exp.And) -> exp.Expression:
    """``a AND b AND c`` (left-associative, as parsed; no parentheses added)."""
    items = list(conditions)
    out = items[0]
    for item in items[1:]:
        out = kind(this=out, expression=item)
    return out


def select(items: Iterable[exp.Expression], source: exp.Expression | None = None, *,
           where: exp.Expression | None = None, group: Iterable[exp.Expression] = (),
           qualify: exp.Expression | None = None, joins: Iterable[exp.Expression] = (),
           order: Iterable[exp.Expression] = ()) -> exp.Select:
    """``SELECT items FROM source [joins] [WHERE] [GROUP BY] [QUALIFY] [ORDER BY]``."""
    node = exp.Select(expressions=list(items))
    if source is not None:
        node.set("from_", exp.From(this=source))
    joins = list(joins)
    if joins:
        node.set("joins", joins)
    if where is not None:
        node.set("where", exp.Where(this=where))
    group = list(group)
    if group:
        node.set("group", exp.Group(expressions=group))
    if qualify is not None:
        node.set("qualify", exp.Qualify(this=qualify))
    order = list(order)
    if order:
        node.set("order", exp.Order(expressions=[exp.Ordered(this=o, nulls_first=False) for o in order]))
    return node


def table(name: str, db: str | None = None, alias_name: str | None = None) -> exp.Table:
    """``"db"."name" AS "alias"``."""
    node = exp.Table(this=ident(name), db=ident(db) if db is not None else None)
    if alias_name is not None:
        node.set("alias", exp.TableAlias(this=ident(alias_name)))
    return node


def subquery(query: exp.Expression, alias_name: str, columns: Iterable[str] = ()) -> exp.Subquery:
    """``(query) AS alias_name[(columns…)]``."""
    cols = [ident(c) for c in columns]
    return exp.Subquery(this=query, alias=exp.TableAlias(this=ident(alias_name), columns=cols or None))


def with_ctes(ctes: list[tuple[str, exp.Expression]], final: exp.Select) -> exp.Select:
    """``WITH "a" AS (…), "b" AS (…) final``."""
    final.set("with_", exp.With(expressions=[exp.CTE(this=q, alias=exp.TableAlias(this=ident(n)))
                                             for n, q in ctes]))
    return final
