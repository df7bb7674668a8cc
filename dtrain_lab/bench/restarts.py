"""``restart_reliability``: clean resumes after one killed rank under ``torchrun --max-restarts 2``.

``dtrain_lab.demos.recovery_restart_probe`` kills rank 1 once; a trial is clean when the job finishes
with the right result after exactly one restart. Three ways to start the process group are compared,
alternating trial by trial: ``init_process_group`` as PyTorch does it (the restarted ranks share the
agent's TCPStore, where the failed attempt's gloo addresses are still written), the same with
PyTorch's ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (a fresh store per attempt), and
``dtrain_lab.jobs.runtime`` (a key prefix per attempt). A race: counts, never times, never a ratio.
"""
from __future__ import annotations

from dtrain_lab.jobs.launch import launch

RESTART_MODES = {
    "plain": (["plain"], {}),
    "plain + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": (["plain"], {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}),
    "dtrain_lab.jobs.runtime": (["runtime"], {}),
}


def restart_reliability(trials: int = 5, nproc: int = 2) -> dict:
    """Clean resumes out of ``trials`` per mode, modes alternating trial by trial. Counts only: a ratio
    against one of the baselines would pick the worst one (plain ``init_process_group``), while
    PyTorch's own ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (the workers get a TCPStore of their own
    instead of sharing the agent's) fixes the stale keys just as ``dtrain_lab.jobs.runtime``'s key
    prefix per attempt does: the two are expected to tie."""
    counts = {m: {"clean": 0, "stale_keys_seen": 0, "outcomes": []} for m in RESTART_MODES}
    for _ in range(trials):
        for mode, (args, env) in RESTART_MODES.items():
            r = launch("dtrain_lab.demos.recovery_restart_probe", nproc=nproc, args=args, max_restarts=2,
                       timeout=60, quiet=True, env={"DTRAIN_PG_TIMEOUT": "10", **env})
            ms = list(r.metrics.values())
            clean = (r.ok and len(ms) == nproc and all(m.get("total") == float(nproc ** 4) for m in ms)
                     and all(m.get("attempt") == 1 for m in ms))
            c = counts[mode]
            c["clean"] += int(clean)
            c["stale_keys_seen"] += int(any(m.get("stale_keys") for m in ms))
            if clean:
                outcome = "clean"
            elif r.hung or not r.ok:
                outcome = "hang" if r.hung else "failed"
            else:
                outcome = "more restarts" if any(m.get("attempt") != 1 for m in ms) else "wrong result"
            c["outcomes"].append(outcome)
    return {"name": "restart_reliability", "trials": trials, "nproc": nproc, "modes": counts}
