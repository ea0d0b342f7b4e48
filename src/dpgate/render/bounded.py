"""The bounded query of a plan as a sqlglot tree (issue 20 step 4).

The same statement as the text form of :mod:`dpgate.sql.bound` (the module docstring there
describes the four steps and why each bound holds), built node by node, so that no engine
parses generated SQL: ``sqlglot.parse_one(bounded_sql_text(...), read="duckdb")`` equals
:func:`bounded_tree` (tests/test_render_trees.py checks it over the golden queries).
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from dpgate.policy import ColumnPolicy, TablePolicy
from dpgate.render import nodes as n
from dpgate.sql.bind import bind_value
from dpgate.sql.expr import total_sql, value_sql
from dpgate.sql.plan import QueryPlan
from dpgate.sql.primitives import fragment as kind_fragment, primitive_kind, sum_clamp

_PREFIX = "__dpg_"
_SRC = _PREFIX + "src"
UNIQUE_ROWS_CTE = _PREFIX + "unique_rows"
#: Column of a selecting query's result: the candidate's number of distinct units.
UNITS_COLUMN = "__dpg_units"


def _src(c: str) -> exp.Column:
    return n.col(c, _SRC)


def row_tree(canonical: exp.Expression | str, qualifier: str | None = _SRC) -> exp.Expression:
    """:func:`dpgate.sql.bound.row_sql` as a tree, from the plan's tree (``plan.where_tree()``,
    ``plan.key_tree(key)``: :class:`~dpgate.sql.plan.PlanTrees`; text is parsed)."""
    tree = sqlglot.parse_one(canonical, read="duckdb") if isinstance(canonical, str) else canonical
    ref = lambda name: exp.column(name, table=qualifier, quoted=True)  # noqa: E731
    return total_sql(tree, ref)


def _derived_value(tree: exp.Expression, table: TablePolicy) -> exp.Expression:
    e = bind_value(tree, table)
    return exp.Paren(this=value_sql(e, _src))


def _fixed_point(c: ColumnPolicy, ref) -> exp.Expression:
    lo, hi = c.fixed_point_bounds
    res = c.resolution
    if c.type == "int" and res == 1:
        return n.case_when(n.not_null(ref()), n.least(n.greatest(ref(), n.num(lo)), n.num(hi)))
    if res == 1:
        scaled = ref()
    else:
        ctype = "int" if c.type == "int" else "float"
        clamped = n.least(n.greatest(ref(), n.lit(c.lower, ctype)), n.lit(c.upper, ctype))
        scaled = exp.Div(this=clamped, expression=n.lit(res, "float"), typed=False, safe=False)
    value: exp.Expression = n.cast(
        n.least(n.greatest(exp.Round(this=scaled), n.lit(lo, "float")), n.lit(hi, "float")), "BIGINT")
    if max(abs(lo), abs(hi)) > 2**53:
        value = n.least(n.greatest(value, n.num(lo)), n.num(hi))
    guard = n.anonymous("isfinite", ref()) if c.type == "float" else n.not_null(ref())
    return n.case_when(guard, value)


def _present(c: ColumnPolicy, ref) -> exp.Expression:
    cond = n.anonymous("isfinite", ref()) if c.type == "float" else n.not_null(ref())
    return n.case_when(cond, n.num(1))


def _key_filter(c: ColumnPolicy, ref) -> exp.Expression:
    keys = c.public_keys
    if isinstance(keys, range):
        return exp.Between(this=ref(), low=n.num(keys.start), high=n.num(keys.stop - 1))
    values = [k for k in keys if k is not None]
    test: exp.Expression = (exp.In(this=ref(), expressions=[n.lit(k, c.type) for k in values])
                            if values else exp.Boolean(this=False))
    if len(values) < len(keys):
        test = exp.Paren(this=exp.Or(this=test, expression=n.is_null(ref())))
    return test


def _has_null(c: ColumnPolicy) -> bool:
    return not isinstance(c.public_keys, range) and None in c.public_keys


def _input_filter(c: ColumnPolicy, ref) -> exp.Expression:
    if c.public_keys is not None:
        inside = _key_filter(c, ref)
    elif c.type == "int" and c.bounded:
        inside = exp.Between(this=ref(), low=n.num(int(c.lower)), high=n.num(int(c.upper)))
    elif c.type in ("date", "timestamp") and c.time_bounded:
        t = c.type.upper()
        lo = c.time_lower.isoformat(sep=" ") if t == "TIMESTAMP" else c.time_lower.isoformat()
        hi = c.time_upper.isoformat(sep=" ") if t == "TIMESTAMP" else c.time_upper.isoformat()
        inside = exp.Between(this=ref(), low=n.cast(exp.Literal.string(lo), t),
                             high=n.cast(exp.Literal.string(hi), t))
    else:
        return exp.Boolean(this=True)
    return exp.Paren(this=exp.Or(this=n.is_null(ref()), expression=inside))


def _key_relation(c: ColumnPolicy, i: int) -> exp.Expression:
    o, g, k = f"{_PREFIX}o{i}", f"{_PREFIX}g{i}", f"{_PREFIX}k{i}"
    keys = c.public_keys
    if isinstance(keys, range):
        rng = exp.GenerateSeries(start=n.num(keys.start), end=n.num(keys.stop), is_end_exclusive=True)
        sel = n.select([n.alias(exp.column("range"), g),
                        n.alias(exp.Sub(this=exp.column("range"), expression=n.num(keys.start)), o)],
                       exp.Table(this=rng))
        return n.subquery(sel, k)
    rows = [exp.Tuple(expressions=[n.num(j), n.lit(v, c.type)]) for j, v in enumerate(keys)]
    return exp.Values(expressions=rows, alias=exp.TableAlias(this=n.ident(k), columns=[n.ident(o), n.ident(g)]))


def key_relations(plan: QueryPlan, table: TablePolicy, keys: list[ColumnPolicy],
                  names: tuple[str, ...] | None = None):
    """:func:`dpgate.sql.bound._key_relations` as trees: (relations, ref builders, order builders)."""
    names = plan.group_by if names is None else names
    index = [plan.group_by.index(x) for x in names]
    relations: list[exp.Expression] = []
    refs: dict[int, object] = {}
    order: list[object] = []
    for block, values in plan.key_domain(table, names):
        positions = [index[b] for b in block]
        i = positions[0]
        k, o = f"{_PREFIX}k{i}", f"{_PREFIX}o{i}"
        if len(positions) == 1:
            relations.append(_key_relation(keys[i], i))
        else:
            cols = [f"{_PREFIX}g{j}" for j in positions]
            if values:
                rows = [exp.Tuple(expressions=[n.num(r)] + [n.lit(v, keys[j].type) for v, j in zip(t, positions)])
                        for r, t in enumerate(values)]
                relations.append(exp.Values(expressions=rows, alias=exp.TableAlias(
                    this=n.ident(k), columns=[n.ident(o)] + [n.ident(x) for x in cols])))
            else:
                items = [n.alias(n.num(0), o)] + [n.alias(n.cast(exp.Null(), keys[j].duckdb_type), f"{_PREFIX}g{j}")
                                                   for j in positions]
                relations.append(n.subquery(n.select(items, where=exp.Boolean(this=False)), k))
        for j in positions:
            refs[j] = (lambda k=k, j=j: n.col(f"{_PREFIX}g{j}", k))
        order.append(lambda k=k, o=o: n.col(o, k))
    return relations, refs, order


def _hash_key(c: ColumnPolicy, ref: exp.Expression) -> exp.Expression:
    if c.type != "float":
        return ref
    return exp.Paren(this=exp.Case(this=ref, ifs=[exp.If(this=n.lit(v, "float"), true=n.num(j))
                                                  for j, v in enumerate(c.public_keys)]))


def _relation(table: TablePolicy, join_tree) -> exp.Expression:
    if join_tree is None:
        return n.table(table.name, table.dataset, _SRC)
    return n.subquery(join_tree, _SRC)


def _distinct_ctes(prims, distinct_of, g, m, salt, per_unit, rows_name, k_chosen=False):
    """:func:`dpgate.sql.bound._distinct_ctes` as trees (one pass: the kept pairs' distinct values
    with their count ``__dpg_nd``, the m-value window only where ``__dpg_nd > m``)."""
    out = []
    u, parts, x, nd = _PREFIX + "u", _PREFIX + "partials", _PREFIX + "x", _PREFIX + "nd"
    for j, p in enumerate(prims):
        d = distinct_of[p.column]
        dd, dv, dc, pid = f"{_PREFIX}dd{j}", f"{_PREFIX}dv{j}", f"{_PREFIX}dc{j}", _PREFIX + p.id
        if not per_unit:
            items = [n.col(c) for c in g] + [n.alias(n.count(exp.Distinct(expressions=[n.col(d)])), pid)]
            out.append((dc, n.select(items, n.table(rows_name), group=[n.col(c) for c in g])))
            continue
        ug = [u] + g
        r_ug = lambda: [n.col(c, rows_name) for c in ug]  # noqa: E731
        joins = []
        if k_chosen:
            on = n.conjunction([exp.EQ(this=n.col(u, rows_name), expression=n.col(u, parts))]
                               + [exp.NullSafeEQ(this=n.col(c, rows_name), expression=n.col(c, parts)) for c in g])
            joins.append(exp.Join(this=n.table(parts), on=on))
        count = exp.Window(this=n.count(), partition_by=r_ug(), over="OVER")
        out.append((dd, n.select(r_ug() + [n.col(d, rows_name), n.alias(count, nd)], n.table(rows_name), joins=joins,
                                 where=n.not_null(n.col(d, rows_name)), group=r_ug() + [n.col(d, rows_name)])))
        window = exp.Window(this=exp.RowNumber(), partition_by=[n.col(c) for c in ug], order=exp.Order(expressions=[
            exp.Ordered(this=n.anonymous("hash", *[n.col(c) for c in ug + [d]], salt()), nulls_first=False),
            exp.Ordered(this=n.col(d), nulls_first=False)]), over="OVER")
        over = n.select([exp.Star()], n.table(dd), where=exp.GT(this=n.col(nd), expression=n.num(m)),
                        qualify=exp.LTE(this=window, expression=n.num(m)))
        kept = exp.Union(
            this=n.select([n.col(c) for c in ug] + [n.alias(n.col(d), x)], n.table(dd),
                          where=exp.LTE(this=n.col(nd), expression=n.num(m))),
            distinct=False,
            expression=n.select([n.col(c) for c in ug] + [n.alias(n.col(d), x)],
                                n.subquery(over, _PREFIX + "over_m")))
        out.append((dv, kept))
        items = [n.col(c) for c in g] + [n.alias(n.count(exp.Distinct(expressions=[n.col(x)])), pid)]
        out.append((dc, n.select(items, n.table(dv), group=[n.col(c) for c in g])))
    return out


def _join_distinct(prims, g):
    g0 = _PREFIX + "groups0"
    cols: list[exp.Expression] = [exp.Column(this=exp.Star(), table=n.ident(g0))]
    joins = []
    for j, p in enumerate(prims):
        dc, pid = f"{_PREFIX}dc{j}", _PREFIX + p.id
        cols.append(n.alias(n.coalesce0(n.col(pid, dc)), pid))
        on = (n.conjunction([exp.NullSafeEQ(this=n.col(c, g0), expression=n.col(c, dc)) for c in g])
              if g else exp.Boolean(this=True))
        joins.append(exp.Join(this=n.table(dc), on=on, side="LEFT"))
    return _PREFIX + "groups", n.select(cols, n.table(g0), joins=joins)


def _selection_final(plan: QueryPlan, keys: list[ColumnPolicy], public) -> exp.Select:
    grp, cand = _PREFIX + "groups", _PREFIX + "cand"
    g = [f"{_PREFIX}g{i}" for i in range(len(keys))]
    relations, refs, public_order = public
    out, on, order = [], [], []
    for i, c in enumerate(keys):
        if c.name in plan.selected_keys:
            out.append(n.alias(n.cast(n.col(g[i], cand), c.duckdb_type), c.name))
            on.append(exp.NullSafeEQ(this=n.col(g[i], cand), expression=n.col(g[i], grp)))
            order.append(n.col(g[i], cand))
        else:
            out.append(n.alias(n.cast(refs[i](), c.duckdb_type), c.name))
            on.append(exp.EQ(this=refs[i](), expression=n.col(g[i], grp)))
    order += [o() for o in public_order]
    out += [n.alias(n.coalesce0(n.col(_PREFIX + p.id, grp)), p.id) for p in plan.primitives]
    out.append(n.alias(n.col(_PREFIX + "n", cand), UNITS_COLUMN))
    joins = [exp.Join(this=r, kind="CROSS") for r in relations]
    joins.append(exp.Join(this=n.table(grp), on=n.conjunction(on), side="LEFT"))
    return n.select(out, n.table(cand), joins=joins, order=order)


def _rows_cte(plan: QueryPlan, table: TablePolicy, keys: list, key_ref: list, g: list[str],
              join_tree: exp.Expression | None) -> tuple[exp.Select, dict[str, str], dict[str, str]]:
    """Step 1: one row per input row — unit, group keys, fixed-point values — filtered by WHERE
    and the key filters; returns (the SELECT, value column of each summed/counted column, of each
    COUNT(DISTINCT) column)."""
    u = _PREFIX + "u"
    value_of: dict[str, str] = {}
    rows_items: list[exp.Expression] = []
    if not table.record_level:
        rows_items.append(n.alias(_src(table.privacy_unit), u))
    rows_items += [n.alias(key_ref[i](), g[i]) for i in range(len(keys))]
    summed = {p.column for p in plan.primitives if primitive_kind(p.kind).row_value == "fixed_point"}
    counted = {p.column for p in plan.primitives if primitive_kind(p.kind).row_value == "present"}
    declared = list(table.columns)
    derived = [v.expression for v in plan.values]
    order_key = lambda x: (0, declared.index(x)) if x in declared else (1, derived.index(x))  # noqa: E731
    for j, name in enumerate(sorted(summed | counted, key=order_key)):
        cp = plan.column_policy(table, name)
        v = f"{_PREFIX}v{j}"
        if name in declared:
            ref = lambda name=name: _src(name)  # noqa: E731
        else:
            dv = _derived_value(plan.value_tree(name), table)
            ref = lambda dv=dv: dv.copy()  # noqa: E731
        rows_items.append(n.alias(_fixed_point(cp, ref) if name in summed else _present(cp, ref), v))
        value_of[name] = v
    distinct_of: dict[str, str] = {}
    for j, name in enumerate(dict.fromkeys(p.column for p in plan.primitives
                                                 if primitive_kind(p.kind).row_value == "raw")):
        distinct_of[name] = f"{_PREFIX}d{j}"
        rows_items.append(n.alias(_src(name), distinct_of[name]))
    if not rows_items:
        rows_items.append(n.alias(n.num(1), _PREFIX + "one"))
    conditions: list[exp.Expression] = []
    if not table.record_level:
        conditions.append(n.not_null(_src(table.privacy_unit)))
    if plan.where is not None:
        conditions.append(exp.Paren(this=row_tree(plan.where_tree())))
    conditions += [_key_filter(c, key_ref[i]) for i, c in enumerate(keys) if c.name not in plan.selected_keys]
    for key in plan.computed_keys:
        if key.rule == "enumerated":
            conditions += [_input_filter(table.column(x), lambda x=x: _src(x)) for x in key.inputs]
    rows = n.select(rows_items, _relation(table, join_tree),
                    where=n.conjunction(conditions) if conditions else None)
    return rows, value_of, distinct_of


def _primitive_columns(plan: QueryPlan, table: TablePolicy, value_of: dict[str, str], *, per_unit: bool
                       ) -> tuple[list[exp.Expression], list[exp.Expression]]:
    """Each primitive's per-(unit, group) clipped partial (step 2) and per-group total (step 3)."""
    m = table.max_rows_per_unit
    part_cols: list[exp.Expression] = []
    group_cols: list[exp.Expression] = []
    for p in plan.primitives:
        pid = f"{_PREFIX}{p.id}"
        kind = primitive_kind(p.kind)
        lo, hi = plan.column_policy(table, p.column).fixed_point_bounds if kind.bounded else (0, 0)
        fragment = kind_fragment(kind, value_of.get(p.column), m, lo, hi, sum_clamp(table, p))
        if fragment is None:  # COUNT(DISTINCT col): its own CTEs, joined to the groups
            continue
        row, clip = fragment.row, fragment.clip
        if clip is None:  # COUNT(DISTINCT unit): the group aggregate, per unit or not
            group_cols.append(n.alias(row, pid))
            continue
        if not per_unit:
            group_cols.append(n.alias(row, pid))
        else:
            part_cols.append(n.alias(clip, pid))
            group_cols.append(n.alias(exp.Sum(this=n.col(pid)), pid))
    return part_cols, group_cols


