"""Which rank a captured process is, from its launcher's environment (torchrun, the deepspeed
launcher, Open MPI, MPICH / Intel MPI, PMIx, Slurm): :func:`rank_identity`, the ``{rank}``-style
placeholders of ``-o`` (:func:`expand_output`), the GPU a rank runs on (:func:`rank_gpu`), and the
multi-node launches one nsys cannot record (:func:`multinode_problem`). Part of
:mod:`tracekit.capture.runner`, which re-exports these names.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from tracekit.errors import TracekitError

#: environment variables that name a process's global rank, local rank and node rank, in
#: the order they are trusted: torchrun / torch.distributed.launch / the deepspeed launcher
#: (RANK, LOCAL_RANK, GROUP_RANK or CROSS_RANK), Open MPI, MPICH / Intel MPI (PMI), PMIx,
#: Slurm's srun. RANK comes first so that torchrun inside srun names ranks, not srun tasks.
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
NODE_RANK_VARS = ("GROUP_RANK", "CROSS_RANK", "NODE_RANK", "SLURM_NODEID")
WORLD_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
PLACEHOLDERS = ("rank", "local_rank", "node_rank", "host")


def _first_int(env: dict, names: tuple[str, ...]) -> tuple[int | None, str | None]:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip().isdigit():
            return int(value), name
    return None, None


def rank_identity(env: dict) -> dict:
    """Who this process is in a distributed job, from the launcher's environment (see
    :data:`RANK_VARS` and the lists beside it): ``{"rank", "rank_from", "local_rank",
    "node_rank", "world_size", "host"}``; a value the environment does not give is None."""
    rank, rank_from = _first_int(env, RANK_VARS)
    local_rank, _ = _first_int(env, LOCAL_RANK_VARS)
    node_rank, _ = _first_int(env, NODE_RANK_VARS)
    world, _ = _first_int(env, WORLD_SIZE_VARS)
    return {"rank": rank, "rank_from": rank_from, "local_rank": local_rank, "node_rank": node_rank,
            "world_size": world, "host": platform.node().split(".")[0] or None}


def expand_output(output: str, ident: dict, per_rank: bool) -> str:
    """``-o`` with ``{rank}``, ``{local_rank}``, ``{node_rank}`` and ``{host}`` replaced from
    ``ident`` (:func:`rank_identity`); with ``per_rank`` and no ``{rank}`` in it,
    ``.rank{rank}`` is appended (``runs/z3`` -> ``runs/z3.rank5``, which ``tracekit analyze
    runs/`` reads as rank 5). Other braces are kept. Raises :class:`TracekitError` when a
    placeholder (or ``per_rank``) needs a value the environment does not give."""
    base = output[: -len(".nsys-rep")] if output.endswith(".nsys-rep") else output
    if per_rank and "{rank}" not in base:
        base += ".rank{rank}"
    for key in PLACEHOLDERS:
        token = "{" + key + "}"
        if token not in base:
            continue
        value = ident.get(key)
        if value is None:
            names = {"rank": RANK_VARS, "local_rank": LOCAL_RANK_VARS, "node_rank": NODE_RANK_VARS}.get(key, ())
            raise TracekitError(f"-o {output}: {token} needs one of {', '.join(names)} in the environment "
                                "(run tracekit capture --per-rank as the program each rank runs, "
                                "under the launcher; see docs/capture.md)")
        base = base.replace(token, str(value))
    return base


def rank_gpu(env: dict, local_rank: int | None) -> str | None:
    """The GPU (as ``nvidia-smi`` numbers them) that local rank ``local_rank`` uses: item
    ``local_rank`` of ``CUDA_VISIBLE_DEVICES`` (its only item when it names one GPU, as
    Slurm's ``--gpus-per-task=1`` does), else ``local_rank`` itself; None when that is not a
    plain index (a GPU UUID, a MIG instance)."""
    if local_rank is None:
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return str(local_rank)
    items = [v.strip() for v in visible.split(",") if v.strip()]
    pick = items[local_rank] if local_rank < len(items) else items[0] if len(items) == 1 else None
    return pick if pick is not None and pick.isdigit() else None


_DS_LAUNCHERS = ("deepspeed", "ds")


def multinode_problem(command: list[str], cwd: str | None = None) -> str | None:
    """Why ``command`` cannot be captured by one local nsys, or None.

    The ``deepspeed`` launcher runs remote ranks through pdsh/ssh, mpirun or srun
    (deepspeed/launcher/runner.py, 0.19.8): they run outside this nsys, and remote ranks see
    only the launcher's export list (variables starting with PYTHON, NCCL, UCX, MV2, MLFLOW)
    and ``.deepspeed_env``. Detected: ``--hostfile``/``-H`` (or the default
    ``/job/hostfile``) naming more than one host, ``--num_nodes`` > 1, ``--force_multi``,
    and no ``--no_ssh`` (with it the user starts one launcher per node).
    """
    if not command or os.path.basename(command[0]) not in _DS_LAUNCHERS:
        return None
    hostfile, num_nodes, force_multi, no_ssh = "/job/hostfile", None, False, False
    i = 1
    while i < len(command):
        tok = command[i]
        if not tok.startswith("-"):
            break  # the user script: the rest is its own arguments
        key, _, value = tok.partition("=")
        takes = key in ("--hostfile", "-H", "--num_nodes", "--include", "-i", "--exclude", "-e",
                        "--num_gpus", "--num_accelerators", "--master_port", "--master_addr",
                        "--node_rank", "--launcher", "--launcher_args", "--save_pid",
                        "--enable_each_rank_log", "--autotuning", "--bind_core_list", "--ssh_port",
                        "--venv_script", "--log_level", "--elastic_training", "--min_elastic_nodes",
                        "--max_elastic_nodes", "--comment")
        if takes and not value and i + 1 < len(command):
            value = command[i + 1]
            i += 1
        if key in ("--hostfile", "-H"):
            hostfile = value
        elif key == "--num_nodes" and value.lstrip("-").isdigit():
            num_nodes = int(value)
        elif key == "--force_multi":
            force_multi = True
        elif key == "--no_ssh":
            no_ssh = True
        i += 1
    if no_ssh:
        return None  # one launcher per node, started by the user: this node only
    hosts: list[str] = []
    path = Path(hostfile) if cwd is None or os.path.isabs(hostfile) else Path(cwd) / hostfile
    try:
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                hosts.append(line.split()[0])
    except OSError:
        hosts = []
    if force_multi or (num_nodes is not None and num_nodes > 1) or len(set(hosts)) > 1:
        where = f"hostfile {hostfile} names {len(set(hosts))} hosts" if len(set(hosts)) > 1 else \
            "--force_multi" if force_multi else f"--num_nodes {num_nodes}"
        return (f"the deepspeed launcher starts remote ranks ({where}) outside this nsys; wrap each rank "
                f"instead: deepspeed --hostfile {hostfile} --module tracekit.capture --per-rank -o NAME "
                "-- python train.py ... (docs/capture.md, multi-node)")
    return None
