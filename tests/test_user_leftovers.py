"""Defects a fresh user found in the last review: --bin-ms bounds, a --time-range outside the
capture, a bad --phase-map regex, and tables at 80 columns (piped or not)."""

import sqlite3

import pytest
from conftest import FIXTURES, assert_one_line_error, run_cli

from tracekit.errors import TracekitError

ZERO2 = FIXTURES / "zero2_offload_gas2_cut.sqlite"


# ---------------------------------------------------------------- 1. --bin-ms
@pytest.mark.parametrize("bin_ms", [0.0009, 1e-7, 1e-12])
def test_bin_ms_below_the_floor_is_refused(bin_ms):
    from tracekit.options import MIN_BIN_MS, Options

    assert MIN_BIN_MS == 0.001
    with pytest.raises(TracekitError, match=r"below the 0\.001 ms \(1 us\) floor.*use --bin-ms 0\.001 or more"):
        Options(bin_ms=bin_ms)
    assert Options(bin_ms=0.001).bin_ns == 1000  # the floor itself is allowed


def test_bin_count_by_hand():
    from tracekit.analyze.sections import throughput as T

    # [1500, 4000] in 1000 ns bins: [1000,2000) [2000,3000) [3000,4000); one more when it ends at 4001
    assert T._bin_count([(1500, 4000)], 1000, 1) == 3
    assert T._bin_count([(1500, 4001)], 1000, 1) == 4
    assert T._bin_count([(1500, 4000), (0, 10_000)], 1000, 2) == 2 * 3 + 2 * 10


def test_bin_count_bound_names_a_bin_that_works(monkeypatch):
    """The bound counts every rank and direction, is checked before any bin is built, and the
    --bin-ms it suggests gives a timeline within it (the frame's own row count)."""
    from tracekit.analyze.model import phases
    from tracekit.analyze.sections import throughput as T
    from tracekit.analyze.trace.export import Export

    with Export.open(ZERO2) as e:
        model = phases.build(e)
    rows_1ms = T.throughput_timeline(model, bin_ns=1_000_000).height
    assert rows_1ms > 1000
    monkeypatch.setattr(T, "MAX_BINS", rows_1ms)  # 1 ms fits exactly, 0.5 ms is twice too many
    assert T.throughput_timeline(model, bin_ns=1_000_000).height == rows_1ms
    with pytest.raises(TracekitError) as exc:
        T.throughput_timeline(model, bin_ns=500_000)
    msg = str(exc.value)
    assert msg.startswith("--bin-ms 0.5 gives ") and msg.endswith("use --bin-ms 1 or more"), msg
    n = int(msg.split(" gives ")[1].split(" ")[0].replace(",", ""))
    monkeypatch.setattr(T, "MAX_BINS", 10 ** 9)
    assert n == T.throughput_timeline(model, bin_ns=500_000).height > rows_1ms  # the count it names is real


def test_bin_count_with_an_implausible_span_is_one_error():
    """A forged time (a kernel ending 292 years after it started: test_mutations) leaves no bin
    up to 5,000 s within the bound: still one TracekitError, saying so (was StopIteration)."""
    from tracekit.analyze.sections import throughput as T

    span = [(0, 9_200_000_000_000_000_000)]  # 9.2e18 ns
    assert T._bin_count(span, 5 * 10 ** 12, 2) > T.MAX_BINS  # 5,000 s bins: 3.7 M
    with pytest.raises(TracekitError) as exc:
        T.check_bin_count(span, 1_000_000, 2)
    assert "a time in the trace is implausible" in str(exc.value)
    T.check_bin_count([(0, 10 ** 9)], 1_000_000, 2)  # 1 s at 1 ms: 2,000 bins, fine


def test_bin_ms_cli_too_many_bins():
    """The review's command: 1 us bins over this trace are 3.6 M rows; refused, naming 0.002."""
    rc, out, err = run_cli("analyze", ZERO2, "--no-cache", "--section", "timeline", "--bin-ms", "0.001")
    assert_one_line_error(rc, out, err, "--bin-ms 0.001 gives 3,583,858 timeline bins")
    assert err.strip().endswith("use --bin-ms 0.002 or more")
    assert_one_line_error(*run_cli("analyze", ZERO2, "--no-cache", "--bin-ms", "0.0001"), "(1 us) floor")


# ---------------------------------------------------------------- 2. trim --time-range
def _capture(path):
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as c:
        return c.execute("SELECT startTime, stopTime FROM ANALYSIS_DETAILS").fetchone()


@pytest.mark.parametrize("window, problem", [
    ("200%:300%", "200% is outside the capture"),
    ("50%:150%", "150% is outside the capture"),
    ("100:200", "outside the capture"),
    ("0:0.5", "outside the capture"),
    ("1%:2%", "no CUDA activity in this window"),  # inside the capture, before its CUDA work
])
def test_time_range_outside_the_capture_writes_nothing(tmp_path, window, problem):
    lo, hi = _capture(ZERO2)
    dst = tmp_path / "out.sqlite"
    rc, out, err = run_cli("trim", ZERO2, dst, "--time-range", window)
    assert_one_line_error(rc, out, err, f"--time-range '{window}': {problem}")
    assert f"{lo / 1e9:.6g}:{hi / 1e9:.6g} s" in err or "its CUDA activity spans" in err
    assert list(tmp_path.iterdir()) == []  # no output, no temporary file


