"""Quantile aggregates in SQL: recognising them (parser hook) and the bounded histogram SQL.

Recognised spellings (sqlglot, DuckDB dialect) and the quantile α they mean:

* ``MEDIAN(x)`` → 0.5; ``QUANTILE_CONT(x, q)``, ``QUANTILE_DISC(x, q)``,
  ``QUANTILE(x, q)``, ``APPROX_QUANTILE(x, q)`` → q;
* ``PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY x)`` and ``PERCENTILE_DISC`` → q
  (``ORDER BY x DESC`` → 1 − q);
* ``MIN(x)`` → 0, ``MAX(x)`` → 1 (DP estimates of the bounded column's minimum and
  maximum, not the true extremes).

q is a numeric literal in [0, 1]. CONT and DISC are the same DP estimate: the
released value is a candidate of the public grid (:mod:`dpgate.quantiles`), so
there is nothing to interpolate. A list of quantiles in one call is refused (write
one call per quantile: each is its own release, charged separately).

:func:`histogram_sql` is the bounding rewrite for one quantile column (same
conventions as :mod:`dpgate.sql.bound`: generated names only, the plan's canonical
WHERE, the analyst's text never reaches the engine). Its steps:

1. ``rows``: filtered rows (NULL unit dropped, group keys restricted to their
   public keys), the value as a clamped fixed-point integer (NULL for NULL, NaN,
   ±inf; those rows are left out) rounded to its nearest grid candidate ``b``;
2. ``unit_groups``/``kept``: when the unit has values in more than k groups, only
   the k groups with the smallest ``hash(unit, keys, salt)`` (the rule of
   :mod:`dpgate.sql.bound`); in each kept (unit, group), at most m values — all of
   them when there are at most m, else the m with the smallest
   ``hash(unit, b, salt)`` (ties between equal candidates are interchangeable).
   The choice depends only on the unit's own rows and the secret salt. With k = 1 the
   group is found without ranking every (unit, group) pair (:func:`_one_group_rows`: the
   rows whose group hash is the unit's smallest, then the keys break a tie; issue 25 item 3),
   which keeps the same group;
3. per (group, candidate): the number of kept values;
4. the public keys LEFT JOINed: one row per (group, non-empty candidate), or one row
   with ``b = -1`` for an empty group, in public-key order.

With privately selected keys (issue 21 item 8; :mod:`dpgate.sql.partition_selection`) the
selected keys have no public keys to filter or enumerate: step 1 keeps every value of them
(NULL too), step 2 always keeps at most k groups, and step 4 is the non-empty (group,
candidate) counts alone, without ``__dpg_r``; the gateway keeps the groups the threshold
mechanism selected, before any quantile is chosen
(:func:`dpgate.quantile_release.selected_histograms`).

Record-level tables (each row its own unit, k = m = 1) skip step 2.
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.rendered import mark
from dpgate.errors import UnsupportedQuery
from dpgate.policy import DatasetPolicy, quote_identifier as q
from dpgate.quantiles import Grid, alpha_fraction, grid_for
from dpgate.sql.bound import SALT_PLACEHOLDER, _fixed_point, _key_filter, _key_relations, _where
from dpgate.sql.plan import QueryPlan

_PREFIX = "__dpg_"
_SRC = _PREFIX + "src"

#: Aggregate node types that are quantiles (besides MIN/MAX and WITHIN GROUP).
QUANTILE_NODES = (exp.Median, exp.PercentileCont, exp.PercentileDisc, exp.ApproxQuantile,
                  exp.Quantile, exp.Min, exp.Max, exp.WithinGroup)

#: Aggregate functions of the plan that are quantiles.
QUANTILE_FUNCTIONS = ("quantile", "min", "max")


def is_quantile_call(node: exp.Expression) -> bool:
    """True for a quantile aggregate node (see the module docstring)."""
    if isinstance(node, exp.WithinGroup):
        return isinstance(node.this, (exp.PercentileCont, exp.PercentileDisc))
    return isinstance(node, QUANTILE_NODES)


def _snippet(node: exp.Expression) -> str:
    text = node.sql(dialect="duckdb")
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse(message: str, node: exp.Expression) -> UnsupportedQuery:
    return UnsupportedQuery(message, {"construct": _snippet(node)})


def _alpha(lit: exp.Expression | None, call: exp.Expression) -> str:
    """The quantile literal's decimal text (checked to be in [0, 1])."""
    if isinstance(lit, exp.Array):
        raise _refuse(f"{_snippet(call)}: a list of quantiles in one call is not supported; "
                      "write one call per quantile", call)
    if not (isinstance(lit, exp.Literal) and not lit.is_string):
        raise _refuse(f"{_snippet(call)}: the quantile must be a numeric literal in [0, 1]", call)
    try:
        alpha_fraction(lit.this)
    except ValueError as e:
        raise _refuse(f"{_snippet(call)}: {e}", call) from None
    return str(lit.this)


