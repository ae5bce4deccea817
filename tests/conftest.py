import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # for tests/synthetic.py

FIXTURES = HERE / "fixtures"
ZERO3_CUT = FIXTURES / "ds_zero3_offload_iter1-2.sqlite"


def unpack_fixtures(folder: Path = FIXTURES) -> list[Path]:
    """Decompress each ``NAME.sqlite.xz`` of ``folder`` to ``NAME.sqlite`` (git-ignored) when that
    is missing or older than the archive: the repository keeps most cuts compressed (about 6x
    smaller) so that a checkout stays small enough to travel to the GPU machine. Written under a
    temporary name and renamed, so a run stopped half-way never leaves a truncated fixture."""
    import lzma
    import os
    import shutil

    done = []
    for xz in sorted(folder.glob("*.sqlite.xz")):
        target = xz.with_suffix("")
        if target.exists() and target.stat().st_mtime >= xz.stat().st_mtime:
            continue
        part = target.with_name(f".{target.name}.{os.getpid()}.part")
        with lzma.open(xz) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(part, target)
        done.append(target)
    return done


unpack_fixtures()
# ../shared beside the checkout (read-only); tests that need it skip when it is absent
SHARED = HERE.parent.parent / "shared" / "traces"
PUBLIC = SHARED / "public"


@pytest.fixture
def zero3_cut() -> Path:
    return ZERO3_CUT


def public_exports():
    return sorted(PUBLIC.glob("*.sqlite")) if PUBLIC.exists() else []


FULL_TRACE_XZ = SHARED / "ds-zero3-offload-134m-bf16-gas2-h200.sqlite.xz"


@pytest.fixture(scope="session")
def full_trace(tmp_path_factory) -> Path:
    """The full shared DeepSpeed trace (624 MB), decompressed once per test session into a
    temporary folder; skips when ../shared is not beside the checkout."""
    import lzma
    import shutil

    if not FULL_TRACE_XZ.exists():
        pytest.skip("full shared trace not present")
    out = tmp_path_factory.mktemp("full") / "ds-zero3-offload-134m-bf16-gas2-h200.sqlite"
    with lzma.open(FULL_TRACE_XZ) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 16 << 20)
    return out


# ---------------------------------------------------------------- shared test helpers
def run_cli(*args, env=None):
    """Run ``tracekit ARGS`` in a subprocess; returns (exit code, stdout, stderr).

    Without ``env``, the child gets this environment less ``COLUMNS`` and ``LINES``: GNU
    readline (imported by pytest through pdb) exports the terminal's size into the process
    environment, and tracekit honours ``COLUMNS``; tests that want a width pass it."""
    import os
    import subprocess

    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}

    p = subprocess.run([sys.executable, "-m", "tracekit.cli", *map(str, args)],
                       capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr


def assert_one_line_error(rc, out, err, pattern):
    """Exit code 2, no traceback, exactly one ``tracekit: error:`` line containing ``pattern``."""
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error:"), err
    assert pattern in lines[0], lines[0]


def union_length_loop(intervals) -> int:
    """Brute-force union length of (start, end) pairs: a plain loop over the sorted list,
    the independent reference for tracekit's vectorized interval algebra."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)
