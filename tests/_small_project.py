"""Test support: a small project (one policy, one CSV of 300 people) written to a folder.

Not a test module (leading underscore). Real files, read by the real gateway.
"""

from __future__ import annotations

from pathlib import Path

POLICY = """
[dataset]
name = "shop"
population = "shoppers"
{version_line}

[budget]
epsilon = {epsilon}
delta = {delta}
default_query_rho = 0.01
{extra_budget}

[allocations]
analysts = {analysts}
{dashboard_line}

[tables.orders]
source = "{source}"
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.orders.columns]
user_id = {{ type = "int" }}
region = {{ type = "text", public_keys = ["eu", "us", "apac"] }}
amount = {{ type = "int", lower = 0, upper = 100 }}
"""


def write_project(root: Path, *, epsilon: float = 4.0, delta: float = 1e-6, analysts: float = 0.5,
                  dashboard: float | None = 0.5, extra_budget: str = "", data_version: str | None = "v1") -> Path:
    """Write ``root/policies/shop.toml`` and ``root/orders.csv`` (300 users, 1-3 rows each);
    return the policies folder. ``data_version`` None: the gateway fingerprints the CSV."""
    root.mkdir(parents=True, exist_ok=True)
    csv = root / "orders.csv"
    if not csv.exists():
        lines = ["user_id,region,amount"]
        regions = ["eu", "us", "apac"]
        for u in range(300):
            for j in range(1 + u % 3):
                lines.append(f"{u},{regions[u % 3]},{(u * 7 + j * 13) % 101}")
        csv.write_text("\n".join(lines) + "\n")
    policies = root / "policies"
    policies.mkdir(exist_ok=True)
    version_line = f'data_version = "{data_version}"' if data_version else ""
    (policies / "shop.toml").write_text(POLICY.format(
        version_line=version_line, epsilon=epsilon, delta=delta, extra_budget=extra_budget,
        analysts=analysts, dashboard_line="" if dashboard is None else f"dashboard = {dashboard}",
        source=csv.as_posix()))
    return policies
