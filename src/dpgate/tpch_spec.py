"""The TPC-H specification's scale, dates and domains (TPC Benchmark H, Standard Specification,
revision 3.0.1, clause 4.2): table sizes at a scale factor, the spec's lists (regions, nations,
segments, priorities, ship modes and instructions, part types, containers, brands, colours) and
its formulas for P_RETAILPRICE and the suppliers of a part.

Benchmark and test data only, not a noise source. Part of :mod:`dpgate.tpch`.
"""

from __future__ import annotations

import datetime as dt

import numpy as np

from dpgate.errors import InvalidRequest

#: Default scale factor: 1,500 customers, 15,000 orders, about 60,000 lineitems.
DEFAULT_SF = 0.01
#: Default seed.
DEFAULT_SEED = 2026
#: Smallest and largest scale factor accepted (10 suppliers at the smallest; 60M lines at the largest).
MIN_SF, MAX_SF = 0.001, 10.0
#: The spec's dates (clause 4.2.2.12).
STARTDATE = dt.date(1992, 1, 1)
CURRENTDATE = dt.date(1995, 6, 17)
ENDDATE = dt.date(1998, 12, 31)
#: The 8 tables in the spec's order.
TABLES = ("region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem")

REGIONS = ("AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST")
#: (name, region key) for nation keys 0..24 (clause 4.2.3).
NATIONS = (
    ("ALGERIA", 0), ("ARGENTINA", 1), ("BRAZIL", 1), ("CANADA", 1), ("EGYPT", 4), ("ETHIOPIA", 0),
    ("FRANCE", 3), ("GERMANY", 3), ("INDIA", 2), ("INDONESIA", 2), ("IRAN", 4), ("IRAQ", 4),
    ("JAPAN", 2), ("JORDAN", 4), ("KENYA", 0), ("MOROCCO", 0), ("MOZAMBIQUE", 0), ("PERU", 1),
    ("CHINA", 2), ("ROMANIA", 3), ("SAUDI ARABIA", 4), ("VIETNAM", 2), ("RUSSIA", 3),
    ("UNITED KINGDOM", 3), ("UNITED STATES", 1),
)
SEGMENTS = ("AUTOMOBILE", "BUILDING", "FURNITURE", "MACHINERY", "HOUSEHOLD")
PRIORITIES = ("1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW")
SHIP_INSTRUCT = ("DELIVER IN PERSON", "COLLECT COD", "NONE", "TAKE BACK RETURN")
SHIP_MODES = ("REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB")
_TYPE_1 = ("STANDARD", "SMALL", "MEDIUM", "LARGE", "ECONOMY", "PROMO")
_TYPE_2 = ("ANODIZED", "BURNISHED", "PLATED", "POLISHED", "BRUSHED")
_TYPE_3 = ("TIN", "NICKEL", "BRASS", "STEEL", "COPPER")
TYPES = tuple(f"{a} {b} {c}" for a in _TYPE_1 for b in _TYPE_2 for c in _TYPE_3)
_CONTAINER_1 = ("SM", "LG", "MED", "JUMBO", "WRAP")
_CONTAINER_2 = ("CASE", "BOX", "BAG", "JAR", "PKG", "PACK", "CAN", "DRUM")
CONTAINERS = tuple(f"{a} {b}" for a in _CONTAINER_1 for b in _CONTAINER_2)
BRANDS = tuple(f"Brand#{m}{n}" for m in range(1, 6) for n in range(1, 6))
MANUFACTURERS = tuple(f"Manufacturer#{m}" for m in range(1, 6))
#: The 92 colour words of P_NAME (clause 4.2.3).
COLOURS = (
    "almond", "antique", "aquamarine", "azure", "beige", "bisque", "black", "blanched", "blue",
    "blush", "brown", "burlywood", "burnished", "chartreuse", "chiffon", "chocolate", "coral",
    "cornflower", "cornsilk", "cream", "cyan", "dark", "deep", "dim", "dodger", "drab", "firebrick",
    "floral", "forest", "frosted", "gainsboro", "ghost", "goldenrod", "green", "grey", "honeydew",
    "hot", "indian", "ivory", "khaki", "lace", "lavender", "lawn", "lemon", "light", "lime", "linen",
    "magenta", "maroon", "medium", "metallic", "midnight", "mint", "misty", "moccasin", "navajo",
    "navy", "olive", "orange", "orchid", "pale", "papaya", "peach", "peru", "pink", "plum", "powder",
    "puff", "purple", "red", "rose", "rosy", "royal", "saddle", "salmon", "sandy", "seashell",
    "sienna", "sky", "slate", "smoke", "snow", "spring", "steel", "tan", "thistle", "tomato",
    "turquoise", "violet", "wheat", "white", "yellow",
)


def table_sizes(scale_factor: float) -> dict[str, int]:
    """Rows of each table at ``scale_factor`` (lineitem: the expected count, 4 per order).

    Raises:
        InvalidRequest: ``scale_factor`` outside [0.001, 10].
    """
    sf = _check_sf(scale_factor)
    c = int(150_000 * sf)
    return {"region": 5, "nation": 25, "supplier": int(10_000 * sf), "customer": c,
            "part": int(200_000 * sf), "partsupp": 4 * int(200_000 * sf), "orders": 10 * c,
            "lineitem": 40 * c}


def _check_sf(scale_factor: float) -> float:
    if isinstance(scale_factor, bool) or not isinstance(scale_factor, (int, float)) or not (
            MIN_SF <= float(scale_factor) <= MAX_SF):
        raise InvalidRequest(f"scale_factor must be a number in [{MIN_SF}, {MAX_SF}]",
                             {"scale_factor": repr(scale_factor)})
    return float(scale_factor)


def retail_price_cents(partkey: np.ndarray) -> np.ndarray:
    """P_RETAILPRICE in cents: 90000 + ((partkey / 10) mod 20001) + 100 · (partkey mod 1000)."""
    partkey = np.asarray(partkey, dtype=np.int64)
    return 90_000 + (partkey // 10) % 20_001 + 100 * (partkey % 1_000)


def _supplier_of(partkey: np.ndarray, i: np.ndarray, suppliers: int) -> np.ndarray:
    """The spec's i-th supplier (i = 0..3) of a part: (p + i·(S/4 + (p − 1)/S)) mod S + 1."""
    return (partkey + i * (suppliers // 4 + (partkey - 1) // suppliers)) % suppliers + 1
