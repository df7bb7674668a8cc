"""Lesson 06: DeepSpeed ZeRO stages 0-3 against PyTorch DDP, state bytes, checkpoints, in one job.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.ds_zero [key=value ...]

Keys (defaults): ``stages=0,1,2,3`` ``steps=8`` ``seed=0`` ``lr=0.01`` ``micro=8`` ``accum=1``
``d_hidden=32`` ``optimizer=adam`` ``precision=fp32`` ``ckpt=2,3`` (stages whose checkpoint round trip
runs; ``ckpt=`` for none) ``probe=1`` ``bf16=0,1,2,3`` (stages also run in bf16 for ``bf16_steps=3`` steps)
``clip_control=0.05`` (a ZeRO-0 run with ``gradient_clipping`` at this value; 0 = none) ``facts=1``
``fsdp=1``.

One process trains the same :func:`dtrain_lab.demos.ds_train.make_model` from the same seed on the same
global batches, first under ``torch.nn.parallel.DistributedDataParallel`` (the reference), then under
one DeepSpeed engine per ZeRO stage (engines can be created one after the other in one process:
DeepSpeed keeps the process group it wrapped the first time). Every rank reports:

* ``ddp`` — the reference's per-step ``loss``;
* ``runs`` — per stage: ``loss``, ``loss_vs_ddp`` and ``params_vs_ddp`` (``equal`` bit for bit and
  ``max_abs_diff``), ``state_bytes`` (:func:`~dtrain_lab.parallel.deepspeed_lab.per_rank_state_bytes`: gradients
  after the first backward, the rest after the first step), ``config`` (the config's key settings),
  ``engine_config`` (what the engine runs), ``step_seconds``, ``seconds``;
* ``clip_control`` — ``params_vs_ddp``/``loss_vs_ddp`` of the clipped run (it must differ);
* ``mixed`` — per stage, the bf16 runs: ``loss``, ``loss_vs_ddp`` (close, not equal), ``state_bytes``;
* ``ckpt`` — per stage: :func:`~dtrain_lab.demos.ds_train.checkpoint_roundtrip` (files this rank
  saved, resumed loss against the uninterrupted one);
* ``facts`` — things the seed material gets wrong, run: ``"type": "Adam"`` builds AdamW; a client
  optimizer passed to ``initialize`` trains like DDP; ZeRO-Offload with a PyTorch optimizer, allowed
  and refused; fp16 on this machine; the pipeline engine with ZeRO-2 (the bilingual error key each raised);
* ``fsdp`` — the same model under FSDP2 (:func:`dtrain_lab.parallel.fsdp.shard_model`): ``loss``, ``params_vs_ddp``
  (rank 0), ``state_bytes`` (:func:`dtrain_lab.parallel.fsdp.sharded_state_bytes`), ``files`` of its DCP
  checkpoint, ``step_seconds``; ``fsdp_error`` instead if that module is missing or fails;
* ``features`` — :func:`~dtrain_lab.parallel.deepspeed_lab.probe_features` (rank 0);
* ``numel``, ``rank``, ``world_size``, ``backend``, ``accelerator``.
"""
import sys
import time

import torch

from dtrain_lab import caps
from dtrain_lab.demos import ds_train
from dtrain_lab.i18n import LabError
from dtrain_lab.jobs import runtime
from dtrain_lab.parallel import deepspeed_lab as dsl


def parse(argv: list[str]) -> dict:
    opts = {"stages": "0,1,2,3", "steps": 8, "seed": 0, "lr": 0.01, "micro": 8, "accum": 1, "d_hidden": 32,
            "optimizer": "adam", "precision": "fp32", "ckpt": "2,3", "probe": 1, "bf16": "0,1,2,3",
            "bf16_steps": 3, "clip_control": 0.05, "facts": 1, "fsdp": 1}
    for item in argv:
        key, _, value = item.partition("=")
        if key not in opts:
            raise SystemExit(f"unknown option {key!r}; known: {', '.join(opts)}")
        opts[key] = runtime.parse_value(value) if key not in ("stages", "ckpt", "bf16") else value
    for key in ("stages", "ckpt", "bf16"):
        opts[key] = [int(s) for s in str(opts[key]).split(",") if s != ""]
    return opts


def _error_key(fn):
    try:
        fn()
        return None
    except LabError as exc:
        return exc.key


