"""Plan a distributed training job on a laptop (``dtrain-lab plan``): memory per rank, communication
per dimension and step time for any model and layout, from a dry run on the meta device and fake
tensors under a fake process group, and the formulas of the course. See :mod:`dtrain_lab.planner.core`."""
from dtrain_lab.planner.core import DIMS, PRECISIONS, Plan, plan, stage_layers
from dtrain_lab.planner.presets import HARDWARE, MODELS, hardware_preset, model_preset
from dtrain_lab.planner.report import format_plan

__all__ = ["plan", "Plan", "stage_layers", "DIMS", "PRECISIONS", "MODELS", "HARDWARE", "model_preset",
           "hardware_preset", "format_plan"]
