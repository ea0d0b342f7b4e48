"""Deterministic data sets for the benchmarks.

Two generators, both written in chunks (constant memory, progress on stderr)
and both deterministic by seed: every value is a pure function of
``(seed, stream, row index)`` through :func:`dpgate.sample_data.counter_uniform`
(a counter-based SplitMix64 generator used for *data generation*, never for
noise), so the output does not depend on the chunk size.

``synthetic`` — table ``events(unit_id BIGINT, key BIGINT, x DOUBLE)``:
    ``rows`` rows over ``units`` privacy units with heavy-tailed rows per unit
    (every unit has at least one row; extra rows are apportioned by Pareto
    weights of shape 1.2, capped at 2000× the smallest), ``key`` in
    ``0 .. keys - 1`` (each unit has a home key, used by 80 % of its rows;
    the others are uniform) and ``x = lower + (upper - lower)·u²`` always
    inside the declared bounds ``[lower, upper]``. Rows are spread over the
    file by the bijection ``position ↦ position·A mod rows`` (A coprime with
    ``rows``), so one unit's rows are not contiguous.

``pums`` — table ``pums(pid, age, sex, educ, race, income, married)``: a
    bootstrap (resampling with replacement) of the 1,000 rows of
    ``../shared/data/smartnoise/PUMS.csv`` to ``rows`` rows, each with its own
    person id ``pid`` (1 .. rows): one row per privacy unit. With ``--persons P`` (issue 25
    item 1: several rows per person) ``pid`` is drawn uniformly from 1 .. P instead (stream
    ``_S_PID``; 1.2M rows over P = 400,000 give ~380k distinct persons, ~3.2 rows each, every
    row its own bootstrap draw) and the policy bounds k = ``--max-groups``, m = ``--max-rows``.

``tpch`` — the 8 TPC-H tables of :mod:`dpgate.tpch` at scale factor ``--sf`` (10M lineitems
    at SF 1.667, about 45 s), both lineitem layouts, and the policies ``tpch`` (denormalised:
    ``l_custkey``) and ``tpch_fk`` (the unit through ``l_orderkey -> orders.o_orderkey``).

Each output folder gets ``<table>.parquet``, ``policies/<dataset>.toml`` (a
policy whose ``source`` is relative to the folder, so
``load_policies(out / "policies")`` works) and ``manifest.json`` (parameters,
timing and, for ``synthetic``, the exact per-key count and sum of ``x``
before any contribution bounding).

Examples (from the project root)::

    python -m bench.datagen --rows 1000000 --units 100000 --keys 10 --out bench/.data/rows_1m
    python -m bench.datagen --kind pums --rows 1200000 --out bench/.data/pums_1m2
    python -m bench.datagen --kind pums --rows 1200000 --persons 400000 --max-groups 3 --max-rows 5 \
        --out bench/.data/pums_1m2_multi
    python -m bench.datagen --preset all        # 1M, 10M, 30M (if RAM allows) and PUMS
    python -m bench.datagen --kind tpch --sf 1.667 --out bench/.data/tpch_10m
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from dpgate.sample_data import counter_uniform

ROOT = Path(__file__).resolve().parents[1]
#: ../shared/data/smartnoise next to the repository (or, from a git worktree, one level up).
SHARED_DATA = next((p / "shared" / "data" / "smartnoise" for p in Path(__file__).resolve().parents[2:4]
                    if (p / "shared" / "data" / "smartnoise").exists()),
                   Path(__file__).resolve().parents[2] / "shared" / "data" / "smartnoise")
DEFAULT_CHUNK = 1_000_000

_S_WEIGHT, _S_HOME, _S_STRAY, _S_KEY, _S_X, _S_PUMS, _S_PID = 101, 102, 103, 104, 105, 106, 107

#: Standard data sets of ``--preset``: name → (rows, units, keys).
PRESETS = {
    "1m": (1_000_000, 100_000, 10),
    "10m": (10_000_000, 1_000_000, 10),
    "30m": (30_000_000, 3_000_000, 10),
}
#: Rows of the PUMS-like preset.
PUMS_ROWS = 1_200_000
#: Available memory (bytes) below which the 30M preset is skipped.
MIN_FREE_FOR_30M = 8 * 1024**3


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rows_per_unit(rows: int, units: int, seed: int) -> np.ndarray:
    """Heavy-tailed rows per unit summing exactly to ``rows``.

    Each unit gets one row; the remaining ``rows - units`` are apportioned
    by largest remainder in proportion to Pareto(1, 1.2) weights capped at
    2000 (inverse CDF of :func:`counter_uniform` draws, stream ``_S_WEIGHT``).

    Args:
        rows: total rows (≥ units).
        units: number of units (≥ 1).
        seed: generator seed.

    Returns:
        int64 array of length ``units``, every entry ≥ 1, summing to ``rows``.

    Raises:
        ValueError: if ``units < 1`` or ``rows < units``.
    """
    if units < 1 or rows < units:
        raise ValueError(f"need 1 <= units <= rows, got units={units}, rows={rows}")
    w = np.minimum(np.power(counter_uniform(seed, _S_WEIGHT, np.arange(units)), -1 / 1.2), 2000.0)
    extra = rows - units
    share = extra * (w / w.sum())
    n = np.floor(share).astype(np.int64)
    short = extra - int(n.sum())
    if short > 0:
        n[np.argsort(-(share - n), kind="stable")[:short]] += 1
    return n + 1


def _multiplier(rows: int) -> int:
    """An integer near rows·(√5−1)/2 that is coprime with ``rows`` (the row-spreading bijection)."""
    a = max(1, int(rows * 0.6180339887498949))
    while math.gcd(a, rows) != 1:
        a += 1
    return a % rows if rows > 1 else 0


def synthetic_chunks(
    rows: int, units: int, keys: int, *, seed: int, lower: float = 0.0, upper: float = 100.0,
    chunk_rows: int = DEFAULT_CHUNK,
) -> Iterator[pa.Table]:
    """Yield the ``events`` table in chunks of at most ``chunk_rows`` rows (see the module docstring).

    Raises:
        ValueError: on a non-positive size, ``keys < 1`` or ``lower >= upper``.
    """
    if keys < 1 or chunk_rows < 1 or not lower < upper:
        raise ValueError("need keys >= 1, chunk_rows >= 1 and lower < upper")
    counts = rows_per_unit(rows, units, seed)
    ends = np.cumsum(counts)
    uidx = np.arange(units)
    home = np.floor(counter_uniform(seed, _S_HOME, uidx) * keys).astype(np.int64)
    a = _multiplier(rows)
    for start in range(0, rows, chunk_rows):
        pos = np.arange(start, min(rows, start + chunk_rows), dtype=np.int64)
        logical = (pos * a) % rows  # < 2**63 for rows < 3e9
        # searchsorted on sorted queries is ~30x faster than on the scattered ones.
        order = np.argsort(logical, kind="stable")
        unit = np.empty_like(logical)
        unit[order] = np.searchsorted(ends, logical[order], side="right")
        stray = counter_uniform(seed, _S_STRAY, pos) < 0.2
        other = np.floor(counter_uniform(seed, _S_KEY, pos) * keys).astype(np.int64)
        key = np.where(stray, other, home[unit])
        x = lower + (upper - lower) * counter_uniform(seed, _S_X, pos) ** 2
        yield pa.table({"unit_id": pa.array(unit, pa.int64()), "key": pa.array(key, pa.int64()),
                        "x": pa.array(x, pa.float64())})


def _pums_source() -> pa.Table:
    path = SHARED_DATA / "PUMS.csv"
    if not path.is_file():
        raise FileNotFoundError(path)
    return pacsv.read_csv(path)


def pums_chunks(rows: int, *, seed: int, chunk_rows: int = DEFAULT_CHUNK,
                persons: int | None = None) -> Iterator[pa.Table]:
    """Yield a bootstrap of PUMS.csv with ``rows`` rows and a unique ``pid`` (1 .. rows), in chunks;
    with ``persons``, ``pid`` is uniform on 1 .. persons (several rows per person).

    Raises:
        FileNotFoundError: if ``../shared/data/smartnoise/PUMS.csv`` is absent.
    """
    src = _pums_source()
    n_src = src.num_rows
    for start in range(0, rows, chunk_rows):
        pos = np.arange(start, min(rows, start + chunk_rows), dtype=np.int64)
        pick = np.minimum(np.floor(counter_uniform(seed, _S_PUMS, pos) * n_src).astype(np.int64), n_src - 1)
        part = src.take(pa.array(pick))
        pid = pos + 1 if persons is None else np.minimum(
            np.floor(counter_uniform(seed, _S_PID, pos) * persons).astype(np.int64), persons - 1) + 1
        cols = {"pid": pa.array(pid, pa.int64())}
        cols.update({name: part[name].combine_chunks() for name in src.column_names})
        yield pa.table(cols)


def _write(chunks: Iterator[pa.Table], path: Path, total: int, say: Callable[[str], None]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    writer = None
    done = 0
    try:
        for chunk in chunks:
            if writer is None:
                writer = pq.ParquetWriter(tmp, chunk.schema, compression="zstd")
            writer.write_table(chunk, row_group_size=max(1, chunk.num_rows))
            done += chunk.num_rows
            say(f"  {path.name}: {done:,}/{total:,} rows ({100 * done / total:.0f} %)")
        if writer is not None:
            writer.close()
            writer = None
        os.replace(tmp, path)
    finally:
        if writer is not None:
            writer.close()
        tmp.unlink(missing_ok=True)
    return done


def _toml_name(out: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", out.name).strip("_") or "bench"
    return name if not name[0].isdigit() else f"d_{name}"



def events_table_toml(source: str, *, k: int, m: int, keys: int, lower: float, upper: float) -> str:
    """The policy's ``[tables.events]`` block for a synthetic data set (x at resolution 0.01)."""
    return f"""[tables.events]
source = "{source}"
privacy_unit = "unit_id"
max_groups_per_unit = {k}
max_rows_per_unit = {m}

[tables.events.columns]
key = {{ type = "int", public_keys = "range(0, {keys})" }}
x   = {{ type = "float", lower = {lower!r}, upper = {upper!r}, resolution = 0.01 }}
"""


