"""What run a trace records: the DeepSpeed configuration and model size, for titles and the report.

Sources, first found wins per field:

1. the capture manifest beside the trace, the file
   :func:`tracekit.analyze.trace.dsconfig.manifest_for` names (``tracekit capture -o NAME``
   writes ``NAME.json``; else ``NAME_capture.json``, else for a cut ``PREFIX_cut.sqlite``
   ``PREFIX_capture.json``), the same one the advice reads:
   its ``deepspeed_config`` (stage, offload, precision, gradient accumulation) and the
   training command line;
2. the analysis's config table (``--json``'s ``config.settings``: what the trace shows when no
   config was found), so the figures' titles say what ``analyze`` says;
3. the trace's file name: ``134m``, ``1.3b`` (model size), ``bf16`` / ``fp16`` / ``fp32``,
   ``zero3``, ``gas2``, ``offload``: only for fields nothing above gave;
4. the trace's NVTX range names (``DeepSpeedZeroOptimizer_Stage3`` means ZeRO stage 3).

Nothing here reads more than the manifest, the file name and the finished analysis: the range
names come from the already built phase model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.analyze.trace.dsconfig import is_manifest, manifest_for, read_manifest


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


def _read_manifest(trace: Path) -> tuple[Path | None, dict]:
    """``(path, document)`` of the capture manifest of ``trace``: the file
    :func:`tracekit.analyze.trace.dsconfig.manifest_for` names (the same one the advice and the
    report's configuration read). A JSON object without a manifest's keys is a DeepSpeed config
    kept under the manifest's name, read as ``{"deepspeed_config": it}`` (as
    :func:`tracekit.analyze.trace.dsconfig.load` reads it); ``(None, {})`` when there is none or
    :func:`tracekit.analyze.trace.dsconfig.read_manifest` refuses it (not a JSON object, too
    large, nested too deeply, keys of the wrong type)."""
    p = manifest_for(trace)
    if p is None:
        return None, {}
    doc, _note = read_manifest(p)  # the one reader: size, depth and shape checked (the advice says why not)
    if doc is None:
        return None, {}
    if is_manifest(doc):
        return p, doc
    return p, {"deepspeed_config": doc}


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


def _from_settings(settings: list[dict], out: RunConfig) -> None:
    """Fill the fields still unknown from the analysis's config table (``--json``'s
    ``config.settings``: ``{"key", "value", "source", "how"}``, the config's values or what the
    trace shows), so the figures say what ``analyze`` says before any guess from the file name."""
    v = {s.get("key"): s.get("value") for s in settings or [] if isinstance(s, dict)}
    if out.stage is None and v.get("zero_optimization.stage") is not None:
        out.stage = v["zero_optimization.stage"]
    dev = v.get("zero_optimization.offload_optimizer.device")
    if out.offload is None and dev is not None:
        pin = v.get("zero_optimization.offload_optimizer.pin_memory")
        out.offload = "none" if dev == "none" else (
            f"optimizer → {dev}" + (" (pinned)" if pin is True else " (pageable)" if pin is False else ""))
    if out.precision is None and v.get("precision") in ("bf16", "fp16", "fp32"):
        out.precision = v["precision"]
    if out.gas is None and isinstance(v.get("gradient_accumulation_steps"), int):
        out.gas = v["gradient_accumulation_steps"]


def run_config(trace: str | Path, range_names: list[str] | None = None,
               settings: list[dict] | None = None) -> RunConfig:
    """The :class:`RunConfig` of ``trace`` (see the module doc for the sources).
    ``range_names``: NVTX range names of the trace (for the ZeRO stage when nothing else says
    it); ``settings``: the analysis's config table (:func:`_from_settings`), read after the
    manifest and before the file name. Never raises for a missing or unreadable manifest (the
    fields stay unknown)."""
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
        out.gpus = [str(g.get("name", "?")) for g in doc.get("gpus") or [] if isinstance(g, dict)]
    _from_settings(settings or [], out)
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
        if getattr(data.model, "range_names", None) is not None:  # (a model that keeps part of its ranges)
            names = [n for n in data.model.range_names[:5000] if n]
        else:
            for col in ("name", "text"):
                if hasattr(r, "columns") and col in r.columns:
                    names = [n for n in r[col].unique().to_list()[:5000] if n]
                    break
        settings = None
        if data.analysis is not None:  # what analyze says: the config's values or the trace's
            settings = ((data.analysis.to_json() or {}).get("config") or {}).get("settings")
        data._cache["run_config"] = run_config(data.path, names, settings)
    return data._cache["run_config"]


# ---------------------------------------------------------------------- the settings tables
#: Narrowest the "from"/"how" column is squeezed to before the keys fold (at their dots).
FROM_MIN_WIDTH = 26


def config_text(value) -> str:
    """A DeepSpeed setting's value as the terminal tables show it, JSON-like: ``true`` /
    ``false``, ``not set`` for None, integers with thousands separators (``500,000,000``),
    lists and dicts as JSON, other values as ``str``."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    return str(value)


