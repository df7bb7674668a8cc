import math

import pytest

from dtrain_lab import perfmodel as pm


def test_ring_allreduce_formula():
    a, b, n = 1e-5, 1e-9, 2 ** 20
    for p in (2, 3, 8, 64):
        t = pm.collective_time("all_reduce", n, p, a, b)
        assert t == pytest.approx(2 * (p - 1) * a + 2 * (p - 1) / p * n * b)
    # the bandwidth term is bounded by 2·n·β however many ranks: rings scale
    big = pm.collective_time("all_reduce", n, 10_000, 0.0, b)
    assert big < 2 * n * b


def test_halves_add_up_to_allreduce():
    a, b, n, p = 3e-6, 2e-10, 1e8, 8
    rs = pm.collective_time("reduce_scatter", n, p, a, b)
    ag = pm.collective_time("all_gather", n, p, a, b)
    assert rs + ag == pytest.approx(pm.collective_time("all_reduce", n, p, a, b))


def test_naive_is_worse_than_ring_for_large_messages():
    a, b, n = 1e-5, 1e-9, 2 ** 26
    for p in (4, 16):
        assert pm.collective_time("all_reduce", n, p, a, b, "naive") > 2 * pm.collective_time("all_reduce", n, p, a, b)


def test_world_of_one_costs_nothing():
    assert pm.collective_time("all_reduce", 1e9, 1, 1.0, 1.0) == 0.0


def test_busbw_factors_match_nccl_tests():
    assert pm.busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert pm.busbw_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert pm.busbw_factor("reduce_scatter", 2) == pytest.approx(1 / 2)
    assert pm.busbw_factor("broadcast", 16) == 1.0
    algbw, busbw = pm.bus_bandwidth("all_reduce", 1e9, 0.5, 4)
    assert algbw == pytest.approx(2e9) and busbw == pytest.approx(2e9 * 1.5)


def test_fit_recovers_alpha_beta():
    a, b = 2e-5, 3e-9
    sizes = [2.0 ** k for k in range(10, 25)]
    alpha, beta = pm.fit_alpha_beta(sizes, [a + s * b for s in sizes])
    assert alpha == pytest.approx(a, rel=1e-6) and beta == pytest.approx(b, rel=1e-9)


def test_ring_bytes_and_amdahl():
    assert pm.ring_bytes_sent(1000, 4) == pytest.approx(1500)
    assert pm.ring_bytes_sent(1000, 1) == 0
    assert pm.amdahl_speedup(0.9, 10) == pytest.approx(1 / (0.1 + 0.09))
    assert pm.amdahl_speedup(1.0, 7) == pytest.approx(7)
    assert math.isclose(pm.amdahl_speedup(0.0, 100), 1.0)


@pytest.mark.parametrize("bad", [dict(p=0), dict(nbytes=-1), dict(op="allreduce"), dict(algorithm="tree")])
def test_bad_arguments_are_refused(bad):
    args = dict(op="all_reduce", nbytes=10, p=2, alpha=1e-6, beta=1e-9)
    args.update(bad)
    algorithm = args.pop("algorithm", "ring")
    with pytest.raises(ValueError):
        pm.collective_time(args["op"], args["nbytes"], args["p"], args["alpha"], args["beta"], algorithm)


def test_ring_schedule_simulation_sums_every_chunk():
    import random

    from dtrain_lab.comm.collectives import ring_steps, simulate_ring

    rng = random.Random(0)
    for p in range(1, 7):
        values = [[rng.randint(-50, 50) for _ in range(p)] for _ in range(p)]
        final, log = simulate_ring(values)
        want = [sum(v[c] for v in values) for c in range(p)]
        assert all(row == want for row in final)
        assert len(log) == 2 * (p - 1)
        for r in range(p):  # each chunk index is sent exactly once per phase, never the one received
            for phase in ("reduce_scatter", "all_gather"):
                steps = ring_steps(r, p, phase)
                assert len({s for s, _ in steps}) == p - 1 and all(s != q for s, q in steps)


