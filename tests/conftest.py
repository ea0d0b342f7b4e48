"""Test tiers (issue 20 "Tests", issue 24 item 1) and the Hypothesis profiles.

* **Fast tier** — plain ``pytest`` (the README's command): unit, planner, golden, in-process
  service and API tests. Everything marked ``slow`` is deselected.
* **Slow tier** — ``pytest -m slow`` runs only it, ``pytest --all`` runs both: Spark, the
  browser, the quickstart (a fresh clone and venv), docker, subprocess servers and other child
  processes, engine parity on PostgreSQL (the corpus-sized comparisons; the PostgreSQL ledger
  and engine tests stay fast), long statistical checks and long Hypothesis runs. ``.ci/run``
  runs ``pytest --all``. Golden, planner and privacy-number tests are never slow; a test moves
  here only with a reason (the lists below), and CI's ``--all`` still runs it.

Durations (issue 20 "Tests": the fast tier in at most 5 minutes on the 2-core machine) are in
the README's "Run the tests"; measure with ``pytest -p no:cacheprovider --durations=40``.

Which tests are slow is decided here, centrally, by file and test name (:data:`SLOW_FILES`,
:data:`SLOW_TESTS`) and by marker (every ``spark`` or ``browser`` test is slow), so that no test
file has to change when a test moves between tiers. A test named explicitly on the command
line (``pytest tests/test_quickstart.py`` or a node id) runs whatever its tier: only a run
that was not pointed at its file leaves it out, and says so in the header.

Hypothesis: every ``@settings(max_examples=N)`` is scaled at collection — N/4 (at least 10) in
the fast tier, 2·N with ``--all`` or ``-m slow`` — and the profiles ``dpgate-fast`` /
``dpgate-all`` (25 / 200 examples, no deadline) apply to tests that set nothing.

Shared fixtures: ``policy``, the planner tests' policy (``fixtures/policies/planner.toml``);
modules with a policy of their own override it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpgate.engines.duckdb import evaluate_tableless
from dpgate.sql import evaluation

# The planner's evaluator of table-less queries (computed keys' domains, WHERE narrowing), which
# the pipeline installs (dpgate.pipeline.planning); planner tests call dpgate.sql directly.
evaluation.install(evaluate_tableless)

#: Whole files in the slow tier, with the reason.
SLOW_FILES: dict[str, str] = {
    "test_quickstart.py": "clones the repository, fresh venvs, pip install from the index, the README's commands",
    "test_ui_browser.py": "drives a headless Chromium",
    "test_api_serve.py": "starts `dpgate serve` as child processes",
    "test_ledger_concurrency.py": "child processes charging one ledger, SIGKILL mid-charge",
    "test_privacy_audit.py": "statistical privacy audit over thousands of releases",
    "test_api_serve_limits.py": "starts `dpgate serve` as a child process and holds connections to its timeouts",
}

#: Single tests in the slow tier (``file::name``: every parameter; ``file::name[id]``: one), with the reason.
SLOW_TESTS: dict[str, str] = {
    "test_api_fuzz.py::test_the_whole_api_survives_a_schema_fuzz": "schema fuzz of the whole HTTP API",
    "test_docker.py::test_compose_config_validates_when_a_client_is_present": "docker compose",
    "test_docker.py::test_compose_sample_dataset_runs_on_the_postgres_engine": "docker's sample dataset (200k rows)",
    "test_engine_parity.py::test_corpus_postgres_equals_duckdb": "the analyst corpus on PostgreSQL",
    "test_selection.py::test_gateway_picks_the_best_candidate_with_the_mechanisms_probability":
        "statistical: thousands of selections",
    "test_selection.py::test_selection_probabilities_match_the_exponential_mechanism":
        "statistical: thousands of selections",
    "test_quantiles.py::test_selection_probabilities_are_the_exponential_mechanism": "statistical",
    "test_partition_selection.py::test_one_unit_key_release_rate_matches_the_charged_delta": "statistical",
    "test_service.py::test_counts_lie_within_4_sigma_in_99_percent_of_200_runs": "statistical: 200 releases",
    "test_release_store.py::test_concurrent_first_starts_agree_on_one_fingerprint_key": "child processes",
    "test_release_store.py::test_a_process_that_crashed_after_its_charge_blocks_nobody": "child processes",
    "test_ledger_postgres.py::test_sigkill_mid_charge_loop_leaves_a_consistent_ledger": "child processes, SIGKILL",
    "test_cli_newuser.py::test_a_closed_pipe_ends_quietly": "a `dpgate` child process",
    "test_cli_newuser.py::test_serve_on_a_taken_port_is_one_line_and_never_says_listening": "a `dpgate serve` child",
    "test_walkthrough.py::test_the_walkthrough_twice_then_the_demo": "the README's curl walkthrough, twice",
    "test_bench_cli.py::test_the_utility_step_runs_twice_and_spends_exactly_the_ledgers_cap": "53 releases, twice",
    # issue 20 "Tests" (fast tier <= 5 min): measured 1-16 s each in the fast tier, none a golden,
    # planner or privacy-number test (their fast-tier twins are named where there are any)
    "test_api_hardening.py::test_a_postgres_ledger_that_goes_down_answers_503_and_recovers":
        "stops a PostgreSQL relay and waits out the ledger's retry (5.5 s)",
    "test_ledger_postgres.py::test_processes_charge_exactly_the_budget": "8 child processes charging one ledger",
    "test_cli_newuser.py::test_a_bad_setting_is_one_line_not_a_traceback": "a `dpgate` child process",
    "test_engine_parity.py::test_postgres_equals_duckdb": "engine parity on PostgreSQL (11 s; DuckDB's answers stay fast)",
    "test_engine_parity.py::test_pums_through_the_gateway_postgres_equals_duckdb": "engine parity on PostgreSQL",
    "test_engine_dates.py::test_postgres_dates_equal_duckdb": "engine parity on PostgreSQL (6 s)",
    "test_fast_path.py::test_postgres_fast_path_equals_duckdb": "engine parity on PostgreSQL (2 x 8 s)",
    "test_fast_path.py::test_pums_fast_path_postgres_equals_duckdb": "engine parity on PostgreSQL",
    "test_fast_path.py::test_duckdb_fast_path_equals_general_form[in_place-k2m5]":
        "the corpus twice per load mode (5 s); the `memory` load mode stays fast",
    "test_fast_path.py::test_duckdb_fast_path_equals_general_form[in_place-k1m1]":
        "the corpus twice per load mode (4 s); the `memory` load mode stays fast",
    "test_ratio_intervals.py::test_monte_carlo_coverage_is_at_least_95_percent":
        "statistical: 20,000 trials per case, 6 cases (accuracy, not a privacy number)",
    "test_selection_chunks.py::test_same_release_rates_as_opendp_threshold_measurement":
        "statistical: 84,000 keys through both selection paths",
    "test_quantiles.py::test_median_within_stated_rank_error_by_simulation": "statistical: a simulation of the rank error",
    "test_sample_data.py::test_bench_synthetic_is_deterministic_and_chunk_independent": "two `bench.datagen` child processes",
    "test_sample_data.py::test_bench_pums_bootstrap": "a `bench.datagen` child process",
    "test_sample_data.py::test_bench_rejects_bad_sizes": "`bench.datagen` child processes",
}

#: Markers whose tests are always slow (the optional extras they need are heavy to start).
SLOW_MARKERS = ("slow", "spark", "browser")

#: Hypothesis scaling of an explicit ``max_examples``: (fast tier factor, floor), --all factor.
FAST_FACTOR, FAST_FLOOR, ALL_FACTOR = 0.25, 10, 2.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all", action="store_true", dest="dpgate_all",
                     help="run every tier (fast and slow: Spark, browser, quickstart, docker, subprocess "
                          "servers, long Hypothesis runs); plain `pytest` runs the fast tier")


def _long_run(config: pytest.Config) -> bool:
    """True for ``--all`` and for a ``-m`` expression that names ``slow`` (``-m slow``)."""
    return bool(config.getoption("dpgate_all")) or "slow" in (config.getoption("markexpr") or "")


def pytest_configure(config: pytest.Config) -> None:
    try:
        from hypothesis import settings
    except ImportError:  # pragma: no cover - hypothesis is in the test extra
        return
    settings.register_profile("dpgate-fast", max_examples=25, deadline=None)
    settings.register_profile("dpgate-all", max_examples=200, deadline=None)
    settings.load_profile("dpgate-all" if _long_run(config) else "dpgate-fast")


def _slow_reason(item: pytest.Item) -> str | None:
    file = Path(str(item.path)).name
    name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    if file in SLOW_FILES:
        return SLOW_FILES[file]
    for key in (f"{file}::{name}", f"{file}::{item.name}"):  # every parameter, or one by its id
        if key in SLOW_TESTS:
            return SLOW_TESTS[key]
    for marker in SLOW_MARKERS:
        if item.get_closest_marker(marker) is not None:
            return "marked slow" if marker == "slow" else f"needs {marker}"
    # a Spark engine reached through a fixture or a parameter, without the marker (a JVM start)
    if "spark" in getattr(item, "fixturenames", ()) or "[spark" in item.name:
        return "needs spark (a fixture or parameter starts a Spark session)"
    return None


def _named_files(config: pytest.Config) -> set[Path]:
    """The test files named on the command line (a file or a node id; not a folder)."""
    out = set()
    for arg in config.args:
        path = Path(str(arg).split("::", 1)[0])
        if path.suffix == ".py":
            out.add((Path(str(config.invocation_params.dir)) / path).resolve())
    return out


def _scale_hypothesis(item: pytest.Item, long_run: bool) -> None:
    fn = getattr(item, "obj", None)
    current = getattr(fn, "_hypothesis_internal_use_settings", None)
    if current is None or getattr(fn, "hypothesis", None) is None:
        return
    from hypothesis import settings

    original = getattr(fn, "_dpgate_max_examples", None)
    if original is None:  # parametrized tests share the function: always scale the author's number
        original = current.max_examples
        fn._dpgate_max_examples = original
    n = math.ceil(original * ALL_FACTOR) if long_run else max(FAST_FLOOR, math.ceil(original * FAST_FACTOR))
    fn._hypothesis_internal_use_settings = settings(current, max_examples=n)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    long_run = _long_run(config)
    named = _named_files(config)
    keep_slow = long_run or bool(config.getoption("markexpr"))  # a -m expression decides by itself
    kept, deselected = [], []
    for item in items:
        reason = _slow_reason(item)
        if reason is not None:
            item.add_marker(pytest.mark.slow(reason=reason))
        _scale_hypothesis(item, long_run)
        if reason is not None and not keep_slow and Path(str(item.path)).resolve() not in named:
            deselected.append(item)
        else:
            kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
        config._dpgate_deselected_slow = len(deselected)  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> str:
    if _long_run(config):
        return "dpgate: every tier (fast + slow); Hypothesis examples x2"
    return ("dpgate: fast tier (slow tests are deselected unless their file is named; `pytest --all` or "
            "`pytest -m slow` runs them); Hypothesis examples /4")


def pytest_terminal_summary(terminalreporter) -> None:
    """Print the figures tests record as ``dpgate_summary`` (e.g. the quickstart's test-command
    duration); user properties travel with the reports, so this works under pytest-xdist too."""
    lines = list(dict.fromkeys(value for reports in terminalreporter.stats.values() for rep in reports
                               for key, value in getattr(rep, "user_properties", ()) if key == "dpgate_summary"))
    if lines:
        terminalreporter.section("dpgate")
        for line in lines:
            terminalreporter.write_line(str(line))


# --- shared fixtures -----------------------------------------------------------------------------

#: The planner tests' policy file (dataset ``planner``; tables prompts, pums, ev, sv, fx, …).
PLANNER_POLICY = Path(__file__).parent / "fixtures" / "policies" / "planner.toml"


@pytest.fixture(scope="module")
def policy():
    """The planner tests' :class:`~dpgate.policy.DatasetPolicy` (:data:`PLANNER_POLICY`), loaded
    once per test module. A test module with a policy of its own defines its own ``policy``
    fixture, which takes precedence over this one."""
    from dpgate.policy import load_policy

    return load_policy(PLANNER_POLICY)
