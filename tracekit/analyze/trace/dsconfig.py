"""The DeepSpeed config of a run and the versions it ran with, or what the trace tells of them.

Sources, first found wins:

1. ``--ds-config FILE``: a DeepSpeed JSON config, or a ``tracekit capture`` manifest (a JSON
   object with a ``deepspeed_config`` key);
2. the capture manifest beside the trace (:func:`manifest_candidates` says which):
   ``NAME.json`` next to ``NAME.sqlite`` (what ``tracekit capture -o NAME`` writes), else
   ``NAME_capture.json``, else ``PREFIX_capture.json`` for a cut ``PREFIX_cut.sqlite``;
3. nothing: :func:`infer_settings` reads what it can from the trace (stage 3 from
   ``DeepSpeedZeroOptimizer_Stage3`` ranges, gradient accumulation from the micro-steps per
   iteration, the optimizer offload from the update's copy-back or CPU optimizer step,
   parameter offload from forward's H2D copies, pin_memory from the host memory kind of the
   gradient copies, fp16/bf16 from DeepSpeed's ``has_overflow`` range or the 16-bit type in the
   kernels' names, SuperOffload and ZenFlow from their ranges, the number of sub-groups from
   the copy-backs per optimizer step and the sub_group_size bracket from their sizes) and says
   how (docs/advice.md, "The config").

:func:`settings` turns either into rows ``{"key", "value", "source", "how"}``: ``source`` is
``config`` (set in the config), ``default`` (DeepSpeed's default for an unset key, from
``deepspeed/runtime/zero/config.py`` and ``offload_config.py``), ``trace`` (inferred) or
``unknown``. Keys are dotted DeepSpeed config paths (``zero_optimization.offload_optimizer.
pin_memory``); ``precision`` stands for ``fp16.enabled`` / ``bf16.enabled``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.userfiles import shown

#: DeepSpeed defaults of the keys shown (deepspeed/runtime/zero/config.py, offload_config.py).
#: ``offload_optimizer.pin_memory`` became True by default in DeepSpeed 0.19.6 (PR #8207).
DEFAULTS = {
    "zero_optimization.stage": 0,
    "zero_optimization.offload_optimizer.device": "none",
    "zero_optimization.offload_optimizer.ratio": 1.0,
    "zero_optimization.offload_optimizer.super_offload": False,
    "zero_optimization.offload_param.device": "none",
    "zero_optimization.sub_group_size": 1_000_000_000,
    "zero_optimization.contiguous_gradients": True,
    "zero_optimization.reduce_bucket_size": 500_000_000,
    "zero_optimization.allgather_bucket_size": 500_000_000,
    "zero_optimization.stage3_prefetch_bucket_size": 50_000_000,
    "gradient_accumulation_steps": 1,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_clipping": 0.0,  # before 0.19.3; 1.0 since (config_value)
    "precision": "fp32",
    "optimizer.params.torch_adam": False,
}

#: Keys shown at the top of ``analyze`` and ``report``, in this order.
KEYS = [
    "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_optimizer.ratio",
    "zero_optimization.offload_optimizer.super_offload",
    "zero_optimization.offload_param.device",
    "zero_optimization.sub_group_size",
    "precision",
    "gradient_accumulation_steps",
    "train_micro_batch_size_per_gpu",
    "zero_optimization.overlap_comm",
    "zero_optimization.contiguous_gradients",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "gradient_clipping",
    "zero_optimization.zenflow",
    "optimizer.type",
    "optimizer.params.torch_adam",
    "optimizer.params.weight_decay",
]


def manifest_candidates(trace: str | Path) -> list[Path]:
    """The paths where the capture manifest of ``trace`` may lie, in the order tried (the one
    rule of which manifest belongs to a trace; :func:`manifest_for` takes the first that is a
    file, and everything that reads a manifest beside a trace goes through it):

    1. ``NAME.json`` for ``NAME.sqlite``: what ``tracekit capture -o NAME`` writes beside its
       export (``tracekit.capture.runner.output_paths``), also ``NAME.rankR.json`` beside
       ``NAME.rankR.sqlite`` (``--per-rank``) and ``NAME.new-PID.json`` (a kept ``--force`` run);
    2. ``NAME_capture.json``: a manifest kept beside a trace under the trace's name (the test
       fixtures' naming);
    3. ``PREFIX_capture.json`` for a cut ``PREFIX_cut.sqlite`` only (the trace cut from capture
       ``PREFIX`` with ``tracekit trim``). No other ``_`` in a name is read as a prefix:
       ``zero3_b.sqlite`` does not take ``zero3_capture.json``, which belongs to another trace.
    """
    t = Path(trace)
    cands = [t.with_suffix(".json"), t.with_name(t.stem + "_capture.json")]
    if t.stem.endswith("_cut") and len(t.stem) > 4:  # PREFIX_cut.sqlite -> PREFIX_capture.json
        cands.append(t.with_name(t.stem[:-4] + "_capture.json"))
    return cands


def manifest_for(trace: str | Path) -> Path | None:
    """The capture manifest beside ``trace``: the first of :func:`manifest_candidates` that is
    a file (read or not: a manifest that is not valid JSON is still the one of this trace, and
    its readers say so rather than fall back to another name), or None."""
    for cand in manifest_candidates(trace):
        if cand.is_file():
            return cand
    return None


#: Largest ``--ds-config`` or capture manifest read (bytes): a DeepSpeed config is a few KB and
#: a manifest with its hook report a few hundred; a larger file is refused by its size at once
#: instead of read whole (issue 25: a 3 GB ``NAME.json`` took 70 s and 6.4 GB).
MAX_CONFIG_BYTES = 16 << 20
#: Deepest nesting of objects and arrays accepted in such a file (DeepSpeed's configs nest 3-4
#: levels; a deeper document is refused before anything walks it recursively).
MAX_CONFIG_DEPTH = 64


def _depth(doc) -> int:
    """Nesting depth of ``doc`` (a scalar 0, ``{}``/``[]`` 1), walked without recursion and
    stopping past :data:`MAX_CONFIG_DEPTH`."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if deepest > MAX_CONFIG_DEPTH:
                return deepest
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def read_json_object(path: str | Path, what: str) -> dict:
    """The JSON object in ``path`` (a ``--ds-config`` or a capture manifest; ``what`` names it in
    messages). The one reader of such files: a regular file of at most :data:`MAX_CONFIG_BYTES`
    (:func:`tracekit.userfiles.read_limited`: no FIFO, no device), UTF-8 JSON as Python and
    DeepSpeed read it (``NaN``/``Infinity`` taken), an object nested at most
    :data:`MAX_CONFIG_DEPTH` deep. Raises
    :class:`TracekitError`, one line naming ``what``, the path as given and the problem."""
    from tracekit.userfiles import read_limited

    raw = read_limited(path, what, MAX_CONFIG_BYTES)
    head = f"{what} {shown(path)}"
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TracekitError(f"{head}: not UTF-8 text (byte {exc.start:,}); pass a DeepSpeed JSON config") from None
    try:
        data = json.loads(text)  # NaN/Infinity taken, as DeepSpeed's json.load does (HF Trainer writes
        # steps_per_print: Infinity); tracekit's JSON output writes them as null (json_format.json_safe)
    except RecursionError:
        raise TracekitError(f"{head}: nested too deeply to be a DeepSpeed config or a capture manifest "
                            f"(at most {MAX_CONFIG_DEPTH} levels)") from None
    except ValueError as exc:
        raise TracekitError(f"{head}: not valid JSON ({exc}); pass a DeepSpeed JSON config") from None
    if not isinstance(data, dict):
        raise TracekitError(f"{head}: expected a JSON object (a DeepSpeed config or a capture manifest)")
    if _depth(data) > MAX_CONFIG_DEPTH:
        raise TracekitError(f"{head}: nested too deeply to be a DeepSpeed config or a capture manifest "
                            f"(at most {MAX_CONFIG_DEPTH} levels)")
    return data


