"""A trace with copies but no kernel rows is analysed with a note saying so (the GPU's busy time
is then the copies' only), on the screen and in --json; a trace with kernels gets no such note."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from conftest import run_cli

from tracekit.vocab import NO_KERNELS_NOTE

FIX = Path(__file__).resolve().parent / "fixtures"


def test_copies_without_kernels_get_the_note(tmp_path):
    src = tmp_path / "no_kernels.sqlite"
    shutil.copyfile(FIX / "ds_zero3_offload_iter1-2.sqlite", src)
    with sqlite3.connect(src) as con:
        con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
        assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()[0] > 0
    rc, js, _ = run_cli("analyze", src, "--json", "--no-cache")
    assert rc == 0 and NO_KERNELS_NOTE in json.loads(js)["transfer_notes"]
    rc, out, _ = run_cli("analyze", src, "--no-cache", env={"COLUMNS": "200"})
    assert rc == 0 and f"note: {NO_KERNELS_NOTE}" in " ".join(out.split())  # folded at the width
    rc, js, _ = run_cli("analyze", FIX / "ds_zero3_offload_iter1-2.sqlite", "--json", "--no-cache")
    assert NO_KERNELS_NOTE not in json.loads(js)["transfer_notes"]
