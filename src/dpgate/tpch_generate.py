"""Generating the TPC-H tables (:func:`tpch_tables`, :func:`generate_tpch`): every value a pure
function of ``(seed, stream, row index)`` through :func:`dpgate.sample_data.counter_uniform`, so
one ``(scale_factor, seed)`` gives equal tables whatever the chunk size.

This module **generates benchmark and test data; it is not a noise source** (noise comes only
from OpenDP's samplers in :mod:`dpgate.mechanisms`). The rules followed and the simplifications
are listed in :mod:`dpgate.tpch`.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpgate.errors import InvalidRequest
from dpgate.sample_data import counter_uniform, write_parquet
from dpgate.tpch_spec import (
    BRANDS,
    COLOURS,
    CONTAINERS,
    CURRENTDATE,
    DEFAULT_SEED,
    DEFAULT_SF,
    ENDDATE,
    MANUFACTURERS,
    NATIONS,
    PRIORITIES,
    REGIONS,
    SEGMENTS,
    SHIP_INSTRUCT,
    SHIP_MODES,
    STARTDATE,
    TYPES,
    _supplier_of,
    retail_price_cents,
    table_sizes,
)

#: Words of comments: a subset of the spec's text grammar (clause 4.2.2.10).
_WORDS = (
    "foxes", "ideas", "theodolites", "pinto", "beans", "instructions", "dependencies", "excuses",
    "platelets", "asymptotes", "courts", "dolphins", "multipliers", "sauternes", "warthogs",
    "frets", "dinos", "attainments", "somas", "patterns", "forges", "braids", "frays", "pearls",
    "accounts", "packages", "requests", "deposits", "sleep", "wake", "are", "cajole", "haggle",
    "nag", "use", "boost", "affix", "detect", "integrate", "maintain", "nod", "promise", "engage",
    "furious", "sly", "careful", "blithe", "quick", "fluffy", "slow", "quiet", "ruthless", "thin",
    "final", "ironic", "even", "bold", "silent", "special", "pending", "express", "unusual",
    "regular", "furiously", "slyly", "carefully", "blithely", "quickly", "fluffily", "slowly",
    "quietly", "about", "above", "across", "after", "against", "along", "among", "around",
    "beneath", "beside", "between", "beyond", "during", "except", "from", "into", "near", "over",
)
_ALNUM = np.frombuffer(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,. ", dtype=np.uint8)

# Streams: one per independent quantity (offset so as not to reuse sample_data's numbers).
_S = {name: 1000 + i for i, name in enumerate((
    "p_name_a", "p_name_b", "p_mfgr", "p_brand", "p_type", "p_size", "p_container", "p_comment",
    "s_address", "s_nation", "s_phone", "s_acctbal", "s_comment", "s_bbb",
    "ps_availqty", "ps_supplycost", "ps_comment",
    "c_address", "c_nation", "c_phone", "c_acctbal", "c_segment", "c_comment",
    "o_custkey", "o_date", "o_priority", "o_clerk", "o_comment", "o_lines",
    "l_partkey", "l_supp", "l_quantity", "l_discount", "l_tax", "l_ship", "l_commit", "l_receipt",
    "l_flag", "l_instruct", "l_mode", "l_comment", "n_comment", "r_comment",
))}
#: Streams for the characters or words of a string quantity: its stream + this offset.
_SUB = 500

_EPOCH = dt.date(1970, 1, 1)


def _days(d: dt.date) -> int:
    return (d - _EPOCH).days


# --- vectorised draws -------------------------------------------------------------------------


def _int(seed: int, stream: str, idx: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Uniform integers in [lo, hi] (both included)."""
    u = counter_uniform(seed, _S[stream], idx)
    return np.minimum(lo + np.floor(u * (hi - lo + 1)).astype(np.int64), hi)


