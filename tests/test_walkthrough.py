"""The README's curl walkthrough, followed twice in a row, then ``dpgate demo``.

The requests are the README's own: its ``Walkthrough with curl`` block is run by
bash with ``curl`` replaced by a shell function that records its arguments, and
each recorded call is sent with httpx to a real server (real Gateway) holding the
keys ``dpgate serve --demo-keys`` creates. Every request must answer 2xx except
the one the README announces as ``→ 409``; after two passes no allocation may be
close to exhausted, and the second pass spends nothing (repeats are served from
the release store).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import httpx
import pytest
from _api_server import REPO, LiveServer, make_project

from dpgate.api import create_app
from dpgate.auth import KeyStore
from dpgate.cli import main
from dpgate.cli.serve import create_demo_keys
from dpgate.settings import Settings

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to read the README's shell block")

#: curl replaced by a function printing its arguments, NUL-separated, one call per record.
RECORDER = "curl() { for a in \"$@\"; do printf '%s\\0' \"$a\"; done; printf '\\036\\0'; }\n"


def walkthrough_block() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Walkthrough with curl", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def recorded_calls(block: str, keys: dict[str, str]) -> list[tuple[str, list[str]]]:
    """``[(comment, curl argv), …]`` in the README's order (comment: the last ``#`` line before it)."""
    script = "\n".join(line for line in block.splitlines() if not line.startswith("export "))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **keys}
    out = subprocess.run(["bash", "-c", RECORDER + script], env=env, capture_output=True, timeout=30, check=True)
    calls = [c.split("\0") for c in out.stdout.decode().split("\036\0") if c]
    calls = [[a for a in c if a] for c in calls]
    comments, last = [], ""
    for line in block.splitlines():
        if line.startswith("#"):
            last = line
        if line.startswith("curl "):
            comments.append(last)
    assert len(comments) == len(calls), (comments, calls)
    return list(zip(comments, calls))


def send(client: httpx.Client, argv: list[str]) -> httpx.Response:
    headers, data, url, method = {}, None, None, "GET"
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-H":
            name, _, value = argv[i + 1].partition(":")
            headers[name.strip()] = value.strip()
            i += 2
        elif a == "-d":
            data, method = argv[i + 1], "POST"
            i += 2
        elif a == "-X":
            method = argv[i + 1]
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            url = a
            i += 1
    path = re.sub(r"^(https?://)?localhost:8000", "", url)
    return client.request(method, path, headers=headers, content=data)


@pytest.fixture()
def walkthrough_server(tmp_path):
    project = make_project(tmp_path / "project")
    settings = Settings(policies=project / "policies", home=project / ".dpgate")
    created = create_demo_keys(KeyStore(settings.resolved_keys_file()), settings.policies)
    keys = {name.removeprefix("demo-").upper(): key for _role, name, _consumer, key in created}
    assert set(keys) == {"ANALYST", "DASHBOARD", "ADMIN", "REFRESH"}
    with LiveServer(create_app(settings)) as server:
        yield server, keys, settings


def test_the_walkthrough_twice_then_the_demo(walkthrough_server, capsys):
    server, keys, settings = walkthrough_server
    calls = recorded_calls(walkthrough_block(), keys)
    assert len(calls) >= 8
    spends = []
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for attempt in (1, 2):
            for comment, argv in calls:
                r = send(client, argv)
                expected = 409 if "→ 409" in comment else None
                if expected:
                    assert r.status_code == expected, (attempt, comment, r.text)
                    assert r.json()["error"]["code"] == "budget_exhausted"
                else:
                    assert 200 <= r.status_code < 300, (attempt, comment, r.status_code, r.text)
            report = client.get("/v1/datasets/usage/budget", headers={"Authorization": f"Bearer {keys['ADMIN']}"})
            spends.append(report.json())
    first, second = spends
    # the second pass was served from the release store: not one more charge
    assert second["charges"] == first["charges"]
    assert second["spent"]["rho"] == pytest.approx(first["spent"]["rho"], rel=1e-12)
    for name, c in second["consumers"].items():
        assert c["spent_rho"] <= 0.1 * c["cap_rho"], (name, c)  # nothing near exhaustion

    # and the demo runs afterwards, in its own state, twice
    home = str(settings.home)
    for _ in range(2):
        assert main(["demo", "--policies", str(settings.policies), "--home", home]) == 0
        out = capsys.readouterr().out
        assert "population product-users" in out
    assert (settings.home / "demo" / "ledger.sqlite").is_file()
