"""API keys file and principals (dpgate.auth) and the ``dpgate keys`` command."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest

from dpgate.auth import ROLE_PERMISSIONS, KeyStore, Permission, Principal, Role, hash_key
from dpgate.cli import main
from dpgate.errors import Conflict, Forbidden, InvalidRequest, NotFound, PolicyError, Unauthenticated


@pytest.fixture()
def store(tmp_path):
    return KeyStore(tmp_path / "home" / "keys.json")


def test_add_stores_only_a_sha256_digest_with_mode_0600(store):
    key, record = store.add("alice", role="analyst", consumer="analysts")
    assert key.startswith(f"dpg_{record.key_id}_")
    text = store.path.read_text()
    assert key not in text
    secret = key.rsplit("_", 1)[1]
    assert secret not in text
    stored = json.loads(text)["keys"][0]
    assert stored["sha256"] == hashlib.sha256(key.encode()).hexdigest() == hash_key(key)
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert {k: stored[k] for k in ("name", "role", "consumer")} == {
        "name": "alice",
        "role": "analyst",
        "consumer": "analysts",
    }


def test_authenticate_maps_key_to_principal(store):
    key, record = store.add("alice", role="analyst", consumer="analysts")
    principal = store.authenticate(key)
    assert principal == Principal(name="alice", role=Role.ANALYST, consumer="analysts", key_id=record.key_id)
    # another KeyStore on the same file (e.g. the server process) sees the key too
    assert KeyStore(store.path).authenticate(key) == principal


@pytest.mark.parametrize("presented", [None, "", "nonsense", "dpg_0123456789ab_" + "x" * 43])
def test_authenticate_refuses_missing_malformed_and_unknown_keys(store, presented):
    store.add("alice", role="analyst", consumer="analysts")
    with pytest.raises(Unauthenticated):
        store.authenticate(presented)


def test_a_key_with_one_changed_character_is_refused(store):
    key, _ = store.add("alice", role="analyst", consumer="analysts")
    last = key[-1]
    forged = key[:-1] + ("A" if last != "A" else "B")
    with pytest.raises(Unauthenticated):
        store.authenticate(forged)
    # same key id, different secret: the digest comparison decides
    assert forged.split("_")[1] == key.split("_")[1]


def test_revoke_takes_effect_for_a_store_already_loaded(store):
    key, _ = store.add("alice", role="analyst", consumer="analysts")
    server_side = KeyStore(store.path)
    server_side.authenticate(key)
    revoked = KeyStore(store.path).revoke("alice")
    assert revoked.revoked_at is not None
    with pytest.raises(Unauthenticated):
        server_side.authenticate(key)
    # the revoked record stays for audit, without its secret
    assert [r.name for r in store.records(include_revoked=True)] == ["alice"]
    assert store.records() == []
    with pytest.raises(NotFound):
        store.revoke("alice")
    # the name can be reused after revocation, with a different key
    key2, _ = store.add("alice", role="dashboard")
    assert key2 != key
    assert store.authenticate(key2).role is Role.DASHBOARD


def test_add_validates_name_role_and_consumer(store):
    with pytest.raises(InvalidRequest):
        store.add("bad name", role="analyst", consumer="analysts")
    with pytest.raises(InvalidRequest):
        store.add("bob", role="superuser")
    with pytest.raises(InvalidRequest, match="consumer"):
        store.add("bob", role="analyst")
    with pytest.raises(InvalidRequest, match="consumer"):
        store.add("svc", role="service")
    store.add("bob", role="admin")
    with pytest.raises(Conflict):
        store.add("bob", role="admin")
    assert list(store.path.parent.glob(".keys-*")) == []  # no temporary file left behind


def test_corrupt_keys_file_is_a_clear_error(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text("{not json")
    with pytest.raises(PolicyError, match="keys file"):
        KeyStore(path).authenticate("dpg_0123456789ab_" + "x" * 43)
    path.write_text(json.dumps({"keys": [{"name": "x", "role": "root", "key_id": "a", "sha256": "b"}]}))
    with pytest.raises(PolicyError, match="unknown role"):
        KeyStore(path).records()


def test_role_table():
    """The design's HTTP table, row by row."""
    assert ROLE_PERMISSIONS[Role.DASHBOARD] == {Permission.READ_RELEASES, Permission.READ_DATASETS,
                                                Permission.CURATE_DASHBOARDS}  # pins (issue 24): no spending
    assert Permission.QUERY in ROLE_PERMISSIONS[Role.ANALYST]
    assert Permission.QUERY not in ROLE_PERMISSIONS[Role.ADMIN]
    assert Permission.SET_CAP not in ROLE_PERMISSIONS[Role.ANALYST]
    assert Permission.READ_LEDGER not in ROLE_PERMISSIONS[Role.ANALYST]
    for role in (Role.ADMIN, Role.SERVICE):
        assert Permission.CHARGE_EXTERNAL in ROLE_PERMISSIONS[role]
    for role in Role:
        assert Permission.READ_DATASETS in ROLE_PERMISSIONS[role]  # "all"
    dashboard = Principal("d", Role.DASHBOARD, None, "k")
    with pytest.raises(Forbidden):
        dashboard.require(Permission.QUERY)
    dashboard.require(Permission.READ_RELEASES)


