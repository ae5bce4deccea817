"""tracekit: measure what DeepSpeed optimizer offload costs on the PCIe link and the host.

Two layers: :mod:`tracekit.capture` records a training run under Nsight Systems with NVTX
phase ranges; :mod:`tracekit.analyze` reads the SQLite export with polars.

The Python API (docs/api.md): ``tracekit.analyze(path, **options)`` returns an
:class:`~tracekit.analysis.Analysis` (``.phases``, ``.sub_phases``, ``.copies``, ``.kernels``,
``.frames``, ``.findings``, ``.advice``, ``.to_json()``), ``tracekit.analyze_many(paths)`` a
:class:`~tracekit.analysis_many.ManyAnalysis`; ``tracekit.Options`` holds every option and default.
``tracekit.analyze`` is also the analysis layer's package, made callable
(:mod:`tracekit.analyze`). Importing tracekit loads neither polars nor the analysis stack.
"""

__version__ = "0.1.0"

__all__ = ["Analysis", "ManyAnalysis", "Options", "analyze", "analyze_many", "__version__"]


def __getattr__(name: str):
    # lazy: `import tracekit` (and the CLI's cached answers) must not import polars
    if name == "analyze":  # the package, callable as the API's entry point
        import tracekit.analyze as _analyze

        return _analyze
    if name == "Analysis":
        from tracekit.analysis import Analysis

        return Analysis
    if name in ("ManyAnalysis", "analyze_many"):
        from tracekit import analysis_many

        return getattr(analysis_many, name)
    if name == "Options":
        from tracekit.options import Options

        return Options
    raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
