"""DeepSpeed on the course's runtime: configs, engines, ZeRO stages 0-3, model-state bytes (lesson 06).

DeepSpeed wraps a model in an *engine* built from a JSON-like config. The engine owns the
optimizer, the gradient averaging and, with ``zero_optimization.stage`` 1-3, the partitioning of
the optimizer state (1), the gradients (2) and the parameters (3) over the data-parallel ranks
(ZeRO: Rajbhandari et al., SC 2020). These modules keep DeepSpeed's own API and add what a course
on 2 CPU processes needs; everything is importable from here:

* :mod:`dtrain_lab.parallel.ds_config` — :func:`make_config`, a valid config from a few keyword
  arguments, checked up front with bilingual errors (``train_batch_size = micro × accumulation ×
  world size``, unknown stage, fp16 on a machine that cannot run it, an optimizer that needs a
  compiled op or a GPU …); :func:`deepspeed_view`, what DeepSpeed's own parser reads from it.
* :mod:`dtrain_lab.parallel.ds_engine` — :func:`initialize`, ``deepspeed.initialize`` on the process
  group the launcher already opened (gloo on CPU, nccl on GPUs): DeepSpeed's ``init_distributed``
  sees an initialised ``torch.distributed`` and reuses it (``deepspeed/comm/comm.py``);
  :func:`per_rank_state_bytes`, the bytes of model states this rank holds, counted from the engine's
  tensors, to put next to :func:`dtrain_lab.perfmodel.zero_memory`; :func:`full_params`.
* :mod:`dtrain_lab.parallel.ds_env` — importing DeepSpeed the course's way, the cache of its compiled
  ops (:func:`extensions_dir`, :func:`warm`), and :func:`probe_features`: what DeepSpeed can run on
  this machine and what needs a GPU or a compiled op, detected (no traceback wall).

The runs of the lesson — the same model, seed and data under DeepSpeed and under PyTorch's DDP, and
a checkpoint round trip — are experiments: :mod:`dtrain_lab.demos.ds_train` (launched by
:mod:`dtrain_lab.demos.ds_zero`).

Command line::

    python -m dtrain_lab.parallel.deepspeed_lab --warm      # compile/cache the op
    python -m dtrain_lab.parallel.deepspeed_lab --probe     # what this machine can run
"""
from __future__ import annotations

import sys

from dtrain_lab.i18n import tr
from dtrain_lab.parallel.ds_config import (OFFLOADS, OPTIMIZERS, PRECISIONS, STAGES, config_summary, deepspeed_view,
                                           make_config)
from dtrain_lab.parallel.ds_engine import (count_tensor_bytes, default_device, full_params, initialize,
                                           per_rank_state_bytes)
from dtrain_lab.parallel.ds_env import (cuda_available, extensions_dir, fp16_supported, has_compiler,
                                        import_deepspeed, probe_features, warm)

__all__ = ["make_config", "config_summary", "deepspeed_view", "initialize", "default_device",
           "per_rank_state_bytes", "count_tensor_bytes", "full_params", "probe_features", "extensions_dir",
           "warm", "fp16_supported", "cuda_available", "has_compiler", "import_deepspeed", "STAGES",
           "PRECISIONS", "OPTIMIZERS", "OFFLOADS"]


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m dtrain_lab.parallel.deepspeed_lab",
                                 description=tr("ds_cli_description"))
    ap.add_argument("--warm", action="store_true", help=tr("ds_cli_warm"))
    ap.add_argument("--probe", action="store_true", help=tr("ds_cli_probe"))
    args = ap.parse_args(argv)
    if args.warm:
        warm()
    if args.probe:
        for row in probe_features():
            print(f"{'✓' if row['ok'] else '✗'} {row['feature']:<12} {row['detail']}")
    if not (args.warm or args.probe):
        ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
