"""Recompute the advice validation table of docs/advice.md from the traces.

    python benchmarks/advice_validation.py [DIR]      # DIR: /tmp/pairs (default)

DIR holds ``base.sqlite`` and one trace per single config change (``pin``, ``bf16``,
``nooffload``, ``subgroup``, ``ratio``: see benchmarks/record_advice_pairs.sh), each with its
manifest ``NAME.json``. Every changed run is *predicted from base alone* with the what-if model
(:mod:`tracekit.analyze.whatif`) and *measured from its own trace*: the mean wall time of its
steady iterations (complete ones, warm-up iteration 0 left out), the same basis as the
prediction. Error % = 100 * (predicted - measured) / measured. When ``pairs.log`` is there, the
training's own step times (``step N loss L time_s T``, mean of steps 1..) are shown beside the
traced ones as a cross-check. Prints a Markdown table; ``--json`` prints the rows.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: changed run -> (scenario of the what-if model, change targets, what changed)
PAIRS = {
    "pin": ("pin_memory", {}, "offload_optimizer.pin_memory false -> true"),
    "bf16": ("bf16", {}, "fp16 -> bf16"),
    "nooffload": ("no_offload", {}, "no offload_optimizer"),
    "subgroup": ("sub_group_size", {"sub_group_size": 2e7}, "sub_group_size 1e9 -> 2e7"),
    "ratio": ("ratio", {"ratio": 0.5}, "offload_optimizer.ratio 1 -> 0.5"),
}


def measured_ms(path: Path) -> tuple[float, list[int]]:
    """Mean steady iteration wall time of a trace (ms) and the iterations averaged."""
    from tracekit.analyze import phases, whatif
    from tracekit.analyze.export import Export

    with Export.open(path) as ex:
        pieces = whatif.measure(ex, phases.build(ex))
    if not pieces:  # no complete iteration: the run failed or was cut short
        return None, []
    p = pieces[0]
    return p["iteration_ns"] / 1e6, p["iterations"]


def log_steps(log: Path) -> dict[str, float]:
    """Mean of ``time_s`` of steps >= 1 per run in pairs.log (run names from the ``=== ... NAME:`` lines)."""
    out: dict[str, list[float]] = {}
    name = None
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"=== \[\d+ s\] (\w+):", line)
        if m:
            name = m.group(1)
        m = re.match(r"step (\d+) loss \S+ time_s ([\d.]+)", line)
        if m and name and int(m.group(1)) >= 1:
            out.setdefault(name, []).append(float(m.group(2)) * 1e3)
    return {k: sum(v) / len(v) for k, v in out.items() if v}


def predictions(base: Path, changes: dict) -> dict[str, dict]:
    """Every what-if scenario for ``base`` with ``changes``, by scenario name."""
    from tracekit.analyze import advice, dsconfig, phases, whatif
    from tracekit.analyze.export import Export

    with Export.open(base) as ex:
        model = phases.build(ex)
        pieces = whatif.measure(ex, model)[0]
    loaded = dsconfig.load(base)
    inferred = dsconfig.infer_settings(whatif.trace_facts(pieces))
    sett = advice.settings_map(dsconfig.settings(loaded, inferred))
    return {s["scenario"]: s for s in whatif.predict(pieces, sett, changes)}, pieces


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    args = [a for a in argv if a != "--json"]
    d = Path(args[0]) if args else Path("/tmp/pairs")
    base = d / "base.sqlite"
    if not base.exists():
        print(f"{base}: missing (record the pairs with benchmarks/record_advice_pairs.sh)", file=sys.stderr)
        return 2
    logs = log_steps(d / "pairs.log") if (d / "pairs.log").exists() else {}
    base_ms, base_its = measured_ms(base)
    rows = []
    for name, (scenario, changes, what) in PAIRS.items():
        trace = d / f"{name}.sqlite"
        if not trace.exists():
            continue
        scen, _ = predictions(base, changes)
        s = scen[scenario]
        meas, its = measured_ms(trace)
        pred = s["predicted_ns"] / 1e6
        if meas is None:
            rows.append({"run": name, "change": what, "baseline_ms": round(base_ms, 1), "predicted_ms": round(pred, 1),
                         "measured_ms": None, "error_pct": None, "measured_saving_ms": None,
                         "predicted_saving_ms": round(base_ms - pred, 1), "log_ms": logs.get(name), "iterations": [],
                         "confidence": s["confidence"], "applicable": s["applicable"],
                         "why_not": "no complete iteration in the changed run's trace (the training failed)"})
            continue
        rows.append({"run": name, "change": what, "baseline_ms": round(base_ms, 1), "predicted_ms": round(pred, 1),
                     "measured_ms": round(meas, 1), "error_pct": round(100 * (pred - meas) / meas, 1),
                     "measured_saving_ms": round(base_ms - meas, 1), "predicted_saving_ms": round(base_ms - pred, 1),
                     "log_ms": round(logs[name], 1) if name in logs else None, "iterations": its,
                     "confidence": s["confidence"], "applicable": s["applicable"], "why_not": s["why_not"]})
    if as_json:
        print(json.dumps({"base_ms": base_ms, "base_iterations": base_its, "rows": rows}, indent=1))
        return 0
    print(f"base: {base_ms:,.1f} ms per steady iteration (iterations {base_its}"
          + (f"; pairs.log {logs['base']:,.1f} ms" if "base" in logs else "") + ")\n")
    print("| change | predicted ms | measured ms | error % | saving predicted / measured ms | confidence | pairs.log ms |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for r in rows:
        log = f"{r['log_ms']:,.1f}" if r["log_ms"] is not None else "–"
        if r["measured_ms"] is None:
            print(f"| {r['change']} | {r['predicted_ms']:,.1f} | – | – | {r['predicted_saving_ms']:,.1f} / – | "
                  f"{r['confidence']} | {log} |  ({r['why_not']})")
            continue
        print(f"| {r['change']} | {r['predicted_ms']:,.1f} | {r['measured_ms']:,.1f} | {r['error_pct']:+.1f} | "
              f"{r['predicted_saving_ms']:,.1f} / {r['measured_saving_ms']:,.1f} | {r['confidence']} | {log} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
