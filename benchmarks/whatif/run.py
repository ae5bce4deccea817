"""The what-if benchmark: predicted vs measured iteration time on recorded pairs of real runs.

    python benchmarks/whatif/run.py                  # the table (results.md is its output)
    python benchmarks/whatif/run.py --json           # the rows as JSON
    python benchmarks/whatif/run.py --traces DIR     # predict from full exports in DIR instead
    python benchmarks/whatif/run.py --summarize DIR  # rewrite summaries.json from full exports
    python benchmarks/whatif/run.py --no-manifest    # statistics with each config inferred from its trace alone

Each pair is a baseline run and a run with one DeepSpeed setting changed, recorded in the same
device call (benchmarks/whatif/record.sh; README.md says what and how). The *prediction* is the
what-if model (:mod:`tracekit.analyze.sections.whatif`) applied to the baseline's trace alone:
by default the committed cut ``traces/BASELINE.sqlite.xz`` (steady iterations 1-N, see README),
decompressed once into a cache folder. The *measured* side is the changed run's own full trace,
kept as ``summaries.json``: per steady iteration (warm-up iteration 0 left out) its wall time
and the wall time of each phase (ns, tracekit's phase table of rank 0); the measured iteration
time is their mean, the same basis as the prediction (ms per steady iteration).

Error % = 100 * (predicted - measured) / measured. Per phase, the prediction is the baseline's
phase plus the scenario's ``phase_delta_ns`` where it gives one, else the whole saving taken
from the update. *Interval*: the scenario's ``interval_ns`` ``[low, high]``, the 95 % interval of
the predicted iteration time (docs/advice.md, "Interval": the baseline's iteration noise, the
modelled term and the between-run term; none with fewer than 2 steady iterations); *inside*:
the measured mean within it; the last two columns are the same for ``interval_within_run_ns``,
the interval without the between-run term (``--json``: ``interval_within_run``,
``inside_within_run``). The noise rows (a baseline recorded twice, no change) give the measured
spread; the Summary recomputes the between-run term from the same-call ones
(:func:`between_run_spread`; ``--json``: ``stats["between_run"]``) beside the model's constant. A pair whose change has no scenario in the model is shown
with the baseline as the prediction ("no scenario") and counted apart in the statistics.
*Per change*: every pair that records one change (the same family, scenario and changes:
:func:`change_key`), single and repeated, pooled by :func:`by_change` (each error weighted by
``1 / (1 / baseline runs + 1 / changed runs)``); its median / p90 are the benchmark's estimate of
the model's error with the drift between runs averaged down.
Rank correlation: Spearman's rho of predicted vs measured iteration time over a baseline and its
changed runs (the baseline counts with predicted = measured = its own time), for baselines with
at least 2 modelled changes.
"""

from __future__ import annotations

import json
import lzma
import re
import shutil
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PHASES = ("forward", "backward", "update", "other")

