"""The one narrow channel between a sandboxed rank and the grader: plain data in a file, never code.

What crosses it (a rank's private inputs going in, the value ``run()`` returned coming out) is
encoded here as a JSON document followed by the raw bytes of its tensors::

    b"DTRAIN1\\n" + <8-byte length of the JSON> + JSON + tensor bytes

JSON holds ``None``, booleans, numbers (``nan``/``inf`` included), strings, lists and dicts with
string keys; a tensor is ``{"__tensor__": [dtype, shape, offset, nbytes]}`` pointing into the bytes
after the JSON; anything else (a module, an optimizer, a function) crosses as ``{"__object__":
type name, "repr": a short repr}``, so a check can name it but never run it. Decoding builds
tensors with ``torch.frombuffer`` from plain numeric dtypes: no pickle, no import of anything the
submission names. Sizes are capped before anything is read (:data:`MAX_BYTES`); a file that is
truncated, malformed or too deep decodes to :class:`Unreadable`, never to an exception.

:func:`short` is how feedback quotes a submission's value: a repr cut to a few dozen characters,
so that feedback cannot carry a file the submission read.
"""
from __future__ import annotations

import json
import math
import os
import struct

MAGIC = b"DTRAIN1\n"
MAX_BYTES = 96 << 20          # a result or an input file, all tensors included
MAX_DEPTH = 32
MAX_ITEMS = 200_000           # list items and dict keys, all levels together
MAX_TENSORS = 4096            # tensors in one value
MAX_DIMS = 16
SHORT = 80                    # characters of a value quoted in feedback
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "complex128")


class Unreadable:
    """A value that could not be decoded (and why): a check reports it, it never raises."""

    def __init__(self, why: str):
        self.why = why

    def __repr__(self) -> str:
        return f"<unreadable: {self.why}>"


def _encode(value, blobs: list, state: dict, depth: int = 0):
    state["items"] += 1
    if depth > MAX_DEPTH or state["items"] > MAX_ITEMS:
        raise ValueError("the value is nested too deeply or is too large")
    if value is None or isinstance(value, (bool, int, str)):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 63:
            return {"__object__": "int", "repr": short(value)}
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, (list, tuple)):
        return [_encode(v, blobs, state, depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out[str(k) if isinstance(k, (str, int, float, bool)) or k is None else short(k)] = \
                _encode(v, blobs, state, depth + 1)
        return out
    tensor = _as_tensor(value)
    if tensor is not None:
        t = tensor.detach().cpu().contiguous()
        dtype = str(t.dtype).replace("torch.", "")
        if dtype not in DTYPES:
            return {"__object__": type(value).__name__, "repr": short(value)}
        data = t.reshape(-1).view(torch_uint8()).numpy().tobytes() if t.numel() else b""
        offset = sum(len(b) for b in blobs)
        blobs.append(data)
        return {"__tensor__": [dtype, list(t.shape), offset, len(data)]}
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        try:  # a numpy scalar
            return _encode(value.item(), blobs, state, depth + 1)
        except Exception:  # noqa: BLE001
            pass
    return {"__object__": type(value).__name__, "repr": short(value)}


def torch_uint8():
    import torch

    return torch.uint8


def _as_tensor(value):
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value
    return None


def encode(value) -> bytes:
    """``value`` as bytes of the channel format (raises ValueError if it is too large to send)."""
    blobs: list[bytes] = []
    doc = json.dumps(_encode(value, blobs, {"items": 0}), allow_nan=False).encode()
    out = MAGIC + struct.pack("<Q", len(doc)) + doc + b"".join(blobs)
    if len(out) > MAX_BYTES:
        raise ValueError(f"the value takes {len(out)} bytes; at most {MAX_BYTES} can be handed back")
    return out


def write(path: str, value) -> int:
    """Encode ``value`` into ``path`` (an existing file is overwritten in place); returns its size."""
    data = encode(value)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)
    return len(data)


def _decode(node, payload: memoryview, state: dict, depth: int = 0):
    state["items"] += 1
    if depth > MAX_DEPTH or state["items"] > MAX_ITEMS:
        raise ValueError("nested too deeply")
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(v, payload, state, depth + 1) for v in node]
    if not isinstance(node, dict):
        raise ValueError("unknown node")
    if set(node) == {"__float__"}:
        return float(node["__float__"])
    if set(node) == {"__tensor__"}:
        import torch

        header = node["__tensor__"]
        if not (isinstance(header, list) and len(header) == 4):
            raise ValueError("bad tensor header")
        dtype, shape, offset, nbytes = header
        # every field checked before anything is allocated: a shape like [0, 2**62, 2**62] has no
        # elements, but torch would still refuse (or overflow on) its strides
        if dtype not in DTYPES or not isinstance(shape, list) or len(shape) > MAX_DIMS or \
                not all(type(d) is int and 0 <= d <= MAX_BYTES for d in shape) or \
                math.prod(d for d in shape if d) > MAX_BYTES:
            raise ValueError("bad tensor header")
        if not (type(offset) is int and type(nbytes) is int and 0 <= offset <= offset + nbytes <= len(payload)):
            raise ValueError("tensor data out of range")
        tdtype = getattr(torch, dtype)
        numel = math.prod(shape)
        if numel * torch.empty((), dtype=tdtype).element_size() != nbytes:
            raise ValueError("tensor size does not match its shape")
        _claim(state, offset, nbytes)
        if numel == 0:
            return torch.empty(shape, dtype=tdtype)
        raw = bytearray(payload[offset:offset + nbytes])
        return torch.frombuffer(raw, dtype=torch.uint8).view(tdtype).reshape(shape).clone()
    if set(node) == {"__object__", "repr"}:
        return Opaque(str(node["__object__"]), str(node["repr"]))
    return {str(k): _decode(v, payload, state, depth + 1) for k, v in node.items()}


