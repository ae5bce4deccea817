"""The one-line summaries of the findings (tracekit.analyze.sections.finding_summary): hand-made
findings with known numbers, and the merge of the same finding on several ranks."""

from tracekit.analyze.sections.finding_summary import MAX_CHARS, headline, per_run, summary

MS = 1_000_000


def _update(pid, dev, wall_ms, idle_ms, step_ms, n=2):
    return {"topic": "update", "pid": pid, "device": dev, "phase": "update", "text": "update: ... long ...",
            "values": {"wall_ns": wall_ms * n * MS, "gpu_idle_ns": idle_ms * n * MS, "updates": n,
                       "cpu_steps_ns": {"parameter copy-back": step_ms * MS, "gradient unscale (x)": 1 * MS}}}


def test_update_line_by_hand():
    # 88.5 of 125.5 ms idle = 70.5 % -> 71 %; copy-back 34.3 / 125.5 = 27.3 % -> 27 %
    f = _update(1, 0, 125.5, 88.5, 34.3)
    assert summary(f) == "update CPU-bound: GPU idle 71 % of 125.5 ms/it, 27 % parameter copy-back"
    assert headline(f)[1] == (125.5, "ms/it")
    f = _update(1, 0, 100.0, 30.0, 10.0)  # under half idle: not called CPU-bound
    assert summary(f).startswith("update: GPU idle 30 % of 100.0 ms/it")


def test_transfer_lines_per_iteration_or_total():
    f = {"topic": "exposed-copies", "phase": "backward", "text": "",
         "values": {"exposed_ns": 60.6 * MS, "copy_busy_ns": 80.8 * MS, "iterations": 2}}
    assert summary(f) == "backward: 30.3 ms/it of copies exposed (75 % of copy time)"
    f["values"].pop("iterations")  # no iteration count: the total, said so
    assert summary(f) == "backward: 60.6 ms in all of copies exposed (75 % of copy time)"
    f = {"topic": "pageable", "phase": "update", "text": "", "values": {
        "direction": "H2D", "gbps": 7.26, "pinned_gbps": 53.9, "saving_ns": 64 * MS, "iterations": 2}}
    assert summary(f) == "update: pageable H2D 7.3 GB/s vs 53.9 pinned; pinning saves ~32.0 ms/it"


def test_lines_fit_and_unknown_topics_keep_their_first_clause():
    f = {"topic": "new-rule", "text": "phase: 12.0 ms of something; then details", "values": {}}
    assert summary(f) == "phase: 12.0 ms of something"
    broken = {"topic": "pageable", "text": "update: 5 MB; more", "values": {"gbps": None}}
    assert summary(broken) == "update: 5 MB"  # a rule's number missing: the first clause
    assert len(summary(_update(1, 0, 2787.0, 2759.0, 2592.0))) <= MAX_CHARS


def test_per_run_merges_ranks_with_their_range():
    a, b = _update(10, 0, 125.5, 88.5, 34.3), _update(11, 1, 150.6, 106.2, 41.2)
    comm = [{"topic": "communication", "pid": p, "device": d, "phase": None, "text": f"rank {r}: x",
             "values": {"comm_busy_ns": 3 * MS}} for p, d, r in ((10, 0, 0), (11, 1, 1))]
    same = [{"topic": "contention", "pid": p, "device": d, "phase": None, "text": "",
             "values": {"contention_ns": 0, "copy_busy_ns": 134.1 * MS}} for p, d in ((10, 0), (11, 1))]
    runs = per_run([a, comm[0], same[0], b, comm[1], same[1]], {(10, 0): 0, (11, 1): 1})
    assert [r["topic"] for r in runs] == ["update", "communication", "contention", "communication"]
    up = runs[0]
    assert up["ranks"] == [0, 1] and up["worst"] == 1 and (up["key_min"], up["key_max"]) == (125.5, 150.6)
    assert up["summary"] == ("update CPU-bound: GPU idle 71 % of 150.6 ms/it, 27 % parameter copy-back "
                             "(ranks 125.5-150.6 ms/it, most: rank 1)")
    assert runs[2]["summary"] == "no PCIe contention (134.1 ms of copies in all, serialized) (all 2 ranks)"
