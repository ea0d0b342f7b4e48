"""Synthetic sample data for the quickstart: an LLM usage log.

This module **generates demonstration data; it is not a noise source** and
nothing in it is used by any privacy mechanism (noise comes only from OpenDP's
samplers in :mod:`dpgate.mechanisms`). The data must be reproducible, so it is
drawn from a small deterministic, counter-based generator written here rather
than from a stateful library generator:

    u(seed, stream, i) = to_unit(splitmix64_output_i(key(seed, stream)))

i.e. the ``i``-th output of SplitMix64 (Steele, Lea & Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014) started from a key derived from
``(seed, stream)``, mapped to a double strictly inside (0, 1). Every draw is a
pure function of ``(seed, stream, index)``, computed in vectorised NumPy
``uint64`` arithmetic, so the same seed gives byte-identical Parquet files on
every run, independently of chunking or of the order in which columns are
built. Distributions are obtained by inverse-CDF transforms of these uniforms
(Pareto for rows per user, lognormal via :func:`scipy.special.ndtri` for token
counts and durations, categorical via cumulative probabilities and
:func:`numpy.searchsorted`). It is **not** cryptographically secure and must
never be used for anything privacy-relevant.

The population ("product-users") is shared by two tables:

``prompts`` — one row per prompt:
    ``user_id`` (text ``"u000123"``), ``week`` (int, 0..51), ``region`` (text:
    ``eu``, ``us``, ``apac``, ``latam``, ``africa``), ``tokens`` (float, heavy
    tailed: about 1.4 % above 8000, a few NULL and a few NaN), ``model`` (text:
    ``small``, ``medium``, ``large``).
``sessions`` — one or more rows per (user, week) in which the user prompted:
    ``user_id``, ``week``, ``region``, ``duration_s`` (float seconds, heavy
    tailed, a few NULL).

Each user has a home region and travels in some weeks, but **all of a user's
rows in one week (in both tables) share one region**, so a COUNT by region
restricted to one week touches exactly one group per user
(``max_groups_per_unit = 1`` is exact, not a clipping assumption). Rows per
user are heavy tailed: the median user has a handful of prompts, a few hundred
users have hundreds, the heaviest about two thousand.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.special import ndtri

from dpgate.errors import InvalidRequest

__all__ = [
    "DEFAULT_SEED",
    "DEFAULT_USERS",
    "MODELS",
    "REGIONS",
    "SAMPLE_DIR",
    "WEEKS",
    "categorical",
    "counter_uniform",
    "ensure_sample_data",
    "generate_usage",
    "lognormal",
    "pareto_counts",
    "usage_tables",
    "write_parquet",
]

#: Number of users in the default quickstart data (about 226k prompts).
DEFAULT_USERS = 20_000
#: Seed of the default quickstart data.
DEFAULT_SEED = 2026
#: Weeks of the year covered; ``week`` takes values ``0 .. WEEKS - 1``.
WEEKS = 52
#: Region names (the public keys of ``region`` in ``policies/usage.toml``) and
#: the share of users whose home region each is.
REGIONS: tuple[str, ...] = ("eu", "us", "apac", "latam", "africa")
_REGION_P = (0.30, 0.30, 0.20, 0.12, 0.08)
#: Model names; ``model`` has no public keys in the policy.
MODELS: tuple[str, ...] = ("small", "medium", "large")
_MODEL_P = (0.55, 0.30, 0.15)
_MODEL_MEDIAN_TOKENS = (350.0, 700.0, 1400.0)
#: Folder of the quickstart data, relative to the project root.
SAMPLE_DIR = Path("sample_data") / "usage"

# Streams: one per independent quantity. Changing a number changes the data.
_S_ROWS, _S_SPAN, _S_START, _S_WEEK = 1, 2, 3, 4
_S_HOME, _S_TRAVEL, _S_TRAVEL_TO = 5, 6, 7
_S_PREF, _S_SWITCH, _S_MODEL, _S_TOKENS, _S_TOKENS_MISSING = 8, 9, 10, 11, 12
_S_SESS_RATE, _S_SESS_DUR, _S_SESS_MISSING = 13, 14, 15

_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
_STREAM_MUL = 0xD1B54A32D192ED03  # odd constant separating stream keys


def _mix64_int(z: int) -> int:
    """SplitMix64's output finaliser on a Python int (mod 2**64)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * _MUL1) & _M64
    z = ((z ^ (z >> 27)) * _MUL2) & _M64
    return z ^ (z >> 31)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output finaliser on a ``uint64`` array (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(_MUL1)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(_MUL2)
    return z ^ (z >> np.uint64(31))


def counter_uniform(seed: int, stream: int, index: np.ndarray | int) -> np.ndarray:
    """Deterministic uniform doubles in the open interval (0, 1) — for data generation only.

    Draw ``i`` of stream ``stream`` is the ``i``-th output of SplitMix64 (Steele,
    Lea & Flood, OOPSLA 2014) started from the key
    ``mix64(mix64(seed) ^ (stream · C))``: ``mix64(key + (i + 1) · γ)`` with
    γ = 0x9E3779B97F4A7C15, all mod 2**64. The top 52 bits ``k`` become
    ``(k + 0.5) / 2**52``, which is exact in float64, never 0 and never 1 (so
    inverse CDFs stay finite). A pure function of its arguments: the same
    ``(seed, stream, index)`` gives the same value whatever the array shape or
    chunking. Not cryptographically secure; not a noise source.

    Args:
        seed: any Python int (taken mod 2**64).
        stream: a non-negative int naming an independent sequence.
        index: a non-negative int or integer array of draw indices (any shape).

    Returns:
        float64 array of ``index``'s shape with values in (0, 1).

    Raises:
        InvalidRequest: if ``stream`` or any index is negative, or ``index``
            is not of an integer type.
    """
    if stream < 0:
        raise InvalidRequest("stream must be a non-negative integer", {"stream": stream})
    idx = np.asarray(index)
    if idx.dtype.kind not in "iu":
        raise InvalidRequest("index must be an integer array", {"dtype": str(idx.dtype)})
    if idx.size and idx.dtype.kind == "i" and int(idx.min()) < 0:
        raise InvalidRequest("index must be non-negative")
    key = _mix64_int(_mix64_int(int(seed) + _GAMMA) ^ ((int(stream) * _STREAM_MUL) & _M64))
    with np.errstate(over="ignore"):  # wrapping uint64 arithmetic is intended (0-d arrays warn)
        counter = idx.astype(np.uint64) + np.uint64(1)
        z = _mix64(counter * np.uint64(_GAMMA) + np.uint64(key))
    return ((z >> np.uint64(12)).astype(np.float64) + 0.5) * (2.0**-52)


def categorical(u: np.ndarray, probs: Sequence[float]) -> np.ndarray:
    """Inverse-CDF categorical draw: the category index for each uniform.

    Args:
        u: uniforms in (0, 1), any shape.
        probs: category probabilities (non-negative, normalised here).

    Returns:
        int64 array of ``u``'s shape with values in ``0 .. len(probs) - 1``.

    Raises:
        InvalidRequest: if ``probs`` is empty, has a negative entry or sums to 0.
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or (p < 0).any() or p.sum() <= 0:
        raise InvalidRequest("probs must be a non-empty list of non-negative numbers with a positive sum")
    cdf = np.cumsum(p / p.sum())
    cdf[-1] = 1.0
    return np.minimum(np.searchsorted(cdf, u, side="right"), p.size - 1).astype(np.int64)


def pareto_counts(u: np.ndarray, *, minimum: float, alpha: float, maximum: int) -> np.ndarray:
    """Heavy-tailed positive counts: ``min(maximum, floor(minimum · u**(-1/alpha)))``.

    The inverse CDF of a Pareto(scale ``minimum``, shape ``alpha``) law,
    rounded down and truncated at ``maximum``: for integers
    ``minimum ≤ t ≤ maximum``, ``P(N ≥ t) = (minimum / t)**alpha``.

    Args:
        u: uniforms in (0, 1).
        minimum: Pareto scale (≥ 1); the smallest count is ``floor(minimum)``.
        alpha: Pareto shape (> 0); smaller means a heavier tail.
        maximum: truncation point (≥ minimum).

    Returns:
        int64 array of ``u``'s shape with values in ``[floor(minimum), maximum]``.

    Raises:
        InvalidRequest: if a parameter is out of range.
    """
    if not (minimum >= 1 and alpha > 0 and maximum >= minimum):
        raise InvalidRequest("pareto_counts needs minimum >= 1, alpha > 0, maximum >= minimum")
    x = np.floor(minimum * np.power(u, -1.0 / alpha))
    return np.minimum(x, float(maximum)).astype(np.int64)


def lognormal(u: np.ndarray, *, median: np.ndarray | float, sigma: float) -> np.ndarray:
    """Inverse-CDF lognormal draw: ``median · exp(sigma · Φ⁻¹(u))``.

    Args:
        u: uniforms in (0, 1).
        median: the law's median (> 0), a scalar or an array broadcastable to ``u``.
        sigma: standard deviation of the log (> 0).

    Returns:
        float64 array of positive values.
    """
    return np.asarray(median, dtype=np.float64) * np.exp(sigma * ndtri(u))


def _missing(u: np.ndarray, values: np.ndarray, *, null_p: float, nan_p: float) -> pa.Array:
    """``values`` as an Arrow float64 array with a share ``null_p`` NULL and ``nan_p`` NaN."""
    values = values.copy()
    values[(u >= null_p) & (u < null_p + nan_p)] = np.nan
    return pa.array(values, type=pa.float64(), mask=u < null_p)


def _user_ids(n: int) -> pa.Array:
    """Text ids ``u000000 ..`` (at least six digits) for users ``0 .. n - 1``."""
    width = max(6, len(str(n - 1)))
    return pa.array([f"u{i:0{width}d}" for i in range(n)], type=pa.string())


def usage_tables(*, users: int = DEFAULT_USERS, seed: int = DEFAULT_SEED) -> dict[str, pa.Table]:
    """Build the ``prompts`` and ``sessions`` tables of the sample usage log in memory.

    Deterministic: the same ``(users, seed)`` always gives equal tables. Rows
    are ordered by (week, user, prompt). See the module docstring for the
    columns and the shape of the data.

    Args:
        users: number of users (the privacy units), ≥ 1. About 11 prompts and 6
            sessions per user on average.
        seed: any int.

    Returns:
        ``{"prompts": pa.Table, "sessions": pa.Table}``.

    Raises:
        InvalidRequest: if ``users`` is not a positive integer.
    """
    if isinstance(users, bool) or not isinstance(users, (int, np.integer)) or users < 1:
        raise InvalidRequest("users must be a positive integer", {"users": repr(users)})
    users = int(users)
    uidx = np.arange(users, dtype=np.int64)

    # Users: rows per user (heavy tail), active span of weeks, home region, preferred model.
    n_rows = pareto_counts(counter_uniform(seed, _S_ROWS, uidx), minimum=2.0, alpha=1.1, maximum=2_000)
    span_max = np.minimum(WEEKS, n_rows)
    span = 1 + np.floor(counter_uniform(seed, _S_SPAN, uidx) * span_max).astype(np.int64)
    start = np.floor(counter_uniform(seed, _S_START, uidx) * WEEKS).astype(np.int64)
    home = categorical(counter_uniform(seed, _S_HOME, uidx), _REGION_P)
    preferred = categorical(counter_uniform(seed, _S_PREF, uidx), _MODEL_P)

    # Prompts: one row per prompt, generated user by user.
    total = int(n_rows.sum())
    ridx = np.arange(total, dtype=np.int64)
    user = np.repeat(uidx, n_rows)
    # Weeks wrap around the year so that every week is equally busy on average.
    offset = np.floor(counter_uniform(seed, _S_WEEK, ridx) * span[user]).astype(np.int64)
    week = (start[user] + offset) % WEEKS

    # Region per (user, week): home unless travelling that week; the same for every row of the week.
    def region_of(u_: np.ndarray, w_: np.ndarray) -> np.ndarray:
        cell = u_ * WEEKS + w_
        travel = counter_uniform(seed, _S_TRAVEL, cell) < 0.08
        away = categorical(counter_uniform(seed, _S_TRAVEL_TO, cell), _REGION_P)
        return np.where(travel, away, home[u_])

    region = region_of(user, week)
    switch = counter_uniform(seed, _S_SWITCH, ridx) < 0.2
    model = np.where(switch, categorical(counter_uniform(seed, _S_MODEL, ridx), _MODEL_P), preferred[user])
    median = np.asarray(_MODEL_MEDIAN_TOKENS)[model]
    raw_tokens = lognormal(counter_uniform(seed, _S_TOKENS, ridx), median=median, sigma=1.1)
    tokens = np.clip(np.rint(raw_tokens), 1, 128_000)
    tokens_arr = _missing(counter_uniform(seed, _S_TOKENS_MISSING, ridx), tokens, null_p=0.004, nan_p=0.001)

    order = np.argsort(week * users + user, kind="stable")
    ids = _user_ids(users)
    prompts = pa.table(
        {
            "user_id": ids.take(pa.array(user[order])),
            "week": pa.array(week[order], type=pa.int64()),
            "region": pa.array(REGIONS, type=pa.string()).take(pa.array(region[order])),
            "tokens": tokens_arr.take(pa.array(order)),
            "model": pa.array(MODELS, type=pa.string()).take(pa.array(model[order])),
        }
    )

    # Sessions: for each (user, week) with prompts, 1 + about a third of that week's prompts.
    cell, per_cell = np.unique(user * WEEKS + week, return_counts=True)
    c_user, c_week = cell // WEEKS, cell % WEEKS
    rate = 0.15 + 0.5 * counter_uniform(seed, _S_SESS_RATE, cell)
    n_sess = 1 + np.floor(per_cell * rate).astype(np.int64)
    s_user = np.repeat(c_user, n_sess)
    s_week = np.repeat(c_week, n_sess)
    sidx = np.arange(s_user.size, dtype=np.int64)
    duration = np.rint(lognormal(counter_uniform(seed, _S_SESS_DUR, sidx), median=420.0, sigma=1.0) * 10) / 10
    duration_arr = _missing(counter_uniform(seed, _S_SESS_MISSING, sidx), duration, null_p=0.003, nan_p=0.0)
    s_order = np.argsort(s_week * users + s_user, kind="stable")
    sessions = pa.table(
        {
            "user_id": ids.take(pa.array(s_user[s_order])),
            "week": pa.array(s_week[s_order], type=pa.int64()),
            "region": pa.array(REGIONS, type=pa.string()).take(pa.array(region_of(s_user, s_week)[s_order])),
            "duration_s": duration_arr.take(pa.array(s_order)),
        }
    )
    return {"prompts": prompts, "sessions": sessions}


def write_parquet(table: pa.Table, path: Path) -> Path:
    """Write ``table`` to ``path`` as Parquet, atomically (temporary file, then rename).

    Uses fixed writer options (zstd) and Parquet stores no timestamp of its
    own, so equal tables give byte-identical files with one pyarrow version.

    Args:
        table: the Arrow table.
        path: destination file; its folder is created if missing.

    Returns:
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd", row_group_size=1 << 20)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def generate_usage(
    out_dir: Path,
    *,
    users: int = DEFAULT_USERS,
    seed: int = DEFAULT_SEED,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Generate the sample usage log and write ``prompts.parquet`` and ``sessions.parquet``.

    Overwrites existing files (each write is atomic). The same ``(users,
    seed)`` gives byte-identical files. The default size (20,000 users) is
    about 226k prompts and 124k sessions and takes well under a second.

    Args:
        out_dir: destination folder (created if missing).
        users: number of users (privacy units), ≥ 1.
        seed: any int.
        progress: optional callback receiving one human-readable line per step.

    Returns:
        ``{"prompts": Path, "sessions": Path}``.

    Raises:
        InvalidRequest: if ``users`` is not a positive integer.
        OSError: if the files cannot be written.
    """
    say = progress or (lambda _msg: None)
    out_dir = Path(out_dir)
    say(f"generating sample usage log: {users:,} users, seed {seed}")
    tables = usage_tables(users=users, seed=seed)
    paths: dict[str, Path] = {}
    for name, table in tables.items():
        paths[name] = write_parquet(table, out_dir / f"{name}.parquet")
        say(f"wrote {paths[name]} ({table.num_rows:,} rows)")
    return paths


def ensure_sample_data(
    project_root: Path, *, progress: Callable[[str], None] | None = None
) -> dict[str, Path]:
    """Return the quickstart data files under ``<project_root>/sample_data/usage``, generating them if missing.

    Files that already exist are left untouched (whatever their content); if
    any of the two is missing, both are regenerated with the defaults
    (:data:`DEFAULT_USERS`, :data:`DEFAULT_SEED`).

    Args:
        project_root: the folder that holds ``policies/`` and ``sample_data/``.
        progress: optional callback receiving one line per step.

    Returns:
        ``{"prompts": Path, "sessions": Path}`` (absolute paths).
    """
    out_dir = (Path(project_root) / SAMPLE_DIR).resolve()
    paths = {name: out_dir / f"{name}.parquet" for name in ("prompts", "sessions")}
    if all(p.is_file() for p in paths.values()):
        return paths
    return generate_usage(out_dir, users=DEFAULT_USERS, seed=DEFAULT_SEED, progress=progress)

