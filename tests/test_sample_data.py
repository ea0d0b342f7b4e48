"""Tests of the quickstart sample data (dpgate.sample_data), its policy and bench/datagen.py."""

from __future__ import annotations

import hashlib
import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from scipy import stats

from dpgate.errors import DpgateError, InvalidRequest
from dpgate.sample_data import (
    MODELS,
    REGIONS,
    WEEKS,
    categorical,
    counter_uniform,
    ensure_sample_data,
    generate_usage,
    lognormal,
    pareto_counts,
    usage_tables,
)
from tests.shared_data import smartnoise_dir

ROOT = Path(__file__).resolve().parents[1]
SHARED = smartnoise_dir()


@pytest.fixture(scope="module")
def default_tables() -> dict[str, pa.Table]:
    return usage_tables()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the counter-based generator ----------------------------------------------------------


def test_counter_uniform_is_a_pure_function_of_seed_stream_index():
    idx = np.arange(10_000)
    a = counter_uniform(7, 3, idx)
    # Same draws whatever the shape/chunking of the index array.
    assert np.array_equal(a, np.concatenate([counter_uniform(7, 3, idx[:1234]), counter_uniform(7, 3, idx[1234:])]))
    assert np.array_equal(a[::-1], counter_uniform(7, 3, idx[::-1]))
    assert counter_uniform(7, 3, 42)[()] == a[42]
    # Different seeds and streams give different sequences.
    assert not np.array_equal(a, counter_uniform(8, 3, idx))
    assert not np.array_equal(a, counter_uniform(7, 4, idx))


