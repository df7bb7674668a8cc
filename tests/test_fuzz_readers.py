"""Everything a rank writes is hostile input (issue 22, point 3): seeded property tests feed random and
adversarial files to every reader of the grader (the result channel, traces, events, errors, stacks,
logs, the supervisor's marks) and to every pattern check that reads traces. None may raise, hang or
decode more bytes than the file holds. Seeded (random.Random), so a failure reproduces."""
import json
import math
import random
import struct
import time

import torch

from dtrain_lab.grading import channel, patterns, runner, trace
from dtrain_lab.grading.exercise import Run
from dtrain_lab.sandbox import supervisor

N = 400


def tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    return 0


def rand_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 4 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False, 0, -1, 2 ** 63, 1e308, -0.0, "x" * rng.randrange(50)])
    if kind == 2:
        return rng.choice(["nan", "?", "", "all_reduce", "send", "__tensor__", "\u4e2d"])
    if kind == 3:
        return rng.uniform(-1e9, 1e9)
    if kind == 4:
        return rng.randrange(-(1 << 40), 1 << 40)
    if kind == 5:
        return [rand_json(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == 6:   # a tensor header, often almost right
        dtype = rng.choice(list(channel.DTYPES) + ["object", 3, None])
        shape = rng.choice([[rng.randrange(-2, 9) for _ in range(rng.randrange(4))], [0, 2 ** 62, 2 ** 62],
                            [2 ** 31] * 3, "3", [1.5]])
        return {"__tensor__": [dtype, shape, rng.choice([0, 8, -8, 2 ** 62, 1.0]),
                               rng.choice([0, 4, 8, 64, -4, 2 ** 62])]}
    if kind == 7:
        return {"__object__": rand_json(rng, depth + 1), "repr": rand_json(rng, depth + 1)}
    return {rng.choice(["a", "__float__", "__tensor__", "op", "t"]): rand_json(rng, depth + 1)
            for _ in range(rng.randrange(4))}


def framed(doc, payload: bytes) -> bytes:
    text = json.dumps(doc).encode()
    return channel.MAGIC + struct.pack("<Q", len(text)) + text + payload


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        op = rng.randrange(4)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1:
            b = b[:rng.randrange(len(b) + 1)]
        elif op == 2:
            at = rng.randrange(len(b) + 1)
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(16)))
        elif len(b) > 16:   # a length field that lies
            b[8:16] = struct.pack("<Q", rng.choice([0, 1, len(b), 2 ** 64 - 1]))
    return bytes(b)


def test_the_result_channel_never_raises_nor_decodes_more_than_the_file():
    rng = random.Random(2201)
    valid = [channel.encode(v) for v in (
        0, [1.5, float("nan")], {"params": [torch.randn(3, 4), torch.arange(6, dtype=torch.int32)]},
        {"x": torch.zeros(0, 5), "s": "text", "nested": [[torch.ones(2, dtype=torch.float16)]]})]
    t0 = time.monotonic()
    for i in range(N):
        if i % 3 == 0:
            data = mutate(rng, rng.choice(valid))
        elif i % 3 == 1:
            data = framed(rand_json(rng), bytes(rng.randrange(256) for _ in range(rng.randrange(128))))
        else:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        out = channel.decode(data)
        assert tensor_bytes(out) <= len(data), (i, data[:200])
    # one adversarial case each: shared bytes, a huge empty shape, thousands of headers, deep nesting
    block = {"__tensor__": ["float32", [256], 0, 1024]}
    assert isinstance(channel.decode(framed([block] * 1200, bytes(1024))), channel.Unreadable)
    assert isinstance(channel.decode(framed({"__tensor__": ["float32", [0, 2 ** 62, 2 ** 62], 0, 0]}, b"")), channel.Unreadable)
    assert isinstance(channel.decode(framed([{"__tensor__": ["uint8", [0], 0, 0]}] * 5000, b"")), channel.Unreadable)
    assert isinstance(channel.decode(framed(json.loads("[" * 40 + "]" * 40), b"")), channel.Unreadable)
    deep = channel.MAGIC + struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000
    assert isinstance(channel.decode(deep), channel.Unreadable)
    assert time.monotonic() - t0 < 60