#: changed run -> (baseline run, scenario or None, scenario changes, what changed)
PAIRS = {
    # call 1: ZeRO-3, 134 M, fp16, offload_optimizer cpu pin_memory false, micro-batch 1 x gas 2
    "z3s_base2": ("z3s_base", "noise", {}, "ZeRO-3 134M: baseline again (noise floor)"),
    "z3s_pin": ("z3s_base", "pin_memory", {}, "ZeRO-3 134M: offload_optimizer.pin_memory false -> true"),
    "z3s_bf16": ("z3s_base", "bf16", {}, "ZeRO-3 134M: fp16 -> bf16"),
    "z3s_nooffload": ("z3s_base", "no_offload", {"gpu_optimizer": "torch"},
                      "ZeRO-3 134M: no offload_optimizer (torch.optim.AdamW on the GPU)"),
    "z3s_sg1e8": ("z3s_base", "sub_group_size", {"sub_group_size": 1e8}, "ZeRO-3 134M: sub_group_size 1e9 -> 1e8"),
    "z3s_base@sg1e8": ("z3s_sg1e8", "sub_group_size", {"sub_group_size": 1e9},
                       "ZeRO-3 134M: sub_group_size 1e8 -> 1e9 (reverse pair)"),
    # call 2: the same ZeRO-3 baseline recorded again, and ZeRO-2 134M (same keys, stage 2)
    "z3s_mb2": ("z3s_base3", "larger_micro_batch", {}, "ZeRO-3 134M: micro-batch 1 x gas 2 -> 2 x gas 1 (same global batch)"),
    "z3s_sg2e7": ("z3s_base3", "sub_group_size", {"sub_group_size": 2e7}, "ZeRO-3 134M: sub_group_size 1e9 -> 2e7"),
    "z2s_base2": ("z2s_base", "noise", {}, "ZeRO-2 134M: baseline again (noise floor)"),
    "z2s_pin": ("z2s_base", "pin_memory", {}, "ZeRO-2 134M: offload_optimizer.pin_memory false -> true"),
    "z2s_bf16": ("z2s_base", "bf16", {}, "ZeRO-2 134M: fp16 -> bf16"),
    "z2s_nooffload": ("z2s_base", "no_offload", {"gpu_optimizer": "torch"},
                      "ZeRO-2 134M: no offload_optimizer (torch.optim.AdamW on the GPU)"),
    # call 3: SuperOffload and ZenFlow, 134 M, bf16 (examples/ds_superoffload.json, ds_zenflow.json)
    "so_noclip": ("so_base", "superoffload_no_clipping", {}, "SuperOffload 134M: gradient_clipping 1.0 -> 0.0"),
    "zf_topk05": ("zf_base", None, {}, "ZenFlow 134M: topk_ratio 0.1 -> 0.05"),
    # call 4 (2026-12-02): ZeRO-3 1.3 B, the z3s config (fp16, pin_memory false, micro-batch 1 x gas 2)
    "z3l_base2": ("z3l_base", "noise", {}, "ZeRO-3 1.3B: baseline again (noise floor)"),
    "z3l_mb2": ("z3l_base", "larger_micro_batch", {}, "ZeRO-3 1.3B: micro-batch 1 x gas 2 -> 2 x gas 1 (same global batch)"),
    "z3l_bind": ("z3l_base", None, {}, "ZeRO-3 1.3B: deepspeed --bind_cores_to_rank (numactl -C 0-15, OMP_NUM_THREADS=16)"),
    # call 5: ZeRO-3 134 M again (z3s_base4 = the z3s config) and its one-knob changes
    "z3s_base5": ("z3s_base4", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call 5)"),
    "z3s_bind": ("z3s_base4", None, {}, "ZeRO-3 134M: deepspeed --bind_cores_to_rank (numactl -C 0-15, OMP_NUM_THREADS=16)"),
    "z3s_op": ("z3s_base4", None, {}, "ZeRO-3 134M: offload_param cpu (pin_memory false) added"),
    "z3s_oc0": ("z3s_base4", None, {}, "ZeRO-3 134M: overlap_comm true -> false"),
    # call 5's z2s_mb2 against call 6's ZeRO-2 baseline (z2s_base3): a cross-call pair (+-15 % noise)
    "z2s_mb2": ("z2s_base3", "larger_micro_batch", {},
                "ZeRO-2 134M: micro-batch 1 x gas 2 -> 2 x gas 1 (baseline from the next call)"),
    # call 6: SuperOffload and ZenFlow baselines again, one knob each
    "so_rb": ("so_base2", None, {}, "SuperOffload 134M: reduce_bucket_size -> 1e7"),
    "zf_ui2": ("zf_base2", None, {}, "ZenFlow 134M: update_interval (and select_interval) 4 -> 2; gas follows it, so an iteration holds 2 micro-steps, not 4"),
    # call A (2026-12-02): ZeRO-3 134 M again; sub_group_size 2e7 (z3s_sg2e7b, recorded as z3s_sg2e7), and
    # on it offload_optimizer.ratio 0.5 (z3s_fused, no offload with FusedAdam, failed to build: not here)
    "z3s_base7": ("z3s_base6", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call A)"),
    "z3s_sg2e7b": ("z3s_base6", "sub_group_size", {"sub_group_size": 2e7}, "ZeRO-3 134M: sub_group_size 1e9 -> 2e7 (call A)"),
    "z3s_sg2e7r05": ("z3s_sg2e7b", "ratio", {"ratio": 0.5},
                     "ZeRO-3 134M, sub_group_size 2e7: offload_optimizer.ratio 1 -> 0.5"),
    # call B: ZeRO-3 2.7 B (hidden 2560, 32 layers, seq 512), the z3s config; 8 steady iterations each
    "z3x_pin": ("z3x_base", "pin_memory", {}, "ZeRO-3 2.7B: offload_optimizer.pin_memory false -> true"),
    "z3x_base2": ("z3x_base", "noise", {}, "ZeRO-3 2.7B: baseline again (noise floor, call B)"),
    # call C: ZeRO-3 1.3 B again (z3l_base3, recorded as z3l_base), no offload with either GPU Adam
    "z3l_nooffload": ("z3l_base3", "no_offload", {"gpu_optimizer": "torch"},
                      "ZeRO-3 1.3B: no offload_optimizer (torch.optim.AdamW on the GPU)"),
    "z3l_fused": ("z3l_base3", "no_offload", {"gpu_optimizer": "fused"},
                  "ZeRO-3 1.3B: no offload_optimizer (DeepSpeed FusedAdam on the GPU)"),
    # call D (2026-12-02 night): ZeRO-3 134 M, each config twice, interleaved; the pairs themselves
    # are in REPEATS (means over the repeats); here the baseline's second recording
    "z3s_base9": ("z3s_base8", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call D)"),
    # call E: ZeRO-3 1.3 B, base / micro-batch 2 / base / micro-batch 2
    "z3l_base6": ("z3l_base5", "noise", {}, "ZeRO-3 1.3B: baseline again (noise floor, call E)"),
    # call F: ZeRO-2 134 M, base / bf16 / micro-batch 2, twice
    "z2s_base5": ("z2s_base4", "noise", {}, "ZeRO-2 134M: baseline again (noise floor, call F)"),
    # calls H-K (2026-12-03): each a baseline twice, interleaved with the changes (REPEATS)
    "z3s_base12": ("z3s_base11", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call H)"),
    "z2s_base7": ("z2s_base6", "noise", {}, "ZeRO-2 134M: baseline again (noise floor, call I)"),
    "so_base4": ("so_base3", "noise", {}, "SuperOffload 134M: baseline again (noise floor, call J)"),
    "z3s_base14": ("z3s_base13", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call K)"),
    # calls L-N (2026-12-03 evening): a baseline 4 times, interleaved with one change 4 times
    # (REPEATS); two disjoint same-call pairs of its baselines as noise rows
    "z3s_base16": ("z3s_base15", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call L, runs 1/3)"),
    "z3s_base18": ("z3s_base17", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call L, runs 5/7)"),
    "z3s_base20": ("z3s_base19", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call M, runs 1/3)"),
    "z3s_base22": ("z3s_base21", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call M, runs 5/7)"),
    "z3s_base24": ("z3s_base23", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call N, runs 1/3)"),
    # calls O-Q (2026-12-03 night): the same, for micro-batch 2 (ZeRO-3 134 M and 1.3 B) and SuperOffload's clipping
    "z3s_base27": ("z3s_base26", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call O, runs 1/3)"),
    "z3s_base29": ("z3s_base28", "noise", {}, "ZeRO-3 134M: baseline again (noise floor, call O, runs 5/7)"),
    "z3l_base8": ("z3l_base7", "noise", {}, "ZeRO-3 1.3B: baseline again (noise floor, call P, runs 1/3)"),
    "so_base6": ("so_base5", "noise", {}, "SuperOffload 134M: baseline again (noise floor, call Q, runs 1/3)"),
    "so_base8": ("so_base7", "noise", {}, "SuperOffload 134M: baseline again (noise floor, call Q, runs 5/7)"),
}
#: repeated pairs: a baseline and a one-knob change each recorded 2 (calls D-K) or 3-4 times (calls L-Q) in one call, interleaved
#: (base, change, base, change), so that a drift of the host during the call falls on both sides.
#: name -> (baseline runs, changed runs, scenario, scenario changes, what changed). The prediction
#: is the mean of the predictions from each baseline's cut, the measured time the mean of the
#: changed runs' means (each run weighs the same), the interval the mean of the intervals' ends.
REPEATS = {
    "z3s_mb2 x2": (("z3s_base8", "z3s_base9"), ("z3s_mb2_r2", "z3s_mb2_r3"), "larger_micro_batch", {},
                   "ZeRO-3 134M: micro-batch 1 x gas 2 -> 2 x gas 1 (call D)"),
    "z3s_bf16 x2": (("z3s_base8", "z3s_base9"), ("z3s_bf16_r2", "z3s_bf16_r3"), "bf16", {},
                    "ZeRO-3 134M: fp16 -> bf16 (call D)"),
    "z3s_sg2e7 x1": (("z3s_base8", "z3s_base9"), ("z3s_sg2e7_r2",), "sub_group_size", {"sub_group_size": 2e7},
                     "ZeRO-3 134M: sub_group_size 1e9 -> 2e7 (call D; its second run skipped: time)"),
    "z3s_sg2e7 x2": (("z3s_base10",), ("z3s_sg2e7_r3", "z3s_sg2e7_r4"), "sub_group_size", {"sub_group_size": 2e7},
                     "ZeRO-3 134M: sub_group_size 1e9 -> 2e7 (call G: change, base, change)"),
    "z3l_mb2 x2": (("z3l_base5", "z3l_base6"), ("z3l_mb2_r2", "z3l_mb2_r3"), "larger_micro_batch", {},
                   "ZeRO-3 1.3B: micro-batch 1 x gas 2 -> 2 x gas 1 (call E)"),
    "z2s_bf16 x2": (("z2s_base4", "z2s_base5"), ("z2s_bf16_r2", "z2s_bf16_r3"), "bf16", {},
                    "ZeRO-2 134M: fp16 -> bf16 (call F)"),
    "z2s_mb2 x2": (("z2s_base4", "z2s_base5"), ("z2s_mb2_r2", "z2s_mb2_r3"), "larger_micro_batch", {},
                   "ZeRO-2 134M: micro-batch 1 x gas 2 -> 2 x gas 1 (call F)"),
    "z3s_pin x2": (("z3s_base11", "z3s_base12"), ("z3s_pin_r2", "z3s_pin_r3"), "pin_memory", {},
                   "ZeRO-3 134M: offload_optimizer.pin_memory false -> true (call H)"),
    "z3s_nooffload x2": (("z3s_base11", "z3s_base12"), ("z3s_nooffload_r2", "z3s_nooffload_r3"), "no_offload",
                         {"gpu_optimizer": "torch"},
                         "ZeRO-3 134M: no offload_optimizer (torch.optim.AdamW on the GPU) (call H)"),
    "z3s_sg1e8 x1": (("z3s_base11", "z3s_base12"), ("z3s_sg1e8_r2",), "sub_group_size", {"sub_group_size": 1e8},
                     "ZeRO-3 134M: sub_group_size 1e9 -> 1e8 (call H; its second run skipped: time)"),
    "z3s_sg1e8 x2": (("z3s_base13", "z3s_base14"), ("z3s_sg1e8_r3", "z3s_sg1e8_r4"), "sub_group_size",
                     {"sub_group_size": 1e8}, "ZeRO-3 134M: sub_group_size 1e9 -> 1e8 (call K)"),
    "z2s_mb2 x2b": (("z2s_base6", "z2s_base7"), ("z2s_mb2_r4", "z2s_mb2_r5"), "larger_micro_batch", {},
                    "ZeRO-2 134M: micro-batch 1 x gas 2 -> 2 x gas 1 (call I)"),
    "z2s_pin x2": (("z2s_base6", "z2s_base7"), ("z2s_pin_r2", "z2s_pin_r3"), "pin_memory", {},
                   "ZeRO-2 134M: offload_optimizer.pin_memory false -> true (call I)"),
    "z2s_nooffload x2": (("z2s_base6", "z2s_base7"), ("z2s_nooffload_r2", "z2s_nooffload_r3"), "no_offload",
                         {"gpu_optimizer": "torch"},
                         "ZeRO-2 134M: no offload_optimizer (torch.optim.AdamW on the GPU) (call I)"),
    "so_noclip x2": (("so_base3", "so_base4"), ("so_noclip_r2", "so_noclip_r3"), "superoffload_no_clipping", {},
                     "SuperOffload 134M: gradient_clipping 1.0 -> 0.0 (call J)"),
    "z3s_bf16 x4": (("z3s_base15", "z3s_base16", "z3s_base17", "z3s_base18"),
                    ("z3s_bf16_r4", "z3s_bf16_r5", "z3s_bf16_r6", "z3s_bf16_r7"), "bf16", {},
                    "ZeRO-3 134M: fp16 -> bf16 (call L: base, change, 4 times)"),
    "z3s_nooffload x4": (("z3s_base19", "z3s_base20", "z3s_base21", "z3s_base22"),
                         ("z3s_nooffload_r4", "z3s_nooffload_r5", "z3s_nooffload_r6", "z3s_nooffload_r7"),
                         "no_offload", {"gpu_optimizer": "torch"},
                         "ZeRO-3 134M: no offload_optimizer (torch.optim.AdamW on the GPU) (call M: base, change, 4 times)"),
    "z3s_sg1e8 x3": (("z3s_base23", "z3s_base24", "z3s_base25"), ("z3s_sg1e8_r5", "z3s_sg1e8_r6", "z3s_sg1e8_r7"),
                     "sub_group_size", {"sub_group_size": 1e8},
                     "ZeRO-3 134M: sub_group_size 1e9 -> 1e8 (call N: base, change, 3 times; the 4th skipped: time)"),
    "z3s_mb2 x3": (("z3s_base26", "z3s_base27", "z3s_base28", "z3s_base29"), ("z3s_mb2_r4", "z3s_mb2_r5", "z3s_mb2_r6"),
                   "larger_micro_batch", {},
                   "ZeRO-3 134M: micro-batch 1 x gas 2 -> 2 x gas 1 (call O: base, change, 3 times, base)"),
    "z3l_mb2 x2b": (("z3l_base7", "z3l_base8", "z3l_base9"), ("z3l_mb2_r4", "z3l_mb2_r5"), "larger_micro_batch", {},
                    "ZeRO-3 1.3B: micro-batch 1 x gas 2 -> 2 x gas 1 (call P: base, change, twice, base)"),
    "so_noclip x3": (("so_base5", "so_base6", "so_base7", "so_base8"), ("so_noclip_r4", "so_noclip_r5", "so_noclip_r6"),
                     "superoffload_no_clipping", {},
                     "SuperOffload 134M: gradient_clipping 1.0 -> 0.0 (call Q: base, change, 3 times, base)"),
    # call N read the other way: the 1e8 runs are the baselines, the 1e9 runs the changed side
    "z3s_base@sg1e8 x3": (("z3s_sg1e8_r5", "z3s_sg1e8_r6", "z3s_sg1e8_r7"), ("z3s_base23", "z3s_base24", "z3s_base25"),
                          "sub_group_size", {"sub_group_size": 1e9},
                          "ZeRO-3 134M: sub_group_size 1e8 -> 1e9 (call N read in reverse)"),
}
#: noise pairs across calls (same config, different device calls): shown with the noise rows
CROSS_CALL = {"z3s_base3": ("z3s_base", "ZeRO-3 134M: baseline of call 2 vs call 1"),
              "z3s_base4": ("z3s_base", "ZeRO-3 134M: baseline of call 5 vs call 1"),
              "z2s_base3": ("z2s_base", "ZeRO-2 134M: baseline of call 6 vs call 2"),
              "so_base2": ("so_base", "SuperOffload 134M: baseline of call 6 vs call 3"),
              "zf_base2": ("zf_base", "ZenFlow 134M: baseline of call 6 vs call 3"),
              "z3s_base6": ("z3s_base", "ZeRO-3 134M: baseline of call A vs call 1"),
              "z3l_base3": ("z3l_base", "ZeRO-3 1.3B: baseline of call C vs call 4"),
              "z3s_base10": ("z3s_base8", "ZeRO-3 134M: baseline of call G vs call D"),
              "z3l_base4": ("z3l_base3", "ZeRO-3 1.3B: baseline again, the next call on the same warm machine, "
                                         "~2 min after call C's last run")}


