"""tracekit's ``sitecustomize``: loads the NVTX phase hook into Python processes.

``tracekit capture`` prepends this folder to ``PYTHONPATH`` and sets ``TRACEKIT_HOOK=1``, so
every Python process that the training command starts (the ``deepspeed`` launcher, its
workers, ``torchrun``'s workers) runs this file at start-up. It installs an import hook that
wraps DeepSpeed's classes once DeepSpeed is imported (see ``_tracekit_hook``), then runs the
``sitecustomize`` that this one shadows, if any, so site configuration keeps working.
Nothing here may stop the training: every failure becomes one warning line on stderr.
"""

import os as _os
import sys as _sys

_HERE = _os.path.dirname(_os.path.abspath(__file__))

if _os.environ.get("TRACEKIT_HOOK") == "1":
    try:
        if _HERE not in _sys.path:
            _sys.path.append(_HERE)
        import _tracekit_hook

        _tracekit_hook.install()
    except Exception as _exc:  # never break the user's program
        _sys.stderr.write(f"tracekit-hook: warning: hook not installed: {_exc!r}\n")


def _run_shadowed_sitecustomize() -> None:
    """Execute the next ``sitecustomize`` on ``sys.path`` (the one this file hides)."""
    import importlib.machinery
    import importlib.util

    paths = [p for p in _sys.path if _os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _sys.modules["_tracekit_shadowed_sitecustomize"] = module


try:
    _run_shadowed_sitecustomize()
except Exception as _exc:
    _sys.stderr.write(f"tracekit-hook: warning: the shadowed sitecustomize failed: {_exc!r}\n")