def rand_trace_line(rng: random.Random) -> str:
    if rng.random() < 0.1:
        return rng.choice(["", "{", "not json", "[]", "null", '{"op": 3}', '{"op": "' + "x" * 100 + '"}'])
    item = {"op": rng.choice(["all_reduce", "all_gather", "send", "recv", "isend", "irecv", "all_to_all_single",
                              "broadcast", "batch_isend_irecv", "reduce_scatter_tensor", "barrier", "zz"])}
    for key in rng.sample(sorted(trace._FIELDS), rng.randrange(len(trace._FIELDS))):
        if key == "op":
            continue
        good = {"shape": [rng.randrange(9) for _ in range(rng.randrange(4))], "peer": rng.randrange(-1, 4),
                "sent": rng.randrange(1 << 20), "src": rng.randrange(4), "group": [0, 1],
                "ops": [["isend", rng.randrange(4), [rng.randrange(9)]]], "dtype": "torch.float32", "mark": True}
        item[key] = good[key] if rng.random() < 0.6 else rand_json(rng)
    return json.dumps(item)


CHECKS = [patterns.ring(lambda run, rank: 12), patterns.only(("all_reduce",), "pattern_ddp_allreduce"), patterns.all_to_all,
          patterns.sparse(4),
          patterns.two_levels(lambda w: [n for n in (list(range(0, w, 2)), list(range(1, w, 2))) if n]),
          patterns.pipeline(4, 16)]


def test_traces_keep_only_typed_fields_and_no_pattern_check_raises_on_them():
    rng = random.Random(2202)
    for i in range(N // 4):
        world = rng.choice([1, 2, 3, 4])
        traces = {r: trace.parse("\n".join(rand_trace_line(rng) for _ in range(rng.randrange(30))))
                  for r in range(world)}
        for entries in traces.values():
            for e in entries:
                assert all(trace._FIELDS[k](v) for k, v in e.items()), e
        run = Run(world_size=world, seed=0, inputs=[{}] * world, traces={r: trace.calls(t) for r, t in traces.items()},
                  timeline=traces)
        trace.first_mismatch(traces)
        for check in CHECKS:
            problems = check(run)
            assert isinstance(problems, list), (i, check)


def test_a_job_folder_full_of_garbage_reads_back_without_raising(tmp_path):
    rng = random.Random(2203)
    spec = runner.JobSpec(exercise="test.fuzz", entry="run", submission=tmp_path / "s.py", world_size=2, inputs=[b""] * 2,
                          timeout=1)
    for i in range(40):
        job = tmp_path / f"job{i}"
        lines = [json.dumps(rand_json(rng)) for _ in range(rng.randrange(6))]
        lines += [json.dumps({"event": rng.choice(["attempt", "exit", "killed", "fault", "end", "start_failed"]),
                              "attempt": rand_json(rng), "rank": rand_json(rng), "code": rand_json(rng),
                              "t": rand_json(rng), "ok": rand_json(rng), "error": rand_json(rng),
                              "mark": rand_json(rng)}) for _ in range(rng.randrange(6))]
        job.mkdir()
        (job / "status.jsonl").write_text("\n".join(lines))
        for r in range(2):
            for a in range(2):
                adir = job / f"rank{r}" / f"a{a}"
                adir.mkdir(parents=True)
                (adir / "events").write_text("\n".join(json.dumps({"ev": rand_json(rng), "t": rand_json(rng)})
                                                       for _ in range(rng.randrange(8))))
                (adir / "error").write_text(json.dumps(rand_json(rng)) if rng.random() < 0.5 else
                                            json.dumps({"type": rand_json(rng), "message": rand_json(rng),
                                                        "traceback": rand_json(rng), "time": rand_json(rng)}))
                (adir / "trace").write_text("\n".join(rand_trace_line(rng) for _ in range(rng.randrange(10))))
                (adir / "result").write_bytes(mutate(rng, channel.encode({"v": torch.ones(3)})))
                (adir / "stack").write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(300))))
                (adir / "stdout.log").write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(300))))
                (adir / "marks").write_bytes(bytes(rng.randrange(256) for _ in range(rng.randrange(64))))
                supervisor._marked(str(adir / "marks"), "step")
        res = runner.JobResult(world_size=2)
        try:
            runner._read_back(spec, job, res, 0.0)
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise AssertionError(f"job {i}: {type(exc).__name__}: {exc}") from exc
        assert isinstance(res.attempts, int) and res.attempts >= 1
        assert all(isinstance(ro.events, dict) for ro in res.ranks)
        assert all(t is None or (isinstance(t, float) and math.isfinite(t)) for ro in res.ranks for t in ro.events.values())
