"""The query pipeline end to end on real data: real DuckDB, real ledger, real OpenDP (no mocks).

Data: ``../shared/data/smartnoise/PUMS_dup.csv`` (1,948 rows, 1,000 persons ``pid`` with up
to 4 rows each, one sex and one educ per person) and ``PUMS_null.csv`` (same, with NULL cells,
88 of them in ``pid``).
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import duckdb
import pytest
from _oracles import ledger_epsilon as oracle_epsilon

from dpgate import accounting
from dpgate.errors import BudgetExhausted, ExecutionError, MechanismError, UnsupportedQuery
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings
from tests.shared_data import smartnoise_dir

DATA = smartnoise_dir()
pytestmark = pytest.mark.skipif(not (DATA / "PUMS_dup.csv").exists(), reason="../shared/data not present")

POLICY = """
[dataset]
name = "pums"
population = "census-people"
data_version = "{version}"

[budget]
epsilon = {epsilon}
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 0.5
dashboard = 0.5

[tables.persons]
source = "{source}"
privacy_unit = "pid"
max_groups_per_unit = 1
max_rows_per_unit = 4

[tables.persons.columns]
pid = {{ type = "int" }}
sex = {{ type = "int", public_keys = [0, 1] }}
educ = {{ type = "int", public_keys = "range(1, 17)" }}
age = {{ type = "int", lower = 0, upper = 100 }}
income = {{ type = "int", lower = 0, upper = 500000, resolution = 1 }}
"""


def make_gateway(tmp_path: Path, *, csv: str = "PUMS_dup.csv", epsilon: float = 4.0,
                 version: str = "v1", source: Path | None = None) -> Gateway:
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    src = source or DATA / csv
    (policies / "pums.toml").write_text(POLICY.format(source=src, epsilon=epsilon, version=version))
    settings = Settings(policies=policies, home=tmp_path / "home")
    return Gateway.open(settings)


@pytest.fixture
def gw(tmp_path):
    g = make_gateway(tmp_path)
    yield g
    g.close()


def true_counts_by_sex(csv: str = "PUMS_dup.csv", m: int = 4) -> dict[int, int]:
    """Bounded true COUNT(*) by sex, computed independently: per person min(rows, m)."""
    rows = duckdb.sql(
        f"SELECT sex, SUM(LEAST(c, {m})) FROM (SELECT pid, sex, COUNT(*) c FROM "
        f"read_csv('{DATA / csv}') WHERE pid IS NOT NULL GROUP BY pid, sex) GROUP BY sex ORDER BY sex"
    ).fetchall()
    return {int(s): int(n) for s, n in rows}


def test_grouped_count_and_avg_are_charged_once_each(gw):
    before = len(gw.ledger_entries())
    r1 = gw.query("pums", "SELECT sex, COUNT(*) AS n FROM persons GROUP BY sex", consumer="analysts",
                  budget=QueryBudget(rho=0.02))
    r2 = gw.query("pums", "SELECT sex, AVG(income) AS avg_income FROM persons GROUP BY sex",
                  consumer="analysts", budget=QueryBudget(rho=0.02))
    entries = gw.ledger_entries()
    assert len(entries) == before + 2  # one charge per query
    assert r1["columns"] == ["sex", "n"] and [row[0] for row in r1["rows"]] == [0, 1]
    assert r2["columns"] == ["sex", "avg_income"]
    assert r1["charge"]["rho"] == pytest.approx(0.02, rel=1e-12)
    # The AVG's charge is the sum of its two primitives (noisy sum and noisy count), split to
    # minimise the AVG's variance (issue 22 item 5; bounds [0, U]: E[μ²] = U²/3, so
    # ρ_S : ρ_N = √3 : 1, ρ_S = ρ(3 − √3)/2, ρ_N = ρ(√3 − 1)/2): ρ_i = Δ2_i² / (2 σ_i²) (Bun–Steinke
    # 2016, Prop. 1.6). Sum: Δ2 = m · max|L|,|U| / resolution = 4 · 500000; count_column: Δ2 = m = 4 (k = 1).
    scales = r2["noise_scales"]
    assert len(scales) == 2
    deltas = sorted([4.0, 4.0 * 500000])
    parts = sorted(scales.values())
    per = [accounting.gaussian_rho(d, s) for d, s in zip(deltas, parts)]
    rho_n, rho_s = 0.02 * (math.sqrt(3) - 1) / 2, 0.02 * (3 - math.sqrt(3)) / 2
    assert per == pytest.approx([rho_n, rho_s], rel=1e-9)
    assert r2["charge"]["rho"] == pytest.approx(sum(per), rel=1e-9)
    # σ of the count: 4 / √(2 · 0.0073205) = 33.06
    assert parts[0] == pytest.approx(4 / math.sqrt(2 * rho_n), rel=1e-9)
    for row in r2["rows"]:
        assert 0 <= row[1] <= 500000  # AVG clamped into [lower, upper]
    # ε at δ − selection_delta = 1e-6 − 1e-6/2 (default reserve for partition selection, issue 11)
    assert r2["charge"]["epsilon_at_delta"] == pytest.approx(oracle_epsilon(0.02, 0.5e-6), rel=1e-9)


def test_counts_lie_within_4_sigma_in_99_percent_of_200_runs(tmp_path):
    g = make_gateway(tmp_path, epsilon=1e5)  # a cap large enough for 200 fresh releases
    try:
        truth = true_counts_by_sex()
        inside = total = 0
        for i in range(200):
            rho = 0.01 * (1 + i * 1e-6)  # a different budget each run: a new, charged release
            r = g.query("pums", "SELECT sex, COUNT(*) FROM persons GROUP BY sex", consumer="analysts",
                        budget=QueryBudget(rho=rho))
            assert r["cached"] is False
            sigma = next(iter(r["noise_scales"].values()))
            assert sigma == pytest.approx(4 / math.sqrt(2 * rho), rel=1e-9)
            for sex, n in r["rows"]:
                total += 1
                inside += abs(n - truth[sex]) <= 4 * sigma
        assert total == 400
        assert inside / total >= 0.99
        assert len(g.ledger_entries()) == 200
    finally:
        g.close()


def test_reformatted_repeat_is_served_free_with_identical_numbers(gw):
    q1 = "SELECT sex, COUNT(*) AS n FROM persons WHERE age > 30 AND educ < 9 GROUP BY sex"
    q2 = "select  SEX as s , count(1)  as people\nfrom persons p where 9 > educ and 30 < age group by sex"
    first = gw.query("pums", q1, consumer="analysts", budget=QueryBudget(rho=0.01))
    entries = len(gw.ledger_entries())
    spent = gw.budget("pums")["spent"]["rho"]
    again = gw.query("pums", q2, consumer="analysts", budget=QueryBudget(rho=0.01))
    assert again["cached"] is True and again["charge"] is None
    assert again["release_id"] == first["release_id"]
    assert again["rows"] == first["rows"]
    assert again["columns"] == ["s", "people"]  # served under this request's names
    assert again["paid_by"]["charge_id"] == first["charge"]["charge_id"]
    assert len(gw.ledger_entries()) == entries
    assert gw.budget("pums")["spent"]["rho"] == spent
    # a different budget is a different release
    third = gw.query("pums", q1, consumer="analysts", budget=QueryBudget(rho=0.02))
    assert third["cached"] is False and third["release_id"] != first["release_id"]


def test_null_units_never_reach_an_aggregate_and_null_values_are_excluded(tmp_path):
    g = make_gateway(tmp_path, csv="PUMS_null.csv", epsilon=1e6)
    try:
        con = duckdb.connect()
        src = f"read_csv('{DATA / 'PUMS_null.csv'}')"
        n_rows, n_age, n_income, s_income = con.execute(
            f"SELECT COUNT(*), COUNT(age), COUNT(income), SUM(income) FROM {src} WHERE pid IS NOT NULL"
        ).fetchone()
        all_rows = con.execute(f"SELECT COUNT(*) FROM {src}").fetchone()[0]
        assert all_rows - n_rows == 88  # the NULL-unit rows exist in the file
        # With a huge ρ the noise is far below 0.5 and rounding recovers the bounded value.
        r = g.query("pums", "SELECT COUNT(*), COUNT(age), COUNT(income), SUM(income) FROM persons",
                    consumer="analysts", budget=QueryBudget(rho=1e4))
        assert len(r["rows"]) == 1
        c_all, c_age, c_income, sum_income = r["rows"][0]
        # no person has more than 4 rows (m = 4), so nothing is clipped
        assert c_all == n_rows and c_age == n_age and c_income == n_income
        # SUM's noise in fixed-point units: σ = Δ2 / √(2ρ/4) = 2,000,000 / 70.7 ≈ 28,284 (ρ ≤ 1e4, the budget limit)
        assert abs(sum_income - s_income) < 6 * 2_000_000 / math.sqrt(2 * 1e4 / 4)
        avg = g.query("pums", "SELECT AVG(income) FROM persons", consumer="analysts",
                      budget=QueryBudget(rho=1e4))["rows"][0][0]
        assert avg == pytest.approx(s_income / n_income, rel=1e-3)
    finally:
        g.close()


def test_empty_result_gives_noisy_zeros_for_every_key_and_avg_within_bounds(gw):
    r = gw.query("pums", "SELECT educ, COUNT(*) AS n, AVG(age) AS a FROM persons WHERE age > 200 GROUP BY educ",
                 consumer="analysts", budget=QueryBudget(rho=0.05))
    assert [row[0] for row in r["rows"]] == list(range(1, 17))  # every public key, in order
    sigma_count = 4 / math.sqrt(2 * 0.05 / 2)
    for _, n, a in r["rows"]:
        assert n >= 0 and abs(n) <= 6 * sigma_count
        assert 0 <= a <= 100
    one = gw.query("pums", "SELECT COUNT(*) FROM persons WHERE age > 200", consumer="analysts",
                   budget=QueryBudget(rho=0.05))
    assert len(one["rows"]) == 1


def test_charge_stays_when_execution_fails_after_it(gw, monkeypatch):
    before = gw.budget("pums")["spent"]["rho"]

    def boom(sql):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(gw.engine, "execute", boom)
    with pytest.raises(ExecutionError) as err:
        gw.query("pums", "SELECT COUNT(*) FROM persons", consumer="analysts", budget=QueryBudget(rho=0.01))
    assert "disk on fire" not in err.value.message
    assert gw.budget("pums")["spent"]["rho"] == pytest.approx(before + 0.01)
    assert gw.releases("pums") == []


def test_charge_stays_when_noise_fails_after_it(gw, monkeypatch):
    import dpgate.pipeline.runners as runners

    def broken(cal, values):
        raise MechanismError("sampler unavailable")

    monkeypatch.setattr(runners, "sample", broken)
    with pytest.raises(MechanismError):
        gw.query("pums", "SELECT COUNT(*) FROM persons", consumer="analysts", budget=QueryBudget(rho=0.01))
    assert len(gw.ledger_entries()) == 1
    assert gw.releases("pums") == []


def test_refused_query_costs_nothing(gw):
    with pytest.raises(UnsupportedQuery):
        gw.query("pums", "SELECT pid FROM persons", consumer="analysts")
    assert gw.ledger_entries() == []


def test_budget_exhaustion_returns_no_data_and_names_the_numbers(gw):
    cap = gw.budget("pums")["consumers"]["analysts"]["cap_rho"]
    with pytest.raises(BudgetExhausted) as err:
        gw.query("pums", "SELECT COUNT(*) FROM persons", consumer="analysts", budget=QueryBudget(rho=cap * 1.01))
    d = err.value.details
    for key in ("requested", "spent", "remaining"):
        assert "rho" in d[key] and "epsilon" in d[key]
    assert d["requested"]["rho"] == pytest.approx(cap * 1.01)
    assert gw.ledger_entries() == [] and gw.releases() == []


def test_concurrent_identical_queries_give_one_charge_and_one_release(gw):
    results, errors = [], []

    def run():
        try:
            results.append(gw.query("pums", "SELECT educ, COUNT(*) FROM persons GROUP BY educ",
                                    consumer="analysts", budget=QueryBudget(rho=0.01)))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({r["release_id"] for r in results}) == 1
    assert len({str(r["rows"]) for r in results}) == 1
    assert sum(not r["cached"] for r in results) == 1
    assert len(gw.ledger_entries()) == 1 and len(gw.releases()) == 1


def test_changed_data_means_a_new_charged_release(tmp_path):
    src = tmp_path / "persons.csv"
    src.write_text((DATA / "PUMS_dup.csv").read_text())
    # data_version from the policy is fixed; use the fingerprint instead
    policies = tmp_path / "policies"
    policies.mkdir()
    text = POLICY.format(source=src, epsilon=4.0, version="x").replace('data_version = "x"\n', "")
    (policies / "pums.toml").write_text(text)
    settings = Settings(policies=policies, home=tmp_path / "home")
    sql = "SELECT COUNT(*) FROM persons"
    with Gateway.open(settings) as g:
        first = g.query("pums", sql, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert g.query("pums", sql, consumer="analysts", budget=QueryBudget(rho=0.01))["cached"]
    with src.open("a") as f:
        f.write("40,1,9,1,1000,1,5000\n")
    with Gateway.open(settings) as g:
        second = g.query("pums", sql, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert second["cached"] is False and second["data_version"] != first["data_version"]
        assert len(g.ledger_entries()) == 2


def test_explain_reads_no_data_and_charges_nothing(gw, monkeypatch):
    def forbidden(sql):  # pragma: no cover - must not be called
        raise AssertionError("explain touched the data")

    monkeypatch.setattr(gw.engine, "execute", forbidden)
    e = gw.explain("pums", "SELECT sex, AVG(income) FROM persons GROUP BY sex", budget=QueryBudget(epsilon=1.0))
    # ε = 1 at the cap's δ for ρ: δ − selection_delta = 1e-6 − 1e-6/2 (the policy's default reserve
    # for partition selection, issue 11) → ρ by the ledger's one conversion (its cap rule, checked
    # against dp-accounting: the ρ whose conversion is ε = 1), split over two primitives
    assert oracle_epsilon(e["cost"]["rho"], 0.5e-6) == pytest.approx(1.0, rel=1e-9)
    assert oracle_epsilon(e["cost"]["rho"] * 1.001, 0.5e-6) > 1.0  # the largest such ρ
    assert e["cost"]["epsilon_at_delta"] == pytest.approx(1.0, rel=1e-9) and e["cost"]["delta"] == 0.5e-6
    assert "<salt>" in e["bounded_sql"]
    assert gw.ledger_entries() == []


def test_laplace_mechanism_charges_pure_epsilon(gw):
    r = gw.query("pums", "SELECT COUNT(*) FROM persons", consumer="analysts",
                 budget=QueryBudget(epsilon=0.5), mechanism="laplace")
    assert r["mechanism"] == "discrete_laplace"
    # b = Δ1 / ε = 4 / 0.5 = 8 (one primitive gets the whole ε)
    assert next(iter(r["noise_scales"].values())) == pytest.approx(8.0)
    # a pure ε-DP release states its own ε at δ = 0 (issue 24: not "at the cap's δ")
    assert r["charge"]["epsilon_at_delta"] == pytest.approx(0.5, rel=1e-12) and r["charge"]["delta"] == 0.0


def test_ci95_budget_meets_the_requested_half_width(gw):
    r = gw.query("pums", "SELECT COUNT(*) FROM persons", consumer="analysts", budget=QueryBudget(ci95=20.0))
    acc = next(iter(r["accuracy"].values()))
    assert acc["ci95"] <= 20.0 + 1e-9
    sigma = next(iter(r["noise_scales"].values()))
    # ρ = Δ2² / (2σ²) with Δ2 = m = 4
    assert r["charge"]["rho"] == pytest.approx(16 / (2 * sigma**2), rel=1e-9)


def test_hostile_values_in_a_budget_are_refused():
    from dpgate.errors import InvalidBudget

    for bad in (float("nan"), float("inf"), -1.0, 0.0, 1e300):
        with pytest.raises(InvalidBudget):
            QueryBudget(rho=bad)
    with pytest.raises(InvalidBudget):
        QueryBudget(rho=0.1, epsilon=1.0)


def test_a_failed_release_does_not_block_the_next_identical_request(gw, monkeypatch):
    real = gw.engine.execute
    calls = {"n": 0}

    def flaky(sql):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("transient")
        return real(sql)

    monkeypatch.setattr(gw.engine, "execute", flaky)
    q = "SELECT COUNT(*) FROM persons"
    with pytest.raises(ExecutionError):
        gw.query("pums", q, consumer="analysts", budget=QueryBudget(rho=0.01))
    r = gw.query("pums", q, consumer="analysts", budget=QueryBudget(rho=0.01))
    assert r["cached"] is False
    # both attempts were charged: the failed one is never refunded
    assert len(gw.ledger_entries()) == 2
    assert gw.budget("pums")["spent"]["rho"] == pytest.approx(0.02)
    assert gw.query("pums", q, consumer="analysts", budget=QueryBudget(rho=0.01))["cached"] is True


def test_a_vanishing_budget_is_a_client_error_not_a_500(gw):
    from dpgate.errors import InvalidBudget

    for budget in (QueryBudget(rho=1e-320), QueryBudget(rho=1e-24)):
        with pytest.raises(InvalidBudget):
            gw.query("pums", "SELECT SUM(income) FROM persons", consumer="analysts", budget=budget)
    with pytest.raises(InvalidBudget):
        gw.query("pums", "SELECT COUNT(*) FROM persons", consumer="analysts",
                 budget=QueryBudget(epsilon=1e-16), mechanism="laplace")  # b = 4e16 > 2^52
    assert gw.ledger_entries() == []


def test_published_data_version_is_keyed_not_a_plain_hash_of_the_data(tmp_path):
    import hashlib

    src = tmp_path / "persons.csv"
    src.write_bytes((DATA / "PUMS_dup.csv").read_bytes())
    policies = tmp_path / "policies"
    policies.mkdir()
    text = POLICY.format(source=src, epsilon=4.0, version="x").replace('data_version = "x"\n', "")
    (policies / "pums.toml").write_text(text)
    plain = hashlib.sha256(src.read_bytes()).hexdigest()
    versions = []
    for home in ("h1", "h2"):
        with Gateway.open(Settings(policies=policies, home=tmp_path / home)) as g:
            v = g.dataset("pums")["data_version"]
            assert v.startswith("fp-") and plain[:24] not in v
            versions.append(v)
    assert versions[0] != versions[1]  # different secret keys
    with Gateway.open(Settings(policies=policies, home=tmp_path / "h3", fingerprint_key="k")) as g:
        a = g.dataset("pums")["data_version"]
    with Gateway.open(Settings(policies=policies, home=tmp_path / "h4", fingerprint_key="k")) as g:
        assert g.dataset("pums")["data_version"] == a  # replicas sharing the key agree


def test_queries_differing_only_in_post_processing_share_one_charge(gw):
    # The noisy primitives (count per educ) are charged once; ORDER BY / LIMIT / HAVING /
    # output order and names are post-processing of them (Dwork & Roth 2014, Prop. 2.1).
    full = gw.query("pums", "SELECT educ, COUNT(*) AS n FROM persons GROUP BY educ", consumer="analysts",
                    budget=QueryBudget(rho=0.01))
    assert full["cached"] is False and len(gw.ledger_entries()) == 1
    by_key = {row[0]: row[1] for row in full["rows"]}
    top = gw.query("pums", "SELECT educ, COUNT(*) AS n FROM persons GROUP BY educ ORDER BY n DESC LIMIT 3",
                   consumer="analysts", budget=QueryBudget(rho=0.01))
    assert top["cached"] is True and top["charge"] is None
    assert top["derived_from"] == full["release_id"] and top["release_id"] != full["release_id"]
    assert [r[1] for r in top["rows"]] == sorted(by_key.values(), reverse=True)[:3]
    assert all(by_key[e] == n for e, n in top["rows"])
    having = gw.query("pums", "SELECT COUNT(*) AS c, educ FROM persons GROUP BY educ HAVING COUNT(*) > 100",
                      consumer="analysts", budget=QueryBudget(rho=0.01))
    assert having["columns"] == ["c", "educ"]
    assert sorted(having["rows"], key=lambda r: r[1]) == sorted(
        [[n, e] for e, n in by_key.items() if n > 100], key=lambda r: r[1])
    assert len(gw.ledger_entries()) == 1  # still the one charge
    # the derived release is stored and served again as itself
    again = gw.query("pums", "SELECT educ, COUNT(*) AS n FROM persons GROUP BY educ ORDER BY n DESC LIMIT 3",
                     consumer="analysts", budget=QueryBudget(rho=0.01))
    assert again["release_id"] == top["release_id"]
    assert "noisy" not in again and "noisy" not in gw.release(full["release_id"])
    # a different filter is different noise: charged
    gw.query("pums", "SELECT educ, COUNT(*) FROM persons WHERE age > 30 GROUP BY educ", consumer="analysts",
             budget=QueryBudget(rho=0.01))
    assert len(gw.ledger_entries()) == 2


def test_swapped_outputs_are_served_from_the_same_noisy_primitives(gw):
    a = gw.query("pums", "SELECT sex, COUNT(*) AS n, AVG(income) AS avg FROM persons GROUP BY sex",
                 consumer="analysts", budget=QueryBudget(rho=0.03))
    b = gw.query("pums", "SELECT sex, AVG(income) AS avg, COUNT(*) AS n FROM persons GROUP BY sex",
                 consumer="analysts", budget=QueryBudget(rho=0.03))
    assert b["cached"] is True and len(gw.ledger_entries()) == 1
    assert [[r[0], r[2], r[1]] for r in b["rows"]] == a["rows"]


def test_whether_a_query_fails_never_depends_on_the_data(gw):
    # ROUND of a huge integer overflows in DuckDB; before, the error itself told whether a row
    # with age = 59 existed (a release without noise). The whole WHERE is now wrapped in TRY:
    # a row whose predicate would raise is filtered out, and both probes succeed.
    probe = ("SELECT COUNT(*) FROM persons WHERE ROUND((1 - LEAST(ABS(age - {v}), 1)) * 5 "
             "+ 9223372036854775800, -1) > 0")
    for v in (59, 1000):  # 59 occurs in the data, 1000 cannot
        r = gw.query("pums", probe.format(v=v), consumer="analysts", budget=QueryBudget(rho=0.001))
        assert len(r["rows"]) == 1


def test_a_rewrite_duckdb_cannot_bind_is_refused_before_the_charge(gw):
    from dpgate.errors import InvalidSql

    for sql in ("SELECT COUNT(*) FROM persons WHERE ROUND(age, 2147483648) > 1",
                "SELECT COUNT(*) FROM persons WHERE age = 1 GROUP BY"):
        with pytest.raises(InvalidSql):
            gw.query("pums", sql, consumer="analysts", budget=QueryBudget(rho=0.001))
    assert gw.ledger_entries() == []


def test_a_tiny_pure_epsilon_charge_is_never_rounded_down_to_zero(gw):
    # ε = √(2·1e-30): the worst-case RDP of ε-DP is ≤ αε²/2 (Bun–Steinke 2016, Prop. 3.3); the
    # charge must carry ρ' = ε²/2 = 1e-30, not a curve that underflowed to 0.
    r = gw.query("pums", "SELECT COUNT(*) FROM persons", consumer="analysts",
                 budget=QueryBudget(rho=1e-30), mechanism="laplace")
    assert r["charge"]["rho"] == pytest.approx(1e-30, rel=1e-6)


def test_select_list_post_processing_is_free_and_shares_the_stored_primitives(gw):
    # issue 10 item 1: arithmetic over aggregates and constants in the select list is evaluated
    # on the released values; it shares the bare query's noisy primitives (no second charge) and a
    # linear map's accuracy is exact: the 95 % half-width of SUM(age) / 10 is that of SUM(age) / 10.
    before = len(gw.ledger_entries())
    bare = gw.query("pums", "SELECT sex, SUM(age) AS s FROM persons GROUP BY sex", consumer="analysts",
                    budget=QueryBudget(rho=0.02))
    derived = gw.query("pums", "SELECT sex, SUM(age) * 1 AS s1, SUM(age) / 10 AS s10, 3 AS three "
                       "FROM persons GROUP BY sex", consumer="analysts", budget=QueryBudget(rho=0.02))
    assert len(gw.ledger_entries()) == before + 1 and derived["charge"] is None
    assert derived["columns"] == ["sex", "s1", "s10", "three"]
    for a, b in zip(bare["rows"], derived["rows"]):
        assert b[0] == a[0] and b[1] == pytest.approx(a[1]) and b[2] == pytest.approx(a[1] / 10) and b[3] == 3
    assert derived["accuracy"]["s10"]["ci95"] == pytest.approx(bare["accuracy"]["s"]["ci95"] / 10, rel=1e-9)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) + random() FROM persons",        # non-deterministic
    "SELECT MD5(CAST(COUNT(*) AS VARCHAR)) FROM persons",  # a function post-processing does not evaluate
    "SELECT age + 1, COUNT(*) FROM persons",           # a raw column outside an aggregate
])
def test_select_list_expressions_that_cannot_be_evaluated_are_refused_free(gw, sql):
    before = len(gw.ledger_entries())
    with pytest.raises(UnsupportedQuery) as e:
        gw.query("pums", sql, consumer="analysts", budget=QueryBudget(rho=0.02))
    assert "nothing was charged" in str(e.value)
    assert len(gw.ledger_entries()) == before
