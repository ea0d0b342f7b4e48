"""What a new user tripped on (issue 9), CLI and HTTP side by side.

* CLI errors are sentences by default and the API's error shape with ``--json``;
  one exit status per kind of error (:mod:`dpgate.cli.exits`), documented in the README;
* ``dpgate ledger show | head`` ends quietly; ``dpgate serve`` binds before it says
  ``listening`` and a taken port is one line;
* ``dpgate query --json`` prints the same document as ``POST /v1/queries``;
* one budget validator (``QueryBudget``) for HTTP and CLI: same code, same message;
* messages that point at the fix (Content-Type, Bearer, revoked key, unknown
  dataset, a typo'd field);
* ``dpgate keys add --consumer`` is checked against the policies' allocations;
* the README's configuration table is generated from ``Settings``.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import sys

import pytest
from _api_server import REPO, LiveServer, make_project

from dpgate import errors as errors_module
from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.cli import build_parser, exits, main, settings_from_args
from dpgate.cli.serve import example_query
from dpgate.errors import DpgateError
from dpgate.ledger import open_ledger
from dpgate.accounting import Cost
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings, configuration_table, setting_flag

QUERY = "SELECT region, COUNT(*) AS n FROM prompts GROUP BY region"

OPEN_POLICY = """
[dataset]
name = "open"
population = "open-people"
data_version = "v1"

[budget]
epsilon = 2.0
delta = 1e-6
default_query_rho = 0.001

[tables.visits]
source = "open/visits.csv"
privacy_unit = "person"
max_groups_per_unit = 1
max_rows_per_unit = 2

[tables.visits.columns]
ward = { type = "text", public_keys = ["a", "b"] }
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("newuser"))


@pytest.fixture()
def settings(project, tmp_path):
    return Settings(policies=project / "policies", home=tmp_path / "state")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DPGATE_")}


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _common(settings: Settings) -> list[str]:
    return ["--policies", str(settings.policies), "--home", str(settings.home)]


# --- errors: sentences, --json, exit statuses ------------------------------------------------


def test_cli_errors_are_sentences_and_json_on_request(settings, capsys):
    code, out, err = _cli(capsys, "explain", "--dataset", "usag", QUERY, *_common(settings))
    assert code == exits.NOT_FOUND == 4
    assert out == ""
    assert err.startswith("dpgate: error: unknown dataset 'usag' (did you mean 'usage'?); datasets: usage")
    assert err.rstrip().endswith("[unknown_dataset]") and "{" not in err and err.count("\n") == 1
    code, _, err = _cli(capsys, "explain", "--dataset", "usag", QUERY, *_common(settings), "--json")
    assert code == 4
    body = json.loads(err)
    assert body["error"]["code"] == "unknown_dataset"
    assert body["error"]["details"] == {"dataset": "usag", "datasets": ["usage"]}
    # the same kind of error exits the same way from every command
    assert _cli(capsys, "budget", "usag", *_common(settings))[0] == 4
    assert _cli(capsys, "query", "--dataset", "usag", QUERY, *_common(settings))[0] == 4
    # refused SQL is a usage error (2), like argparse's own
    code, _, err = _cli(capsys, "explain", "--dataset", "usage", "SELECT * FROM prompts", *_common(settings))
    assert code == exits.USAGE and "[unsupported_query]" in err
    with pytest.raises(SystemExit) as usage:
        main(["explain"])
    assert usage.value.code == exits.USAGE
    capsys.readouterr()


