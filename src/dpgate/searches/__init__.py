"""Search records (issue 15): tuning and selection searches with every charged step.

* :mod:`dpgate.searches.record` — :class:`Searches`: declare, record charges and selections,
  close, read and replay a search;
* :mod:`dpgate.searches.store` — the append-only tables next to the ledger (SQLite, PostgreSQL).
"""

from __future__ import annotations

from dpgate.searches.record import SCORE_WORDS, STEP_KINDS, Searches, new_search_id, population_state
from dpgate.searches.store import PostgresSearchStore, SearchStore, SqliteSearchStore, open_search_store

__all__ = ["SCORE_WORDS", "STEP_KINDS", "Searches", "new_search_id", "population_state", "PostgresSearchStore",
           "SearchStore", "SqliteSearchStore", "open_search_store"]