def is_manifest(doc: dict) -> bool:
    """True for a capture manifest (``deepspeed_config`` or ``tracekit_version`` at the top),
    False for a plain DeepSpeed config."""
    return "deepspeed_config" in doc or "tracekit_version" in doc


#: The keys of a capture manifest that tracekit reads, and the JSON type each must have (None
#: also accepted): the one description of a manifest's shape (:func:`manifest_problem`).
MANIFEST_SHAPE = {"deepspeed_config": (dict, "an object (the DeepSpeed config)"),
                  "versions": (dict, "an object of name: version"),
                  "gpus": (list, "a list of GPU objects"),
                  "hook": (dict, "an object (the hook's report)"),
                  "command_line": (str, "a string"),
                  "nsys": (dict, "an object")}

_JSON_TYPE = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
              float: "a number"}


def manifest_problem(doc: dict) -> str | None:
    """What is wrong with the shape of the capture manifest ``doc`` (:data:`MANIFEST_SHAPE`:
    ``'"versions" is a list, expected an object of name: version'``), or None when every key
    tracekit reads has its type (or is absent or null). A plain DeepSpeed config has no such
    keys and no problem."""
    if not is_manifest(doc):
        return None
    for key, (want, words) in MANIFEST_SHAPE.items():
        v = doc.get(key)
        if v is not None and not isinstance(v, want):
            return f'"{key}" is {_JSON_TYPE.get(type(v), "another value")}, expected {words}'
    for name, v in (doc.get("versions") or {}).items():
        if isinstance(v, (dict, list)):
            return f'"versions"."{name}" is {_JSON_TYPE[type(v)]}, expected a version string'
    procs = (doc.get("hook") or {}).get("processes")
    if procs is not None and not isinstance(procs, list):
        return f'"hook"."processes" is {_JSON_TYPE.get(type(procs), "another value")}, expected a list'
    return None


