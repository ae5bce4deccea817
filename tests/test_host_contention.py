"""Host-level copy contention (issue 12): synthetic two-device traces with known overlap
windows, every figure checked on an integer time grid; the shared two-GPU export against a
pairwise loop over its copies read with SQL; the --json shape."""

import json
import sqlite3

import polars as pl
import pytest
from conftest import PUBLIC, run_cli
from synthetic import SyntheticTrace, gtid

from tracekit.analyze.model import phases, rank_ids
from tracekit.analyze.sections import host_contention
from tracekit.analyze.trace.export import Export

TWO_GPU = PUBLIC / "nsys-ai__mfu_2gpu_before.sqlite"
H2D, D2H = 1, 2
PAGEABLE, PINNED, DEVICE = 0, 1, 2

# (device, kind, start, end, bytes): process 1 drives device 0, process 2 device 1
COPIES = [
    (0, H2D, 0, 100, 1000),      # alone
    (1, H2D, 200, 400, 2000),    # with device 0's H2D [300, 500): both H2D [300, 400)
    (0, H2D, 300, 500, 2000),
    (0, D2H, 450, 600, 1500),    # same device as the H2D above: not host-level by itself
    (1, D2H, 550, 700, 1500),    # D2H on both [550, 600); device 1 D2H vs nothing else after 600
    (1, H2D, 800, 900, 1000),    # with device 0's D2H [850, 950): mixed [850, 900)
    (0, D2H, 850, 950, 1000),
    (1, H2D, 1000, 1100, 1000),  # alone (the size-class baseline for 1000-byte H2D)
]


def _trace(tmp_path, copies=COPIES, name="synthetic_host_contention.sqlite", marks=None):
    t = SyntheticTrace()
    for pid in (1, 2):
        t.range("DeepSpeedEngine.backward", 0, 1200, gtid(pid, 1), "DeepSpeed")
        t.range("DeepSpeedZeroOptimizer_Stage3.step", 1200, 1300, gtid(pid, 1), "DeepSpeed")
        t.kernel(1250, 1260, pid=pid, tid=1, launch=1201, device=pid - 1)
    for dev, kind, s, e, b in copies:
        src, dst = (PAGEABLE, DEVICE) if kind == H2D else (DEVICE, PAGEABLE)
        t.copy(s, e, b, kind, pid=dev + 1, tid=1, launch=max(0, s - 1), device=dev, src=src, dst=dst)
    for pid, text in (marks or {}).items():
        t.mark(text, 1, gtid(pid, 1))
    return t.write(tmp_path / name)


def _frames(path):
    with Export.open(path) as e:
        m = phases.build(e)
        ranks = rank_ids.distributed_ranks(e, m)
        return host_contention.analyze_host_contention(host_contention.copies_of_model(m, ranks))


def _grid(copies, lo=0, hi=1300):
    """Per integer ns: sets of devices with H2D / D2H in flight."""
    out = []
    for t in range(lo, hi):
        h = {d for d, k, s, e, _ in copies if k == H2D and s <= t < e}
        dd = {d for d, k, s, e, _ in copies if k == D2H and s <= t < e}
        out.append((t, h, dd))
    return out


def _grid_figures(copies):
    conc = h2d = d2h = mixed = 0
    for _, h, d in _grid(copies):
        conc += len(h | d) >= 2
        h2d += len(h) >= 2
        d2h += len(d) >= 2
        mixed += bool(h) and bool(d) and len(h | d) >= 2
    return conc, h2d, d2h, mixed


def test_totals_match_grid(tmp_path):
    fr = _frames(_trace(tmp_path))
    s = fr["host_summary"].row(0, named=True)
    conc, h2d, d2h, mixed = _grid_figures(COPIES)
    assert (s["concurrent_ns"], s["h2d_ns"], s["d2h_ns"], s["mixed_ns"]) == (conc, h2d, d2h, mixed)
    # by hand: both H2D [300,400); [400,450) H2D alone on dev 0 -> no; [450,500) H2D0+D2H0 same
    # device -> no; [550,600) D2H on both; [850,900) mixed
    assert (conc, h2d, d2h, mixed) == (100 + 50 + 50, 100, 50, 50)
    assert s["gpus"] == [0, 1] and s["host"] == "host 0"


def test_windows_and_bytes_match_grid(tmp_path):
    fr = _frames(_trace(tmp_path))
    w = fr["host_windows"]
    # windows: maximal runs of concurrent grid points
    pts = [t for t, h, d in _grid(COPIES) if len(h | d) >= 2]
    runs = []
    for t in pts:
        if runs and runs[-1][1] == t:
            runs[-1][1] = t + 1
        else:
            runs.append([t, t + 1])
    assert w.select("start", "end").rows() == [tuple(r) for r in runs]
    for r in w.iter_rows(named=True):
        # bytes inside the window, each copy spread evenly: sum over grid points of bytes / duration
        for kind, col in ((H2D, "h2d_bytes"), (D2H, "d2h_bytes")):
            exp = sum(b / (e - s) for _, k, s, e, b in COPIES if k == kind
                      for t in range(r["start"], r["end"]) if s <= t < e)
            assert r[col] == pytest.approx(exp)
        devs = sorted({d for d, _, s, e, _ in COPIES if s < r["end"] and e > r["start"]})
        assert r["gpus"] == devs
    assert w["phase"].to_list() == ["backward"] * 3


