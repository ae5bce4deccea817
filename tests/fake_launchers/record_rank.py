"""A stand-in training script for the launcher tests: ``record_rank.py FOLDER ...`` writes what
it received (argv, the rank variables, TRACEKIT_* and PYTHONPATH) to FOLDER/rank-<pid>.json."""
import json
import os
import sys

if __name__ == "__main__":  # the guard that scripts starting SuperOffload/ZenFlow workers need
    out = sys.argv[1]
    keep = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "CROSS_RANK", "SLURM_PROCID", "SLURM_LOCALID",
            "SLURM_NODEID", "CUDA_VISIBLE_DEVICES", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("TRACEKIT_")}
    with open(os.path.join(out, f"rank-{os.getpid()}.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "env": env}, f)