def quantile_call(node: exp.Expression) -> tuple[str, exp.Expression, float]:
    """(function, argument, α) of a quantile aggregate.

    ``function`` is ``"quantile"``, ``"min"`` or ``"max"``; the argument is the
    aggregated expression (the caller checks it is a bounded declared column).

    Raises:
        UnsupportedQuery: a non-literal or out-of-range quantile, a list of quantiles,
            several ORDER BY items in WITHIN GROUP, DISTINCT.
    """
    if isinstance(node, exp.Min):
        return "min", node.this, 0.0
    if isinstance(node, exp.Max):
        return "max", node.this, 1.0
    if isinstance(node, exp.Median):
        return "quantile", node.this, 0.5
    if isinstance(node, exp.WithinGroup):
        order = node.expression
        items = order.expressions if isinstance(order, exp.Order) else []
        if len(items) != 1 or set(k for k, v in order.args.items() if v) - {"expressions"}:
            raise _refuse(f"{_snippet(node)}: WITHIN GROUP needs exactly one ORDER BY column", node)
        item = items[0]
        extra = {k for k, v in node.this.args.items() if v not in (None, False, [], "")} - {"this"}
        if extra:  # PERCENTILE_CONT(0.9, 0.1): one quantile per call
            raise _refuse(f"{_snippet(node)}: one quantile per call (write one PERCENTILE_CONT per "
                          "quantile)", node)
        text = _alpha(node.this.this, node)
        num, den = alpha_fraction(text)
        alpha = num / den
        if isinstance(item, exp.Ordered) and item.args.get("desc"):
            alpha = (den - num) / den
        arg = item.this if isinstance(item, exp.Ordered) else item
        return "quantile", arg, alpha
    lit = node.args.get("quantile") if isinstance(node, (exp.ApproxQuantile, exp.Quantile)) \
        else node.args.get("expression")
    extra = {k for k, v in node.args.items() if v not in (None, False, [], "")} - {
        "this", "quantile", "expression"}
    if extra:
        raise _refuse(f"{_snippet(node)} uses options that are not supported", node)
    num, den = alpha_fraction(_alpha(lit, node))
    return "quantile", node.this, num / den


def quantile_name(function: str, alpha: float | None, column: str) -> str:
    """Canonical output name: ``min_x``, ``max_x``, ``median_x``, ``quantile_90_x``, ``quantile_97_5_x``."""
    if function in ("min", "max"):
        return f"{function}_{column}"
    if alpha == 0.5:
        return f"median_{column}"
    pct = f"{alpha * 100:.4f}".rstrip("0").rstrip(".").replace(".", "_")
    return f"quantile_{pct}_{column}"


def quantile_sql(function: str, alpha: float | None, column_sql: str) -> str:
    """Canonical SQL text of a quantile aggregate (``MIN(x)``, ``MEDIAN(x)``, ``QUANTILE_CONT(x, 0.9)``)."""
    if function == "min":
        return f"MIN({column_sql})"
    if function == "max":
        return f"MAX({column_sql})"
    if alpha == 0.5:
        return f"MEDIAN({column_sql})"
    return f"QUANTILE_CONT({column_sql}, {alpha!r})"


