"""README drift: its in-page links name headings that exist, the SQL length limit is the code's,
and the Layout section names the current packages."""

from __future__ import annotations

import re
from pathlib import Path

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
