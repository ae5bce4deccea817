"""Render layer: the only code that prints or draws. Every view here reads an
:class:`tracekit.analysis.Analysis` (or its JSON); nothing here computes a number.

- terminal tables: :mod:`.terminal` (console, width rule), :mod:`.tables` (phase tables, ``--format``),
  :mod:`.transfer_tables`, :mod:`.multi_gpu_tables`, :mod:`.cpu_update_tables`, :mod:`.many`
  (many traces and the cached terminal views);
- files: :mod:`.files` (``--out DIR``);
- figures and reports: :mod:`.data` (:class:`ReportData` and the frames the figures plot),
  :mod:`.figures`, :mod:`.style`, :mod:`.summary`, :mod:`.report` (``report.md``), :mod:`.html`,
  :mod:`.perfetto`, :mod:`.config`;
- :mod:`.compare`: ``tracekit compare`` (its command line: :mod:`tracekit.cli.compare`).
"""