def _one_group_rows(ctes: list[str], rows: str, u: str, g: list[str], salt_sql: str) -> str:
    """k = 1 (issue 25 item 3): the rows of each unit's groups whose ``hash(unit, keys, salt)``
    is the unit's smallest (CTEs ``__dpg_hashed``, ``__dpg_pick``, ``__dpg_cand`` appended to
    ``ctes``; returns the name of the last).

    The k-group window ranks every (unit, group) pair by ``(hash, keys)`` and keeps the first;
    that pair has the unit's smallest hash, so it is among these rows, and they hold only pairs
    with that same hash (almost always one pair: a tie has probability ≈ n²/2³² for a unit in n
    groups). Ranking the remaining pairs by the keys alone (``__dpg_unit_groups``) then keeps the
    same pair as ranking all pairs by (hash, keys): the same rows for the same salt. NULL hashes
    (a NULL selected key) compare as equal (``IS NOT DISTINCT FROM``) and come last, as NULLs do
    in the window's order."""
    h, mh = q(_PREFIX + "h"), q(_PREFIX + "mh")
    hashed, pick, cand = q(_PREFIX + "hashed"), q(_PREFIX + "pick"), q(_PREFIX + "cand")
    ctes.append(f"{hashed} AS (\n  SELECT *, hash({', '.join([u] + g + [salt_sql])}) AS {h} FROM {rows}\n)")
    ctes.append(f"{pick} AS (\n  SELECT {u}, MIN({h}) AS {mh} FROM {hashed} GROUP BY {u}\n)")
    cols = ", ".join(f"{hashed}.{x}" for x in [u] + g + [q(_PREFIX + "b")])
    ctes.append(f"{cand} AS (\n  SELECT {cols} FROM {hashed} JOIN {pick} ON {hashed}.{u} = {pick}.{u} "
                f"AND {hashed}.{h} IS NOT DISTINCT FROM {pick}.{mh}\n)")
    return cand