def trace_of(run: str) -> str:
    """The run whose trace a pair name reads (``z3s_base@sg1e8`` is the run ``z3s_base``)."""
    return run.split("@")[0]


# ----------------------------------------------------------------------------- measuring

def summarize_trace(path: Path) -> dict:
    """Measured summary of one full export (rank 0): ``steady`` (iteration numbers), ``warmup``,
    ``iterations`` ``{str(i): {"wall_ns": int, "phases": {phase: ns}}}`` per steady iteration,
    ``warmup_iterations`` (the same for warm-up iterations other than 0), and ``iteration_ns`` /
    ``phase_ns`` (means over the steady iterations, ns)."""
    import polars as pl

    from tracekit.analyze.model import phases
    from tracekit.analyze.sections import breakdown, whatif
    from tracekit.analyze.trace.export import Export

    with Export.open(path) as ex:
        model = phases.build(ex)
        pieces = whatif.measure(ex, model)[0]
        t = breakdown.phase_table(model)
        t = t.filter((pl.col("global_pid") == pieces["global_pid"]) & (pl.col("device") == pieces["device"])
                     & pl.col("iteration").is_in(pieces["iterations"] + pieces["warmup"]))
        its = {}
        for (i,), g in sorted(t.group_by(["iteration"]), key=lambda kv: kv[0][0]):
            ph = g.group_by("phase").agg(pl.col("wall_ns").sum())
            phs = {p: int(w) for p, w in ph.iter_rows()}
            its[str(i)] = {"wall_ns": int(sum(phs.values())), "phases": {p: phs.get(p, 0) for p in PHASES}}
    steady = {i: v for i, v in its.items() if int(i) in pieces["iterations"]}
    # warm-up iterations after the first (a run of one micro-step per iteration: iteration 1,
    # tracekit.analyze.model.steady), kept for the cut traces' plain-SQL check
    warm = {i: v for i, v in its.items() if int(i) not in pieces["iterations"] and int(i) > 0}
    return {"steady": pieces["iterations"], "warmup": pieces["warmup"], "iterations": steady,
            "warmup_iterations": warm,
            "iteration_ns": pieces["iteration_ns"], "phase_ns": {p: pieces["phase_ns"].get(p, 0.0) for p in PHASES}}


