"""Peak memory of a piece of code, counted from the storages its operations create."""
from __future__ import annotations

__all__ = ["PeakMemory"]


class PeakMemory:
    """Live and peak bytes of tensor storage in this process while active (``with PeakMemory(model,
    optimizer=opt) as mem: step()`` then ``mem.peak``): the storages that exist at the start (the given
    modules' parameters and gradients, the optimizer's state) plus every storage an operation creates,
    until it is freed. The mechanism of torch's ``MemTracker`` (a ``TorchDispatchMode`` and weak
    references to storages), without its per-module bookkeeping, which refuses a module called twice
    in one step — as every micro-batch does. Works on fake tensors too (the planner's dry run).

    ``exclude`` (a predicate on a tensor an operation creates): such storages are counted in ``peak``
    but not in ``peak_kept``, the high-water mark of everything else (the planner leaves out the
    attention-score temporaries a fused kernel never holds)."""

    def __init__(self, *modules, optimizer=None, exclude=None):
        self._start = [t for m in modules for p in m.parameters() for t in (p, p.grad) if t is not None]
        if optimizer is not None:
            self._start += [t for st in optimizer.state.values() for t in st.values() if hasattr(t, "untyped_storage")]
        self.live: dict = {}
        self.now = self.peak = 0
        self.now_kept = self.peak_kept = 0
        self._exclude, self._excluding = exclude, None
        self._mode = None

    def _track(self, t) -> None:
        import weakref

        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return
        n = st.nbytes()
        kept = 0 if self._excluding is not None and self._excluding(t) else n

        def free(_, key=key, n=n, kept=kept):
            if self.live.pop(key, None) is not None:
                self.now -= n
                self.now_kept -= kept

        self.live[key] = weakref.ref(st, free)
        self.now += n
        self.now_kept += kept
        self.peak = max(self.peak, self.now)
        self.peak_kept = max(self.peak_kept, self.now_kept)

    def __enter__(self) -> "PeakMemory":
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        tracker._track(t)
                return out

        for t in self._start:
            self._track(t)
        self._start = None            # keep no reference: a gradient set to None must be freed
        self.start = self.now
        self._excluding = self._exclude   # only what operations create may be excluded
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
