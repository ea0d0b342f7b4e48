"""A schema fuzz of the whole HTTP API (schemathesis against the app's own OpenAPI document).

For every operation of ``/openapi.json``, schemathesis generates requests from
the document — valid ones (positive) and ones that break it (negative) — and
sends them to the real application (real Gateway: DuckDB, SQLite ledger,
OpenDP) in-process over ASGI. Every answer must

* never be a 5xx, never carry a stack trace;
* be a status the document declares for the operation, with a JSON body that
  matches the declared schema — for errors the one shape
  ``{"error": {"code", "message", "details"}}``;
* refuse (4xx) a request that breaks the document.

Bounded in time: ``DPGATE_FUZZ_EXAMPLES`` examples per operation and mode
(default 25; derandomized, so a CI run is reproducible). The project has the
quickstart dataset ``usage`` and a dataset whose policy has no
``[allocations]`` (issue 9 item 11: its budget report was a 500).
"""

from __future__ import annotations

import os
import time

import pytest
from _api_server import make_project

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings as hypothesis_settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from dpgate.api import create_app  # noqa: E402
from dpgate.auth import KeyStore  # noqa: E402
from dpgate.service import Gateway  # noqa: E402
from dpgate.settings import Settings  # noqa: E402

EXAMPLES = int(os.environ.get("DPGATE_FUZZ_EXAMPLES", "25"))
#: Whole-fuzz time bound (seconds): the issue asks for < 2 minutes in CI.
TIME_BOUND_S = float(os.environ.get("DPGATE_FUZZ_TIME_BOUND_S", "120"))

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
stay = { type = "float", lower = 0, upper = 30, resolution = 1 }
"""

DATASETS = ["usage", "open"]
KNOWN_PATH_VALUES = {"name": DATASETS, "population": ["product-users", "open-people"]}

#: A request that breaks the document must be refused with one of these (413: a body over
#: ``max_body_bytes`` is refused before it is read, whatever else is wrong with it).
REJECTIONS = [400, 401, 403, 404, 405, 409, 413]
FUZZ_CONFIG = schemathesis.Config.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": REJECTIONS}}}
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def _project(root):
    make_project(root)
    (root / "open").mkdir()
    rows = ["person,ward,stay"] + [f"p{i},{'ab'[i % 2]},{i % 31}" for i in range(60)]
    (root / "open" / "visits.csv").write_text("\n".join(rows) + "\n")
    (root / "policies" / "open.toml").write_text(OPEN_POLICY)
    return root


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory):
    root = _project(tmp_path_factory.mktemp("fuzz"))
    settings = Settings(policies=root / "policies", home=root / "state")
    store = KeyStore(settings.resolved_keys_file())
    keys = {
        "analyst": store.add("fuzz-analyst", role="analyst", consumer="analysts")[0],
        "admin": store.add("fuzz-admin", role="admin")[0],
    }
    gateway = Gateway.open(settings)
    # a lived-in state: a release on each dataset (the open population now has a consumer)
    releases = [
        gateway.query("usage", "SELECT region, COUNT(*) AS n FROM prompts GROUP BY region", consumer="analysts"),
        gateway.query("open", "SELECT ward, SUM(stay) AS days FROM visits GROUP BY ward", consumer="analysts"),
    ]
    KNOWN_PATH_VALUES["release_id"] = [r["release_id"] for r in releases]
    app = create_app(settings, gateway=gateway, keys=store)
    try:
        yield app, keys
    finally:
        gateway.close()


def _key_for(path: str, keys: dict[str, str]) -> str:
    """The role that may call ``path``: admins govern (ledger, caps), analysts query and read."""
    return keys["admin"] if path.startswith(("/v1/admin", "/v1/ledger")) else keys["analyst"]


def _assert_no_trace(response) -> None:
    text = response.text
    assert "Traceback" not in text and 'File "' not in text, text[:500]
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"code", "message", "details"}, body
        assert isinstance(body["error"]["code"], str) and body["error"]["message"], body


def test_the_whole_api_survives_a_schema_fuzz(fuzz_target):
    app, keys = fuzz_target
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=FUZZ_CONFIG)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    started = time.monotonic()
    seen_statuses: dict[str, set[int]] = {}
    timings: dict[str, float] = {}

    passes = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            passes.append((operation, mode, {}))
        # and with the names that exist, so the fuzz reaches past "not found"
        for param, values in KNOWN_PATH_VALUES.items():
            if "{" + param + "}" in operation.path:
                for value in values:
                    passes.append((operation, GenerationMode.POSITIVE, {param: value}))

    for operation, mode, path_parameters in passes:
        headers = {"Authorization": f"Bearer {_key_for(operation.path, keys)}"}
        strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters or None)

        @hypothesis_settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def run(case) -> None:
            if mode is GenerationMode.POSITIVE and isinstance(case.body, dict) and "dataset" in case.body:
                # reach past "unknown dataset" too: half the bodies name a real dataset
                case.body["dataset"] = (DATASETS + [case.body["dataset"]] * 2)[len(repr(case.body)) % 4]
            response = case.call(headers=headers)
            seen_statuses.setdefault(operation.label, set()).add(response.status_code)
            _assert_no_trace(response)
            case.validate_response(response, checks=CHECKS, headers=headers)

        try:
            run()
        except Unsatisfiable:
            # nothing in the document can be broken (e.g. GET /healthz has no parameters)
            assert mode is GenerationMode.NEGATIVE, operation.label
        timings[f"{operation.label} {mode.value} {path_parameters or ''}"] = time.monotonic() - started - sum(timings.values())
    print("fuzz timings:", {k: round(v, 1) for k, v in timings.items()})
    elapsed = time.monotonic() - started
    assert elapsed < TIME_BOUND_S, f"the fuzz took {elapsed:.0f} s"
    # the fuzz reached past authentication: some answers were not 401/403
    assert any(s - {401, 403} for s in seen_statuses.values()), seen_statuses


def test_a_policy_without_allocations_has_a_budget_report(fuzz_target):
    """Issue 9 item 11: ``share`` is null for an open population; the report is a 200, not a 500."""
    from starlette.testclient import TestClient

    app, keys = fuzz_target
    client = TestClient(app)
    auth = {"Authorization": f"Bearer {keys['analyst']}"}
    before = client.get("/v1/datasets/open/budget", headers=auth)
    assert before.status_code == 200, before.text
    r = client.post("/v1/queries", headers=auth,
                    json={"dataset": "open", "sql": "SELECT ward, COUNT(*) AS n FROM visits GROUP BY ward"})
    assert r.status_code == 200, r.text
    r = client.get("/v1/datasets/open/budget", headers=auth)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["consumers"]["analysts"]["share"] is None
    spent_before = before.json()["consumers"]["analysts"]["spent_rho"]
    assert report["consumers"]["analysts"]["spent_rho"] == pytest.approx(spent_before + 0.001)  # default_query_rho
    assert report["consumers"]["analysts"]["cap_rho"] == pytest.approx(report["cap"]["rho"])
    assert client.get("/v1/datasets/open", headers=auth).json()["allocations"] == {}
