"""Count what a process hands to its communication backend, calls and bytes, point to point included.

``CommDebugMode`` counts collectives but not ``send``/``recv`` (nor ``batch_isend_irecv``), which ring
attention and pipelines are made of. The PyTorch profiler records every call the backend makes
(``gloo:all_reduce``, ``gloo:send``, ``nccl:all_to_all`` …) with its tensor's shape and dtype, without
touching ``torch.distributed``::

    with counted() as comm:
        step()
    comm["all_to_all"]  # {"calls": 5, "bytes": 1234}

Bytes are the payload of each call: the tensor given to it (for all_to_all the whole input buffer,
for send/recv the message). Used by the demos of lessons 13 and 14 and the planner's validation run.

:func:`by_dimension` attributes each call to a parallel dimension: the library wraps its own calls in
``torch.profiler.record_function("dtrain:<dim>")`` (ring attention ``cp``, MoE ``ep``, gradient
sync ``dp``/``edp``); a call outside any such range is tensor parallelism's All-Reduce (lesson 07's
``f``/``g``) or the pipeline executor's send/recv.
"""
from __future__ import annotations

import contextlib
import math

_DTYPE_BYTES = {"float": 4, "double": 8, "long int": 8, "int": 4, "c10::Half": 2, "c10::BFloat16": 2,
                "bool": 1, "signed char": 1, "unsigned char": 1, "short int": 2}
_BACKENDS = ("gloo:", "nccl:")
_LABEL = "dtrain:"
_KEPT = (_LABEL,) + _BACKENDS      # the events counted() reads: its labels and the backend calls


_DEFAULT_DIM = {"all_reduce": "tp", "send": "pp", "recv": "pp"}


@contextlib.contextmanager
def counted(by_dim: bool = False):
    """Profile the block; afterwards the yielded dict maps each backend op to ``{"calls", "bytes"}``
    (``by_dim``: ``{dim: {op: {"calls", "bytes"}}}``, see :func:`by_dimension`)."""
    from torch.profiler import ProfilerActivity, profile

    out: dict = {}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        yield out
    events = _raw_events(prof)
    labels = [(start, end, name[len(_LABEL):]) for name, start, end, _, _ in events if name.startswith(_LABEL)]
    for name, start, _, shapes, dtypes in events:
        if not name.startswith(_BACKENDS):
            continue
        op = name.split(":", 1)[1]
        shape = shapes[0] if shapes else []
        dtype = dtypes[0] if dtypes else "float"
        table = out
        if by_dim:   # gloo runs collectives on its own threads: match by time, not by thread
            inside = [(a, lab) for a, b, lab in labels if a <= start <= b]
            table = out.setdefault(max(inside)[1] if inside else _DEFAULT_DIM.get(op, op), {})   # innermost
        entry = table.setdefault(op, {"calls": 0, "bytes": 0})
        entry["calls"] += 1
        entry["bytes"] += math.prod(shape) * _DTYPE_BYTES.get(dtype, 4)


def _raw_events(prof) -> list:
    """``(name, start_ns, end_ns, shapes, dtypes)`` of every recorded event that :func:`counted` reads.

    Read from the profiler's raw Kineto results: ``prof.events()`` first builds a Python
    ``FunctionEvent`` tree of every aten op (measured: 3.4 s for 50,000 events on an idle core, against
    0.17 s for this read), and a pipeline step records tens of thousands of them to find a few dozen
    backend calls.
    """
    raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if raw is not None:
        return [(e.name(), e.start_ns(), e.end_ns(), e.shapes(), e.dtypes()) for e in raw.events()
                if e.name().startswith(_KEPT)]
    return [(e.name, e.time_range.start * 1000, e.time_range.end * 1000, e.input_shapes, e.input_dtypes)
            for e in prof.events() if e.name.startswith(_KEPT)]