def pums_table_toml(source: str, *, k: int = 1, m: int = 1) -> str:
    """The policy's ``[tables.pums]`` block for a PUMS bootstrap (one row per person: k = m = 1)."""
    return f"""[tables.pums]
source = "{source}"
privacy_unit = "pid"
max_groups_per_unit = {k}
max_rows_per_unit = {m}

[tables.pums.columns]
age     = {{ type = "int", lower = 0, upper = 100 }}
sex     = {{ type = "int", public_keys = [0, 1] }}
educ    = {{ type = "int", public_keys = "range(1, 17)" }}
race    = {{ type = "int", public_keys = "range(1, 7)" }}
income  = {{ type = "float", lower = 0, upper = 500000, resolution = 1 }}
married = {{ type = "int", public_keys = [0, 1] }}
"""

def generate_synthetic(
    out: Path, *, rows: int, units: int, keys: int, seed: int = 2026, lower: float = 0.0,
    upper: float = 100.0, max_groups_per_unit: int = 1, max_rows_per_unit: int = 5,
    chunk_rows: int = DEFAULT_CHUNK, name: str | None = None, progress: Callable[[str], None] = _stderr,
) -> dict:
    """Write ``out/events.parquet``, ``out/policies/<name>.toml`` and ``out/manifest.json``; return the manifest."""
    out = Path(out)
    name = name or _toml_name(out)
    t0 = time.perf_counter()
    progress(f"synthetic {name}: {rows:,} rows, {units:,} units, {keys} keys, seed {seed} -> {out}")
    true_count = np.zeros(keys, np.int64)
    true_sum = np.zeros(keys, np.float64)

    def tally(chunks: Iterator[pa.Table]) -> Iterator[pa.Table]:
        for c in chunks:
            k = c["key"].to_numpy()
            true_count[:] += np.bincount(k, minlength=keys)
            true_sum[:] += np.bincount(k, weights=c["x"].to_numpy(), minlength=keys)
            yield c

    chunks = synthetic_chunks(rows, units, keys, seed=seed, lower=lower, upper=upper, chunk_rows=chunk_rows)
    _write(tally(chunks), out / "events.parquet", rows, progress)
    counts = rows_per_unit(rows, units, seed)
    policy = f"""# Benchmark data set written by bench/datagen.py (synthetic, seed {seed}).
[dataset]
name = "{name}"
population = "{name}-units"

[budget]
epsilon = 1000.0
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 1.0

{events_table_toml("events.parquet", k=max_groups_per_unit, m=max_rows_per_unit, keys=keys, lower=lower, upper=upper)}"""
    manifest = {
        "kind": "synthetic", "dataset": name, "table": "events", "rows": rows, "units": units, "keys": keys,
        "seed": seed, "lower": lower, "upper": upper, "max_groups_per_unit": max_groups_per_unit,
        "max_rows_per_unit": max_rows_per_unit,
        "rows_per_unit": {"median": float(np.median(counts)), "p99": float(np.quantile(counts, 0.99)),
                          "max": int(counts.max())},
        "true_count_by_key": true_count.tolist(), "true_sum_x_by_key": true_sum.tolist(),
    }
    return _finish(out, name, policy, manifest, t0, progress)


