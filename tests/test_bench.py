"""The bench's own logic, without launching: row selection, the restart-reliability count, the table.
(The rows themselves are measurements: ``make bench`` runs them.)"""
from types import SimpleNamespace

import pytest

from dtrain_lab import bench


def test_only_rejects_unknown_rows(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--only", "restarts,nonsense"])
    assert "nonsense" in capsys.readouterr().err


def test_restart_reliability_counts_only_clean_single_restarts(monkeypatch):
    # per call, in the order the modes alternate: (ok, hung, attempts reported, totals)
    script = iter([
        (True, False, [1, 1], [16.0, 16.0]),     # plain: clean
        (True, False, [1, 1], [16.0, 16.0]),     # own store: clean
        (True, False, [1, 1], [16.0, 16.0]),     # runtime: clean
        (True, False, [2, 2], [16.0, 16.0]),     # plain: finished only after a second restart
        (False, True, [1, 1], [None, None]),     # own store: hung
        (True, False, [1, 1], [16.0, 8.0]),      # runtime: wrong result on rank 1
    ])
    calls = []

    def fake_launch(target, **kw):
        calls.append((kw["args"], kw["env"].get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")))
        ok, hung, attempts, totals = next(script)
        metrics = {r: {"attempt": a, "total": t, "stale_keys": ["k"] if r == 0 else []}
                   for r, (a, t) in enumerate(zip(attempts, totals))}
        return SimpleNamespace(ok=ok, hung=hung, metrics=metrics)

    monkeypatch.setattr(bench, "launch", fake_launch)
    row = bench.restart_reliability(trials=2, nproc=2)
    assert [c["clean"] for c in row["modes"].values()] == [1, 1, 1]
    assert row["modes"]["plain"]["outcomes"] == ["clean", "more restarts"]
    assert row["modes"]["plain + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"]["outcomes"] == ["clean", "hang"]
    assert row["modes"]["dtrain_lab.jobs.runtime"]["outcomes"] == ["clean", "wrong result"]
    assert row["ratio"] == 1.0 and row["modes"]["plain"]["stale_keys_seen"] == 2
    assert calls[:3] == [(["plain"], None), (["plain"], "1"), (["runtime"], None)]   # modes alternate
    text = bench.table([row])
    assert "| clean resumes after a killed rank: plain | 1/2 |" in text