def fold_key(key: str, width: int) -> str:
    """``key`` folded onto lines of at most ``width`` characters, only after a dot
    (``zero_optimization.`` / ``offload_optimizer.device``); a part between dots longer than
    ``width`` stays whole on its line. Joining the lines gives ``key`` back."""
    parts = re.findall(r"[^.]+\.?|\.", key) or [key]
    lines = [""]
    for p in parts:
        if lines[-1] and len(lines[-1]) + len(p) > width:
            lines.append(p)
        else:
            lines[-1] += p
    return "\n".join(lines)


def key_width(keys: list[str], budget: int) -> int:
    """Width of a key column that gets ``budget`` characters: the longest key when it fits,
    else ``budget`` but at least the longest part between dots (see :func:`fold_key`)."""
    longest = max((len(k) for k in keys), default=0)
    if longest <= budget:
        return longest
    part = max((len(p) for k in keys for p in re.findall(r"[^.]+\.?|\.", k)), default=0)
    return max(budget, part)


def _table_overhead(n_columns: int) -> int:
    """Characters a house-style table (:func:`tracekit.render.terminal.new_table`) adds around
    ``n_columns`` cells: edges and padding, measured by rich itself."""
    from rich.console import Console

    from tracekit.render.terminal import new_table

    t = new_table("")
    for _ in range(n_columns):
        t.add_column("")
    t.add_row(*["x"] * n_columns)
    c = Console(width=1000, file=None, record=False, color_system=None)
    with c.capture() as cap:
        c.print(t)
    return max(len(line) for line in cap.get().splitlines()) - n_columns


def settings_table(rows: list[dict], width: int):
    """The ``analyze`` table of the DeepSpeed settings (``rows``: ``key, value, source, how`` as
    in the result's ``config.settings``) laid out for ``width`` columns: values JSON-like
    (:func:`config_text`), the "from" column folds first, a key folds only at its dots and
    only when the "from" column would be narrower than :data:`FROM_MIN_WIDTH` otherwise."""
    from rich.text import Text

    from tracekit.render.terminal import new_table
    from tracekit.textsafe import clean, text as _t

    keys = [clean(r["key"]) for r in rows]
    values = [config_text(r["value"]) for r in rows]
    froms = [r["how"] if r["source"] != "trace" else f"inferred: {r['how']}" for r in rows]
    short_value = max((len(v) for v in values if len(v) <= 16), default=5)
    word = max((len(w) for f in froms for w in f.split()), default=0)  # "from" keeps its longest word whole
    from_min = min(max((len(f) for f in froms), default=0), max(FROM_MIN_WIDTH, min(word, 40)))
    room = width - _table_overhead(3) - max(short_value, len("value")) - from_min
    kw = key_width(keys, room)
    t = new_table("DeepSpeed settings that matter for offload")
    t.add_column("key", no_wrap=True, min_width=kw, max_width=kw)
    t.add_column("value", overflow="fold", min_width=min(short_value, 16))
    t.add_column("from", overflow="fold")
    for k, v, f in zip(keys, values, froms):
        t.add_row(Text("\n").join(_t(line) for line in fold_key(k, kw).split("\n")), _t(v), _t(f))
    return t
