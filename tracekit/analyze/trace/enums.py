"""Built-in maps of the nsys enums tracekit uses, for exports without ``ENUM_*`` tables.

Values are those of CUPTI (``CUpti_ActivityMemcpyKind``, ``CUpti_ActivityMemoryKind``) as
exported by Nsight Systems into ``ENUM_CUDA_MEMCPY_OPER`` / ``ENUM_CUDA_MEM_KIND``, and the
NVTX event types of ``ENUM_NSYS_EVENT_TYPE``. When the export has the ``ENUM_*`` table, the
table wins (see :meth:`tracekit.analyze.trace.export.Export.enum_labels`).
"""

from __future__ import annotations

#: copyKind -> short direction label used throughout tracekit.
COPY_KIND: dict[int, str] = {
    0: "unknown",
    1: "H2D",
    2: "D2H",
    3: "H2A",
    4: "A2H",
    5: "A2A",
    6: "A2D",
    7: "D2A",
    8: "D2D",
    9: "H2H",
    10: "P2P",
    11: "UVM_H2D",
    12: "UVM_D2H",
    13: "UVM_D2D",
}

#: ENUM_CUDA_MEMCPY_OPER.name -> short label, to translate an export's own table.
COPY_KIND_BY_NAME: dict[str, str] = {
    "CUDA_MEMCPY_KIND_UNKNOWN": "unknown",
    "CUDA_MEMCPY_KIND_HTOD": "H2D",
    "CUDA_MEMCPY_KIND_DTOH": "D2H",
    "CUDA_MEMCPY_KIND_HTOA": "H2A",
    "CUDA_MEMCPY_KIND_ATOH": "A2H",
    "CUDA_MEMCPY_KIND_ATOA": "A2A",
    "CUDA_MEMCPY_KIND_ATOD": "A2D",
    "CUDA_MEMCPY_KIND_DTOA": "D2A",
    "CUDA_MEMCPY_KIND_DTOD": "D2D",
    "CUDA_MEMCPY_KIND_HTOH": "H2H",
    "CUDA_MEMCPY_KIND_PTOP": "P2P",
    "CUDA_MEMCPY_KIND_UVM_HTOD": "UVM_H2D",
    "CUDA_MEMCPY_KIND_UVM_DTOH": "UVM_D2H",
    "CUDA_MEMCPY_KIND_UVM_DTOD": "UVM_D2D",
}

#: srcKind / dstKind / memKind -> label.
MEM_KIND: dict[int, str] = {
    0: "pageable",
    1: "pinned",
    2: "device",
    3: "array",
    4: "managed",
    5: "device_static",
    6: "managed_static",
    7: "unknown",
}

MEM_KIND_BY_NAME: dict[str, str] = {
    "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE": "pageable",
    "CUDA_MEMOPR_MEMORY_KIND_PINNED": "pinned",
    "CUDA_MEMOPR_MEMORY_KIND_DEVICE": "device",
    "CUDA_MEMOPR_MEMORY_KIND_ARRAY": "array",
    "CUDA_MEMOPR_MEMORY_KIND_MANAGED": "managed",
    "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC": "device_static",
    "CUDA_MEMOPR_MEMORY_KIND_MANAGED_STATIC": "managed_static",
    "CUDA_MEMOPR_MEMORY_KIND_UNKNOWN": "unknown",
}

# NVTX event types (ENUM_NSYS_EVENT_TYPE); stable across the exports in shared/traces/public.
NVTX_MARK = 34
NVTX_PUSH_POP = 59
NVTX_START_END = 60
NVTX_DOMAIN_CREATE = 75

#: The nsys option that records each table, for "the trace lacks ..." messages.
RECORDED_BY: dict[str, str] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": "-t cuda",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "-t cuda",
    "CUPTI_ACTIVITY_KIND_MEMSET": "-t cuda",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "-t cuda",
    "NVTX_EVENTS": "-t nvtx",
    "CUDA_GPU_MEMORY_USAGE_EVENTS": "--cuda-memory-usage=true",
    "GPU_METRICS": "--gpu-metrics-devices=all",
    "TARGET_INFO_GPU_METRICS": "--gpu-metrics-devices=all",
    "TARGET_INFO_GPU": "-t cuda",
}
