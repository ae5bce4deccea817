"""Advice once per run: the per-rank advice items of one trace merged by what they change.

A multi-GPU export gets one advice item per rank from
:func:`tracekit.analyze.sections.advice.advise` (each with its ``pid`` and ``device``); the
per-run view (``advice_per_run`` in ``--json``, beside the per-rank ``advice`` kept as it is)
holds each change once, with the spread of its saving over the ranks and the slowest rank
(longest baseline iteration) named.
"""

from __future__ import annotations


def per_run(items: list[dict]) -> list[dict]:
    """Merge per-rank advice items (:mod:`tracekit.analyze.sections.advice` shape) that make
    the same change (same ``scenario``, ``knob`` and ``change``). Returns one dict per change::

        {"scenario", "knob", "change", "problem" (the slowest rank's words), "confidence",
         "ranks": int, "per_rank": [{"pid", "device", "baseline_iteration_ms",
                                    "saving_ms_per_iteration"}],
         "saving_ms_per_iteration": {"min", "mean", "max"}, "saving_spread_ms": max - min,
         "saving_pct": {"min", "mean", "max"} (% of each rank's iteration; null without),
         "slowest": {"pid", "device", "baseline_iteration_ms"}}

    (ms per steady iteration), sorted by the mean saving, largest first. ``slowest`` is the
    rank with the longest baseline iteration among those the item concerns.
    """
    groups: dict[tuple, list[dict]] = {}
    for it in items:
        groups.setdefault((it.get("scenario"), it.get("knob"), it.get("change")), []).append(it)
    out = []
    for (scenario, knob, change), its in groups.items():
        savings = [float(i["saving_ms_per_iteration"]) for i in its]
        pcts = [float(i["saving_pct"]) for i in its if i.get("saving_pct") is not None]
        slow = max(its, key=lambda i: (float(i.get("baseline_iteration_ms") or 0.0), -its.index(i)))
        out.append({
            "scenario": scenario, "knob": knob, "change": change, "problem": slow.get("problem"),
            "confidence": slow.get("confidence"), "ranks": len(its),
            "per_rank": [{"pid": i.get("pid"), "device": i.get("device"),
                          "baseline_iteration_ms": i.get("baseline_iteration_ms"),
                          "saving_ms_per_iteration": i.get("saving_ms_per_iteration")} for i in its],
            "saving_ms_per_iteration": {"min": min(savings), "mean": sum(savings) / len(savings),
                                        "max": max(savings)},
            "saving_spread_ms": max(savings) - min(savings),
            "saving_pct": ({"min": min(pcts), "mean": sum(pcts) / len(pcts), "max": max(pcts)} if pcts else None),
            "slowest": {"pid": slow.get("pid"), "device": slow.get("device"),
                        "baseline_iteration_ms": slow.get("baseline_iteration_ms")},
        })
    out.sort(key=lambda d: -d["saving_ms_per_iteration"]["mean"])
    return out
