"""The TPC-H-shaped dataset of dpgate.tpch: the spec's sizes, domains and key relationships,
determinism, and the policies' contribution bounds (derived from the generation law, checked
here by an independent computation). Relationships are checked with SQL in DuckDB, written from
the spec (TPC-H v3.0.1 clause 4.2.3), not from the generator's code.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy.stats import binom

from dpgate.errors import InvalidRequest
from dpgate.policy import load_policies
from dpgate.tpch import (
    BRANDS, COLOURS, CONTAINERS, MAX_LINES_PER_CUSTOMER, MAX_ORDERS_PER_CUSTOMER, NATIONS, REGIONS, TYPES,
    generate_tpch, retail_price_cents, rows_per_customer_bound, table_sizes, tpch_policy, tpch_tables,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "policies" / "corpus"


@pytest.fixture(scope="module")
def tables():
    return tpch_tables(0.01, denormalised=True)


@pytest.fixture(scope="module")
def con(tables):
    c = duckdb.connect()
    for name, t in tables.items():
        c.register(name, t)
    yield c
    c.close()


def one(con, sql):
    return con.execute(sql).fetchone()


def test_sizes_follow_the_scale_factor(tables):
    assert {k: t.num_rows for k, t in tables.items() if k not in ("lineitem", "lineitem_custkey")} == {
        "region": 5, "nation": 25, "supplier": 100, "customer": 1500, "part": 2000, "partsupp": 8000,
        "orders": 15000}
    assert 57_000 < tables["lineitem"].num_rows < 63_000  # 4 lines per order on average
    assert table_sizes(1) == {"region": 5, "nation": 25, "supplier": 10_000, "customer": 150_000, "part": 200_000,
                              "partsupp": 800_000, "orders": 1_500_000, "lineitem": 6_000_000}
    for bad in (0, 0.0001, 11, "1", True, float("nan")):
        with pytest.raises(InvalidRequest):
            table_sizes(bad)


def test_lineitem_has_no_customer_column_unless_denormalised(tables, con):
    assert not any("cust" in n for n in tables["lineitem"].column_names)
    assert tables["lineitem_custkey"].column_names[:2] == ["l_orderkey", "l_custkey"]
    # l_custkey is the customer of the line's order
    assert one(con, "SELECT count(*) FROM lineitem_custkey l JOIN orders o ON l.l_orderkey = o.o_orderkey "
                    "WHERE l.l_custkey <> o.o_custkey") == (0,)
    assert tables["lineitem_custkey"].drop_columns(["l_custkey"]).equals(tables["lineitem"])


def test_keys_are_unique_and_orderkeys_sparse(con):
    for table, key in (("customer", "c_custkey"), ("orders", "o_orderkey"), ("part", "p_partkey"),
                       ("supplier", "s_suppkey"), ("partsupp", "ps_partkey, ps_suppkey"),
                       ("lineitem", "l_orderkey, l_linenumber"), ("nation", "n_nationkey"),
                       ("region", "r_regionkey")):
        n, d = one(con, f"SELECT count(*), count(DISTINCT ({key})) FROM {table}")
        assert n == d, table
    # 8 of every 32 keys (clause 4.2.3: o_orderkey sparse), starting at 1
    assert one(con, "SELECT count(*) FROM orders WHERE (o_orderkey - 1) % 32 >= 8") == (0,)
    assert one(con, "SELECT min(o_orderkey), max(o_orderkey) FROM orders") == (1, (15000 - 1) // 8 * 32 + 7 + 1)


def test_orders_belong_to_customers_not_divisible_by_three(con):
    assert one(con, "SELECT count(*) FROM orders WHERE o_custkey % 3 = 0 OR o_custkey NOT IN "
                    "(SELECT c_custkey FROM customer)") == (0,)
    # about 2/3 of the customers order, and nearly all of those do
    assert 980 <= one(con, "SELECT count(DISTINCT o_custkey) FROM orders")[0] <= 1000


def test_one_to_seven_lines_numbered_from_one(con):
    lo, hi, bad = one(con, "SELECT min(n), max(n), count(*) FILTER (WHERE n <> mx) FROM (SELECT l_orderkey, "
                           "count(*) AS n, max(l_linenumber) AS mx FROM lineitem GROUP BY l_orderkey)")
    assert (lo, hi, bad) == (1, 7, 0)
    assert one(con, "SELECT count(*) FROM orders WHERE o_orderkey NOT IN (SELECT l_orderkey FROM lineitem)") == (0,)
    assert one(con, "SELECT count(*) FROM lineitem WHERE l_orderkey NOT IN (SELECT o_orderkey FROM orders)") == (0,)


def test_prices_and_suppliers_follow_the_part(con):
    # P_RETAILPRICE = (90000 + ((P_PARTKEY/10) modulo 20001) + 100 * (P_PARTKEY modulo 1000)) / 100
    assert one(con, "SELECT count(*) FROM part WHERE round(p_retailprice * 100) <> "
                    "90000 + (p_partkey // 10) % 20001 + 100 * (p_partkey % 1000)") == (0,)
    # L_EXTENDEDPRICE = L_QUANTITY * P_RETAILPRICE (to the cent)
    assert one(con, "SELECT count(*) FROM lineitem JOIN part ON l_partkey = p_partkey "
                    "WHERE round(l_extendedprice * 100) <> l_quantity * round(p_retailprice * 100)") == (0,)
    # every line's supplier is one of its part's four suppliers in partsupp
    assert one(con, "SELECT count(*) FROM lineitem l LEFT JOIN partsupp ps ON l.l_partkey = ps.ps_partkey "
                    "AND l.l_suppkey = ps.ps_suppkey WHERE ps.ps_partkey IS NULL") == (0,)
    assert one(con, "SELECT min(n), max(n) FROM (SELECT count(DISTINCT ps_suppkey) AS n FROM partsupp "
                    "GROUP BY ps_partkey)") == (4, 4)


def test_dates_flags_and_statuses(con):
    assert one(con, "SELECT min(o_orderdate), max(o_orderdate) <= DATE '1998-08-02' FROM orders") == (
        __import__("datetime").date(1992, 1, 1), True)
    assert one(con, """SELECT count(*) FROM lineitem JOIN orders ON l_orderkey = o_orderkey WHERE
        l_shipdate - o_orderdate NOT BETWEEN 1 AND 121 OR l_commitdate - o_orderdate NOT BETWEEN 30 AND 90
        OR l_receiptdate - l_shipdate NOT BETWEEN 1 AND 30""") == (0,)
    assert one(con, """SELECT count(*) FROM lineitem WHERE
        (l_receiptdate <= DATE '1995-06-17') <> (l_returnflag IN ('R', 'A'))
        OR (l_shipdate > DATE '1995-06-17') <> (l_linestatus = 'O')""") == (0,)
    assert one(con, "SELECT count(DISTINCT l_returnflag) FROM lineitem WHERE l_returnflag <> 'N'") == (2,)
    # O_ORDERSTATUS: F when all its lines are F, O when all are O, else P
    assert one(con, """SELECT count(*) FROM orders JOIN (SELECT l_orderkey, bool_and(l_linestatus = 'F') AS f,
        bool_and(l_linestatus = 'O') AS o FROM lineitem GROUP BY l_orderkey) s ON o_orderkey = l_orderkey
        WHERE o_orderstatus <> CASE WHEN f THEN 'F' WHEN o THEN 'O' ELSE 'P' END""") == (0,)
    assert one(con, "SELECT count(DISTINCT o_orderstatus) FROM orders") == (3,)


def test_total_price_is_the_sum_of_the_charges(con):
    # dbgen's integer-cent arithmetic: sum(eprice * (100 - disc) / 100 * (100 + tax) / 100)
    assert one(con, """SELECT count(*) FROM orders JOIN (SELECT l_orderkey,
        sum(round(l_extendedprice * 100)::BIGINT * (100 - round(l_discount * 100)::BIGINT) // 100
            * (100 + round(l_tax * 100)::BIGINT) // 100) AS cents FROM lineitem GROUP BY l_orderkey) s
        ON o_orderkey = l_orderkey WHERE round(o_totalprice * 100)::BIGINT <> cents""") == (0,)


def test_domains(con, tables):
    assert one(con, "SELECT min(l_quantity), max(l_quantity), min(l_discount), max(l_discount), min(l_tax), "
                    "max(l_tax) FROM lineitem") == (1, 50, 0.0, 0.1, 0.0, 0.08)
    assert one(con, "SELECT count(DISTINCT l_discount), count(DISTINCT l_tax) FROM lineitem") == (11, 9)
    for t in ("customer", "supplier"):
        p = t[0]
        lo, hi = one(con, f"SELECT min({p}_acctbal), max({p}_acctbal) FROM {t}")
        assert -999.99 <= lo < 0 < hi <= 9999.99
    assert one(con, "SELECT min(ps_availqty) >= 1, max(ps_availqty) <= 9999, min(ps_supplycost) >= 1, "
                    "max(ps_supplycost) <= 1000 FROM partsupp") == (True, True, True, True)
    assert one(con, "SELECT min(p_size), max(p_size) FROM part") == (1, 50)
    assert {r[0] for r in con.execute("SELECT DISTINCT p_type FROM part").fetchall()} <= set(TYPES)
    assert {r[0] for r in con.execute("SELECT DISTINCT p_container FROM part").fetchall()} == set(CONTAINERS)
    assert {r[0] for r in con.execute("SELECT DISTINCT p_brand FROM part").fetchall()} == set(BRANDS)
    assert one(con, "SELECT count(*) FROM part WHERE p_brand[7] <> p_mfgr[14]") == (0,)  # Brand#MN of Manufacturer#M
    names = tables["part"].column("p_name").to_pylist()
    assert all(len(set(n.split())) == 5 and set(n.split()) <= set(COLOURS) for n in names)
    assert [r for r in tables["nation"].select(["n_name", "n_regionkey"]).to_pylist()] == [
        {"n_name": n, "n_regionkey": r} for n, r in NATIONS]
    assert tables["region"].column("r_name").to_pylist() == list(REGIONS)
    # phone country code = nation key + 10
    assert one(con, "SELECT count(*) FROM customer WHERE c_phone[1:2]::INT <> c_nationkey + 10 "
                    "OR NOT regexp_full_match(c_phone, '\\d\\d-\\d{3}-\\d{3}-\\d{4}')") == (0,)
    # the comment words that the spec's queries filter on occur
    assert one(con, "SELECT count(*) FROM orders WHERE o_comment LIKE '%special%requests%'")[0] > 10
    assert one(con, "SELECT count(*) FROM part WHERE p_name LIKE '%green%'")[0] > 50


def test_deterministic_by_seed_and_independent_of_chunks(tmp_path):
    a = tpch_tables(0.002, seed=7)
    assert all(a[k].equals(t) for k, t in tpch_tables(0.002, seed=7).items())
    assert not a["lineitem"].equals(tpch_tables(0.002, seed=8)["lineitem"])
    paths = generate_tpch(tmp_path / "small", 0.002, seed=7, chunk_orders=777, denormalised=True)
    assert set(paths) == {"region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem",
                          "lineitem_custkey"}
    b = {k: pq.read_table(p) for k, p in paths.items()}
    full = tpch_tables(0.002, seed=7, denormalised=True)
    for name, table in full.items():
        assert b[name].equals(table), name
    again = generate_tpch(tmp_path / "again", 0.002, seed=7, chunk_orders=777)
    assert again["lineitem"].read_bytes() == paths["lineitem"].read_bytes()
    assert not list((tmp_path / "small").glob(".*.tmp"))
    with pytest.raises(InvalidRequest):
        generate_tpch(tmp_path / "bad", 0.002, chunk_orders=0)


# --- contribution bounds and policies ---------------------------------------------------------


def _lines_tail_by_generating_function(sf: float) -> tuple[int, np.ndarray]:
    """P(a customer has > m lines), independently of dpgate.tpch: the probability generating
    function of Binomial(n, p) orders, each with U{1..7} lines, is (1 − p + p·U(z))^n with
    U(z) = (z + … + z^7)/7; its coefficients (truncated at 2000 lines) by repeated squaring."""
    c = int(150_000 * sf)
    active, n = c - c // 3, 10 * c
    p = 1.0 / active
    width = 2000
    base = np.zeros(width)
    base[0] = 1 - p
    base[1:8] = p / 7

    def mul(a, b):
        return np.convolve(a, b)[:width]

    result, power, k = np.r_[1.0, np.zeros(width - 1)], base, n
    while k:
        if k & 1:
            result = mul(result, power)
        power = mul(power, power)
        k >>= 1
    return active, np.r_[np.cumsum(result[::-1])[::-1][1:], 0.0]  # P(X > m), summed from the top


@pytest.mark.parametrize("sf", [0.01, 1.0, 10.0])
def test_rows_per_customer_bounds_hold_by_an_independent_derivation(sf):
    c = int(150_000 * sf)
    active = c - c // 3
    m_orders = rows_per_customer_bound(sf, lines=False)
    # the union bound over the customers that order: active · P(Binomial(10c, 1/active) > m) ≤ 1e-6
    assert active * binom.sf(m_orders, 10 * c, 1 / active) <= 1e-6 < active * binom.sf(m_orders - 1, 10 * c, 1 / active)
    m_lines = rows_per_customer_bound(sf, lines=True)
    active, tail = _lines_tail_by_generating_function(sf)
    assert active * tail[m_lines] <= 1e-6 < active * tail[m_lines - 1]
    assert m_orders <= MAX_ORDERS_PER_CUSTOMER and m_lines <= MAX_LINES_PER_CUSTOMER


def test_the_generated_data_stays_within_the_caps(con):
    # not how the caps are chosen (that is the law above): a check that the data follows the law
    assert one(con, "SELECT max(n) FROM (SELECT count(*) AS n FROM orders GROUP BY o_custkey)")[0] <= 43
    assert one(con, "SELECT max(n) FROM (SELECT count(*) AS n FROM lineitem_custkey GROUP BY l_custkey)")[0] <= 193


def test_policy_bounds_are_the_spec_domains():
    keys = np.arange(1, 2_000_001)  # every part key up to SF 10
    cents = retail_price_cents(keys)
    # the formula's range: 90000 + [0, 20000] + 100 · [0, 999] cents = [900.00, 2099.00]
    assert 90_000 <= cents.min() and cents.max() <= 209_900 and cents.max() == 209_899
    policy = tomllib.loads(tpch_policy("/data", 0.01, variant="fk"))
    line = policy["tables"]["lineitem"]["columns"]
    assert (line["l_extendedprice"]["lower"], line["l_extendedprice"]["upper"]) == (1 * 900, 50 * 2099)
    total = policy["tables"]["orders"]["columns"]["o_totalprice"]
    assert total["upper"] == pytest.approx(7 * 50 * 2099 * 1.08) and total["lower"] == pytest.approx(900 * 0.9)
    assert line["l_suppkey"]["public_keys"] == "range(1, 101)" and line["l_partkey"]["public_keys"] == "range(1, 2001)"
    assert policy["tables"]["lineitem"]["max_rows_per_unit"] == MAX_LINES_PER_CUSTOMER
    assert policy["tables"]["orders"]["max_rows_per_unit"] == MAX_ORDERS_PER_CUSTOMER
    assert policy["tables"]["customer"]["max_rows_per_unit"] == 1
    assert all(policy["tables"][t].get("public") for t in ("region", "nation", "supplier", "part", "partsupp"))
    with pytest.raises(InvalidRequest):
        tpch_policy("/data", 0.01, variant="star")


@pytest.mark.parametrize("variant, file", [("denormalised", "tpch.toml"), ("fk", "tpch_fk.toml")])
def test_corpus_fixtures_are_what_the_code_writes(variant, file):
    assert (FIXTURES / file).read_text() == tpch_policy("{tpch}", 0.01, variant=variant)


def test_both_policies_load_on_the_data(tmp_path):
    from dpgate.engine import Engine

    generate_tpch(tmp_path / "data", 0.002, denormalised=True)
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "tpch.toml").write_text(tpch_policy(tmp_path / "data", 0.002, variant="denormalised"))
    (pol / "tpch_fk.toml").write_text(tpch_policy(tmp_path / "data", 0.002, variant="fk"))
    policies = load_policies(pol)  # one population, one cap
    assert policies["tpch_fk"].tables["lineitem"].unit_path is not None
    assert policies["tpch"].tables["lineitem"].privacy_unit == "l_custkey"
    engine = Engine(timeout_s=30)
    engine.load(policies)  # the unique keys hold on the data
    engine.close()