def histogram_sql(plan: QueryPlan, policy: DatasetPolicy, column: str, *, salt: int | str) -> str:
    """DuckDB SQL of the bounded per-(group, candidate) counts of one quantile column.

    Result columns: the group keys (declared names, in public-key order), ``__dpg_r``
    (the group's ordinal, 0-based), ``__dpg_b`` (candidate index, −1 for an empty
    group) and ``__dpg_n`` (kept values at that candidate), ordered by (r, b).
    """
    table = policy.table(plan.table)
    col = table.column(column)
    grid: Grid = grid_for(col)
    salt_sql = str(int(salt)) if not isinstance(salt, str) else salt
    src = lambda c: f"{q(_SRC)}.{q(c)}"  # noqa: E731
    keys = [plan.key_column(table, c) for c in plan.group_by]  # narrowed by the WHERE, if it does
    g = [q(f"{_PREFIX}g{i}") for i in range(len(keys))]
    u, b = q(_PREFIX + "u"), q(_PREFIX + "b")
    m, k = table.max_rows_per_unit, table.max_groups_per_unit
    fp = _fixed_point(col, src(col.name))
    half = grid.stride // 2
    bin_sql = f"LEAST(({fp} - ({grid.lo}) + {half}) // {grid.stride}, {grid.size - 1})"
    select = ([] if table.record_level else [f"{src(table.privacy_unit)} AS {u}"])
    select += [f"{src(c.name)} AS {g[i]}" for i, c in enumerate(keys)]
    select.append(f"{bin_sql} AS {b}")
    conditions = [f"({fp}) IS NOT NULL"]
    if not table.record_level:
        conditions.append(f"{src(table.privacy_unit)} IS NOT NULL")
    where = _where(plan)
    if where is not None:
        conditions.append(f"({where})")
    conditions += [_key_filter(c, src(c.name)) for c in keys if c.name not in plan.selected_keys]
    ctes = [f"{q(_PREFIX + 'rows')} AS (\n  SELECT {', '.join(select)}\n  FROM {table.relation} AS "
            f"{q(_SRC)}\n  WHERE {' AND '.join(conditions)}\n)"]
    source = q(_PREFIX + "rows")
    if not table.record_level:
        # per (unit, group): the row count c, and at most k groups per unit (salted hash);
        # then the rows of pairs with c <= m pass as they are, and only pairs with c > m
        # rank their rows (the expensive window runs on those alone)
        ug, j, c = q(_PREFIX + "unit_groups"), q(_PREFIX + "joined"), q(_PREFIX + "c")
        k_chosen = bool(keys) and bool(plan.selected_keys or k < plan.key_combinations(table))
        if k_chosen and k == 1:  # issue 25 item 3: the one group without a window over every pair
            source = _one_group_rows(ctes, source, u, g, salt_sql)
        ugs = f"SELECT {', '.join([u] + g)}, COUNT(*) AS {c} FROM {source} GROUP BY {', '.join([u] + g)}"
        if k_chosen:
            order = ", ".join([f"hash({', '.join([u] + g + [salt_sql])})"] + g) if k > 1 else ", ".join(g)
            ugs += f"\n  QUALIFY row_number() OVER (PARTITION BY {u} ORDER BY {order}) <= {k}"
        ctes.append(f"{ug} AS (\n  {ugs}\n)")
        nullable = {g[i] for i, c in enumerate(keys) if c.name in plan.selected_keys}  # NULL is a selected key
        on = " AND ".join(f"{source}.{x} {'IS NOT DISTINCT FROM' if x in nullable else '='} {ug}.{x}"
                          for x in [u] + g)
        ctes.append(f"{j} AS (\n  SELECT {', '.join(f'{source}.{x}' for x in [u] + g + [b])}, {ug}.{c} "
                    f"FROM {source} JOIN {ug} ON {on}\n)")
        part = ", ".join([u] + g)
        kept = (f"SELECT {', '.join(g + [b])} FROM {j} WHERE {c} <= {m}\n  UNION ALL\n  "
                f"SELECT {', '.join(g + [b])} FROM (SELECT * FROM {j} WHERE {c} > {m}\n    QUALIFY "
                f"row_number() OVER (PARTITION BY {part} ORDER BY hash({u}, {b}, {salt_sql}), {b}) <= {m}) AS "
                f"{q(_PREFIX + 'over_m')}")
        ctes.append(f"{q(_PREFIX + 'kept')} AS (\n  {kept}\n)")
        source = q(_PREFIX + "kept")
    counts = f"SELECT {', '.join(g + [b])}, COUNT(*) AS {q(_PREFIX + 'n')} FROM {source} GROUP BY {', '.join(g + [b])}"
    ctes.append(f"{q(_PREFIX + 'counts')} AS (\n  {counts}\n)")
    cnt = q(_PREFIX + "counts")
    r, n = q(_PREFIX + "r"), q(_PREFIX + "n")
    if plan.selected_keys:  # issue 21 item 8: the candidates' counts; the selected ones are kept in Python
        key_outs = [f"CAST({g[i]} AS {c.duckdb_type}) AS {q(c.name)}" for i, c in enumerate(keys)]
        final = (f"SELECT {', '.join(key_outs)}, {b}, {n}\nFROM {cnt}\n"
                 f"ORDER BY {', '.join(f'{x} NULLS LAST' for x in g)}, {b} NULLS LAST")
    elif not keys:
        final = (f"SELECT 0 AS {r}, COALESCE({cnt}.{b}, -1) AS {b}, COALESCE({cnt}.{n}, 0) AS {n}\n"
                 f"FROM (SELECT 1) AS {q(_PREFIX + 'one')}(x) LEFT JOIN {cnt} ON TRUE\nORDER BY {b}")
    else:
        relations, refs, orders = _key_relations(plan, table, keys)
        key_outs = [f"CAST({refs[i]} AS {c.duckdb_type}) AS {q(c.name)}" for i, c in enumerate(keys)]
        joins = " CROSS JOIN ".join(relations)
        on = " AND ".join(f"{refs[i]} = {cnt}.{g[i]}" for i in range(len(keys)))
        order = ", ".join(orders)
        final = (f"SELECT {', '.join(key_outs)}, dense_rank() OVER (ORDER BY {order}) - 1 AS {r}, "
                 f"COALESCE({cnt}.{b}, -1) AS {b}, COALESCE({cnt}.{n}, 0) AS {n}\n"
                 f"FROM {joins}\nLEFT JOIN {cnt} ON {on}\nORDER BY {r}, {b}")
    return "WITH " + ",\n".join(ctes) + "\n" + final


def histogram_query(plan: QueryPlan, policy: DatasetPolicy, column: str, *, salt: int) -> exp.Select:
    """:func:`histogram_sql` as a sqlglot tree (what the gateway hands an engine; no parse).

    Marked with the renderer's flags (:func:`dpgate.rendered.mark`): ``per_unit`` when the rows are a
    per-unit table's (engines that cannot run one refuse it); never ``unit_unique``.
    """
    from dpgate.render.histogram import histogram_tree
    from dpgate.sql.sources import plan_source

    source = plan_source(plan, policy)
    tree = histogram_tree(plan, policy, column, exp.Literal.number(str(int(salt))), join_tree=source.rows())
    return mark(tree, unit_unique=False, per_unit=bool(getattr(source.table, "per_unit", False)))


def histogram_sql_template(plan: QueryPlan, policy: DatasetPolicy, column: str) -> str:
    """:func:`histogram_sql` with the salt shown as ``<salt>`` (for explain)."""
    return histogram_sql(plan, policy, column, salt=SALT_PLACEHOLDER)
