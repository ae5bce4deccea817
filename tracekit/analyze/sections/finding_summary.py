"""One line per finding (issue 23): the finding's headline with its numbers and their basis.

Each finding of :mod:`tracekit.analyze.sections.findings` (and of the idle, CPU-update and
multi-GPU rules) is a sentence that can run to several hundred characters. :func:`summary`
gives it a line of at most :data:`MAX_CHARS` characters, computed from its ``values`` (never by
cutting the sentence), e.g. ``update CPU-bound: GPU idle 71 % of 125.5 ms/it, 27 % in
parameter copy-back``. Basis words (:data:`BASIS_NOTE`): ``ms/it`` is ms per iteration, the
mean the finding's sentence states: over the steady iterations (warm-up apart) for the
``update``, ``idle`` and ``cpu-update`` findings, over the iterations that have the phase for
the transfer findings (``values["iterations"]``); ``in all`` is a total over the trace. The
whole sentence stays in ``text`` (``--explain``, ``--wide``, the report).

:func:`per_run` merges the findings of a multi-rank trace that say the same thing on several
ranks (same ``topic``, ``phase`` and, for pageable copies, direction and sub-phase) into one
line with the rank whose number is largest and the range over the ranks.
"""

from __future__ import annotations

from tracekit.vocab import NS_PER_MS

#: the longest summary line (the default screen's findings fit 80 columns with their "- ")
MAX_CHARS = 76
#: the legend of the summaries' basis words
BASIS_NOTE = "ms/it: mean per iteration (update, idle, CPU step: steady ones); in all: total"


def _ms(ns) -> str:
    return f"{float(ns) / NS_PER_MS:,.1f} ms"


def _mb(b) -> str:
    b = float(b)
    return f"{b / 1e6:,.0f} MB" if b >= 1e6 else f"{b / 1e3:,.1f} kB" if b >= 1e3 else f"{b:,.0f} B"


def _pct(part, whole) -> str:
    return f"{100 * float(part) / float(whole):.0f} %" if whole else "0 %"


def _per_it(ns, n) -> tuple[tuple[float, str], str]:
    """``((ms value, unit), "X ms/it")`` when ``n`` iterations are known (> 0), else the total
    ``in all``."""
    if n:
        v = float(ns) / n
        return (v / NS_PER_MS, "ms/it"), f"{_ms(v)}/it"
    return (float(ns) / NS_PER_MS, "ms in all"), f"{_ms(ns)} in all"


def _key(ns, unit: str) -> tuple[float, str]:
    return float(ns) / NS_PER_MS, unit


def _fit(*lines: str) -> str:
    """The first of ``lines`` that fits :data:`MAX_CHARS`, else the last (the shortest wording)."""
    return next((x for x in lines if len(x) <= MAX_CHARS), lines[-1])


def _step_label(name: str) -> str:
    return name.split(" (")[0]


def headline(f: dict) -> tuple[str, tuple[float, str] | None]:
    """:func:`_headline`, or the first clause of the sentence when the finding's ``values`` lack
    a number its rule reads (a finding of an older or hand-made result)."""
    try:
        return _headline(f)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return (f.get("text") or "").split("; ")[0], None