def _released_final(plan: QueryPlan, table: TablePolicy, keys: list, g: list[str]) -> exp.Select:
    """The final SELECT over the per-group totals: every released key combination (left join), zero-filled."""
    grp = _PREFIX + "groups"
    outs = [n.alias(n.coalesce0(n.col(_PREFIX + p.id, grp)), p.id) for p in plan.primitives]
    if not keys:
        return n.select(outs, n.table(grp))
    relations, refs, orders = key_relations(plan, table, keys)
    key_outs = [n.alias(n.cast(refs[i](), c.duckdb_type), c.name) for i, c in enumerate(keys)]
    on = n.conjunction([(exp.NullSafeEQ if _has_null(c) else exp.EQ)(this=refs[i](), expression=n.col(g[i], grp))
                        for i, c in enumerate(keys)])
    joins = [exp.Join(this=r, kind="CROSS") for r in relations[1:]]
    joins.append(exp.Join(this=n.table(grp), on=on, side="LEFT"))
    return n.select(key_outs + outs, relations[0], joins=joins, order=[o() for o in orders])


def _keys(plan: QueryPlan, table: TablePolicy) -> tuple[list[ColumnPolicy], list, list[str]]:
    """The plan's group keys: their columns, a reference to each (a computed key's tree), their names."""
    keys = [plan.key_column(table, c) for c in plan.group_by]
    key_trees = {c.name: row_tree(plan.key_tree(plan.computed_key(c.name)))
                 for c in keys if plan.computed_key(c.name) is not None}
    key_ref = [(lambda c=c: key_trees[c.name].copy()) if c.name in key_trees else (lambda c=c: _src(c.name))
               for c in keys]
    return keys, key_ref, [f"{_PREFIX}g{i}" for i in range(len(keys))]


