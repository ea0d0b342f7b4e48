"""Library-shaped test data shared by tests/test_joins.py and tests/test_public_tables.py.

Dataset ``lib`` of population ``members``: ``checkouts`` (protected, unit ``member_id``:
member_id, genre, pages), optionally ``members`` (protected, unit ``id``: id, edu, age) and
``genres`` (a public table whose columns each test declares). Each test module states its own
``[tables.…]`` sections (bounds, public keys, ``public = true``); this module writes the CSV
files and the ``[dataset]``/``[budget]``/``[allocations]`` header they share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

#: The genres the checkouts cycle through.
CHECKOUT_GENRES = ("fantasy", "mystery", "history")

_HEADER = """[dataset]
name = "lib"
population = "members"
data_version = "v1"

[budget]
epsilon = {epsilon}
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 1.0
"""


def checkouts_rows(n: int = 300) -> list[tuple[int, str, int]]:
    """(member_id, genre, pages): 50 members, genres in turn, pages 100, 101, …"""
    return [(i % 50, CHECKOUT_GENRES[i % 3], 100 + i) for i in range(n)]


def members_rows() -> list[tuple[int, str, int]]:
    """(id, edu, age) of the 50 members."""
    return [(i, ["hs", "ba", "ma"][i % 3], 20 + i) for i in range(50)]


def csv_text(header: str, rows: Iterable[Sequence[object]]) -> str:
    """CSV text: the header line, then one line per row (None as an empty field)."""
    lines = [",".join("" if v is None else str(v) for v in r) for r in rows]
    return header + "\n" + "".join(line + "\n" for line in lines)


def write_library(root: Path, tables: str, *, genres_csv: str, epsilon: float = 4.0,
                  members: bool = False) -> Path:
    """Write the library's CSV files and ``policies/lib.toml`` under ``root``; return the policies folder.

    Args:
        root: the project folder (created).
        tables: the policy's ``[tables.…]`` sections (sources ``checkouts.csv``, ``genres.csv``
            and, with ``members``, ``members.csv``, relative to ``root``).
        genres_csv: the text of ``genres.csv``.
        epsilon: the population's cap ε (δ = 1e-6).
        members: also write ``members.csv`` (:func:`members_rows`).
    """
    (root / "policies").mkdir(parents=True, exist_ok=True)
    (root / "checkouts.csv").write_text(csv_text("member_id,genre,pages", checkouts_rows()))
    if members:
        (root / "members.csv").write_text(csv_text("id,edu,age", members_rows()))
    (root / "genres.csv").write_text(genres_csv)
    (root / "policies" / "lib.toml").write_text(_HEADER.format(epsilon=epsilon) + "\n" + tables)
    return root / "policies"