def summarize(d: Path) -> dict:
    """``{run: summary}`` of every ``NAME.sqlite`` in ``d`` with its manifest's DeepSpeed config."""
    out = {}
    for p in sorted(d.glob("*.sqlite")):
        s = summarize_trace(p)
        man = p.with_suffix(".json")
        if man.exists():
            m = json.loads(man.read_text())
            s["deepspeed_config"] = m.get("deepspeed_config")
            s["command_line"] = m.get("command_line")
        out[p.stem] = s
        print(f"{p.stem}: {s['iteration_ns'] / 1e6:,.1f} ms x {len(s['steady'])} steady iterations", file=sys.stderr)
    return out


# ----------------------------------------------------------------------------- predicting

def cut_trace(run: str, traces: Path | None) -> Path:
    """The baseline trace to predict from: ``traces/RUN.sqlite`` (a full export) when ``traces``
    is given, else the committed cut, decompressed once into ``~/.cache/tracekit-whatif-bench``."""
    if traces is not None:
        if not (traces / f"{run}.sqlite").exists():
            raise FileNotFoundError(2, "missing", str(traces / f"{run}.sqlite"))
        return traces / f"{run}.sqlite"
    src = HERE / "traces" / f"{run}.sqlite.xz"
    cache = Path.home() / ".cache" / "tracekit-whatif-bench"
    cache.mkdir(parents=True, exist_ok=True)
    dst = cache / f"{run}.sqlite"
    if not src.exists():
        raise FileNotFoundError(2, "missing", str(src))
    if not dst.exists() or dst.stat().st_mtime < src.stat().st_mtime:
        tmp = dst.with_suffix(".tmp")
        with lzma.open(src) as f, open(tmp, "wb") as g:
            shutil.copyfileobj(f, g)
        tmp.replace(dst)
    return dst