def read_manifest(path: str | Path) -> tuple[dict | None, str | None]:
    """``(document, None)`` of the capture manifest at ``path`` (:func:`read_json_object`, its
    shape checked by :func:`manifest_problem`), or ``(None, note)``: one line saying why it is
    ignored (``capture manifest t.json: 3,221,225,472 bytes, more than the 16 MiB read ...;
    manifest ignored``). Every reader of the manifest beside a trace (the advice's config, the
    report's run configuration, the CPU-update worker map) goes through it; never raises
    :class:`TracekitError`."""
    try:
        doc = read_json_object(path, "capture manifest")
    except TracekitError as exc:
        return None, f"{exc}; manifest ignored"
    problem = manifest_problem(doc)
    if problem:
        return None, f"capture manifest {shown(path)}: {problem}; manifest ignored"
    return doc, None


def load(trace: str | Path | None, ds_config: str | Path | None = None) -> dict:
    """The config of the run of ``trace``.

    Returns ``{"source": "ds-config"|"manifest"|None, "path": str|None,
    "deepspeed_config": dict|None, "versions": {name: version}, "gpus": [str], "note": str|None}``.
    ``versions`` and ``gpus`` come from a manifest only. A manifest beside the trace that
    :func:`read_manifest` refuses (not valid JSON, too large, nested too deeply, keys of the
    wrong type) is skipped with a note; a bad ``--ds-config`` raises :class:`TracekitError`
    (one line: the file and what is wrong).
    """
    out = {"source": None, "path": None, "deepspeed_config": None, "versions": {}, "gpus": [], "note": None}
    if ds_config is not None:
        p = Path(ds_config)
        data = read_json_object(p, "--ds-config")
        problem = manifest_problem(data)
        if problem:
            raise TracekitError(f"--ds-config {shown(p)}: a capture manifest whose {problem}; pass the DeepSpeed "
                                "JSON config itself")
        out.update(source="ds-config", path=str(p))
    else:
        p = manifest_for(trace) if trace is not None else None
        if p is None:
            return out
        data, note = read_manifest(p)
        if data is None:
            out["note"] = f"{note}, config inferred from the trace instead"
            return out
        out.update(source="manifest", path=str(p))
    if isinstance(data.get("deepspeed_config"), dict):  # a capture manifest
        out["deepspeed_config"] = data["deepspeed_config"]
        out["versions"] = {k: str(v) for k, v in (data.get("versions") or {}).items()}
        out["gpus"] = [str(g.get("name")) for g in data.get("gpus") or [] if isinstance(g, dict)]
    elif "deepspeed_config" in data and data["deepspeed_config"] is None:
        out["note"] = f"capture manifest {shown(p)}: holds no DeepSpeed config; config inferred from the trace"
    else:
        out["deepspeed_config"] = data
    if out["deepspeed_config"] is not None and ds_config is not None and not _looks_like_ds(out["deepspeed_config"]):
        raise TracekitError(f"--ds-config {shown(p)}: no DeepSpeed key in it (zero_optimization, fp16, bf16, "
                            "train_batch_size, ...); pass the config given to deepspeed.initialize")
    return out


def _looks_like_ds(cfg: dict) -> bool:
    known = {"zero_optimization", "fp16", "bf16", "train_batch_size", "train_micro_batch_size_per_gpu",
             "gradient_accumulation_steps", "optimizer", "scheduler", "gradient_clipping",
             "zero_allow_untested_optimizer"}
    return bool(known & set(cfg))


