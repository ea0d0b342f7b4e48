"""Transition alias: the engines now live in :mod:`dpgate.engines`.

``dpgate.engine.Engine`` is :class:`dpgate.engines.EngineSet` (same constructor,
``load(policies)``, ``check``, ``execute``, ``close``); new code imports from
:mod:`dpgate.engines`.
"""

from dpgate.engines.base import source_files, source_fingerprint
from dpgate.engines.registry import EngineSet as Engine

__all__ = ["Engine", "source_files", "source_fingerprint"]
