"""Capture layer: run training under ``nsys profile`` with NVTX ranges injected into DeepSpeed."""