def test_a_defect_is_one_line_and_exit_8_not_a_traceback(settings, capsys, monkeypatch):
    """Trial finding (2026-12-03): an unexpected exception (a TypeError from the release store)
    printed a raw traceback and exited 1; the README's table says `internal` exits 8."""
    import dpgate.cli.budget as budget_cmd

    def boom(*_a, **_k):
        raise TypeError("something broke")
    monkeypatch.delenv("DPGATE_DEBUG", raising=False)
    monkeypatch.setattr(budget_cmd, "run", boom)
    code, out, err = _cli(capsys, "budget", "usage", *_common(settings))
    assert code == exits.FAILED == 8 and out == ""
    assert err.startswith("dpgate: error: internal error (TypeError)") and "[internal]" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_budget_exhausted_exits_5_with_a_sentence(settings, capsys):
    code, _, err = _cli(capsys, "query", "--dataset", "usage", QUERY, "--rho", "5", *_common(settings))
    assert code == exits.REFUSED == 5
    # one short sentence: what is needed, what is left of what (issue 24)
    assert err.startswith("dpgate: error: needs ρ 5; left for ") and "[budget_exhausted]" in err
    assert len(err.splitlines()) == 1 and len(err) < 200


def test_every_error_code_has_one_exit_status_and_the_readme_lists_it():
    table = {status: meaning for status, meaning in exits.MEANINGS}
    classes = [c for _, c in inspect.getmembers(errors_module, inspect.isclass)
               if issubclass(c, DpgateError) and c is not DpgateError]
    assert len(classes) >= 15
    for cls in classes:
        status = exits.exit_status(cls("x"))
        assert f"`{cls.code}`" in table[status], (cls.code, status)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- exit-status-table:start -->\n", 1)[1].split("<!-- exit-status-table:end -->", 1)[0]
    assert block == exits.status_table()


