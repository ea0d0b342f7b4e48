"""Rewrite rules on the analyst's parsed statement: small pure functions, tree → tree.

Each rule takes a sqlglot SELECT and returns a new one (the input is never modified),
refusing what it cannot rewrite soundly with an :class:`~dpgate.errors.UnsupportedQuery`
that quotes the construct. They run before the planner's allow-list
(:func:`dpgate.sql.parse.parse_query`), so a query that a rule turns into the flat form
gets the flat query's plan, plan hash and release-cache entry.

Rules (in the order the planner applies them):

* :func:`inline_ctes` — ``WITH r AS (SELECT …) SELECT … FROM r`` → the CTE's query as a
  derived table in FROM (CTEs referring to earlier CTEs included; unused CTEs dropped,
  since nothing of them runs);
* :func:`merge_derived_tables` — ``SELECT … FROM (SELECT <projections> FROM t [WHERE p])
  AS s [WHERE q] …`` → ``SELECT … FROM t AS s WHERE p AND q …`` with every reference to a
  projected name replaced by its expression (nested derived tables merge inside out).

A derived table is merged only when it filters, projects and computes row expressions over
one table: its own GROUP BY, aggregates, DISTINCT, LIMIT, joins, HAVING, window functions
and the like are refused with a reason (per-unit subqueries and joins are separate
features: issue 12). Inlining is what SQL means: a non-recursive CTE or a derived table
without those clauses is exactly the filtered projection of its table (ISO/IEC 9075-2,
§7.6 and §7.17), so the rewrite changes no answer.
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.errors import UnknownColumn, UnsupportedQuery

#: SELECT arguments a mergeable derived table may have.
_MERGEABLE_ARGS = {"expressions", "from_", "from", "where"}
_CLAUSE_NAMES = {
    "group": "GROUP BY",
    "having": "HAVING",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "distinct": "SELECT DISTINCT",
    "joins": "JOIN",
    "laterals": "LATERAL",
    "qualify": "QUALIFY",
    "windows": "WINDOW",
    "with_": "WITH",
    "sample": "TABLESAMPLE",
}
#: Most nested derived tables / CTEs merged into one query.
MAX_DEPTH = 32


def _snippet(node: exp.Expression, limit: int = 80, dialect: str = "duckdb") -> str:
    try:
        text = node.sql(dialect=dialect, comments=False)
    except Exception:  # pragma: no cover - sqlglot cannot render some fragments
        text = type(node).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _refuse(message: str, node: exp.Expression) -> UnsupportedQuery:
    return UnsupportedQuery(message, {"construct": _snippet(node)})


def _real_args(node: exp.Expression) -> set[str]:
    return {k for k, v in node.args.items() if v not in (None, False, [], "")}


def _from(stmt: exp.Select) -> exp.From | None:
    return stmt.args.get("from_") or stmt.args.get("from")


# --- inline_ctes -----------------------------------------------------------------------------


def inline_ctes(stmt: exp.Select) -> exp.Select:
    """Replace references to common table expressions by the CTEs' queries.

    A CTE name shadows a table of the same name (as in SQL). ``WITH RECURSIVE``, column
    lists (``WITH r(a, b) AS …``) and CTEs that are not a plain SELECT are refused.

    Raises:
        UnsupportedQuery: a CTE form that cannot be inlined (quoted in the message).
    """
    with_ = stmt.args.get("with_") or stmt.args.get("with")
    if with_ is None:
        return stmt
    if with_.args.get("recursive"):
        raise _refuse("WITH RECURSIVE is not supported", with_)
    stmt = stmt.copy()
    stmt.set("with_", None)
    stmt.set("with", None)
    bodies: dict[str, exp.Expression] = {}
    for cte in with_.expressions:
        alias = cte.args.get("alias")
        name = cte.alias
        if alias is not None and alias.args.get("columns"):
            raise _refuse(f"column lists on a CTE ({_snippet(alias)}) are not supported: "
                          "rename the columns with AS inside the CTE", cte)
        if _real_args(cte) - {"this", "alias"}:
            raise _refuse(f"the CTE {name!r} uses options that are not supported", cte)
        body = cte.this
        if not isinstance(body, exp.Select):
            raise _refuse(f"the CTE {name!r} must be a plain SELECT", body)
        # Earlier CTEs are visible inside later ones.
        bodies[name.casefold()] = _substitute_ctes(body.copy(), bodies)
    return _substitute_ctes(stmt, bodies)


def _substitute_ctes(stmt: exp.Select, bodies: dict[str, exp.Expression]) -> exp.Select:
    def visit(node: exp.Expression) -> exp.Expression:
        if (isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier)
                and node.args.get("db") is None and node.name.casefold() in bodies):
            alias = node.args.get("alias")
            name = alias.name if alias is not None else node.name
            return exp.Subquery(this=bodies[node.name.casefold()].copy(),
                                alias=exp.TableAlias(this=exp.to_identifier(name)))
        return node

    return stmt.transform(visit, copy=False)


# --- merge_derived_tables -------------------------------------------------------------------


def merge_derived_tables(stmt: exp.Select, _depth: int = 0) -> exp.Select:
    """Merge a derived table in FROM (and, recursively, the ones inside it) into the query.

    The outer query's references to the derived table's output names (qualified by its
    alias or not) become the projected expressions (parenthesised unless they are a
    column or a constant), ``*`` passes the table's columns through, the two WHERE
    clauses are joined with AND, and the base table takes the derived table's alias.
    A released column keeps the title it had (``SELECT a FROM (SELECT age AS a …)``
    releases a column titled ``a``).

    Raises:
        UnsupportedQuery: the derived table does more than filter/project one table
            (GROUP BY, aggregates, DISTINCT, LIMIT, JOIN, …), or the nesting is deeper
            than :data:`MAX_DEPTH`.
        UnknownColumn: the outer query names a column the derived table does not project.
    """
    frm = _from(stmt)
    if frm is None or not isinstance(frm.this, exp.Subquery):
        return stmt
    if _depth >= MAX_DEPTH:
        raise nesting_refusal("subqueries", MAX_DEPTH)
    sub = frm.this
    if _real_args(sub) - {"this", "alias"}:
        raise _refuse(f"{_snippet(sub)}: options on a subquery are not supported", sub)
    inner = sub.this
    if isinstance(inner, exp.Subquery):  # ((SELECT …)) AS s
        inner = inner.unnest()
    if not isinstance(inner, exp.Select):
        raise _refuse(f"{_snippet(inner)} in FROM: only a plain SELECT can be a subquery", inner)
    inner = inline_ctes(inner)
    inner = merge_derived_tables(inner, _depth + 1)
    _check_mergeable(inner)
    alias_node = sub.args.get("alias")
    if alias_node is not None and alias_node.args.get("columns"):
        raise _refuse(f"column lists on a subquery alias ({_snippet(alias_node)}) are not "
                      "supported: rename the columns with AS inside the subquery", alias_node)
    alias = alias_node.name if alias_node is not None else None

    inner_from = _from(inner)
    base = inner_from.this.copy()
    inner_quals = {base.name.casefold()}
    if base.args.get("alias") is not None:
        inner_quals.add(base.alias.casefold())
    # Inner expressions are rewritten over the base table with no qualifier.
    def unqualify(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            tbl = node.args.get("table")
            if tbl is not None and node.args.get("db") is None and tbl.name.casefold() in inner_quals:
                return exp.column(node.this.copy())
        return node

    projections: dict[str, exp.Expression] = {}
    star = False
    for item in inner.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column)
                                          and isinstance(item.this, exp.Star)):
            if _real_args(item) - {"this", "table"}:
                raise _refuse(f"{_snippet(item)} with modifiers is not supported in a subquery",
                              item)
            star = True
            continue
        name = item.alias_or_name
        if not name:
            raise _refuse(f"{_snippet(item)} in a subquery needs a name (AS …)", item)
        body = item.unalias().transform(unqualify, copy=True)
        if name.casefold() in projections:
            raise _refuse(f"the subquery projects two columns named {name!r}", item)
        projections[name.casefold()] = body

    quals = {alias.casefold()} if alias else set()
    out = stmt.copy()

    def replace(node: exp.Expression, aliases: set[str], shadow: bool = True) -> exp.Expression:
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            return node
        tbl = node.args.get("table")
        if node.args.get("db") is not None or (tbl is not None and tbl.name.casefold() not in quals):
            return node  # not ours: the planner's scope check names it
        key = node.name.casefold()
        if key in projections:
            if shadow and tbl is None and key in aliases:
                return node  # an output alias of the outer query (ORDER BY / HAVING)
            body = projections[key].copy()
            if not isinstance(body, (exp.Column, exp.Literal, exp.Null, exp.Boolean)):
                body = exp.Paren(this=body)
            return body
        if star:
            return exp.column(node.this.copy())
        if tbl is None and key in aliases:
            return node  # an output alias of the outer query
        raise UnknownColumn(
            f"the subquery {alias or _snippet(sub, 40)!r} has no column {node.name!r}",
            {"table": alias, "column": node.name},
        )

    outer_aliases = {e.alias.casefold() for e in out.expressions if isinstance(e, exp.Alias)}
    items = []
    for item in out.expressions:
        if isinstance(item, exp.Column) and not isinstance(item.this, exp.Star):
            new = replace(item, set())
            if new is not item and not (isinstance(new, exp.Column) and new.name == item.name):
                new = exp.alias_(new, item.name, quoted=item.this.args.get("quoted"))
            items.append(new)
        else:
            new = item.transform(lambda n: replace(n, set()), copy=True)
            if not isinstance(item, exp.Alias) and new != item:
                # Keep the analyst's title (``SUM(t)``, not ``SUM(tokens)``).
                new = exp.alias_(new, _snippet(item, 200), quoted=True)
            items.append(new)
    out.set("expressions", items)
    # In WHERE and GROUP BY the subquery's columns come before the outer query's aliases; in
    # HAVING and ORDER BY the aliases come first (as in DuckDB and PostgreSQL).
    for key in ("where", "group", "having", "order"):
        if out.args.get(key) is not None:
            shadow = key in ("having", "order")
            out.set(key, out.args[key].transform(
                lambda n: replace(n, outer_aliases, shadow), copy=True))

    table = base.copy()
    table.set("alias", exp.TableAlias(this=exp.to_identifier(alias)) if alias else None)
    out.set("from_", exp.From(this=table))
    out.set("from", None)
    inner_where = inner.args.get("where")
    if inner_where is not None:
        cond = inner_where.this.transform(unqualify, copy=True)
        outer_where = out.args.get("where")
        if outer_where is not None:
            cond = exp.and_(exp.Paren(this=cond), exp.Paren(this=outer_where.this))
        out.set("where", exp.Where(this=cond))
    return out


def _check_mergeable(inner: exp.Select) -> None:
    for key in sorted(_real_args(inner) - _MERGEABLE_ARGS):
        what = _CLAUSE_NAMES.get(key, key.upper())
        raise _refuse(
            f"{what} inside a subquery is not supported: a subquery may only filter (WHERE), "
            "project and compute row expressions over one table",
            inner,
        )
    frm = _from(inner)
    if frm is None:
        raise _refuse("a subquery needs a FROM clause naming one table", inner)
    if not isinstance(frm.this, exp.Table):
        raise _refuse(f"{_snippet(frm.this)} in a subquery's FROM: name one table", frm.this)
    for node in inner.expressions:
        agg = node.find(exp.AggFunc)
        if agg is not None:
            raise _refuse(
                f"aggregates inside a subquery ({_snippet(agg)}) are not supported: a "
                "subquery may only filter, project and compute row expressions over one table",
                agg,
            )
        if node.find(exp.Window) is not None:
            raise _refuse("window functions inside a subquery are not supported", node)


# --- or_equalities_to_in ---------------------------------------------------------------------


def _or_operands(node: exp.Expression) -> list[exp.Expression]:
    """The operands of a chain of ORs (parentheses looked through), iteratively."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        while isinstance(n, exp.Paren):
            n = n.this
        if isinstance(n, exp.Or):
            stack.append(n.expression)
            stack.append(n.this)
        else:
            out.append(n)
    return out


