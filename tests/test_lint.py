"""The code passes ``ruff check`` with the rules of ``[tool.ruff]`` in pyproject.toml.

Skipped when ruff is not installed (it is in the ``test`` extra). The rules: pycodestyle errors
and warnings (E, W; lines of at most 120 characters), pyflakes (F) and import order (I), with
the per-file exceptions listed, and explained, in pyproject.toml.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_passes():
    pytest.importorskip("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ruff_catches_a_violation(tmp_path):
    """The check is live: the same configuration rejects an unused import and a long line."""
    pytest.importorskip("ruff")
    bad = tmp_path / "tracekit" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("import os\n\nX = '" + "x" * 130 + "'\n")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "--config", str(ROOT / "pyproject.toml"), str(bad)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "F401" in done.stdout and "E501" in done.stdout, done.stdout
