"""Kernels classified as communication (collectives, point-to-point) or compute (issue 12).

A kernel is **communication** when its name (``demangledName``, else ``shortName``, from
``StringIds``) matches :data:`COMM_PATTERN`: NCCL's device kernels (``ncclDevKernel_*``,
``ncclKernel_*``, any name containing ``nccl``), PyTorch's ``c10d`` kernels, and the
all-reduce / all-gather / reduce-scatter / all-to-all kernels of other libraries
(``one_shot_all_reduce``, ``cross_device_reduce``, ``AllGather``, ...). Everything else is
**compute**. The test is on names only; a plain ``gather`` or ``reduce_kernel`` (an index
gather, a tensor reduction) is compute.

Where a communication kernel is counted (see :mod:`tracekit.analyze.sections.breakdown` and
:mod:`tracekit.analyze.sections.overlap`): ``kernel_busy_ns``, GPU idle and copy/compute overlap count
compute kernels only (an NCCL kernel that spins waiting for a peer is not work the GPU does
for the model); communication has its own ``comm_busy_ns`` / ``comm_count`` and, for copies,
``*_comm_overlap_ns``.

The collective's **kind** (:func:`collective_kind`) is read from the name too: ``AllReduce``,
``AllGather``, ``ReduceScatter``, ``Broadcast``, ``Reduce``, ``AllToAll``, ``SendRecv``,
``Send``, ``Recv``, else ``other``; :mod:`tracekit.analyze.sections.waiting_ranks` matches collectives
across ranks by kind and order.
"""

from __future__ import annotations

import re

import polars as pl

#: Names of communication kernels (case-insensitive ``re.search``).
COMM_PATTERN = (
    r"(?i)nccl|c10d|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce|"
    r"custom_?all_?reduce|msccl|rccl"
)

_KINDS = [
    ("AllReduce", r"all_?reduce|cross_device_reduce"),
    ("AllGather", r"all_?gather"),
    ("ReduceScatter", r"reduce_?scatter"),
    ("AllToAll", r"all_?to_?all"),
    ("SendRecv", r"send_?recv"),
    ("Broadcast", r"broadcast|bcast"),
    ("Send", r"send"),
    ("Recv", r"recv"),
    ("Reduce", r"reduce"),
]


#: the kinds :func:`collective_kind` gives, the Enum of ``model.ops``' ``collective`` (lexical
#: order, see :data:`tracekit.analyze.model.gpu_ops.KINDS`)
COLLECTIVES = pl.Enum(sorted({k for k, _ in _KINDS} | {"other"}))


def is_communication(name: str | None) -> bool:
    """True when the kernel name ``name`` matches :data:`COMM_PATTERN`."""
    return bool(name) and re.search(COMM_PATTERN, name) is not None


def collective_kind(name: str | None) -> str | None:
    """The collective a communication kernel performs (see module doc); None for compute."""
    if not is_communication(name):
        return None
    low = name.lower()
    # NCCL: ncclDevKernel_AllGather_RING_LL(...), ncclKernel_AllReduce_...: the word after the prefix
    m = re.search(r"nccl(?:dev)?kernel_([a-z]+)", low)
    head = m.group(1) if m else low
    for kind, pat in _KINDS:
        if re.search(pat, head):
            return kind
    for kind, pat in _KINDS:
        if re.search(pat, low):
            return kind
    return "other"


def annotate(ops: pl.DataFrame, names: dict[int, str]) -> pl.DataFrame:
    """``ops`` (frame of :func:`tracekit.analyze.model.gpu_ops.load_gpu_ops`) with ``comm`` (bool:
    a communication kernel) and ``collective`` (its kind, null otherwise); copies and memsets
    are never communication. ``names``: {name_id: kernel name}; ``collective`` is an Enum
    (:data:`COLLECTIVES`)."""
    ops = ops.drop([c for c in ("comm", "collective") if c in ops.columns])
    # one lookup per distinct name, mapped onto the rows (no join: the ops' columns are not copied)
    comm = {int(i): is_communication(n) for i, n in names.items()}
    kinds = {i: collective_kind(names[i]) for i, c in comm.items() if c}
    is_k = pl.col("kind") == "kernel"
    nid = pl.col("name_id")
    return ops.with_columns(
        comm=is_k & nid.replace_strict(comm, default=False, return_dtype=pl.Boolean).fill_null(False),
        collective=pl.when(is_k).then(nid.replace_strict(kinds, default=None, return_dtype=COLLECTIVES))
        .otherwise(None),
    )


def comm_expr() -> pl.Expr:
    """``True`` for communication kernels of a frame with the ``comm`` column; frames of an
    older model without it count every kernel as compute."""
    return pl.col("comm").fill_null(False)


def kernel_frames(ops: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(compute kernels, communication kernels) of an ops frame; without a ``comm`` column all
    kernels are compute."""
    if "comm" not in ops.columns:
        k = ops.filter(pl.col("kind") == "kernel")
        return k, k.head(0)
    k = ops.lazy().filter(pl.col("kind") == "kernel")
    compute, comm = pl.collect_all([k.filter(~comm_expr()), k.filter(comm_expr())])  # one polars call
    return compute, comm

