"""Model and hardware presets of the planner, read from ``presets.toml`` (each entry cites its source)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.compose import ModelConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["ModelSpec", "Hardware", "model_preset", "hardware_preset", "MODELS", "HARDWARE"]

_TABLE = tomllib.loads((Path(__file__).with_name("presets.toml")).read_text(encoding="utf-8"))
MODELS = tuple(_TABLE["model"])
HARDWARE = tuple(_TABLE["hardware"])


@dataclass(frozen=True)
class ModelSpec:
    """A preset: its architecture (``config``; None when only the parameter count is known), the
    parameter count it states (``params``, for those), its sequence length and its source."""

    name: str
    config: ModelConfig | None
    seq_len: int | None
    source: str
    params: float | None = None


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    memory_bytes: float
    nvlink_bytes_per_s: float
    network_bytes_per_s: float
    nvlink_alpha_s: float
    network_alpha_s: float
    gpus_per_node: int
    source: str


def model_preset(name: str) -> ModelSpec:
    if name not in _TABLE["model"]:
        raise LabError("plan_bad_preset", value=name, choices=", ".join(MODELS))
    e = dict(_TABLE["model"][name])
    source, seq, params = e.pop("source"), e.pop("seq_len", None), e.pop("params", None)
    return ModelSpec(name, ModelConfig(**e) if e else None, seq, source, params)


def hardware_preset(name: str) -> Hardware:
    if name not in _TABLE["hardware"]:
        raise LabError("plan_bad_preset", value=name, choices=", ".join(HARDWARE))
    return Hardware(name=name, **_TABLE["hardware"][name])