def test_a_bad_setting_is_one_line_not_a_traceback(settings):
    env = {**_env(), "DPGATE_PORT": "eighty"}
    done = subprocess.run([sys.executable, "-m", "dpgate", "budget", "usage", *_common(settings)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == exits.CONFIGURATION
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("dpgate: error: invalid setting --port / DPGATE_PORT")
    assert "eighty" not in done.stderr


# --- pipes and serve ---------------------------------------------------------------------------


def test_a_closed_pipe_ends_quietly(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    ledger = open_ledger(url)
    ledger.ensure_population("users", epsilon=4.0, delta=1e-6, allocations={"a": 1.0})
    for i in range(30):
        ledger.charge("users", "a", Cost.zcdp(0.001), purpose=f"query {i}")
    ledger.close()
    # `dpgate ledger show | head -1`: the reader is gone before the writer writes
    proc = subprocess.Popen([sys.executable, "-m", "dpgate", "ledger", "show", "--ledger-url", url],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert proc.returncode == exits.BROKEN_PIPE
    # through a real shell pipe too
    done = subprocess.run(f"'{sys.executable}' -m dpgate ledger export --ledger-url '{url}' | head -1",
                          shell=True, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("{") and "Traceback" not in done.stderr, done.stderr


def test_serve_on_a_taken_port_is_one_line_and_never_says_listening(tmp_path):
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "usage.toml").write_text((REPO / "policies" / "usage.toml").read_text())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "dpgate", "serve", "--port", str(port), "--demo-keys"],
                              cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == exits.CONFIGURATION, output
    assert "listening" not in output and "Traceback" not in output
    assert done.stderr == (f"dpgate: error: cannot listen on 127.0.0.1:{port}: the address is already in use "
                           "(another dpgate serve?); pick another port with --port N or DPGATE_PORT\n")
    # nothing was generated or created before the bind failed
    assert not (tmp_path / "sample_data").exists() and not (tmp_path / ".dpgate" / "keys.json").exists()


# --- one document, one validator ---------------------------------------------------------------


def test_query_json_is_the_http_document(settings, capsys):
    sql = "SELECT region, AVG(tokens) AS t FROM prompts WHERE week = 3 GROUP BY region"
    code, out, err = _cli(capsys, "query", "--dataset", "usage", sql, "--rho", "0.002", "--consumer", "analysts",
                          *_common(settings), "--json")
    assert code == 0, err
    cli_doc = json.loads(out)
    assert "release" not in cli_doc and "release_id" in cli_doc  # not wrapped in {"release", "budget"}
    key, _ = KeyStore(settings.resolved_keys_file()).add("a", role="analyst", consumer="analysts")
    with LiveServer(create_app(settings)) as server, server.client(key) as client:
        http_doc = client.post("/v1/queries", json={"dataset": "usage", "sql": sql, "budget": {"rho": 0.002}}).json()
    assert http_doc["cached"] is True and cli_doc["cached"] is False
    assert set(http_doc) == set(cli_doc)
    assert http_doc["paid_by"] == cli_doc["charge"] == cli_doc["paid_by"]
    for field in set(cli_doc) - {"cached", "charge"}:
        assert http_doc[field] == cli_doc[field], field


BAD_BUDGETS = [
    ({"rho": -1.0}, ["--rho", "-1"]),
    ({"rho": 0.0}, ["--rho", "0"]),
    ({"rho": 20000.0}, ["--rho", "20000"]),
    ({"epsilon": 1e5}, ["--epsilon", "1e5"]),
    ({"ci95": -3.0}, ["--ci95", "-3"]),
]


@pytest.mark.parametrize("body, flags", BAD_BUDGETS)
def test_http_and_cli_refuse_a_budget_alike(settings, capsys, body, flags):
    _, _, err = _cli(capsys, "query", "--dataset", "usage", QUERY, *flags, *_common(settings), "--json")
    cli_error = json.loads(err)["error"]
    key, _ = KeyStore(settings.resolved_keys_file()).add("b", role="analyst", consumer="analysts")
    gateway = Gateway.open(settings)
    try:
        from starlette.testclient import TestClient

        client = TestClient(create_app(settings, gateway=gateway))
        r = client.post("/v1/queries", headers={"Authorization": f"Bearer {key}"},
                        json={"dataset": "usage", "sql": QUERY, "budget": body})
    finally:
        gateway.close()
    assert r.status_code == 400
    assert r.json()["error"] == cli_error
    assert cli_error["code"] == "invalid_budget"


def test_the_one_budget_validator_limits():
    assert QueryBudget(rho=QueryBudget.MAX_RHO).rho == 1e4
    with pytest.raises(DpgateError, match="at most 10000"):
        QueryBudget(rho=10_000.5)
    with pytest.raises(DpgateError, match="names none"):
        QueryBudget.from_request({"rho": None})
    with pytest.raises(DpgateError, match="not rho and epsilon"):
        QueryBudget.from_request({"rho": 0.1, "epsilon": 1.0})


# --- messages that point at the fix ------------------------------------------------------------


@pytest.fixture()
def client(settings):
    from starlette.testclient import TestClient

    store = KeyStore(settings.resolved_keys_file())
    keys = {"analyst": store.add("ann", role="analyst", consumer="analysts")[0],
            "gone": store.add("old-laptop", role="analyst", consumer="analysts")[0]}
    store.revoke("old-laptop")
    gateway = Gateway.open(settings)
    try:
        yield TestClient(create_app(settings, gateway=gateway, keys=store)), keys
    finally:
        gateway.close()


def _error(r, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["code"] == code, body
    return body["message"]


def test_messages_point_at_the_fix(client):
    c, keys = client
    auth = {"Authorization": f"Bearer {keys['analyst']}"}
    body = json.dumps({"dataset": "usage", "sql": QUERY})
    # curl -d without a JSON Content-Type (curl sends application/x-www-form-urlencoded)
    r = c.post("/v1/queries", headers={**auth, "Content-Type": "application/x-www-form-urlencoded"}, content=body)
    message = _error(r, 400, "invalid_request")
    assert "Content-Type: application/json" in message and "valid dictionary" not in message
    r = c.post("/v1/queries", headers=auth, content=body)  # no Content-Type at all
    assert "Content-Type: application/json" in _error(r, 400, "invalid_request")
    # the key without "Bearer "
    r = c.post("/v1/queries", headers={"Authorization": keys["analyst"]}, json={"dataset": "usage", "sql": QUERY})
    assert "Authorization: Bearer <key>" in _error(r, 401, "unauthenticated")
    assert "missing" not in r.json()["error"]["message"]
    r = c.get("/v1/datasets", headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert "unsupported Authorization scheme 'Basic'" in _error(r, 401, "unauthenticated")
    # a revoked key is told so
    r = c.get("/v1/datasets", headers={"Authorization": f"Bearer {keys['gone']}"})
    message = _error(r, 401, "unauthenticated")
    assert "'old-laptop' was revoked at" in message and "ask an admin for a new key" in message
    # an unknown dataset lists the ones that exist
    r = c.post("/v1/queries", headers=auth, json={"dataset": "usages", "sql": QUERY})
    message = _error(r, 404, "unknown_dataset")
    assert message == "unknown dataset 'usages' (did you mean 'usage'?); datasets: usage"
    assert r.json()["error"]["details"]["datasets"] == ["usage"]
    assert "datasets: usage" in _error(c.get("/v1/datasets/nope/budget", headers=auth), 404, "unknown_dataset")
    # a typo'd field: the closest one, and the fields that exist
    r = c.post("/v1/queries", headers=auth, json={"dataset": "usage", "sql": QUERY, "budjet": {"rho": 0.001}})
    message = _error(r, 400, "invalid_request")
    assert "unknown field 'budjet': did you mean 'budget'?" in message
    assert "expected: dataset, sql, budget, mechanism" in message
    r = c.post("/v1/queries", headers=auth, json={"dataset": "usage", "sql": QUERY, "budget": {"rh": 0.001}})
    assert "unknown field 'rh': did you mean 'rho'?" in _error(r, 400, "invalid_request")
    r = c.post("/v1/queries", headers=auth, json={"dataset": "usage", "sql": QUERY, "consumer": "dashboard"})
    assert "comes from the API key" in _error(r, 400, "invalid_request")
    # nothing above was charged
    assert c.get("/v1/datasets/usage/budget", headers=auth).json()["charges"] == 0


# --- keys ---------------------------------------------------------------------------------------


def test_keys_add_checks_the_consumer_against_the_policies(settings, capsys, tmp_path):
    home = ["--home", str(settings.home), "--policies", str(settings.policies)]
    code, _, err = _cli(capsys, "keys", "add", "bob", "--role", "analyst", "--consumer", "analyst", *home)
    assert code == exits.NOT_FOUND
    assert err == ("dpgate: error: no policy allocates budget to consumer 'analyst' (did you mean 'analysts'?); "
                   "allocations: analysts, dashboard [unknown_consumer]\n")
    assert _cli(capsys, "keys", "add", "bob", "--role", "service", "--consumer", "nonexistent", *home)[0] == 4
    assert KeyStore(settings.resolved_keys_file()).records() == []
    assert _cli(capsys, "keys", "add", "bob", "--role", "analyst", "--consumer", "analysts", *home)[0] == 0
    code, _, err = _cli(capsys, "keys", "add", "carl", "--role", "analyst", *home)
    assert code == exits.USAGE and "an analyst key needs --consumer" in err
    # a policy without [allocations] admits any consumer
    (tmp_path / "open" / "policies").mkdir(parents=True)
    (tmp_path / "open" / "policies" / "open.toml").write_text(OPEN_POLICY)
    code, _, err = _cli(capsys, "keys", "add", "dan", "--role", "analyst", "--consumer", "anyone",
                        "--home", str(settings.home), "--policies", str(tmp_path / "open" / "policies"))
    assert code == 0, err


def test_demo_keys_example_uses_a_dataset_of_the_policies(tmp_path):
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "open.toml").write_text(OPEN_POLICY)
    assert example_query(tmp_path / "policies", "analysts") == ("open", "SELECT COUNT(*) AS n FROM visits")
    assert example_query(REPO / "policies", "analysts")[0] == "usage"


# --- configuration -----------------------------------------------------------------------------


def test_readme_configuration_table_is_settings():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- settings-table:start -->\n", 1)[1].split("<!-- settings-table:end -->", 1)[0]
    assert block == configuration_table(), "regenerate README's table: dpgate.settings.configuration_table()"
    for name in ("fingerprint_key", "query_timeout_s", "max_body_bytes", "duckdb_memory_limit",
                 "duckdb_threads", "keys_file"):
        assert f"`DPGATE_{name.upper()}`" in block


def test_every_settings_flag_reaches_its_setting(tmp_path):
    parser = build_parser()
    values = {"policies": "p", "home": "h", "ledger_url": "sqlite:///x", "host": "::1", "port": "8123",
              "keys_file": "k.json", "query_timeout_s": "7.5", "max_body_bytes": "1000",
              "duckdb_memory_limit": "1GB", "duckdb_threads": "3"}
    serve = parser._subparsers._group_actions[0].choices["serve"]  # the `dpgate serve` parser
    argv = ["serve"]
    for name in Settings.model_fields:
        flag = setting_flag(name)
        if flag is None:
            continue
        # every flag named in the README's table exists on `dpgate serve` and lands in its setting
        assert flag in serve._option_string_actions, f"dpgate serve has no {flag} (setting {name})"
        assert serve._option_string_actions[flag].dest == flag.lstrip("-").replace("-", "_")
        if name in values:
            argv += [flag, values[name]]
    settings = settings_from_args(parser.parse_args(argv))
    assert settings.port == 8123 and settings.query_timeout_s == 7.5 and settings.max_body_bytes == 1000
    assert str(settings.keys_file) == "k.json" and settings.duckdb_threads == 3
    assert settings.duckdb_memory_limit == "1GB" and settings.host == "::1"
    assert setting_flag("fingerprint_key") is None  # a secret: environment only


def test_demo_runs_in_its_own_state_and_says_so_when_it_cannot(settings, capsys, tmp_path):
    code, out, err = _cli(capsys, "demo", *_common(settings))
    assert code == 0, err
    assert "its own ledger" in out
    assert (settings.home / "demo" / "ledger.sqlite").is_file()
    assert not (settings.home / "ledger.sqlite").exists()  # the gateway's ledger is untouched
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "open.toml").write_text(OPEN_POLICY)
    code, out, err = _cli(capsys, "demo", "--policies", str(tmp_path / "other"), "--home", str(settings.home))
    assert code == exits.CONFIGURATION
    assert err.startswith("dpgate: error: the demo runs on the quickstart dataset 'usage'") and "{" not in err


def test_common_options_may_come_before_the_sub_command(settings, capsys):
    # a trial found `dpgate --home H ledger show` refused by argparse
    code, out, _ = _cli(capsys, *_common(settings), "explain", "--dataset", "usage", QUERY)
    assert code == 0 and out
    code, out, err = _cli(capsys, "--json", *_common(settings), "explain", "--dataset", "usag", QUERY)
    assert code == 4 and json.loads(err)["error"]["code"] == "unknown_dataset"
    # the sub-command's own option wins over one written before it
    code, _, err = _cli(capsys, "--home", "/nonexistent/elsewhere", "query", "--dataset", "usage", QUERY,
                        "--consumer", "analysts", "--rho", "0.01", *_common(settings))
    assert code == 0, err


def test_an_unknown_consumer_names_the_allocations_and_the_flag(settings, capsys):
    code, _, err = _cli(capsys, "query", "--dataset", "usage", QUERY, "--consumer", "nobody", *_common(settings))
    assert code == 4 and "[unknown_consumer]" in err
    assert "pass --consumer NAME (this dataset's allocations: " in err and "analysts" in err
