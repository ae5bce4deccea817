"""Which capture manifest belongs to a trace: one rule
(:func:`tracekit.analyze.trace.dsconfig.manifest_candidates` / ``manifest_for``), followed by
the advice's loader (``dsconfig.load``), the figure titles (``render.config.run_config``) and
the report's cache key (``render.report_cache.beside``).

Each layout is made by hand in ``tmp_path``; every manifest holds a different ZeRO stage, so
the stage each reader reports tells which file it read, and the expected file is written down
by hand per layout.
"""

from __future__ import annotations

import json

import pytest

from tracekit.analyze.trace import dsconfig
from tracekit.render import report_cache
from tracekit.render.config import run_config


def _manifest(stage: int) -> str:
    return json.dumps({"tracekit_version": "test", "deepspeed_config": {"zero_optimization": {"stage": stage}}})


#: (trace name, {file beside it: its stage, or raw text}, the file that is its manifest or None)
LAYOUTS = [
    # what capture -o NAME writes
    ("z.sqlite", {"z.json": 1}, "z.json"),
    # NAME.json first, then NAME_capture.json
    ("z.sqlite", {"z.json": 1, "z_capture.json": 2}, "z.json"),
    ("z.sqlite", {"z_capture.json": 2}, "z_capture.json"),
    # a cut PREFIX_cut.sqlite reads PREFIX_capture.json, but its own name comes first
    ("z_cut.sqlite", {"z_capture.json": 2}, "z_capture.json"),
    ("z_cut.sqlite", {"z_capture.json": 2, "z_cut_capture.json": 3}, "z_cut_capture.json"),
    ("z_cut.sqlite", {"z_capture.json": 2, "z_cut.json": 1}, "z_cut.json"),
    # any other "_" is no prefix: my_capture.json is another trace's (render.config read it)
    ("my_run.sqlite", {"my_capture.json": 2}, None),
    ("run_b.sqlite", {"run_capture.json": 3, "run.json": 1}, None),
    # per-rank and kept --force captures: NAME.rankR.json, NAME.new-PID.json
    ("z.rank1.sqlite", {"z.rank1.json": 3, "z.json": 1}, "z.rank1.json"),
    ("z.new-123.sqlite", {"z.new-123.json": 2, "z.json": 1}, "z.new-123.json"),
]


@pytest.mark.parametrize("trace_name, files, expected", LAYOUTS)
def test_every_reader_takes_the_same_manifest(tmp_path, trace_name, files, expected):
    trace = tmp_path / trace_name
    trace.write_bytes(b"")  # only the name matters to the lookup
    for name, stage in files.items():
        (tmp_path / name).write_text(_manifest(stage))
    want = tmp_path / expected if expected else None
    assert dsconfig.manifest_for(trace) == want
    loaded = dsconfig.load(trace)
    cfg = run_config(trace)
    assert cfg.manifest == want
    if want is None:
        assert loaded["source"] is None and loaded["path"] is None
        assert cfg.stage is None and cfg.deepspeed_config == {}
    else:
        stage = files[expected]
        assert loaded["source"] == "manifest" and loaded["path"] == str(want)
        assert loaded["deepspeed_config"]["zero_optimization"]["stage"] == stage
        assert cfg.stage == stage
    # the report's key hashes exactly the candidate paths, in the order tried
    assert list(report_cache.beside(trace)) == [p.name for p in dsconfig.manifest_candidates(trace)]


def test_candidates_by_hand(tmp_path):
    t = tmp_path / "a_b_cut.sqlite"
    assert dsconfig.manifest_candidates(t) == [tmp_path / "a_b_cut.json", tmp_path / "a_b_cut_capture.json",
                                               tmp_path / "a_b_capture.json"]
    t = tmp_path / "a_b.sqlite"
    assert dsconfig.manifest_candidates(t) == [tmp_path / "a_b.json", tmp_path / "a_b_capture.json"]


def test_an_unreadable_first_manifest_is_not_replaced_by_the_next(tmp_path):
    """``NAME.json`` that is not JSON is still this trace's manifest: the advice notes it and
    infers; the titles read nothing, rather than ``NAME_capture.json`` (the old titles code went
    on to the next name and so disagreed with the advice)."""
    trace = tmp_path / "z.sqlite"
    trace.write_bytes(b"")
    (tmp_path / "z.json").write_text("{not json")
    (tmp_path / "z_capture.json").write_text(_manifest(3))
    loaded = dsconfig.load(trace)
    assert loaded["source"] is None and loaded["deepspeed_config"] is None
    assert "z.json" in loaded["note"] and "not valid JSON" in loaded["note"]
    cfg = run_config(trace)
    assert cfg.manifest is None and cfg.stage is None


def test_a_plain_deepspeed_config_beside_is_read_alike(tmp_path):
    """A DeepSpeed config saved as ``NAME.json`` (no manifest keys): the advice takes it as the
    config, and so do the titles."""
    trace = tmp_path / "z.sqlite"
    trace.write_bytes(b"")
    (tmp_path / "z.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
                                                 "gradient_accumulation_steps": 4}))
    loaded = dsconfig.load(trace)
    assert loaded["deepspeed_config"]["zero_optimization"]["stage"] == 2
    cfg = run_config(trace)
    assert cfg.manifest == tmp_path / "z.json"
    assert (cfg.stage, cfg.precision, cfg.gas) == (2, "bf16", 4)
