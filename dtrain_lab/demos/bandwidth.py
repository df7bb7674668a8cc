"""Measure collectives against message size on this machine: time, algbw, busbw.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.bandwidth [max_bytes] [ops]

Numbers are this machine's: gloo over loopback TCP between CPU processes here. NCCL over NVLink or
InfiniBand is orders of magnitude faster and has other crossover points: never carry these figures
over to GPUs.
"""
import sys

from dtrain_lab.jobs import runtime
from dtrain_lab.demos.collective_timing import measure_collective


def main() -> None:
    rt = runtime.current()
    max_bytes = int(float(sys.argv[1])) if len(sys.argv) > 1 else 16 << 20
    ops = sys.argv[2].split(",") if len(sys.argv) > 2 else ["all_reduce", "ring_all_reduce"]
    sizes = []
    n = 4 << 10
    while n <= max_bytes:
        sizes.append(n)
        n *= 4
    rows = [measure_collective(op, size, device=rt.device) for op in ops for size in sizes]
    runtime.report(rows=rows, world_size=rt.world_size, backend=rt.backend)
    runtime.print0(f"measured {len(rows)} points ({', '.join(ops)}) on {rt.world_size} ranks with {rt.backend}")


if __name__ == "__main__":
    runtime.entrypoint(main)
