"""Functions whose value is not a function of the data read (random numbers, the clock, sequences).

The planner refuses them in SELECT items and keys (:func:`dpgate.sql.outputs.nondeterministic`),
post-processing refuses them in expressions over released values
(:func:`dpgate.postprocess.check_postprocess_expression`): a release must be a function of the
query, the data and the noise. Below both (the planner imports no post-processing).
"""

from __future__ import annotations

__all__ = ["NONDETERMINISTIC_FUNCTIONS"]

#: Functions refused in post-processing because their value is not a function of the release.
NONDETERMINISTIC_FUNCTIONS = frozenset(
    "RANDOM RAND RANDN RANDOMBYTES SETSEED UUID GEN_RANDOM_UUID NEWID NOW GETDATE SYSDATE "
    "SYSDATETIME TODAY CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP LOCALTIME LOCALTIMESTAMP "
    "CLOCK_TIMESTAMP STATEMENT_TIMESTAMP TRANSACTION_TIMESTAMP GET_CURRENT_TIME UNIX_TIMESTAMP "
    "CURRENT_DATETIME UTC_TIMESTAMP UTC_DATE NEXTVAL CURRVAL TXID_CURRENT".split()
)
