"""Distributed rank, local rank and host of each (process, device) of an export (issue 12).

**Rank.** tracekit's capture hook records, at engine start, an NVTX mark or range in the
``tracekit`` domain named ``rank R local_rank L world W`` (:data:`RANK_PATTERN` also accepts
``rank=R``, ``local_rank: L``, ``world_size W``; ``?`` for a local rank or world size the hook could not read). When a
process has one, its rank is R. When
no process of the export has one, ranks are numbered in **device order** (by host, then device
id, then process id) and ``source`` says ``device order``: with one process per GPU, as
``torchrun``/``deepspeed`` launch them, that is the usual mapping of ``LOCAL_RANK`` to
``cuda:N`` but it is a guess.

**Host.** A process's host is the machine part of its nsys ``globalPid`` (bits 48 and up: the
hardware and VM ids; pid and thread ids sit below). Its name is ``TARGET_INFO_SYSTEM_ENV``'s
``Hostname`` for that ``globalVid`` when the export has it, else ``host N``.
"""

from __future__ import annotations

import re

import polars as pl

from tracekit.analyze.model import nvtx
from tracekit.analyze.model.phases import TRACEKIT_DOMAIN, PhaseModel
from tracekit.analyze.trace import enums
from tracekit.analyze.trace.export import Export
from tracekit.vocab import global_pid_of, os_pid_expr

#: Name of the capture hook's rank record (``re.search``, case-insensitive).
RANK_PATTERN = re.compile(
    r"(?i)\brank\s*[=:]?\s*(\d+)[\s,;]+local_rank\s*[=:]?\s*(\d+|\?)[\s,;]+world(?:_size)?\s*[=:]?\s*(\d+|\?)"
)

#: Columns of :func:`distributed_ranks`.
COLUMNS = ["global_pid", "pid", "device", "host_id", "host", "rank", "local_rank", "world", "source"]

_HOST_MASK = ~((1 << 48) - 1)


def host_id(global_pid: int) -> int:
    """The machine part of an nsys globalPid/globalTid (its ``globalVid``)."""
    return int(global_pid) & _HOST_MASK


def host_names(export: Export) -> dict[int, str]:
    """``{globalVid: Hostname}`` from ``TARGET_INFO_SYSTEM_ENV`` ({} when absent)."""
    env = export.load("TARGET_INFO_SYSTEM_ENV", {"vid": "globalVid", "name": "name", "value": "value"})
    if env.height == 0:
        return {}
    env = env.filter(pl.col("name") == "Hostname")
    return {int(v): str(n) for v, n in zip(env["vid"], env["value"]) if v is not None and n}


def rank_records(export: Export) -> pl.DataFrame:
    """NVTX marks and ranges whose name matches :data:`RANK_PATTERN`: ``global_pid, start,
    domain, name, rank, local_rank, world`` (first record per process; marks and push/pop or
    start/end ranges alike)."""
    schema = {"global_pid": pl.Int64, "start": pl.Int64, "domain": pl.String, "name": pl.String,
              "rank": pl.Int64, "local_rank": pl.Int64, "world": pl.Int64}
    cols = set(export.columns("NVTX_EVENTS"))
    if not {"start", "eventType", "globalTid"} <= cols:
        return pl.DataFrame(schema=schema)
    dom = "n.domainId" if "domainId" in cols else "0"
    join = "LEFT JOIN StringIds s ON s.id = n.textId" if "textId" in cols and export.has("StringIds") else ""
    value = "coalesce(n.text, s.value)" if join else "n.text"
    rows = export.query(
        f"""SELECT n.globalTid, n.start, {dom}, {value} FROM NVTX_EVENTS n {join}
            WHERE n.eventType IN (?, ?, ?) AND {value} LIKE '%rank%world%'""",
        (enums.NVTX_MARK, enums.NVTX_PUSH_POP, enums.NVTX_START_END),
        schema={"tid": pl.Int64, "start": pl.Int64, "domain_id": pl.Int64, "name": pl.String},
    )
    if rows.height == 0:
        return pl.DataFrame(schema=schema)
    dnames = nvtx.domains(export)  # per process: domain ids are numbered per process
    out = []
    for tid, start, did, name in rows.sort("start").iter_rows():
        m = RANK_PATTERN.search(name or "")
        if not m:
            continue
        domain = dnames.name(None if tid is None else global_pid_of(tid), did)
        out.append({"global_pid": global_pid_of(tid), "start": start, "domain": domain, "name": name,
                    "rank": int(m.group(1)), "local_rank": _int(m.group(2)), "world": _int(m.group(3))})
    if not out:
        return pl.DataFrame(schema=schema)
    f = pl.DataFrame(out, schema=schema)
    # prefer the tracekit domain, then the earliest record, per process
    f = f.sort(pl.col("domain") != TRACEKIT_DOMAIN, "start")
    return f.unique(subset=["global_pid"], keep="first", maintain_order=True).sort("global_pid")


def _int(text: str) -> int | None:
    return None if text == "?" else int(text)


def distributed_ranks(export: Export, model: PhaseModel) -> pl.DataFrame:
    """Every (process, device) with GPU work, with its host and distributed rank.

    Columns (:data:`COLUMNS`): ``global_pid, pid, device, host_id`` (globalVid), ``host``
    (name), ``rank, local_rank, world`` (Int64), ``source`` (``nvtx`` when read from the
    capture hook's record, ``device order`` when guessed; see module doc). Sorted by rank.
    A process driving several devices gets its rank on each of them.
    """
    # (a lazy unique: the eager one hashes every op's pair at once, 16 MiB on a 10 GB trace)
    r = model.scan_ops().select("global_pid", "device").unique().collect().drop_nulls()
    names = host_names(export)
    r = r.with_columns(
        pid=os_pid_expr(pl.col("global_pid")),
        host_id=pl.col("global_pid").cast(pl.Int64) & pl.lit(_HOST_MASK, pl.Int64),
    )
    hosts = sorted(set(r["host_id"].to_list()))
    label = {h: names.get(int(h)) or f"host {i}" for i, h in enumerate(hosts)}
    r = r.with_columns(host=pl.col("host_id").replace_strict(label, return_dtype=pl.String))
    recs = rank_records(export)
    r = r.sort("host_id", "device", "pid")
    if recs.height and recs["global_pid"].is_in(r["global_pid"].implode()).any():
        r = r.join(recs.select("global_pid", "rank", "local_rank", "world"), on="global_pid", how="left")
        r = r.with_columns(
            source=pl.when(pl.col("rank").is_not_null()).then(pl.lit("nvtx")).otherwise(pl.lit("device order")))
        # processes without a record (launcher helpers with GPU work): after the recorded ranks
        top = int(r["rank"].max()) + 1
        missing = r.filter(pl.col("rank").is_null()).with_row_index("_i")
        if missing.height:
            missing = missing.with_columns(rank=(pl.col("_i") + top).cast(pl.Int64),
                                           local_rank=pl.col("device"), world=pl.lit(None, pl.Int64)).drop("_i")
            r = pl.concat([r.filter(pl.col("rank").is_not_null()), missing.select(r.columns)])
    else:
        r = r.with_row_index("rank").with_columns(
            rank=pl.col("rank").cast(pl.Int64),
            local_rank=pl.int_range(pl.len()).over("host_id").cast(pl.Int64),
            world=pl.lit(r.height, pl.Int64),
            source=pl.lit("device order"),
        )
    return r.cast({"rank": pl.Int64, "local_rank": pl.Int64, "world": pl.Int64}).sort("rank", "device").select(COLUMNS)
