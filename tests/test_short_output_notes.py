"""The default screen keeps the config's note: a capture manifest that was ignored is said."""

from __future__ import annotations

import os
import shutil

from conftest import ZERO3_CUT, run_cli


def test_ignored_manifest_is_said_on_the_default_screen(tmp_path):
    t = tmp_path / "t.sqlite"
    shutil.copy(ZERO3_CUT, t)
    with open(tmp_path / "t.json", "wb") as f:  # sparse: 17 MiB, over the manifest's 16 MiB limit
        f.truncate(17 * 1024 * 1024)
    env = {**{k: v for k, v in os.environ.items() if k != "LINES"}, "COLUMNS": "200"}  # the path whole
    code, out, err = run_cli("analyze", str(t), "--no-cache", env=env)
    assert code == 0, err
    flat = " ".join(out.split())
    assert f"note: capture manifest {tmp_path / 't.json'}: 17,825,792 bytes, over the 16 MiB limit" in flat
    assert len(out.splitlines()) <= 40
