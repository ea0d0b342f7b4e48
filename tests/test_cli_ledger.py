"""Tests of ``dpgate ledger show | verify | export``."""

from __future__ import annotations

import json
import sqlite3

import pytest
from _oracles import ledger_epsilon as oracle_epsilon

from dpgate.accounting import Cost
from dpgate.cli import main
from dpgate.ledger import open_ledger
from dpgate.ledger.base import canonical_json, entry_hash
from dpgate.ledger.entries import hashed_entry

DELTA = 1e-6


@pytest.fixture
def url(tmp_path):
    u = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    led = open_ledger(u)
    led.ensure_population("users", epsilon=4.0, delta=DELTA, allocations={"dash": 0.6, "analysts": 0.4})
    led.ensure_population("patients", rho_cap=0.1, delta=1e-7, allocations={})
    for i in range(5):
        led.charge("users", "dash", Cost.zcdp(0.01), purpose=f"query {i}")
    led.charge("users", "analysts", Cost.pure(0.2), purpose="laplace")
    led.charge("patients", "x", Cost.zcdp(0.02), purpose="study")
    led.close()
    return u


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_show_json(url, capsys):
    code, out, _ = run(capsys, "ledger", "show", "--ledger-url", url, "--json")
    assert code == 0
    data = json.loads(out)
    pops = {p["population"]: p for p in data["populations"]}
    assert set(pops) == {"users", "patients"}
    assert pops["patients"]["spent"]["rho"] == 0.02
    assert pops["patients"]["spent"]["epsilon"] == pytest.approx(oracle_epsilon(0.02, 1e-7), rel=1e-9)
    assert pops["users"]["consumers"]["dash"]["spent_rho"] == pytest.approx(0.05)
    assert pops["users"]["charges"] == 6
    assert len(data["entries"]) == 7  # default limit 20


def test_show_population_and_limit(url, capsys):
    code, out, _ = run(capsys, "ledger", "show", "--ledger-url", url, "--json", "--population", "users",
                       "--limit", "2")
    assert code == 0
    data = json.loads(out)
    assert [p["population"] for p in data["populations"]] == ["users"]
    assert [e["purpose"] for e in data["entries"]] == ["query 4", "laplace"]


def test_show_table(url, capsys):
    code, out, _ = run(capsys, "ledger", "show", "--ledger-url", url)
    assert code == 0
    assert "population" in out and "remaining ρ" in out and "users" in out and "patients" in out
    assert "dash" in out and "analysts" in out
    assert "latest 7 charge(s)" in out


def test_show_unknown_population(url, capsys):
    code, _, err = run(capsys, "ledger", "show", "--ledger-url", url, "--population", "nobody", "--json")
    assert code == 4  # not found (dpgate.cli.exits)
    assert json.loads(err)["error"]["code"] == "unknown_population"
    code, _, err = run(capsys, "ledger", "show", "--ledger-url", url, "--population", "nobody")
    assert code == 4 and err.startswith("dpgate: error: no population 'nobody'")


def test_missing_ledger_is_an_error_and_is_not_created(tmp_path, capsys):
    target = tmp_path / "nope.sqlite"
    for action in ("show", "verify", "export"):
        code, _, err = run(capsys, "ledger", action, "--ledger-url", f"sqlite:///{target}", "--json")
        assert code == 7 and json.loads(err)["error"]["code"] == "ledger_error"  # configuration
    assert not target.exists()


def test_home_option_locates_the_ledger(tmp_path, capsys):
    led = open_ledger(f"sqlite:///{tmp_path / 'home' / 'ledger.sqlite'}")
    led.ensure_population("p", epsilon=1.0, delta=DELTA, allocations={})
    led.close()
    code, out, _ = run(capsys, "ledger", "verify", "--home", str(tmp_path / "home"), "--json")
    assert code == 0 and json.loads(out)["entries"] == 1


