"""Time and memory of joining one run's exports (tracekit/analyze/run_join.py) against the ranks.

    python benchmarks/run_join_scale.py [RANKS ...]      # default: 64 256

Builds the run parts in memory (no export is analyzed: what the workers would send back): 8 GPUs
per node, each rank 1000 AllReduces (its arrival skewed by rank, every node's capture start 1 ms
apart, so every export is its own clock group and is aligned on the collectives) and 200 pinned
4 MB H2D copies (GPUs of a node 1 us apart). Prints per size the join's wall time (s), the
process's peak RSS (MiB, ru_maxrss: the parts included), the alignment method and residual skew.
"""

from __future__ import annotations

import resource
import sys
import time

import numpy as np
import polars as pl

from tracekit.analyze import run_join

GPUS = 8


def part(r: int, world: int, n_coll: int = 1000, n_copy: int = 200) -> dict:
    """The run part of rank ``r`` (shapes of tracekit.analyze.run_parts)."""
    local, node = r % GPUS, r // GPUS
    gp = (1 << 48) + ((1000 + local) << 24)  # the same globalPid on every node, as real exports
    host = f"node{node}"
    ranks = pl.DataFrame({"global_pid": [gp], "pid": [1000 + local], "device": [local], "host_id": [1 << 48],
                          "host": [host], "rank": [r], "local_rank": [local], "world": [world], "source": ["nvtx"]})
    k = np.arange(n_coll)
    coll = pl.DataFrame({"rank": r, "global_pid": gp, "device": local, "stream": 20, "collective": "AllReduce",
                         "start": k * 10_000 + (r * 37 % 13) * 100, "end": k * 10_000 + 5000, "iteration": k // 100,
                         "phase": "backward"})
    c = np.arange(n_copy)
    copies = pl.DataFrame({"host": host, "gpu": local, "global_pid": gp, "device": local, "direction": "H2D",
                           "host_kind": "pinned", "bytes": 4_000_000, "start": c * 50_000 + local * 1000,
                           "end": c * 50_000 + local * 1000 + 10_000, "iteration": c // 20, "phase": "update",
                           "sub_phase": pl.Series([None] * n_copy, dtype=pl.String)})
    table = pl.DataFrame({"global_pid": gp, "device": local, "iteration": list(range(10)), "phase": "backward",
                          "gpu_idle_ns": 1000, "kernel_busy_ns": 1000, "h2d_bytes": 0, "d2h_bytes": 0,
                          "h2d_busy_ns": 0, "d2h_busy_ns": 0})
    return {"trace": f"rank{r}.sqlite", "clock": {"utc_start_ns": 10**18 + r * 1000 + node * 1_000_000, "host": host},
            "ranks": ranks, "collectives": coll, "copies": copies, "table": table}


def main(sizes: list[int]) -> None:
    for n in sizes:
        parts = [part(r, n) for r in range(n)]
        names = [p["trace"] for p in parts]
        t = time.perf_counter()
        run = run_join.run_json(parts, names, list(range(n)), None, [names])
        dt = time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{n} ranks ({n // GPUS} nodes): join {dt:.2f} s, peak RSS {rss:.0f} MiB, "
              f"{run['clock']['method']}, residual skew {run['clock']['residual_skew_ns']} ns, "
              f"{len(run['waiting_ranks']['per_rank'])} per-rank rows")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [64, 256])