def _equality(node: exp.Expression) -> tuple[exp.Column, list[exp.Expression]] | None:
    """(column, values) of ``col = literal`` (either side) or ``col IN (literals…)``."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.EQ):
        a, b = node.this, node.expression
        if isinstance(b, exp.Column) and isinstance(a, (exp.Literal, exp.Neg)):
            a, b = b, a
        if isinstance(a, exp.Column) and isinstance(b, (exp.Literal, exp.Neg)):
            return a, [b]
    if (isinstance(node, exp.In) and isinstance(node.this, exp.Column) and node.expressions
            and not (set(node.args) - {"this", "expressions"} & {k for k, v in node.args.items() if v})
            and all(isinstance(e, (exp.Literal, exp.Neg)) for e in node.expressions)):
        return node.this, list(node.expressions)
    return None


def or_equalities_to_in(stmt: exp.Select) -> exp.Select:
    """``x = 1 OR x = 2 OR x IN (3, 4)`` → ``x IN (1, 2, 3, 4)`` (same column, literals only).

    The two mean the same for every row, NULLs included (both are NULL when ``x`` is NULL,
    else true iff ``x`` equals one of the values). Long lists of values written as ORs nest
    one level per term in the syntax tree; as an IN list they do not, so a 1,000-value OR
    plans like the IN it means. Runs without recursion. Other ORs are left alone.
    """
    def chains(tree: exp.Expression):
        for n in tree.walk():
            if isinstance(n, exp.Or) and not isinstance(n.parent, exp.Or) and not (
                    isinstance(n.parent, exp.Paren) and isinstance(n.parent.parent, exp.Or)):
                operands = _or_operands(n)
                parts = [_equality(o) for o in operands]
                if any(p is None for p in parts):
                    continue
                columns = {(p[0].name.casefold(), p[0].table.casefold(), p[0].db.casefold())
                           for p in parts}
                if len(columns) == 1:
                    yield n, parts

    if next(chains(stmt), None) is None:
        return stmt  # nothing to rewrite (the input is returned unmodified)
    stmt = stmt.copy()
    for top, parts in list(chains(stmt)):
        values = [v.copy() for _, vals in parts for v in vals]
        replacement = exp.In(this=parts[0][0].copy(), expressions=values)
        if top is stmt:  # pragma: no cover - a statement is never an OR
            continue
        top.replace(replacement)
    return stmt


#: Deepest nesting of expressions the planner accepts (:func:`expression_depth`). Measured
#: (tests/test_plan_clauses.py): sqlglot's recursive-descent parser spends ~25 Python frames per
#: level of nesting, and the planner parses its own canonical SQL again, where every arithmetic
#: operator and ABS is wrapped in ``TRY(…)`` (two levels per level): from a shallow caller the
#: first failure is at 20 nested ``ABS(…)`` in a WHERE (the costliest construct; 42 parentheses,
#: 39 chained ``+``). 12 leaves room for a caller 300 frames deep (an HTTP server's stack).
MAX_NESTING = 12
#: Longest path of the syntax tree (:func:`tree_depth`): a chain of n AND/OR conditions is n
#: levels, each cheap (~3 frames); the first failure from a caller 300 frames deep is at ~225.
MAX_TREE_DEPTH = 200


#: What to do about each kind of nesting (the end of :func:`nesting_refusal`'s message).
_NESTING_HINTS = {
    "expressions": ("each parenthesis, function call and operator around another is one level; "
                    "compute less in one expression"),
    "conditions": "a chain of n AND/OR conditions nests n levels: write a list of values as IN (…)",
    "subqueries": "write the filters of nested subqueries or CTEs as one WHERE",
}


def nesting_refusal(kind: str, limit: int, depth: int | None = None) -> UnsupportedQuery:
    """The one refusal for a query nested deeper than the planner accepts, wherever it is found
    (the parser's recursion, :func:`check_nesting`, :func:`merge_derived_tables`, the planner).

    Args:
        kind: ``"expressions"`` (:func:`expression_depth`: operators, function calls,
            parentheses), ``"conditions"`` (:func:`tree_depth`: chains of AND/OR) or
            ``"subqueries"``.
        limit: the limit that was exceeded (:data:`MAX_NESTING`, :data:`MAX_TREE_DEPTH` or
            :data:`MAX_DEPTH`).
        depth: the measured depth, or None where only "more than the limit" is known.

    Returns:
        An :class:`UnsupportedQuery` "the query nests <kind> <depth> levels deep; the planner
        accepts at most <limit> (<hint>)" with ``details = {"reason": "nesting", "kind",
        "depth", "max"}``.
    """
    levels = f"{depth} levels" if depth is not None else f"more than {limit} levels"
    return UnsupportedQuery(
        f"the query nests {kind} {levels} deep; the planner accepts at most {limit} "
        f"({_NESTING_HINTS[kind]})",
        {"reason": "nesting", "kind": kind, "depth": depth, "max": limit},
    )


#: Nodes of the query's structure (clauses, names, subqueries): they add no expression level
#: (nested subqueries have their own limit, :data:`MAX_DEPTH`).
_STRUCTURE = (exp.Query, exp.From, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered,
              exp.Limit, exp.Offset, exp.Subquery, exp.Table, exp.TableAlias, exp.Identifier,
              exp.Alias, exp.Join, exp.With, exp.CTE, exp.Star, exp.Column, exp.Literal,
              exp.DataType, exp.Var, exp.Null, exp.Boolean, exp.Distinct, exp.Qualify)


def _depths(stmt: exp.Expression, weight) -> int:
    """Longest root-to-node path of ``stmt``, each node adding ``weight(node)`` (no recursion)."""
    depth_of = {id(stmt): weight(stmt)}
    deepest = 0
    for node in stmt.walk():
        d = depth_of.get(id(node), 0)
        deepest = max(deepest, d)
        for child in node.iter_expressions():
            depth_of[id(child)] = d + weight(child)
    return deepest


def expression_depth(stmt: exp.Expression, *, parentheses: bool = True) -> int:
    """The nesting of expressions: the most operators, function calls and parentheses on one
    path, the query's structure (:data:`_STRUCTURE`: clauses, names, literals, subqueries) not
    counted, and a chain of the same AND/OR counted once (``a AND b AND c`` is one level:
    sqlglot parses and renders such chains without recursing per link).

    ``((age > 1))`` is 3 (two parentheses and the comparison), ``ABS(ABS(age)) > 3`` is 3,
    ``a > 1 AND b > 1 AND c > 1`` is 2. Measured without recursion.

    Args:
        parentheses: count parentheses (the analyst's text: the parser recurses on each). False
            for a tree the rules built (:func:`merge_derived_tables` wraps what it substitutes
            in parentheses, which the canonical SQL drops: the parser never reads them).
    """
    def weight(node: exp.Expression) -> int:
        if isinstance(node, _STRUCTURE):
            return 0
        if not parentheses and isinstance(node, exp.Paren):
            return 0
        if isinstance(node, exp.Connector):
            parent = node.parent
            while not parentheses and isinstance(parent, exp.Paren):
                parent = parent.parent
            if type(parent) is type(node):
                return 0
        return 1

    return _depths(stmt, weight)


def tree_depth(stmt: exp.Expression) -> int:
    """The longest path of the syntax tree, every node counted (a chain of n ANDs is n levels)."""
    return _depths(stmt, lambda node: 1)


def parser_nesting_refusal(sql: str, dialect: str) -> UnsupportedQuery:
    """The refusal when sqlglot's parser itself ran out of recursion (before any tree exists).

    The SQL's tokens (read without recursion) tell which limit: more than :data:`MAX_DEPTH`
    nested ``(SELECT …)`` is the subquery limit, with its depth; anything else is more than
    :data:`MAX_NESTING` levels of expressions (every query within the limits parses).
    """
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.tokens import TokenType

    try:
        tokens = Dialect.get_or_raise(dialect).tokenize(sql)
    except Exception:  # noqa: BLE001 - the tokens only choose the message
        tokens = []
    stack: list[bool] = []  # one entry per open parenthesis: does it open a subquery?
    deepest = 0
    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.L_PAREN:
            nxt = tokens[i + 1].token_type if i + 1 < len(tokens) else None
            stack.append(nxt in (TokenType.SELECT, TokenType.WITH))
            deepest = max(deepest, sum(stack))
        elif tok.token_type == TokenType.R_PAREN and stack:
            stack.pop()
    if deepest > MAX_DEPTH:
        return nesting_refusal("subqueries", MAX_DEPTH, deepest)
    return nesting_refusal("expressions", MAX_NESTING)


def check_nesting(stmt: exp.Expression, *, parentheses: bool = True) -> None:
    """Refuse a tree nested deeper than the planner can process, with a clear message: more
    than :data:`MAX_NESTING` levels of expressions (:func:`expression_depth`) or a syntax tree
    deeper than :data:`MAX_TREE_DEPTH` (:func:`tree_depth`: long AND/OR chains).

    Every query within both limits is planned (measured in tests/test_plan_clauses.py, from a
    caller 300 frames deep). Measured without recursion.

    Args:
        parentheses: as for :func:`expression_depth` (False after the rules rewrote the tree).

    Raises:
        UnsupportedQuery: naming the depth and the limit.
    """
    depth = expression_depth(stmt, parentheses=parentheses)
    if depth > MAX_NESTING:
        raise nesting_refusal("expressions", MAX_NESTING, depth)
    if parentheses:  # merging adds AND links and parentheses the parser never reads
        depth = tree_depth(stmt)
        if depth > MAX_TREE_DEPTH:
            raise nesting_refusal("conditions", MAX_TREE_DEPTH, depth)


def apply_statement_rules(stmt: exp.Select) -> exp.Select:
    """Every statement rule, in order: :func:`or_equalities_to_in`, :func:`check_nesting`,
    :func:`inline_ctes`, then :func:`merge_derived_tables`."""
    stmt = or_equalities_to_in(stmt)
    check_nesting(stmt)
    stmt = merge_derived_tables(inline_ctes(stmt))
    check_nesting(stmt, parentheses=False)  # merging substitutes projected expressions: nesting can grow
    return stmt
