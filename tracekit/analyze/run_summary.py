"""The ranks of one trace side by side, per steady iteration (issue 23): ``"across_ranks"`` of
the result (:mod:`tracekit.analyze.result`), what the default screen of a multi-GPU trace
prints (:mod:`tracekit.render.short`).

Read from the result dict only (each rank's iterations and totals, ``waiting_ranks``). The
basis is the mean per steady iteration: a rank's complete iterations, iteration 0 (the
warm-up step) left out when another complete iteration exists, all its iterations when none is
complete (the rule of :meth:`tracekit.render.data.ReportData.steady_iterations`). A rank
without iterations (no phase ranges) is compared on its whole-trace totals (``basis``
``"total"``). "The slowest rank" and "the rank that waits most" are named only when they pass
:func:`tracekit.analyze.significance.slowest` (the one rule of a comparative claim).
"""

from __future__ import annotations

from tracekit.analyze.significance import slowest, spread
from tracekit.vocab import PHASES


def steady_iterations(rank: dict) -> list[int]:
    """The steady iterations of a result rank (the module doc's rule), sorted."""
    its = rank.get("iterations") or []
    full = [it["index"] for it in its if it.get("complete")] or [it["index"] for it in its]
    if len(full) > 1 and 0 in full:
        full = [i for i in full if i != 0]
    return sorted(full)


def _rank_row(i: int, rank: dict, waits: list[dict]) -> dict:
    steady = set(steady_iterations(rank))
    its = [it for it in rank.get("iterations") or [] if it["index"] in steady]
    no = rank.get("rank", i)
    mine = [w for w in waits if w.get("rank") == no]
    if its:
        n = len(its)
        walls = [sum(p["wall_ns"] for p in it["phases"]) for it in its]
        per_it = {ph: [sum(p["wall_ns"] for p in it["phases"] if p["phase"] == ph) for it in its]
                  for ph in PHASES if any(p["phase"] == ph for it in its for p in it["phases"])}
        phase_ns = {ph: sum(v) / n for ph, v in per_it.items()}
        phase_spread = {ph: spread(v) for ph, v in per_it.items()}
        idle = sum(p.get("gpu_idle_ns") or 0 for it in its for p in it["phases"])
        wall = sum(walls)
        mine = [w for w in mine if w.get("iteration") in steady]
        basis, div = "steady", n
    else:  # no iterations: the whole trace
        tot = rank.get("totals") or {}
        walls = []
        phase_ns = {ph: float(tot[ph]["wall_ns"]) for ph in PHASES if ph in tot}
        phase_spread = {}
        idle = sum(t.get("gpu_idle_ns") or 0 for t in tot.values())
        wall = sum(t["wall_ns"] for t in tot.values())
        basis, div = "total", 1
    return {"rank": no, "pid": rank["pid"], "device": rank["device"], "basis": basis,
            "iterations": sorted(steady) if its else [],
            "iteration_ns": sum(walls) / len(walls) if walls else float(wall),
            "iteration_spread_ns": spread(walls), "phase_ns": phase_ns, "phase_spread_ns": phase_spread,
            "gpu_idle_share": idle / wall if wall else None,
            "wait_ns": sum(w["wait_ns"] for w in mine) / div if mine else None,
            "collective_ns": sum(w["collective_ns"] for w in mine) / div if mine else None}


def across_ranks(result: dict) -> dict:
    """The ranks of ``result`` compared, per steady iteration (ns; see the module doc)::

        {"basis": "steady"|"total"|"mixed",
         "per_rank": [{"rank", "pid", "device", "basis", "iterations": [int],
                       "iteration_ns", "iteration_spread_ns" (max - min over them; null: < 2),
                       "phase_ns": {phase: ns}, "phase_spread_ns": {phase: ns|null},
                       "gpu_idle_share", "wait_ns", "collective_ns"}],
         "phases": [{"phase" ("iteration" for the whole iteration, then each phase), "mean_ns",
                     "min_ns", "max_ns", "max_rank", "min_rank", "slowest_rank"}],
         "slowest_rank": int|null, "waits_most": {"rank", "wait_ns", "others_mean_ns"}|null,
         "collectives": bool}

    ``wait_ns``: time in collectives waiting for the last rank to arrive (``waiting_ranks``),
    null for a rank without collectives. ``slowest_rank`` (by iteration time) and the
    ``slowest_rank`` of a phase (each rank's iteration-to-iteration spread of it counted) and
    ``waits_most`` are null when no rank differs from the runner-up by the rule of the module doc.
    """
    waits = (result.get("waiting_ranks") or {}).get("per_rank") or []
    rows = [_rank_row(i, r, waits) for i, r in enumerate(result.get("ranks") or [])]
    bases = {r["basis"] for r in rows}
    phases = []
    names = ["iteration"] + [p for p in PHASES if any(p in r["phase_ns"] for r in rows)]
    for ph in names:
        vals = [((r["iteration_ns"] if ph == "iteration" else r["phase_ns"].get(ph)), r["rank"]) for r in rows]
        vals = [(v, k) for v, k in vals if v is not None]
        if not vals:
            continue
        top, low = max(vals), min(vals)
        spreads = {r["rank"]: (r["iteration_spread_ns"] if ph == "iteration" else r["phase_spread_ns"].get(ph))
                   for r in rows}
        phases.append({"phase": ph, "mean_ns": sum(v for v, _ in vals) / len(vals), "min_ns": low[0],
                       "max_ns": top[0], "max_rank": top[1], "min_rank": low[1],
                       "slowest_rank": slowest(vals, spreads=spreads) if len(vals) > 1 else None})
    it = next((p for p in phases if p["phase"] == "iteration"), None)
    waited = [(r["wait_ns"], r["rank"]) for r in rows if r["wait_ns"] is not None]
    most = None
    if len(waited) > 1:
        who = slowest(waited)
        if who is not None:
            w = next(v for v, k in waited if k == who)
            others = [v for v, k in waited if k != who]
            most = {"rank": who, "wait_ns": w, "others_mean_ns": sum(others) / len(others)}
    return {"basis": bases.pop() if len(bases) == 1 else "mixed" if bases else "steady", "per_rank": rows,
            "phases": phases, "slowest_rank": it["slowest_rank"] if it else None, "waits_most": most,
            "collectives": bool(waits)}
