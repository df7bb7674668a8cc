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
