"""The test suite's ``sitecustomize`` for DeepSpeed's training processes (tests only).

DeepSpeed asks py-cpuinfo about the CPU up to three times per process (the op builders'
``-march`` and SIMD flags, CPU Adam's vendor check), and each ``cpuinfo.get_cpu_info()`` starts
a Python process that times the clock for a second: ~3.5 s per training process on the 2-core
machine. With ``TRACEKIT_TEST_CPUINFO=FILE`` (conftest sets it once per test session),
``get_cpu_info`` returns the real answer of the first call of the session, kept in FILE (JSON,
what py-cpuinfo itself returns); the first caller computes and writes it. The answer is this
machine's, so DeepSpeed picks the same flags and loads the same prebuilt ops.

DeepSpeed decorates three Muon functions with ``torch.compile`` when its ZeRO optimizer check
imports them (``deepspeed.runtime.zero.muon``), and ``torch.compile`` imports the whole of
TorchInductor to read its config before it returns: ~1.9 s per training process, for functions
no test calls. Here ``torch.compile`` of a plain function (not a module) is deferred to that
function's first call, when the real ``torch.compile`` runs with the same arguments: what is
compiled, and when it is first run, do not change.

The DeepSpeed tests put this folder after tracekit's hook folder on ``PYTHONPATH``; the hook's
``sitecustomize`` runs this one (the one it shadows), and this one runs the next, if any."""

import os as _os
import sys as _sys

_HERE = _os.path.dirname(_os.path.abspath(__file__))
_CACHE = _os.environ.get("TRACEKIT_TEST_CPUINFO")


def _memoized(real):
    def get_cpu_info():
        import json

        try:
            with open(_CACHE, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            pass
        info = real()
        if info:  # py-cpuinfo answers {} when its child failed: not kept
            part = f"{_CACHE}.{_os.getpid()}.part"
            with open(part, "w", encoding="utf-8") as f:
                json.dump(info, f)
            _os.replace(part, _CACHE)
        return info

    get_cpu_info.__wrapped__ = real
    return get_cpu_info


class _PatchCpuinfo:
    """A meta-path finder that, once the ``cpuinfo`` package is imported, replaces its
    ``get_cpu_info`` (and ``cpuinfo.cpuinfo``'s) by the memoized one."""

    def find_spec(self, name, path=None, target=None):
        if name != "cpuinfo":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            inner = _sys.modules.get("cpuinfo.cpuinfo")
            if inner is not None and hasattr(inner, "get_cpu_info"):
                inner.get_cpu_info = module.get_cpu_info = _memoized(inner.get_cpu_info)

        loader.exec_module = exec_module
        return spec


def _lazy_compile(real):
    import functools

    def compile(model=None, **kwargs):
        if model is None:  # used as ``@torch.compile(...)``
            return lambda fn: compile(fn, **kwargs)
        if not callable(model) or isinstance(model, type) or hasattr(model, "forward"):
            return real(model, **kwargs)  # modules and classes: torch's own wrapper at once
        compiled = []

        @functools.wraps(model)
        def run(*args, **kw):
            if not compiled:
                compiled.append(real(model, **kwargs))
            return compiled[0](*args, **kw)

        return run

    compile.__wrapped__ = real
    return compile


class _PatchTorchCompile:
    """A meta-path finder that, once ``torch`` is imported, replaces ``torch.compile`` by
    :func:`_lazy_compile`'s (for plain functions only)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.machinery

        _sys.meta_path.remove(self)  # once: torch's own submodule imports pass straight through
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            if callable(getattr(module, "compile", None)):
                module.compile = _lazy_compile(module.compile)

        loader.exec_module = exec_module
        return spec


def _run_shadowed_sitecustomize() -> None:
    """Execute the next ``sitecustomize`` on ``sys.path`` after this folder (the one this file
    hides; not one before it, such as the hook's, which ran this one)."""
    import importlib.machinery
    import importlib.util

    here = [i for i, p in enumerate(_sys.path) if _os.path.abspath(p or ".") == _HERE]
    paths = _sys.path[here[-1] + 1:] if here else []
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if _CACHE:
    _sys.meta_path.insert(0, _PatchCpuinfo())
_sys.meta_path.insert(0, _PatchTorchCompile())
_run_shadowed_sitecustomize()
