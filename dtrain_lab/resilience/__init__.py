"""Failure recovery: atomic checkpoints, exact resume, fault injection, heartbeats.

``from dtrain_lab.resilience import recovery`` (the lessons' spelling) or the names directly
(``from dtrain_lab.resilience import save, latest, capture, restore``); see :mod:`.recovery`.
"""
from dtrain_lab.resilience import recovery
from dtrain_lab.resilience.recovery import *  # noqa: F401,F403
from dtrain_lab.resilience.recovery import __all__ as _names

__all__ = ["recovery", *_names]
