"""ORDER BY and LIMIT over released rows (:func:`order_by`, :func:`sort_rows`, :func:`limit_rows`).

Post-processing of released values ([DR14] Prop. 2.1): no privacy cost. Part of
:mod:`dpgate.postprocess.expressions`.

[DR14] C. Dwork, A. Roth, The Algorithmic Foundations of Differential Privacy, 2014.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from sqlglot import exp

from dpgate.postprocess.evaluator import _as_tree, _cells_of, _Evaluator
from dpgate.postprocess.vectors import Vector

# --- ORDER BY and LIMIT ------------------------------------------------------------------------------


def _ranks(v: Vector, index: np.ndarray) -> np.ndarray:
    """Dense ranks (0, 1, …) of the valid values of ``v`` at ``index``; −1 at NULLs."""
    sub_valid = v.valid[index]
    ranks = np.full(len(index), -1, dtype=np.int64)
    present = index[sub_valid]
    if len(present) == 0:
        return ranks
    _, inverse = np.unique(v.values[present], return_inverse=True)  # object arrays: one Python type
    ranks[sub_valid] = inverse.reshape(-1)
    return ranks


def sort_rows(keys: Sequence[tuple[Any, bool, bool]], order: np.ndarray | None = None, *,
              rows: int | None = None) -> np.ndarray:
    """Stable multi-key sort of row indices with SQL NULL placement.

    Args:
        keys: ``(values, descending, nulls_first)`` per ORDER BY item, most
            significant first; ``values`` is a :class:`Vector` or array over *all*
            rows (NULL = None/NaN).
        order: the row indices to sort (default: all rows, ``0..n-1``), e.g. the
            rows HAVING kept; ties keep this order.
        rows: number of rows when ``keys`` is empty and ``order`` is None.

    Returns:
        The indices of ``order`` rearranged (int64 array).
    """
    vectors = [(Vector.of(v), bool(d), bool(nf)) for v, d, nf in keys]
    if order is None:
        n = len(vectors[0][0]) if vectors else int(rows or 0)
        order = np.arange(n, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    if not vectors or len(order) <= 1:
        return order
    columns = []
    big = len(order) + 1
    for v, descending, nulls_first in vectors:
        r = _ranks(v, order)
        null = r < 0
        r = -r if descending else r
        r = np.where(null, -big if nulls_first else big, r)
        columns.append(r)
    # np.lexsort sorts by the last key first; the position breaks ties (stability).
    perm = np.lexsort([np.arange(len(order))] + columns[::-1])
    return order[perm]


def order_by(items: Sequence[exp.Ordered | exp.Expression], cells: Mapping[str, Any], *,
             order: np.ndarray | None = None, rows: int | None = None,
             dialect: str = "duckdb") -> np.ndarray:
    """ORDER BY over post-processing expressions: evaluate each item and sort.

    Args:
        items: sqlglot ``Ordered`` nodes (their ``desc`` and ``nulls_first`` are
            used; sqlglot sets ``nulls_first`` from the dialect's default NULL
            ordering when the query does not say) or bare expressions (ascending,
            NULLS LAST).
        cells: as for :func:`evaluate`.
        order: the row indices to sort (default all rows).
        rows, dialect: as for :func:`evaluate`.

    Returns:
        Row indices in the requested order (stable; ties keep ``order``).

    Raises:
        ExpressionError: as for :func:`evaluate`.
    """
    vectors, n = _cells_of(cells, rows)
    ev = _Evaluator(vectors, n)
    keys = []
    for item in items:
        if isinstance(item, exp.Ordered):
            keys.append((ev.ev(item.this), bool(item.args.get("desc")), bool(item.args.get("nulls_first"))))
        else:
            keys.append((ev.ev(_as_tree(item, dialect)), False, False))
    return sort_rows(keys, order, rows=n)


def limit_rows(order: np.ndarray, limit: int | None, offset: int = 0) -> np.ndarray:
    """``order[offset : offset + limit]`` (LIMIT/OFFSET on sorted row indices; None = no limit).

    Raises:
        ValueError: a negative limit or offset.
    """
    if (limit is not None and limit < 0) or offset < 0:
        raise ValueError("LIMIT and OFFSET must be >= 0")
    end = None if limit is None else offset + int(limit)
    return np.asarray(order)[int(offset):end]
