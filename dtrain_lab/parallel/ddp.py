"""Data parallelism from scratch: what ``torch.nn.parallel.DistributedDataParallel`` does, in Python.

Every rank holds a full copy of the model and trains on its own shard of the global batch. After
``loss.backward()`` each rank's gradient is the gradient of *its* shard's loss; the average of the
ranks' gradients is the gradient of the global batch's loss (equal shards, mean losses). So one
all-reduce of the gradients per step makes every rank take the same optimizer step, and the
replicas stay identical without ever exchanging parameters again.

The design follows the PyTorch DDP paper — S. Li, Y. Zhao, R. Varma, et al., "PyTorch Distributed:
Experiences on Accelerating Data Parallel Training", PVLDB 13(12), 2020 (VLDB 2020),
arXiv:2006.15704:

1. **Same start** (paper §3.1). At construction rank 0 broadcasts its parameters and buffers, so the
   replicas start equal even if the ranks were seeded differently.
2. **Gradient bucketing** (§3.2.2, §5.2). One all-reduce per parameter pays the per-message latency
   α once per tensor (see :mod:`dtrain_lab.perfmodel`: ``t = α + n·β``); small tensors waste the
   link. Parameters are grouped into *buckets* of about ``bucket_cap_mb`` MB, in **reverse
   registration order** (gradients of the last layers are ready first in backward), and each
   bucket is flattened into one contiguous buffer reduced by *one* all-reduce.
3. **Overlap of communication with computation** (§3.2.3). A hook on each parameter
   (``Tensor.register_post_accumulate_grad_hook``) fires the moment its gradient has been
   accumulated; it copies the gradient (already divided by the world size) into the bucket, and
   the moment a bucket is full of ready gradients its all-reduce is launched **asynchronously**
   (``dist.all_reduce(..., async_op=True)``) while backward goes on computing the gradients of
   earlier layers. Buckets are launched in bucket order on every rank — collectives must be issued
   in the same order everywhere. The first hook of a backward queues a callback on the autograd
   engine (``Variable._execution_engine.queue_callback``, what PyTorch's reducer does) that runs
   when backward ends: it waits for every bucket and copies the averaged gradients back into
   ``param.grad``. So gradients are synchronised when ``loss.backward()`` returns; nothing else to
   call.
4. **Gradient accumulation** (§3.2.4): inside ``with ddp.no_sync():`` the hooks do nothing and the
   gradients accumulate locally; the first backward outside (of a forward outside) synchronises the
   accumulated gradients.
5. **Unused parameters** (§3.2.3). A parameter that takes no part in this step's loss gets no
   gradient and its hook never fires: its bucket would never be complete. With
   ``find_unused_parameters=False`` (the default) this is an error, raised at the end of backward
   with an explanation (PyTorch raises its "Expected to have finished reduction in the prior
   iteration before starting a new one" at the next forward instead). With ``True`` each forward
   walks the autograd graph from the outputs to find the parameters it does not reach; they are
   marked ready (zero gradient) at the first hook of backward, so buckets complete and overlap is
   kept; and a used-map (one int per parameter) is all-reduced so that a parameter unused on
   *every* rank keeps its ``.grad`` untouched, as in PyTorch. **This costs** a traversal of the
   whole graph every iteration plus one extra all-reduce: enable it only when the model needs it.

6. **Communication hooks** (:meth:`DDP.register_comm_hook`, PyTorch's API): ``hook(state, bucket)``
   replaces the all-reduce of each bucket and returns a future of the averaged bucket. As in PyTorch
   the bucket then holds the gradients *not* divided by the world size (the hook divides), and
   ``bucket`` offers ``buffer()``, ``gradients()``, ``parameters()``, ``index()``, ``is_last()``, so
   hooks written for PyTorch (``default_hooks``, ``powerSGD_hook``) and :mod:`dtrain_lab.parallel.compression`
   run on either wrapper.

What is left out compared with PyTorch: bucket rebuilding in gradient-ready order after the first
iteration, the small first bucket (``first_bucket_cap_mb``), ``gradient_as_bucket_view``,
``static_graph``, sparse gradients, join for uneven inputs, mixed devices in
one bucket, and the C++ thread safety. Tied weights (one ``Parameter`` registered twice) are
reduced once: ``module.parameters()`` yields it once and autograd accumulates both uses before its
hook fires. Frozen parameters (``requires_grad=False``) are broadcast at start and never reduced.

On a world of one (no process group, or a group of size 1) :class:`DDP` is the plain module.

**Events** (what lesson 02 draws): set ``ddp.on_event`` to a function and it is called with a dict for
each thing a synchronised backward does, in the order it does them: ``ready`` (a parameter's gradient
is ready: ``param``, ``bucket``), ``launch`` (a bucket's all-reduce is issued), ``backward_end``
(the autograd engine ran the final callback), ``wait`` (the callback has waited for a bucket), and
``done`` (a bucket's all-reduce completed: from the communication thread, so its place among the others
depends on timing). The function may add the time; this module measures nothing.

Every collective goes through :class:`dtrain_lab.comm.counted.Comm`, which counts it:
:meth:`DDP.stats` reports the collectives issued, the bytes all-reduced in the last synchronised step,
the buckets launched while backward was still running, … The buckets, the view of a bucket a hook
gets, the graph walk of ``find_unused_parameters`` and the one-all-reduce-per-parameter baseline
(:func:`naive_allreduce_grads`) are in :mod:`dtrain_lab.parallel.ddp_parts`.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from dtrain_lab.comm import groups
from dtrain_lab.comm.counted import Comm
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.ddp_parts import (MB, Bucket, HookBucket, broadcast_coalesced, naive_allreduce_grads,
                                           params_reached)

__all__ = ["DDP", "DDPError", "HookBucket", "naive_allreduce_grads", "params_reached", "MB"]

class DDPError(LabError, RuntimeError):
    """An error of :class:`DDP` in training (a ``RuntimeError``, as PyTorch's), bilingual: the
    learner's language first. Keys: ``ddp_unused_params``, ``ddp_ready_twice``, ``ddp_not_in_group``,
    ``ddp_model_mismatch``, ``ddp_hook_twice``, ``ddp_hook_late``."""


# ------------------------------------------------------------------------------------ the wrapper
class DDP(nn.Module):
    """Data-parallel wrapper with bucketed, overlapped gradient all-reduce (see the module docstring).

    ``DDP(module, *, process_group=None, bucket_cap_mb=25.0, overlap=True,
    find_unused_parameters=False, broadcast_buffers=True)``

    * ``process_group``: the group of replicas (default ``None``: the whole world).
    * ``bucket_cap_mb``: a bucket is closed once it holds at least this many MiB of gradients
      (PyTorch's rule; a larger parameter gets a bucket of its own).
    * ``overlap``: launch each bucket's all-reduce from the gradient hooks while backward runs
      (True), or reduce every bucket after backward (False) — same buckets, same results, no overlap.
    * ``find_unused_parameters``: see the module docstring; costs a graph traversal per forward
      and one extra all-reduce per step, like PyTorch's.
    * ``broadcast_buffers``: broadcast rank 0's buffers (e.g. BatchNorm statistics) before a forward
      that follows a synchronised training forward (and before the first), as PyTorch does by
      default; no collective for a module without buffers.

    Use it as PyTorch's: ``loss = loss_fn(ddp(x), y); loss.backward(); opt.step()``. The optimizer may
    be built on ``ddp.parameters()`` or ``ddp.module.parameters()`` (the same tensors).
    """

    def __init__(self, module: nn.Module, *, process_group: Group = None, bucket_cap_mb: float = 25.0,
                 overlap: bool = True, find_unused_parameters: bool = False, broadcast_buffers: bool = True):
        super().__init__()
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
            raise LabError("ddp_bad_bucket_cap", value=bucket_cap_mb)
        self.module = module
        self.process_group = process_group
        self.bucket_cap_mb = float(bucket_cap_mb)
        self.overlap = bool(overlap)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.broadcast_buffers = bool(broadcast_buffers)
        self._require_forward_param_sync = True
        self.require_backward_grad_sync = True
        if not groups.is_member(process_group):
            raise DDPError("ddp_not_in_group", rank=dist.get_rank())
        self._comm = Comm(process_group)       # every collective of this wrapper, counted
        self.rank, self.world_size = self._comm.rank, self._comm.size
        self.distributed = self.world_size > 1

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]  # tied: listed once
        self.param_names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._buffer_list = list(module.buffers())
        # small bookkeeping tensors travel on the parameters' device (NCCL reduces CUDA tensors only)
        first = next(iter(module.parameters()), None)
        self._device = first.device if first is not None else torch.device("cpu")
        self.buckets: list[Bucket] = []
        self._locator: list[tuple[int, int]] = []
        self._hook_handles: list[Any] = []
        self._comm_hook: tuple[Any, Any] | None = None
        self.on_event: Any = None              # called with each event of a backward (module docstring)
        # counters (the rest are read from self._comm)
        self.init_collectives = 0
        self.sync_steps = 0
        self.last_step: dict[str, Any] = {"collectives": 0, "bytes": 0, "launched_in_backward": 0,
                                          "globally_unused": [], "hook_calls": 0}
        if not self.distributed:
            return
        self._check_same_model()
        broadcast_coalesced([p for p in module.parameters()] + self._buffer_list, self._comm)
        self.init_collectives = self._comm.total("calls")
        self._build_buckets()
        self._register_hooks()
        n = len(self._params)
        self._locally_used = torch.zeros(n, dtype=torch.int32, device=self._device)
        self._reset_iteration()

    # ---------------------------------------------------------------- construction
    def _check_same_model(self) -> None:
        sig = 0
        for i, p in enumerate(self._params):
            for d in p.shape:
                sig = (sig * 1_000_003 + d + i) % (2 ** 61 - 1)
        mine = torch.tensor([len(self._params), sum(p.numel() for p in self._params), sig], dtype=torch.int64,
                            device=self._device)
        every = self._comm.all_gather_list(mine)
        if any(not torch.equal(every[0], t) for t in every):
            raise DDPError("ddp_model_mismatch", detail=[t.cpu().tolist() for t in every])

    def _build_buckets(self) -> None:
        cap = self.bucket_cap_mb * MB
        order = list(reversed(range(len(self._params))))  # gradients of the last layers come first
        open_: dict[tuple, list] = {}
        groups: list[list[int]] = []
        for i in order:
            p = self._params[i]
            key = (p.dtype, p.device)  # one dtype and device per flat buffer
            cur = open_.setdefault(key, [[], 0])
            cur[0].append(i)
            cur[1] += p.numel() * p.element_size()
            if cur[1] >= cap:
                groups.append(cur[0])
                del open_[key]
        groups.extend(cur[0] for cur in open_.values() if cur[0])
        position = {i: k for k, i in enumerate(order)}
        groups.sort(key=lambda g: position[g[0]])
        self._locator = [(-1, -1)] * len(self._params)
        for b, idx in enumerate(groups):
            numels = [self._params[i].numel() for i in idx]
            offsets = [sum(numels[:k]) for k in range(len(idx))]
            p0 = self._params[idx[0]]
            buf = torch.zeros(sum(numels), dtype=p0.dtype, device=p0.device)
            self.buckets.append(Bucket(index=b, params=idx, offsets=offsets, numels=numels, buffer=buf,
                                       names=[self.param_names[i] for i in idx]))
            for k, i in enumerate(idx):
                self._locator[i] = (b, k)

    def _register_hooks(self) -> None:
        me = weakref.ref(self)  # the parameters must not keep the wrapper alive

        def make(i: int):
            def hook(_param: torch.Tensor) -> None:
                ddp = me()
                if ddp is not None:
                    ddp._on_grad_ready(i)
            return hook

        for i, p in enumerate(self._params):
            self._hook_handles.append(p.register_post_accumulate_grad_hook(make(i)))

    def register_comm_hook(self, state: Any, hook) -> None:
        """Replace each bucket's all-reduce by ``hook(state, bucket) -> torch.futures.Future[Tensor]``
        (PyTorch's signature, see the module docstring). Once, before the first backward. The hook's
        state counts its own bytes: :meth:`stats` then reports hook calls, not bytes."""
        if self._comm_hook is not None:
            raise DDPError("ddp_hook_twice")
        if self.sync_steps:
            raise DDPError("ddp_hook_late")
        self._comm_hook = (state, hook)

    def remove_hooks(self) -> None:
        """Detach the gradient hooks from the parameters (to reuse the module without this wrapper)."""
        for h in self._hook_handles:
            h.remove()
        self._hook_handles.clear()

    # ---------------------------------------------------------------- per iteration
    def _reset_iteration(self) -> None:
        self._expect_hooks = False      # set by a forward that will need a synchronised backward
        self._callback_queued = False
        self._unused_marked = False
        self._in_finalize = False
        self._used_in_graph: set[int] = set()
        self._ready = [False] * len(self._params)
        self._next_bucket = 0
        self._step_start = self._comm.counts()   # this step's collectives: counted from here
        self._step_launched_in_backward = 0
        self._step_hook_calls = 0
        for b in self.buckets:
            b.pending = len(b.params)
            b.work = None
            b.launched_in_backward = False

    def forward(self, *args, **kwargs):
        if not self.distributed:
            return self.module(*args, **kwargs)
        # As PyTorch's DDP (``require_forward_param_sync``): buffers are broadcast before a forward
        # only if the previous forward was a synchronised training forward (grad enabled, outside
        # no_sync). The first forward always broadcasts; eval / no_grad forwards do not make the
        # next one broadcast, so a rank-0-only evaluation under no_grad issues no collective.
        if self.broadcast_buffers and self._buffer_list and self._require_forward_param_sync:
            broadcast_coalesced(self._buffer_list, self._comm)
        out = self.module(*args, **kwargs)
        self._require_forward_param_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self._expect_hooks = True
            if self.find_unused_parameters:  # the traversal find_unused_parameters costs
                self._used_in_graph |= params_reached(out, self._index)
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: forwards and backwards inside accumulate gradients locally, with no
        communication; the next forward+backward outside synchronises the accumulated sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # ---------------------------------------------------------------- hooks
    def _on_grad_ready(self, i: int) -> None:
        p = self._params[i]
        if p.grad is not None:
            self._locally_used[i] = 1  # also inside no_sync: used since the last synchronisation
        if not self._expect_hooks:
            return  # no_sync, or a backward not preceded by a forward through this wrapper
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize_backward)
            if self.find_unused_parameters and not self._unused_marked:
                self._unused_marked = True
                for j in range(len(self._params)):
                    if j != i and j not in self._used_in_graph and not self._ready[j]:
                        self._mark_ready(j)
        if self._ready[i]:
            raise DDPError("ddp_ready_twice", name=self.param_names[i])
        self._mark_ready(i)

    def _copy_into_bucket(self, i: int) -> None:
        b, k = self._locator[i]
        bucket = self.buckets[b]
        view = bucket.buffer[bucket.offsets[k]:bucket.offsets[k] + bucket.numels[k]]
        g = self._params[i].grad
        if g is None:  # unused (find_unused_parameters=True): contributes zeros
            view.zero_()
        elif self._comm_hook is not None:  # a comm hook gets the local gradient and divides itself
            view.copy_(g.detach().reshape(-1))
        else:  # divide while copying, like PyTorch's reducer: sum of grad/world = average
            torch.mul(g.detach().reshape(-1), 1.0 / self.world_size, out=view)

    def _event(self, event: str, **fields) -> None:
        if self.on_event is not None:
            self.on_event({"event": event, **fields})

    def _mark_ready(self, i: int) -> None:
        self._ready[i] = True
        bucket = self.buckets[self._locator[i][0]]
        bucket.pending -= 1
        self._event("ready", param=self.param_names[i], bucket=bucket.index)
        if self.overlap:
            self._copy_into_bucket(i)
            if bucket.pending == 0:
                self._launch_ready_buckets()

    def _launch_ready_buckets(self) -> None:
        # In bucket order only: every rank must issue its collectives in the same order.
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].pending == 0:
            bucket = self.buckets[self._next_bucket]
            if self._comm_hook is None:
                bucket.work = self._comm.all_reduce(bucket.buffer, async_op=True)
            else:
                state, hook = self._comm_hook
                bucket.work = hook(state, HookBucket(bucket, [self._params[i] for i in bucket.params],
                                                     len(self.buckets)))
                self._step_hook_calls += 1
            bucket.launched_in_backward = not self._in_finalize
            if self.on_event is not None:
                self._event("launch", bucket=bucket.index)
                future = bucket.work.get_future() if hasattr(bucket.work, "get_future") else bucket.work
                future.add_done_callback(lambda _f, b=bucket.index, tell=self.on_event: tell({"event": "done", "bucket": b}))
            self._step_launched_in_backward += bucket.launched_in_backward
            self._next_bucket += 1

    def _finalize_backward(self) -> None:
        """Runs on the autograd engine when backward ends: wait for every bucket, write the averaged
        gradients back into ``param.grad``."""
        self._in_finalize = True
        self._event("backward_end")
        try:
            if self.find_unused_parameters:  # parameters in the graph whose hook did not fire
                for j in range(len(self._params)):
                    if not self._ready[j]:
                        self._mark_ready(j)
            missing = [j for j in range(len(self._params)) if not self._ready[j]]
            if missing:
                for b in self.buckets:  # launched ones were launched on every rank: let them finish
                    if b.work is not None:
                        b.work.wait()
                raise DDPError("ddp_unused_params", rank=self.rank, count=len(missing),
                               names=", ".join(self.param_names[j] for j in missing),
                               buckets=sorted({self._locator[j][0] for j in missing}))
            if not self.overlap:
                for j in range(len(self._params)):
                    self._copy_into_bucket(j)
            self._launch_ready_buckets()
            used_work = used = None
            if self.find_unused_parameters:
                used = self._locally_used.clone()
                used_work = self._comm.all_reduce(used, async_op=True)
            for b in self.buckets:
                result = b.work.wait()
                self._event("wait", bucket=b.index)
                if self._comm_hook is not None and result is not b.buffer:  # a hook's future: the average
                    b.buffer.copy_(result)
            if used_work is not None:
                used_work.wait()
                used = used.cpu()
            unused: list[str] = []
            with torch.no_grad():
                for b in self.buckets:
                    for k, i in enumerate(b.params):
                        p = self._params[i]
                        if used is not None and int(used[i]) == 0:
                            unused.append(self.param_names[i])
                            continue  # unused on every rank: .grad untouched, as in PyTorch
                        avg = b.buffer[b.offsets[k]:b.offsets[k] + b.numels[k]].view_as(p)
                        if p.grad is None:  # used elsewhere, not here: gets the average too
                            p.grad = avg.clone()
                        else:
                            p.grad.copy_(avg)
            self._locally_used.zero_()
            self.sync_steps += 1
            step = self._comm.since(self._step_start)
            self.last_step = {"collectives": step["calls"]["all_reduce"], "bytes": step["payload"]["all_reduce"],
                              "launched_in_backward": self._step_launched_in_backward,
                              "globally_unused": unused, "hook_calls": self._step_hook_calls}
        finally:
            self._reset_iteration()

    # ---------------------------------------------------------------- introspection
    @property
    def total_collectives(self) -> int:
        """Collectives issued since construction (buffer broadcasts and gradient all-reduces)."""
        return int(self._comm.total("calls")) - self.init_collectives

    @property
    def total_bytes(self) -> int:
        """Bytes all-reduced (the payload passed in) since construction."""
        return int(self._comm.payload["all_reduce"])

    def stats(self) -> dict:
        """Counters: buckets and their sizes, collectives issued (construction, total, last step),
        bytes all-reduced (total, last step), buckets launched while backward still ran."""
        return {
            "world_size": self.world_size,
            "num_params": len(self._params),
            "num_buckets": len(self.buckets),
            "bucket_numels": [b.buffer.numel() for b in self.buckets],
            "bucket_params": [list(b.names) for b in self.buckets],
            "init_collectives": self.init_collectives,
            "total_collectives": self.total_collectives,
            "total_bytes": self.total_bytes,
            "sync_steps": self.sync_steps,
            "step_collectives": self.last_step["collectives"],
            "step_bytes": self.last_step["bytes"],
            "launched_in_backward": self.last_step["launched_in_backward"],
            "globally_unused": list(self.last_step["globally_unused"]),
            "hook_calls": self.last_step["hook_calls"],
        }

    def extra_repr(self) -> str:
        return (f"world_size={self.world_size}, buckets={len(self.buckets)}, bucket_cap_mb={self.bucket_cap_mb:g}, "
                f"overlap={self.overlap}, find_unused_parameters={self.find_unused_parameters}")