def _cents(seed: int, stream: str, idx: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Uniform decimals with two places in [lo/100, hi/100], as float64."""
    return np.round(_int(seed, stream, idx, lo, hi) / 100.0, 2)


def _pick(values: tuple[str, ...], codes: np.ndarray) -> pa.Array:
    return pa.array(values, type=pa.string()).take(pa.array(codes))


def _padded(prefix: str, keys: np.ndarray) -> pa.Array:
    """``prefix`` + the key zero-padded to 9 digits (``Customer#000000001``)."""
    digits = pc.utf8_lpad(pc.cast(pa.array(keys), pa.string()), 9, "0")
    return pc.binary_join_element_wise(prefix, digits, "")


def _vstring(seed: int, stream: str, idx: np.ndarray, lo: int, hi: int) -> pa.Array:
    """Random strings of ``lo..hi`` characters from a 65-character alphabet (the spec's v-string)."""
    n = idx.size
    lengths = _int(seed, stream, idx, lo, hi)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    row = np.repeat(idx.astype(np.int64), lengths)
    pos = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], lengths)
    u = counter_uniform(seed, _S[stream] + _SUB, row * hi + pos)
    data = _ALNUM[np.minimum((u * _ALNUM.size).astype(np.int64), _ALNUM.size - 1)]
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())).cast(pa.string())


def _text(seed: int, stream: str, idx: np.ndarray, lo: int, hi: int) -> pa.Array:
    """Comments of ``lo..hi`` words from :data:`_WORDS`, separated by single spaces."""
    count = _int(seed, stream, idx, lo, hi)
    vocab = pa.array(_WORDS, type=pa.string())
    base = idx.astype(np.int64) * hi
    columns = []
    for j in range(hi):
        u = counter_uniform(seed, _S[stream] + _SUB, base + j)
        codes = np.minimum((u * len(_WORDS)).astype(np.int64), len(_WORDS) - 1)
        columns.append(vocab.take(pa.array(codes, mask=count <= j)))
    if len(columns) == 1:
        return columns[0]
    return pc.binary_join_element_wise(*columns, " ", null_handling="skip")


def _phones(seed: int, stream: str, idx: np.ndarray, nation: np.ndarray) -> pa.Array:
    """``CC-LLL-LLL-LLLL`` with country code nation + 10 (clause 4.2.2.9)."""
    base = idx.astype(np.int64) * 3
    u = [counter_uniform(seed, _S[stream], base + j) for j in range(3)]
    parts = [nation + 10, 100 + np.floor(u[0] * 900).astype(np.int64),
             100 + np.floor(u[1] * 900).astype(np.int64), 1000 + np.floor(u[2] * 9000).astype(np.int64)]
    return pc.binary_join_element_wise(*[pc.cast(pa.array(p), pa.string()) for p in parts], "-")


def _date(days: np.ndarray) -> pa.Array:
    return pa.array(days.astype(np.int32), type=pa.date32())


# --- tables -------------------------------------------------------------------------------------


def _region(seed: int) -> pa.Table:
    idx = np.arange(5, dtype=np.int64)
    return pa.table({"r_regionkey": pa.array(idx), "r_name": pa.array(REGIONS),
                     "r_comment": _text(seed, "r_comment", idx, 5, 20)})


def _nation(seed: int) -> pa.Table:
    idx = np.arange(25, dtype=np.int64)
    return pa.table({"n_nationkey": pa.array(idx), "n_name": pa.array([n for n, _ in NATIONS]),
                     "n_regionkey": pa.array([r for _, r in NATIONS], type=pa.int64()),
                     "n_comment": _text(seed, "n_comment", idx, 5, 20)})


def _supplier(seed: int, sizes: dict[str, int]) -> pa.Table:
    n = sizes["supplier"]
    idx = np.arange(n, dtype=np.int64)
    key = idx + 1
    nation = _int(seed, "s_nation", idx, 0, 24)
    comment = _text(seed, "s_comment", idx, 4, 14)
    # clause 4.2.3: about SF·5 suppliers say "Customer … Complaints", as many "Customer … Recommends"
    u = counter_uniform(seed, _S["s_bbb"], idx)
    complaints = pc.binary_join_element_wise(comment, "Customer slyly Complaints", " ")
    recommends = pc.binary_join_element_wise(comment, "Customer quickly Recommends", " ")
    comment = pc.if_else(pa.array(u < 0.0005), complaints,
                         pc.if_else(pa.array(u > 0.9995), recommends, comment))
    return pa.table({
        "s_suppkey": pa.array(key), "s_name": _padded("Supplier#", key),
        "s_address": _vstring(seed, "s_address", idx, 10, 40), "s_nationkey": pa.array(nation),
        "s_phone": _phones(seed, "s_phone", idx, nation),
        "s_acctbal": pa.array(_cents(seed, "s_acctbal", idx, -99_999, 999_999)), "s_comment": comment,
    })


