"""The contract API: all a submission may import from the grader, inside its sandbox.

A lab's contract module (``dtrain_lab.grading.lab10``, ...) holds what the learner's code
needs and nothing that judges it: constants, the lab's model and data, the drivers that call the
learner's function, and the **private inputs** of this rank. The checks, the references and any
hidden check live in ``dtrain_lab.grading.checks``, which is an empty folder inside the sandbox.

Private inputs. For every graded run the grader draws a seed no rank ever sees, computes every
rank's inputs from it with the lab's ``make_inputs(seed, world_size)`` (public: the rule is no secret,
the seed is), and hands each rank only its own part, in a file only that rank's sandbox contains.
:func:`mine` returns it. A rank that wants another rank's data has to communicate: an answer computed
without the required collectives is wrong, whatever the submission recomputes locally.

Outside the grader (a learner trying a function in a notebook or under ``dtrain_lab.launch``) there
is no such file, and :func:`mine` returns the inputs of a fixed public seed instead (:data:`PRACTICE_SEED`).
"""
from __future__ import annotations

import hashlib
import os
import random

PRACTICE_SEED = 0
_cache: dict = {}


def graded() -> bool:
    """True inside a graded run (the grader handed this rank its private inputs)."""
    return bool(os.environ.get("DTRAIN_GRADE_INPUTS"))


def rank_and_world() -> tuple[int, int]:
    """This process's rank and world size: from torch.distributed when it is up, else (0, 1)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", 0) or 0), int(os.environ.get("WORLD_SIZE", 1) or 1)


def mine(make_inputs, rank: int | None = None) -> dict:
    """This rank's private inputs (a dict). ``rank``, if given, must be this rank: another rank's
    inputs are not here, by design (raises a bilingual LabError saying so)."""
    own, world = rank_and_world()
    if rank is not None and int(rank) != own:
        from dtrain_lab.i18n import LabError

        raise LabError("grade_other_rank", rank=rank, mine=own)
    path = os.environ.get("DTRAIN_GRADE_INPUTS")
    key = (path, own, world, make_inputs)
    if key not in _cache:
        if path:
            from dtrain_lab.grading import channel

            value = channel.read(path)
            _cache[key] = value if isinstance(value, dict) else {}
        else:
            _cache[key] = make_inputs(PRACTICE_SEED, world)[own]
    return _cache[key]


def rng(seed: int, label: str, rank: int | None = None) -> random.Random:
    """A random stream of its own for (seed, label, rank): knowing one rank's values tells nothing
    about another's, nor about the seed."""
    digest = hashlib.sha256(f"{seed}:{label}:{rank}".encode()).digest()
    return random.Random(int.from_bytes(digest[:16], "little"))


def torch_generator(seed: int, label: str, rank: int | None = None):
    """A ``torch.Generator`` seeded like :func:`rng`."""
    import torch

    return torch.Generator().manual_seed(rng(seed, label, rank).getrandbits(63))


def shared_dir() -> str:
    """A folder every rank of the job sees (``/shared`` in the sandbox): where one rank writes a file
    another reads. Outside the grader, the system's temporary folder."""
    import tempfile

    return os.environ.get("DTRAIN_GRADE_SHARED") or tempfile.gettempdir()


def attempt() -> int:
    """Which attempt of a restarted job this is (0, then 1 after a restart)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
