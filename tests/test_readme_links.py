"""README drift: its in-page links name headings that exist, the SQL length limit is the code's,
and the Layout section names the current packages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
SRC = Path(__file__).resolve().parents[1] / "src" / "dpgate"


def _slug(heading: str) -> str:  # GitHub's anchors: lower case, punctuation dropped, spaces to '-'
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_in_page_links_and_quoted_sections_exist():
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", README, flags=re.M)}
    missing = sorted({a for a in re.findall(r"\]\(#([^)]+)\)", README)} - anchors)
    assert not missing, missing
    assert 'see "Partition selection" below' not in README  # no such heading


def test_the_sql_length_limit_is_documented_as_the_code_has_it():
    from dpgate.api.schemas import MAX_SQL_CHARS

    assert f"at most {MAX_SQL_CHARS:,} characters" in README


def test_layout_names_the_pipeline_packages():
    layout = README[README.index("## Layout"):README.index("Benchmarks in `bench/`")]
    assert "`service` (the pipeline)" not in layout
    for module in sorted(p.stem for p in (SRC / "pipeline").glob("*.py") if p.stem != "__init__"):
        assert f"`{module}`" in layout, module
    for package in ("pipeline/", "render/", "policy/", "accounting/", "sql/"):
        assert f"`{package}`" in layout, package


def test_the_pure_epsilon_receipt_example():
    """README: a top-2 {"epsilon": 0.2} charges ρ = k·(ε/k)²/8 = 0.0025 (dpgate.selection), which the
    ledger reads as ε ≈ 0.3085 at δ = 5e-7 — above the requested 0.2 and below Bun & Steinke's
    ρ + 2√(ρ log 1/δ) (Prop. 1.3)."""
    import math

    from dpgate.ledger.caps import ledger_epsilon
    from dpgate.mechanisms.selection import top_k_rho

    k, eps = 2, 0.2
    rho = k * (eps / k) ** 2 / 8
    assert rho == pytest.approx(0.0025, rel=1e-12)
    assert top_k_rho(1, k, 10.0, monotonic=True) == pytest.approx(rho, rel=1e-9)
    assert "ρ = 2·0.1²/8 = 0.0025" in README and "ε ≈ 0.3085" in README
    shown = ledger_epsilon(rho, 5e-7)
    assert f"{shown:.4f}" == "0.3085"
    assert eps < shown <= rho + 2 * math.sqrt(rho * math.log(1 / 5e-7))
