"""The import contract of tracekit's modules: imports go one way, and no module imports itself back.

Every module of the package is parsed (``ast``; imports inside functions count too, since they
run as soon as the function does) and each import of a tracekit module becomes an edge
``importer -> imported`` (``from tracekit.analyze.sections import breakdown`` is an edge to the
module ``sections.breakdown``, ``from tracekit.analyze.sections import Context`` one to the
registry ``sections``). The layers, highest first::

    cli       the command-line front ends (tracekit/cli/: the entry point and one module per
              command; ``python -m tracekit`` and ``python -m tracekit.capture``)
    render    tracekit/render/: terminal tables, figures, report files
    analysis  tracekit/analysis.py (the API's objects), analysis_many.py (several traces),
              analyze/result.py (the JSON of a trace), analyze/multi.py (several traces' work),
              options.py, the analyze package
    sections  tracekit/analyze/sections/: the sections and their registry
    capture   tracekit/capture/ (but its command): recording a run; reads trace/dsconfig only
    model     tracekit/analyze/model/: the phase model of one trace
    trace     tracekit/analyze/trace/: reading the export, the cache
    base      helpers any layer may use: errors, vocab, textsafe, userfiles, output, signals,
              memlimit, analyze/significance, analyze/trace/temporaries (the file writer), and
              the package itself (its ``__version__``)

A module may import its own layer and the layers below it, never one above; and the graph of
modules has no cycle. What breaks either today is in :data:`ALLOWED` with the reason and what
removes it; the test fails on any edge or cycle not listed there, and on an entry that no
longer matches anything (so the list shrinks as the code is fixed).

The hook package (tracekit/capture/hook/) is not part of this graph: it runs inside the user's
training process and imports nothing of tracekit (tests/test_capture_hook.py loads it alone).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "tracekit"

LAYERS = ["base", "trace", "model", "capture", "sections", "analysis", "render", "cli"]
RANK = {name: i for i, name in enumerate(LAYERS)}

#: modules whose layer is not their package's (checked first, exact names)
EXACT = {
    "tracekit": "base",  # the package: __version__ for the cache and the capture manifest
    "tracekit.__main__": "cli",  # `python -m tracekit`
    "tracekit.capture.__main__": "cli",  # `python -m tracekit.capture`: tracekit.cli.capture alone
    "tracekit.analysis": "analysis",
    "tracekit.analysis_many": "analysis",  # several traces: imports multi.py, which imports analysis.py
    "tracekit.analyze": "analysis",
    "tracekit.analyze.result": "analysis",
    "tracekit.analyze.multi": "analysis",
    "tracekit.analyze.multi_runners": "analysis",  # worker processes, Dask, the workers' resources (multi.py's)
    "tracekit.analyze.multi_summary": "analysis",  # the summary across ranks (multi.py's)
    "tracekit.analyze.run_groups": "analysis",  # which traces of a folder are one run (multi.py's)
    "tracekit.analyze.trim": "analysis",  # cuts a trace at the phase model's iterations (tracekit trim)
    "tracekit.analyze.section_data": "analysis",  # the sections' frames render draws, behind one door
    "tracekit.analyze.run_advice": "sections",  # the advice once per run (the advice section's)
    "tracekit.analyze.run_parts": "analysis",  # what each export of a run sends to the join (multi.py's)
    "tracekit.analyze.run_clock": "analysis",  # one clock for a run's exports (run_join's)
    "tracekit.analyze.run_join": "analysis",  # a run's exports joined: waits, host contention (multi.py's)
    "tracekit.analyze.run_summary": "analysis",  # the ranks side by side (result.py's)
    "tracekit.options": "analysis",
    "tracekit.analyze.significance": "base",
    # the one writer of files (temporary, then rename), output.py's too; imports nothing of tracekit
    "tracekit.analyze.trace.temporaries": "base",
}
#: package prefixes, longest first
PREFIXES = [
    ("tracekit.cli", "cli"),
    ("tracekit.analyze.sections", "sections"),
    ("tracekit.analyze.model", "model"),
    ("tracekit.analyze.trace", "trace"),
    ("tracekit.render", "render"),
    ("tracekit.capture", "capture"),
]
BASE = {"tracekit.errors", "tracekit.vocab", "tracekit.textsafe", "tracekit.userfiles", "tracekit.output",
        "tracekit.signals", "tracekit.memlimit"}

#: Edges (importer, imported) that break the layer order or close a cycle today, each with why
#: it is there and what removes it. Keep it short: fix an edge rather than add one.
ALLOWED: dict[tuple[str, str], str] = {
    # -- cycle: the package's lazy public API (its __getattr__ imports the analysis layer on first
    # use, so `import tracekit` loads nothing); modules below read only tracekit.__version__. By
    # design: these four edges stay.
    ("tracekit", "tracekit.analysis"): "lazy public API",
    ("tracekit", "tracekit.analysis_many"): "lazy public API",
    ("tracekit", "tracekit.analyze"): "lazy public API",
    ("tracekit", "tracekit.options"): "lazy public API",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    paths = sorted(PKG.rglob("*.py"))
    return {_module_name(p): p for p in paths if p.relative_to(PKG).parts[:2] != ("capture", "hook")}


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module an import of ``name`` loads last: ``name`` itself, else its nearest parent."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, source: str) -> set[str]:
    """The tracekit modules ``module`` (its text ``source``) imports, at any depth of its code."""
    out: set[str] = set()
    is_package = MODULES[module].name == "__init__.py"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(_resolve(a.name) for a in node.names if a.name.split(".")[0] == "tracekit")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                full = f"{base}.{node.module}" if node.module else base
            else:
                full = node.module or ""
            if full.split(".")[0] != "tracekit":
                continue
            for a in node.names:  # `from pkg import submodule` imports the submodule
                out.add(f"{full}.{a.name}" if f"{full}.{a.name}" in MODULES else _resolve(full))
    out.discard(None)
    out.discard(module)
    return out


def layer(module: str) -> str:
    if module in EXACT:
        return EXACT[module]
    if module in BASE:
        return "base"
    for prefix, name in PREFIXES:
        if module == prefix or module.startswith(prefix + "."):
            return name
    raise AssertionError(f"{module}: no layer; add it to EXACT, PREFIXES or BASE in this test")


def graph() -> dict[str, set[str]]:
    return {m: imports_of(m, p.read_text(encoding="utf-8")) for m, p in MODULES.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_parser_sees_every_kind_of_import():
    """Hand-made: module-level, function-level, relative and `from pkg import submodule` imports."""
    src = ("import tracekit.errors\n"
           "from tracekit.analyze.sections import breakdown, Context\n"
           "def f():\n"
           "    from tracekit.render import figures\n"
           "    import os\n"
           "from . import export\n"
           "from .cache import TraceCache\n")
    got = imports_of("tracekit.analyze.trace.quiet", src)
    assert got == {"tracekit.errors", "tracekit.analyze.sections.breakdown", "tracekit.analyze.sections",
                   "tracekit.render.figures", "tracekit.analyze.trace.export", "tracekit.analyze.trace.cache"}


def test_cycle_finder():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_module_has_a_layer():
    assert len(MODULES) > 60  # the whole package was found
    for m in MODULES:
        layer(m)


def test_no_import_goes_up_a_layer():
    edges = graph()
    bad = sorted(f"{a} ({layer(a)}) imports {b} ({layer(b)})" for a, targets in edges.items() for b in targets
                 if RANK[layer(b)] > RANK[layer(a)] and (a, b) not in ALLOWED)
    assert not bad, "imports against the layer order (cli > render > analysis > sections > model > trace):\n" + \
        "\n".join(bad)


def test_no_import_cycle():
    edges = {a: {b for b in targets if (a, b) not in ALLOWED} for a, targets in graph().items()}
    found = cycles(edges)
    assert not found, "import cycles (each a set of modules that import each other):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_render_reads_no_section():
    """render/ gets the sections' frames through the analysis layer (:class:`tracekit.analysis.Analysis`,
    :mod:`tracekit.analyze.section_data`), never from a section module or the registry itself."""
    edges = graph()
    bad = sorted(f"{a} imports {b}" for a, targets in edges.items() if layer(a) == "render" for b in targets
                 if layer(b) == "sections" and (a, b) not in ALLOWED)
    assert not bad, "render imports sections (go through tracekit.analysis):\n" + "\n".join(bad)


def test_allow_list_is_current():
    """Every allowed edge still exists: a fixed import leaves the list with its fix."""
    edges = graph()
    stale = sorted(f"{a} -> {b}" for a, b in ALLOWED if b not in edges.get(a, set()))
    assert not stale, "ALLOWED entries that no longer match an import (remove them):\n" + "\n".join(stale)


@pytest.mark.parametrize("module", ["tracekit.analyze.trace.json_format", "tracekit.analyze.trace.temporaries",
                                    "tracekit.analyze.trace.chunks"])
def test_the_new_trace_modules_are_leaves(module):
    """The modules split out of cache.py and export.py import nothing of tracekit."""
    assert graph()[module] == set()
