"""tracekit: measure what DeepSpeed optimizer offload costs on the PCIe link and the host.

Two layers: :mod:`tracekit.capture` records a training run under Nsight Systems with NVTX
phase ranges; :mod:`tracekit.analyze` reads the SQLite export with polars.
"""

__version__ = "0.1.0"
