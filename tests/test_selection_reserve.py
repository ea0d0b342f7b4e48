"""Issue 22 item 2, "no idle δ reserve": the default ``selection_delta`` of a cap.

δ/2 is reserved for private partition selection only when some protected table of the
population's datasets has a key column (text/int/bool/date/timestamp) without public keys, so
that a GROUP BY may need selection; otherwise the default is 0 and all of δ goes to ρ_cap. A
value stated in the file always wins. A population that exists keeps its stored cap (the new
default is reported as drift, adopted only by ``dpgate caps apply``).

Real policy files, real SQLite ledger, real gateway (no mocks); ρ_cap is checked against the
cap rule at the full δ (and shown to differ from the one at δ/2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpgate.errors import UnsupportedQuery
from dpgate.ledger import open_ledger
from dpgate.ledger.caps import ledger_rho
from dpgate.policy import load_policies
from dpgate.selection_reserve import selection_key_columns
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings

EPS, DELTA = 4.0, 1e-6

POLICY = """
[dataset]
name = "{name}"
population = "{population}"
data_version = "v1"

[budget]
epsilon = 4.0
delta = 1e-6
default_query_rho = 0.01
{budget}

[allocations]
analysts = 1.0

[tables.people]
source = "{source}"
privacy_unit = "pid"
max_groups_per_unit = 1
max_rows_per_unit = 1