def _headline(f: dict) -> tuple[str, tuple[float, str] | None]:
    """``(line, key)``: the one-line summary of finding ``f`` (see the module doc) and its main
    amount as ``(value, unit)``, a number the line shows (``ms/it`` or ``ms in all``), for
    :func:`per_run` to compare ranks by; None for findings about the run as a whole. A topic
    without a rule here gets its sentence's first clause (up to the first ``;``), which every
    finding rule writes with its numbers."""
    v = f.get("values") or {}
    topic, phase = f.get("topic"), f.get("phase") or ""
    n = v.get("iterations")
    if topic == "update" and v.get("wall_ns"):
        k = v.get("updates") or 1
        wall, idle = v["wall_ns"] / k, v["gpu_idle_ns"] / k
        steps = v.get("cpu_steps_ns") or {}
        share = idle / wall
        heads = ["update CPU-bound", "update"] if share >= 0.5 else ["update"]
        tail = ""
        if steps:
            name, ns = max(steps.items(), key=lambda kv: (kv[1], kv[0]))
            tail = f", {_pct(ns, wall)} {_step_label(name)}"
        lines = [f"{h}: GPU idle {100 * share:.0f} % of {_ms(wall)}/it{tail}" for h in heads]
        return _fit(*lines), _key(wall, "ms/it")
    if topic == "exposed-copies":
        key, txt = _per_it(v["exposed_ns"], n)
        return f"{phase}: {txt} of copies exposed ({_pct(v['exposed_ns'], v['copy_busy_ns'])} of copy time)", key
    if topic == "pageable":
        key, txt = _per_it(v["saving_ns"], n if phase != "other" else None)
        where = phase if phase != "other" else "outside the phases"
        if v["pinned_gbps"] <= v["gbps"]:  # the saving is the host's stall, not bandwidth
            return f"{where}: pageable {v.get('direction', '')} stalls the host; pinning saves ~{txt}", key
        return (f"{where}: pageable {v.get('direction', '')} {v['gbps']:.1f} GB/s vs {v['pinned_gbps']:.1f} "
                f"pinned; pinning saves ~{txt}"), key
    if topic == "contention":
        if not v.get("contention_ns"):
            return f"no PCIe contention ({_ms(v.get('copy_busy_ns', 0))} of copies in all, serialized)", None
        s = (f"{phase}: PCIe contention {_ms(v['contention_ns'])} in all "
             f"({100 * (v.get('contention_share') or 0):.0f} % of copy time, {v.get('windows', 0)} windows)")
        return s, _key(v["contention_ns"], "ms in all")
    if topic == "gradient-round-trip":
        nb = float(v.get("h2d_bytes") or 0) + float(v.get("d2h_bytes") or 0)
        key, txt = _per_it(v["round_trip_ns"], n)
        mb = _mb(nb / n) + "/it" if n else _mb(nb) + " in all"
        fits = {True: "; fits the GPU", False: "; over GPU memory"}.get(v.get("fits"), "")
        return _fit(f"gradient accumulation round trip: {mb}, {txt} of copies{fits}",
                    f"gradient accumulation round trip: {mb}, {txt}{fits}",
                    f"gradient accumulation round trip: {mb}, {txt}"), key
    if topic == "pcie":
        d = "RX (H2D)" if v.get("direction") == "H2D" else "TX (D2H)"
        thr = v.get("threshold")
        at = f">= {thr:.0f} %" if thr is not None else "saturated"
        return (f"{phase}: PCIe {d} {at} of the link {_ms(v['saturated_ns'])} in all "
                f"({v.get('windows', 0)} windows)"), _key(v["saturated_ns"], "ms in all")
    if topic == "pcie-cross-check":
        lo, hi = v["implied_min_gbps"], v["implied_max_gbps"]
        verdict = "copies explain the traffic" if hi <= 1.25 * lo else "untraced link traffic"
        return f"PCIe cross-check: implied link peak {lo:.0f}-{hi:.0f} GB/s ({verdict})", None
    if topic == "idle" and v.get("wall_ns"):
        wall, idle = v["wall_ns"], v["gpu_idle_ns"]
        parts = {c: v.get(c) or 0 for c in ("between_api_ns", "in_api_ns", "waiting_ns")}
        cause = max(parts, key=lambda c: (parts[c], c))
        head = {"between_api_ns": f"{phase} host-bound", "in_api_ns": f"{phase} held in CUDA calls",
                "waiting_ns": f"{phase} waits on collectives"}[cause]
        why = {"between_api_ns": "between API calls", "in_api_ns": "in API calls",
               "waiting_ns": "in collectives"}[cause]
        return (f"{head}: GPU idle {_pct(idle, wall)} of {_ms(wall)}/it, {_pct(parts[cause], idle)} {why}",
                _key(wall, "ms/it"))
    if topic == "cpu-update" and v.get("busy_ns") is not None:
        busy = v["busy_ns"]
        where = f"worker {', '.join(map(str, v['workers']))}" if v.get("workers") else "in update"
        return (f"CPU optimizer step ({where}): {_ms(busy)}/it, {_pct(v.get('exposed_ns') or 0, busy)} exposed, "
                f"{_pct(v.get('hidden_ns') or 0, busy)} hidden"), _key(busy, "ms/it")
    if topic == "host-contention" and "concurrent_ns" in v:
        host = (f.get("text") or "").split(":", 1)[0]
        if v["concurrent_ns"] < 1_000_000:
            return (f"{host}: no cross-GPU copy contention ({_ms(v['concurrent_ns'])} of "
                    f"{_ms(v.get('copy_busy_ns', 0))} in all)"), None
        s = f"{host}: GPUs copy at once {_ms(v['concurrent_ns'])} in all"
        if v.get("slower_share") is not None:
            s += f", {100 * abs(v['slower_share']):.0f} % {'slower' if v['slower_share'] >= 0 else 'faster'}"
        return s + (f", most in {phase}" if phase else ""), None
    if topic == "communication" and "comm_busy_ns" in v:
        head = (f.get("text") or "").split(":", 1)[0]
        s = f"{head}: {_ms(v['comm_busy_ns'])} in collectives in all"
        if v.get("wait_ns") is not None:
            s += f", {_ms(v['wait_ns'])} waiting for the last rank"
        return s, None
    if topic == "waiting-rank" and "others_wait_ns" in v:
        return (f"{phase}: rank {v.get('rank')} is the slowest; the others waited {_ms(v['others_wait_ns'])} "
                "for it in all"), None
    text = f.get("text") or ""
    return text.split("; ")[0], None