def baseline_pieces(path: Path, manifest: Path | None) -> tuple[dict, dict]:
    """``(pieces of rank 0, settings map)`` of a baseline trace; ``manifest`` (the capture's
    JSON) gives the DeepSpeed config when the trace sits apart from it."""
    from tracekit.analyze.model import phases
    from tracekit.analyze.sections import advice, whatif
    from tracekit.analyze.trace import dsconfig
    from tracekit.analyze.trace.export import Export

    with Export.open(path) as ex:
        pieces = whatif.measure(ex, phases.build(ex))[0]
    has = manifest is not None and manifest.exists()
    loaded = dsconfig.load(None if has else path, ds_config=manifest if has else None)
    inferred = dsconfig.infer_settings(whatif.trace_facts(pieces))
    return pieces, advice.settings_map(dsconfig.settings(loaded, inferred))


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 3 points or a
    constant side."""
    if len(xs) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else None


def percentile(v: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``v``, linear between order statistics."""
    s = sorted(v)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def between_run_spread(summ: dict, pairs: list[tuple[str, str]]) -> float:
    """Pooled relative sd of the difference between two runs of one config beyond their
    iteration-to-iteration noise (the what-if model's ``BETWEEN_RUN_REL_SD``): per pair ``(A, B)``
    ``d = (mean_B - mean_A) / mean_A`` and ``w^2 = (s_A^2 / n_A + s_B^2 / n_B) / mean_A^2`` over the
    runs' steady iteration walls of ``summ`` (summaries.json), ``sqrt(max(mean(d^2 - w^2), 0))``."""
    acc = []
    for a, b in pairs:
        wa = [v["wall_ns"] for v in summ[a]["iterations"].values()]
        wb = [v["wall_ns"] for v in summ[b]["iterations"].values()]
        ma, mb = statistics.fmean(wa), statistics.fmean(wb)
        w2 = (statistics.variance(wa) / len(wa) + statistics.variance(wb) / len(wb)) / ma ** 2
        acc.append(((mb - ma) / ma) ** 2 - w2)
    return max(statistics.fmean(acc), 0.0) ** 0.5 if acc else 0.0


def rows(traces: Path | None = None, manifests: bool = True) -> dict:
    """Every pair of :data:`PAIRS` (and :data:`CROSS_CALL`) and of :data:`REPEATS`: prediction,
    measurement, error. ``manifests=False``: each baseline's config is inferred from its trace
    alone (no capture manifest, no DeepSpeed config), as for a trace recorded without tracekit."""
    from tracekit.analyze.sections import whatif

    summ = json.loads((HERE / "summaries.json").read_text())
    man_dir = HERE / ("manifests" if manifests else "no-such-manifests")
    cache: dict[str, tuple[dict, dict]] = {}
    out = []
    for name, (base, scenario, changes, what) in {**PAIRS, **{k: (b, "noise", {}, w) for k, (b, w) in
                                                              CROSS_CALL.items()}}.items():
        run = trace_of(name)
        m, b = summ[run], summ[base]
        meas = m["iteration_ns"] / 1e6
        row = {"pair": name, "baseline": base, "run": run, "change": what, "scenario": scenario,
               "baseline_ms": round(b["iteration_ns"] / 1e6, 1), "measured_ms": round(meas, 1),
               "measured_steady": len(m["steady"]),
               "measured_spread_ms": [round(min(v["wall_ns"] for v in m["iterations"].values()) / 1e6, 1),
                                      round(max(v["wall_ns"] for v in m["iterations"].values()) / 1e6, 1)],
               "measured_phases_ms": {p: round(m["phase_ns"][p] / 1e6, 1) for p in PHASES}}
        if scenario == "noise":
            row.update(predicted_ms=row["baseline_ms"], error_pct=round(100 * (b["iteration_ns"] / 1e6 - meas) / meas, 1),
                       predicted_from="the baseline's full trace (no change)", interval=None, inside=None,
                       predicted_phases_ms={p: round(b["phase_ns"][p] / 1e6, 1) for p in PHASES})
            out.append(row)
            continue
        if base not in cache:
            cache[base] = baseline_pieces(cut_trace(base, traces), man_dir / f"{base}.json")
        pieces, sett = cache[base]
        pb = pieces["iteration_ns"] / 1e6
        row["predicted_from"] = f"{len(pieces['iterations'])} steady iterations of the baseline ({pb:,.1f} ms)"
        row["prediction_baseline_ms"] = round(pb, 1)
        if scenario is None:
            pred, delta, s = pb, {}, {"confidence": "-", "applicable": False, "why_not": "no scenario in the model"}
        else:
            s = {r["scenario"]: r for r in whatif.predict(pieces, sett, changes)}[scenario]
            pred = s["predicted_ns"] / 1e6
            delta = s.get("phase_delta_ns") or {"update": -s["saving_ns"]}
        iv, iw = s.get("interval_ns"), s.get("interval_within_run_ns")
        interval = None if iv is None else [round(iv[0] / 1e6, 1), round(iv[1] / 1e6, 1)]
        within = None if iw is None else [round(iw[0] / 1e6, 1), round(iw[1] / 1e6, 1)]
        row.update(predicted_ms=round(pred, 1), error_pct=round(100 * (pred - meas) / meas, 1),
                   confidence=s["confidence"], applicable=s["applicable"], why_not=s["why_not"],
                   interval=interval, inside=None if interval is None else interval[0] <= meas <= interval[1],
                   interval_within_run=within,
                   inside_within_run=None if within is None else within[0] <= meas <= within[1],
                   predicted_phases_ms={p: round((pieces["phase_ns"].get(p, 0.0) + delta.get(p, 0.0)) / 1e6, 1)
                                        for p in PHASES})
        out.append(row)
    reps = repeat_rows(summ, traces, man_dir, cache)
    modelled = [r for r in out if r["scenario"] not in (None, "noise")]
    errs = [abs(r["error_pct"]) for r in modelled]
    stats = {"pairs_modelled": len(modelled),
             "median_abs_error_pct": round(statistics.median(errs), 1) if errs else None,
             "p90_abs_error_pct": round(percentile(errs, 0.9), 1) if errs else None,
             "inside_interval": sum(1 for r in modelled if r["inside"]),
             "with_interval": sum(1 for r in modelled if r["interval"] is not None),
             "inside_interval_within_run": sum(1 for r in modelled if r.get("inside_within_run"))}
    same_call = [(b, k) for k, (b, sc, _, _) in PAIRS.items() if sc == "noise"]
    stats["between_run"] = {"rel_sd_pct": round(100 * between_run_spread(summ, same_call), 2),
                            "pairs": [f"{a}/{b}" for a, b in same_call],
                            "model_rel_sd_pct": round(100 * whatif.BETWEEN_RUN_REL_SD, 2)}
    allc = [r for r in out if r["scenario"] != "noise"]
    e2 = [abs(r["error_pct"]) for r in allc]
    stats.update(pairs_all=len(allc), median_abs_error_pct_all=round(statistics.median(e2), 1),
                 p90_abs_error_pct_all=round(percentile(e2, 0.9), 1))
    rho = {}
    for base in sorted({r["baseline"] for r in allc}):
        rs = [r for r in allc if r["baseline"] == base and r["scenario"] is not None]
        if len(rs) < 2:
            rho[base] = None
            continue
        bm = summ[base]["iteration_ns"] / 1e6
        rho[base] = spearman([bm] + [r["predicted_ms"] for r in rs], [bm] + [r["measured_ms"] for r in rs])
        rho[base] = None if rho[base] is None else round(rho[base], 2)
    stats["rank_correlation"] = rho
    # the model's pick among a baseline's recorded changes (lowest predicted time) against the
    # measured best (lowest measured time), for baselines with >= 2 modelled changes; the same for
    # the repeated pairs that share their baseline runs (one call's changes)
    stats["best_change"] = best_changes(modelled, lambda r: r["baseline"])
    stats["best_change_repeated"] = best_changes(reps, lambda r: "/".join(r["baselines"]))
    re_errs = [abs(r["error_pct"]) for r in reps]
    stats["repeated"] = {"pairs": len(reps),
                         "median_abs_error_pct": round(statistics.median(re_errs), 1) if re_errs else None,
                         "p90_abs_error_pct": round(percentile(re_errs, 0.9), 1) if re_errs else None,
                         "inside_interval": sum(1 for r in reps if r["inside"]),
                         "with_interval": sum(1 for r in reps if r["interval"] is not None)}
    stats["by_runs"] = by_runs(modelled, reps)
    stats["by_change"] = by_change(modelled, reps)
    return {"rows": out, "repeated": reps, "stats": stats, "from_cuts": traces is None}