[tables.people.columns]
pid = {{ type = "int" }}
region = {{ type = "text", public_keys = ["eu", "us"] }}
age = {{ type = "int", lower = 0, upper = 100{age_keys} }}
income = {{ type = "float", lower = 0, upper = 1000, resolution = 1 }}
"""

KEYED = ', public_keys = "range(0, 101)"'


def _project(root: Path, *datasets: tuple[str, str, str, str]) -> Path:
    """Write ``root/people.csv`` and one policy per ``(name, population, age_keys, budget)``."""
    root.mkdir(parents=True, exist_ok=True)
    csv = root / "people.csv"
    csv.write_text("pid,region,age,income\n" + "".join(
        f"{i},{'eu' if i % 2 else 'us'},{i % 90},{(i * 37) % 1000}\n" for i in range(200)))
    folder = root / "policies"
    folder.mkdir(exist_ok=True)
    for name, population, age_keys, budget in datasets:
        (folder / f"{name}.toml").write_text(POLICY.format(
            name=name, population=population, age_keys=age_keys, budget=budget, source=csv.as_posix()))
    return folder


def _gateway(tmp_path: Path, folder: Path) -> Gateway:
    return Gateway.open(Settings(policies=folder, home=tmp_path / "state"))


def test_every_key_column_has_public_keys_so_no_delta_is_reserved(tmp_path):
    folder = _project(tmp_path, ("keyed", "people", KEYED, ""))
    policy = load_policies(folder)["keyed"]
    assert selection_key_columns(policy.tables.values()) == ()  # pid is the unit; income a measure
    assert policy.budget.selection_delta == 0.0 and policy.budget.default_selection_delta == 0.0
    assert not policy.budget.selection_delta_stated
    with _gateway(tmp_path, folder) as gw:
        cap = gw.ledger.cap("people")
        assert cap.selection_delta == 0.0 and cap.rho_delta == DELTA
        assert cap.rho_cap == ledger_rho(EPS, DELTA)
        assert cap.rho_cap > ledger_rho(EPS, DELTA / 2) * 1.01  # what the δ/2 reserve cost (> 1 %)
        assert gw.dataset("keyed")["cap"]["selection_delta"] == 0.0
        # a GROUP BY on a float column without keys is refused before any charge (a float is a
        # measure: partition selection takes int, text, bool and date keys)
        with pytest.raises(UnsupportedQuery, match=r"float column without public keys cannot be a group key"):
            gw.query("keyed", "SELECT income, COUNT(*) FROM people GROUP BY income", consumer="analysts",
                     budget=QueryBudget(rho=0.01))
        assert gw.ledger.spend("people").charges == 0


def test_a_key_column_without_public_keys_reserves_half_of_delta(tmp_path):
    folder = _project(tmp_path, ("open", "people", "", ""))
    policy = load_policies(folder)["open"]
    assert selection_key_columns(policy.tables.values()) == (("people", "age"),)
    assert policy.budget.selection_delta == DELTA / 2
    assert policy.budget.default_selection_delta == DELTA / 200
    with _gateway(tmp_path, folder) as gw:
        cap = gw.ledger.cap("people")
        assert cap.selection_delta == DELTA / 2
        assert cap.rho_cap == ledger_rho(EPS, DELTA / 2)
        rel = gw.query("open", "SELECT age, COUNT(*) FROM people GROUP BY age", consumer="analysts",
                       budget=QueryBudget(rho=0.05))
        assert rel["partition_selection"]["delta"] <= DELTA / 200


@pytest.mark.parametrize("age_keys, budget, selection", [
    (KEYED, "selection_delta = 1e-7", 1e-7),     # stated in a policy that needs none
    ("", "selection_delta = 0", 0.0),            # stated 0 where a key lacks public keys: selection off
    (KEYED, "default_selection_delta = 1e-9", DELTA / 2),  # a stated per-query δ asks for selection
])
def test_a_stated_value_always_wins(tmp_path, age_keys, budget, selection):
    folder = _project(tmp_path, ("ds", "people", age_keys, budget))
    policy = load_policies(folder)["ds"]
    assert policy.budget.selection_delta == selection and policy.budget.selection_delta_stated
    with _gateway(tmp_path, folder) as gw:
        assert gw.ledger.cap("people").rho_cap == ledger_rho(EPS, DELTA - selection)


def test_the_default_is_decided_per_population(tmp_path):
    # one population, two datasets: one has a key-less key column, so the population's one cap
    # reserves δ/2 for both (and they agree, instead of publishing two caps); another
    # population with keys everywhere reserves nothing
    folder = _project(tmp_path, ("a_keyed", "people", KEYED, ""), ("b_open", "people", "", ""),
                      ("c_other", "others", KEYED, ""))
    policies = load_policies(folder)
    assert policies["a_keyed"].budget.selection_delta == DELTA / 2
    assert policies["a_keyed"].budget.default_selection_delta == DELTA / 200
    assert policies["b_open"].budget.selection_delta == DELTA / 2
    assert policies["c_other"].budget.selection_delta == 0.0


def test_an_existing_population_keeps_its_stored_reserve(tmp_path):
    # a population created before issue 22 (its cap reserved δ/2, the old default) keeps it: the
    # file's new default (0) is drift until `dpgate caps apply`, and charges follow the stored cap
    # (a float column never selects: GROUP BY on one without public keys is refused)
    folder = _project(tmp_path, ("keyed", "people", KEYED, ""))
    settings = Settings(policies=folder, home=tmp_path / "state")
    led = open_ledger(settings.resolved_ledger_url(), create=True)
    try:
        led.ensure_population("people", epsilon=EPS, delta=DELTA, allocations={"analysts": 1.0},
                              selection_delta=DELTA / 2)
    finally:
        led.close()
    with Gateway.open(settings) as gw:
        cap = gw.ledger.cap("people")
        assert cap.selection_delta == DELTA / 2 and cap.rho_cap == ledger_rho(EPS, DELTA / 2)
        drift = gw.dataset("keyed")["policy_drift"]
        assert drift and "caps apply" in str(drift)
        # queries are charged against the stored cap (ρ_cap at δ − δ/2), not the file's
        rel = gw.query("keyed", "SELECT region, COUNT(*) AS n FROM people GROUP BY region", consumer="analysts",
                       budget=QueryBudget(epsilon=0.5))
        assert rel["charge"]["rho"] == pytest.approx(ledger_rho(0.5, DELTA / 2), rel=1e-12)
