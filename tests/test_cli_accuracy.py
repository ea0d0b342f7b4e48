"""The CLI reads right (issue 24, items 4 and 5).

* ``dpgate explain`` takes a budget (``--rho/--epsilon/--ci95/--delta``, the API's validator)
  and shows the cost, whether it fits what is left for ``--consumer``'s allocation, and the
  expected ± per output under the analyst's names; sensitivities carry their unit;
* ``dpgate query`` prints a per-row ± for ratios, the rank error for quantiles and marks a
  value clamped to a bound;
* ``--json`` puts the error object on stdout too (with the non-zero exit), for every command.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from _api_server import make_project

from dpgate.cli import exits, main
from dpgate.errors import InvalidBudget
from dpgate.mechanisms import ci95_halfwidth
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

SQL = "SELECT region, COUNT(*) AS n_prompts, AVG(tokens) AS avg_tokens, MEDIAN(tokens) AS med FROM prompts GROUP BY region"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("cli-accuracy"))


@pytest.fixture()
def settings(project, tmp_path):
    return Settings(policies=project / "policies", home=tmp_path / "state")


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse usage errors exit as argparse does
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def _common(settings: Settings) -> list[str]:
    return ["--policies", str(settings.policies), "--home", str(settings.home)]


# --------------------------------------------------------------------------- explain with a budget


def test_explain_with_a_budget_shows_cost_fit_and_the_expected_accuracy_per_output(settings, capsys):
    code, out, _ = _cli(capsys, "explain", "--dataset", "usage", "SELECT region, COUNT(*) AS n_prompts FROM prompts "
                        "GROUP BY region", "--rho", "0.01", *_common(settings))
    assert code == 0
    assert "cost          ρ 0.01; ε " in out
    assert re.search(r"fits          yes: allocation analysts has ρ [\d.]+ left", out)
    # the expected ± of the count: policies/usage.toml has k = 1, m = 5, so Δ2 = m·√k = 5; one
    # primitive takes all of ρ, and zCDP's ρ = Δ2²/(2σ²) (Bun & Steinke 2016, Prop. 1.6; the
    # discrete Gaussian: Canonne, Kamath & Steinke 2020, Thm 4) gives σ = 5/√(2·0.01)
    sigma = 5 / math.sqrt(2 * 0.01)
    expected = ci95_halfwidth("gaussian", sigma)
    row = next(line for line in out.splitlines() if line.startswith("n_prompts "))
    assert f"± {expected:.4g}" in row  # named as the query names it, not `count`
    with Gateway.open(settings, progress=None) as gw:  # explain charged nothing
        assert gw.budget("usage")["spent"]["rho"] == 0


def test_explain_says_when_a_budget_does_not_fit_and_names_the_consumer(settings, capsys):
    code, out, _ = _cli(capsys, "explain", "--dataset", "usage", SQL, "--epsilon", "3.9", "--consumer", "dashboard",
                        *_common(settings))
    assert code == 0
    assert "fits          NO: allocation dashboard has only ρ " in out and "budget_exhausted" in out
    assert re.search(r"^med +a DP quantile: no value interval; its accuracy is a rank error of ± [\d.]+ ranks",
                     out, re.M)
    # issue 22 item 6: a bound on the AVG's ± in a group of 100 rows (the default reference) before paying
    assert re.search(r"^avg_tokens +± ≤ [\d.,]+ at 100 rows +derived from noisy sum and count: ± known after "
                     r"the run +\[0, 8000\]", out, re.M)


def test_explain_with_a_ci95_budget_gives_each_cell_its_bound(settings, capsys):
    sql = "SELECT region, COUNT(*) AS n_prompts, AVG(tokens) AS avg_tokens FROM prompts GROUP BY region"
    code, out, _ = _cli(capsys, "explain", "--dataset", "usage", sql, "--ci95", "50", "--expected-count", "1000",
                        *_common(settings))
    assert code == 0
    assert re.search(r"^n_prompts +± 50 +exact", out, re.M)
    assert re.search(r"^avg_tokens +± ~50 +interval arithmetic at expected_count = 1000", out, re.M)


def test_explain_refuses_a_budget_as_the_api_does(settings, capsys):
    with pytest.raises(InvalidBudget) as api:
        QueryBudget(rho=-1)
    code, out, err = _cli(capsys, "explain", "--dataset", "usage", SQL, "--rho", "-1", "--json", *_common(settings))
    assert code == exits.USAGE
    assert json.loads(out) == json.loads(err) == {"error": api.value.to_dict()["error"]}
    assert not (settings.home / "ledger.sqlite").exists()  # refused before anything was opened
    code, out, _ = _cli(capsys, "explain", "--dataset", "usage", SQL, "--ci95", "5", "--rho", "1", *_common(settings))
    assert code == exits.USAGE  # one budget at a time (argparse)


def test_explain_json_with_a_budget_is_the_api_document_with_expected_accuracy(settings, capsys):
    code, out, _ = _cli(capsys, "explain", "--dataset", "usage", SQL, "--rho", "0.02", "--json", *_common(settings))
    assert code == 0
    doc = json.loads(out)
    assert doc["cost"]["fits"] is True and doc["cost"]["consumer"] == "analysts"
    assert doc["columns"] == ["region", "n_prompts", "avg_tokens", "med"]
    outputs = {o["label"]: o for o in doc["expected_accuracy"]["outputs"]}
    assert set(outputs) == {"region", "n_prompts", "avg_tokens", "med"}
    prims = doc["expected_accuracy"]["primitives"]
    assert [p["kind"] for p in prims].count("quantile") == 1
    q = next(p for p in prims if p["kind"] == "quantile")
    assert q["rank_error95"] == doc["quantiles"][q["id"]]["rank_error95"] and q["l1"] == 5  # score sensitivity m


def test_plan_only_explain_prints_sensitivities_with_their_unit(tmp_path, capsys):
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "lat.toml").write_text("""
[dataset]
name = "lat"
population = "lat-people"
data_version = "v1"
[budget]
epsilon = 1.0
delta = 1e-6
default_query_rho = 0.01
[tables.calls]
source = "calls.csv"
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 4
[tables.calls.columns]
latency = { type = "float", lower = 0, upper = 10, resolution = 0.5 }
""")
    (tmp_path / "calls.csv").write_text("user_id,latency\n1,0.5\n2,3.0\n")  # explain opens the gateway
    code, out, err = _cli(capsys, "explain", "--dataset", "lat", "SELECT SUM(latency) AS s, VAR_POP(latency) AS v "
                        "FROM calls", "--policies", str(tmp_path / "policies"), "--home", str(tmp_path / "state"))
    assert code == 0, err
    # a sum's sensitivity in steps of the resolution: m·(upper/resolution) = 4·20 = 80 steps = 40 in latency's units;
    # a sum of squares': m·20² = 1600 steps of 0.25 = 400 in latency² units
    sums = next(line for line in out.splitlines() if re.match(r"p\d +sum +latency", line))
    assert "80" in sums and "steps of 0.5 (latency)" in sums and "40 / 40" in sums
    squares = next(line for line in out.splitlines() if re.match(r"p\d +sum_squares", line))
    assert "1600" in squares.replace(",", "") and "steps of 0.25 (latency²)" in squares and "400 / 400" in squares


def test_explain_of_a_query_with_selected_keys_says_so(settings, capsys):
    # GROUP BY a key without public keys (private partition selection): explain crashed with a
    # ValueError counting the groups; it now says the selected keys multiply the public ones
    sql = "SELECT model, COUNT(*) AS n FROM prompts GROUP BY model"
    code, out, _ = _cli(capsys, "explain", "--dataset", "usage", sql, *_common(settings))
    assert code == 0 and "groups of model selected privately" in out
    code, out, _ = _cli(capsys, "explain", "--dataset", "usage", sql, "--rho", "0.01", *_common(settings))
    assert code == 0 and re.search(r"^model +group key chosen by private partition selection", out, re.M)


# --------------------------------------------------------------------------- query output


def _query(capsys, settings, sql: str, rho: str) -> tuple[str, dict, dict[str, str]]:
    code, out, _ = _cli(capsys, "query", "--dataset", "usage", sql, "--rho", rho, *_common(settings))
    assert code == 0
    with Gateway.open(settings, progress=None) as gw:
        release = gw.releases("usage", limit=1)[0]
    lines = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in
             {"eu", "us", "apac", "latam", "africa"}}
    return out, release, lines


def _half(ci: float) -> str:
    return f"{round(ci):,}" if ci >= 1000 else f"{ci:.3g}"


def test_query_prints_a_per_row_interval_for_ratios_and_the_rank_error(settings, capsys):
    sql = "SELECT region, AVG(tokens) AS avg_tokens, MEDIAN(tokens) AS med FROM prompts WHERE week = 3 GROUP BY region"
    out, release, lines = _query(capsys, settings, sql, "0.05")
    acc = release["accuracy"]
    rows_ci = acc["avg_tokens"]["ci95_rows"]
    assert len({_half(c) for c in rows_ci}) > 1  # the regions' counts differ, so do their intervals …
    for (region, avg, med), ci in zip(release["rows"], rows_ci):
        assert f"{avg:.6g} ± ~{_half(ci)}" in lines[region]  # … and each row prints its own, not the widest
        assert f"(± {_half(acc['med']['rank_error95'])} ranks)" in lines[region]
    assert f"coverage ≥ {acc['avg_tokens']['coverage'] * 100:g} %" in out  # the coverage the release states
    assert "med: a DP quantile, no value interval" in out


def test_query_marks_values_clamped_to_a_bound(settings, capsys):
    # ρ = 1e-6: the noisy sums dwarf the counts, so most AVGs fall outside [0, 8000] and are clamped
    # (a row escapes with probability ≈ 0.12, all five with ≈ 2e-5)
    sql = "SELECT region, COUNT(*) AS n, AVG(tokens) AS avg_tokens FROM prompts WHERE week = 4 GROUP BY region"
    out, release, lines = _query(capsys, settings, sql, "0.000001")
    ranges = release["value_ranges"]
    assert ranges["avg_tokens"] == {"lower": 0.0, "upper": 8000.0, "clamped": True, "rule": "tokens's declared bounds"}
    assert ranges["n"]["lower"] == 0 and ranges["n"]["upper"] is None and ranges["n"]["clamped"] is True
    clamped = 0
    for region, n, avg in release["rows"]:
        at_bound = avg in (0.0, 8000.0)
        clamped += at_bound
        cell = re.search(r"(\S+) ± ~\S+( \*)?", lines[region].split(None, 2)[2])
        assert float(cell.group(1)) == pytest.approx(avg, rel=1e-5) and bool(cell.group(2)) == at_bound
        assert (f"{n} ± " in lines[region] and re.search(r"\b0 ± [\d,.]+ \*", lines[region]) is not None) == (n == 0)
    assert clamped >= 1
    assert "avg_tokens: * = on a bound of [0, 8000] (tokens's declared bounds)" in out


# --------------------------------------------------------------------------- --json errors on stdout


@pytest.mark.parametrize("argv, code", [
    (["explain", "--dataset", "usag", "SELECT COUNT(*) FROM prompts"], exits.NOT_FOUND),
    (["query", "--dataset", "usag", "SELECT COUNT(*) FROM prompts"], exits.NOT_FOUND),
    (["budget", "usag"], exits.NOT_FOUND),
    (["query", "--dataset", "usage", "SELECT * FROM prompts"], exits.USAGE),
    (["query", "--dataset", "usage", "SELECT COUNT(*) FROM prompts", "--rho", "5"], exits.REFUSED),
    (["query", "--dataset", "usage"], exits.USAGE),  # an argparse usage error (no SQL)
])
def test_json_errors_are_on_stdout_too(settings, capsys, argv, code):
    status, out, err = _cli(capsys, *argv, "--json", *_common(settings))
    assert status == code
    body = json.loads(out)  # `dpgate … --json | jq` sees the error object
    assert body == json.loads(err) and set(body["error"]) == {"code", "message", "details"}
    status, out, err = _cli(capsys, *argv, *_common(settings))
    assert status == code and "{" not in err.splitlines()[-1]  # without --json: a sentence on stderr