def facts(o: dict, ref: dict, common: dict) -> dict:
    """Claims about DeepSpeed checked by running it (see the module docstring)."""
    out = {}
    # 1. "type": "Adam" without "adam_w_mode": DeepSpeed builds AdamW (ADAM_W_MODE_DEFAULT = True)
    config = dsl.make_config(stage=0, micro_batch=o["micro"], lr=o["lr"])
    del config["optimizer"]["params"]["adam_w_mode"]
    engine = dsl.initialize(ds_train.make_model(o["seed"], o["d_hidden"]), config)
    out["adam_type_builds"] = type(engine.basic_optimizer).__name__
    # 2. a client optimizer (the seed material says it cannot be passed): ZeRO-2, same steps as DDP
    model = ds_train.make_model(o["seed"], o["d_hidden"])
    config = dsl.make_config(stage=2, micro_batch=o["micro"], optimizer=None)
    engine = dsl.initialize(model, config, client_optimizer=torch.optim.Adam(model.parameters(), lr=o["lr"]))
    losses = [ds_train.train_step(engine, s, o["micro"], 1, o["seed"])[0] for s in range(o["steps"])]
    out["client_optimizer"] = {"params_vs_ddp": ds_train.compare(dsl.full_params(engine), ref["params"]),
                               "loss_vs_ddp": ds_train.compare(losses, ref["loss"]),
                               "optimizer": type(engine.basic_optimizer).__name__}
    # 3. ZeRO-Offload to the CPU with PyTorch's Adam from the config: allowed (make_config writes
    #    zero_force_ds_cpu_optimizer: false); with a client optimizer and the default (true): refused
    config = dsl.make_config(stage=2, micro_batch=o["micro"], lr=o["lr"], offload="cpu")
    engine = dsl.initialize(ds_train.make_model(o["seed"], o["d_hidden"]), config)
    losses = [ds_train.train_step(engine, s, o["micro"], 1, o["seed"])[0] for s in range(o["steps"])]
    out["offload"] = {"params_vs_ddp": ds_train.compare(dsl.full_params(engine), ref["params"]),
                      "loss_vs_ddp": ds_train.compare(losses, ref["loss"]),
                      "cpu_offload": bool(engine.zero_cpu_offload())}
    config = dsl.make_config(stage=2, micro_batch=o["micro"], optimizer=None, offload="cpu")
    config["zero_force_ds_cpu_optimizer"] = True          # DeepSpeed's default
    model = ds_train.make_model(o["seed"], o["d_hidden"])
    out["offload_client_refused"] = _error_key(
        lambda: dsl.initialize(model, config, client_optimizer=torch.optim.Adam(model.parameters())))
    # 4. fp16 asked of DeepSpeed directly (make_config would refuse it first)
    config = dsl.make_config(stage=0, micro_batch=o["micro"])
    config["fp16"] = {"enabled": True}
    out["fp16_supported"] = dsl.fp16_supported()
    out["fp16_error"] = _error_key(lambda: dsl.initialize(ds_train.make_model(o["seed"], o["d_hidden"]), config))
    # 5. the pipeline engine refuses ZeRO-2 (runtime/pipe/engine.py)
    out["pipeline_zero2_error"] = _error_key(lambda: _pipeline(2, o))
    out["pipeline_zero1_error"] = _error_key(lambda: _pipeline(1, o))
    return out


def _pipeline(stage: int, o: dict):
    import torch.nn.functional as F
    from deepspeed.pipe import PipelineModule

    net = ds_train.make_model(o["seed"], o["d_hidden"])
    pipe = PipelineModule(layers=list(net.layers), num_stages=1, loss_fn=F.mse_loss)  # 1 stage: pure DP
    return dsl.initialize(pipe, dsl.make_config(stage=stage, micro_batch=o["micro"]))


