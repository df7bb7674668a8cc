"""In-process checks of lesson 02's demo helpers (the multi-process runs are checked by nbval, in the
lesson's own asserts): sync_batch_norm on a world of one, the padding rule sampler_eval relies on,
and the bucket-sweep plot in both languages."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from dtrain_lab.demos.dp_sync_bn import sync_batch_norm


def test_sync_batch_norm_on_a_world_of_one_is_batch_norm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 3, generator=g) * 2 + 1
    w, b, upstream = torch.rand(3, generator=g), torch.randn(3, generator=g), torch.randn(12, 3, generator=g)
    a, ref = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (sync_batch_norm(a, w, b) * upstream).sum().backward()
    (F.batch_norm(ref, None, None, w, b, training=True) * upstream).sum().backward()
    torch.testing.assert_close(sync_batch_norm(x, w, b), F.batch_norm(x, None, None, w, b, training=True))
    torch.testing.assert_close(a.grad, ref.grad)


@pytest.mark.parametrize("n,world", [(7, 2), (10, 3), (5, 4), (8, 2)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_padding_positions_are_past_the_data_set(n, world, shuffle):
    """sampler_eval masks a rank's i-th sample as padding when i·W + rank >= len(data): with
    drop_last=False, exactly those positions repeat indices, and the rest cover the data set once."""
    real = []
    for rank in range(world):
        idx = list(DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=1))
        real += [j for i, j in enumerate(idx) if i * world + rank < n]
    assert sorted(real) == list(range(n))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_bucket_sweep_plot(lang):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import dtrain_lab
    from dtrain_lab.demos.dp_bucket_sweep import plot_bucket_sweep

    caps = [0.01, 25.0]
    seconds = {"naive": 0.05, **{f"{k}@{c:g}": 0.01 + 0.001 * i for i, c in enumerate(caps)
                                 for k in ("ours", "ours_no_overlap", "torch")}}
    metrics = {"caps": caps, "seconds": seconds, "buckets": {"ours@0.01": 5, "ours@25": 1},
               "params": 26, "backend": "gloo"}
    old = dtrain_lab.get_lang()
    try:
        dtrain_lab.set_lang(lang)
        ax = plot_bucket_sweep(metrics)
        assert len(ax.get_lines()) == 4          # three DDP lines and the naive level
    finally:
        dtrain_lab.set_lang(old)
        plt.close("all")