def test_counter_uniform_reference_value():
    # SplitMix64 by hand (Steele, Lea & Flood 2014; Vigna's splitmix64.c), in pure Python ints:
    # key = mix(mix(seed + γ) ^ (stream · C)), draw i = mix(key + (i + 1) · γ), then (top 52 bits + ½) / 2^52.
    m = (1 << 64) - 1

    def mix(z):
        z &= m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    # Vigna's published first output of splitmix64 seeded with 0 is 0xE220A8397B1DCDAF.
    assert mix(0 + 0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    seed, stream, i = 2026, 5, 123_456
    key = mix(mix(seed + 0x9E3779B97F4A7C15) ^ ((stream * 0xD1B54A32D192ED03) & m))
    z = mix(key + (i + 1) * 0x9E3779B97F4A7C15)
    expected = ((z >> 12) + 0.5) / 2**52
    assert counter_uniform(seed, stream, np.array([i]))[0] == expected


def test_counter_uniform_is_uniform_and_open_interval():
    u = counter_uniform(2026, 1, np.arange(200_000))
    assert u.min() > 0.0 and u.max() < 1.0
    # Kolmogorov–Smirnov against U(0,1): a broken mixer (e.g. a missing xor-shift) fails this badly.
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    # Consecutive draws are uncorrelated.
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01


def test_counter_uniform_rejects_bad_input():
    with pytest.raises(InvalidRequest):
        counter_uniform(1, -1, np.arange(3))
    with pytest.raises(InvalidRequest):
        counter_uniform(1, 0, np.array([0, -1]))
    with pytest.raises(InvalidRequest):
        counter_uniform(1, 0, np.array([0.5]))


def test_inverse_cdf_transforms():
    u = counter_uniform(11, 0, np.arange(100_000))
    c = categorical(u, [0.5, 0.3, 0.2])
    assert np.allclose(np.bincount(c, minlength=3) / u.size, [0.5, 0.3, 0.2], atol=0.01)
    assert categorical(np.array([1e-12, 0.5 - 1e-9, 0.5, 0.999999]), [1, 1]).tolist() == [0, 0, 1, 1]
    n = pareto_counts(u, minimum=2.0, alpha=1.5, maximum=1000)
    assert n.min() == 2 and n.max() <= 1000
    # N = floor(X) with X ~ Pareto(2, 1.5), so P(N >= t) = P(X >= t) = (2/t)^1.5 for integer t >= 2.
    assert abs(np.mean(n >= 10) - (2 / 10) ** 1.5) < 0.005
    assert abs(np.mean(n == 2) - (1 - (2 / 3) ** 1.5)) < 0.01
    x = lognormal(u, median=100.0, sigma=1.0)
    assert abs(np.median(x) - 100.0) < 2.0
    assert stats.kstest(np.log(x), "norm", args=(np.log(100.0), 1.0)).pvalue > 1e-4
    with pytest.raises(InvalidRequest):
        categorical(u, [])
    with pytest.raises(InvalidRequest):
        pareto_counts(u, minimum=0.0, alpha=1.0, maximum=10)


# --- the usage log --------------------------------------------------------------------------


def test_generation_is_byte_identical(tmp_path):
    a = generate_usage(tmp_path / "a", users=2_000, seed=5)
    b = generate_usage(tmp_path / "b", users=2_000, seed=5)
    c = generate_usage(tmp_path / "c", users=2_000, seed=6)
    assert set(a) == {"prompts", "sessions"}
    for name in a:
        assert _sha(a[name]) == _sha(b[name])
        assert _sha(a[name]) != _sha(c[name])
    assert not list((tmp_path / "a").glob("*.tmp"))


def _same(a: pa.Table, b: pa.Table) -> bool:
    """Equal schemas and values, NULL where NULL, NaN where NaN (Table.equals treats NaN != NaN)."""
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    for name in a.column_names:
        x, y = a[name].combine_chunks(), b[name].combine_chunks()
        if not np.array_equal(x.is_null().to_numpy(zero_copy_only=False), y.is_null().to_numpy(zero_copy_only=False)):
            return False
        if pa.types.is_floating(x.type):
            if not np.array_equal(x.fill_null(0).to_numpy(), y.fill_null(0).to_numpy(), equal_nan=True):
                return False
        elif not x.equals(y):
            return False
    return True


def test_default_tables_are_deterministic(default_tables):
    again = usage_tables()
    for name, table in default_tables.items():
        assert _same(table, again[name])
    assert not _same(default_tables["prompts"], usage_tables(seed=1)["prompts"].slice(0, 10))


def test_schema_and_size(default_tables):
    p, s = default_tables["prompts"], default_tables["sessions"]
    assert p.schema == pa.schema(
        [("user_id", pa.string()), ("week", pa.int64()), ("region", pa.string()), ("tokens", pa.float64()),
         ("model", pa.string())]
    )
    assert s.schema == pa.schema(
        [("user_id", pa.string()), ("week", pa.int64()), ("region", pa.string()), ("duration_s", pa.float64())]
    )
    assert 200_000 <= p.num_rows <= 300_000
    assert pc.count_distinct(p["user_id"]).as_py() == 20_000
    assert all(len(v) == 7 and v.startswith("u") and v[1:].isdigit() for v in pc.unique(p["user_id"]).to_pylist())
    for t in (p, s):
        assert t["user_id"].null_count == t["week"].null_count == t["region"].null_count == 0
        assert pc.min(t["week"]).as_py() == 0 and pc.max(t["week"]).as_py() == WEEKS - 1
        assert set(pc.unique(t["region"]).to_pylist()) == set(REGIONS)
    assert set(pc.unique(p["model"]).to_pylist()) == set(MODELS)
    # Sessions cover the same population (users with prompts), not a new one.
    assert set(pc.unique(s["user_id"]).to_pylist()) == set(pc.unique(p["user_id"]).to_pylist())


def test_rows_per_user_are_heavy_tailed(default_tables):
    p = default_tables["prompts"]
    per_user = p.group_by("user_id").aggregate([("week", "count")])["week_count"].to_numpy()
    assert np.median(per_user) <= 6
    assert per_user.max() >= 100
    assert np.sum(per_user >= 100) >= 100  # "some with hundreds" is more than one outlier
    assert per_user.min() >= 1


def test_one_region_per_user_per_week(default_tables):
    for t in default_tables.values():
        g = t.group_by(["user_id", "week"]).aggregate([("region", "count_distinct")])
        assert pc.max(g["region_count_distinct"]).as_py() == 1
    # ... and the two tables agree on it.
    def key(t):
        return {(u, w): r for u, w, r in zip(*(t[c].to_pylist() for c in ("user_id", "week", "region")))}
    kp, ks = key(default_tables["prompts"]), key(default_tables["sessions"])
    assert ks.keys() == kp.keys()
    assert all(kp[k] == ks[k] for k in ks)
    # Users do travel: some change region between weeks, but most rows are in the home region.
    per_user = default_tables["prompts"].group_by("user_id").aggregate([("region", "count_distinct")])
    moved = np.mean(per_user["region_count_distinct"].to_numpy() > 1)
    assert 0.01 < moved < 0.5


def test_tokens_tail_and_missing_values(default_tables):
    tokens = default_tables["prompts"]["tokens"]
    assert tokens.null_count > 0
    values = tokens.drop_null().to_numpy()
    nan = np.isnan(values)
    assert nan.sum() > 0
    finite = values[~nan]
    assert (finite > 8000).sum() > 100
    assert np.mean(finite > 8000) < 0.05
    assert finite.min() >= 1 and np.median(finite) < 2000
    durations = default_tables["sessions"]["duration_s"]
    assert durations.null_count > 0
    assert (durations.drop_null().to_numpy() > 3600).sum() > 0


def test_bad_sizes_are_refused(tmp_path):
    for users in (0, -3, 2.5, True):
        with pytest.raises(DpgateError):
            generate_usage(tmp_path, users=users)
    assert not list(tmp_path.iterdir())


def test_ensure_sample_data_generates_only_when_missing(tmp_path, monkeypatch):
    import dpgate.sample_data as sd

    monkeypatch.setattr(sd, "DEFAULT_USERS", 500)  # keep the test small
    calls = []
    paths = ensure_sample_data(tmp_path, progress=calls.append)
    assert paths["prompts"] == (tmp_path / "sample_data" / "usage" / "prompts.parquet").resolve()
    assert all(p.is_file() for p in paths.values()) and calls
    before = {k: (p.stat().st_mtime_ns, _sha(p)) for k, p in paths.items()}
    calls.clear()
    assert ensure_sample_data(tmp_path, progress=calls.append) == paths
    assert calls == []
    assert {k: (p.stat().st_mtime_ns, _sha(p)) for k, p in paths.items()} == before
    paths["sessions"].unlink()
    ensure_sample_data(tmp_path)
    assert paths["sessions"].is_file()


# --- the policy --------------------------------------------------------------------------------


def _load_policies():
    try:
        policy = importlib.import_module("dpgate.policy")
    except ModuleNotFoundError as exc:
        if exc.name == "dpgate.policy":
            pytest.skip("dpgate.policy not written yet")
        raise
    return policy


def test_usage_policy_loads_and_matches_the_data(default_tables):
    policy = _load_policies()
    policies = policy.load_policies(ROOT / "policies")
    usage = policies["usage"]
    assert usage.population == "product-users"
    assert usage.budget.epsilon == 4.0 and usage.budget.delta == 1e-6
    assert dict(usage.allocations) == {"dashboard": 0.6, "analysts": 0.4}
    prompts = usage.table("prompts")
    assert prompts.privacy_unit == "user_id"
    assert (prompts.max_groups_per_unit, prompts.max_rows_per_unit) == (1, 5)
    assert Path(prompts.source) == (ROOT / "sample_data" / "usage" / "prompts.parquet").resolve()
    assert tuple(prompts.column("region").public_keys) == REGIONS
    assert tuple(prompts.column("week").public_keys) == tuple(range(WEEKS))
    tokens = prompts.column("tokens")
    assert (tokens.type, tokens.lower, tokens.upper) == ("float", 0, 8000)
    assert prompts.column("model").public_keys is None
    sessions = usage.table("sessions")
    assert sessions.column("duration_s").upper == 3600
    # Every declared column exists in the generated table with a compatible type.
    for name, table in (("prompts", prompts), ("sessions", sessions)):
        data = default_tables[name]
        assert set(table.columns) | {"user_id"} == set(data.column_names)


# --- bench/datagen.py -----------------------------------------------------------------------------


def _datagen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.datagen", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_bench_synthetic_is_deterministic_and_chunk_independent(tmp_path):
    common = ["--rows", "50000", "--units", "4000", "--keys", "7", "--seed", "3"]
    a = _datagen(*common, "--out", str(tmp_path / "a"))
    b = _datagen(*common, "--chunk-rows", "4321", "--out", str(tmp_path / "b"))
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    assert "100 %" in a.stderr
    ta, tb = pq.read_table(tmp_path / "a" / "events.parquet"), pq.read_table(tmp_path / "b" / "events.parquet")
    assert _same(ta, tb)
    assert ta.num_rows == 50_000
    units = ta["unit_id"].to_numpy()
    per_unit = np.bincount(units)
    assert per_unit.size == 4000 and per_unit.min() >= 1  # every unit present
    assert per_unit.max() >= 20 * np.median(per_unit)  # heavy tail
    assert not np.all(np.diff(units) >= 0)  # units are spread over the file
    keys, x = ta["key"].to_numpy(), ta["x"].to_numpy()
    assert keys.min() == 0 and keys.max() == 6
    assert x.min() >= 0.0 and x.max() <= 100.0
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["true_count_by_key"] == np.bincount(keys, minlength=7).tolist()
    assert np.allclose(manifest["true_sum_x_by_key"], np.bincount(keys, weights=x, minlength=7))
    try:
        policy = importlib.import_module("dpgate.policy")
    except ModuleNotFoundError:
        return
    loaded = policy.load_policies(tmp_path / "a" / "policies")
    table = loaded["a"].table("events")
    assert Path(table.source) == (tmp_path / "a" / "events.parquet").resolve()


def test_bench_pums_bootstrap(tmp_path):
    if not (SHARED / "PUMS.csv").is_file():
        pytest.skip("../shared/data not present")
    r = _datagen("--kind", "pums", "--rows", "5000", "--out", str(tmp_path / "p"))
    assert r.returncode == 0, r.stderr
    t = pq.read_table(tmp_path / "p" / "pums.parquet")
    assert t.column_names == ["pid", "age", "sex", "educ", "race", "income", "married"]
    assert t["pid"].to_pylist() == list(range(1, 5001))
    src = pacsv.read_csv(SHARED / "PUMS.csv")
    rows = set(zip(*(src[c].to_pylist() for c in src.column_names)))
    assert set(zip(*(t[c].to_pylist() for c in src.column_names))) <= rows


def test_bench_rejects_bad_sizes(tmp_path):
    r = _datagen("--rows", "10", "--units", "20", "--out", str(tmp_path / "x"))
    assert r.returncode != 0 and "units" in r.stderr