def test_time_range_inside_the_capture_still_cuts(tmp_path):
    dst = tmp_path / "out.sqlite"
    rc, out, err = run_cli("trim", ZERO2, dst, "--time-range", "31.8:32.0")
    assert rc == 0, err
    with sqlite3.connect(f"file:{ZERO2}?mode=ro", uri=True) as c:
        n = c.execute('SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start < 32000000000 '
                      'AND "end" > 31800000000').fetchone()[0]
    with sqlite3.connect(f"file:{dst}?mode=ro", uri=True) as c:
        assert c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] == n > 0


# ---------------------------------------------------------------- 3. --phase-map regex
@pytest.mark.parametrize("item, problem", [
    ("update=(", "invalid regular expression: unclosed group"),
    ("update=a{2", "invalid regular expression: unclosed counted repetition"),
    ("update=(?<=x)step", "invalid regular expression: look-around, including look-ahead and look-behind, "
                          "is not supported (the matcher takes Rust regex syntax)"),
    (r"update=(a)\1", "invalid regular expression: backreferences are not supported"),
    ("forward", "expected PHASE=REGEX"),
])
def test_bad_phase_map_is_one_line(item, problem):
    from tracekit.options import Options

    with pytest.raises(TracekitError) as exc:
        Options(phase_map=(item,))
    assert str(exc.value).startswith(f"--phase-map '{item}': {problem}"), str(exc.value)
    assert "\n" not in str(exc.value) and "col(" not in str(exc.value)


def test_bad_phase_map_cli():
    rc, out, err = run_cli("analyze", ZERO2, "--no-cache", "--phase-map", "update=(")
    assert_one_line_error(rc, out, err, "--phase-map 'update=(': invalid regular expression: unclosed group")
    assert err.strip() == "tracekit: error: --phase-map 'update=(': invalid regular expression: unclosed group"
    # compare goes through Options too (it showed polars' message or a traceback before)
    rc, out, err = run_cli("compare", ZERO2, FIXTURES / "zero3_offload_gas2_cut.sqlite",
                           "--phase-map", r"update=\d+(")
    assert_one_line_error(rc, out, err, r"--phase-map 'update=\d+(': invalid regular expression: unclosed group")


def test_good_phase_map_still_accepted():
    from tracekit.options import Options

    assert Options(phase_map=(r"update=\p{L}+_step$", "forward=^fwd")).phase_map == (r"update=\p{L}+_step$",
                                                                                     "forward=^fwd")


# ---------------------------------------------------------------- 5. the no-offload basis names the stage
@pytest.mark.parametrize("stage, shown", [(2, "ZeRO-2"), (3, "ZeRO-3"), (1, "ZeRO-1"), ("1 or 2", "ZeRO-1/2"),
                                          (None, "ZeRO")])
def test_gpu_step_basis_names_the_stage(stage, shown):
    from tracekit.analyze.sections.whatif import gpu_step_bytes

    settings = {} if stage is None else {"zero_optimization.stage": stage}
    impl, nbytes, basis = gpu_step_bytes(settings)
    assert (impl, nbytes) == ("fused", 28 + 42)
    assert basis == f"DeepSpeed FusedAdam 28 B + {shown} fp32 gradient, norm, unscale and 16-bit copy 42 B"


def test_zero2_trace_advice_says_zero2():
    import json

    manifest = json.loads((FIXTURES / "zero2_offload_gas2_capture.json").read_text())
    assert '"stage": 2' in json.dumps(manifest)  # the run's config: ZeRO stage 2
    rc, out, err = run_cli("analyze", ZERO2, "--no-cache", "--json")
    assert rc == 0, err
    basis = [a["basis"] for a in json.loads(out)["advice"] if a.get("scenario") == "no_offload"]
    assert basis and all("FusedAdam 28 B + ZeRO-2 fp32 gradient" in b and "ZeRO-3" not in b for b in basis), basis


# ---------------------------------------------------------------- 4. tables at 80 columns
def test_config_text_is_json_like():
    from tracekit.render.config import config_text

    assert [config_text(v) for v in (None, False, True, 0, 500_000_000, 1.0, "cpu", {"a": True, "b": None}, [1, 2])] \
        == ["not set", "false", "true", "0", "500,000,000", "1.0", "cpu", '{"a": true, "b": null}', "[1, 2]"]


def test_fold_key_by_hand():
    from tracekit.render.config import fold_key, key_width

    k = "zero_optimization.offload_optimizer.device"
    assert fold_key(k, 80) == k
    assert fold_key(k, 30) == "zero_optimization.\noffload_optimizer.device"
    assert fold_key(k, 20) == "zero_optimization.\noffload_optimizer.\ndevice"
    assert fold_key(k, 5) == "zero_optimization.\noffload_optimizer.\ndevice"  # a part is never cut
    assert fold_key("train_micro_batch_size_per_gpu", 10) == "train_micro_batch_size_per_gpu"
    keys = [k, "train_micro_batch_size_per_gpu", "precision"]
    assert key_width(keys, 60) == len(k)  # fits: no fold
    assert key_width(keys, 25) == len("train_micro_batch_size_per_gpu")  # at least the longest part
    assert key_width(keys, 33) == 33


