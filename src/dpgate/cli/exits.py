"""The one mapping from an error to the exit status of a ``dpgate`` command.

Every command exits 0 on success. A failure exits with the status of its error
*kind*, the same for every command, so scripts can tell "fix the request" from
"no budget left" from "the server side is broken". The kinds follow the HTTP
status of the error code (the same code answers the same status over HTTP),
with configuration problems set apart:

======  ===================================================================  ==============================
status  meaning                                                              error codes (HTTP status)
======  ===================================================================  ==============================
0       success
1       a check found problems (``dpgate ledger verify``, ``datasets check``)
2       the command line or the request is wrong (argparse usage errors too) 400, 413
3       not allowed                                                          401, 403
4       something named does not exist                                       404
5       refused: budget exhausted, a renewal, or a conflicting request       409
6       timed out                                                            408, 504
7       configuration: a policy, the keys file, the ledger, the bind address ``invalid_policy``, ``ledger_error``,
                                                                             ``ledger_unavailable``
8       failed while running (the charge, if any, stays)                     other 5xx
130     interrupted (Ctrl-C)
141     the output pipe was closed (e.g. ``| head``)
======  ===================================================================  ==============================
"""

from __future__ import annotations

from dpgate.errors import DpgateError

OK = 0
CHECK_FAILED = 1
USAGE = 2
NOT_ALLOWED = 3
NOT_FOUND = 4
REFUSED = 5
TIMEOUT = 6
CONFIGURATION = 7
FAILED = 8
INTERRUPTED = 130
BROKEN_PIPE = 141

#: Error codes whose status is not their HTTP class: configuration problems.
CONFIGURATION_CODES = frozenset({"invalid_policy", "ledger_error", "ledger_unavailable"})

#: (status, meaning) in the order documented (README "Exit status").
MEANINGS: tuple[tuple[int, str], ...] = (
    (OK, "success"),
    (CHECK_FAILED, "a check found problems (`dpgate ledger verify`; `dpgate datasets check`: a draft policy's TODOs)"),
    (USAGE, "the command line or the request is wrong: `invalid_request`, `invalid_sql`, `unsupported_query`, "
            "`unknown_table`, `unknown_column`, `invalid_budget`, `payload_too_large`, usage errors"),
    (NOT_ALLOWED, "not allowed: `unauthenticated`, `forbidden`"),
    (NOT_FOUND, "something named does not exist: `unknown_dataset`, `unknown_population`, "
                "`unknown_consumer`, `not_found`"),
    (REFUSED, "refused: `budget_exhausted`, `renewal_refused`, `conflict`"),
    (TIMEOUT, "timed out: `query_timeout`, `request_timeout`"),
    (CONFIGURATION, "configuration: `invalid_policy` (policies, keys file), `ledger_error`, "
                    "`ledger_unavailable` (locked or unreachable: try again), the bind address is taken"),
    (FAILED, "failed while running: `execution_error`, `mechanism_error`, `internal` (a charge, if any, stays), "
             "`server_busy`"),
    (INTERRUPTED, "interrupted (Ctrl-C)"),
    (BROKEN_PIPE, "the output pipe was closed (e.g. piped into `head`)"),
)


def exit_status(error: DpgateError) -> int:
    """The exit status of a command that failed with ``error`` (see the table above)."""
    if error.code in CONFIGURATION_CODES:
        return CONFIGURATION
    status = error.http_status
    if status in (400, 413, 422):
        return USAGE
    if status in (401, 403):
        return NOT_ALLOWED
    if status == 404:
        return NOT_FOUND
    if status == 409:
        return REFUSED
    if status in (408, 504):
        return TIMEOUT
    if 400 <= status < 500:
        return USAGE
    return FAILED


def status_table() -> str:
    """The README's exit-status table (Markdown), generated from :data:`MEANINGS`."""
    rows = ["| exit status | meaning |", "|---|---|"]
    rows += [f"| {status} | {meaning} |" for status, meaning in MEANINGS]
    return "\n".join(rows) + "\n"


__all__ = ["exit_status", "status_table", "MEANINGS"]
