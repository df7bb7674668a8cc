"""dtrain_lab.parallel.deepspeed_lab: DeepSpeed's ZeRO stages 0-3 train exactly like PyTorch DDP, the bytes each
rank holds match the ZeRO formulas of dtrain_lab.perfmodel where DeepSpeed follows them, checkpoints resume
exactly, and bad configs fail with a readable bilingual error.

One launch (world size 2, gloo, DeepSpeed's CPU accelerator) runs dtrain_lab.demos.ds_zero: a DDP reference,
then one DeepSpeed engine per stage in fp32 and in bf16, a clipped control run, and two checkpoint round
trips. Tolerance: fp32 with gradient clipping off, DeepSpeed's losses and parameters must match DDP's to
1e-6 (absolute; on 2 CPU ranks they are in fact bit-identical: the same all-reduce sum, the same
torch.optim.Adam). The clipped control must differ by more than that, so the comparison can fail.
The in-process tests at the end check make_config against DeepSpeed's own config parser.
"""
import pytest

from dtrain_lab.parallel import deepspeed_lab as dsl
from dtrain_lab import i18n
from dtrain_lab.perfmodel import zero_memory
from forkjob import fork_launch

WORLD = 2
STEPS = 8
TOL = 1e-6
NUMEL = 16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4     # MLP(16, 32, 4, depth=2): 1732


@pytest.fixture(scope="module")
def job():
    r = fork_launch("dtrain_lab.demos.ds_zero", nproc=WORLD, args=[f"steps={STEPS}"], timeout=240,
                    startup_timeout=120, quiet=True)
    assert r.ok, r.summary() + "\n" + "\n".join(x.output[-4000:] for x in r.ranks)
    assert sorted(r.metrics) == list(range(WORLD))
    assert all(m.get("last") is True for m in r.metrics.values())
    return r.metrics


@pytest.mark.timeout(400)
def test_job_on_cpu_accelerator(job):
    for rank, m in job.items():
        assert m["rank"] == rank and m["world_size"] == WORLD and m["numel"] == NUMEL
        if m["backend"] == "gloo":
            assert m["accelerator"] == "cpu" and m["comm_backend"] == "gloo"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stage_matches_ddp(job, stage):
    ref = job[0]["ddp"]["loss"]
    assert len(ref) == STEPS and len(set(ref)) > 1             # the loss moves: a real training run
    for m in job.values():
        run = m["runs"][str(stage)]
        assert run["loss_vs_ddp"]["n"] == STEPS and run["params_vs_ddp"]["n"] == NUMEL
        assert run["loss_vs_ddp"]["max_abs_diff"] <= TOL, run["loss_vs_ddp"]
        assert run["params_vs_ddp"]["max_abs_diff"] <= TOL, run["params_vs_ddp"]
        assert run["loss"] == job[0]["runs"][str(stage)]["loss"]   # every rank reports the same global loss
        seen = run["engine_config"]
        assert seen["stage"] == stage and seen["clipping"] == 0.0
        assert seen["train_batch_size"] == 8 * 1 * WORLD and seen["micro"] == 8 and seen["accum"] == 1
        assert seen["optimizer"] == "Adam"                          # torch.optim.Adam, not AdamW, not FusedAdam
        assert (seen["wrapper"] == "Adam") == (stage == 0)          # stages 1-3: a ZeRO optimizer wraps it


@pytest.mark.timeout(400)
def test_clipping_control_differs(job):
    c = job[0]["clip_control"]
    assert c["clipping"] > 0
    assert c["params_vs_ddp"]["max_abs_diff"] > 100 * TOL           # the comparison above can fail