def test_fit_collective_inverts_the_model():
    a, b = 4e-5, 2e-9
    for p in (2, 3, 8):
        sizes = [2.0 ** k for k in range(12, 24)]
        secs = [pm.collective_time("all_reduce", n, p, a, b) for n in sizes]
        alpha, beta = pm.fit_collective("all_reduce", sizes, secs, p)
        assert alpha == pytest.approx(a, rel=1e-6) and beta == pytest.approx(b, rel=1e-6)


def test_fit_survives_an_outlier_and_noise():
    a, b = 1e-3, 1e-9
    sizes = [4.0 ** k * 1024 for k in range(6)]
    secs = [a + s * b for s in sizes]
    secs[1] *= 20  # one disturbed measurement
    alpha, beta = pm.fit_alpha_beta(sizes, secs)
    assert beta == pytest.approx(b, rel=0.05) and alpha == pytest.approx(a, rel=0.05)
    # pure noise with a falling trend: β stays positive (bandwidth finite)
    alpha, beta = pm.fit_alpha_beta([1e3, 1e4, 1e5], [3e-3, 2e-3, 1e-3])
    assert beta > 0 and alpha >= 0


def _through_root(messages: list[float], alpha: float, beta: float) -> float:
    """Seconds for messages that cross the root's link one at a time."""
    return sum(alpha + m * beta for m in messages)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_naive_collectives_count_every_message_through_the_root(p):
    # the messages a root-based implementation sends, written out: the root's link carries them in turn
    a, b, n = 3e-6, 1e-9, 3 * 2 ** 20
    peers = p - 1
    shard = n / p
    msgs = {
        "all_reduce": [n] * peers + [n] * peers,                      # whole arrays in, the sum out
        "all_gather": [shard] * peers + [n] * peers,                  # shards in, the whole array out
        "reduce_scatter": [n] * peers + [shard] * peers,              # whole arrays in, a shard out
        "all_to_all": [n - shard] * peers + [n - shard] * peers,      # what is not one's own, both ways
        "broadcast": [n] * peers,
    }
    for op, m in msgs.items():
        assert pm.collective_time(op, n, p, a, b, "naive") == pytest.approx(_through_root(m, a, b)), op
    # one direction of a naive all-gather carries all n bytes per peer: p + 1 times the ring's bytes
    ag_naive = pm.collective_time("all_gather", n, p, 0.0, b, "naive")
    ag_ring = pm.collective_time("all_gather", n, p, 0.0, b)
    assert ag_naive / ag_ring == pytest.approx(p + 1)
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        assert pm.collective_time(op, n, p, a, b, "naive") >= pm.collective_time(op, n, p, a, b)


def test_ring_bytes_sent_per_collective_is_exact():
    from dtrain_lab.i18n import LabError

    for p in (2, 3, 5, 8):
        n = 4 * p * 1001                     # divisible by p: exact integers, no float residue
        assert pm.ring_bytes_sent(n, p, "reduce_scatter") == (p - 1) * n // p
        assert pm.ring_bytes_sent(n, p, "all_gather") == (p - 1) * n // p
        assert pm.ring_bytes_sent(n, p) == pm.ring_bytes_sent(n, p, "all_reduce") == 2 * (p - 1) * n // p
        # the bytes a ring sends are the bandwidth term of its time, at β = 1 s per byte
        for op in pm.RING_OPS:
            assert pm.ring_bytes_sent(n, p, op) == pytest.approx(pm.collective_time(op, n, p, 0.0, 1.0))
    assert pm.ring_bytes_sent(512, 1, "all_gather") == 0.0
    with pytest.raises(LabError) as e:
        pm.ring_bytes_sent(10, 2, "broadcast")
    assert "broadcast" in str(e.value) and "all_gather" in str(e.value)


def test_errors_are_bilingual():
    from dtrain_lab.i18n import LabError, rendered

    with pytest.raises(LabError) as e:
        pm.collective_time("all_reduce", 10, 0, 1e-6, 1e-9)
    text = rendered(e.value.key, **e.value.fields)
    assert "p" in text["en"] and "rank" in text["zh"]
    with pytest.raises(LabError):
        pm.fit_alpha_beta([1.0], [1.0])
    with pytest.raises(LabError):
        pm.bus_bandwidth("all_reduce", 10, 0.0, 2)
