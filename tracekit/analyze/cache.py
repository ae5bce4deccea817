"""A Parquet cache of what tracekit reads from a trace, kept beside the trace.

Reading a large nsys export is dominated by SQLite scans (``GPU_METRICS`` alone can hold tens
of millions of rows). The cache stores, for one trace:

- every frame fetched through :meth:`tracekit.analyze.export.Export.query`, as Parquet,
  keyed on the SQL text, its parameters and the requested schema (``q-<sha1>.parquet``);
- finished analysis results (the JSON-ready dict of :mod:`tracekit.analyze.result`), keyed on
  the analysis options, the trace path as given and a fingerprint of tracekit's own source
  files (``r-<sha1>.json``), so that editing tracekit never serves a stale result;
- the terminal tables printed for such a result, per terminal width and colour system
  (``t-<sha1>-<view>.txt``).

Location: a directory ``<trace>.tracekit-cache/`` beside the trace (for ``run.sqlite``:
``run.sqlite.tracekit-cache/``). When the trace's directory is not writable, or when the
environment variable ``TRACEKIT_CACHE_DIR`` names a root, the directory is
``ROOT/<sha1 of the trace's absolute path>-<trace name>.tracekit-cache/`` instead, with ROOT
defaulting to ``$XDG_CACHE_HOME/tracekit`` (``~/.cache/tracekit``). Nothing is ever written into
the trace itself: the trace is only ``stat``-ed here and opened read-only elsewhere.

Invalidation: ``manifest.json`` records the trace's size, modification time (ns) and inode,
the cache format and tracekit's version. When any of them differs from the trace on disk,
every entry is deleted before use. Entries are written to a temporary file and renamed into
place, so concurrent analyses of one trace never read a partial file; an entry is not written
when the trace changed while it was being read.

A cache that cannot be written (read-only disk, full disk) degrades to no cache: errors while
reading or writing entries are swallowed and counted in :attr:`TraceCache.errors`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import tracekit

#: Bumped when the layout or meaning of cached entries changes.
CACHE_FORMAT = 1
SUFFIX = ".tracekit-cache"
MANIFEST = "manifest.json"
#: Environment variable: a root directory for all caches (instead of beside each trace).
ENV_DIR = "TRACEKIT_CACHE_DIR"

_code_fingerprint: str | None = None


def code_fingerprint() -> str:
    """sha1 (hex, 16 chars) over path, size and mtime of every ``.py`` file of the tracekit
    package and the versions of polars and numpy.

    Part of every result key, so that a cached result is never served after tracekit's code
    changed (editable installs, development checkouts).
    """
    global _code_fingerprint
    if _code_fingerprint is None:
        from importlib.metadata import PackageNotFoundError, version

        root = Path(tracekit.__file__).parent
        h = hashlib.sha1(tracekit.__version__.encode())
        for dist in ("polars", "numpy"):  # results depend on them too
            try:
                h.update(f"{dist}={version(dist)}\n".encode())
            except PackageNotFoundError:
                pass
        for p in sorted(root.rglob("*.py")):
            st = p.stat()
            h.update(f"{p.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        _code_fingerprint = h.hexdigest()[:16]
    return _code_fingerprint


def trace_identity(trace: Path) -> dict:
    """What the cache is keyed on: {"size": bytes, "mtime_ns": int, "inode": int, "format": int,
    "tracekit": version}. Raises OSError when the trace cannot be stat-ed."""
    st = os.stat(trace)
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "inode": st.st_ino,
        "format": CACHE_FORMAT,
        "tracekit": tracekit.__version__,
    }


def _writable_dir(folder: Path) -> bool:
    """Writable for us and meant to be written: ``os.access`` says yes to root for any folder,
    so a folder with no write permission bit at all (e.g. 0555) counts as read-only too."""
    try:
        return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False


def default_cache_dir(trace: str | Path) -> Path:
    """The cache directory for ``trace`` (see the module doc for the rules); not created here."""
    trace = Path(trace).resolve()
    root = os.environ.get(ENV_DIR)
    if not root and _writable_dir(trace.parent):
        return trace.with_name(trace.name + SUFFIX)
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracekit"
    digest = hashlib.sha1(str(trace).encode()).hexdigest()[:16]
    return Path(root) / f"{digest}-{trace.name}{SUFFIX}"


def _digest(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class TraceCache:
    """The cache of one trace (see module doc).

    Args:
        trace: the nsys SQLite export (only stat-ed).
        directory: where entries live; :func:`default_cache_dir` when None.

    Attributes:
        hits, misses, writes, errors: counters of this object's lookups and stores.

    Raises OSError (from the constructor) only when the trace itself cannot be stat-ed; a
    cache directory that cannot be created leaves :attr:`enabled` False.
    """

    def __init__(self, trace: str | Path, directory: str | Path | None = None):
        self.trace = Path(trace)
        self.directory = Path(directory) if directory else default_cache_dir(self.trace)
        self.identity = trace_identity(self.trace)
        self.hits = self.misses = self.writes = self.errors = 0
        self.enabled = True
        # entries are readable only when the manifest matches; the directory is made (or
        # emptied) at the first write, so reading a file that is no trace leaves nothing behind
        self._ready = self._manifest_matches()

    # ------------------------------------------------------------------ validity
    def _manifest_matches(self) -> bool:
        try:
            current = json.loads((self.directory / MANIFEST).read_text()).get("identity")
        except (OSError, ValueError, AttributeError):
            return False
        return current == self.identity

    def _prepare(self) -> bool:
        """Make the directory and its manifest before the first write; False disables the cache."""
        if self._ready:
            return True
        try:
            if self.directory.exists():
                self.clear()
            self.directory.mkdir(parents=True, exist_ok=True)
            self._atomic_write(
                self.directory / MANIFEST,
                json.dumps({"trace": self.trace.name, "identity": self.identity}, indent=1).encode(),
            )
        except OSError:
            self.enabled = False
            self.errors += 1
            return False
        self._ready = True
        return True

    def clear(self) -> None:
        """Delete this cache's entries and manifest (only files the cache wrote)."""
        if not self.directory.is_dir():
            return
        for p in self.directory.iterdir():
            if p.name == MANIFEST or p.suffix in (".parquet", ".json", ".txt") or p.name.startswith(".tmp-"):
                try:
                    p.unlink()
                except OSError:
                    pass

    def still_valid(self) -> bool:
        """True while the trace on disk still has the identity it had when the cache was opened."""
        try:
            return trace_identity(self.trace) == self.identity
        except OSError:
            return False

    def _atomic_write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    # ------------------------------------------------------------------ frames
    @staticmethod
    def query_key(sql: str, params: tuple, schema: dict | None) -> str:
        """Entry key of a query: sha1 of its SQL text, parameters and requested schema."""
        return _digest(" ".join(sql.split()), list(params), {k: str(v) for k, v in (schema or {}).items()})

    def has_frame(self, key: str) -> bool:
        """True when an entry for ``key`` exists (it may still fail to read)."""
        return self.enabled and self._ready and (self.directory / f"q-{key}.parquet").exists()

    def get_frame(self, key: str):
        """The cached polars frame of ``key``, or None on a miss (or an unreadable entry)."""
        if not self.enabled or not self._ready:
            self.misses += 1
            return None
        path = self.directory / f"q-{key}.parquet"
        if not path.exists():
            self.misses += 1
            return None
        import polars as pl

        try:
            frame = pl.read_parquet(path)
        except Exception:
            self.errors += 1
            self.misses += 1
            return None
        self.hits += 1
        return frame

    def put_frame(self, key: str, frame) -> None:
        """Store a polars frame under ``key`` (skipped when the trace changed meanwhile)."""
        if not self.enabled or not self.still_valid() or not self._prepare():
            return
        path = self.directory / f"q-{key}.parquet"
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=self.directory)
        os.close(fd)
        try:
            frame.write_parquet(tmp, compression="zstd", compression_level=1, statistics=False)
            os.replace(tmp, path)
            self.writes += 1
        except Exception:
            self.errors += 1
            if os.path.exists(tmp):
                os.unlink(tmp)

    # ------------------------------------------------------------------ results
    @staticmethod
    def result_key(options: dict, trace: str = "") -> str:
        """Entry key of an analysis result: sha1 of the options, the trace path as given (the
        result names it) and :func:`code_fingerprint`."""
        return _digest(options, trace, code_fingerprint())

    def get_result_text(self, key: str) -> str | None:
        """A cached analysis result as its JSON text (the layout of :func:`format_json`), or None."""
        if not self.enabled or not self._ready:
            self.misses += 1
            return None
        try:
            with open(self.directory / f"r-{key}.json", encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError:
            self.errors += 1
            self.misses += 1
            return None
        self.hits += 1
        return text

    def get_result(self, key: str) -> dict | None:
        """A cached analysis result (a JSON-ready dict), or None."""
        text = self.get_result_text(key)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            self.errors += 1
            return None

    def put_result(self, key: str, result: dict) -> None:
        """Store an analysis result under ``key`` (skipped when the trace changed meanwhile, or
        when a dict key is not a string: JSON would give it back as one)."""
        if not self.enabled or not self.still_valid() or not self._prepare():
            return
        try:
            text = format_json(result, strict=True)  # TypeError for keys JSON would turn into strings
            self._atomic_write(self.directory / f"r-{key}.json", text.encode("utf-8"))
            self.writes += 1
        except (OSError, TypeError, ValueError):
            self.errors += 1

    def get_text(self, key: str) -> str | None:
        """A cached text (e.g. the terminal tables of a result), or None."""
        if not self.enabled or not self._ready:  # no manifest for this trace: nothing is valid
            self.misses += 1
            return None
        try:
            with open(self.directory / f"t-{key}.txt", encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError):
            self.errors += 1
            return None
        self.hits += 1
        return text

    def put_text(self, key: str, text: str) -> None:
        """Store ``text`` under ``key`` (skipped when the trace changed meanwhile)."""
        if not self.enabled or not self.still_valid() or not self._prepare():
            return
        try:
            self._atomic_write(self.directory / f"t-{key}.txt", text.encode("utf-8"))
            self.writes += 1
        except OSError:
            self.errors += 1


def format_json(obj, indent: int = 1, strict: bool = False) -> str:
    """``obj`` as JSON text: objects and lists that hold containers are indented (``indent``
    spaces a level), everything else, such as each row of a table, stays on one line; ends
    with a newline. Parses to the same value as ``json.dumps(obj, indent=indent)``, many times
    faster on large results (rows go through the C encoder; the indenting encoder is Python).

    ``strict``: raise TypeError for a dict key that is not a string (JSON would turn it into
    one, so the text would not read back as ``obj``), as the result cache needs.
    """
    from json.encoder import c_make_encoder, encode_basestring_ascii

    if c_make_encoder is not None:  # the C encoder, built once (JSONEncoder.encode builds one per call)

        def _default(o):
            raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")

        _c = c_make_encoder(None, _default, encode_basestring_ascii, None, ": ", ", ", False, False, True)

        def dumps(o) -> str:
            return "".join(_c(o, 0))
    else:  # pragma: no cover - Pythons without the C accelerator
        dumps = json.JSONEncoder(ensure_ascii=True, separators=(", ", ": ")).encode
    parts: list[str] = []

    def nested(o) -> bool:
        if isinstance(o, dict):
            return any(isinstance(v, (dict, list, tuple)) for v in o.values())
        if isinstance(o, (list, tuple)):
            return any(isinstance(v, (dict, list, tuple)) for v in o)
        return False

    def enc(o, level: int) -> None:
        if strict and isinstance(o, dict) and not all(type(k) is str for k in o):
            raise TypeError(f"non-string keys in {list(o)[:5]}")
        if not nested(o):
            if strict and isinstance(o, (list, tuple)):
                for v in o:  # a flat list may hold flat dicts (table rows)
                    if isinstance(v, dict) and not all(type(k) is str for k in v):
                        raise TypeError(f"non-string keys in {list(v)[:5]}")
            parts.append(dumps(o))
            return
        pad = "\n" + " " * (indent * (level + 1))
        if isinstance(o, dict):
            parts.append("{")
            for i, (k, v) in enumerate(o.items()):
                parts.append(("," if i else "") + pad + dumps(str(k)) + ": ")
                enc(v, level + 1)
            parts.append("\n" + " " * (indent * level) + "}")
        else:
            parts.append("[")
            for i, v in enumerate(o):
                parts.append(("," if i else "") + pad)
                enc(v, level + 1)
            parts.append("\n" + " " * (indent * level) + "]")

    enc(obj, 0)
    parts.append("\n")
    return "".join(parts)


def remove_cache(trace: str | Path) -> bool:
    """Delete the cache directory of ``trace``; True when there was one."""
    d = default_cache_dir(trace)
    if d.is_dir():
        shutil.rmtree(d, ignore_errors=True)
        return True
    return False
