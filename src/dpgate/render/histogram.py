"""The bounded histogram of one quantile column as a sqlglot tree (issue 20 step 4).

The statement of :func:`dpgate.sql.quantile.histogram_sql` (its module docstring describes
the steps), built node by node: ``sqlglot.parse_one(histogram_sql(...), read="duckdb")``
equals :func:`histogram_tree` (tests/test_render_trees.py).
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.policy import DatasetPolicy
from dpgate.quantiles import Grid, grid_for
from dpgate.render import nodes as n
from dpgate.render.bounded import _fixed_point, _key_filter, _relation, _src, key_relations, row_tree
from dpgate.sql.plan import QueryPlan

_PREFIX = "__dpg_"


def _window(func: exp.Expression, partition: list[str], order: list[exp.Expression]) -> exp.Window:
    node = exp.Window(this=func, order=exp.Order(expressions=[exp.Ordered(this=o, nulls_first=False)
                                                            for o in order]), over="OVER")
    if partition:
        node.set("partition_by", [n.col(c) for c in partition])
    return node


def _one_group_rows(ctes: list, rows: str, u: str, g: list[str], b: str, salt: exp.Expression) -> str:
    """:func:`dpgate.sql.quantile._one_group_rows` as trees (k = 1: the rows of each unit's
    groups with its smallest group hash)."""
    h, mh = _PREFIX + "h", _PREFIX + "mh"
    hashed, pick, cand = _PREFIX + "hashed", _PREFIX + "pick", _PREFIX + "cand"
    ctes.append((hashed, n.select([exp.Star(), n.alias(n.anonymous("hash", *[n.col(x) for x in [u] + g], salt.copy()), h)],
                                  n.table(rows))))
    ctes.append((pick, n.select([n.col(u), n.alias(exp.Min(this=n.col(h)), mh)], n.table(hashed), group=[n.col(u)])))
    on = n.conjunction([exp.EQ(this=n.col(u, hashed), expression=n.col(u, pick)),
                        exp.NullSafeEQ(this=n.col(h, hashed), expression=n.col(mh, pick))])
    ctes.append((cand, n.select([n.col(x, hashed) for x in [u] + g + [b]], n.table(hashed),
                                joins=[exp.Join(this=n.table(pick), on=on)])))
    return cand


def histogram_tree(plan: QueryPlan, policy: DatasetPolicy, column: str, salt: exp.Expression,
                   join_tree: exp.Expression | None = None) -> exp.Select:
    """The per-(group, candidate) counts of ``column`` (columns as :func:`histogram_sql`'s)."""
    table = policy.table(plan.table)
    col = table.column(column)
    grid: Grid = grid_for(col)
    keys = [plan.key_column(table, c) for c in plan.group_by]
    g = [f"{_PREFIX}g{i}" for i in range(len(keys))]
    u, b = _PREFIX + "u", _PREFIX + "b"
    m, k = table.max_rows_per_unit, table.max_groups_per_unit

    def fp() -> exp.Expression:
        return _fixed_point(col, lambda: _src(col.name))

    half = grid.stride // 2
    shifted = exp.Add(this=exp.Sub(this=fp(), expression=exp.Paren(this=n.num(grid.lo))), expression=n.num(half))
    bin_node = n.least(exp.IntDiv(this=exp.Paren(this=shifted), expression=n.num(grid.stride)),
                       n.num(grid.size - 1))
    items = [] if table.record_level else [n.alias(_src(table.privacy_unit), u)]
    items += [n.alias(_src(c.name), g[i]) for i, c in enumerate(keys)]
    items.append(n.alias(bin_node, b))
    conditions: list[exp.Expression] = [n.not_null(exp.Paren(this=fp()))]
    if not table.record_level:
        conditions.append(n.not_null(_src(table.privacy_unit)))
    if plan.where is not None:
        conditions.append(exp.Paren(this=row_tree(plan.where_tree())))
    conditions += [_key_filter(c, lambda c=c: _src(c.name)) for c in keys if c.name not in plan.selected_keys]
    ctes: list[tuple[str, exp.Expression]] = [
        (_PREFIX + "rows", n.select(items, _relation(table, join_tree), where=n.conjunction(conditions)))]
    source = _PREFIX + "rows"
    cols = lambda names, t=None: [n.col(x, t) for x in names]  # noqa: E731
    if not table.record_level:
        ug, j, c = _PREFIX + "unit_groups", _PREFIX + "joined", _PREFIX + "c"
        qualify = None
        k_chosen = bool(keys) and bool(plan.selected_keys or k < plan.key_combinations(table))
        if k_chosen and k == 1:  # issue 25 item 3 (dpgate.sql.quantile._one_group_rows)
            source = _one_group_rows(ctes, source, u, g, b, salt)
        if k_chosen:
            order = ([n.anonymous("hash", *cols([u] + g), salt.copy())] if k > 1 else []) + cols(g)
            qualify = exp.LTE(this=_window(exp.RowNumber(), [u], order), expression=n.num(k))
        ctes.append((ug, n.select(cols([u] + g) + [n.alias(n.count(), c)], n.table(source),
                                  group=cols([u] + g), qualify=qualify)))
        nullable = {g[i] for i, c in enumerate(keys) if c.name in plan.selected_keys}  # NULL is a selected key
        on = n.conjunction([(exp.NullSafeEQ if x in nullable else exp.EQ)(this=n.col(x, source), expression=n.col(x, ug))
                            for x in [u] + g])
        ctes.append((j, n.select(cols([u] + g + [b], source) + [n.col(c, ug)], n.table(source),
                                 joins=[exp.Join(this=n.table(ug), on=on)])))
        window = _window(exp.RowNumber(), [u] + g, [n.anonymous("hash", n.col(u), n.col(b), salt.copy()), n.col(b)])
        over = n.select([exp.Star()], n.table(j), where=exp.GT(this=n.col(c), expression=n.num(m)),
                        qualify=exp.LTE(this=window, expression=n.num(m)))
        kept = exp.Union(this=n.select(cols(g + [b]), n.table(j), where=exp.LTE(this=n.col(c), expression=n.num(m))),
                         distinct=False,
                         expression=n.select(cols(g + [b]), n.subquery(over, _PREFIX + "over_m")))
        ctes.append((_PREFIX + "kept", kept))
        source = _PREFIX + "kept"
    counts = n.select(cols(g + [b]) + [n.alias(n.count(), _PREFIX + "n")], n.table(source), group=cols(g + [b]))
    cnt = _PREFIX + "counts"
    ctes.append((cnt, counts))
    r, nn = _PREFIX + "r", _PREFIX + "n"
    outs = [n.alias(exp.Coalesce(this=n.col(b, cnt), expressions=[n.num(-1)]), b),
            n.alias(n.coalesce0(n.col(nn, cnt)), nn)]
    if plan.selected_keys:  # issue 21 item 8: the candidates' counts (histogram_sql's step 4)
        key_outs = [n.alias(n.cast(n.col(g[i]), c.duckdb_type), c.name) for i, c in enumerate(keys)]
        final = n.select(key_outs + [n.col(b), n.col(nn)], n.table(cnt),
                         order=[n.col(x) for x in g] + [n.col(b)])
    elif not keys:
        one = exp.Subquery(this=exp.Select(expressions=[n.num(1)]), alias=exp.TableAlias(
            this=n.ident(_PREFIX + "one"), columns=[n.ident("x", quoted=False)]))
        final = n.select([n.alias(n.num(0), r)] + outs, one,
                         joins=[exp.Join(this=n.table(cnt), on=exp.Boolean(this=True), side="LEFT")],
                         order=[n.col(b)])
    else:
        relations, refs, orders = key_relations(plan, table, keys)
        key_outs = [n.alias(n.cast(refs[i](), c.duckdb_type), c.name) for i, c in enumerate(keys)]
        on = n.conjunction([exp.EQ(this=refs[i](), expression=n.col(g[i], cnt)) for i in range(len(keys))])
        rank = exp.Sub(this=_window(exp.DenseRank(), [], [o() for o in orders]), expression=n.num(1))
        joins = [exp.Join(this=x, kind="CROSS") for x in relations[1:]]
        joins.append(exp.Join(this=n.table(cnt), on=on, side="LEFT"))
        final = n.select(key_outs + [n.alias(rank, r)] + outs, relations[0], joins=joins,
                         order=[n.col(r), n.col(b)])
    return n.with_ctes(ctes, final)