def _claim(state: dict, offset: int, nbytes: int) -> None:
    """Each tensor owns its bytes: no two tensors may share any (1,200 headers over the same 1 MiB
    would otherwise decode to 1.2 GB), so what is decoded is never more than the file holds."""
    import bisect

    spans = state.setdefault("spans", [])
    state["tensors"] = state.get("tensors", 0) + 1
    if state["tensors"] > MAX_TENSORS:
        raise ValueError("too many tensors")
    if nbytes == 0:
        return
    starts = [a for a, _ in spans]
    i = bisect.bisect_right(starts, offset)
    if (i > 0 and spans[i - 1][1] > offset) or (i < len(spans) and spans[i][0] < offset + nbytes):
        raise ValueError("tensors share bytes")
    spans.insert(i, (offset, offset + nbytes))


class Opaque:
    """An object the submission returned that is not data (a module, an optimizer): its type and a short repr."""

    def __init__(self, type_name: str, text: str):
        self.type_name = type_name
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other) -> bool:
        return False

    __hash__ = None


def decode(data: bytes):
    """The value encoded in ``data``, or :class:`Unreadable`."""
    if len(data) > MAX_BYTES:
        return Unreadable("too large")
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        return Unreadable("not a result file")
    (n,) = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8
    if n > len(data) - start:
        return Unreadable("truncated")
    try:
        doc = json.loads(data[start:start + n].decode("utf-8"))
        return _decode(doc, memoryview(data)[start + n:], {"items": 0})
    except Exception as exc:  # noqa: BLE001 - whatever a forged file makes the decoder raise, it is unreadable
        return Unreadable(type(exc).__name__)


def read(path: str, limit: int = MAX_BYTES):
    """Decode the file at ``path``; ``None`` if it is missing or empty, :class:`Unreadable` if it is
    larger than ``limit`` or malformed. Never reads more than ``limit + 1`` bytes, never follows a
    symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    if not data:
        return None
    if len(data) > limit:
        return Unreadable("too large")
    return decode(data)


def read_text(path: str, limit: int) -> str:
    """The last ``limit`` bytes of a text file (a log), decoded leniently; ``""`` if missing."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                f.seek(size - limit)
            data = f.read(limit)
        except OSError:
            return ""
    return data.decode("utf-8", errors="replace")


def cut(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    text = str(text).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short(value, limit: int = SHORT) -> str:
    """A repr of ``value`` cut to ``limit`` characters: how feedback quotes what a submission returned."""
    try:
        if _as_tensor(value) is not None:
            t = value
            if t.numel() <= 6:
                text = "tensor(" + repr([round(float(x), 6) for x in t.detach().reshape(-1).tolist()]) + ")"
            else:
                text = f"tensor(shape={tuple(t.shape)}, dtype={str(t.dtype).replace('torch.', '')})"
        else:
            text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a repr that raises is quoted by its type
        text = f"<{type(value).__name__}: repr raised {type(exc).__name__}>"
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"