def summary(f: dict) -> str:
    """The one-line summary of finding ``f`` (:func:`headline`'s line)."""
    return headline(f)[0]


def add_summaries(findings: list[dict]) -> list[dict]:
    """Set ``summary`` (:func:`summary`) on each finding dict; returns ``findings`` (changed in place)."""
    for f in findings:
        f["summary"] = summary(f)
    return findings


def _group_key(f: dict) -> tuple:
    v = f.get("values") or {}
    return (f.get("topic"), f.get("phase"), v.get("direction"), v.get("sub_phase"))


#: topics about the run as a whole (one finding per host or phase, or a per-rank comparison in itself)
RUN_TOPICS = frozenset({"host-contention", "waiting-rank", "communication"})


def per_run(findings: list[dict], rank_of: dict[tuple[int, int], int]) -> list[dict]:
    """The findings of a trace once per run: findings with the same ``topic``, ``phase`` (and
    direction, sub-phase) on several ranks become one ``{"topic", "phase", "summary", "ranks":
    [rank, ...], "worst": rank, "key_min", "key_max", "key_unit"}``: ``summary`` is the line of
    the rank whose main amount (:func:`headline`'s key) is largest, followed by ``(ranks A-B
    UNIT, most: rank R)``, the range of that amount over the ranks, when their amounts differ
    at 0.1 ms, else by ``(all N ranks)`` (``(N ranks)`` when not every rank has it).
    Topics of :data:`RUN_TOPICS` (their lines compare the ranks already) stay one per finding.
    ``rank_of[(pid, device)]`` is the rank number. Keeps the order of first appearance."""
    groups: dict[tuple, list[dict]] = {}
    order: list[tuple] = []
    for i, f in enumerate(findings):
        key = ("#", i) if f.get("topic") in RUN_TOPICS else _group_key(f)
        if key not in groups:
            order.append(key)
        groups.setdefault(key, []).append(f)
    out = []
    for key in order:
        fs = groups[key]
        heads = [headline(f) for f in fs]
        ranks = [rank_of.get((f.get("pid"), f.get("device"))) for f in fs]
        keys = [k[0] if k else None for _, k in heads]
        unit = next((k[1] for _, k in heads if k), None)
        known = [k for k in keys if k is not None]
        i = max(range(len(fs)), key=lambda j: (keys[j] if keys[j] is not None else float("-inf"), -j))
        line = heads[i][0]
        lo, hi = (min(known), max(known)) if known else (None, None)
        if len(fs) > 1 and known and round(lo, 1) != round(hi, 1):
            line += f" (ranks {lo:,.1f}-{hi:,.1f} {unit}, most: rank {ranks[i]})"
        elif len(fs) > 1:
            line += f" ({'all ' if len(fs) == len(set(rank_of.values())) else ''}{len(fs)} ranks)"
        out.append({"topic": fs[0].get("topic"), "phase": fs[0].get("phase"), "summary": line,
                    "ranks": ranks, "worst": ranks[i], "key_min": lo, "key_max": hi, "key_unit": unit})
    return out