def fsdp_run(o: dict, ref: dict) -> dict:
    """The same model, data and Adam under FSDP2 (fully_shard of each Linear, then the root)."""
    import os
    import shutil
    import tempfile

    import torch.distributed as dist
    import torch.nn.functional as F

    from dtrain_lab.parallel import fsdp

    rt = runtime.current()
    model = ds_train.make_model(o["seed"], o["d_hidden"]).to(rt.device)
    names = [n for n, _ in model.named_parameters()]
    t0 = time.perf_counter()
    fsdp.shard_model(model)
    wrap_seconds = time.perf_counter() - t0
    opt = torch.optim.Adam(model.parameters(), lr=o["lr"])
    losses, seconds, state = [], [], None
    for step in range(o["steps"]):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        step_losses = []
        for x, y in ds_train.batches(step, o["micro"], o["accum"], o["seed"], rt.rank, rt.world_size):
            loss = F.mse_loss(model(x.to(rt.device)), y.to(rt.device))
            (loss / o["accum"]).backward()
            step_losses.append(loss.item())
        grads = fsdp.sharded_state_bytes(model)["grads"] if step == 0 else None
        opt.step()
        seconds.append(time.perf_counter() - t0)
        if step == 0:
            state = fsdp.sharded_state_bytes(model, opt)
            state["grads"] = grads
        losses.append(ds_train.mean_over_ranks(sum(step_losses) / len(step_losses)))
    full = fsdp.full_state_dict(model)
    out = {"loss": losses, "loss_vs_ddp": ds_train.compare(losses, ref["loss"]), "state_bytes": state,
           "wrap_seconds": wrap_seconds, "step_seconds": sorted(seconds[1:])[len(seconds[1:]) // 2]}
    if rt.rank == 0:
        flat = torch.cat([full[n].reshape(-1).float() for n in names]).tolist()
        out["params_vs_ddp"] = ds_train.compare(flat, ref["params"])
    root = [tempfile.mkdtemp(prefix="dtrain_fsdp_ckpt_") if rt.rank == 0 else None]
    dist.broadcast_object_list(root, src=0)
    path = fsdp.save_checkpoint(model, opt, os.path.join(root[0], "ckpt"))
    if rt.rank == 0:
        out["files"] = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
    dist.barrier()
    if rt.rank == 0:
        shutil.rmtree(root[0], ignore_errors=True)
    return out


def main() -> None:
    rt = runtime.current()
    if not caps.have("cuda"):
        torch.set_num_threads(1)  # CPU ranks share the machine's cores
    o = parse(sys.argv[1:])
    common = dict(micro_batch=o["micro"], grad_accum=o["accum"], lr=o["lr"], d_hidden=o["d_hidden"],
                  optimizer=o["optimizer"])
    t0 = time.perf_counter()
    ref = ds_train.train_ddp(o["steps"], o["seed"], **common)
    runtime.report(ddp={"loss": ref["loss"], "seconds": time.perf_counter() - t0}, rank=rt.rank,
                   world_size=rt.world_size, backend=rt.backend, steps=o["steps"],
                   numel=len(ref["params"]))
    runtime.print0(f"DDP      : loss {ref['loss'][0]:.5f} -> {ref['loss'][-1]:.5f}")
    runs = {}
    for stage in o["stages"]:
        t0 = time.perf_counter()
        out = ds_train.train(stage, o["steps"], o["seed"], precision=o["precision"], **common)
        runs[stage] = {"loss": out["loss"], "loss_vs_ddp": ds_train.compare(out["loss"], ref["loss"]),
                       "params_vs_ddp": ds_train.compare(out["params"], ref["params"]),
                       "state_bytes": out["state_bytes"], "config": out["config"],
                       "engine_config": out["engine_config"], "step_seconds": out["step_seconds"],
                       "seconds": time.perf_counter() - t0}
        runtime.report(runs=runs)
        d = runs[stage]["params_vs_ddp"]
        runtime.print0(f"ZeRO-{stage}   : loss {out['loss'][0]:.5f} -> {out['loss'][-1]:.5f}   "
                       f"params vs DDP: equal={d['equal']} max|diff|={d['max_abs_diff']:.2e}")
        del out
    if o["clip_control"] > 0:
        # the control: DeepSpeed's clipping switched on (0.05, below this model's gradient norm) must
        # move the result away from DDP's -- the comparison above can detect a difference
        out = ds_train.train(0, o["steps"], o["seed"], clipping=o["clip_control"], **common)
        runtime.report(clip_control={"clipping": o["clip_control"],
                                     "params_vs_ddp": ds_train.compare(out["params"], ref["params"]),
                                     "loss_vs_ddp": ds_train.compare(out["loss"], ref["loss"])})
        del out
    mixed = {}
    for stage in o["bf16"]:   # bf16 parameters and gradients, fp32 master copy: the ZeRO paper's "mixed precision"
        t0 = time.perf_counter()
        out = ds_train.train(stage, o["bf16_steps"], o["seed"], precision="bf16", **common)
        mixed[stage] = {"loss": out["loss"], "state_bytes": out["state_bytes"],
                        "loss_vs_ddp": ds_train.compare(out["loss"], ref["loss"][:o["bf16_steps"]]),
                        "seconds": time.perf_counter() - t0}
        runtime.report(mixed=mixed)
        runtime.print0(f"bf16 ZeRO-{stage}: loss {out['loss'][0]:.5f} -> {out['loss'][-1]:.5f}")
        del out
    ckpt = {}
    for stage in o["ckpt"]:
        ckpt[stage] = ds_train.checkpoint_roundtrip(stage, steps_before=3, seed=o["seed"], micro_batch=o["micro"],
                                               lr=o["lr"])
        runtime.report(ckpt=ckpt)
        c = ckpt[stage]
        runtime.print0(f"ckpt ZeRO-{stage}: next loss {c['next_loss']:.6f} resumed {c['resumed_loss']:.6f}")
    if o["facts"]:
        runtime.report(facts=facts(o, ref, common))
    if o["fsdp"]:
        try:
            runtime.report(fsdp=fsdp_run(o, ref))
        except Exception as exc:  # noqa: BLE001 - another module; the lesson says what happened
            runtime.report(fsdp_error=f"{type(exc).__name__}: {exc}"[:500])
    from deepspeed.accelerator import get_accelerator

    extra = {"accelerator": get_accelerator()._name, "comm_backend": get_accelerator().communication_backend_name()}
    if o["probe"] and rt.rank == 0:
        extra["features"] = dsl.probe_features()
    runtime.report(last=True, **extra)


if __name__ == "__main__":
    runtime.entrypoint(main)
