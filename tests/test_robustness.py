"""Issue 9, items 1, 8 and 9: once a query is charged, its outcome (release, error, error code)
never depends on the data beyond what the noise covers; degenerate bounds are exact and free;
the published bounds are the bounds applied.

Everything runs end to end in process: a policy written to a temporary folder, the data as a
Parquet file (exact floats: NaN, ±inf, 1e300, -0.0 survive), ``Gateway.open`` with the real
DuckDB engine, SQLite ledger and OpenDP. A release must also be strict JSON (the release store
writes it with ``allow_nan=False``, as any JSON client reads it).
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpgate import limits
from dpgate.errors import BudgetExhausted, DpgateError, InvalidBudget, PolicyError, UnsupportedQuery
from dpgate.policy import parse_policy
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

_ARROW = {"int": pa.int64(), "float": pa.float64(), "text": pa.string(), "bool": pa.bool_()}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def _inline(d: dict) -> str:
    return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in d.items()) + " }"


def policy_text(columns: dict[str, dict], *, source: Path, k: int = 1, m: int = 1,
                unit: str | None = "u", rho: float = 0.5, mechanism: str = "gaussian") -> str:
    unit_lines = f'privacy_unit = "{unit}"\nmax_groups_per_unit = {k}\nmax_rows_per_unit = {m}' \
        if unit else ""
    cols = "\n".join(f"{name} = {_inline(spec)}" for name, spec in columns.items())
    return textwrap.dedent(f"""\
        [dataset]
        name = "d"
        population = "p"
        data_version = "v1"

        [budget]
        epsilon = 1e9
        delta = 1e-6
        default_query_rho = {rho}
        mechanism = "{mechanism}"

        [allocations]
        analysts = 1.0

        [tables.t]
        source = "{source}"
        """) + unit_lines + "\n\n[tables.t.columns]\n" + cols + "\n"


def write_data(path: Path, columns: dict[str, dict], rows: list[dict], unit: str | None = "u") -> None:
    schema = ([(unit, pa.int64())] if unit else []) + [(n, _ARROW[c["type"]]) for n, c in columns.items()]
    data = {n: pa.array([r.get(n) for r in rows], type=t) for n, t in schema}
    pq.write_table(pa.table(data), path)


def open_gateway(tmp_path: Path, columns: dict[str, dict], rows: list[dict], **kw) -> Gateway:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "policies").mkdir(exist_ok=True)
    source = tmp_path / "t.parquet"
    write_data(source, columns, rows, kw.get("unit", "u"))
    (tmp_path / "policies" / "d.toml").write_text(policy_text(columns, source=source, **kw))
    return Gateway.open(Settings(policies=tmp_path / "policies", home=tmp_path / "home"))


def strict_json(release: dict) -> dict:
    """The release as any strict JSON reader sees it (fails on NaN/±inf)."""
    return json.loads(json.dumps(release, allow_nan=False))


def query(gw: Gateway, sql: str, **kw) -> dict:
    return strict_json(gw.query("d", sql, consumer="analysts", **kw))


def release_or_free_refusal(gw: Gateway, sql: str, **kw) -> dict | None:
    """A query is either refused before the charge (a 4xx, nothing written; None) or released.

    Whether it is refused must not depend on the data: explain (which reads no data) refuses
    exactly the same queries. Once charged, the answer is a strict-JSON release, never an error.
    """
    try:
        gw.explain("d", sql, **kw)
    except DpgateError as e:
        assert e.http_status < 500, e.to_dict()
        with pytest.raises(type(e)):
            gw.query("d", sql, consumer="analysts", **kw)
        assert gw.ledger_entries() == []
        return None
    try:
        r = query(gw, sql, **kw)
    except BudgetExhausted:  # does not fit what is left (depends on the ledger, not the data)
        assert gw.ledger_entries() == []
        return None
    assert r["cached"] is False
    # charged, unless every primitive is a constant (sensitivity 0: exact and free)
    assert (r["charge"] is None) == all(s == 0 for s in r["noise_scales"].values())
    return r


# --- item 1: data-dependent failure after the charge ----------------------------------------------

AMT = {"amt": {"type": "int", "lower": 0, "upper": 2**50}}


@pytest.mark.parametrize("units", [4000, 4200])
def test_a_sum_beyond_2_62_releases_like_one_below(tmp_path, units):
    # k = m = 1, amt ∈ [0, 2^50]: Δ = 2^50, ρ = 0.5 → σ = Δ/√(2ρ) = 2^50. 4,000 units at the
    # upper bound sum to 4000·2^50 < 2^62; 4,200 units to 4200·2^50 > 2^62. Both are answered
    # (200) and charged once: whether the exact sum crosses 2^62 is not published.
    gw = open_gateway(tmp_path, AMT, [{"u": i, "amt": 2**50} for i in range(units)])
    with gw:
        r = query(gw, "SELECT SUM(amt) FROM t")
        assert r["charge"]["rho"] == pytest.approx(0.5)
        assert len(gw.ledger_entries()) == 1
        (value,), = r["rows"]
        exact = min(units * 2**50, limits.MAX_ABS_AGGREGATE)  # the clamp before the noise
        assert abs(value - exact) <= 12 * 2**50  # 12σ


def test_huge_bounds_are_refused_when_the_policy_loads(tmp_path):
    # upper = 1e308: SUM(x)·resolution and VAR_POP's (upper − lower)² overflow a double; the
    # policy is refused before any query (nothing can be charged).
    cols = {"x": {"type": "float", "lower": 0.0, "upper": 1e308},
            "g": {"type": "int", "public_keys": "range(0, 10)"}}
    with pytest.raises(PolicyError, match=r"at most 1e\+100"):
        open_gateway(tmp_path, cols, [{"u": 1, "x": 1e308, "g": 0}], k=10)


@pytest.mark.parametrize("sql", [
    "SELECT SUM(x) FROM t", "SELECT AVG(x) FROM t", "SELECT VAR_POP(x) FROM t",
    "SELECT STDDEV(x) FROM t", "SELECT g, SUM(x), AVG(x), VAR_POP(x) FROM t GROUP BY g",
])
def test_bounds_at_the_limit_release_finite_json(tmp_path, sql):
    # The largest accepted bounds (±1e100, resolution 1e94 by default) with data at, beyond and
    # around them (NaN, ±inf, ±1e308): every released number is a finite double.
    big = limits.MAX_ABS_BOUND
    cols = {"x": {"type": "float", "lower": -big, "upper": big},
            "g": {"type": "int", "public_keys": "range(0, 10)"}}
    values = [1e308, -1e308, math.inf, -math.inf, math.nan, big, -big, 0.0, None]
    rows = [{"u": i, "x": values[i % len(values)], "g": i % 10} for i in range(300)]
    with open_gateway(tmp_path, cols, rows, k=10, m=3) as gw:
        r = query(gw, sql)
        for row in r["rows"]:
            assert all(v is None or isinstance(v, (int, str, bool)) or math.isfinite(v) for v in row)


def test_a_sum_of_squares_beyond_2_62_per_unit_is_refused_before_the_charge(tmp_path):
    # v ∈ [0, 2^31], m = 4: one unit adds up to m·(2^31)² = 2^64 to a sum of squares, more than
    # the 2^62 one unit may add to any exact aggregate (beyond it the bounded query's 128-bit
    # arithmetic could overflow on some data). Refused, free.
    cols = {"v": {"type": "int", "lower": 0, "upper": 2**31}}
    with open_gateway(tmp_path, cols, [{"u": 1, "v": 2**31}] * 4, m=4) as gw:
        with pytest.raises(UnsupportedQuery, match="2\\^62"):
            gw.query("d", "SELECT VAR_POP(v) FROM t", consumer="analysts")
        assert gw.ledger_entries() == []
        gw.query("d", "SELECT SUM(v) FROM t", consumer="analysts")  # 4·2^31 is fine


def test_a_budget_too_small_for_the_noise_names_the_aggregate_and_charges_nothing(tmp_path):
    # cost ∈ [0, 5000] at the default float resolution: the sum of squares behind STDDEV has a
    # per-unit bound of 5000² on a fine grid; at ρ = 1e-9 its σ (integer units) exceeds 2^52.
    # A trial found the refusal naming the internal primitive 'p0'.
    cols = {"cost": {"type": "float", "lower": 0.0, "upper": 5000.0}}
    with open_gateway(tmp_path, cols, [{"u": 1, "cost": 10.0}]) as gw:
        with pytest.raises(InvalidBudget) as info:
            gw.query("d", "SELECT STDDEV(cost) FROM t", consumer="analysts", budget=QueryBudget(rho=1e-9))
        e = info.value
        assert "cost" in e.message and "'p" not in e.message and "nothing was charged" in e.message
        assert e.details["charged"] is False and e.details["aggregate"]
        assert gw.ledger_entries() == []


def test_a_per_unit_sum_bound_beyond_2_62_is_refused_when_the_policy_loads(tmp_path):
    # m·max(|lower|, |upper|)/resolution = 4·2^61 = 2^63 > 2^62.
    cols = {"v": {"type": "int", "lower": 0, "upper": 2**61}}
    with pytest.raises(PolicyError, match="max_rows_per_unit"):
        open_gateway(tmp_path, cols, [{"u": 1, "v": 1}], m=4)


HOSTILE_WHERE = [
    "x * 1e308 > 1",
    "ABS(i) > 0",
    "i * i > 0",
    "i + 9223372036854775807 > 0",
    "-i < 0",
    "ROUND(x, 300) > 0",
    "x / 0 > 0",
    "TRY_CAST(s AS BIGINT) > 0",
    "TRY_CAST(x AS BIGINT) > 0",
    "LENGTH(s) > 3",
    "COALESCE(x, i) > 0",
    "FLOOR(x) = CEIL(x)",
    "LOWER(s) LIKE 'a%'",
]


@pytest.mark.parametrize("where", HOSTILE_WHERE)
def test_hostile_predicates_on_hostile_data_release(tmp_path, where):
    # Values chosen to make a predicate raise at run time if anything could: ±2^63 − 1, −2^63,
    # ±inf, NaN, 1e308, text that is not a number. The bounded query never raises.
    cols = {"x": {"type": "float", "lower": -10.0, "upper": 10.0},
            "i": {"type": "int", "lower": -5, "upper": 5},
            "s": {"type": "text"}}
    xs = [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 0.0, None]
    is_ = [-(2**63), 2**63 - 1, 0, None, 7]
    ss = ["abc", "9223372036854775808", "1e400", "", None, "A" * 1000]
    rows = [{"u": n, "x": xs[n % len(xs)], "i": is_[n % len(is_)], "s": ss[n % len(ss)]}
            for n in range(240)]
    with open_gateway(tmp_path, cols, rows, m=2) as gw:
        r = release_or_free_refusal(
            gw, f"SELECT COUNT(*), SUM(x), AVG(i), VAR_POP(i) FROM t WHERE {where}")
        assert r is None or len(r["rows"]) == 1


# --- item 8: zero-width and degenerate bounds -----------------------------------------------------

ZERO = {"x": {"type": "float", "lower": 0.0, "upper": 0.0}}


def test_a_sum_over_zero_width_bounds_is_exact_and_free(tmp_path):
    # x ∈ [0, 0]: every clamped value is 0, so SUM(x) is 0 on every dataset: sensitivity 0, no
    # noise, no cost (the release is a constant).
    with open_gateway(tmp_path, ZERO, [{"u": i, "x": float(i)} for i in range(50)]) as gw:
        r = query(gw, "SELECT SUM(x) FROM t")
        assert r["rows"] == [[0.0]]
        assert r["charge"] is None and gw.ledger_entries() == []  # nothing to charge
        acc = next(iter(r["accuracy"].values()))
        assert acc["sigma"] == 0.0 and acc["ci95"] == 0.0
        assert list(r["noise_scales"].values()) == [0.0]


def test_count_and_sum_over_zero_width_bounds(tmp_path):
    # The count is noised with the whole budget (the only noisy primitive); the sum is exact.
    with open_gateway(tmp_path, ZERO, [{"u": i, "x": 1.0} for i in range(50)]) as gw:
        r = query(gw, "SELECT COUNT(x), SUM(x), AVG(x), VAR_POP(x) FROM t", budget=QueryBudget(rho=0.5))
        count, total, avg, var = r["rows"][0]
        assert total == 0.0 and avg == 0.0 and var == 0.0
        assert abs(count - 50) < 12  # σ = m/√(2ρ) = 1
        assert r["charge"]["rho"] == pytest.approx(0.5)
        scales = sorted(r["noise_scales"].values())
        assert scales[:2] == [0.0, 0.0] and scales[2] == pytest.approx(1.0)


def test_zero_width_bounds_with_the_laplace_mechanism_and_a_ci95_budget(tmp_path):
    with open_gateway(tmp_path, ZERO, [{"u": i, "x": 1.0} for i in range(20)]) as gw:
        r = query(gw, "SELECT SUM(x), COUNT(*) FROM t", mechanism="laplace")
        assert r["rows"][0][0] == 0.0 and r["charge"]["rho"] > 0
        r = query(gw, "SELECT SUM(x) FROM t", budget=QueryBudget(ci95=3.0))
        assert r["rows"] == [[0.0]] and r["charge"] is None


# --- item 9: the published bounds are the applied bounds -------------------------------------------


def test_bounds_that_are_not_multiples_of_the_resolution_are_refused(tmp_path):
    cols = {"score": {"type": "float", "lower": 0.0, "upper": 1.0, "resolution": 0.3}}
    with pytest.raises(PolicyError) as info:
        open_gateway(tmp_path, cols, [{"u": 1, "score": 1.0}])
    msg = info.value.message
    assert "upper = 1" in msg and "not a multiple of the resolution 0.3" in msg
    assert "0.9" in msg and "1.2" in msg  # the nearest valid upper bounds
    assert "0.1" in msg  # a resolution that divides both bounds


def test_the_average_of_values_at_the_upper_bound_is_the_published_upper_bound(tmp_path):
    cols = {"score": {"type": "float", "lower": 0.0, "upper": 0.9, "resolution": 0.3}}
    with open_gateway(tmp_path, cols, [{"u": i, "score": 1.0} for i in range(500)]) as gw:
        r = query(gw, "SELECT AVG(score) FROM t", budget=QueryBudget(rho=1e4))
        assert r["bounds"]["columns"]["score"] == {"lower": 0.0, "upper": 0.9, "resolution": 0.3}
        assert r["rows"][0][0] == pytest.approx(0.9, abs=0.01)


# --- the property: any accepted policy, any data → a release --------------------------------------


def _decimal_bound(draw, scale_exp: int):
    return draw(st.integers(-(10**4), 10**4)) * 10.0**scale_exp


@st.composite
def policies_and_data(draw):
    ctype = draw(st.sampled_from(["int", "float"]))
    if ctype == "int":
        res = draw(st.sampled_from([1, 1, 2, 10, 1000]))
        top = draw(st.sampled_from([10, 10**6, 2**40, 2**61 // res]))
        a, b = sorted(draw(st.integers(-top, top)) * res for _ in range(2))
        spec = {"type": "int", "lower": a, "upper": b, "resolution": res}
    else:
        e = draw(st.integers(-60, 60))
        a, b = sorted(_decimal_bound(draw, e) for _ in range(2))
        spec = {"type": "float", "lower": a, "upper": b}
        if draw(st.booleans()):
            spec["resolution"] = 10.0**e
    k = draw(st.integers(1, 4))
    m = draw(st.integers(1, 4))
    mech = draw(st.sampled_from(["gaussian", "laplace"]))
    raw = {"dataset": {"name": "d", "population": "p"},
           "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.1},
           "tables": {"t": {"source": "t.parquet", "privacy_unit": "u", "max_groups_per_unit": k,
                            "max_rows_per_unit": m, "columns": {
                                "x": spec, "g": {"type": "int", "public_keys": "range(0, 3)"}}}}}
    try:
        parse_policy(raw, Path("p/policies/d.toml"))
    except PolicyError:
        from hypothesis import reject
        reject()
    if spec["type"] == "int":
        extremes = [a, b, 2**63 - 1, -(2**63), 0, None]
        xs = st.one_of(st.sampled_from(extremes), st.integers(-(2**63), 2**63 - 1))
    else:
        extremes = [a, b, math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -0.0, None]
        xs = st.one_of(st.sampled_from(extremes), st.floats(allow_nan=True, allow_infinity=True))
    rows = draw(st.lists(st.fixed_dictionaries({
        "u": st.integers(0, 6) | st.none(), "x": xs, "g": st.sampled_from([0, 1, 2, 3, None])}),
        max_size=30))
    copies = draw(st.sampled_from([1, 1, 100]))  # sometimes many rows per unit and group
    return spec, k, m, mech, rows * copies


PROPERTY_QUERIES = [
    "SELECT COUNT(*), COUNT(x), SUM(x), AVG(x) FROM t",
    "SELECT g, SUM(x), AVG(x), STDDEV(x), COUNT(DISTINCT u) FROM t GROUP BY g",
    "SELECT g, VAR_POP(x) AS v FROM t WHERE x > 0 GROUP BY g HAVING v >= 0 ORDER BY v DESC",
]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.filter_too_much])
@given(case=policies_and_data(), sql=st.sampled_from(PROPERTY_QUERIES),
       budget=st.sampled_from([None, QueryBudget(rho=1e-3), QueryBudget(rho=1e4),
                               QueryBudget(ci95=1.0)]))
def test_any_accepted_policy_and_any_data_give_a_release_once_admitted(tmp_path_factory, case,
                                                                        sql, budget):
    spec, k, m, mech, rows = case
    cols = {"x": spec, "g": {"type": "int", "public_keys": "range(0, 3)"}}
    tmp = tmp_path_factory.mktemp("prop")
    with open_gateway(tmp, cols, rows, k=k, m=m, mechanism=mech) as gw:
        release_or_free_refusal(gw, sql, budget=budget)