@pytest.mark.timeout(400)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_fp32_state_bytes(job, stage):
    """Measured from DeepSpeed's tensors against ZeRO's fp32 formula (4Ψ params, 4Ψ grads, 8Ψ Adam state)."""
    model = zero_memory(NUMEL, stage, WORLD, precision="fp32")
    for m in job.values():
        b = m["runs"][str(stage)]["state_bytes"]
        assert b["numel"] == NUMEL and b["stage"] == stage
        assert b["params"] == model["params"]
        assert b["state_bytes"] == model["optimizer"]               # Adam's m and v, partitioned from stage 1 on
        if stage >= 2:
            assert b["grads"] == model["grads"]
        else:   # after backward: stage 0 keeps full gradients; stage 1 keeps only its reduced partition
            assert b["grads"] == (4 * NUMEL if stage == 0 else 4 * NUMEL // WORLD)
        # DeepSpeed's ZeRO optimizers keep an fp32 copy of this rank's partition even in fp32 training
        assert b["master_bytes"] == (0 if stage == 0 else 4 * NUMEL // WORLD)
        assert not b["master_is_params"]
        assert b["optimizer"] == b["state_bytes"] + b["master_bytes"]
        assert b["total"] == b["params"] + b["grads"] + b["optimizer"]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_state_bytes_match_mixed_formula(job, stage):
    """bf16 params/grads + fp32 master + Adam (K = 12): the ZeRO paper's mixed-precision accounting."""
    model = zero_memory(NUMEL, stage, WORLD, precision="mixed")
    for m in job.values():
        run = m["mixed"][str(stage)]
        b = run["state_bytes"]
        assert b["params"] == model["params"]
        assert b["optimizer"] == model["optimizer"]
        assert b["grads"] == 2 * NUMEL // WORLD                      # the reduced bf16 gradient partition
        # bf16 is close to fp32 training, not equal
        assert 0 < run["loss_vs_ddp"]["max_abs_diff"] < 0.05


@pytest.mark.timeout(400)
@pytest.mark.parametrize("stage", [2, 3])
def test_checkpoint_roundtrip(job, stage):
    for rank, m in job.items():
        c = m["ckpt"][str(stage)]
        assert c["resumed_loss"] == c["next_loss"]
        assert c["params_equal"] and c["params_diff"] == 0.0
        assert c["before_load_differs"] and c["loaded_equal_saved"]
        assert c["client_next_step"] == 3 and c["tag"] == "step3"
        own = {f"step3/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"}
        if stage == 3:
            own.add(f"step3/zero_pp_rank_{rank}_mp_rank_00_model_states.pt")  # each rank its parameter shard
        elif rank == 0:
            own.add("step3/mp_rank_00_model_states.pt")                        # rank 0 alone: full weights
        assert set(c["files"]) == own
        assert all(size > 0 for size in c["sizes"].values())
    listing = job[0]["ckpt"][str(stage)]["listing"]
    every = set().union(*(set(m["ckpt"][str(stage)]["files"]) for m in job.values()))
    assert every <= set(listing) and {"latest", "zero_to_fp32.py"} <= set(listing)
    cons = job[0]["ckpt"][str(stage)]["consolidated"]
    assert cons["equal"] and len(cons["keys"]) == 6


@pytest.mark.timeout(400)
def test_claims_checked_by_running(job):
    f = job[0]["facts"]
    assert f["adam_type_builds"] == "AdamW"          # "type": "Adam" without adam_w_mode is AdamW
    for key in ("client_optimizer", "offload"):       # both train exactly like DDP
        assert f[key]["params_vs_ddp"]["max_abs_diff"] <= TOL and f[key]["loss_vs_ddp"]["max_abs_diff"] <= TOL, key
    assert f["client_optimizer"]["optimizer"] == "Adam" and f["offload"]["cpu_offload"] is True
    assert f["offload_client_refused"] == "ds_offload_client_optimizer"
    assert f["fp16_supported"] == dsl.fp16_supported()
    assert f["fp16_error"] == (None if f["fp16_supported"] else "ds_no_fp16")
    assert f["pipeline_zero2_error"] == "ds_pipeline_zero" and f["pipeline_zero1_error"] is None


@pytest.mark.timeout(400)
def test_fsdp2_same_training_other_bytes(job):
    if "fsdp_error" in job[0]:
        pytest.fail(f"dtrain_lab.parallel.fsdp failed in the job: {job[0]['fsdp_error']}")
    f = job[0]["fsdp"]
    assert f["loss_vs_ddp"]["max_abs_diff"] <= TOL and f["params_vs_ddp"]["max_abs_diff"] <= TOL
    ds3 = job[0]["runs"]["3"]["state_bytes"]
    for m in job.values():
        b = m["fsdp"]["state_bytes"]
        assert b["params"] == ds3["params"] == 4 * NUMEL // WORLD  # both shard the parameters
        assert b["grads"] == ds3["grads"] == 4 * NUMEL // WORLD
        # FSDP2: Adam's m and v of the shards (+ a 4-byte step per parameter tensor); DeepSpeed adds its fp32 copy
        assert b["optimizer"] == 8 * NUMEL // WORLD + 4 * 6
        assert m["runs"]["3"]["state_bytes"]["optimizer"] == 12 * NUMEL // WORLD
    assert ".metadata" in f["files"] and {f"__{r}_0.distcp" for r in range(WORLD)} <= set(f["files"])


@pytest.mark.timeout(400)
def test_probe_features(job):
    rows = {r["feature"]: r for r in job[0]["features"]}
    assert {"accelerator", "bf16", "fp16", "fused_adam", "cpu_adam", "shm_comm", "nccl"} <= set(rows)
    assert rows["fp16"]["ok"] == dsl.fp16_supported()
    assert rows["nccl"]["ok"] == dsl.cuda_available()
    assert rows["shm_comm"]["ok"] or rows["accelerator"]["detail"].startswith("cuda")  # the job loaded it


# ---------------------------------------------------------------------------------- in-process
@pytest.mark.parametrize("micro,accum,world", [(8, 1, 2), (4, 3, 2), (2, 2, 3), (1, 1, 1)])
def test_config_batch_arithmetic(micro, accum, world):
    c = dsl.make_config(micro_batch=micro, grad_accum=accum, world_size=world)
    assert c["train_batch_size"] == micro * accum * world
    assert c["train_micro_batch_size_per_gpu"] == micro and c["gradient_accumulation_steps"] == accum
    assert c["gradient_clipping"] == 0.0                      # written: DeepSpeed's default would be 1.0


def test_config_accepted_by_deepspeed():
    """DeepSpeed's own parser (world of one in this process) reads what make_config meant."""
    dsl.import_deepspeed()
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

    assert GRADIENT_CLIPPING_DEFAULT == 1.0                   # why make_config always writes the key
    for stage in dsl.STAGES:
        for precision in ("fp32", "bf16"):
            ds = DeepSpeedConfig(dsl.make_config(stage=stage, micro_batch=4, grad_accum=2, world_size=1,
                                                 precision=precision, clipping=0.5))
            assert ds.zero_optimization_stage == stage and ds.train_batch_size == 8
            assert ds.gradient_accumulation_steps == 2 and ds.gradient_clipping == 0.5
            assert ds.bfloat16_config.enabled == (precision == "bf16") and not ds.float16_config.enabled
    off = DeepSpeedConfig(dsl.make_config(stage=2, world_size=1, offload="cpu"))
    assert off.zero_config.offload_optimizer.device == "cpu" and off.zero_force_ds_cpu_optimizer is False
    # DeepSpeed itself rejects what make_config rejects
    bad = dsl.make_config(micro_batch=4, world_size=1)
    bad["train_batch_size"] = 6
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        DeepSpeedConfig(bad)
    with pytest.raises(i18n.LabError):
        dsl.make_config(micro_batch=4, world_size=1, train_batch=6)


@pytest.mark.parametrize("kwargs,key", [
    (dict(stage=4), "ds_bad_stage"),
    (dict(stage="2"), "ds_bad_stage"),
    (dict(micro_batch=0), "ds_bad_positive_int"),
    (dict(grad_accum=1.5), "ds_bad_positive_int"),
    (dict(world_size=0), "ds_bad_positive_int"),
    (dict(micro_batch=8, grad_accum=2, world_size=2, train_batch=16), "ds_batch_mismatch"),
    (dict(precision="fp8"), "ds_bad_choice"),
    (dict(optimizer="lamb"), "ds_bad_choice"),
    (dict(offload="nvme", stage=2), "ds_bad_choice"),
    (dict(offload="cpu", stage=0), "ds_offload_needs_zero"),
    (dict(lr=0), "ds_bad_number"),
    (dict(clipping=-1), "ds_bad_number"),
    (dict(optimizer="cpu_adam", stage=2), "ds_cpu_adam_needs_offload"),
    (dict(optimizer="Adam"), "ds_bad_choice"),
])
def test_bad_config_clear_error(kwargs, key):
    with pytest.raises(i18n.LabError) as info:
        dsl.make_config(world_size=kwargs.pop("world_size", 2), **kwargs)
    assert info.value.key == key
    text = str(info.value)
    assert info.value.message("zh") in text and info.value.message("en") in text
    assert "Traceback" not in text


def test_gpu_only_features_detected():
    if not dsl.fp16_supported():
        with pytest.raises(i18n.LabError) as info:
            dsl.make_config(precision="fp16", world_size=2)
        assert info.value.key == "ds_no_fp16" and "bf16" in str(info.value)
    if not dsl.cuda_available():
        with pytest.raises(i18n.LabError) as info:
            dsl.make_config(optimizer="fused_adam", world_size=2)
        assert info.value.key == "ds_no_fused_adam"


def test_client_optimizer_config_has_no_optimizer_key():
    assert "optimizer" not in dsl.make_config(optimizer=None, world_size=2)


def test_overrides_merge_and_summary():
    c = dsl.make_config(stage=2, world_size=2, zero_optimization={"overlap_comm": True, "contiguous_gradients": True})
    assert c["zero_optimization"] == {"stage": 2, "overlap_comm": True, "contiguous_gradients": True}
    s = dsl.config_summary(dsl.make_config(stage=3, world_size=4, precision="bf16", grad_accum=2))
    assert s == {"stage": 3, "train_batch_size": 64, "micro": 8, "accum": 2, "precision": "bf16",
                 "optimizer": "Adam", "clipping": 0.0, "offload": None}


def test_count_tensor_bytes_counts_shared_memory_once():
    import torch

    flat = torch.zeros(100)
    views = [flat[:50], flat[25:75], flat[90:]]
    assert dsl.count_tensor_bytes(views) == 4 * 85
    assert dsl.count_tensor_bytes([flat, flat[:10], torch.zeros(3, dtype=torch.bfloat16)]) == 400 + 6


def test_deepspeed_view_reads_defaults_and_rejects():
    v = dsl.deepspeed_view({"train_batch_size": 32, "gradient_accumulation_steps": 4})
    assert v["micro"] == 8 and v["gradient_clipping"] == 1.0 and v["stage"] == 0   # DeepSpeed's own defaults
    auto = dsl.deepspeed_view({"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})
    plain = dsl.deepspeed_view({"train_batch_size": 8, "zero_optimization": {"stage": 3}})
    assert auto["reduce_bucket_size"] == plain["reduce_bucket_size"] and plain["overlap_comm"] is True
    bad = dsl.make_config(world_size=1)
    bad["train_batch_size"] = 7
    with pytest.raises(i18n.LabError) as info:
        dsl.deepspeed_view(bad)
    assert info.value.key == "ds_rejected" and "7 != 8 * 1 * 1" in str(info.value)
