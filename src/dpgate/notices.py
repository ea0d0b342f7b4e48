"""Warnings said once per change, not on every command (e.g. a policy file that differs from the ledger).

A notice is identified by its kind and key (``"policy_drift"``, the population) and its text.
:func:`first_notice` is true the first time a text is seen for that kind and key in a state
folder (``DPGATE_HOME``) and records its SHA-256 digest in ``<home>/notices.json``; the same text
again is not new, a changed text (the drift changed) is. Losing the file only repeats a warning
once. The report itself (``policy_drift`` in the API, ``dpgate budget --json``) always carries
the current state: only the printed warning is deduplicated.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

_LOCK = threading.Lock()
FILE_NAME = "notices.json"


def first_notice(home: Path | str, kind: str, key: str, text: str) -> bool:
    """True if ``text`` is new for (``kind``, ``key``) in the state folder ``home`` (then recorded).

    Never raises for a missing or unreadable file (the notice is then said again); an empty text
    is never new (and clears the record, so that the same drift coming back is said again).
    """
    path = Path(home) / FILE_NAME
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest() if text else None
    with _LOCK:
        try:
            seen = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(seen, dict):
                seen = {}
        except (OSError, ValueError):
            seen = {}
        bucket = seen.setdefault(kind, {})
        if not isinstance(bucket, dict):
            bucket = seen[kind] = {}
        if bucket.get(key) == digest:
            return False
        if digest is None:
            bucket.pop(key, None)
        else:
            bucket[key] = digest
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".notices-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(seen, fh, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError:
            pass
        return digest is not None
