"""JSON without non-finite floats: one spelling for the HTTP API, the CLI and the ledger's reports.

JSON has no literal for NaN or ±∞; Python's ``json`` would write ``NaN`` and
``Infinity``, which strict parsers refuse. :func:`json_safe` writes them as the
strings ``"nan"``, ``"inf"`` and ``"-inf"`` instead.
"""

from __future__ import annotations

import math
from typing import Any


def json_safe(value: Any) -> Any:
    """Replace non-finite floats by the strings ``"inf"``, ``"-inf"``, ``"nan"``, recursively.

    Dicts, lists and tuples are copied (tuples become lists); other values are
    returned as they are.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


__all__ = ["json_safe"]
