"""The figures of lessons 02, 09, 10, 11 and 12 take their inputs from recorded data only: each
``inputs`` function keeps orders, ranks and steps and drops times, PIDs and paths; lesson 11's live
picture of this machine (``paths.here``) follows what the doctor reports."""
from types import SimpleNamespace as NS

from dtrain_lab import figures
from dtrain_lab.figures import buckets, hang, paths, rendezvous, restarts


def _frame(file, line, func):
    return NS(file=file, line=line, func=func)


def test_hang_inputs_keep_the_program_frames_from_the_entry_inward(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text("def f():\n    g()   # comment\n\ndef g():\n    dist.barrier()\n", encoding="utf-8")
    torch_file = "/x/site-packages/torch/distributed/distributed_c10d.py"
    site = NS(call="barrier", frames=[_frame(torch_file, 1, "barrier"), _frame(str(prog), 5, "g"),
                                      _frame(str(prog), 2, "f"), _frame(str(prog), 9, "main")])
    data = hang.inputs({1: site, 0: site}, "f")
    assert data["ranks"][0] == {"rank": 0, "call": "barrier",
                                "stack": [{"func": "f", "code": "g()"}, {"func": "g", "code": "dist.barrier()"}]}
    assert "<svg" in figures.svg("hang_waits", data, "zh")


def test_bucket_inputs_drop_times_and_completions():
    ev = [{"event": "ready", "param": "w", "bucket": 0, "t": 0.1}, {"event": "launch", "bucket": 0, "t": 0.2},
          {"event": "backward_end", "t": 0.3}, {"event": "done", "bucket": 0, "t": 0.4},
          {"event": "wait", "bucket": 0, "t": 0.5}]
    m = {0: {"variants": {"buckets": {"buckets": [["w"]], "events": ev}, "buckets_no_overlap": {"events": ev}}}}
    data = buckets.inputs(m)
    assert data["variants"]["buckets"] == [{"event": "ready", "param": "w", "bucket": 0}, {"event": "launch", "bucket": 0},
                                           {"event": "backward_end"}, {"event": "wait", "bucket": 0}]


def test_restart_inputs_name_leftovers_without_their_pid():
    r0 = [{"attempt": 0, "resumed_from": 0, "ckpt_files": [], "started_at": 5.0},
          {"progress": {"attempt": 0, "step": 1, "t": 6.0}}, {"saved": {"attempt": 0, "step": 1, "t": 6.1}},
          {"fault": {"attempt": 0, "mode": "ckpt", "rank": 0, "step": 2, "where": "ckpt_rename", "t": 7.0}},
          {"attempt": 1, "resumed_from": 1, "ckpt_files": [".step_00000002.pt.tmp.4242", "heartbeats"], "started_at": 8.0},
          {"progress": {"attempt": 1, "step": 3, "t": 9.0}}]
    data = restarts.inputs({0: r0, 1: [r for r in r0 if "attempt" in r]})
    assert data["attempts"][1]["files"] == [".step_00000002.pt.tmp.<pid>"]
    assert data["attempts"][0]["fault"] == {"rank": 0, "step": 2, "where": "ckpt_rename"} and data["steps"] == 3
    assert "4242" not in str(data) and "<svg" in figures.svg("restarts", data, "en")


def test_rendezvous_inputs_keep_orders_not_pids():
    nodes = [NS(requested_rank=0, group_rank=1, ranks=[1]), NS(requested_rank=1, group_rank=0, ranks=[0])]
    everyone = [["h", 0, 0, 111, 5000, ["127.0.0.1", 5000, 0]], ["h", 1, 0, 222, 7000, ["127.0.0.1", 7000, 0]]]
    data = rendezvous.inputs(nodes, everyone, start_order=[1, 0])
    assert data["nodes"] == [{"node": 1, "group_rank": 0, "ranks": [0], "pid_order": 0},
                             {"node": 0, "group_rank": 1, "ranks": [1], "pid_order": 1}]
    assert "5000" not in str(data)


def _report(gpus=0, topology=None, ib=False):
    net = [{"name": "lo", "kind": "loopback", "up": True}, {"name": "eth0", "kind": "ethernet/other", "up": True}]
    if ib:
        net.append({"name": "ib0", "kind": "infiniband", "up": True})
    return {"platform": "linux", "gpus": {"count": gpus, "topology": topology}, "network": net,
            "shm": {"path": "/dev/shm"}}


def test_this_machine_s_paths_follow_the_doctor():
    assert [p["transport"] for p in paths.here(_report())["paths"]] == ["gloo_socket"]
    assert [p["transport"] for p in paths.here(_report(2))["paths"]] == ["p2p_pcie", "shm", "net_socket"]
    full = paths.here(_report(8, "GPU0 X NV12 ...", ib=True))
    assert [p["transport"] for p in full["paths"]] == ["p2p_nvlink", "shm", "net_ib", "net_socket"]
    for data in (paths.here(_report()), full, paths.node()):
        assert "<svg" in figures.svg("nccl_paths", data, "zh")
    assert {p["transport"] for p in paths.node()["paths"]} == {"p2p_nvlink", "shm", "net_ib", "net_socket"}
