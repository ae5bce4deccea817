"""Recompute the advice validation table of docs/advice.md from the traces.

    python benchmarks/advice_validation.py [DIR]      # DIR: /tmp/pairs (default)
    python benchmarks/advice_validation.py DIR --json

DIR holds ``base.sqlite`` and one trace per single config change (``pin``, ``bf16``,
``nooffload``, ``subgroup``, ``ratio``: see benchmarks/record_advice_pairs.sh), each with its
manifest ``NAME.json``, and may hold SuperOffload pairs with their own baseline
(``superoffload`` -> ``superoffload_noclip``, ``superoffload_rb`` -> ``superoffload_noclip_rb``:
benchmarks/record_engines.sh). Every changed run is *predicted from its baseline alone* with the
what-if model (:mod:`tracekit.analyze.sections.whatif`) and *measured from its own trace*: the
mean wall time of its steady iterations (complete ones, warm-up iteration 0 left out), the same
basis as the prediction. Error % = 100 * (predicted - measured) / measured. Per phase, the
prediction is the baseline's phase plus the scenario's ``phase_delta_ns`` where the scenario
gives one, else the whole saving taken from the phase of :data:`SAVING_PHASE` (where the work
it removes lies).

The host's single-thread speed drifts from run to run on the recording machine (a VM: base and
an identical base2 differed by 12 %), so each row also shows a host-speed probe of both runs,
:func:`launch_us` (the mean CPU time of a ``cudaLaunchKernel`` call in the steady forwards, work
no config change here touches), and for :data:`NORMALISED` runs a second error against the
measured run *normalised* (:func:`normalised_ms`): the phases the change cannot touch taken
from base, the update divided by the slowdown of the update's own step the change cannot touch
(the fp16 overflow check, one pass over the whole gradient buffer on the CPU whatever the
sub-groups).

The training's own step times (``step N loss L time_s T``, mean of steps >= 1) are shown beside
the traced ones as a cross-check, from ``pairs.log`` (runs named by its ``=== [S s] NAME:``
lines) or ``NAME.out``. Prints a Markdown table and a per-phase table; ``--json`` prints the
rows. A missing DIR/base.sqlite: one line, exit 2.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: changed run -> (scenario of the what-if model, change targets, what changed[, baseline run])
PAIRS = {
    "pin": ("pin_memory", {}, "offload_optimizer.pin_memory false -> true"),
    "bf16": ("bf16", {}, "fp16 -> bf16"),
    # FusedAdam failed to build on the recording machine: the run used torch_adam (torch.optim.AdamW)
    "nooffload": ("no_offload", {"gpu_optimizer": "torch"},
                  "no offload_optimizer (optimizer on the GPU: torch.optim.AdamW, torch_adam true)"),
    "subgroup": ("sub_group_size", {"sub_group_size": 2e7}, "sub_group_size 1e9 -> 2e7"),
    "ratio": ("ratio", {"ratio": 0.5}, "offload_optimizer.ratio 1 -> 0.5"),
    "superoffload_noclip": ("superoffload_no_clipping", {}, "SuperOffload gradient_clipping 1.0 -> 0.0", "superoffload"),
    "superoffload_noclip_rb": ("superoffload_no_clipping", {},
                               "SuperOffload gradient_clipping 1.0 -> 0.0, reduce_bucket_size 1e7", "superoffload_rb"),
}
#: scenario without phase_delta_ns -> the phase its saving comes out of (the CPU optimizer waits
#: of superoffload_no_clipping are inside the update)
SAVING_PHASE = {"superoffload_no_clipping": "update"}
#: runs whose change touches neither forward nor backward: shown also normalised (host drift)
NORMALISED = {"subgroup", "ratio"}
#: phases a change cannot touch (the normalisation takes them from base)
UNTOUCHED = {"subgroup": ("forward", "backward", "other"), "ratio": ("forward", "backward", "other")}
PHASES = ("forward", "backward", "update", "other")


def measure(path: Path) -> dict | None:
    """The what-if pieces of rank 0 of a trace (:func:`tracekit.analyze.sections.whatif.measure`), or
    None when it has no complete iteration (the run failed or was cut short)."""
    from tracekit.analyze.model import phases
    from tracekit.analyze.sections import whatif
    from tracekit.analyze.trace.export import Export

    with Export.open(path) as ex:
        pieces = whatif.measure(ex, phases.build(ex))
    return pieces[0] if pieces else None


def launch_us(path: Path) -> float | None:
    """Host-speed probe: mean duration (us) of the ``cudaLaunchKernel*`` runtime calls inside the
    ``forward`` NVTX ranges of iterations >= 1 (``iteration N`` ranges), or None without them."""
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        ids = dict(con.execute("SELECT value, id FROM StringIds WHERE value = 'forward' OR value LIKE 'iteration %'"))
        its = [(s, e) for v, i in ids.items() if v.startswith("iteration ") and v[10:].isdigit() and int(v[10:]) >= 1
               for s, e in con.execute("SELECT start, end FROM NVTX_EVENTS WHERE textId = ?", (i,))]
        if "forward" not in ids or not its:
            return None
        tot = n = 0
        for s, e, tid in con.execute("SELECT start, end, globalTid FROM NVTX_EVENTS WHERE textId = ?", (ids["forward"],)):
            if not any(a <= s < b for a, b in its):
                continue
            c, t = con.execute(
                "SELECT count(*), coalesce(sum(r.end - r.start), 0) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                "JOIN StringIds si ON si.id = r.nameId WHERE r.globalTid = ? AND r.start >= ? AND r.end <= ? "
                "AND si.value LIKE 'cudaLaunchKernel%'", (tid, s, e)).fetchone()
            n, tot = n + c, tot + t
        return tot / n / 1e3 if n else None
    finally:
        con.close()


def log_steps(text: str, default: str | None = None) -> dict[str, float]:
    """Mean ``time_s`` (ms) of steps >= 1 per run of a training log; runs are named by the
    ``=== [S s] NAME:`` lines, else ``default``."""
    out: dict[str, list[float]] = {}
    name = default
    for line in text.splitlines():
        m = re.match(r"=== \[\d+ s\] (\w+):", line)
        if m:
            name = m.group(1)
        m = re.match(r"step (\d+) loss \S+ time_s ([\d.]+)", line)
        if m and name and int(m.group(1)) >= 1:
            out.setdefault(name, []).append(float(m.group(2)) * 1e3)
    return {k: sum(v) / len(v) for k, v in out.items() if v}


def predictions(base: Path, pieces: dict, changes: dict) -> dict[str, dict]:
    """Every what-if scenario for ``base`` (its ``pieces`` and manifest) with ``changes``, by name."""
    from tracekit.analyze.sections import advice, whatif
    from tracekit.analyze.trace import dsconfig

    loaded = dsconfig.load(base)
    inferred = dsconfig.infer_settings(whatif.trace_facts(pieces))
    sett = advice.settings_map(dsconfig.settings(loaded, inferred))
    return {s["scenario"]: s for s in whatif.predict(pieces, sett, changes)}


def normalised_ms(name: str, base: dict, changed: dict) -> tuple[float, float] | None:
    """``(normalised ms, update slowdown factor)`` of a changed run on a host slower than base's:
    the phases of :data:`UNTOUCHED` from base, plus the changed run's update divided by
    ``k = overflow check (changed) / overflow check (base)`` (wall per iteration). None for a
    run not in :data:`NORMALISED` or without an overflow check."""
    if name not in NORMALISED:
        return None
    oc_b = base["roles"]["overflow_check"]["wall_ns"]
    oc_c = changed["roles"]["overflow_check"]["wall_ns"]
    if not oc_b or not oc_c:
        return None
    k = oc_c / oc_b
    ns = sum(base["phase_ns"].get(p, 0.0) for p in UNTOUCHED[name]) + changed["phase_ns"].get("update", 0.0) / k
    return ns / 1e6, k


def rows_for(d: Path) -> dict:
    """The validation rows of DIR ``d`` (see module doc)."""
    logs = log_steps((d / "pairs.log").read_text(errors="replace")) if (d / "pairs.log").exists() else {}
    bases: dict[str, dict | None] = {}

    def baseline(bname: str) -> dict | None:
        if bname not in bases:
            bases[bname] = measure(d / f"{bname}.sqlite") if (d / f"{bname}.sqlite").exists() else None
        return bases[bname]

    rows = []
    for name, (scenario, changes, what, *rest) in PAIRS.items():
        trace = d / f"{name}.sqlite"
        bname = rest[0] if rest else "base"
        if not trace.exists() or baseline(bname) is None:
            continue
        base_path, base = d / f"{bname}.sqlite", baseline(bname)
        base_ms = base["iteration_ns"] / 1e6
        if name not in logs and (d / f"{name}.out").exists():
            logs.update(log_steps((d / f"{name}.out").read_text(errors="replace"), default=name))
        s = predictions(base_path, base, changes)[scenario]
        pred = s["predicted_ns"] / 1e6
        changed = measure(trace)
        delta = s.get("phase_delta_ns") or ({SAVING_PHASE[scenario]: -s["saving_ns"]} if scenario in SAVING_PHASE else {})
        row = {"run": name, "baseline": bname, "change": what, "baseline_ms": round(base_ms, 1),
               "predicted_ms": round(pred, 1), "predicted_saving_ms": round(base_ms - pred, 1),
               "confidence": s["confidence"], "applicable": s["applicable"], "why_not": s["why_not"],
               "log_ms": logs.get(name), "baseline_log_ms": logs.get(bname), "basis": s["basis"],
               "launch_us": [None if v is None else round(v, 2) for v in (launch_us(base_path), launch_us(trace))]}
        if changed is None:
            rows.append({**row, "measured_ms": None, "error_pct": None, "measured_saving_ms": None, "iterations": [],
                         "why_not": "no complete iteration in the changed run's trace (the training failed)"})
            continue
        meas = changed["iteration_ns"] / 1e6
        row.update(measured_ms=round(meas, 1), error_pct=round(100 * (pred - meas) / meas, 1),
                   measured_saving_ms=round(base_ms - meas, 1), iterations=changed["iterations"])
        if base["roles"]["cpu_wait"]["wall_ns"] or changed["roles"]["cpu_wait"]["wall_ns"]:  # waits for a CPU optimizer worker
            row["cpu_wait_ms"] = [round(p["roles"]["cpu_wait"]["wall_ns"] / 1e6, 1) for p in (base, changed)]
        norm = normalised_ms(name, base, changed)
        if norm is not None:
            row.update(normalised_ms=round(norm[0], 1), update_slowdown=round(norm[1], 3),
                       normalised_error_pct=round(100 * (pred - norm[0]) / norm[0], 1))
        row["phases"] = {p: {"base_ms": round(base["phase_ns"].get(p, 0.0) / 1e6, 1),
                             "predicted_ms": round((base["phase_ns"].get(p, 0.0) + delta.get(p, 0.0)) / 1e6, 1),
                             "measured_ms": round(changed["phase_ns"].get(p, 0.0) / 1e6, 1)} for p in PHASES}
        rows.append(row)
    base = baseline("base")
    return {"base_ms": base["iteration_ns"] / 1e6, "base_iterations": base["iterations"],
            "base_log_ms": logs.get("base"), "base_launch_us": launch_us(d / "base.sqlite"),
            "base_phases": {p: round(base["phase_ns"].get(p, 0.0) / 1e6, 1) for p in PHASES}, "rows": rows}


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    args = [a for a in argv if a != "--json"]
    d = Path(args[0]) if args else Path("/tmp/pairs")
    if not (d / "base.sqlite").exists():
        print(f"{d / 'base.sqlite'}: missing (record the pairs with benchmarks/record_advice_pairs.sh)", file=sys.stderr)
        return 2
    res = rows_for(d)
    if as_json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"base: {res['base_ms']:,.1f} ms per steady iteration (mean of iterations {res['base_iterations']}"
          + (f"; training log {res['base_log_ms']:,.1f} ms" if res["base_log_ms"] else "")
          + (f"; launch {res['base_launch_us']:.2f} us" if res["base_launch_us"] else "") + ")\n")
    print("| change | baseline ms | predicted ms | measured ms | error % | saving predicted / measured ms | confidence "
          "| normalised ms (error %) | launch us baseline / changed | training log ms |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for r in res["rows"]:
        log = f"{r['log_ms']:,.1f}" if r["log_ms"] is not None else "–"
        lu = " / ".join("–" if v is None else f"{v:.1f}" for v in r["launch_us"])
        if r["measured_ms"] is None:
            print(f"| {r['change']} | {r['baseline_ms']:,.1f} | {r['predicted_ms']:,.1f} | – | – | "
                  f"{r['predicted_saving_ms']:,.1f} / – | {r['confidence']} | – | {lu} | {log} |  ({r['why_not']})")
            continue
        norm = (f"{r['normalised_ms']:,.1f} ({r['normalised_error_pct']:+.1f})" if "normalised_ms" in r else "–")
        print(f"| {r['change']} | {r['baseline_ms']:,.1f} | {r['predicted_ms']:,.1f} | {r['measured_ms']:,.1f} | "
              f"{r['error_pct']:+.1f} | {r['predicted_saving_ms']:,.1f} / {r['measured_saving_ms']:,.1f} | "
              f"{r['confidence']} | {norm} | {lu} | {log} |")
    print("\nper phase, ms per steady iteration (base / predicted / measured):\n")
    print("| run | " + " | ".join(PHASES) + " |")
    print("|---|" + "---:|" * len(PHASES))
    for r in res["rows"]:
        if r["measured_ms"] is None:
            continue
        cells = [f"{v['base_ms']:,.1f} / {v['predicted_ms']:,.1f} / {v['measured_ms']:,.1f}" for v in r["phases"].values()]
        print(f"| {r['run']} | " + " | ".join(cells) + " |")
    for r in res["rows"]:
        if "cpu_wait_ms" in r:
            print(f"\n{r['run']}: cpu_update_wait {r['cpu_wait_ms'][0]:,.1f} ms ({r['baseline']}) -> "
                  f"{r['cpu_wait_ms'][1]:,.1f} ms per iteration")
    for r in res["rows"]:
        if "update_slowdown" in r:
            print(f"\n{r['run']}: update normalised by the overflow check's slowdown x{r['update_slowdown']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