def generate_pums(
    out: Path, *, rows: int = PUMS_ROWS, seed: int = 2026, chunk_rows: int = DEFAULT_CHUNK,
    name: str | None = None, progress: Callable[[str], None] = _stderr, persons: int | None = None,
    max_groups_per_unit: int = 1, max_rows_per_unit: int = 1,
) -> dict | None:
    """Write a PUMS bootstrap (``out/pums.parquet``, policy, manifest); None if ../shared is absent."""
    if not (SHARED_DATA / "PUMS.csv").is_file():
        progress(f"skipping pums: {SHARED_DATA / 'PUMS.csv'} not present (../shared/data is absent)")
        return None
    out = Path(out)
    name = name or _toml_name(out)
    t0 = time.perf_counter()
    progress(f"pums {name}: bootstrap of PUMS.csv to {rows:,} rows, seed {seed} -> {out}")
    _write(pums_chunks(rows, seed=seed, chunk_rows=chunk_rows, persons=persons), out / "pums.parquet", rows,
           progress)
    k, m = (1, 1) if persons is None else (max_groups_per_unit, max_rows_per_unit)
    units = rows if persons is None else len(pq.read_table(out / "pums.parquet", columns=["pid"])["pid"].unique())
    policy = f"""# Benchmark data set written by bench/datagen.py (PUMS bootstrap, seed {seed}).
[dataset]
name = "{name}"
population = "{name}-persons"

[budget]
epsilon = 1000.0
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 1.0

{pums_table_toml("pums.parquet", k=k, m=m)}"""
    manifest = {"kind": "pums", "dataset": name, "table": "pums", "rows": rows, "units": units, "seed": seed,
                "persons": persons, "max_groups_per_unit": k, "max_rows_per_unit": m,
                "source": str(SHARED_DATA / "PUMS.csv")}
    return _finish(out, name, policy, manifest, t0, progress)