def by_runs(modelled: list[dict], reps: list[dict]) -> dict:
    """|error| % of every modelled pair grouped by how many changed runs its measured side is
    the mean of: "1" (the single pairs and the repeated rows of one changed run), "2", "3-4";
    per group ``{"pairs", "median_abs_error_pct", "p90_abs_error_pct", "max_abs_error_pct"}``.
    The drift between runs (whatif.BETWEEN_RUN_REL_SD, its sd) averages out over more runs; the
    model's own error is what is left."""
    groups = {"1": [abs(r["error_pct"]) for r in modelled]}
    for r in reps:
        n = len(r["runs"])
        groups.setdefault("1" if n == 1 else "2" if n == 2 else "3-4", []).append(abs(r["error_pct"]))
    return {k: {"pairs": len(v), "median_abs_error_pct": round(statistics.median(v), 1),
                "p90_abs_error_pct": round(percentile(v, 0.9), 1), "max_abs_error_pct": round(max(v), 1)}
            for k, v in groups.items() if v}


def change_key(baseline: str, scenario: str, changes: dict) -> str:
    """The change a pair records, the same for every recording of it: the baseline's family (the
    run name before ``_``: z3s, z2s, z3l, z3x, so, zf), the baseline's own variant where it is not a
    plain baseline (``z3s_sg1e8`` for the reverse pairs, ``z3s_sg2e7b`` for the ratio pair), the
    scenario and its changes; e.g. ``z3s: sub_group_size sub_group_size=2e+07``."""
    fam, var = baseline.split("_", 1)
    var = re.sub(r"_r[0-9]+$", "", var)  # z3s_sg1e8_r5: the z3s_sg1e8 config recorded again (record.sh)
    base = fam if var.startswith("base") else f"{fam}_{var}"
    return " ".join([f"{base}:", scenario] + [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in sorted(changes.items())])


def by_change(modelled: list[dict], reps: list[dict]) -> dict:
    """Every recording of one change pooled (:func:`change_key`): the single pairs and the repeated
    rows of it, each error weighted by ``1 / (1 / n_baselines + 1 / n_changed)`` (the inverse of its
    variance when every run drifts by the same between-run sd, whatif.BETWEEN_RUN_REL_SD: a pair of
    one run per side weighs 0.5, 4 runs per side 2). Returns ``{"changes": {key: {"error_pct",
    "rows", "runs", "weight"}}, "median_abs_error_pct", "p90_abs_error_pct", "max_abs_error_pct"}``;
    ``rows``: ``[pair, error_pct, weight]`` of each pair pooled, ``runs``: their changed runs."""
    acc: dict[str, list[tuple[str, float, float, int]]] = {}
    for r in modelled:
        key = change_key(r["baseline"], r["scenario"], PAIRS[r["pair"]][2])
        acc.setdefault(key, []).append((r["pair"], r["error_pct"], 0.5, 1))
    for r in reps:
        key = change_key(r["baselines"][0], r["scenario"], REPEATS[r["pair"]][3])
        nb, nc = len(r["baselines"]), len(r["runs"])
        acc.setdefault(key, []).append((r["pair"], r["error_pct"], 1 / (1 / nb + 1 / nc), nc))
    changes = {}
    for key, v in sorted(acc.items()):
        w = sum(x[2] for x in v)
        changes[key] = {"error_pct": round(sum(x[1] * x[2] for x in v) / w, 1),
                        "rows": [[x[0], x[1], round(x[2], 2)] for x in v],
                        "runs": sum(x[3] for x in v), "weight": round(w, 2)}
    errs = [abs(c["error_pct"]) for c in changes.values()]
    return {"changes": changes, "median_abs_error_pct": round(statistics.median(errs), 1),
            "p90_abs_error_pct": round(percentile(errs, 0.9), 1), "max_abs_error_pct": round(max(errs), 1)}


def best_changes(rs: list[dict], group) -> dict:
    """Per group of rows (``group(row)``, sorted) with >= 2 rows: ``{"predicted_best",
    "measured_best"}`` (the ``pair`` of the lowest ``predicted_ms`` / ``measured_ms``) and ``same``."""
    out = {}
    for key in sorted({group(r) for r in rs}):
        g = [r for r in rs if group(r) == key]
        if len(g) >= 2:
            pred = min(g, key=lambda r: r["predicted_ms"])["pair"]
            meas = min(g, key=lambda r: r["measured_ms"])["pair"]
            out[key] = {"predicted_best": pred, "measured_best": meas, "same": pred == meas}
    return out