def test_verify_ok_and_tampered(url, capsys, tmp_path):
    code, out, _ = run(capsys, "ledger", "verify", "--ledger-url", url)
    assert code == 0 and "ledger OK: 9 entries (7 charges, 2 events)" in out
    code, out, _ = run(capsys, "ledger", "verify", "--ledger-url", url, "--json")
    rep = json.loads(out)
    assert code == 0 and rep["ok"] and rep["problems"] == [] and len(rep["head"]) == 64
    conn = sqlite3.connect(str(tmp_path / "ledger.sqlite"))
    conn.execute("DROP TRIGGER charges_no_update")
    conn.execute("UPDATE charges SET rho = 0 WHERE purpose = 'study'")
    conn.commit()
    conn.close()
    code, out, _ = run(capsys, "ledger", "verify", "--ledger-url", url)
    assert code == 1 and "FAILED" in out and "hash mismatch" in out
    code, out, _ = run(capsys, "ledger", "verify", "--ledger-url", url, "--json")
    assert code == 1 and not json.loads(out)["ok"]


def test_export_json_lines_are_a_verifiable_chain(url, capsys, tmp_path):
    code, out, _ = run(capsys, "ledger", "export", "--ledger-url", url)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 9
    assert [e["type"] for e in lines].count("event") == 2
    assert [e["seq"] for e in lines] == list(range(1, 10))
    prev = "0" * 64
    for e in lines:  # an auditor's check, with the documented canonical serialisation
        assert e["prev_hash"] == prev and entry_hash(hashed_entry(e)) == e["hash"]
        prev = e["hash"]
    # the stored JSON fields are objects, not JSON strings inside JSON (issue 24)
    events = [e for e in lines if e["type"] == "event"]
    assert events[0]["kind"] == "population_created" and events[0]["old"] is None
    assert events[0]["new"]["cap"]["epsilon"] == 4.0 and events[0]["new"]["allocations"] == {"dash": 0.6,
                                                                                              "analysts": 0.4}
    charges = [e for e in lines if e["type"] == "charge"]
    assert all(isinstance(c["cost"], dict) and isinstance(c["metadata"], dict) for c in charges)
    target = tmp_path / "export.jsonl"
    code, out, _ = run(capsys, "ledger", "export", "--ledger-url", url, "--output", str(target), "--json")
    assert code == 0 and json.loads(out) == {"output": str(target), "entries": 9, "head": prev}
    assert target.read_text().splitlines() == [json.dumps(e, sort_keys=True, separators=(",", ":"),
                                                          ensure_ascii=False) for e in lines]


def test_export_after_cap_changes_writes_objects_and_old_exports_still_check(url, capsys):
    led = open_ledger(url)
    led.set_cap("users", epsilon=3.0, delta=DELTA, actor="root", reason="lower")
    led.set_cap("users", epsilon=2.5, delta=DELTA, actor="root", reason="lower again")
    old_format = [canonical_json(e) for e in led.chain()]  # what exports wrote before issue 24
    led.close()
    code, out, _ = run(capsys, "ledger", "export", "--ledger-url", url)
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    changes = [e for e in lines if e.get("kind") == "cap_changed"]
    assert [(c["old"]["epsilon"], c["new"]["epsilon"]) for c in changes] == [(4.0, 3.0), (3.0, 2.5)]
    assert all(isinstance(c["new"]["rho_cap"], float) for c in changes)
    for text in old_format:  # the old form (JSON text inside JSON) checks with the same function
        e = json.loads(text)
        assert isinstance(e.get("new", e.get("cost")), str)
        assert entry_hash(hashed_entry(e)) == e["hash"]
    for e in lines:  # a tampered object breaks the hash
        if e.get("kind") == "cap_changed":
            e["new"]["epsilon"] = 40.0
            assert entry_hash(hashed_entry(e)) != e["hash"]


def test_cli_reads_change_nothing(url, capsys, tmp_path):
    def dump():
        conn = sqlite3.connect(str(tmp_path / "ledger.sqlite"))
        try:
            return list(conn.iterdump())
        finally:
            conn.close()

    before = dump()
    for argv in (["show"], ["verify"], ["export"], ["show", "--json"]):
        assert run(capsys, "ledger", *argv, "--ledger-url", url)[0] == 0
    assert dump() == before
