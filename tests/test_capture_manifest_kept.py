"""``tracekit capture`` keeps its manifest when the output folder stops taking it mid-run.

The training itself (run under the FAKE nsys of ``tests/fake_nsys``) makes ``run.json`` a
directory, so the manifest cannot be renamed into place: the capture must say where the manifest
went instead, keep the report and the export, and exit 3 (training fine, capture not)."""

import json
import os
import subprocess
import sys
from pathlib import Path

FAKE_NSYS = str(Path(__file__).parent / "fake_nsys" / "nsys")


def test_manifest_kept_elsewhere_when_the_folder_refuses_it(tmp_path):
    env = dict(os.environ, FAKE_NSYS_MODE="ok", FAKE_NSYS_GPU="supported", FAKE_NSYS_LOG=str(tmp_path / "l.jsonl"))
    env.pop("TRACEKIT_NSYS", None)
    done = subprocess.run([sys.executable, "-m", "tracekit.cli", "capture", "--nsys", FAKE_NSYS, "-o", "run", "--",
                           sys.executable, "-c", "import os; os.mkdir('run.json'); print('trained')"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert (tmp_path / "run.nsys-rep").is_file() and (tmp_path / "run.sqlite").is_file()
    assert (tmp_path / "run.json").is_dir() and not list(tmp_path.glob("*.part"))
    line = next(x for x in done.stderr.splitlines() if "cannot write the manifest" in x)
    kept = Path(line.split("it is kept as ", 1)[1].split(": move it", 1)[0])
    m = json.loads(kept.read_text())
    assert m["command"][-1].endswith("print('trained')")
    assert m["files"]["sqlite"]["bytes"] == (tmp_path / "run.sqlite").stat().st_size
    assert str(kept) in done.stderr.splitlines()[-1]  # the 'wrote ...' line names where it went
    kept.unlink()
    kept.parent.rmdir()
