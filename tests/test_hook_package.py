"""The hook package loads as the training processes load it, and only with the standard library.

``sitecustomize`` imports ``_tracekit_hook`` from tracekit/capture/hook/ (on ``PYTHONPATH``) in
every process of the user's training, under whatever Python runs it: the package's modules must
import each other relatively and nothing outside the standard library at import time.
"""

import ast
import json
import os
import subprocess
import sys

from hook_recorder import HOOK_DIR  # tests/ is on sys.path (conftest)

PKG = HOOK_DIR / "_tracekit_hook"


def test_imported_from_the_hook_folder_it_loads_only_the_standard_library():
    code = ("import sys\n"
            "before = set(sys.modules)\n"
            f"sys.path.insert(0, {str(HOOK_DIR)!r})\n"
            "import _tracekit_hook as h\n"
            "new = sorted(set(sys.modules) - before)\n"
            "import json; print(json.dumps([new, h.install.__module__, h._state is h.core._state]))\n")
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    new, where, shared = json.loads(done.stdout)
    ours = {m for m in new if m == "_tracekit_hook" or m.startswith("_tracekit_hook.")}
    assert ours == {"_tracekit_hook"} | {f"_tracekit_hook.{p.stem}" for p in PKG.glob("*.py") if p.stem != "__init__"}
    others = [m for m in new if m not in ours and m.split(".")[0] not in sys.stdlib_module_names]
    assert others == [], others
    assert where == "_tracekit_hook.install" and shared  # one state object behind the flat namespace


def test_module_level_imports_are_standard_library_or_relative():
    """Every import outside a function: the standard library, or a sibling module (level 1)."""
    for path in sorted(PKG.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    assert a.name.split(".")[0] in sys.stdlib_module_names, (path.name, a.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    assert node.level == 1 and (PKG / f"{node.module}.py").exists(), (path.name, node.module)
                else:
                    assert node.module.split(".")[0] in sys.stdlib_module_names or node.module == "__future__", \
                        (path.name, node.module)
