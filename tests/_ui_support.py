"""Test support for the web pages: a project with a hostile dataset, keys per role, sign-in.

Not a test module. The project holds the repository's ``usage`` policy with the
generated sample data, and ``hostile``: a small dataset whose public keys,
and the SQL and cap reasons the tests send, carry markup that would run if a
page failed to escape it (each payload sets ``window.__xss``).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from _api_server import make_project

from dpgate.auth import KeyStore

#: Markup that runs script if it is ever inserted unescaped (each sets window.__xss).
XSS_SCRIPT = "<script>window.__xss='script'</script>"
XSS_IMG = '<img src=x onerror="window.__xss=\'img\'">'
XSS_KEYS = [XSS_SCRIPT, XSS_IMG, 'plain & "quoted" \'keys\'']
#: A cap reason with markup.
XSS_REASON = "<script>window.__xss='reason'</script><b onmouseover=\"window.__xss='b'\">quarterly</b>"
#: SQL whose canonical form keeps markup in a string literal and in an output alias.
XSS_SQL = ("SELECT label, COUNT(*) AS \"<img src=x onerror=window.__xss='alias'>\" FROM events "
           "WHERE note <> '<script>window.__xss=''sql''</script>' GROUP BY label")

HOSTILE_POLICY = """\
[dataset]
name = "hostile"
population = "hostile-pop"
data_version = "v1"

[budget]
epsilon = 2.0
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 0.5
dashboard = 0.5

[tables.events]
source = "data/hostile.csv"
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 1

[tables.events.columns]
label = { type = "text", public_keys = KEYS }
note = { type = "text" }
amount = { type = "float", lower = 0, upper = 10, resolution = 1 }
"""


def _toml_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def make_ui_project(root: Path) -> Path:
    """The API tests' project (``usage`` + sample data) plus the ``hostile`` dataset."""
    make_project(root)
    (root / "data").mkdir(exist_ok=True)
    lines = ["user_id,label,note,amount"]
    for i in range(60):
        label = XSS_KEYS[i % 3].replace('"', '""')
        lines.append(f'{i},"{label}","n{i % 4}",{i % 11}')
    (root / "data" / "hostile.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    keys = "[" + ", ".join(_toml_string(k) for k in XSS_KEYS) + "]"
    (root / "policies" / "hostile.toml").write_text(HOSTILE_POLICY.replace("KEYS", keys), encoding="utf-8")
    return root


def make_keys(keys_file: Path) -> dict[str, str]:
    """One key per role (the analyst pays from ``analysts``, the refresh job from ``dashboard``)."""
    store = KeyStore(keys_file)
    return {
        "admin": store.add("root", role="admin")[0],
        "analyst": store.add("alice", role="analyst", consumer="analysts")[0],
        "refresh": store.add("refresh-job", role="analyst", consumer="dashboard")[0],
        "dashboard": store.add("wall", role="dashboard")[0],
        "service": store.add("trainer", role="service", consumer="analysts")[0],
    }


def csrf_token(html: str) -> str:
    """The CSRF token of the first form on a page."""
    m = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert m, "no CSRF token on the page"
    return m.group(1)


def sign_in(base_url: str, key: str, **client_options) -> httpx.Client:
    """An httpx client (a cookie jar: a browser without JavaScript) signed in with ``key``."""
    client = httpx.Client(base_url=base_url, timeout=120.0, **client_options)
    form = client.get("/ui/login")
    assert form.status_code == 200, form.text
    r = client.post("/ui/login", data={"csrf_token": csrf_token(form.text), "api_key": key, "next": ""})
    assert r.status_code == 303, r.text
    return client

