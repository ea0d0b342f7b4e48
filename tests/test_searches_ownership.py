"""A search belongs to its consumer (issue 19, item 9): every endpoint and every path that takes
a ``search_id``, over real HTTP, with two consumers and an admin.

Consumer ``training`` (a service key and an analyst key) owns search A; consumer ``analysts``
(an analyst key and a service key) owns search B. Another consumer's search is answered exactly
like a missing one (404 ``not_found``, same message, same details); a refused step charges
nothing and leaves the record as it was. Admin keys read, list, attach to (paid by the search's
own consumer) and close every search.
"""

from __future__ import annotations

import pytest
from _api_server import LiveServer, assert_error

from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.settings import Settings
from tests._eval_project import write_eval_project

BEST = "SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC LIMIT 1"
POP = "eval-users"
SPEC = {"purpose": "pick a fine-tune", "candidates": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
        "training": {"name": "ft", "population": POP}, "validation": {"name": "evals/eval", "population": POP},
        "selection": "private"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("owners")
    settings = Settings(policies=write_eval_project(tmp, epsilon=8.0), home=tmp / "state")
    store = KeyStore(settings.resolved_keys_file())
    keys = {
        "svc_a": store.add("trainer-a", role="service", consumer="training")[0],
        "ana_a": store.add("analyst-a", role="analyst", consumer="training")[0],
        "ana_b": store.add("analyst-b", role="analyst", consumer="analysts")[0],
        "svc_b": store.add("trainer-b", role="service", consumer="analysts")[0],
        "admin": store.add("root", role="admin")[0],
    }
    with LiveServer(create_app(settings)) as live:
        clients = {name: live.client(key) for name, key in keys.items()}
        r = clients["svc_a"].post("/v1/searches", json=SPEC)
        assert r.status_code == 201, r.text
        a = r.json()["search_id"]
        r = clients["ana_b"].post("/v1/searches", json=SPEC)
        assert r.status_code == 201, r.text
        b = r.json()["search_id"]
        yield live, clients, a, b
        for c in clients.values():
            c.close()


def _ledger(clients) -> list[dict]:
    r = clients["admin"].get("/v1/admin/ledger")
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def _steps(clients, sid) -> list[dict]:
    r = clients["admin"].get(f"/v1/searches/{sid}")
    assert r.status_code == 200, r.text
    return r.json()["steps"]


def _same_as_missing(response, sid: str, missing) -> None:
    """A search of another consumer answers exactly what a missing search answers."""
    details = assert_error(response, 404, "not_found")
    other = missing.json()["error"]
    assert missing.status_code == 404
    assert response.json()["error"]["message"] == other["message"]
    assert details == {"search_id": sid} and set(other["details"]) == {"search_id"}


def test_another_consumers_search_is_not_found_on_every_endpoint(world):
    live, clients, a, b = world
    entries, steps_a = _ledger(clients), _steps(clients, a)
    charge = {"population": POP, "kind": "zcdp", "rho": 0.01, "purpose": "a run", "candidate": "a"}
    close = {"selected": "a", "artifacts": ["s3://forged"]}
    for who in ("ana_b", "svc_b"):
        c = clients[who]
        missing = c.get("/v1/searches/srch_000000000000000000000000")
        assert missing.status_code == 404
        # read
        _same_as_missing(c.get(f"/v1/searches/{a}"), a, missing)
        # close with forged selected / artifacts
        _same_as_missing(c.post(f"/v1/searches/{a}/close", json=close), a,
                         c.post("/v1/searches/srch_000000000000000000000000/close", json=close))
        # attach an external charge (service keys may charge)
        if who == "svc_b":
            _same_as_missing(c.post("/v1/ledger/charges", json={**charge, "search_id": a}), a,
                             c.post("/v1/ledger/charges", json={**charge, "search_id": "srch_000000000000000000000000"}))
        # attach a selection query (analyst keys may query)
        if who == "ana_b":
            body = {"dataset": "evals", "sql": BEST, "budget": {"epsilon": 1.0}}
            _same_as_missing(c.post("/v1/queries", json={**body, "search_id": a}), a,
                             c.post("/v1/queries", json={**body, "search_id": "srch_000000000000000000000000"}))
    # refused: nothing charged, nothing recorded, the search still open
    assert _ledger(clients) == entries
    assert _steps(clients, a) == steps_a
    assert clients["admin"].get(f"/v1/searches/{a}").json()["status"] == "open"
    r = clients["admin"].get("/v1/datasets/evals/budget")
    assert r.json()["spent"]["rho"] == 0


def test_the_owner_sees_and_extends_its_own_search(world):
    live, clients, a, b = world
    for who in ("svc_a", "ana_a"):
        r = clients[who].get(f"/v1/searches/{a}")
        assert r.status_code == 200, r.text
        assert r.json()["consumer"] == "training"
        assert_error(clients[who].get(f"/v1/searches/{b}"), 404, "not_found")
    r = clients["ana_b"].get(f"/v1/searches/{b}")
    assert r.status_code == 200 and r.json()["consumer"] == "analysts"


def test_lists_show_only_the_keys_own_searches_and_admins_see_all(world):
    live, clients, a, b = world

    def ids(client, **params):
        r = client.get("/v1/searches", params=params)
        assert r.status_code == 200, r.text
        return {s["search_id"] for s in r.json()["searches"]}

    assert a in ids(clients["svc_a"]) and b not in ids(clients["svc_a"])
    assert a in ids(clients["ana_a"]) and b not in ids(clients["ana_a"])
    assert b in ids(clients["ana_b"]) and a not in ids(clients["ana_b"])
    assert b in ids(clients["svc_b"]) and a not in ids(clients["svc_b"])
    assert {a, b} <= ids(clients["admin"])
    assert a in ids(clients["admin"], consumer="training") and b not in ids(clients["admin"], consumer="training")
    assert b in ids(clients["ana_b"], consumer="analysts")
    assert_error(clients["ana_b"].get("/v1/searches", params={"consumer": "training"}), 403, "forbidden")
    assert a in ids(clients["svc_a"], population=POP) and b not in ids(clients["svc_a"], population=POP)


def test_an_admin_attaches_only_the_searchs_own_consumers_charges(world):
    live, clients, a, b = world
    admin = clients["admin"]
    entries = _ledger(clients)
    charge = {"population": POP, "kind": "zcdp", "rho": 0.01, "purpose": "admin run", "candidate": "b",
              "search_id": a}
    # the admin sees search A, but analysts may not pay for training's search: refused, nothing charged
    details = assert_error(admin.post("/v1/ledger/charges", json={**charge, "consumer": "analysts"}),
                           400, "invalid_request")
    assert details["search_consumer"] == "training"
    assert _ledger(clients) == entries
    r = admin.post("/v1/ledger/charges", json={**charge, "consumer": "training"})
    assert r.status_code == 201, r.text
    assert r.json()["consumer"] == "training" and r.json()["search_id"] == a
    assert len(_ledger(clients)) == len(entries) + 1


def test_selection_charges_go_to_the_searchs_consumer_and_admins_close_any_search(world):
    live, clients, a, b = world
    r = clients["ana_a"].post("/v1/queries", json={"dataset": "evals", "sql": BEST, "budget": {"epsilon": 1.0},
                                                    "search_id": a})
    assert r.status_code == 200, r.text
    rel = r.json()
    assert rel["charge"]["consumer"] == "training"
    steps = _steps(clients, a)
    assert steps[-1]["kind"] == "selection" and steps[-1]["release_id"] == rel["release_id"]
    # the admin closes another consumer's search; the closing step names the admin key
    close = {"selected": rel["rows"][0][0], "artifacts": ["s3://m"], "selection_release": rel["release_id"]}
    r = clients["admin"].post(f"/v1/searches/{a}/close", json=close)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "closed" and r.json()["result"]["actor"] == "root"
    # a closed search of another consumer still answers 404, not 409: its state is not confirmed either
    entries = _ledger(clients)
    assert_error(clients["svc_b"].post("/v1/ledger/charges", json={"population": POP, "kind": "zcdp", "rho": 0.01,
                                                                   "purpose": "x", "search_id": a}), 404, "not_found")
    assert_error(clients["ana_b"].post(f"/v1/searches/{a}/close", json=close), 404, "not_found")
    assert_error(clients["svc_a"].post(f"/v1/searches/{a}/close", json=close), 409, "conflict")  # the owner is told
    assert _ledger(clients) == entries
