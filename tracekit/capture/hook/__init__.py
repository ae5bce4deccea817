"""Files that ``tracekit capture`` puts on the training processes' ``PYTHONPATH``.

This folder is self-contained (standard library plus the optional ``nvtx`` package): the
training may run under another Python than tracekit's own, so nothing here imports tracekit.
"""
