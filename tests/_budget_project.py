"""Test support for issue 23: a project with a cohort population, a plain population and a proxy.

Not a test module (leading underscore). Real files, read by the real gateway:

* ``members`` (dataset ``club``): 240 users, each in exactly one signup cohort
  (``2026-01``/``2026-02``/``2026-03``, 80 users each), 1-3 orders each; cohorts declared.
* ``plain`` (dataset ``shop``): the same rows, no cohorts (a fixed cap, never renewed),
  proxy ``shop_synthetic`` and ``proxy_default_for = ["dashboard"]``.
* ``shop_synthetic``: a public, synthetic proxy with the same schema (120 made-up users).
"""

from __future__ import annotations

from pathlib import Path

COHORTS = ["2026-01", "2026-02", "2026-03"]

_TABLE = """
[tables.orders]
source = "{source}"
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.orders.columns]
signup = {{ type = "text", public_keys = ["2026-01", "2026-02", "2026-03"] }}
region = {{ type = "text", public_keys = ["eu", "us", "apac"] }}
amount = {{ type = "int", lower = 0, upper = 100 }}
"""

CLUB = """
[dataset]
name = "club"
population = "members"
data_version = "v1"
{proxy}

[population]
cohort_column = "signup"

[budget]
epsilon = {epsilon}
delta = 1e-6
default_query_rho = 0.01
selection_delta = 0

[allocations]
analysts = 0.5
dashboard = 0.5
""" + _TABLE

SHOP = """
[dataset]
name = "shop"
population = "plain"
data_version = "v1"
proxy = "shop_synthetic"
proxy_default_for = ["dashboard"]

[budget]
epsilon = {epsilon}
delta = 1e-6
default_query_rho = 0.01
selection_delta = 0

[allocations]
analysts = 0.5
dashboard = 0.5
""" + _TABLE

SYNTHETIC = """
[dataset]
name = "shop_synthetic"
population = "plain"
data_version = "synthetic-1"
provenance = "synthetic: 120 made-up users for the tests"

[budget]
epsilon = {epsilon}
delta = 1e-6
default_query_rho = 0.01
selection_delta = 0

[allocations]
analysts = 0.5
dashboard = 0.5

[tables.orders]
source = "{source}"
public = true

[tables.orders.columns]
user_id = {{ type = "int" }}
signup = {{ type = "text" }}
region = {{ type = "text" }}
amount = {{ type = "int" }}
"""


def orders_csv(path: Path, *, users: int = 240, bad_units: int = 0) -> Path:
    """Rows of ``users`` users, user u in cohort COHORTS[u % 3]; ``bad_units`` of them also get a row
    in the next cohort (breaking the cohort rule)."""
    regions = ["eu", "us", "apac"]
    lines = ["user_id,signup,region,amount"]
    for u in range(users):
        for j in range(1 + u % 3):
            lines.append(f"{u},{COHORTS[u % 3]},{regions[(u // 3) % 3]},{(u * 7 + j * 13) % 101}")
        if u < bad_units:
            lines.append(f"{u},{COHORTS[(u + 1) % 3]},{regions[0]},1")
    path.write_text("\n".join(lines) + "\n")
    return path


def synthetic_csv(path: Path) -> Path:
    """120 synthetic users, one order each: 42 in eu, 39 in us, 39 in apac."""
    regions = ["eu", "us", "apac"]
    lines = ["user_id,signup,region,amount"]
    for u in range(120):
        lines.append(f"{1000 + u},{COHORTS[u % 3]},{regions[(u // 3) % 3]},{(u * 11) % 101}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_project(root: Path, *, epsilon: float = 4.0, bad_units: int = 0, club_proxy: bool = False,
                  with_shop: bool = True) -> Path:
    """Write the policies and CSVs under ``root``; return the policies folder."""
    root.mkdir(parents=True, exist_ok=True)
    data = orders_csv(root / "orders.csv", bad_units=bad_units)
    synth = synthetic_csv(root / "synthetic.csv")
    policies = root / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "club.toml").write_text(CLUB.format(epsilon=epsilon, source=data.as_posix(),
                                                    proxy='proxy = "shop_synthetic"' if club_proxy else ""))
    if with_shop:
        (policies / "shop.toml").write_text(SHOP.format(epsilon=epsilon, source=data.as_posix()))
        (policies / "shop_synthetic.toml").write_text(SYNTHETIC.format(epsilon=epsilon, source=synth.as_posix()))
    return policies
