"""A pageable finding whose pinned copies of that size are no faster (tiny copies) does not
read as a bandwidth gain: it says the saving is the launching thread's stall (found by a
new-user run: "pageable D2H 1.7 GB/s vs 1.0 pinned; pinning saves ~0.9 ms/it")."""

from __future__ import annotations

from pathlib import Path

FIX = Path(__file__).resolve().parent / "fixtures"


def test_no_faster_pinned_copies_are_worded_as_a_stall():
    from tracekit.analysis import analyze

    res = analyze(FIX / "nvme_offload_cut.sqlite").to_json()
    pages = [f for f in res["findings"] if f["topic"] == "pageable"]
    slow = [f for f in pages if f["values"]["pinned_gbps"] <= f["values"]["gbps"]]
    fast = [f for f in pages if f["values"]["pinned_gbps"] > f["values"]["gbps"]]
    assert slow and fast  # this fixture has both kinds
    for f in slow:
        v = f["values"]
        assert f"{v['gbps']:.1f} GB/s (pinned copies of that size run no faster here: {v['pinned_gbps']:.1f} GB/s)" \
            in f["text"]
        assert "stall" in f["text"] and "stalls the host" in f["summary"] and " vs " not in f["summary"]
    for f in fast:
        v = f["values"]
        assert f"{v['gbps']:.1f} GB/s vs {v['pinned_gbps']:.1f} GB/s for pinned" in f["text"]