def _predict(base: str, scenario: str, changes: dict, traces: Path | None, man_dir: Path, cache: dict) -> dict:
    """The scenario's prediction from ``base``'s cut (or full export): ``predicted_ms``,
    ``basis_ms`` (the baseline's mean over the iterations predicted from), ``interval`` and
    ``phases_ms`` (ms per steady iteration), ``confidence``."""
    from tracekit.analyze.sections import whatif

    if base not in cache:
        cache[base] = baseline_pieces(cut_trace(base, traces), man_dir / f"{base}.json")
    pieces, sett = cache[base]
    s = {r["scenario"]: r for r in whatif.predict(pieces, sett, changes)}[scenario]
    delta = s.get("phase_delta_ns") or {"update": -s["saving_ns"]}
    iv = s.get("interval_ns")
    return {"predicted_ms": s["predicted_ns"] / 1e6, "basis_ms": pieces["iteration_ns"] / 1e6,
            "interval": None if iv is None else (iv[0] / 1e6, iv[1] / 1e6), "confidence": s["confidence"],
            "phases_ms": {p: (pieces["phase_ns"].get(p, 0.0) + delta.get(p, 0.0)) / 1e6 for p in PHASES}}


def repeat_rows(summ: dict, traces: Path | None, man_dir: Path, cache: dict) -> list[dict]:
    """One row per :data:`REPEATS` entry: the mean prediction over its baselines' cuts against
    the mean of its changed runs' means (ms per steady iteration), error %, interval, inside."""
    out = []
    for name, (bases, runs, scenario, changes, what) in REPEATS.items():
        preds = [_predict(b, scenario, changes, traces, man_dir, cache) for b in bases]
        run_ms = [summ[r]["iteration_ns"] / 1e6 for r in runs]
        base_ms = [summ[b]["iteration_ns"] / 1e6 for b in bases]
        pred = statistics.fmean(p["predicted_ms"] for p in preds)
        meas = statistics.fmean(run_ms)
        ivs = [p["interval"] for p in preds]
        iv = None if None in ivs else [round(statistics.fmean(i[0] for i in ivs), 1),
                                       round(statistics.fmean(i[1] for i in ivs), 1)]
        out.append({"pair": name, "change": what, "scenario": scenario, "baselines": list(bases), "runs": list(runs),
                    "baseline_runs_ms": [round(x, 1) for x in base_ms],
                    "prediction_basis_ms": [round(p["basis_ms"], 1) for p in preds],
                    "predictions_ms": [round(p["predicted_ms"], 1) for p in preds],
                    "measured_runs_ms": [round(x, 1) for x in run_ms],
                    "predicted_ms": round(pred, 1), "measured_ms": round(meas, 1),
                    "error_pct": round(100 * (pred - meas) / meas, 1), "interval": iv,
                    "inside": None if iv is None else iv[0] <= meas <= iv[1],
                    "confidence": preds[0]["confidence"],
                    "predicted_phases_ms": {p: round(statistics.fmean(x["phases_ms"][p] for x in preds), 1)
                                            for p in PHASES},
                    "measured_phases_ms": {p: round(statistics.fmean(summ[r]["phase_ns"][p] / 1e6 for r in runs), 1)
                                           for p in PHASES}})
    return out