def _part(seed: int, sizes: dict[str, int]) -> pa.Table:
    n = sizes["part"]
    idx = np.arange(n, dtype=np.int64)
    key = idx + 1
    start = _int(seed, "p_name_a", idx, 0, 91)
    steps = np.array([b for b in range(1, 92) if b % 23], dtype=np.int64)  # 5 distinct words mod 92
    step = steps[_int(seed, "p_name_b", idx, 0, steps.size - 1)]
    colours = pa.array(COLOURS, type=pa.string())
    name = pc.binary_join_element_wise(
        *[colours.take(pa.array((start + j * step) % 92)) for j in range(5)], " ")
    mfgr = _int(seed, "p_mfgr", idx, 1, 5)
    brand = (mfgr - 1) * 5 + _int(seed, "p_brand", idx, 1, 5) - 1
    return pa.table({
        "p_partkey": pa.array(key), "p_name": name, "p_mfgr": _pick(MANUFACTURERS, mfgr - 1),
        "p_brand": _pick(BRANDS, brand), "p_type": _pick(TYPES, _int(seed, "p_type", idx, 0, 149)),
        "p_size": pa.array(_int(seed, "p_size", idx, 1, 50)),
        "p_container": _pick(CONTAINERS, _int(seed, "p_container", idx, 0, 39)),
        "p_retailprice": pa.array(retail_price_cents(key) / 100.0),
        "p_comment": _text(seed, "p_comment", idx, 1, 3),
    })


def _partsupp(seed: int, sizes: dict[str, int]) -> pa.Table:
    n = sizes["part"]
    idx = np.arange(4 * n, dtype=np.int64)
    partkey = idx // 4 + 1
    return pa.table({
        "ps_partkey": pa.array(partkey),
        "ps_suppkey": pa.array(_supplier_of(partkey, idx % 4, sizes["supplier"])),
        "ps_availqty": pa.array(_int(seed, "ps_availqty", idx, 1, 9_999)),
        "ps_supplycost": pa.array(_cents(seed, "ps_supplycost", idx, 100, 100_000)),
        "ps_comment": _text(seed, "ps_comment", idx, 8, 30),
    })


def _customer(seed: int, sizes: dict[str, int]) -> pa.Table:
    n = sizes["customer"]
    idx = np.arange(n, dtype=np.int64)
    key = idx + 1
    nation = _int(seed, "c_nation", idx, 0, 24)
    return pa.table({
        "c_custkey": pa.array(key), "c_name": _padded("Customer#", key),
        "c_address": _vstring(seed, "c_address", idx, 10, 40), "c_nationkey": pa.array(nation),
        "c_phone": _phones(seed, "c_phone", idx, nation),
        "c_acctbal": pa.array(_cents(seed, "c_acctbal", idx, -99_999, 999_999)),
        "c_mktsegment": _pick(SEGMENTS, _int(seed, "c_segment", idx, 0, 4)),
        "c_comment": _text(seed, "c_comment", idx, 5, 16),
    })