def _get(cfg: dict, dotted: str):
    cur = cfg
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _version_tuple(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", v)
    return tuple(int(x) for x in m.groups()) if m else None


def config_value(cfg: dict, key: str, ds_version: str | None = None) -> tuple[object, str]:
    """``(value, source)`` of ``key`` in the DeepSpeed config ``cfg``: set (``config``) or
    DeepSpeed's default (``default``; pin_memory's depends on ``ds_version``)."""
    if key == "precision":
        if _get(cfg, "fp16.enabled") is True:
            return "fp16", "config"
        if _get(cfg, "bf16.enabled") is True or _get(cfg, "bfloat16.enabled") is True:
            return "bf16", "config"
        return "fp32", "default"
    v = _get(cfg, key)
    if key.startswith("zero_optimization.stage3_") and v is None:  # also accepted without the prefix
        v = _get(cfg, key.replace("stage3_", ""))
    if v is not None:
        if key == "zero_optimization.zenflow" and isinstance(v, dict):
            v = ", ".join(f"{k}={x if isinstance(x, str) else json.dumps(x)}" for k, x in v.items())  # true, not True
        return v, "config"
    offload_dev = _get(cfg, "zero_optimization.offload_optimizer.device")
    if key == "zero_optimization.offload_optimizer.pin_memory":
        if offload_dev in (None, "none"):
            return None, "default"
        ver = _version_tuple(ds_version)
        if ver is None:
            return None, "unknown"
        return ver >= (0, 19, 6), "default"
    if key == "zero_optimization.overlap_comm":  # DeepSpeed: True for stage 3, else False
        return _get(cfg, "zero_optimization.stage") == 3, "default"
    if key in ("zero_optimization.zenflow", "optimizer.type", "optimizer.params.weight_decay"):
        return None, "default"  # no DeepSpeed default (the optimizer's own applies): not shown
    if key == "gradient_clipping":  # DeepSpeed's default became 1.0 in 0.19.3 (deepspeedai/DeepSpeed#8068)
        ver = _version_tuple(ds_version)
        if ver is None:
            return None, "unknown"
        return (1.0 if ver >= (0, 19, 3) else 0.0), "default"
    if key in DEFAULTS:
        return DEFAULTS[key], "default"
    return None, "unknown"


#: the value :func:`infer_settings` gives ``gradient_clipping`` when the trace shows clipping on but
#: not its threshold
CLIPPING_ON = "> 0"


def infer_settings(facts: dict) -> dict:
    """What the trace says of the config: ``{key: (value, how)}`` from ``facts``
    (:func:`tracekit.analyze.sections.whatif.trace_facts`: range names seen, micro-steps per iteration,
    host kinds of the gradient copies, copy-back bytes and count per update, 16-bit type names
    in the kernels, forward's H2D copies, the CPU optimizer step's time). The rules and what
    each was checked on: docs/advice.md, "The config"."""
    out: dict[str, tuple] = {}
    names = facts.get("range_names", set())
    stage3 = any("DeepSpeedZeroOptimizer_Stage3" in n for n in names) or "param_copy_back" in names
    if stage3:
        out["zero_optimization.stage"] = (
            3, "DeepSpeedZeroOptimizer_Stage3 NVTX ranges (or tracekit's param_copy_back)")
    elif "param_copy_to_device" in names:
        out["zero_optimization.stage"] = ("1 or 2", "tracekit's param_copy_to_device range (ZeRO-1/2 copy of the "
                                                    "updated parameters)")
    super_offload = any(n.startswith("SuperOffloadOptimizer_Stage3.") for n in names)
    zenflow = "selective_optimizer_step" in names or any("ZenFlow" in n for n in names)
    if super_offload:
        out["zero_optimization.offload_optimizer.super_offload"] = (
            True, "SuperOffloadOptimizer_Stage3 NVTX ranges (DeepSpeed's SuperOffload optimizer)")
    elif any(n.endswith("DeepSpeedZeroOptimizer_Stage3.step") for n in names):
        out["zero_optimization.offload_optimizer.super_offload"] = (
            False, "the optimizer step is DeepSpeedZeroOptimizer_Stage3.step, not SuperOffloadOptimizer_Stage3's")
    waits = facts.get("cpu_wait_calls") or 0.0
    if super_offload and waits >= 1.5:
        # superoffload_stage3.py: with clip_grad set, step() takes _step_with_clipping, which waits
        # for each CPU sub-group's step in turn (_wait_for_single_async_result); without it the
        # sub-groups were stepped during backward and step() waits once (_wait_for_async_operations)
        out["gradient_clipping"] = (
            CLIPPING_ON, f"{waits:.0f} cpu_update_wait ranges per update: SuperOffload waits for each CPU sub-group's "
                         "step inside step() only with gradient clipping on (once without it)")
    m = facts.get("micro_steps")
    if zenflow:
        out["zero_optimization.zenflow"] = (
            "on", "ZenFlow's selective_optimizer_step (tracekit) or ZenFlow* NVTX ranges")
        if m:
            out["gradient_accumulation_steps"] = (
                f"{m} / update_interval", f"ZenFlow steps the CPU optimizer every update_interval training steps: "
                                          f"{m} backward micro-steps per optimizer step = gas x update_interval")
    elif m:
        out["gradient_accumulation_steps"] = (m, "backward micro-steps per iteration (median)")
    share = facts.get("update_cpu_share")
    upd = facts.get("update_ns") or 0.0
    cpu_step = facts.get("cpu_step_ns") or 0.0
    if share is not None and facts.get("copy_back_bytes") and share > 0.3:
        out["zero_optimization.offload_optimizer.device"] = (
            "cpu", f"the update copies {facts['copy_back_bytes'] / 1e6:,.0f} MB of parameters to the GPU per "
                   f"iteration, and {100 * share:.0f}% of the update is the optimizer step's ranges with the GPU idle "
                   "(steady iterations; the tables' 'update idle' counts the whole update window)")
    elif share is not None and share > 0.3 and upd and cpu_step >= 0.1 * upd:
        out["zero_optimization.offload_optimizer.device"] = (
            "cpu", f"the update's CPU optimizer step takes {cpu_step / 1e6:,.1f} ms per iteration with the GPU idle "
                   f"({100 * cpu_step / upd:.0f}% of the update; GPU idle {100 * share:.0f}% of the update)")
    elif super_offload or zenflow:
        out["zero_optimization.offload_optimizer.device"] = (
            "cpu", ("SuperOffload" if super_offload else "ZenFlow") + " runs the optimizer on the CPU "
                   "(it needs offload_optimizer.device cpu)")
    if any(n in ("swap_in", "swap_out") for n in names):
        out["zero_optimization.offload_optimizer.device"] = (
            "nvme", "swap_in / swap_out ranges inside the update (optimizer state read from and written to NVMe)")
    if ("zero_optimization.stage" not in out and out.get("zero_optimization.offload_optimizer.device", (None,))[0]
            not in (None, "none") and any(n.startswith("DeepSpeedEngine.") for n in names)):
        out["zero_optimization.stage"] = ("1 or 2", "DeepSpeedEngine ranges without DeepSpeedZeroOptimizer_Stage3 "
                                                    "ones, and the optimizer offloaded (offload needs ZeRO >= 1)")
    fwd = facts.get("forward_h2d_bytes_per_micro_step") or 0.0
    if stage3 and fwd >= 1 << 20:
        nvme = any(n.startswith("param_swap") for n in names)
        kinds = "/".join(facts.get("forward_h2d_kinds") or []) or "host"
        out["zero_optimization.offload_param.device"] = (
            "nvme" if nvme else "cpu",
            f"forward copies {fwd / 1e6:,.0f} MB of {kinds} H2D per micro-step (parameters fetched from host memory"
            + (", swapped in from NVMe" if nvme else "") + ")")
    elif stage3 and m:
        out["zero_optimization.offload_param.device"] = ("none", "no H2D copy in forward (parameters stay on the GPU)")
    kinds = facts.get("grad_copy_kinds") or {}
    if kinds and sum(kinds.values()) > 0:  # zero-byte copies only: no share to tell the kind by
        main = max(kinds, key=kinds.get)
        if main in ("pinned", "pageable"):
            out["zero_optimization.offload_optimizer.pin_memory"] = (
                main == "pinned", f"backward's gradient copies are {100 * kinds[main] / sum(kinds.values()):.0f}% "
                                  f"{main} (by bytes)")
    dt = facts.get("kernel_dtypes") or {}
    half, bf = dt.get("Half", 0), dt.get("BFloat16", 0)
    by_kernels = (f"{half:,} of {dt.get('kernels', 0):,} kernels' names carry Half, {bf:,} BFloat16")
    if facts.get("overflow_check"):
        out["precision"] = ("fp16", "DeepSpeed's has_overflow range (it checks gradients for overflow only in fp16)"
                            + (f"; {by_kernels}" if half or bf else ""))
    elif half > bf:
        out["precision"] = ("fp16", by_kernels)
    elif bf > half:
        out["precision"] = ("bf16", by_kernels)
    elif facts.get("loss_scale_update"):
        out["precision"] = ("bf16 or fp32", "_overflow_check_and_loss_scale_update without has_overflow inside")
    n = facts.get("sub_groups")
    if n and out.get("zero_optimization.stage", (None,))[0] != "1 or 2":  # sub-groups are ZeRO-3's
        p = facts.get("parameters")
        bracket = sub_group_size_bracket(facts.get("sub_group_bytes") or [])
        if n == 1 and p:
            out["zero_optimization.sub_group_size"] = (
                f">= {p / 1e6:,.0f} M (1 sub-group)", "one parameter copy-back per optimizer step")
        elif bracket is not None:
            lo, hi = bracket
            out["zero_optimization.sub_group_size"] = (
                f"{lo / 1e6:,.1f}-{hi / 1e6:,.1f} M ({n} sub-groups)",
                f"{n} parameter copy-backs per optimizer step of {min(facts['sub_group_bytes']) / 2e6:,.1f}-"
                f"{max(facts['sub_group_bytes']) / 2e6:,.1f} M parameters: DeepSpeed closes a sub-group once it "
                "holds >= sub_group_size parameters, so the setting is at most the smallest closed one")
        elif p:
            out["zero_optimization.sub_group_size"] = (
                f"~{p / n / 1e6:,.0f} M ({n} sub-groups)", f"{n} parameter copy-backs per optimizer step")
    return out


def sub_group_size_bracket(sub_group_bytes: list[int], bytes_per_param: int = 2) -> tuple[float, float] | None:
    """``(low, high)`` parameters bounding the ``sub_group_size`` DeepSpeed used, from the
    16-bit bytes each sub-group copies back (one entry per sub-group, in DeepSpeed's order or
    its reverse), or None for fewer than two sub-groups.

    ``stage3.py`` ``_create_fp16_sub_groups`` adds parameters to a sub-group until it holds
    ``>= sub_group_size`` and then closes it; only the last one may close smaller. So every
    sub-group but the last holds at least the setting: ``high`` = the smallest of them (either
    end may be the last: both orders are tried, the larger bound kept). A sub-group is closed by
    the parameter that reached the setting, so the setting is above what the sub-group held
    before that parameter: at least the smallest closed sub-group minus its largest parameter,
    which the trace does not show per parameter; ``low`` = half the smallest closed sub-group,
    the bound when no parameter exceeds half a sub-group (``low`` is a reading aid, ``high``
    the rule)."""
    numel = [b / bytes_per_param for b in sub_group_bytes if b > 0]
    if len(numel) < 2:
        return None
    high = max(min(numel[:-1]), min(numel[1:]))
    return high / 2, high


def settings(loaded: dict, inferred: dict | None = None) -> list[dict]:
    """Rows ``{"key", "value", "source", "how"}`` for :data:`KEYS` (see module doc): from the
    loaded config when there is one (keys it does not set get DeepSpeed's default), else from
    ``inferred`` (:func:`infer_settings`); keys neither knows are left out."""
    cfg = loaded.get("deepspeed_config")
    inferred = inferred or {}
    ds_version = (loaded.get("versions") or {}).get("deepspeed")
    rows = []
    for key in KEYS:
        if cfg is not None:
            value, source = config_value(cfg, key, ds_version)
            how = {"config": f"set in {Path(loaded['path']).name}" if loaded.get("path") else "set in the config",
                   "default": "DeepSpeed default" + (f" ({ds_version})" if ds_version else ""),
                   "unknown": "not set; its default depends on the DeepSpeed version"}[source]
            if value is None and source == "default":
                continue
            rows.append({"key": key, "value": value, "source": source, "how": how})
        elif key in inferred:
            value, how = inferred[key]
            rows.append({"key": key, "value": value, "source": "trace", "how": how})
    return rows


def setting(rows: list[dict], key: str):
    """The value of ``key`` in :func:`settings` rows, or None."""
    for r in rows:
        if r["key"] == key:
            return r["value"]
    return None
