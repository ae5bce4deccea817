"""The section registry (:mod:`tracekit.analyze.sections`) says what the analysis does: every
registered frame is computed with its key columns, the command line offers exactly the registered
sections, and the layers keep to their jobs (sections never print or draw)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import tracekit
from tracekit.analyze.sections import FILE_ONLY, REGISTRY, SECTIONS, parse_sections
from tracekit.errors import TracekitError

FIXTURE = Path(__file__).parent / "fixtures" / "ds_zero3_offload_iter1-2.sqlite"
PKG = Path(tracekit.__file__).parent


def test_every_registered_frame_has_its_key_columns():
    a = tracekit.analyze(FIXTURE, sections=SECTIONS, cache=False)
    frames = a.section_frames()
    for s in REGISTRY.values():
        assert set(s.keys) == set(s.frames), s.name
        for name in s.frames:
            if name in FILE_ONLY:
                continue
            assert name in frames, (s.name, name)
            missing = [k for k in s.keys[name] if k not in frames[name].columns]
            assert not missing, (s.name, name, missing)


def test_registry_drives_the_command_line_and_notes():
    assert parse_sections("all") == SECTIONS == tuple(REGISTRY)
    with pytest.raises(TracekitError, match="choose from " + re.escape(", ".join(SECTIONS))):
        parse_sections("nope")
    out = subprocess.run([sys.executable, "-m", "tracekit.cli", "analyze", "--help"], capture_output=True,
                         text=True, env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"}).stdout
    assert ", ".join(SECTIONS) in re.sub(r"\s+", " ", out.replace("│", " "))
    assert REGISTRY["memory"].nsys_option == "--cuda-memory-usage=true"
    assert REGISTRY["pcie"].nsys_option == "--gpu-metrics-devices=all"
    assert REGISTRY["memory"].missing_note("CUDA_GPU_MEMORY_USAGE_EVENTS").endswith(
        "`nsys profile --cuda-memory-usage=true`")


def _code(path: Path) -> str:
    return path.read_text()


def test_sections_and_model_never_print_or_draw():
    for layer in ("analyze/sections", "analyze/model", "analyze/trace"):
        for f in sorted((PKG / layer).glob("*.py")):
            src = _code(f)
            assert not re.search(r"^\s*(import|from)\s+(rich|matplotlib)\b", src, re.M), f
            prints = re.findall(r"(?<![\w.])print\(.*", src)
            # the read cache's one diagnostic (a cache folder it cannot use) goes to stderr
            assert all(layer == "analyze/trace" and "file=sys.stderr" in p for p in prints), (f, prints)
            assert not re.search(r"^\s*(import|from)\s+tracekit\.render\b", src, re.M), f


def test_render_is_the_only_layer_that_imports_rich_or_matplotlib():
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).as_posix()
        if rel.startswith(("render/", "capture/")) or rel in ("cli.py", "textsafe.py"):
            continue
        assert not re.search(r"^\s*(import|from)\s+(rich|matplotlib)\b", _code(f), re.M), rel