def _orders_and_lines(seed: int, sizes: dict[str, int], lo: int, hi: int,
                      denormalised: bool) -> tuple[pa.Table, pa.Table]:
    """Orders ``lo .. hi - 1`` (by index) and their lines; draws indexed by order (and line)."""
    customers, parts, suppliers = sizes["customer"], sizes["part"], sizes["supplier"]
    idx = np.arange(lo, hi, dtype=np.int64)
    orderkey = (idx // 8) * 32 + idx % 8 + 1
    active = customers - customers // 3  # customers with c_custkey mod 3 != 0
    j = _int(seed, "o_custkey", idx, 0, active - 1)
    custkey = 3 * (j // 2) + j % 2 + 1  # the j-th integer that is not a multiple of 3
    orderdate = _days(STARTDATE) + _int(seed, "o_date", idx, 0, _days(ENDDATE) - 151 - _days(STARTDATE))
    n_lines = _int(seed, "o_lines", idx, 1, 7)

    # lines: draw index = order index · 7 + (line number − 1), independent of chunking
    order_of = np.repeat(np.arange(idx.size, dtype=np.int64), n_lines)
    starts = np.zeros(idx.size, dtype=np.int64)
    np.cumsum(n_lines[:-1], out=starts[1:])
    line = np.arange(order_of.size, dtype=np.int64) - starts[order_of] + 1
    lidx = idx[order_of] * 7 + line - 1
    partkey = _int(seed, "l_partkey", lidx, 1, parts)
    suppkey = _supplier_of(partkey, _int(seed, "l_supp", lidx, 0, 3), suppliers)
    quantity = _int(seed, "l_quantity", lidx, 1, 50)
    price_cents = quantity * retail_price_cents(partkey)
    discount = _int(seed, "l_discount", lidx, 0, 10)  # in hundredths
    tax = _int(seed, "l_tax", lidx, 0, 8)
    shipdate = orderdate[order_of] + _int(seed, "l_ship", lidx, 1, 121)
    commitdate = orderdate[order_of] + _int(seed, "l_commit", lidx, 30, 90)
    receiptdate = shipdate + _int(seed, "l_receipt", lidx, 1, 30)
    current = _days(CURRENTDATE)
    flag = np.where(receiptdate <= current,
                    np.where(counter_uniform(seed, _S["l_flag"], lidx) < 0.5, 0, 1), 2)  # R, A, N
    status_f = shipdate <= current  # F, else O

    # orders' derived columns (dbgen's integer-cent arithmetic for the total price)
    charge = price_cents * (100 - discount) // 100 * (100 + tax) // 100
    total = np.add.reduceat(charge, starts) if idx.size else charge[:0]
    n_f = np.add.reduceat(status_f.astype(np.int64), starts) if idx.size else n_lines[:0]
    status = np.where(n_f == n_lines, 0, np.where(n_f == 0, 1, 2))  # F, O, P
    oidx = idx
    orders = pa.table({
        "o_orderkey": pa.array(orderkey), "o_custkey": pa.array(custkey),
        "o_orderstatus": _pick(("F", "O", "P"), status), "o_totalprice": pa.array(total / 100.0),
        "o_orderdate": _date(orderdate), "o_orderpriority": _pick(PRIORITIES, _int(seed, "o_priority", oidx, 0, 4)),
        "o_clerk": _padded("Clerk#", _int(seed, "o_clerk", oidx, 1, max(1, int(sizes["supplier"] / 10)))),
        "o_shippriority": pa.array(np.zeros(idx.size, dtype=np.int64)),
        "o_comment": _text(seed, "o_comment", oidx, 3, 11),
    })
    columns = {"l_orderkey": pa.array(orderkey[order_of])}
    if denormalised:
        columns["l_custkey"] = pa.array(custkey[order_of])
    columns.update({
        "l_partkey": pa.array(partkey), "l_suppkey": pa.array(suppkey), "l_linenumber": pa.array(line),
        "l_quantity": pa.array(quantity), "l_extendedprice": pa.array(price_cents / 100.0),
        "l_discount": pa.array(discount / 100.0), "l_tax": pa.array(tax / 100.0),
        "l_returnflag": _pick(("R", "A", "N"), flag), "l_linestatus": _pick(("F", "O"), np.where(status_f, 0, 1)),
        "l_shipdate": _date(shipdate), "l_commitdate": _date(commitdate), "l_receiptdate": _date(receiptdate),
        "l_shipinstruct": _pick(SHIP_INSTRUCT, _int(seed, "l_instruct", lidx, 0, 3)),
        "l_shipmode": _pick(SHIP_MODES, _int(seed, "l_mode", lidx, 0, 6)),
        "l_comment": _text(seed, "l_comment", lidx, 2, 6),
    })
    return orders, pa.table(columns)


def _chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, size):
        yield lo, min(n, lo + size)


def tpch_tables(scale_factor: float = DEFAULT_SF, seed: int = DEFAULT_SEED, *,
                denormalised: bool = False) -> dict[str, pa.Table]:
    """The 8 TPC-H tables in memory (see the module docstring); for small scale factors.

    Deterministic: the same ``(scale_factor, seed)`` gives equal tables.

    Args:
        scale_factor: SF in [0.001, 10]; 0.01 is 1,500 customers and about 60,000 lineitems.
        seed: any int.
        denormalised: also return ``lineitem_custkey``: lineitem with ``l_custkey`` (the
            customer of its order) after ``l_orderkey``.

    Returns:
        table name → ``pa.Table`` (the spec's column names, lower case).

    Raises:
        InvalidRequest: ``scale_factor`` out of range.
    """
    sizes = table_sizes(scale_factor)
    out = {"region": _region(seed), "nation": _nation(seed), "supplier": _supplier(seed, sizes),
           "customer": _customer(seed, sizes), "part": _part(seed, sizes), "partsupp": _partsupp(seed, sizes)}
    orders, lines = _orders_and_lines(seed, sizes, 0, sizes["orders"], denormalised)
    out["orders"] = orders
    if denormalised:
        out["lineitem"] = lines.drop_columns(["l_custkey"])
        out["lineitem_custkey"] = lines
    else:
        out["lineitem"] = lines
    return out


def generate_tpch(out_dir: Path, scale_factor: float = DEFAULT_SF, seed: int = DEFAULT_SEED, *,
                  denormalised: bool = False, chunk_orders: int = 500_000,
                  progress: Callable[[str], None] | None = None) -> dict[str, Path]:
    """Write the TPC-H tables as ``<table>.parquet`` into ``out_dir`` (chunked: constant memory).

    Each file is written to a temporary name and renamed (atomic). The same ``(scale_factor,
    seed)`` gives the same rows whatever ``chunk_orders`` (draws are indexed by row), and
    byte-identical files for one ``chunk_orders`` and pyarrow version (row groups follow the
    chunks). About 10 s per million lineitems on one core.

    Args:
        out_dir: destination folder (created if missing).
        scale_factor: SF in [0.001, 10].
        seed: any int.
        denormalised: also write ``lineitem_custkey.parquet`` (lineitem with ``l_custkey``).
        chunk_orders: orders generated per chunk (with their lines).
        progress: optional callback receiving one line per step.

    Returns:
        table name → path (``lineitem_custkey`` included when ``denormalised``).

    Raises:
        InvalidRequest: ``scale_factor`` out of range or ``chunk_orders`` < 1.
        OSError: if a file cannot be written.
    """
    if isinstance(chunk_orders, bool) or not isinstance(chunk_orders, int) or chunk_orders < 1:
        raise InvalidRequest("chunk_orders must be a positive integer", {"chunk_orders": repr(chunk_orders)})
    sizes = table_sizes(scale_factor)
    say = progress or (lambda _msg: None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"generating TPC-H at SF {scale_factor:g}, seed {seed}: {sizes['orders']:,} orders, "
        f"~{sizes['lineitem']:,} lineitems")
    paths: dict[str, Path] = {}
    small = {"region": _region, "nation": _nation}
    for name in ("region", "nation"):
        paths[name] = write_parquet(small[name](seed), out_dir / f"{name}.parquet")
    for name, build in (("supplier", _supplier), ("customer", _customer), ("part", _part),
                        ("partsupp", _partsupp)):
        table = build(seed, sizes)
        paths[name] = write_parquet(table, out_dir / f"{name}.parquet")
        say(f"wrote {paths[name]} ({table.num_rows:,} rows)")
    names = ["orders", "lineitem"] + (["lineitem_custkey"] if denormalised else [])
    targets = {n: out_dir / f"{n}.parquet" for n in names}
    tmps = {n: _tmp_next_to(p) for n, p in targets.items()}
    writers: dict[str, pq.ParquetWriter] = {}
    rows = dict.fromkeys(names, 0)
    try:
        for lo, hi in _chunks(sizes["orders"], chunk_orders):
            orders, lines = _orders_and_lines(seed, sizes, lo, hi, denormalised)
            parts = {"orders": orders, "lineitem": lines.drop_columns(["l_custkey"]) if denormalised else lines}
            if denormalised:
                parts["lineitem_custkey"] = lines
            for name, table in parts.items():
                if name not in writers:
                    writers[name] = pq.ParquetWriter(tmps[name], table.schema, compression="zstd")
                writers[name].write_table(table, row_group_size=1 << 20)
                rows[name] += table.num_rows
            say(f"orders {hi:,} / {sizes['orders']:,}")
        for name in names:
            writers.pop(name).close()
            os.replace(tmps[name], targets[name])
            paths[name] = targets[name]
            say(f"wrote {targets[name]} ({rows[name]:,} rows)")
    finally:
        for w in writers.values():
            w.close()
        for tmp in tmps.values():
            Path(tmp).unlink(missing_ok=True)
    return paths


def _tmp_next_to(path: Path) -> str:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return tmp
