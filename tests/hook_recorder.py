"""What the capture-hook tests share: an emitter that records the range tree instead of
calling NVTX, and where the hook's import path lives."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOK_DIR = ROOT / "tracekit" / "capture" / "hook"
#: ``PYTHONPATH`` of the DeepSpeed tests' training processes: the hook folder, then the suite's
#: ``sitecustomize`` (tests/pythonpath/: py-cpuinfo's answer once per session, see its docstring)
TRAINING_PYTHONPATH = f"{HOOK_DIR}{os.pathsep}{ROOT / 'tests' / 'pythonpath'}"


class Recorder:
    """Emitter that keeps the range tree as ('push', name) / ('pop',) events."""

    def __init__(self):
        self.events = []

    def push(self, message):
        self.events.append(("push", message))

    def pop(self):
        self.events.append(("pop",))

    def tree(self):
        """Indented names, checking that every pop matches a push and nothing stays open."""
        depth, out = 0, []
        for ev in self.events:
            if ev[0] == "push":
                out.append("  " * depth + ev[1])
                depth += 1
            else:
                assert depth > 0, "pop without push"
                depth -= 1
        assert depth == 0, "unclosed ranges"
        return out
