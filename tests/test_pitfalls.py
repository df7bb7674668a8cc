"""The pitfalls lessons 02 and 02b show live (dtrain_lab.demos.pitfalls) and the scaling table (dtrain_lab.demos.scaling):
a second all-reduce on top of DDP makes the gradients p times those of one process (launched at 2 and
3 ranks, against one process in the worker); next(iter(loader)) never leaves the first batch; the
scaling table's arithmetic against perfmodel, and the measuring job's report at 3 ranks."""
import uuid

import pytest

import dtrain_lab
from dtrain_lab import perfmodel
from dtrain_lab.demos.pitfalls import first_batch_forever
from dtrain_lab.demos.scaling import format_table, scaling_table
from dtrain_lab.i18n import LabError
from forkjob import fork_launch


def test_next_iter_inside_the_loop_never_leaves_the_first_batch():
    seen = first_batch_forever(n=12, batch_size=4)
    assert seen["for_loop"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert seen["iterator_kept"] == seen["for_loop"]                 # iter() once: a real epoch
    assert seen["next_iter"] == [[0, 1, 2, 3]] * 3                   # the first batch forever
    first = seen["next_iter_distributed"][0]
    assert seen["next_iter_distributed"] == [first] * 3              # DistributedSampler, shuffle=True
    drawn = [i for b in seen["next_iter_shuffle"] for i in b]        # a new permutation at every step:
    assert len(set(drawn)) < 12 and len(drawn) == 12                 # repeats, and samples never seen


@pytest.mark.timeout(600)
@pytest.mark.parametrize("p", [2, 3])
def test_a_second_all_reduce_on_top_of_ddp_multiplies_the_gradients_by_p(p):
    r = fork_launch("dtrain_lab.demos.pitfalls", nproc=p, args=["double_reduction"], timeout=240,
                    quiet=True, env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
    assert r.ok, r.summary() + "\n" + "\n".join(x.output for x in r.ranks)
    for m in r.metrics.values():
        assert m["world_size"] == p
        assert m["ddp_vs_one_process"] < 1e-6                         # DDP alone: one process's gradient
        assert m["twice_is_p_times"] and m["norm_ratio"] == pytest.approx(p, rel=1e-5)
        assert m["twice_vs_one_process"] > 1e-3


def test_pitfalls_refuses_an_unknown_program():
    import sys

    from dtrain_lab.demos import pitfalls

    old = sys.argv
    sys.argv = ["pitfalls", "first_batch_forever"]
    try:
        with pytest.raises(LabError) as err:
            pitfalls.main()
    finally:
        sys.argv = old
    assert "double_reduction" in str(err.value) and "notebook" in str(err.value)


SYNTHETIC = {"step": {"1": 0.100, "2": 0.060, "3": 0.050}, "fb_one": 0.080, "alpha": 1e-4, "beta": 1e-9,
             "grad_bytes": 4_000_000, "global_batch": 192, "cores": 2, "threads": 1}


def test_scaling_table_arithmetic():
    rows = scaling_table(SYNTHETIC)
    assert [r["ranks"] for r in rows] == [1, 2, 3]
    assert rows[1]["speedup"] == pytest.approx(0.1 / 0.06) and rows[1]["efficiency"] == pytest.approx(0.1 / 0.06 / 2)
    assert rows[2]["amdahl"] == pytest.approx(perfmodel.amdahl_speedup(0.8, 3))
    comm = perfmodel.collective_time("all_reduce", 4_000_000, 3, 1e-4, 1e-9)
    assert rows[2]["alpha_beta"] == pytest.approx(0.1 / (0.02 + 0.08 / 3 + comm))
    assert rows[0]["speedup"] == rows[0]["alpha_beta"] == 1.0
    assert [r["oversubscribed"] for r in rows] == [False, False, True]


def test_scaling_table_says_when_ranks_oversubscribe_in_both_languages():
    from dtrain_lab.i18n import get_lang

    before = get_lang()
    try:
        dtrain_lab.set_lang("en")
        en = format_table(SYNTHETIC)
        dtrain_lab.set_lang("zh")
        zh = format_table(SYNTHETIC)
    finally:
        dtrain_lab.set_lang(before)
    assert en.count("oversubscribed") == 1 and zh.count("超额订阅") == 1
    assert en.splitlines()[0].startswith("ranks") and len(zh.splitlines()) == 4


@pytest.mark.timeout(600)
def test_scaling_job_reports_every_group_size():
    r = fork_launch("dtrain_lab.demos.scaling", nproc=3, args=["blocks=1", "steps=2", "warmup=1"],
                    timeout=240, quiet=True, env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
    assert r.ok, r.summary() + "\n" + "\n".join(x.output for x in r.ranks)
    m = r.metrics[0]
    assert sorted(m["step"]) == ["1", "2", "3"] and all(v > 0 for v in m["step"].values())
    assert 0 < m["fb_one"] <= m["step"]["1"] * 1.5 and m["alpha"] >= 0 and m["beta"] > 0
    assert [row["ranks"] for row in scaling_table(m)] == [1, 2, 3]