def rows_tree(plan: QueryPlan, table: TablePolicy, join_tree: exp.Expression | None = None
              ) -> tuple[exp.Select, list[str]]:
    """Step 1 of the bounded query alone (:func:`_rows_cte`: one row per input row with its unit
    ``__dpg_u`` and group keys, filtered by WHERE and the key filters) and the key columns' names."""
    keys, key_ref, g = _keys(plan, table)
    return _rows_cte(plan, table, keys, key_ref, g, join_tree)[0], g


def rows_and_values(plan: QueryPlan, table: TablePolicy, join_tree: exp.Expression | None = None
                    ) -> tuple[exp.Select, list[str], dict[str, str]]:
    """As :func:`rows_tree`, with the value column (``__dpg_v<j>``) of each summed or counted column."""
    keys, key_ref, g = _keys(plan, table)
    rows, value_of, _ = _rows_cte(plan, table, keys, key_ref, g, join_tree)
    return rows, g, value_of


def bounded_tree(plan: QueryPlan, table: TablePolicy, salt: exp.Expression, *, per_unit: bool,
                 join_tree: exp.Expression | None = None) -> exp.Select:
    """The bounded query (see :func:`dpgate.sql.bound.bounded_sql`) of a count/sum plan.

    In steps: the rows (:func:`_rows_cte`), the per-unit partials with the k-group choice when
    ``per_unit``, the per-group totals (:func:`_primitive_columns`), COUNT(DISTINCT) CTEs, then
    the selection candidates or the released key combinations (:func:`_released_final`).

    Args:
        plan: the plan without its quantile primitives. table: its table's policy (a joined
            table's relation given as ``join_tree``). salt: the salt literal (or placeholder).
        per_unit: whether step 2 runs (:func:`dpgate.sql.bound.aggregates_per_unit`).
    """
    keys, key_ref, g = _keys(plan, table)
    gc = lambda: [n.col(x) for x in g]  # noqa: E731
    m, k = table.max_rows_per_unit, table.max_groups_per_unit
    record_level = table.record_level
    u = _PREFIX + "u"
    k_chosen = per_unit and bool(keys) and bool(plan.selected_keys or k < plan.key_combinations(table))
    rows, value_of, distinct_of = _rows_cte(plan, table, keys, key_ref, g, join_tree)
    part_cols, group_cols = _primitive_columns(plan, table, value_of, per_unit=per_unit)

    rows_name = _PREFIX + "rows" if per_unit or record_level else UNIQUE_ROWS_CTE
    ctes: list[tuple[str, exp.Expression]] = [(rows_name, rows)]
    source = rows_name
    if per_unit:
        qualify = None
        if k_chosen:
            hashed = [_hash_key(c, n.col(g[i])) for i, c in enumerate(keys)]
            window = exp.Window(this=exp.RowNumber(), partition_by=[n.col(u)], order=exp.Order(
                expressions=[exp.Ordered(this=n.anonymous("hash", n.col(u), *hashed, salt.copy()), nulls_first=False)]
                + [exp.Ordered(this=c, nulls_first=False) for c in gc()]), over="OVER")
            qualify = exp.LTE(this=window, expression=n.num(k))
        ctes.append((_PREFIX + "partials", n.select([n.col(u)] + gc() + part_cols, n.table(source),
                                                    group=[n.col(u)] + gc(), qualify=qualify)))
        source = _PREFIX + "partials"
    if not g + group_cols:
        group_cols.append(n.alias(n.count(), _PREFIX + "one"))
    groups = n.select(gc() + group_cols, n.table(source), group=gc() if keys else ())
    distinct = [p for p in plan.primitives if primitive_kind(p.kind).row_value == "raw"]
    if distinct:
        ctes.append((_PREFIX + "groups0", groups))
        ctes += _distinct_ctes(distinct, distinct_of, g, m, lambda: salt.copy(), per_unit, rows_name, k_chosen)
        ctes.append(_join_distinct(distinct, g))
    else:
        ctes.append((_PREFIX + "groups", groups))
    if plan.selected_keys:
        sel = [n.col(f"{_PREFIX}g{plan.group_by.index(c)}") for c in plan.selected_keys]
        cnt = n.count() if record_level else n.count(exp.Distinct(expressions=[n.col(u)]))
        ctes.append((_PREFIX + "cand", n.select(sel + [n.alias(cnt, _PREFIX + "n")], n.table(source),
                                                group=[x.copy() for x in sel])))
        final = _selection_final(plan, keys, key_relations(plan, table, keys, plan.public_group_by))
        return n.with_ctes(ctes, final)
    return n.with_ctes(ctes, _released_final(plan, table, keys, g))
