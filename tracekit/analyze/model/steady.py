"""Steady iterations: the complete iterations that per-iteration figures average over, warm-up apart.

The one warm-up rule of tracekit (:func:`split_warmup`); every "mean per steady iteration"
(the what-if model and advice, the CPU optimizer step, the update finding, the report's key
numbers and figures, ``compare``) takes its iterations from it:

- **warm-up** = the iterations that hold any of the rank's first :data:`WARMUP_MICRO_STEPS`
  micro-steps (forward windows) counted from iteration 0: iteration 0, plus iteration 1 when
  iteration 0 holds a single micro-step (``gradient_accumulation_steps`` 1);
- **steady** = the other complete iterations, as long as at least one remains; else the rule
  falls back to leaving out iteration 0 alone when another iteration remains (and to all
  iterations when there is only one).

Where the rule comes from (measured on an H200, ``benchmarks/whatif/summaries.json``, wall time
per iteration): in ZeRO-3 runs the run's first **two** micro-steps are slow, not only the
first. With ``gradient_accumulation_steps`` 2 both fall in iteration 0 (its second forward took
1,012 ms against ~150 ms steady on a 1.3 B model, 376 against ~85 ms on 134 M). With
``gradient_accumulation_steps`` 1 (runs ``z3s_mb2``, ``z3l_mb2``: micro-batch 2 x gas 1) the
second micro-step falls in iteration 1, which was then counted as steady although it is an
outlier: ``z3s_mb2`` iteration 1 1,172 ms against a median of 732 ms (iterations 1-9), ``z3l_mb2`` 4,521 against
3,412 ms (its forward 661 against ~155 ms, mostly host time between CUDA API calls; no module
loading). ZeRO-2 with gas 1 (``z2s_mb2``) shows no such outlier (iteration 1 275 ms against
~295 ms), so leaving one more iteration out there costs only one sample.

Iterations are numbered from 0 at the trace's first iteration, or after tracekit's
``iteration N`` ranges, or from the first kept iteration of a cut (``tracekit trim``): a trace
whose first iteration is not 0 holds no warm-up and every complete iteration is steady.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import polars as pl

#: The run's first this many micro-steps (forward windows) are warm-up (see the module doc).
WARMUP_MICRO_STEPS = 2


def split_warmup(iterations: Iterable[int], forwards: Mapping[int, int] | None = None) -> tuple[list[int], list[int]]:
    """``(steady, warmup)`` of one rank by the warm-up rule (module doc).

    ``iterations``: the candidate iterations (normally the rank's complete ones; any order,
    duplicates ignored). ``forwards``: ``{iteration: number of forward windows}`` of the rank,
    over all its iterations, complete or not (:func:`forward_counts`); None or a missing
    iteration counts as 0 (then only iteration 0 is warm-up, the rule before gas-1 runs were
    measured). Returns two sorted lists that partition ``iterations``: ``steady`` is empty only
    when ``iterations`` is; ``warmup`` holds the iterations left out. Raises nothing."""
    its = sorted(set(int(i) for i in iterations))
    forwards = forwards or {}
    warm = {0}
    seen, i = forwards.get(0, 0), 0
    # iteration 0 holds the first micro-step; the next iterations hold the following ones
    while 0 < seen < WARMUP_MICRO_STEPS and forwards.get(i + 1, 0) > 0:
        i += 1
        warm.add(i)
        seen += forwards[i]
    steady = [i for i in its if i not in warm]
    if not steady:  # keep at least one steady iteration: iteration 0 alone apart, as before
        steady = [i for i in its if i != 0] if len(its) > 1 else its
    return steady, [i for i in its if i not in steady]


def forward_counts(windows: pl.DataFrame, global_pid: int | None = None) -> dict:
    """Forward windows per iteration, from phase windows
    (:data:`tracekit.analyze.model.phases.WINDOW_COLUMNS`; needs ``global_pid, iteration,
    phase``): ``{iteration: count}`` of ``global_pid``'s process, or with ``global_pid`` None
    ``{global_pid: {iteration: count}}`` of every process. Windows outside iterations are not
    counted."""
    w = windows.filter((pl.col("phase") == "forward") & pl.col("iteration").is_not_null())
    if global_pid is not None:
        w = w.filter(pl.col("global_pid") == global_pid)
        return {int(i): int(n) for i, n in w.group_by("iteration").len().iter_rows()}
    out: dict = {}
    for gp, i, n in w.group_by("global_pid", "iteration").len().iter_rows():
        out.setdefault(int(gp), {})[int(i)] = int(n)
    return out


def warmup_keys(windows: pl.DataFrame) -> pl.DataFrame:
    """The warm-up iterations of every process by :func:`split_warmup`, over each process's
    iterations that have phase windows: a frame ``global_pid, iteration`` (the dtypes of
    ``windows``), empty when no process has one."""
    w = windows.filter(pl.col("iteration").is_not_null())
    schema = {"global_pid": w.schema["global_pid"], "iteration": w.schema["iteration"]}
    fw = forward_counts(w)
    rows = []
    for gp in sorted(w["global_pid"].unique().to_list()):
        its = w.filter(pl.col("global_pid") == gp)["iteration"].unique().to_list()
        rows += [(gp, i) for i in split_warmup(its, fw.get(int(gp), {}))[1]]
    return pl.DataFrame(rows, schema=schema, orient="row")
