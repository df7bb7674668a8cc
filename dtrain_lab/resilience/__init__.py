"""Failure recovery: atomic checkpoints, exact resume, fault injection, heartbeats."""
from dtrain_lab.resilience.recovery import *  # noqa: F401,F403
