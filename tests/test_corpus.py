"""The analyst-query corpus (tests/corpus/queries.toml), run through the gateway in-process.

Each answer-labelled query is compared with the exact DuckDB answer of the same SQL on the
raw data (every released cell within 5× its reported noise scale); each refuse-labelled query
must raise the expected error code and charge nothing (tests/corpus/harness.py has the rules).
Queries the gateway does not handle yet are ``pending``: strict xfails naming their issue, so
that they flip to failures — remove the flag — when the issue lands. The answered fraction per
issue: ``python -m tests.corpus.harness`` (docs/CORPUS.md).
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.corpus.harness import (
    ISSUES,
    SHARED_DATASETS,
    CorpusRunner,
    load_corpus,
    shared_data_dir,
)

CORPUS = load_corpus()
SHARED = shared_data_dir()


def _param(q):
    marks = []
    if q.dataset in SHARED_DATASETS:
        marks.append(pytest.mark.shared_data)
    if q.pending:
        marks.append(pytest.mark.xfail(strict=True, reason=f"issue {q.issue}: not handled yet ({q.label})"))
    return pytest.param(q, id=q.id, marks=marks)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    r = CorpusRunner(tmp_path_factory.mktemp("corpus"), SHARED)
    yield r
    r.close()


@pytest.mark.parametrize("query", [_param(q) for q in CORPUS])
def test_corpus_query(runner, query):
    outcome = runner.run(query)
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    assert outcome.ok, f"{query.id} ({query.source}): {outcome.detail}"


def test_corpus_is_large_and_well_formed():
    # load_corpus validates each entry (fields, labels, issues, datasets, unique ids)
    assert len(CORPUS) >= 100
    assert sum(q.label == "answer" for q in CORPUS) >= 50
    per_issue = Counter(q.issue for q in CORPUS)
    assert all(per_issue[i] >= 10 for i in ISSUES), per_issue
    sources = {q.source.split(":")[0].split(" ")[0] for q in CORPUS}
    # peers' suites, tutorials and docs, not only our own examples
    assert {"opendp/smartnoise-sdk", "opendp/tumult-analytics", "OpenMined/PipelineDP"} <= sources
    assert any("cloud.google.com/bigquery" in q.source for q in CORPUS)
    assert any("google/zetasql" in q.source for q in CORPUS)


@pytest.mark.parametrize("query", [pytest.param(q, id=q.id, marks=[pytest.mark.shared_data]
                                                 if q.dataset in SHARED_DATASETS else [])
                                   for q in CORPUS if q.label == "answer"])
def test_exact_answer_exists(runner, query):
    """Every answer-labelled query runs in DuckDB on the raw data (the corpus itself is sound,
    whatever the gateway does today)."""
    if query.dataset in SHARED_DATASETS and SHARED is None:
        pytest.skip("../shared/data/smartnoise is not present")
    columns, rows, _ = runner.exact(query)
    assert columns