def render(res: dict) -> str:
    """The Markdown tables of ``res`` (:func:`rows`)."""
    L = ["All times: ms per steady iteration (mean over the run's steady iterations, warm-up iteration 0 "
         "left out); error % = 100 * (predicted - measured) / measured. Measured: the changed run's full trace "
         "(summaries.json). Predicted: the what-if model on the baseline's trace alone"
         + (" (the committed cuts: steady iterations 1-4 of each baseline; *prediction's basis* is their mean)."
            if res.get("from_cuts", True) else " (full exports)."), "",
         "## Pairs", "",
         "| pair | change | baseline ms (all steady / prediction's basis) | predicted ms | measured ms (min-max, n) | error % | interval | inside | confidence | interval without the between-run term | inside |",
         "|---|---|---:|---:|---:|---:|---|---|---|---|---|"]
    for r in res["rows"]:
        if r["scenario"] == "noise":
            continue
        iv = ("no scenario" if r["scenario"] is None else "none (< 2 steady iterations)") if r["interval"] is None else f"{r['interval'][0]:,.1f}-{r['interval'][1]:,.1f}"
        ins = "-" if r["inside"] is None else ("yes" if r["inside"] else "no")
        iw = "-" if r.get("interval_within_run") is None else f"{r['interval_within_run'][0]:,.1f}-{r['interval_within_run'][1]:,.1f}"
        insw = "-" if r.get("inside_within_run") is None else ("yes" if r["inside_within_run"] else "no")
        pred = f"{r['predicted_ms']:,.1f}" + (" (no scenario)" if r["scenario"] is None else "")
        L.append(f"| {r['pair']} | {r['change']} | {r['baseline_ms']:,.1f} / {r['prediction_baseline_ms']:,.1f} | {pred} | {r['measured_ms']:,.1f} "
                 f"({r['measured_spread_ms'][0]:,.1f}-{r['measured_spread_ms'][1]:,.1f}, {r['measured_steady']}) | "
                 f"{r['error_pct']:+.1f} | {iv} | {ins} | {r.get('confidence', '-')} | {iw} | {insw} |")
    L += ["", "## Noise floor (same config recorded twice; 'predicted' = the first run)", "",
          "| pair | what | first ms | second ms (min-max, n) | difference % |", "|---|---|---:|---:|---:|"]
    for r in res["rows"]:
        if r["scenario"] == "noise":
            L.append(f"| {r['pair']} | {r['change']} | {r['baseline_ms']:,.1f} | {r['measured_ms']:,.1f} "
                     f"({r['measured_spread_ms'][0]:,.1f}-{r['measured_spread_ms'][1]:,.1f}, {r['measured_steady']}) "
                     f"| {r['error_pct']:+.1f} |")
    L += ["", "## Per phase (predicted / measured ms per steady iteration)", "",
          "| pair | " + " | ".join(PHASES) + " |", "|---|" + "---:|" * len(PHASES)]
    for r in res["rows"]:
        if r["scenario"] == "noise":
            continue
        cells = [f"{r['predicted_phases_ms'][p]:,.1f} / {r['measured_phases_ms'][p]:,.1f}" for p in PHASES]
        L.append(f"| {r['pair']} | " + " | ".join(cells) + " |")
    L += ["", "## Repeated pairs (each side recorded 1-4 times in one call, interleaved; means)", "",
          "Predicted: the mean of the predictions from each baseline run's cut; measured: the mean of the changed "
          "runs' means (ms per steady iteration, each run's steady iterations).", "",
          "| pair | change | baselines ms (each run: all steady / prediction's basis) | predicted ms (each baseline) "
          "| measured ms (each run) | error % | interval | inside | predicted / measured per phase: forward, backward, "
          "update |",
          "|---|---|---|---:|---:|---:|---|---|---|"]
    for r in res.get("repeated", []):
        bl = ", ".join(f"{b}: {a:,.1f} / {c:,.1f}" for b, a, c in
                       zip(r["baselines"], r["baseline_runs_ms"], r["prediction_basis_ms"]))
        iv = "-" if r["interval"] is None else f"{r['interval'][0]:,.1f}-{r['interval'][1]:,.1f}"
        ins = "-" if r["inside"] is None else ("yes" if r["inside"] else "no")
        ph = ", ".join(f"{r['predicted_phases_ms'][p]:,.1f} / {r['measured_phases_ms'][p]:,.1f}"
                       for p in ("forward", "backward", "update"))
        L.append(f"| {r['pair']} | {r['change']} | {bl} | {r['predicted_ms']:,.1f} "
                 f"({', '.join(f'{x:,.1f}' for x in r['predictions_ms'])}) | {r['measured_ms']:,.1f} "
                 f"({', '.join(f'{x:,.1f}' for x in r['measured_runs_ms'])}) | {r['error_pct']:+.1f} | {iv} | {ins} "
                 f"| {ph} |")
    bc = res["stats"]["by_change"]
    L += ["", "## Per change (every recording of a change pooled)", "",
          "Each change's error: the mean of the errors of every pair that records it (the Pairs and the Repeated "
          "tables), weighted by 1 / (1 / baseline runs + 1 / changed runs): 0.5 for one run per side, 2 for four "
          "(the inverse of the error's variance when each run drifts by the same between-run sd).", "",
          "| change | pairs (error %, weight) | changed runs | error % |", "|---|---|---:|---:|"]
    for key, c in bc["changes"].items():
        parts = ", ".join(f"{n} ({e:+.1f}, {w:.2f})" for n, e, w in c["rows"])
        L.append(f"| {key} | {parts} | {c['runs']} | {c['error_pct']:+.1f} |")
    s = res["stats"]
    L += ["", "## Summary", "",
          f"- modelled pairs: {s['pairs_modelled']}; median |error| {s['median_abs_error_pct']} %, "
          f"p90 |error| {s['p90_abs_error_pct']} %",
          f"- all pairs (changes without a scenario predicted as no change): {s['pairs_all']}; median |error| "
          f"{s['median_abs_error_pct_all']} %, p90 |error| {s['p90_abs_error_pct_all']} %",
          f"- measured run inside the prediction's interval: {s['inside_interval']} of {s['with_interval']} pairs with "
          f"an interval" + (" (the model gives no interval yet)" if not s["with_interval"] else
                            f" (with the between-run term: {s['between_run']['model_rel_sd_pct']} % of the predicted "
                            "iteration)"),
          f"- measured run inside the interval without the between-run term (the baseline's iteration noise and the "
          f"modelled term only): {s['inside_interval_within_run']} of {s['with_interval']}",
          f"- between-run spread from the same-call noise rows ({', '.join(s['between_run']['pairs'])}; pooled relative "
          f"sd of the difference beyond the iteration noise): {s['between_run']['rel_sd_pct']} %; the model's "
          f"constant: {s['between_run']['model_rel_sd_pct']} %",
          f"- repeated pairs: {s['repeated']['pairs']}; median |error| {s['repeated']['median_abs_error_pct']} %, "
          f"p90 |error| {s['repeated']['p90_abs_error_pct']} %; measured inside the interval in "
          f"{s['repeated']['inside_interval']} of {s['repeated']['with_interval']}",
          "- |error| by the number of changed runs a pair's measured time is the mean of (1: the single pairs and "
          "the repeated rows of one changed run): "
          + "; ".join(f"{k} run{'s' if k != '1' else ''}: {v['pairs']} pairs, median {v['median_abs_error_pct']} %, "
                      f"p90 {v['p90_abs_error_pct']} %, max {v['max_abs_error_pct']} %" for k, v in s["by_runs"].items()),
          f"- per change, every recording pooled: {len(bc['changes'])} changes; median |error| "
          f"{bc['median_abs_error_pct']} %, p90 |error| {bc['p90_abs_error_pct']} %, max {bc['max_abs_error_pct']} %",
          "- rank correlation (Spearman) of predicted vs measured per baseline (baseline + its modelled changes): "
          + ", ".join(f"{b}: {'n/a (< 2 modelled changes)' if v is None else v}" for b, v in s["rank_correlation"].items()),
          "- the best recorded change per baseline (>= 2 modelled changes; lowest predicted vs lowest measured ms): "
          + ", ".join(f"{b}: predicted {v['predicted_best']}, measured {v['measured_best']} "
                      f"({'same' if v['same'] else 'different'})" for b, v in s["best_change"].items()),
          "- the best repeated change per set of baseline runs (>= 2 changes on the same baselines; lowest predicted "
          "vs lowest measured ms): "
          + ", ".join(f"{b}: predicted {v['predicted_best']}, measured {v['measured_best']} "
                      f"({'same' if v['same'] else 'different'})" for b, v in s["best_change_repeated"].items())]
    return "\n".join(L) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--summarize"]:
        if len(argv) < 2 or not Path(argv[1]).is_dir():
            print("--summarize needs a folder of full exports (NAME.sqlite, NAME.json)", file=sys.stderr)
            return 2
        # runs already summarised and not in the folder stay (each call's exports are apart)
        res = json.loads((HERE / "summaries.json").read_text()) if (HERE / "summaries.json").exists() else {}
        res.update(summarize(Path(argv[1])))
        (HERE / "summaries.json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
        return 0
    traces = None
    if "--traces" in argv:
        i = argv.index("--traces")
        if i + 1 >= len(argv) or not Path(argv[i + 1]).is_dir():
            print("--traces needs a folder of full exports (NAME.sqlite)", file=sys.stderr)
            return 2
        traces = Path(argv[i + 1])
    try:
        res = rows(traces)
    except FileNotFoundError as exc:
        print(f"{exc.filename}: missing (record the runs with benchmarks/whatif/record.sh; README.md)", file=sys.stderr)
        return 2
    if "--no-manifest" in argv:  # only the statistics: results.md is the run with manifests
        res = rows(traces, manifests=False)
        print(json.dumps({"stats": res["stats"], "errors": {r["pair"]: r["error_pct"] for r in res["rows"] + res["repeated"]
                                                            if r["scenario"] not in (None, "noise")}}, indent=1))
        return 0
    print(json.dumps(res, indent=1) if "--json" in argv else render(res), end="" if "--json" not in argv else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
