"""What run a trace records: the DeepSpeed configuration and model size, for titles and the report.

Sources, first found wins per field:

1. the capture manifest beside the trace (``tracekit capture -o NAME`` writes ``NAME.json``;
   also ``NAME_capture.json`` and, for a cut ``PREFIX_cut.sqlite``, ``PREFIX_capture.json``):
   its ``deepspeed_config`` (stage, offload, precision, gradient accumulation) and the
   training command line;
2. the trace's file name: ``134m``, ``1.3b`` (model size), ``bf16`` / ``fp16`` / ``fp32``,
   ``zero3``, ``gas2``, ``offload``;
3. the trace's NVTX range names (``DeepSpeedZeroOptimizer_Stage3`` means ZeRO stage 3).

Nothing here reads more than the manifest and the file name: the range names come from the
already built phase model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunConfig:
    """What is known about the recorded run; ``None`` where unknown.

    Attributes:
        trace: the trace's file name.
        manifest: path of the capture manifest used, or ``None``.
        model_size: model size as written by the user (``"134M"``, ``"1.3B"``).
        stage: ZeRO stage (0-3).
        offload: e.g. ``"optimizer → cpu (pinned)"``; ``"none"`` when the config says so.
        precision: ``"bf16"``, ``"fp16"`` or ``"fp32"``.
        gas: gradient accumulation steps.
        micro_batch: ``train_micro_batch_size_per_gpu``.
        deepspeed_config: the config dict from the manifest (empty without one).
        command: the training command line from the manifest.
        versions: ``{"deepspeed": ..., "torch": ..., "nsys": ...}`` from the manifest.
        gpus: GPU names from the manifest.
    """

    trace: str
    manifest: Path | None = None
    model_size: str | None = None
    stage: int | None = None
    offload: str | None = None
    precision: str | None = None
    gas: int | None = None
    micro_batch: int | None = None
    deepspeed_config: dict = field(default_factory=dict)
    command: str | None = None
    versions: dict = field(default_factory=dict)
    gpus: list = field(default_factory=list)

    def label(self) -> str:
        """One line for figure titles: ``trace · 134M · ZeRO-3 · optimizer → cpu (pinned) · bf16``;
        unknown fields are left out."""
        parts = [self.trace]
        if self.model_size:
            parts.append(f"{self.model_size} params")
        if self.stage is not None:
            parts.append(f"ZeRO-{self.stage}")
        if self.offload:
            parts.append(f"offload: {self.offload}")
        if self.precision:
            parts.append(self.precision)
        if self.gas:
            parts.append(f"grad. accumulation {self.gas}")
        return " · ".join(parts)

    def rows(self) -> list[tuple[str, str]]:
        """``(field, value)`` pairs of what is known, for a configuration table."""
        out = [("trace", self.trace)]
        if self.manifest is not None:
            out.append(("capture manifest", self.manifest.name))
        for name, v in (("model size", self.model_size and f"{self.model_size} parameters"),
                        ("ZeRO stage", self.stage), ("offload", self.offload), ("precision", self.precision),
                        ("gradient accumulation steps", self.gas), ("micro batch per GPU", self.micro_batch),
                        ("training command", self.command)):
            if v is not None:
                out.append((name, str(v)))
        for k, v in self.versions.items():
            out.append((f"{k} version", str(v)))
        if self.gpus:
            out.append(("GPUs", ", ".join(self.gpus)))
        return out


def manifest_candidates(trace: Path) -> list[Path]:
    """Paths where a capture manifest of ``trace`` may lie, in the order tried."""
    stem = trace.stem
    cands = [trace.with_suffix(".json"), trace.with_name(f"{stem}_capture.json")]
    if "_" in stem:
        cands.append(trace.with_name(f"{stem.rsplit('_', 1)[0]}_capture.json"))
    return cands


def _read_manifest(trace: Path) -> tuple[Path | None, dict]:
    for p in manifest_candidates(trace):
        try:
            if not p.is_file():
                continue
            doc = json.loads(p.read_text(encoding="utf-8", errors="replace"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and ("deepspeed_config" in doc or "tracekit_version" in doc):
            return p, doc
    return None, {}


def _from_ds_config(cfg: dict, out: RunConfig) -> None:
    zero = cfg.get("zero_optimization") or {}
    if isinstance(zero, dict) and isinstance(zero.get("stage"), int):
        out.stage = zero["stage"]
    if isinstance(zero, dict):
        parts = []
        for key, what in (("offload_optimizer", "optimizer"), ("offload_param", "parameters")):
            o = zero.get(key)
            if isinstance(o, dict) and o.get("device") not in (None, "none"):
                pin = o.get("pin_memory")
                parts.append(f"{what} → {o['device']}" + (" (pinned)" if pin else " (pageable)" if pin is False else ""))
        if parts:
            out.offload = ", ".join(parts)
        elif out.stage is not None:
            out.offload = "none"
    for prec in ("bf16", "fp16"):
        p = cfg.get(prec)
        if isinstance(p, dict) and p.get("enabled"):
            out.precision = prec
    if out.precision is None and cfg:
        out.precision = "fp32"
    if isinstance(cfg.get("gradient_accumulation_steps"), int):
        out.gas = cfg["gradient_accumulation_steps"]
    if isinstance(cfg.get("train_micro_batch_size_per_gpu"), int):
        out.micro_batch = cfg["train_micro_batch_size_per_gpu"]


_SIZE = re.compile(r"(?:^|[-_.])(\d+(?:\.\d+)?)([mMbB])(?=$|[-_.])")


def run_config(trace: str | Path, range_names: list[str] | None = None) -> RunConfig:
    """The :class:`RunConfig` of ``trace`` (see the module doc for the sources).
    ``range_names``: NVTX range names of the trace (for the ZeRO stage when nothing else says
    it). Never raises for a missing or unreadable manifest (the fields stay unknown)."""
    trace = Path(trace)
    out = RunConfig(trace=trace.name)
    out.manifest, doc = _read_manifest(trace)
    if doc:
        cfg = doc.get("deepspeed_config")
        if not isinstance(cfg, dict):  # the hook records the config the training process saw
            for proc in (doc.get("hook") or {}).get("processes") or []:
                if isinstance(proc, dict) and isinstance(proc.get("deepspeed_config"), dict):
                    cfg = proc["deepspeed_config"]
        if isinstance(cfg, dict):
            out.deepspeed_config = cfg
            _from_ds_config(cfg, out)
        if isinstance(doc.get("command_line"), str):
            out.command = doc["command_line"]
            m = re.search(r"--(?:model[-_]size|params)[ =](\S+)", out.command)
            if m:
                out.model_size = m.group(1)
        vers = doc.get("versions") or {}
        if isinstance(vers, dict):
            out.versions = {k: v for k, v in vers.items() if k in ("deepspeed", "torch") and v}
        nsys = doc.get("nsys") or {}
        if isinstance(nsys, dict) and nsys.get("version"):
            out.versions["nsys"] = nsys["version"]
        out.gpus = [g.get("name", "?") for g in doc.get("gpus") or [] if isinstance(g, dict)]
    name = trace.stem.lower()
    if out.model_size is None:
        m = _SIZE.search(trace.stem)
        if m:
            out.model_size = m.group(1) + m.group(2).upper()
    if out.precision is None:
        for prec in ("bf16", "fp16", "fp32"):
            if prec in name:
                out.precision = prec
    if out.stage is None:
        m = re.search(r"zero-?([0-3])", name)
        if m:
            out.stage = int(m.group(1))
        else:
            for n in range_names or []:
                m = re.search(r"Stage_?([123])\b|Stage([123])\.", n or "")
                if m:
                    out.stage = int(m.group(1) or m.group(2))
                    break
    if out.offload is None and "offload" in name:
        out.offload = "yes (from the file name)"
    if out.gas is None:
        m = re.search(r"gas-?(\d+)", name)
        if m:
            out.gas = int(m.group(1))
    return out


def trace_config(data) -> RunConfig:
    """:func:`run_config` of a :class:`~tracekit.render.data.ReportData` (its path and the
    names of its NVTX ranges), computed once per trace."""
    if "run_config" not in data._cache:
        names: list[str] = []
        r = data.model.ranges
        for col in ("name", "text"):
            if hasattr(r, "columns") and col in r.columns:
                names = [n for n in r[col].unique().to_list()[:5000] if n]
                break
        data._cache["run_config"] = run_config(data.path, names)
    return data._cache["run_config"]
