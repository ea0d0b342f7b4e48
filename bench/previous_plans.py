"""The bounded statements as they were rendered before issue 25 items 3 and 4 (main at 69f457f).

Frozen copies, verbatim, of the two renderings those items replaced, kept for two uses:

* ``bench/distinct_bench.py`` and ``bench/quantile_bench.py`` time them next to the current
  plans in one interleaved run (the "before" column of docs/BENCHMARKS.md, issue 25 section);
* ``tests/test_plan_equivalence.py`` checks on hypothesis data that the current plans release
  the same pre-noise vectors for the same salt.

Not used by the gateway.
"""

from __future__ import annotations

from dpgate.policy import DatasetPolicy, quote_identifier as q
from dpgate.quantiles import Grid, grid_for
from dpgate.sql.bound import _fixed_point, _key_filter, _key_relations, _where
from dpgate.sql.plan import QueryPlan

_PREFIX = "__dpg_"
_SRC = _PREFIX + "src"


def previous_distinct_ctes(prims, distinct_of, g, m, salt, per_unit, rows_name, k_chosen=False):
    """``dpgate.sql.bound._distinct_ctes`` before issue 25 item 4 (main at 69f457f), verbatim:
    every (unit, group) pair's values ranked by the m-value window, then joined to the k-chosen
    pairs."""
    out = []
    u = q(_PREFIX + "u")
    rows, parts = q(rows_name), q(_PREFIX + "partials")
    for j, p in enumerate(prims):
        d = distinct_of[p.column]
        dv, dc, x, pid = (q(f"{_PREFIX}dv{j}"), q(f"{_PREFIX}dc{j}"), q(_PREFIX + "x"),
                          q(_PREFIX + p.id))
        group = f"\n  GROUP BY {', '.join(g)}" if g else ""
        if not per_unit:
            out.append(f"{dc} AS (\n  SELECT {', '.join(g + [f'COUNT(DISTINCT {d}) AS {pid}'])}\n"
                       f"  FROM {rows}{group}\n)")
            continue
        ug = [u] + g
        out.append(
            f"{dv} AS (\n  SELECT {', '.join(ug)}, {d} AS {x}\n  FROM {rows}\n  WHERE {d} IS NOT NULL\n"
            f"  GROUP BY {', '.join(ug + [d])}\n"
            f"  QUALIFY row_number() OVER (PARTITION BY {', '.join(ug)} ORDER BY "
            f"hash({', '.join(ug + [d, salt])}), {d}) <= {m}\n)")
        on = " AND ".join([f"{dv}.{u} = {parts}.{u}"]
                          + [f"{dv}.{c} IS NOT DISTINCT FROM {parts}.{c}" for c in g])
        sel = [f"{dv}.{c}" for c in g] + [f"COUNT(DISTINCT {dv}.{x}) AS {pid}"]
        grp = f"\n  GROUP BY {', '.join(f'{dv}.{c}' for c in g)}" if g else ""
        out.append(f"{dc} AS (\n  SELECT {', '.join(sel)}\n  FROM {dv} JOIN {parts} ON {on}{grp}\n)")
    return out


def previous_histogram_sql(plan: QueryPlan, policy: DatasetPolicy, column: str, *, salt: int | str) -> str:
    """``dpgate.sql.quantile.histogram_sql`` before issue 25 item 3 (main at 69f457f), verbatim:
    the k-group window over every (unit, group) pair for every k.

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
        ugs = f"SELECT {', '.join([u] + g)}, COUNT(*) AS {c} FROM {source} GROUP BY {', '.join([u] + g)}"
        if keys and (plan.selected_keys or k < plan.key_combinations(table)):
            order = ", ".join([f"hash({', '.join([u] + g + [salt_sql])})"] + g)
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
