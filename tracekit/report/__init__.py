"""Figures, reports and run comparison built on the analysis layer (:mod:`tracekit.analyze`).

- :mod:`tracekit.report.data`: :class:`ReportData` (one analysed trace) and the frames the
  figures plot (memory timeline, copy throughput, copy sizes, overlap, contention);
- :mod:`tracekit.report.figures`: one function per figure, each returning ``(figure, frame)``;
- :mod:`tracekit.report.report`: ``tracekit report`` (figures + ``report.md``);
- :mod:`tracekit.report.compare`: ``tracekit compare`` (two runs side by side);
- :mod:`tracekit.report.command`: the CLI commands.
"""
