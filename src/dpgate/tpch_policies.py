"""Contribution bounds and policies of the TPC-H tables with the customer as the privacy unit:
:func:`rows_per_customer_bound` derives m from the generation law (never from the data) and
:func:`tpch_policy` writes the policy file (the denormalised ``lineitem`` or the spec's one with
a privacy unit through foreign keys, issue 21).

Part of :mod:`dpgate.tpch`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpgate.errors import InvalidRequest
from dpgate.tpch_spec import DEFAULT_SEED, DEFAULT_SF, PRIORITIES, SEGMENTS, SHIP_INSTRUCT, SHIP_MODES, table_sizes

# --- contribution bounds and policies ----------------------------------------------------------


def rows_per_customer_bound(scale_factor: float, *, lines: bool, failure: float = 1e-6) -> int:
    """The smallest m such that P(some customer has more than m orders, or lines) ≤ ``failure``.

    From the generation law, not from data: a customer that orders has Binomial(n, 1/a) orders,
    n = 10·C orders, a = C − ⌊C/3⌋ customers that order (o_custkey uniform over them, clause
    4.2.3); each order has 1..7 lines, uniform and independent. The distribution of a customer's
    lines is the Binomial mixture of sums of uniform 1..7 counts, computed exactly by
    convolution; the union bound over the a customers gives ``a · P(X > m) ≤ failure``.

    Args:
        scale_factor: SF in [0.001, 10].
        lines: True for lineitems per customer, False for orders per customer.
        failure: the accepted probability that the bound does not hold on a generated dataset.

    Returns:
        m (43 orders / 193 lines at SF 0.01; 49 / 222 at SF 10).
    """
    from scipy.stats import binom  # scipy is a dependency (sample_data); imported only here

    sizes = table_sizes(scale_factor)
    active = sizes["customer"] - sizes["customer"] // 3
    top = 120
    pmf = binom.pmf(np.arange(top + 1), sizes["orders"], 1.0 / active)
    if not lines:
        dist = pmf
    else:
        width = 7 * top + 1
        dist = np.zeros(width)
        cur = np.zeros(width)
        cur[0] = 1.0
        step = np.r_[0.0, np.full(7, 1 / 7)]
        for n in range(top + 1):
            dist += pmf[n] * cur
            cur = np.convolve(cur, step)[:width]
    # P(X > m) = Σ_{x > m} P(X = x), summed from the top (1 − cumsum would lose the small tail)
    tail = np.r_[np.cumsum(dist[::-1])[::-1][1:], 0.0]
    return int(next(m for m in range(tail.size) if active * tail[m] <= failure))


#: Contribution bounds of the policies for the customer as the privacy unit, valid for every
#: SF ≤ 10 with failure probability ≤ 1e-6 (:func:`rows_per_customer_bound`: 49 orders and 222
#: lines at SF 10, rounded up).
MAX_ORDERS_PER_CUSTOMER = 50
MAX_LINES_PER_CUSTOMER = 225


def tpch_policy(data_dir: str | Path, scale_factor: float = DEFAULT_SF, *, variant: str = "fk",
                name: str | None = None, population: str = "tpch-customers", seed: int = DEFAULT_SEED) -> str:
    """The policy (TOML text) of the TPC-H tables with the customer as the privacy unit.

    ``customer`` and ``orders`` are protected by ``c_custkey`` / ``o_custkey``; ``nation``,
    ``region``, ``supplier``, ``part`` and ``partsupp`` are public (no customer's data);
    ``lineitem`` is protected: with ``variant = "denormalised"`` it is
    ``lineitem_custkey.parquet`` with the unit column ``l_custkey``; with ``variant = "fk"``
    it is the spec's ``lineitem.parquet`` whose unit is the foreign-key path
    ``l_orderkey → orders.o_orderkey → o_custkey`` (issue 21; the planner refuses it until
    that path is joined). Bounds come from the spec's domains at ``scale_factor``, k and m from
    :data:`MAX_ORDERS_PER_CUSTOMER` / :data:`MAX_LINES_PER_CUSTOMER`; the file's comments
    give each justification.

    Args:
        data_dir: the folder holding the Parquet files, written into ``source`` as given (a
            placeholder such as ``"{tpch}"`` is kept as it is).
        scale_factor: the SF the files were generated at (key ranges of supplier/part keys).
        variant: ``"fk"`` or ``"denormalised"``.
        name: the dataset name (default ``tpch_fk`` / ``tpch``).
        population: the ledger population.
        seed: the seed the files were generated with (part of the declared ``data_version``,
            ``tpch-sf<SF>-seed<seed>``, so releases of other data are never served from cache).

    Raises:
        InvalidRequest: an unknown variant or a scale factor out of range.
    """
    if variant not in ("fk", "denormalised"):
        raise InvalidRequest("variant must be 'fk' or 'denormalised'", {"variant": variant})
    sizes = table_sizes(scale_factor)
    name = name or ("tpch_fk" if variant == "fk" else "tpch")
    d = str(data_dir)
    s, p = sizes["supplier"], sizes["part"]

    def keys(values) -> str:
        return "[" + ", ".join(f'"{v}"' for v in values) + "]"

    lineitem_unit = ('privacy_unit = { path = ["l_orderkey -> orders.o_orderkey", "o_custkey"] }'
                     if variant == "fk" else 'privacy_unit = "l_custkey"')
    lineitem_source = "lineitem" if variant == "fk" else "lineitem_custkey"
    lineitem_custkey = "" if variant == "fk" else 'l_custkey       = { type = "int" }\n'
    lineitem_note = (
        "# Its rows carry no customer column: each belongs to the customer of its order, through\n"
        "# l_orderkey -> orders.o_orderkey (declared unique there) -> o_custkey (issue 21).\n"
        if variant == "fk" else
        "# The denormalised layout: l_custkey is the customer of the line's order (o_custkey).\n")
    return f'''# TPC-H with the customer as the privacy unit (dpgate.tpch; generated by tpch_policy(), do not edit:
# tests/test_tpch.py checks that this file is what the code writes). Scale factor {scale_factor:g}:
# {sizes["customer"]:,} customers, {sizes["orders"]:,} orders, ~{sizes["lineitem"]:,} lineitems.
#
# Bounds come from the TPC-H specification's domains (v3.0.1 clause 4.2.3), never from data.
# k and m (max_groups_per_unit, max_rows_per_unit) from the generation law (dpgate.tpch.
# rows_per_customer_bound): o_custkey is uniform over the customers with c_custkey mod 3 != 0,
# so a customer has Binomial(10 C, 1 / (C - C/3)) orders (mean 15) and 1..7 lines per order
# (mean 60); P(some customer has more than {MAX_ORDERS_PER_CUSTOMER} orders or more than {MAX_LINES_PER_CUSTOMER} lines) < 1e-6 at every SF <= 10,
# so the caps never clip this data and releases match exact answers. k = m: every row lies in one
# group, so a customer's m rows touch at most m groups. Lower k for utility (at the price of
# clipping heavy customers).

[dataset]
name = "{name}"
population = "{population}"
data_version = "tpch-sf{scale_factor:g}-seed{seed}"

[budget]
epsilon = 1e9
delta = 1e-6
default_query_rho = 10000

[allocations]
analysts = 1.0

# --- public tables: the spec's reference data (nothing about any customer) ---

[tables.region]
source = "{d}/region.parquet"
public = true

[tables.region.columns]
r_regionkey = {{ type = "int", unique = true }}
r_name      = {{ type = "text" }}
r_comment   = {{ type = "text" }}

[tables.nation]
source = "{d}/nation.parquet"
public = true

[tables.nation.columns]
n_nationkey = {{ type = "int", unique = true }}
n_name      = {{ type = "text" }}
n_regionkey = {{ type = "int" }}
n_comment   = {{ type = "text" }}

[tables.supplier]
source = "{d}/supplier.parquet"
public = true

[tables.supplier.columns]
s_suppkey   = {{ type = "int", unique = true }}
s_name      = {{ type = "text" }}
s_address   = {{ type = "text" }}
s_nationkey = {{ type = "int" }}
s_phone     = {{ type = "text" }}
s_acctbal   = {{ type = "float", lower = -999.99, upper = 9999.99, resolution = 0.01 }}
s_comment   = {{ type = "text" }}

[tables.part]
source = "{d}/part.parquet"
public = true

[tables.part.columns]
p_partkey     = {{ type = "int", unique = true }}
p_name        = {{ type = "text" }}
p_mfgr        = {{ type = "text" }}
p_brand       = {{ type = "text" }}
p_type        = {{ type = "text" }}
p_size        = {{ type = "int", lower = 1, upper = 50 }}
p_container   = {{ type = "text" }}
p_retailprice = {{ type = "float", lower = 900, upper = 2099, resolution = 0.01 }}
p_comment     = {{ type = "text" }}

[tables.partsupp]
source = "{d}/partsupp.parquet"
public = true

[tables.partsupp.columns]
ps_partkey    = {{ type = "int" }}
ps_suppkey    = {{ type = "int" }}
ps_availqty   = {{ type = "int", lower = 1, upper = 9999 }}
ps_supplycost = {{ type = "float", lower = 1, upper = 1000, resolution = 0.01 }}
ps_comment    = {{ type = "text" }}

# --- protected tables: the customer (c_custkey = o_custkey{"" if variant == "fk" else " = l_custkey"}) is the privacy unit ---

# One row per customer (c_custkey is the primary key): k = m = 1.
[tables.customer]
source = "{d}/customer.parquet"
privacy_unit = "c_custkey"
max_groups_per_unit = 1
max_rows_per_unit = 1

[tables.customer.columns]
c_custkey    = {{ type = "int", unique = true }}
c_name       = {{ type = "text" }}
c_address    = {{ type = "text" }}
c_nationkey  = {{ type = "int", public_keys = "range(0, 25)" }}
c_phone      = {{ type = "text" }}
c_acctbal    = {{ type = "float", lower = -999.99, upper = 9999.99, resolution = 0.01 }}
c_mktsegment = {{ type = "text", public_keys = {keys(SEGMENTS)} }}
c_comment    = {{ type = "text" }}

# A customer has at most {MAX_ORDERS_PER_CUSTOMER} orders (see the header). o_totalprice: at most 7 lines of
# 50 x 2099.00 with tax 0.08 and no discount = 793422.00; at least 1 x 900.00 x 0.90 = 810.00.
[tables.orders]
source = "{d}/orders.parquet"
privacy_unit = "o_custkey"
max_groups_per_unit = {MAX_ORDERS_PER_CUSTOMER}
max_rows_per_unit = {MAX_ORDERS_PER_CUSTOMER}

[tables.orders.columns]
o_orderkey      = {{ type = "int", unique = true }}
o_custkey       = {{ type = "int" }}
o_orderstatus   = {{ type = "text", public_keys = ["F", "O", "P"] }}
o_totalprice    = {{ type = "float", lower = 810, upper = 793422, resolution = 0.01 }}
o_orderdate     = {{ type = "date", lower = "1992-01-01", upper = "1998-08-02" }}
o_orderpriority = {{ type = "text", public_keys = {keys(PRIORITIES)} }}
o_clerk         = {{ type = "text" }}
o_shippriority  = {{ type = "int", lower = 0, upper = 0, public_keys = [0] }}
o_comment       = {{ type = "text" }}

# A customer has at most {MAX_LINES_PER_CUSTOMER} lines (see the header).
{lineitem_note}# l_extendedprice = l_quantity x p_retailprice in [1 x 900.00, 50 x 2099.00]; dates from the
# order date (1992-01-01 .. 1998-08-02) + 1..121 (ship), + 30..90 (commit), ship + 1..30 (receipt).
[tables.lineitem]
source = "{d}/{lineitem_source}.parquet"
{lineitem_unit}
max_groups_per_unit = {MAX_LINES_PER_CUSTOMER}
max_rows_per_unit = {MAX_LINES_PER_CUSTOMER}

[tables.lineitem.columns]
l_orderkey      = {{ type = "int" }}
{lineitem_custkey}l_partkey       = {{ type = "int", public_keys = "range(1, {p + 1})" }}
l_suppkey       = {{ type = "int", public_keys = "range(1, {s + 1})" }}
l_linenumber    = {{ type = "int", lower = 1, upper = 7, public_keys = "range(1, 8)" }}
l_quantity      = {{ type = "int", lower = 1, upper = 50, public_keys = "range(1, 51)" }}
l_extendedprice = {{ type = "float", lower = 900, upper = 104950, resolution = 0.01 }}
l_discount      = {{ type = "float", lower = 0, upper = 0.1, resolution = 0.01 }}
l_tax           = {{ type = "float", lower = 0, upper = 0.08, resolution = 0.01 }}
l_returnflag    = {{ type = "text", public_keys = ["A", "N", "R"] }}
l_linestatus    = {{ type = "text", public_keys = ["F", "O"] }}
l_shipdate      = {{ type = "date", lower = "1992-01-02", upper = "1998-12-01" }}
l_commitdate    = {{ type = "date", lower = "1992-01-31", upper = "1998-10-31" }}
l_receiptdate   = {{ type = "date", lower = "1992-01-03", upper = "1998-12-31" }}
l_shipinstruct  = {{ type = "text", public_keys = {keys(SHIP_INSTRUCT)} }}
l_shipmode      = {{ type = "text", public_keys = {keys(SHIP_MODES)} }}
l_comment       = {{ type = "text" }}
'''
