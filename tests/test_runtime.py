"""runtime outside torchrun (a notebook kernel: a world of one) and its bilingual errors."""
import os

import pytest
import torch

from dtrain_lab import i18n
from dtrain_lab.jobs import runtime
from dtrain_lab.i18n import LabError


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "DTRAIN_BACKEND", "DTRAIN_PG_TIMEOUT",
                "DTRAIN_JOB_DIR", "TORCH_DISTRIBUTED_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    yield monkeypatch
    runtime.cleanup()


def test_world_of_one_outside_torchrun(clean_env):
    with runtime.init(seed=3) as rt:
        assert (rt.rank, rt.world_size, rt.local_rank) == (0, 1, 0)
        assert not rt.under_torchrun and not rt.distributed and rt.is_main
        assert str(rt.device) == "cpu"
        a = torch.randn(3)
    runtime.init(seed=3)
    assert torch.equal(a, torch.randn(3))          # seeding is reproducible


def test_data_generators_differ_by_rank(clean_env):
    runtime.init()
    x0 = torch.randn(4, generator=runtime.data_generator(5, rank=0))
    x1 = torch.randn(4, generator=runtime.data_generator(5, rank=1))
    again = torch.randn(4, generator=runtime.data_generator(5, rank=0))
    assert not torch.equal(x0, x1) and torch.equal(x0, again)


def test_report_outside_a_launch_is_kept_locally(clean_env):
    runtime.init()
    before = len(runtime.local_reports())
    runtime.report(loss=torch.tensor(0.25), vec=torch.arange(3))
    assert runtime.local_reports()[before:] == [{"loss": 0.25, "vec": [0, 1, 2]}]
    with pytest.raises(TypeError):
        runtime.report(bad=object())


def test_print0_and_rprint(clean_env, capsys):
    runtime.init()
    runtime.print0("hi")
    runtime.rprint("there")
    assert capsys.readouterr().out == "hi\n[rank0] there\n"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_bad_backend_is_a_clear_bilingual_error(clean_env, lang):
    i18n.set_lang(lang)
    clean_env.setenv("DTRAIN_BACKEND", "ncll")
    with pytest.raises(LabError) as e:
        runtime.choose_backend()
    text = str(e.value)
    assert "ncll" in text and "gloo" in text
    first = text.splitlines()[0]
    assert ("请从以下选项中选择" in first) == (lang == "zh")   # the learner's language comes first
    i18n.set_lang("en")


def test_nccl_refused_without_gpus(clean_env):
    if runtime.gpu_count() > 0:
        pytest.skip("this machine has GPUs")
    clean_env.setenv("DTRAIN_BACKEND", "nccl")
    with pytest.raises(LabError) as e:
        runtime.choose_backend(2)
    assert "gloo" in str(e.value)


def test_default_backend_on_cpu_is_gloo(clean_env):
    if runtime.gpu_count() > 0:
        pytest.skip("this machine has GPUs")
    assert runtime.choose_backend(2) == "gloo"


def test_bad_env_values(clean_env):
    clean_env.setenv("DTRAIN_PG_TIMEOUT", "soon")
    with pytest.raises(LabError, match="DTRAIN_PG_TIMEOUT"):
        runtime.init()
    clean_env.delenv("DTRAIN_PG_TIMEOUT")
    clean_env.setenv("RANK", "0")
    with pytest.raises(LabError, match="WORLD_SIZE"):
        runtime.init()
    clean_env.setenv("WORLD_SIZE", "two")
    with pytest.raises(LabError, match="WORLD_SIZE"):
        runtime.init()


def test_debug_switch(clean_env):
    import torch.distributed as dist

    runtime.init(debug="detail")
    assert os.environ["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL
    runtime.init(debug="OFF")
    assert dist.get_debug_level() == dist.DebugLevel.OFF
    with pytest.raises(LabError, match="DETAIL"):
        runtime.init(debug="verbose")


def test_cleanup_in_a_kernel_does_not_exit(clean_env):
    runtime.init()
    runtime.cleanup()
    runtime.cleanup()  # twice is fine, and we are still alive
