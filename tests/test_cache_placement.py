"""Where the cache goes: never beside a file that is no trace, never into a read-only folder."""

import os
import shutil
import subprocess
import sys

from conftest import ZERO3_CUT


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tracekit.cli", *map(str, args)],
                          capture_output=True, text=True, env=env)


def test_rejected_file_leaves_no_cache(tmp_path, tmp_path_factory):
    bad = tmp_path / "notes.sqlite"
    bad.write_text("not a trace")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path_factory.mktemp("xdg")))
    env.pop("TRACEKIT_CACHE_DIR", None)  # the placement beside the file is what is checked
    p = run("analyze", bad, env=env)
    assert p.returncode == 2
    assert sorted(os.listdir(tmp_path)) == ["notes.sqlite"]


def test_read_only_folder_gets_no_cache_even_for_root(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    trace = ro / "run.sqlite"
    shutil.copy(ZERO3_CUT, trace)
    ro.chmod(0o555)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("TRACEKIT_CACHE_DIR", None)
    try:
        p = run("analyze", trace, env=env)
        assert p.returncode == 0, p.stderr
        assert sorted(os.listdir(ro)) == ["run.sqlite"]
        # the cache went to the user's cache folder instead
        assert any(n.endswith("run.sqlite.tracekit-cache") for n in os.listdir(tmp_path / "xdg" / "tracekit"))
    finally:
        ro.chmod(0o755)
