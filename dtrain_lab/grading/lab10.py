"""Lab 10 — deadlocks: the contract of its nine exercises (what a submission may import).

Each exercise's ``run()`` is called by the grader in every rank once the process group is up. The
data each rank works on is **private to that rank** (:mod:`dtrain_lab.grading.contract`): drawn
for every graded run from a seed no rank sees, so the only way to an answer that involves other
ranks' data is to communicate. The functions below return this rank's part; asked for another
rank's, they say that it is not here. The checks live outside the sandbox
(``dtrain_lab.grading.checks.lab10``).
"""
from __future__ import annotations

import os
import time

from dtrain_lab.grading import contract, trace

LAB = "lab_10"
VAL_SIZE = 10          # exercise 2: samples in the validation set, sample i held by rank i % world_size
STEPS = 6              # exercise 4: steps of the loop
MESSAGE_NUMEL = 4 << 20  # exercise 6: 16 MiB of float32, far beyond any socket buffer
ACCUM = 2              # exercise 8: micro-batches accumulated per optimizer step
CHECKPOINT_NAME = "lab10_checkpoint.txt"
WRITTEN, READ = "checkpoint_written", "checkpoint_read"   # marks in the ranks' traces (exercise 7)
RANKS_PER_NODE = 2     # exercise 9: consecutive ranks per "node"
GRAD_NUMEL = 6         # exercise 9: elements of each rank's gradient


def make_inputs(seed: int, world: int) -> list[dict]:
    """Every rank's private inputs for one graded run (the grader calls it outside the sandbox
    with a seed of its own; a rank receives only its own dict)."""
    job = contract.rng(seed, "job")
    fail_rank, fail_step = job.randrange(world), job.randrange(1, STEPS - 1)
    # one shared base plus a distinct offset per rank: the numbers of batches (exercise 3) always
    # differ, else stopping at the shortest rank (an all-reduce MIN of the counts) would lose nothing
    base = job.randint(1, 3)
    batch_counts = [base + k for k in job.sample(range(world), world)]
    # exercise 8: the numbers of optimizer steps (micro-batches // ACCUM) always differ between ranks,
    # plus 0..ACCUM-1 surplus micro-batches: with equal step counts the unsynchronised loop would pass
    base = job.randint(1, 2)
    micro_counts = [ACCUM * (base + k) + job.randrange(ACCUM) for k in job.sample(range(world), world)]
    val = [round(job.uniform(0.0, 10.0), 4) for _ in range(VAL_SIZE)]
    out = []
    for r in range(world):
        g = contract.rng(seed, "rank", r)
        out.append({
            "loss": round(g.uniform(0.5, 9.5), 6),
            "val": [[i, val[i]] for i in range(r, VAL_SIZE, world)],
            "batches": [round(g.uniform(1.0, 50.0), 4) for _ in range(batch_counts[r])],
            "steps": [round(g.uniform(1.0, 20.0), 4) for _ in range(STEPS)],
            "fail_step": fail_step if r == fail_rank else None,
            "stats": {"loss": round(g.uniform(0.1, 5.0), 6), "correct": float(g.randint(1, 500))},
            "message": {"fill": round(g.uniform(-100.0, 100.0), 3),
                        "spots": [[g.randrange(MESSAGE_NUMEL), round(g.uniform(-1e3, 1e3), 2)] for _ in range(3)]},
            # the writer saves 1-3 earlier checkpoints first (each complete), then the real one; every
            # write pauses half-way: only a synchronisation after the write tells a reader it is done
            "checkpoint": ({"text": _checkpoint_text(g),
                            "earlier": [_checkpoint_text(g) for _ in range(g.randint(1, 3))],
                            "delay": round(g.uniform(0.4, 0.8), 2)} if r == 0 else None),
            "micro": [round(g.uniform(0.5, 8.0), 4) for _ in range(micro_counts[r])],
            "grad": [round(g.uniform(-5.0, 5.0), 4) for _ in range(GRAD_NUMEL)],
        })
    return out


def _mine(rank: int | None = None) -> dict:
    return contract.mine(make_inputs, rank)


# ------------------------------------------------------------------ 1. collective under a rank branch
def local_loss(rank: int | None = None) -> float:
    """This rank's loss in exercise 1 (a stand-in for a forward pass)."""
    return _mine(rank)["loss"]


# ------------------------------------------------------------------ 2. rank-0-only validation
def val_sample(i: int) -> float:
    """Validation sample ``i``; this rank holds the samples ``i`` with ``i % world_size == rank``."""
    held = dict((int(k), v) for k, v in _mine()["val"])
    if int(i) not in held:
        from dtrain_lab.i18n import LabError

        _, world = contract.rank_and_world()
        raise LabError("lab10_sample_elsewhere", i=i, owner=int(i) % world)
    return held[int(i)]


