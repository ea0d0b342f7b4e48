"""``dpgate.client`` against a real gateway: the uvicorn app in-process (fast tier) and
``dpgate serve --demo-keys`` as a child process (slow tier), on a temporary project.

Nothing is mocked: every call crosses HTTP to the real Gateway (DuckDB, SQLite ledger, OpenDP).
"""

from __future__ import annotations

import math
import os
import re
import sys

import pytest
from _api_server import LiveServer, ServeProcess, free_port, make_project, wait_healthy

from dpgate import client as dpc
from dpgate.client import (
    AuthenticationError,
    BudgetExhaustedError,
    Client,
    DpgateClientError,
    GatewayUnreachable,
    InvalidRequestError,
    NotFoundError,
    PermissionDenied,
    QueryRejected,
    Release,
)

COUNT_SQL = "SELECT region, COUNT(*) AS n FROM prompts GROUP BY region"
REGIONS = ["eu", "us", "apac", "latam", "africa"]
_KEY_LINE = re.compile(r"^\s*(analyst|dashboard|admin)\s+(\S+)\s+consumer=\S+\s+(dpg_[0-9a-f]{12}_[A-Za-z0-9_-]+)\s*$")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("client-project"))


def _inprocess(project, tmp_path_factory):
    from dpgate.api import create_app
    from dpgate.auth import KeyStore
    from dpgate.settings import Settings

    settings = Settings(policies=project / "policies", home=tmp_path_factory.mktemp("client-state"))
    store = KeyStore(settings.resolved_keys_file())
    keys = {"analyst": store.add("alice", role="analyst", consumer="analysts")[0],
            "dashboard": store.add("wall", role="dashboard")[0],
            "admin": store.add("root", role="admin")[0]}
    live = LiveServer(create_app(settings))
    live.__enter__()
    return live.url, keys, live.__exit__


def _subprocess(project):
    """``dpgate serve --demo-keys`` in the project folder, its keys read from what it prints."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPGATE_")}
    env["DPGATE_HOME"] = str(project / ".dpgate-client-test")
    server = ServeProcess([sys.executable, "-m", "dpgate", "serve", "--demo-keys", "--port", str(port),
                           "--log-level", "warning"], cwd=project, env=env)
    try:
        server.wait_for_line(r"for the README's walkthrough", timeout_s=180)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, timeout_s=180, proc=server)
    except BaseException:
        server.stop()
        raise
    keys = {}
    for line in server.lines:
        if m := _KEY_LINE.match(line):
            keys.setdefault(m.group(1), m.group(3))
    assert set(keys) == {"analyst", "dashboard", "admin"}, server.lines
    return url, keys, lambda *exc: server.stop()


@pytest.fixture(scope="module", params=["in-process", pytest.param("dpgate-serve", marks=pytest.mark.slow)])
def gateway(request, project, tmp_path_factory):
    """(url, keys by role) of a running gateway over the project's ``usage`` dataset."""
    if request.param == "in-process":
        url, keys, stop = _inprocess(project, tmp_path_factory)
    else:
        url, keys, stop = _subprocess(project)
    try:
        yield url, keys
    finally:
        stop(None, None, None)


@pytest.fixture()
def analyst(gateway):
    url, keys = gateway
    with Client(url, keys["analyst"], dataset="usage") as c:
        yield c


def test_a_query_returns_a_release_with_its_charge_guarantee_and_errors(analyst):
    r = analyst.query(COUNT_SQL, rho=0.002)
    assert isinstance(r, Release) and r.columns == ["region", "n"] and len(r) == 5
    assert [row[0] for row in r.rows] == REGIONS
    assert r.cached is False and r.charge["rho"] == pytest.approx(0.002)
    assert r.charge["consumer"] == "analysts" and r.charge["charge_id"].startswith("chg_")
    assert r.guarantee["population"] == "product-users" and r.guarantee["privacy_unit"] == "user_id"
    assert r.guarantee["cap"]["epsilon"] == 4.0 and r.guarantee["cap"]["rule"] == "alpha_cap"
    # σ of COUNT(*) with k = 1 group and m = 5 rows per user (usage.toml): Δ2 = 5, so at ρ = 0.002
    # σ = Δ2/√(2ρ) = 5/√0.004 = 79.06 (Bun & Steinke 2016, Prop. 1.6)
    assert r.accuracy["n"]["sigma"] == pytest.approx(5 / math.sqrt(2 * 0.002), rel=1e-9)
    records = r.records()
    assert list(records[0]) == ["region", "n", "n ±"]
    assert records[0]["n ±"] == r.accuracy["n"]["ci95"]

    again = analyst.query(COUNT_SQL, rho=0.002)  # the same release, served from the store: free
    assert again.cached is True and again.charge is None and again.rows == r.rows
    stored = analyst.release(r.release_id)
    assert stored.rows == r.rows and stored.release_id == r.release_id


def test_to_pandas_gives_plus_minus_columns_and_rank_errors(analyst):
    pd = pytest.importorskip("pandas", reason="pandas is optional (pip install pandas)")
    r = analyst.query("SELECT region, COUNT(*) AS n, AVG(tokens) AS mean_tokens FROM prompts GROUP BY region",
                      rho=0.004)
    df = r.to_pandas()
    assert isinstance(df, pd.DataFrame)
    assert list(df.columns) == ["region", "n", "n ±", "mean_tokens", "mean_tokens ±"]
    assert df["region"].tolist() == REGIONS
    # an AVG's half-width differs per row (it depends on the row's noisy count): ci95_rows
    assert df["mean_tokens ±"].tolist() == pytest.approx(r.accuracy["mean_tokens"]["ci95_rows"])
    assert df.attrs["release_id"] == r.release_id and df.attrs["charge"]["rho"] == pytest.approx(0.004)

    q = analyst.query("SELECT MEDIAN(tokens) AS med FROM prompts", rho=0.01).to_pandas()
    assert list(q.columns) == ["med", "med rank_error95"]
    assert 0 <= q["med"][0] <= 8000 and q["med rank_error95"][0] > 0