def _finish(out: Path, name: str, policy: str, manifest: dict, t0: float, say: Callable[[str], None]) -> dict:
    (out / "policies").mkdir(parents=True, exist_ok=True)
    (out / "policies" / f"{name}.toml").write_text(policy)
    manifest["generation_s"] = round(time.perf_counter() - t0, 3)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    say(f"done in {manifest['generation_s']} s: {out}")
    return manifest


def _available_memory() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def generate_tpch_bench(out: Path, *, sf: float, seed: int = 2026) -> dict:
    """TPC-H at ``sf`` (:func:`dpgate.tpch.generate_tpch`, both layouts) with its two policies and a manifest."""
    from dpgate.tpch import generate_tpch, tpch_policy

    t0 = time.perf_counter()
    paths = generate_tpch(out, sf, seed, denormalised=True, progress=_stderr)
    pol = out / "policies"
    pol.mkdir(parents=True, exist_ok=True)
    (pol / "tpch.toml").write_text(tpch_policy(".", sf, variant="denormalised", seed=seed))
    (pol / "tpch_fk.toml").write_text(tpch_policy(".", sf, variant="fk", seed=seed))
    manifest = {"kind": "tpch", "scale_factor": sf, "seed": seed, "seconds": round(time.perf_counter() - t0, 1),
                "rows": {name: pq.ParquetFile(p).metadata.num_rows for name, p in paths.items()}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m bench.datagen", description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=("synthetic", "pums", "tpch"), default="synthetic")
    p.add_argument("--sf", type=float, default=0.01, help="TPC-H scale factor (--kind tpch)")
    p.add_argument("--preset", choices=(*PRESETS, "pums", "all"),
                   help="standard data set(s) under bench/.data/ (ignores --rows/--units/--keys/--out)")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--units", type=int, default=100_000)
    p.add_argument("--keys", type=int, default=10)
    p.add_argument("--persons", type=int, help="--kind pums: draw pid from 1 .. PERSONS (several rows per person)")
    p.add_argument("--lower", type=float, default=0.0)
    p.add_argument("--upper", type=float, default=100.0)
    p.add_argument("--max-groups", type=int, default=1, help="max_groups_per_unit in the written policy")
    p.add_argument("--max-rows", type=int, default=5, help="max_rows_per_unit in the written policy")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK)
    p.add_argument("--name", help="dataset name in the policy (default: from the output folder)")
    p.add_argument("--out", type=Path, help="output folder")
    args = p.parse_args(argv)

    if args.preset:
        base = ROOT / "bench" / ".data"
        names = [*PRESETS, "pums"] if args.preset == "all" else [args.preset]
        for preset in names:
            if preset == "pums":
                generate_pums(base / "pums_1m2", seed=args.seed, chunk_rows=args.chunk_rows)
                continue
            rows, units, keys = PRESETS[preset]
            free = _available_memory()
            if preset == "30m" and free is not None and free < MIN_FREE_FOR_30M:
                _stderr(f"skipping 30m: {free / 1024**3:.1f} GiB available, need {MIN_FREE_FOR_30M / 1024**3:.0f}")
                continue
            generate_synthetic(base / f"rows_{preset}", rows=rows, units=units, keys=keys, seed=args.seed,
                               chunk_rows=args.chunk_rows)
        return 0
    if args.out is None:
        p.error("--out is required without --preset")
    try:
        if args.kind == "tpch":
            generate_tpch_bench(args.out, sf=args.sf, seed=args.seed)
            return 0
        if args.kind == "pums":
            generate_pums(args.out, rows=args.rows, seed=args.seed, chunk_rows=args.chunk_rows, name=args.name,
                          persons=args.persons, max_groups_per_unit=args.max_groups,
                          max_rows_per_unit=args.max_rows)
            return 0
        generate_synthetic(args.out, rows=args.rows, units=args.units, keys=args.keys, seed=args.seed,
                           lower=args.lower, upper=args.upper, max_groups_per_unit=args.max_groups,
                           max_rows_per_unit=args.max_rows, chunk_rows=args.chunk_rows, name=args.name)
    except ValueError as exc:
        p.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
