"""The bounded vector of several-rows-per-unit queries against a Python reference (issue 25 item 1).

The bounded SQL (:mod:`dpgate.sql.bound`, step 2: one partial per (unit, group), clipped; the
k-group choice by the smallest ``(hash(unit, keys, salt), keys)``) is compared, pre-noise, with an
independent implementation of the documented choice in plain Python: per (unit, group) the row
count, the non-NULL count and the fixed-point sum; ``min(count, m)``; a sum scaled to m rows'
worth (m × the mean, ``sum·m / count`` rounded half away from zero, when count > m) and clipped to ``m·[min(lo, 0), max(hi, 0)]``; each unit
keeps the k groups with the smallest (hash, key). The hash is the engine's portable one
(:func:`dpgate.engines.hashing.arithmetic_group_hash`), recomputed here from its documented
formula, so the reference shares no SQL with the rendering. Any rewrite of the bounded query
(issue 25: a cheaper plan for the k-group and m-row choices) must keep these vectors equal for
every salt: the released distribution is then the same.
"""

from __future__ import annotations

from fractions import Fraction

from collections import defaultdict
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.engines.hashing import HASH_PRIME, _salt_constants, arithmetic_group_hash
from dpgate.policy import parse_policy
from dpgate.sql.bound import bounded_query
from dpgate.sql.parse import parse_query

KEYS = list(range(1, 6))  # public keys of g: 1 .. 5
LO, HI = 0, 20  # x in [0, 20] at resolution 1: fixed-point steps = values



def _half_away(q: Fraction) -> int:
    """The integer nearest ``q``, halves away from zero (exact)."""
    r = int(abs(q) + Fraction(1, 2))
    return r if q >= 0 else -r

def _policy(k: int, m: int):
    raw = {"dataset": {"name": "ref", "population": "ref"},
           "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
           "tables": {"t": {"source": "t.parquet", "privacy_unit": "u", "max_groups_per_unit": k,
                            "max_rows_per_unit": m,
                            "columns": {"g": {"type": "int", "public_keys": f"range(1, {len(KEYS) + 1})"},
                                        "x": {"type": "float", "lower": LO, "upper": HI, "resolution": 1}}}}}
    return parse_policy(raw, Path("policies/ref.toml"))


def _hash(u: int, g: int, salt: int) -> int:
    """The arithmetic group hash of (u, g) (dpgate.engines.hashing, documented formula)."""
    p = HASH_PRIME
    s1, t1, s2, s3, *bs = _salt_constants(salt)
    y = (s1 * (u % p) + t1) % p
    y = (y * y + s2) % p
    z = (y + (bs[0] * (g % p)) % p) % p
    return (z * z + s3) % p


def _fixed(x: float | None) -> int | None:
    if x is None or x != x or x in (float("inf"), float("-inf")):
        return None
    return int(min(max(round(x), LO), HI))


def reference(rows, k: int, m: int, salt: int) -> dict[str, list[int]]:
    """Per public key: bounded COUNT(*), SUM(x) (fixed point), COUNT(x) — the documented choice."""
    parts: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0, 0])  # rows, non-NULL, sum
    for u, g, x in rows:
        if g not in KEYS:
            continue
        p = parts[(u, g)]
        p[0] += 1
        v = _fixed(x)
        if v is not None:
            p[1] += 1
            p[2] += v
    by_unit: dict[int, list[int]] = defaultdict(list)
    for u, g in parts:
        by_unit[u].append(g)
    kept = {(u, g) for u, gs in by_unit.items() for g in sorted(gs, key=lambda g: (_hash(u, g, salt), g))[:k]}
    out = {"n": [0] * len(KEYS), "s": [0] * len(KEYS), "c": [0] * len(KEYS)}
    for (u, g), (n, c, s) in parts.items():
        if (u, g) not in kept:
            continue
        worth = _half_away(Fraction(s * m, c)) if c > m else s
        i = KEYS.index(g)
        out["n"][i] += min(n, m)
        out["s"][i] += min(max(worth, m * min(LO, 0)), m * max(HI, 0))
        out["c"][i] += min(c, m)
    return out


def bounded(con, policy, salt: int) -> dict[str, list[int]]:
    """The bounded SQL's pre-noise vector, with the engine's arithmetic hash."""
    plan = parse_query("SELECT g, COUNT(*) AS n, SUM(x) AS s, COUNT(x) AS c FROM t GROUP BY g", policy)
    tree = arithmetic_group_hash(bounded_query(plan, policy, salt=salt), "duckdb", {"__dpg_u", "__dpg_g0"})
    res = con.execute(tree.sql(dialect="duckdb"))
    names = [d[0] for d in res.description]
    rows = res.fetchall()
    cols = {nm: [int(r[i]) for r in rows] for i, nm in enumerate(names)}
    by_id = {p.id: p for p in plan.primitives}
    kinds = {nm: by_id[nm].kind for nm in cols if nm in by_id}
    count, count_col = [nm for nm, kd in kinds.items() if kd == "count"], [
        nm for nm, kd in kinds.items() if kd == "count_column"]
    total = [nm for nm, kd in kinds.items() if kd == "sum"]
    assert cols["g"] == KEYS
    return {"n": cols[count[0]], "s": cols[total[0]], "c": cols[count_col[0]]}


def _load(con, rows) -> None:
    con.execute("CREATE SCHEMA IF NOT EXISTS ref")
    con.execute("CREATE OR REPLACE TABLE ref.t (u BIGINT, g BIGINT, x DOUBLE)")
    if rows:
        data = pa.table({"u": pa.array([r[0] for r in rows], pa.int64()),
                         "g": pa.array([r[1] for r in rows], pa.int64()),
                         "x": pa.array([r[2] for r in rows], pa.float64())})
        con.register("__rows", data)
        con.execute("INSERT INTO ref.t SELECT * FROM __rows")
        con.unregister("__rows")


@pytest.fixture()
def con():
    c = duckdb.connect()
    yield c
    c.close()


_X = st.one_of(st.none(), st.floats(-5, 30, allow_nan=False), st.just(float("nan")), st.just(float("inf")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), _X), max_size=60),
       km=st.sampled_from([(1, 1), (2, 2), (3, 5), (2, 1)]), salt=st.integers(0, 2**63 - 1))
def test_bounded_vector_equals_the_reference_choice(con, rows, km, salt):
    k, m = km
    _load(con, rows)
    assert bounded(con, _policy(k, m), salt) == reference(rows, k, m, salt)


def test_reference_detects_a_wrong_choice(con):
    # A unit in all 5 groups keeps k = 2 of them: the reference with another salt differs for
    # some salt (the test above would catch a rewrite that ignored the salt or kept k + 1).
    rows = [(u, g, 1.0) for u in range(30) for g in KEYS]
    _load(con, rows)
    got = bounded(con, _policy(2, 1), 7)
    assert sum(got["n"]) == 60
    assert got == reference(rows, 2, 1, 7)
    assert any(reference(rows, 2, 1, s) != got for s in (8, 9, 10))
    assert reference(rows, 3, 1, 7) != got