def test_to_pandas_without_pandas_says_how_to_get_it(monkeypatch):
    r = Release.from_json({"release_id": "r", "dataset": "d", "columns": ["n"], "rows": [[1]],
                           "accuracy": {"n": {"ci95": 2.0}}, "cached": False})
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now raises ImportError
    with pytest.raises(ImportError, match="pip install pandas"):
        r.to_pandas()
    assert r.records() == [{"n": 1, "n ±": 2.0}]


def test_explain_budget_releases_and_datasets(analyst, gateway):
    e = analyst.explain(COUNT_SQL, epsilon=0.5)
    assert e["plan_hash"] and e["cost"]["fits"] is True and e["cost"]["rho"] > 0
    before = analyst.budget()
    assert before["population"] == "product-users" and "analysts" in before["consumers"]
    analyst.query("SELECT COUNT(*) AS n FROM prompts WHERE week = 3", rho=0.001)
    after = analyst.budget()
    spent = lambda b: b["consumers"]["analysts"]["spent_rho"]  # noqa: E731
    assert spent(after) == pytest.approx(spent(before) + 0.001, rel=1e-9)
    assert [d["name"] for d in analyst.datasets()] == ["usage"]
    assert analyst.dataset_info()["tables"]["prompts"]["privacy_unit"] == "user_id"
    url, keys = gateway
    with Client(url, keys["dashboard"]) as viewer:  # a dashboard key reads stored releases only
        listed = viewer.releases("usage")
        assert listed and all(isinstance(r, Release) for r in listed)
        with pytest.raises(PermissionDenied) as info:
            viewer.query(COUNT_SQL, dataset="usage")
        assert info.value.code == "forbidden" and info.value.status == 403


def test_errors_are_typed_by_code_family_and_carry_details(analyst, gateway):
    url, _ = gateway
    with pytest.raises(BudgetExhaustedError) as info:
        analyst.query("SELECT COUNT(*) AS n FROM prompts WHERE week = 9", rho=5.0)
    err = info.value
    assert err.code == "budget_exhausted" and err.status == 409
    assert err.details["requested"]["rho"] == pytest.approx(5.0) and "remaining" in err.details
    assert isinstance(err, DpgateClientError)

    with pytest.raises(QueryRejected) as info:
        analyst.query("SELECT user_id FROM prompts")
    assert info.value.code == "unsupported_query" and info.value.status == 400
    assert isinstance(info.value, InvalidRequestError)
    with pytest.raises(QueryRejected, match="unknown_column|column"):
        analyst.query("SELECT SUM(nope) FROM prompts")
    with pytest.raises(InvalidRequestError) as info:
        analyst.query(COUNT_SQL, rho=0.1, epsilon=0.1)
    assert info.value.code == "invalid_budget"
    with pytest.raises(NotFoundError) as info:
        analyst.query(COUNT_SQL, dataset="usgae")
    assert info.value.code == "unknown_dataset" and info.value.details["datasets"] == ["usage"]
    with pytest.raises(NotFoundError):
        analyst.release("rel_does_not_exist")
    with Client(url, "dpg_000000000000_not-a-key") as bad, pytest.raises(AuthenticationError) as info:
        bad.budget("usage")
    assert info.value.code == "unauthenticated" and info.value.status == 401


def test_an_unreachable_gateway_is_a_typed_error():
    with Client(f"http://127.0.0.1:{free_port()}", "k", timeout=5) as c, pytest.raises(GatewayUnreachable) as info:
        c.datasets()
    assert info.value.code == "unreachable" and info.value.status is None


def test_every_api_error_code_maps_to_a_class():
    """Each code the gateway defines (dpgate.errors) has its family class, not the root."""
    from dpgate import errors

    codes = {cls.code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.DpgateError)}
    missing = sorted(codes - set(dpc.ERROR_CLASSES))
    assert not missing, f"error codes without a client class: {missing}"
    assert dpc.ERROR_CLASSES["budget_exhausted"] is BudgetExhaustedError


def test_the_client_imports_neither_the_gateway_nor_its_engines():
    import subprocess

    code = ("import sys, dpgate.client; bad = [m for m in ('duckdb', 'opendp', 'dpgate.service', 'fastapi') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("budget", [{"rho": float("nan")}, {"epsilon": float("inf")}, {"ci95": float("-inf")}])
def test_a_non_finite_budget_is_a_client_error_before_any_request(budget):
    import httpx

    sent = []
    transport = httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(200, json={}))
    with Client("http://gateway.test", "k", dataset="usage", transport=transport) as c:
        for call in (c.query, c.explain):
            with pytest.raises(InvalidRequestError) as info:
                call("SELECT COUNT(*) AS n FROM events", **budget)
            assert info.value.code == "invalid_budget" and info.value.status is None
            assert f"budget.{next(iter(budget))} must be a finite number" in info.value.message
    assert sent == []  # nothing reached the gateway


def test_a_body_json_cannot_encode_is_a_client_error():
    import httpx

    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    with Client("http://gateway.test", "k", transport=transport) as c, pytest.raises(InvalidRequestError) as info:
        c._request("POST", "/v1/query", json={"x": float("nan")})
    assert isinstance(info.value, DpgateClientError) and info.value.code == "invalid_request"