def _key_cells(out: str, title: str = "DeepSpeed settings that matter for offload") -> tuple[list[str], int]:
    """The keys of the settings table in ``out``, joined again from their lines (a line of the
    key column continues the key above when that one ended with a dot), and the widest line."""
    lines = out.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith(title))
    head = next(n for n in range(i, len(lines)) if lines[n].lstrip().startswith("key "))
    end_key = lines[head].index(" value") - 1
    keys: list[str] = []
    for ln in lines[head + 2:]:
        if not ln.strip():
            break
        cell = ln[1:end_key].strip()
        if cell and keys and keys[-1].endswith("."):
            keys[-1] += cell
        elif cell:
            keys.append(cell)
    widest = max(len(ln) for ln in lines[i:head + 2 + len(keys) * 3])
    return keys, widest


@pytest.mark.parametrize("width", [80, 100, 120])
def test_settings_table_folds_keys_at_dots_only(width):
    import io

    from rich.console import Console

    from tracekit.analysis import analyze
    from tracekit.render.config import settings_table

    rows = analyze(ZERO2, cache=False).to_json()["config"]["settings"]
    assert any(len(r["key"]) > 45 for r in rows)
    c = Console(file=io.StringIO(), width=width, color_system=None)
    c.print("DeepSpeed settings that matter for offload")  # (the title line _key_cells looks for)
    with c.capture() as cap:
        c.print(settings_table(rows, width))
    out = cap.get()
    keys, _ = _key_cells(out)
    assert keys == [r["key"] for r in rows]  # whole keys, split at dots only, none cut
    assert max(len(ln) for ln in out.splitlines()) <= width
    assert "…" not in out
    values = {r["key"]: r["value"] for r in rows}
    assert values["zero_optimization.offload_optimizer.pin_memory"] is True
    lines = out.splitlines()
    n = next(n for n, ln in enumerate(lines) if "offload_optimizer.pin_memory" in ln)
    row = lines[n] if lines[n].startswith(" zero_optimization.offload") else lines[n - 1]  # its first line
    assert " true " in row and "True" not in out and "None" not in out


def test_analyze_80_columns_keeps_keys_whole():
    # the config table is part of --wide since issue 23 (the default shows a header line)
    rc, out80, err = run_cli("analyze", ZERO2, "--no-cache", "--wide", env=_env(COLUMNS="80"))
    assert rc == 0, err
    keys, widest = _key_cells(out80)
    assert "zero_optimization.offload_optimizer.device" in keys and widest <= 80
    assert max(len(ln) for ln in out80.splitlines()) <= 80


def _env(**extra):
    import os

    return {**{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}, **extra}


# ---------------------------------------------------------------- 6. compare's config-key table
def test_compare_config_keys_at_80_columns():
    import json

    base, noff = FIXTURES / "advice_pair_base.sqlite", FIXTURES / "advice_pair_nooffload.sqlite"
    cfg_a = json.loads((FIXTURES / "advice_pair_base.json").read_text())
    assert '"pin_memory": false' in json.dumps(cfg_a)  # A sets pin_memory false; B (no offload) has none
    rc, out, err = run_cli("compare", base, noff, env=_env(COLUMNS="80"))
    assert rc == 0, err
    lines = out.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith("config keys that differ"))
    body = lines[i:next(n for n in range(i, len(lines)) if lines[n].startswith("└"))]
    assert max(len(ln) for ln in body) <= 80
    cells = [[c.strip() for c in ln.strip("│").split("│")] for ln in body if ln.startswith("│")]
    keys: list[list] = []
    for k, a, b in cells:  # a key's continuation line has empty A and B cells
        if keys and keys[-1][0].endswith(".") and not a and not b:
            keys[-1][0] += k
        else:
            keys.append([k, a, b])
    rows = {k: (a, b) for k, a, b in keys}
    assert rows["zero_optimization.offload_optimizer.device"] == ("cpu (config)", "none (default)")
    assert rows["zero_optimization.offload_optimizer.pin_memory"] == ("false (config)", "not set")
    assert rows["optimizer.params.torch_adam"] == ("false (default)", "true (config)")
    text = "\n".join(body)
    assert not any(w in text for w in ("None", "False", "True", "…"))


def test_zenflow_value_is_json_like():
    from tracekit.analyze.trace.dsconfig import config_value

    v, src = config_value({"zero_optimization": {"zenflow": {"topk_ratio": 0.1, "select_strategy": "step",
                                                             "overlap_step": True, "x": None}}},
                          "zero_optimization.zenflow")
    assert (v, src) == ("topk_ratio=0.1, select_strategy=step, overlap_step=true, x=null", "config")
