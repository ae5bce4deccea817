"""The streaming reduction of the PCIe samples (:func:`tracekit.analyze.sections.pcie_metrics.reduce_pcie`
runs it): each chunk of samples becomes per-window counts, sums and maxima, value counts for the
baseline median and saturation runs (a run open at a chunk's end continues in the next), and
:class:`PcieReduction` is what every PCIe frame is rolled up from; memory grows with the number of
phase windows, not with the samples. A sample outside :data:`PCT_RANGE` is set aside
(:func:`in_range`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracekit.analyze.model.gpu_ops import with_strings
from tracekit.analyze.model.intervals import SpreadCumulative
from tracekit.analyze.model.phases import PhaseModel
from tracekit.analyze.sections.transfer_common import RANK, attach_window, ranks_of

#: The range of a plausible sample (% of the link's peak); others are set aside.
PCT_RANGE = (0.0, 100.0)


def in_range(values: np.ndarray) -> np.ndarray:
    """Mask of the samples within :data:`PCT_RANGE` (NaN and infinities are not)."""
    return (values >= PCT_RANGE[0]) & (values <= PCT_RANGE[1])


def _median_of_counts(values: np.ndarray, counts: np.ndarray):
    """Median of the multiset {values[i] x counts[i]} exactly as polars' ``median`` computes it
    (the two middle values interpolated by polars itself), or None when empty."""
    if values.size == 0:
        return None
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    n = int(counts.sum())
    cum = np.cumsum(counts)
    lo = values[np.searchsorted(cum, (n - 1) // 2, side="right")]
    hi = values[np.searchsorted(cum, n // 2, side="right")]
    return pl.Series([lo, hi]).median()


class _Counts:
    """A multiset of numbers, merged chunk by chunk (bincount for small integer ranges)."""

    def __init__(self) -> None:
        self.d: dict = {}

    def add(self, a: np.ndarray) -> None:
        if a.size == 0:
            return
        lo, hi = a.min(), a.max()
        small = hi - lo < 65536 and (a.dtype.kind in "iu" or bool(np.array_equal(a, np.floor(a))))
        if small:  # integers (intervals in ns, integral percentages): one bincount
            c = np.bincount((a - lo).astype(np.int64))
            nz = np.flatnonzero(c)
            keys, counts = (nz + lo).astype(a.dtype).tolist(), c[nz].tolist()
        else:
            u, c = np.unique(a, return_counts=True)
            keys, counts = u.tolist(), c.tolist()
        for k, n in zip(keys, counts):
            self.d[k] = self.d.get(k, 0) + n

    def median(self, dtype):
        if not self.d:
            return None
        return _median_of_counts(np.array(list(self.d), dtype=dtype), np.array(list(self.d.values()), dtype=np.int64))




class _Unsorted(Exception):
    """A metric's samples are not in time order by rowid (or a typeId appeared that the device
    mapping did not expect): the streamed reduction cannot be exact, read everything instead."""


@dataclass
class _Group:
    """Accumulators of one (rank, direction)."""

    ws: np.ndarray
    we: np.ndarray
    wid: np.ndarray
    cum: SpreadCumulative
    cnt: np.ndarray
    sum: np.ndarray
    max: np.ndarray
    base: _Counts
    runs: list
    tid: int
    carry: list | None = None  # the open saturation run: [start, end, samples, sum, peak, start_pending]


@dataclass
class PcieReduction:
    """What one pass over the PCIe samples leaves of them, for one phase model.

    Attributes:
        threshold: saturation threshold (%) of :attr:`runs`.
        windows: per rank, direction and phase window holding samples: ``global_pid, device,
            direction, window_id`` (null: samples outside every window), ``iteration, phase,
            micro_step, boundary`` (of that window; ``other`` outside), ``samples``,
            ``sum_pct``, ``peak_pct``.
        baseline: ``global_pid, device, direction, baseline_pct`` (median % of the samples with
            no copy of that direction in flight; ranks without such samples are absent).
        runs: saturation runs: ``global_pid, device, direction, start, end, samples, sum_pct,
            peak_pct``.
        series: the samples (:func:`pcie_series` with a model) when asked for, else None.
        samples: samples attributed to a rank (0: the sampled GPUs could not be matched).
        streamed: False when the samples had to be read whole (not in time order by rowid).
        set_aside: direction -> samples outside :data:`PCT_RANGE` left out (all GPUs).
    """

    threshold: float
    windows: pl.DataFrame
    baseline: pl.DataFrame
    runs: pl.DataFrame
    series: pl.DataFrame | None
    samples: int
    streamed: bool = True
    set_aside: dict | None = None


def host_copy_times(model: PhaseModel) -> pl.DataFrame:
    """The H2D and D2H memcpys of ``model``: ``global_pid, device, direction`` (String),
    ``start, end, bytes``; the columns picked before the rows are gathered."""
    c = model.scan_ops().filter((pl.col("kind") == "memcpy") & pl.col("direction").is_in(["H2D", "D2H"]))
    return with_strings(c.select(*RANK, "direction", "start", "end", "bytes")).collect()


class _Reducer:
    def __init__(self, model: PhaseModel, mapping: dict, threshold: float, keep: bool) -> None:
        self.model, self.mapping, self.threshold, self.keep = model, mapping, threshold, keep
        r = ranks_of(model)
        self.ranks: dict = {}
        for gpid, dev in r.iter_rows():
            self.ranks.setdefault(dev, []).append(gpid)
        self.w = model.windows.select("global_pid", "window_id", "start", "end").sort("global_pid", "start")
        self.copies = host_copy_times(model)
        self.groups: dict = {}
        self.last: dict = {}
        self.diffs = _Counts()
        self.pending: list = []  # first sample of each metric: (type_id, direction, time, value)
        self.seen: set = set()
        self.parts: list = []
        self.set_aside: dict = {}  # direction -> samples outside PCT_RANGE

    def group(self, gpid: int, dev: int, d: str) -> _Group:
        g = self.groups.get((gpid, dev, d))
        if g is None:
            w = self.w.filter(pl.col("global_pid") == gpid)
            c = self.copies.filter((pl.col("global_pid") == gpid) & (pl.col("device") == dev)
                                   & (pl.col("direction") == d))
            n = w.height + 1  # the last slot: samples outside every window
            g = self.groups[(gpid, dev, d)] = _Group(
                ws=w["start"].to_numpy(), we=w["end"].to_numpy(), wid=w["window_id"].to_numpy(),
                cum=SpreadCumulative(c["start"].to_numpy(), c["end"].to_numpy(), c["bytes"].to_numpy()),
                cnt=np.zeros(n, np.int64), sum=np.zeros(n), max=np.full(n, -np.inf), base=_Counts(), runs=[],
                tid=next(t for t, dv in self.mapping.items() if dv == dev))
        return g

    def add(self, c: pl.DataFrame) -> None:
        """Reduce a frame of :func:`_clean_samples` rows that follows the previous ones."""
        for (tid, d), g in c.partition_by("type_id", "direction", maintain_order=True, as_dict=True).items():
            self._metric(tid, d, g["time"].to_numpy(), g["value_pct"].to_numpy())

    def add_raw(self, chunk: pl.DataFrame, by_dir: dict) -> None:
        """Reduce a chunk of raw ``type_id, metric_id, time, value_pct`` rows (``by_dir``:
        direction -> its metric ids) that follows the previous ones: the rows of each metric
        picked by a mask, in rowid order."""
        if any(chunk.null_count().row(0)):
            chunk = chunk.drop_nulls()  # a damaged sample cannot be placed
        if chunk.height == 0:
            return
        ok = in_range(chunk["value_pct"].to_numpy())
        if not ok.all():  # out of range: set aside, counted per direction
            me = chunk["metric_id"].to_numpy()
            for d, mids in by_dir.items():
                n = int((~ok & np.isin(me, mids)).sum())
                if n:
                    self.set_aside[d] = self.set_aside.get(d, 0) + n
            chunk = chunk.filter(pl.Series(ok))
            if chunk.height == 0:
                return
        ty, me = chunk["type_id"].to_numpy(), chunk["metric_id"].to_numpy()
        t_all, v_all = chunk["time"].to_numpy(), chunk["value_pct"].to_numpy()
        tids = [int(ty[0])] if (ty == ty[0]).all() else np.unique(ty).tolist()
        for tid in tids:
            mt = None if len(tids) == 1 else ty == tid
            for d, mids in by_dir.items():
                m = me == mids[0] if len(mids) == 1 else np.isin(me, mids)
                if mt is not None:
                    m &= mt
                if m.any():
                    self._metric(tid, d, t_all[m], v_all[m])

    def _metric(self, tid: int, d: str, t: np.ndarray, v: np.ndarray) -> None:
        last = self.last.get((tid, d))
        if (t.size > 1 and (t[1:] < t[:-1]).any()) or (last is not None and t[0] < last):
            raise _Unsorted
        self.seen.add(tid)
        start = np.empty_like(t)
        start[1:] = t[:-1]
        first = last is None
        start[0] = t[0] if first else last
        if first:
            self.pending.append((tid, d, int(t[0]), float(v[0])))
        self.diffs.add((t - start)[1:] if first else t - start)
        self.last[(tid, d)] = int(t[-1])
        if tid not in self.mapping:
            if self.mapping:
                raise _Unsorted  # a type the mapping did not know: the mapping may change
            return
        dev = self.mapping[tid]
        for gpid in self.ranks.get(dev, ()):
            self._rank(gpid, dev, d, tid, t, start, v, first)

    def _rank(self, gpid, dev, d, tid, t, start, v, first) -> None:
        g = self.group(gpid, dev, d)
        nw = g.ws.size
        j = np.searchsorted(g.ws, t, side="right") - 1
        jj = np.maximum(j, 0)
        idx = np.where((j >= 0) & (t < g.we[jj]) if nw else np.zeros(t.size, bool), jj, nw)
        g.cnt += np.bincount(idx, minlength=nw + 1)
        g.sum += np.bincount(idx, weights=v, minlength=nw + 1)
        np.maximum.at(g.max, idx, v)
        ft = g.cum(t)
        fs = np.empty_like(ft)  # the cumulative at each start is the one at the previous time
        fs[1:] = ft[:-1]
        fs[0] = g.cum(start[:1])[0]
        moved = ft - fs
        zero = moved <= 0
        if first:
            zero[0] = False  # decided in finish(), once the median interval is known
        g.base.add(v[zero])
        # saturation runs, the open one carried across chunk edges
        hi = v >= self.threshold
        edges = np.diff(np.concatenate([[0], hi.astype(np.int8), [0]]))
        rs, re_ = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if rs.size:
            vv = np.append(v, 0.0)
            cut = np.empty(2 * rs.size, np.int64)
            cut[0::2], cut[1::2] = rs, re_
            sums = np.add.reduceat(vv, cut)[0::2]
            peaks = np.maximum.reduceat(vv, cut)[0::2]
            runs = [[int(start[a]), int(t[b - 1]), int(b - a), float(sm), float(pk), first and a == 0]
                    for a, b, sm, pk in zip(rs.tolist(), re_.tolist(), sums.tolist(), peaks.tolist())]
            if g.carry is not None:
                if rs[0] == 0:
                    c, r0 = g.carry, runs[0]
                    runs[0] = [c[0], r0[1], c[2] + r0[2], c[3] + r0[3], max(c[4], r0[4]), c[5]]
                else:
                    g.runs.append(g.carry)
                g.carry = None
            if re_[-1] == t.size:
                g.carry = runs.pop()
            g.runs.extend(runs)
        elif g.carry is not None:
            g.runs.append(g.carry)
            g.carry = None
        if self.keep:
            f = pl.DataFrame({"start": start, "time": t, "value_pct": v,
                              "copy_gbps": np.maximum(moved, 0.0) / np.maximum(t - start, 1)})
            if first:  # dated in finish()
                head = pl.int_range(pl.len()) == 0
                f = f.with_columns(start=pl.when(head).then(None).otherwise(pl.col("start")),
                                   copy_gbps=pl.when(head).then(None).otherwise(pl.col("copy_gbps")))
            self.parts.append(f.select(global_pid=pl.lit(gpid, pl.Int64), device=pl.lit(dev, pl.Int64),
                                       type_id=pl.lit(tid, pl.Int64), direction=pl.lit(d, pl.String),
                                       start="start", time="time", value_pct="value_pct", copy_gbps="copy_gbps"))

    def finish(self) -> PcieReduction:
        step = int(self.diffs.median(np.int64) or 0)
        first_start, fills = {}, []
        for tid, d, t0, v0 in self.pending:  # the first sample of each metric: start = time - median interval
            s0 = t0 - step
            first_start[(tid, d)] = s0
            dev = self.mapping.get(tid)
            if dev is None:
                continue
            for gpid in self.ranks.get(dev, ()):
                g = self.group(gpid, dev, d)
                moved = float(g.cum([t0])[0] - g.cum([s0])[0])
                if moved <= 0:
                    g.base.add(np.array([v0]))
                fills.append((gpid, dev, tid, d, s0, max(moved, 0.0) / max(t0 - s0, 1)))
        wrows, brows, rrows = [], [], []
        samples = 0
        for (gpid, dev, d), g in self.groups.items():
            if g.carry is not None:
                g.runs.append(g.carry)
                g.carry = None
            nz = np.flatnonzero(g.cnt)
            samples += int(g.cnt.sum())
            for k in nz.tolist():
                wrows.append((gpid, dev, d, int(g.wid[k]) if k < g.ws.size else None, int(g.cnt[k]), float(g.sum[k]),
                              float(g.max[k])))
            b = g.base.median(np.float64)
            if b is not None:
                brows.append((gpid, dev, d, float(b)))
            for r in g.runs:  # a run from the metric's first sample starts where that sample does
                rrows.append((gpid, dev, d, first_start[(g.tid, d)] if r[5] else r[0], r[1], r[2], r[3], r[4]))
        keys = {"global_pid": pl.Int64, "device": pl.Int64, "direction": pl.String}
        windows = pl.DataFrame(wrows, schema={**keys, "window_id": self.w.schema["window_id"], "samples": pl.Int64,
                                              "sum_pct": pl.Float64, "peak_pct": pl.Float64}, orient="row")
        cols = ("iteration", "phase", "micro_step", "boundary")
        windows = windows.join(self.model.windows.select("window_id", *cols), on="window_id", how="left").with_columns(
            phase=pl.col("phase").fill_null("other"), boundary=pl.col("boundary").fill_null(False))
        baseline = pl.DataFrame(brows, schema={**keys, "baseline_pct": pl.Float64}, orient="row")
        runs = pl.DataFrame(rrows, schema={**keys, "start": pl.Int64, "end": pl.Int64, "samples": pl.Int64,
                                           "sum_pct": pl.Float64, "peak_pct": pl.Float64}, orient="row")
        series = None
        if self.keep:
            series = self._series(fills)
        return PcieReduction(self.threshold, windows, baseline, runs, series, samples,
                             set_aside=dict(sorted(self.set_aside.items())))

    def _series(self, fills: list) -> pl.DataFrame:
        schema = {"global_pid": pl.Int64, "device": pl.Int64, "type_id": pl.Int64, "direction": pl.String,
                  "start": pl.Int64, "time": pl.Int64, "value_pct": pl.Float64, "copy_gbps": pl.Float64}
        if not self.parts:
            return attach_window(self.model, pl.DataFrame(schema=schema), "time")
        s = pl.concat(self.parts, rechunk=True)
        self.parts = []
        if fills:
            f = pl.DataFrame(fills, schema={"global_pid": pl.Int64, "device": pl.Int64, "type_id": pl.Int64,
                                          "direction": pl.String, "_s": pl.Int64, "_g": pl.Float64}, orient="row")
            s = s.join(f, on=["global_pid", "device", "type_id", "direction"], how="left", maintain_order="left")
            s = s.with_columns(start=pl.col("start").fill_null(pl.col("_s")),
                               copy_gbps=pl.col("copy_gbps").fill_null(pl.col("_g"))).drop("_s", "_g")
        s = s.sort([*RANK, "direction", "time"], maintain_order=True)
        return attach_window(self.model, s, "time")