def test_keys_cli_add_list_revoke(tmp_path, capsys):
    home = str(tmp_path / "state")
    assert main(["keys", "add", "carol", "--role", "analyst", "--consumer", "analysts", "--home", home, "--json",
                 "--no-consumer-check"]) == 0
    created = json.loads(capsys.readouterr().out)
    key = created["key"]
    store = KeyStore(tmp_path / "state" / "keys.json")
    assert store.authenticate(key).consumer == "analysts"

    assert main(["keys", "list", "--home", home]) == 0
    listing = capsys.readouterr().out
    assert "carol" in listing and "analyst" in listing and key not in listing

    assert main(["keys", "revoke", "carol", "--home", home]) == 0
    capsys.readouterr()
    with pytest.raises(Unauthenticated):
        store.authenticate(key)

    # an unknown key name: one sentence on stderr (the documented error shape with --json), exit 4
    assert main(["keys", "revoke", "nobody", "--home", home]) == 4
    assert capsys.readouterr().err == "dpgate: error: no active API key named 'nobody' [not_found]\n"
    assert main(["keys", "revoke", "nobody", "--home", home, "--json"]) == 4
    err = json.loads(capsys.readouterr().err)
    assert err["error"]["code"] == "not_found"

    # human-readable add prints the key exactly once
    assert main(["keys", "add", "dash", "--role", "dashboard", "--home", home]) == 0
    out = capsys.readouterr().out
    assert out.count("dpg_") == 1


@pytest.mark.parametrize("role", ["service", "analyst"])
def test_a_hand_edited_spending_key_without_a_consumer_is_refused_at_load(store, role):
    """Issue 9 item 14: such a key could otherwise charge whatever consumer a request names."""
    key, _ = store.add("trainer", role=role, consumer="analysts")
    raw = json.loads(store.path.read_text())
    raw["keys"][0].pop("consumer")  # the hand edit
    store.path.write_text(json.dumps(raw))
    fresh = KeyStore(store.path)
    with pytest.raises(PolicyError, match=f"'trainer'.* {role} key without a consumer") as refused:
        fresh.authenticate(key)
    assert "--consumer C" in refused.value.message
    raw["keys"][0]["consumer"] = None
    store.path.write_text(json.dumps(raw))
    with pytest.raises(PolicyError, match="without a consumer"):
        KeyStore(store.path).records()
    raw["keys"][0]["consumer"] = "bad name!"
    store.path.write_text(json.dumps(raw))
    with pytest.raises(PolicyError, match="invalid consumer name"):
        KeyStore(store.path).records()


def test_dashboard_and_admin_keys_need_no_consumer(store):
    store.add("wall", role="dashboard")
    key, _ = store.add("root", role="admin")
    assert KeyStore(store.path).authenticate(key).consumer is None


def test_a_revoked_key_is_told_so(store):
    key, _ = store.add("old-laptop", role="analyst", consumer="analysts")
    store.revoke("old-laptop")
    with pytest.raises(Unauthenticated, match="'old-laptop' was revoked at .*ask an admin for a new key"):
        store.authenticate(key)
    with pytest.raises(Unauthenticated, match="no key with this id and secret"):
        store.authenticate(key[:-2] + ("AA" if not key.endswith("AA") else "BB"))
