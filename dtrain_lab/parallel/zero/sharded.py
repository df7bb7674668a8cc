"""ZeRO stages 1 and 2: :class:`ShardedOptimizer`, a ``torch.optim.Optimizer`` around any optimizer."""
from __future__ import annotations

from typing import Iterable

import torch

from dtrain_lab.comm import groups
from dtrain_lab.comm.counted import Comm
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.zero import flat as F
from dtrain_lab.parallel.zero.buckets import BucketReducer


class ShardedOptimizer(F.CommCounts, torch.optim.Optimizer):
    """ZeRO stage 1 or 2 around any ``torch.optim`` optimizer (Adam, AdamW, SGD, …).

    ``ShardedOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-3)`` (parameter groups as
    dicts work too); then per step ``loss.backward(); opt.clip_grad_norm_(1.0)`` (optional)
    ``; opt.step(); opt.zero_grad()``. Do not wrap the model in DDP: this class averages the gradients
    itself. Every rank must start from the same parameters (same seed). It is a real
    ``torch.optim.Optimizer``: ``param_groups`` (an LR scheduler changes ``lr`` there and the next step
    uses it), ``state_dict()`` / ``load_state_dict()`` (this rank's shard), step hooks.

    ``step()``:

    1. **reduce** (:meth:`reduce_gradients`, also called by :meth:`clip_grad_norm_`). Stage 1:
       ``all_reduce`` the flat gradient (every rank gets the full average) and keep the full ``p.grad``,
       as PyTorch's DDP + ``ZeroRedundancyOptimizer`` do: 2(N-1)/N·Ψ. ``grad_reduce="reduce_scatter"``
       gives the paper's stage 1 instead: a reduce-scatter ((N-1)/N·Ψ) averages only this rank's slice,
       the full local gradient buffer is kept all the same (``p.grad`` then holds the *local*, not the
       averaged, gradient); stages 1 and 2 then send the same 2(N-1)/N·Ψ per step.
       Stage 2: a reduce-scatter — each rank receives only the average of *its* slice — then
       ``p.grad = None`` frees the full gradients. By default this happens in ``step()``, after
       backward, so the *peak* still holds every full gradient (plus the flat copy being reduced) for
       a moment; what stage 2 saves is the gradient memory kept from then on (the update, the next
       forward). With ``reduce_in_backward=True`` (stage 2 only) the gradients are reduced *during*
       backward instead, bucket by bucket, as DeepSpeed does (:mod:`~dtrain_lab.parallel.zero.buckets`):
       at most about one bucket of full gradients is alive at a time (``peak_grad_numel``).
    2. **update**: the wrapped optimizer, built over this rank's slice only (cut into one tensor per
       parameter it overlaps, :class:`~dtrain_lab.parallel.zero.flat.FlatShard`), updates it — fp32
       master for bf16/fp16 parameters, cast back afterwards. A parameter without a gradient this step
       (frozen, or unused) gets ``grad = None`` on its pieces and is skipped, as ``torch.optim`` skips
       it: no weight decay, no momentum, Adam's step count unchanged. Every rank must produce gradients
       for the same parameters (the same rule as FSDP2's: same model, same control flow).
    3. **all-gather** the flat parameter buffer so that every rank has every parameter again. PyTorch's
       ``ZeroRedundancyOptimizer`` instead gives each rank whole parameters (greedily: largest first,
       to the least-loaded rank — so its shards are uneven) and lets each owner ``broadcast`` its
       updated parameters; same result, no flat buffer needed.

    ``peak_grad_numel`` — the most ``p.grad`` elements alive at once (the temporary flat copy not
    counted): all P without ``reduce_in_backward``, about one bucket with it.

    ``state_bytes()`` — bytes of the tensors this rank keeps for the step (padding included):
    ``params`` the flat buffer (full, stages 1/2); ``grads`` the gradients alive when the update runs
    (stage 1: the full ``p.grad``; stage 2: this rank's shard); ``optimizer`` the fp32 master slice
    (only for bf16/fp16 params) plus every per-element state tensor (Adam: m and v of the real elements
    of the slice; the padding has none).
    """

    def __init__(self, params: Iterable, optimizer_class, *, stage: int = 1, process_group: Group = None,
                 grad_reduce: str | None = None, reduce_in_backward: bool = False, bucket_numel: int = 2 ** 20,
                 **defaults):
        if stage not in (1, 2):
            raise LabError("zero_opt_bad_stage", stage=stage)
        grad_reduce = grad_reduce or ("all_reduce" if stage == 1 else "reduce_scatter")
        if grad_reduce not in ("all_reduce", "reduce_scatter") or (stage == 2 and grad_reduce != "reduce_scatter"):
            raise LabError("zero_opt_bad_grad_reduce", value=grad_reduce, stage=stage)
        if reduce_in_backward and stage != 2:
            raise LabError("zero_opt_backward_stage2")
        if not isinstance(bucket_numel, int) or bucket_numel < 1:
            raise LabError("zero_opt_bad_bucket", value=bucket_numel)
        params = list(params)
        if not params:
            raise LabError("zero_opt_bad_params", what="ShardedOptimizer")
        self.flat = None
        super().__init__(params, defaults)          # param_groups over the full parameters
        self.stage, self.grad_reduce = stage, grad_reduce
        self.params = F.check_params([p for g in self.param_groups for p in g["params"]], "ShardedOptimizer")
        self.rank, self.world_size = F.group_rank_size(process_group)
        self._comm = Comm(process_group)
        self.flat = F.FlatShard(self.params, self.rank, self.world_size, keep_full=True)
        group_of = {id(p): k for k, g in enumerate(self.param_groups) for p in g["params"]}
        local = []
        for k, g in enumerate(self.param_groups):
            pieces = [pp for (i, _, _), pp in zip(self.flat.pieces, self.flat.piece_params)
                      if group_of[id(self.params[i])] == k]
            local.append({**{key: v for key, v in g.items() if key != "params"}, "params": pieces})
        self.optimizer = optimizer_class(local, **defaults)
        for g, lg in zip(self.param_groups, self.optimizer.param_groups):
            for key, v in lg.items():           # show the wrapped optimizer's defaults (betas, eps, …)
                if key != "params":
                    g.setdefault(key, v)
        self.state = self.optimizer.state       # per piece of this rank's slice
        self._synced = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        self._reduced = False
        self._grad_bytes = 0
        self._full_grad: torch.Tensor | None = None
        self.peak_grad_numel = 0                # the most p.grad elements alive at once
        self.reduce_in_backward = reduce_in_backward
        self._buckets = BucketReducer(self, bucket_numel) if reduce_in_backward else None

    def add_param_group(self, param_group: dict) -> None:
        """Only while constructing: the flat buffer cannot grow afterwards."""
        if self.flat is not None:
            raise LabError("zero_opt_add_group")
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise LabError("zero_opt_bad_params", what="ShardedOptimizer")
        ps = param_group["params"]
        ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
        tensors = [p[1] if isinstance(p, tuple) and len(p) == 2 else p for p in ps]
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise LabError("zero_opt_bad_params", what="ShardedOptimizer")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(t) for t in tensors}) != len(tensors) or seen & {id(t) for t in tensors}:
            raise LabError("zero_opt_shared_params", what="ShardedOptimizer")
        super().add_param_group({**param_group, "params": ps})

    # -- properties the lessons read
    @property
    def shard_numel(self) -> int:
        return self.flat.shard_numel

    @property
    def master(self) -> torch.Tensor:
        """The slice the wrapped optimizer updates (this rank's, fp32 for bf16/fp16 params)."""
        return self.flat.master

    @property
    def live_grad_numel(self) -> int:
        return self._buckets.live if self._buckets else 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        self.flat.clear_grads()
        self._full_grad = None
        self._reduced = False

    def reduce_gradients(self) -> None:
        """Average the gradients across ranks (once per step; see the class docstring)."""
        if self._reduced:
            return
        flat = self.flat
        if self._buckets is not None:           # done bucket by bucket during backward already
            if flat.grad is None:
                flat.grad = torch.zeros(flat.shard_numel, dtype=flat.dtype, device=flat.device)
            self._grad_bytes = groups.nbytes(flat.grad)
            self._reduced = True
            return
        live = sum(p.grad.numel() for p in self.params if p.grad is not None)
        self.peak_grad_numel = max(self.peak_grad_numel, live)
        grads = flat.flat_grads()                   # frees each p.grad once copied
        lo, hi = self.rank * flat.shard_numel, (self.rank + 1) * flat.shard_numel
        n = self.world_size
        if self.stage == 1 and self.grad_reduce == "reduce_scatter":
            # the paper's P_os: only this rank's slice is averaged; the full (local) gradient buffer
            # is kept all the same: that memory is what stage 2 gives up
            shard = torch.empty(flat.shard_numel, dtype=flat.dtype, device=flat.device)
            self._comm.reduce_scatter(shard, grads.div(n) if n > 1 else grads)
            self._full_grad = grads
            flat.grad = shard
            self._point_grads_at(grads)
            self._grad_bytes = groups.nbytes(grads)
        elif self.stage == 1:
            grads.div_(n)                       # divide first (no overflow in fp16), as DDP does
            self._comm.all_reduce(grads)
            self._full_grad = grads             # the full averaged gradient stays alive (stage 1)
            flat.grad = grads[lo:hi]            # this rank's slice of it: a view
            self._point_grads_at(grads)         # p.grad: views of the averaged gradient
            self._grad_bytes = groups.nbytes(grads)
        else:
            shard = torch.empty(flat.shard_numel, dtype=flat.dtype, device=flat.device)
            self._comm.reduce_scatter(shard, grads.div_(n))
            del grads                           # stage 2: no full gradient is kept
            flat.grad = shard
            self._grad_bytes = groups.nbytes(shard)
        self._reduced = True

    def _point_grads_at(self, grads: torch.Tensor) -> None:
        for i, (p, off) in enumerate(zip(self.params, self.flat.offsets)):
            if self.flat.had_grad[i]:
                p.grad = grads[off:off + p.numel()].view_as(p)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the *whole* averaged gradient; returns that norm (same as
        ``torch.nn.utils.clip_grad_norm_`` on the full gradient). Each rank squares and sums its shard,
        one all-reduce adds the N partial sums, the square root is the global norm."""
        self.reduce_gradients()
        total = F.global_norm(self._comm, [self.flat.grad])
        F.clip_([self._full_grad if self.stage == 1 else self.flat.grad], total, max_norm)
        return total

    def _sync_hyperparameters(self) -> None:
        """Schedulers and users change ``param_groups`` (or, by mistake, the wrapped optimizer's
        groups): whichever side changed a value since the last step wins, and both then agree."""
        for g, lg, last in zip(self.param_groups, self.optimizer.param_groups, self._synced):
            for k in set(g) | set(lg):
                if k == "params":
                    continue
                if k in lg and k in last and lg[k] != last[k] and g.get(k) == last[k]:
                    g[k] = lg[k]                # changed on the wrapped optimizer only
                elif k in g:
                    lg[k] = g[k]
                last[k] = g.get(k, lg.get(k))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        self._sync_hyperparameters()
        self.flat.load_piece_grads()
        self.optimizer.step()
        self.flat.copy_master_to_shard()
        flat = self.flat
        self._comm.all_gather(flat.full, flat.shard.clone())   # shard is a view of full: send a copy
        self._reduced = False
        return loss

    def state_bytes(self) -> dict[str, int]:
        return {"params": groups.nbytes(self.flat.full), "grads": self._grad_bytes,
                "optimizer": F.optimizer_bytes(self.optimizer, [self.flat])}

    def optimizer_state_numel(self) -> int:
        """Elements of per-element optimizer state on this rank (Adam: 2 per real element of the slice)."""
        return F.optimizer_state_numel(self.optimizer, [self.flat])

    def state_dict(self) -> dict:
        """This rank's shard: the wrapped optimizer's state of this rank's pieces, the hyperparameters of
        every group (``param_groups``, as ``torch.optim`` saves them) and, for bf16/fp16 parameters, the
        fp32 master slice. Save one per rank; load it on the same rank of the same world size."""
        groups_out = []
        index = {id(p): i for i, p in enumerate(self.params)}
        for g in self.param_groups:
            groups_out.append({**{k: v for k, v in g.items() if k != "params"},
                               "params": [index[id(p)] for p in g["params"]]})
        low = self.flat.master.data_ptr() != self.flat.shard.data_ptr()
        return {"state": self.optimizer.state_dict()["state"], "param_groups": groups_out,
                "zero": {"stage": self.stage, "rank": self.rank, "world_size": self.world_size,
                         "numel": self.flat.numel, "master": self.flat.master.clone() if low else None}}

    def load_state_dict(self, state_dict: dict) -> None:
        z = state_dict.get("zero", {})
        saved = (z.get("rank"), z.get("world_size"), z.get("numel"))
        if saved != (self.rank, self.world_size, self.flat.numel) or \
                len(state_dict.get("param_groups", [])) != len(self.param_groups):
            raise LabError("zero_opt_state_mismatch", saved=saved, now=(self.rank, self.world_size, self.flat.numel))
        for g, s in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in s.items() if k != "params"})
        F.load_optimizer_state(self.optimizer, state_dict["state"], self.param_groups)
        self.state = self.optimizer.state
        self._synced = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        if z.get("master") is not None:         # bf16/fp16: the fp32 master carries the precision
            with torch.no_grad():
                self.flat.master.copy_(z["master"])
            self.flat.copy_master_to_shard()
            self._comm.all_gather(self.flat.full, self.flat.shard.clone())


def clip_grad_norm_per_shard_WRONG(optimizer: ShardedOptimizer, max_norm: float) -> torch.Tensor:
    """The classic ZeRO bug: clip each rank's gradient shard by *its own* norm. Every shard ends up
    with norm <= max_norm, so the whole gradient can have norm up to sqrt(N)·max_norm, and the
    direction changes (shards are scaled by different factors). Returns this rank's local norm."""
    optimizer.reduce_gradients()
    g = optimizer.flat.grad
    local = g.float().norm()
    F.clip_([g], local, max_norm)
    return local