# ------------------------------------------------------------------ 3. uneven numbers of batches
def local_batches(rank: int | None = None) -> list[float]:
    """This rank's batches: their number differs from rank to rank."""
    return list(_mine(rank)["batches"])


# ------------------------------------------------------------------ 4. exception swallowed
def load_batch(rank: int | None, step: int) -> float:
    """This rank's batch of ``step``; on one rank one step raises (a corrupt sample)."""
    mine = _mine(rank)
    if mine["fail_step"] == step:
        r, _ = contract.rank_and_world()
        raise ValueError(f"corrupt batch at step {step} on rank {r}")
    return mine["steps"][step]


# ------------------------------------------------------------------ 5. collectives in different orders
def local_stats(rank: int | None = None) -> dict:
    return dict(_mine(rank)["stats"])


# ------------------------------------------------------------------ 6. blocking send/send
def my_message():
    """The 16 MiB tensor this rank sends to its peer."""
    import torch

    m = _mine()["message"]
    t = torch.full((MESSAGE_NUMEL,), float(m["fill"]))
    for i, v in m["spots"]:
        t[int(i)] = float(v)
    return t


# ------------------------------------------------------------------ 7. barrier inside if rank == 0
def _checkpoint_text(g) -> str:
    return f"step {g.randint(100, 999)} checkpoint {g.getrandbits(48):012x}"


def checkpoint_path() -> str:
    """Where rank 0 writes the checkpoint and the other ranks read it (a folder every rank sees)."""
    return os.path.join(contract.shared_dir(), CHECKPOINT_NAME)


def write_checkpoint(path: str) -> None:
    """Rank 0 only: write the checkpoint's text to ``path``. It is slow, as writing a real checkpoint
    is (the first half, a pause the grader chooses, the rest), and it first saves one to three
    earlier checkpoints to the same file: a reader that does not wait for it reads nothing, half of
    one, or an old one."""
    mine = _mine()
    if not mine.get("checkpoint"):
        from dtrain_lab.i18n import LabError

        raise LabError("lab10_writer_only")
    delay = float(mine["checkpoint"]["delay"])
    earlier = mine["checkpoint"].get("earlier", [])
    for i, text in enumerate([*earlier, mine["checkpoint"]["text"]]):
        with open(path, "w") as f:
            f.write(text[: len(text) // 2])
            f.flush()
            time.sleep(delay)
            f.write(text[len(text) // 2:])
        if i < len(earlier):
            time.sleep(delay)   # an earlier checkpoint stays complete for a while, as a real one would
    trace.mark(WRITTEN)


def watch_reads(rt=None) -> None:
    """The exercise's setup, in every rank: mark in the rank's trace each time it opens the
    checkpoint for reading (an audit hook sees ``open``, ``pathlib`` and ``os.open`` alike), so the
    grader can tell where, among its collectives, a reader read; not a matter of timing."""
    import sys

    target = os.path.normpath(os.path.abspath(checkpoint_path()))
    name = os.path.basename(target)

    def hook(event, args):
        if event != "open" or not args or isinstance(args[0], int):
            return
        mode, flags = (args[1], args[2]) if len(args) > 2 else (None, 0)
        reading = ("r" in mode and "+" not in mode) if isinstance(mode, str) \
            else (flags or 0) & os.O_ACCMODE == os.O_RDONLY
        try:
            given = os.fsdecode(args[0])
            path = os.path.normpath(os.path.abspath(given))
            real = os.path.realpath(given)
        except (TypeError, ValueError, OSError):
            return
        # a relative name opened against a folder descriptor (os.open(name, dir_fd=...)) or through a
        # link is the checkpoint too: the same file name, or the same file once links are resolved
        if reading and (path == target or real == target or os.path.basename(path) == name):
            trace.mark(READ)

    sys.addaudithook(hook)


# ------------------------------------------------------------------ 8. accumulation steps
def micro_batches(rank: int | None = None) -> list[float]:
    """This rank's micro-batch gradients: their number differs from rank to rank."""
    return list(_mine(rank)["micro"])


# ------------------------------------------------------------------ 9. hierarchical all-reduce
def node_ranks(world_size: int) -> list[list[int]]:
    """The ranks of each "node": ``RANKS_PER_NODE`` consecutive ranks, the last node possibly smaller
    (``[[0, 1], [2]]`` for 3 ranks). The first rank of a node is its leader."""
    return [list(range(s, min(s + RANKS_PER_NODE, world_size))) for s in range(0, world_size, RANKS_PER_NODE)]


def local_gradient():
    """This rank's gradient (float64) for exercise 9."""
    import torch

    return torch.tensor(_mine()["grad"], dtype=torch.float64)
