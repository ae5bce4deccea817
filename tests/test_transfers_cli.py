"""The transfer sections from the command line: default findings, --section/--all, --json,
--out, and one-line notes (not crashes) when the trace lacks memory events or GPU metrics."""

import json
import shutil
import sqlite3

import polars as pl
from conftest import ZERO3_CUT
from conftest import run_cli as run


def test_default_output_ends_with_findings():
    rc, out, err = run("analyze", ZERO3_CUT, "--no-cache")
    assert rc == 0, err
    tail = out[out.index("findings"):]  # the default: one line each (issue 23)
    assert "pageable H2D" in tail and "gradient accumulation round trip" in tail and "no PCIe contention" in tail
    assert "copy/compute overlap per phase window" not in out
    rc, out, err = run("analyze", ZERO3_CUT, "--no-cache", "--wide")  # the whole text
    assert rc == 0, err
    tail = out[out.index("findings"):]
    assert "pageable H2D" in tail and "GB/s" in tail and "pinning would save" in tail
    assert "gradient accumulation round trip" in tail and "no PCIe contention" in tail
    assert "copy/compute overlap per phase window" not in out  # sections only when selected


def test_all_sections_render_and_update_sub_phases():
    rc, out, err = run("analyze", ZERO3_CUT, "--no-cache", "--all", "--phase", "update", "--bin-ms", "2")
    assert rc == 0, err
    for title in ("copy/compute overlap", "PCIe contention", "copy sizes", "pageable copies per phase and sub-phase",
                  "GPU memory in use", "copy throughput timeline", "PCIe RX (H2D)", "gradient round trips",
                  "update: idle GPU"):
        assert title in out, title
    assert "_reassign_or_swap_out_partitioned_param" in out
    assert "bins of 2.00 ms" in out


def test_json_carries_sections_and_findings():
    rc, out, err = run("analyze", ZERO3_CUT, "--no-cache", "--json")
    assert rc == 0, err
    res = json.loads(out)
    tr = res["ranks"][0]["transfers"]
    assert set(tr) == {"overlap", "contention", "sizes", "pageable", "memory", "pcie", "opportunities", "idle"}
    con = sqlite3.connect(f"file:{ZERO3_CUT}?mode=ro", uri=True)
    n = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE (copyKind = 1 AND srcKind = 0) "
                    "OR (copyKind = 2 AND dstKind = 0)").fetchone()[0]
    con.close()
    assert len(tr["pageable"]["pageable_copies"]) == n
    assert res["findings"] and all(f["text"] for f in res["findings"])
    rc, out, _ = run("analyze", ZERO3_CUT, "--no-cache", "--json", "--section", "timeline", "--bin-ms", "5")
    bins = json.loads(out)["ranks"][0]["transfers"]["timeline"]["throughput_timeline"]
    assert all(b["bin_end"] - b["bin_start"] == 5_000_000 for b in bins)


def test_out_writes_frames(tmp_path):
    rc, out, err = run("analyze", ZERO3_CUT, "--no-cache", "--section", "pageable,memory", "--out", tmp_path / "o",
                       "--format", "parquet")
    assert rc == 0, err
    f = pl.read_parquet(tmp_path / "o" / "pageable_copies.parquet")
    assert f.height > 0 and {"saving_ns", "host_ns", "blocking"} <= set(f.columns)
    assert (tmp_path / "o" / "memory_timeline.parquet").exists()


def test_missing_memory_and_metrics_are_notes(tmp_path):
    p = tmp_path / "cut.sqlite"
    shutil.copy(ZERO3_CUT, p)
    con = sqlite3.connect(p)
    con.execute("DROP TABLE CUDA_GPU_MEMORY_USAGE_EVENTS")
    con.execute("DROP TABLE GPU_METRICS")
    con.commit()
    con.close()
    rc, out, err = run("analyze", p, "--no-cache", "--all")
    assert rc == 0, err
    assert "Traceback" not in err
    assert "--cuda-memory-usage=true" in out and "--gpu-metrics-devices=all" in out
    assert "findings" in out


def test_bad_section_is_one_line_error():
    rc, out, err = run("analyze", ZERO3_CUT, "--section", "nope")
    assert rc == 2 and err.strip().startswith("tracekit: error:") and "--section" in err


def test_timeline_peaks_line_equals_the_max_over_the_full_timeline():
    """issue 13: the terminal line of the copy throughput timeline comes from
    ``timeline_peaks`` (no per-bin rows in the result); it equals the line computed by hand from
    the full ``throughput_timeline`` frame, and the JSON still has every row as before."""
    import re

    from tracekit.analysis import analyze
    from tracekit.analyze.result import compute
    from tracekit.analyze.trace.export import Export
    from tracekit.options import Options
    from tracekit.render import tables as render
    from tracekit.vocab import fmt_ms

    for phase in (None, "backward"):
        a = analyze(ZERO3_CUT, sections=("timeline",), phase=phase, cache=False)
        text = re.sub(r"\x1b\[[0-9;]*m", "", render.render_text(a, "table", wide=True))
        line = [x for x in text.splitlines() if "copy throughput timeline:" in x]
        assert len(line) == 1 and "(rows in --json / --out)" in line[0]
        tl = a._view()["ranks"][0]["transfers"]["timeline"]
        assert "throughput_timeline" not in tl and tl["throughput_peaks"]  # the tables built no per-bin rows
        f = a.frames["throughput_timeline"]
        if phase:
            f = f.filter(pl.col("phase") == phase)
        peaks = {}
        for r in f.iter_rows(named=True):  # by hand, as the tables did before
            k = (r["phase"], r["direction"])
            peaks[k] = max(peaks.get(k, 0.0), round(r["gbps"], 6))
        txt = "; ".join(f"{p} {d} {v:.1f}" for (p, d), v in sorted(peaks.items()) if v > 0)
        width = f["bin_end"][0] - f["bin_start"][0]
        want = (f"copy throughput timeline: {f.height} bins of {fmt_ms(width)} ms; "
                f"peak bin GB/s per phase: {txt or 'no copies'} (rows in --json / --out)")
        assert line[0].endswith(want), (line[0], want)
        assert txt and f.height > 100
        with Export.open(ZERO3_CUT, cache=False) as export:  # the JSON: the rows computed as before
            old, _ = compute(export, Options(sections=("timeline",), phase=phase, cache=False))
        assert a.to_json() == old
        assert len(a.to_json()["ranks"][0]["transfers"]["timeline"]["throughput_timeline"]) == f.height
