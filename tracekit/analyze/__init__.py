"""Analysis layer: read nsys SQLite exports with polars and attribute GPU work to training phases.

Inside: :mod:`tracekit.analyze.trace` (reading an export, schema, enums, the read cache, trim),
:mod:`tracekit.analyze.model` (GPU operations, NVTX ranges, phases and iterations, interval
algebra), :mod:`tracekit.analyze.sections` (pure functions of the model returning polars frames,
and their registry); :mod:`.result` (the JSON of one trace), :mod:`.multi` (many traces) and
:mod:`.command` (the CLI). Printing and drawing live in :mod:`tracekit.render`.

The package is also the entry point of the Python API: ``tracekit.analyze(path, **options)``
calls :func:`tracekit.analysis.analyze` and returns an :class:`tracekit.analysis.Analysis`
(the package and the function share the name, so the package module is callable).
"""

import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    def __call__(self, path, options=None, **kwargs):
        """``tracekit.analyze(path, **options)``: :func:`tracekit.analysis.analyze`, with the
        sections ``tracekit analyze --json`` computes (every one but the long timeline) unless
        ``options`` or ``sections=`` say otherwise, so that ``a.to_json()`` is what ``--json``
        prints."""
        from tracekit.analysis import analyze

        if options is None and "sections" not in kwargs:
            from tracekit.analyze.sections import SECTIONS

            kwargs["sections"] = tuple(s for s in SECTIONS if s != "timeline")
        return analyze(path, options, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
