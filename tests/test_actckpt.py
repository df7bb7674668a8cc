"""Activation checkpointing: fewer saved bytes, one extra forward per block, identical gradients."""
import torch

from dtrain_lab.demos.actckpt_measure import measure
from dtrain_lab.parallel import actckpt


def test_checkpointing_trades_memory_for_recompute():
    plain = measure(checkpointed=False, n_layers=4)
    ckpt = measure(checkpointed=True, n_layers=4)
    assert plain["loss"] == ckpt["loss"]
    assert plain["grads"].keys() == ckpt["grads"].keys()
    for name, g in plain["grads"].items():
        assert torch.equal(g, ckpt["grads"][name]), name
    assert plain["block_forwards"] == 4          # one forward per block
    assert ckpt["block_forwards"] == 8           # and one recomputation per block in backward
    # what stays per checkpointed block is its input: batch x (seq-1) x d floats
    block_input = 8 * 15 * 64 * 4
    assert ckpt["saved_bytes"] < plain["saved_bytes"] / 4
    assert ckpt["saved_bytes"] >= 4 * block_input


def test_saved_bytes_grow_with_layers():
    two = measure(checkpointed=False, n_layers=2, repeats=1)
    four = measure(checkpointed=False, n_layers=4, repeats=1)
    per_layer = (four["saved_bytes"] - two["saved_bytes"]) / 2
    assert per_layer > 0
    assert abs(two["saved_bytes"] - 2 * per_layer - (four["saved_bytes"] - 4 * per_layer)) < 1e-6


def test_saved_tensor_bytes_counts_each_storage_once():
    x = torch.randn(100, requires_grad=True)
    with actckpt.saved_tensor_bytes() as c:
        y = (x * x).sum()      # mul saves x twice (self and other): one storage
    assert c.bytes == 400 and c.tensors == 1
    y.backward()
