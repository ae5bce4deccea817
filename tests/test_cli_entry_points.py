"""The three ways to start the command line (``tracekit``, ``python -m tracekit``,
``python -m tracekit.cli``) run the same program: the version of pyproject.toml, the same
command list in ``--help``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSOLE = Path(sys.executable).with_name("tracekit")


def _version_in_pyproject() -> str:
    return re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def _run(*argv: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "100", "NO_COLOR": "1"}
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=120)


def test_every_entry_point_prints_the_version():
    want = f"tracekit {_version_in_pyproject()}\n"
    starts = [[sys.executable, "-m", "tracekit"], [sys.executable, "-m", "tracekit.cli"]]
    if CONSOLE.exists():
        starts.append([str(CONSOLE)])
    for start in starts:
        p = _run(*start, "--version")
        assert (p.returncode, p.stdout, p.stderr) == (0, want, ""), start


def test_python_m_tracekit_lists_every_command():
    p = _run(sys.executable, "-m", "tracekit", "--help")
    assert p.returncode == 0, p.stderr
    listed = re.findall(r"^│ (\w+)\s", p.stdout, re.M)
    assert listed == ["analyze", "trim", "capture", "report", "compare"]