def test_bandwidth_against_alone_size_class(tmp_path):
    # two concurrent 1000-byte H2D at 5 GB/s (200 ns) vs alone ones at 10 GB/s (100 ns)
    copies = [(0, H2D, 0, 100, 1000), (1, H2D, 150, 250, 1000),           # alone, 10 B/ns
              (0, H2D, 300, 500, 1000), (1, H2D, 300, 500, 1000),         # concurrent, 5 B/ns
              (0, H2D, 600, 700, 100_000), (1, H2D, 640, 660, 100)]       # 100 kB half-covered: neither
    fr = _frames(_trace(tmp_path, copies, "synthetic_host_bandwidth.sqlite"))
    per = fr["host_copies"].sort("start", "device")
    assert per["concurrent"].to_list() == [False, False, True, True, False, True]
    assert per["alone"].to_list() == [True, True, False, False, False, False]
    bw = fr["host_bandwidth"].filter(pl.col("bucket") == 9)  # 1000 B: [512, 1024)
    r = bw.row(0, named=True)
    assert (r["copies"], r["gbps"], r["alone_copies"], r["alone_gbps"]) == (2, 5.0, 2, 10.0)
    assert r["slower_share"] == pytest.approx(0.5)
    # the 100-byte copy has no alone copy of its class: the nearest class with alone copies (9)
    r6 = fr["host_bandwidth"].filter(pl.col("bucket") == 6).row(0, named=True)
    assert r6["alone_bucket"] == 9 and r6["alone_gbps"] == 10.0


def test_no_concurrency_on_one_device(tmp_path):
    fr = _frames(_trace(tmp_path, [(0, H2D, 0, 100, 10), (0, D2H, 50, 150, 10)], "synthetic_host_one_device.sqlite"))
    s = fr["host_summary"].row(0, named=True)
    assert s["concurrent_ns"] == 0 and fr["host_windows"].height == 0 and s["gpus"] == [0]


def test_json_shape(tmp_path):
    path = _trace(tmp_path)
    rc, out, err = run_cli("analyze", path, "--json", "--no-cache")
    assert rc == 0, err
    d = json.loads(out)
    hc = d["hosts"][0]["host_contention"]
    assert set(hc) >= {"devices", "concurrent_ns", "h2d_ns", "d2h_ns", "mixed_ns", "windows"}
    assert (hc["devices"], hc["concurrent_ns"], hc["h2d_ns"], hc["d2h_ns"], hc["mixed_ns"]) == ([0, 1], 200, 100, 50, 50)
    assert [w["start"] for w in hc["windows"]] == [300, 550, 850]
    assert any(f["topic"] == "host-contention" for f in d["findings"]) is False  # 200 ns: below 1 ms
    rc, out, err = run_cli("analyze", path, "--no-cache", "--wide")  # the whole findings: --wide
    assert rc == 0 and "copies of GPUs 0, 1 in flight together" in out


# --------------------------------------------------------------------------- the shared two-GPU export
def test_two_gpu_export_against_pairwise_loop():
    if not TWO_GPU.exists():
        pytest.skip("shared two-GPU export not present")
    con = sqlite3.connect(f"file:{TWO_GPU}?mode=ro", uri=True)
    rows = con.execute("""SELECT deviceId, copyKind, start, "end", bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY
                          WHERE copyKind IN (1, 2)""").fetchall()
    host = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchone()[0]
    con.close()
    # concurrent time: union of the pairwise intersections of copies of different devices
    inter = [(max(a[2], b[2]), min(a[3], b[3])) for a in rows for b in rows
             if a[0] < b[0] and max(a[2], b[2]) < min(a[3], b[3])]
    from conftest import union_length_loop

    fr = _frames(TWO_GPU)
    s = fr["host_summary"].row(0, named=True)
    assert s["host"] == host == "modal"  # from TARGET_INFO_SYSTEM_ENV (no TARGET_INFO_GPU in this cut)
    assert s["gpus"] == sorted({r[0] for r in rows}) == [0, 1]
    assert s["concurrent_ns"] == union_length_loop(inter) == 0  # 17 tiny 8-byte H2D per GPU, never together
    assert s["copy_busy_ns"] == union_length_loop([(r[2], r[3]) for r in rows])
    assert fr["host_copies"].height == len(rows) == 34
