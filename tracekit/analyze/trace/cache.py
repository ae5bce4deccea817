"""A Parquet cache of what tracekit reads from a trace, kept beside the trace.

Reading a large nsys export is dominated by SQLite scans (``GPU_METRICS`` alone can hold tens
of millions of rows). The cache stores, for one trace:

- every frame fetched through :meth:`tracekit.analyze.trace.export.Export.query`, as Parquet,
  keyed on the SQL text, its parameters and the requested schema (``q-<sha1>.parquet``);
- finished analysis results (the JSON-ready dict of :mod:`tracekit.analyze.result`), keyed on
  the analysis options, the trace path as given and a fingerprint of tracekit's own source
  files (``r-<sha1>.json``), so that editing tracekit never serves a stale result;
- the terminal tables printed for such a result, per terminal width and colour system
  (``t-<sha1>-<view>.txt``);
- the files of a finished ``tracekit report`` (figures, data, report.md/.html), keyed on the
  report's options, the trace path as given and the code fingerprint (``o-<sha1>.files``), so
  that an identical second report writes them without drawing anything.

Where the folder is, what it trusts and checks, and how an entry is written and read:
:mod:`tracekit.analyze.trace.cache_store` (:class:`~tracekit.analyze.trace.cache_store.EntryStore`,
which :class:`TraceCache` extends with the kinds of entries).

A cache that cannot be written (read-only disk, full disk) degrades to no cache: errors while
reading or writing entries are swallowed and counted in :attr:`TraceCache.errors`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

import tracekit

# Of the json_format, temporaries and cache_store names below, those not used here are
# re-exported: they lived here before the JSON text, the writer of temporaries and the store got
# modules of their own; render/, analyze/multi.py and tests import them from here.
from tracekit.analyze.trace.cache_store import (  # noqa: F401
    _ENTRY,
    CACHE_FORMAT,
    ENV_DIR,
    MAGIC,
    MANIFEST,
    SUFFIX,
    EntryStore,
    _Rejected,
    cache_dir_name,
    default_cache_dir,
    trace_identity,
)
from tracekit.analyze.trace.json_format import (  # noqa: F401
    dumps_strict,
    format_json,
    json_safe,
    write_json_to,
)
from tracekit.analyze.trace.quiet import _panic_exception
from tracekit.analyze.trace.temporaries import (  # noqa: F401
    _HOST,
    STALE_TMP_S,
    _owned,
    remove_stale_temporaries,
    stale_temporary,
    temporary_name,
    write_replacing,
    write_temporary,
)

#: a member name of an ``o-`` entry: a relative path of at most two plain components (no dot
#: first, so never ``..`` or a hidden file), what ``tracekit report`` writes (``data/x.csv``)
_MEMBER = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}/)?[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
#: no control character at all (the strings of an ``o-`` entry's metadata, printed as notes)
_CONTROL = re.compile("[\\x00-\\x1f\\x7f-\\x9f]")
#: bytes a stored JSON text may hold (format_json writes ASCII only, control characters escaped)
_JSON_BYTES = bytes([10] + list(range(32, 127)))
#: stored terminal text: no control characters but \n, \t and SGR sequences (ESC [ ... m)
_BAD_TEXT = re.compile("[\x00-\x08\x0b-\x1a\x1c-\x1f\x7f-\x9f]|\x1b(?!\\[[0-9;]*m)")

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


def _digest(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class TraceCache(EntryStore):
    """The cache of one trace (see module doc for what it trusts and checks).

    Args:
        trace: the nsys SQLite export (only stat-ed).
        directory: where entries live; :func:`default_cache_dir` when None (then a folder
            beside the trace that cannot be trusted gives way to the ``ROOT`` location).

    Attributes:
        directory: the folder in use (or the last one tried, when :attr:`enabled` is False).
        identity: :func:`trace_identity` of the trace when the cache was opened.
        hits, misses, writes, errors: counters of this object's lookups and stores (a damaged
            entry counts as an error and a miss).
        enabled: False when no usable folder was found or a write failed.

    Raises OSError (from the constructor) only when the trace itself cannot be stat-ed; a
    cache directory that cannot be created or trusted leaves :attr:`enabled` False.
    """

    # ------------------------------------------------------------------ frames
    @staticmethod
    def query_key(sql: str, params: tuple, schema: dict | None) -> str:
        """Entry key of a query: sha1 of its SQL text, parameters and requested schema."""
        return _digest(" ".join(sql.split()), list(params), {k: str(v) for k, v in (schema or {}).items()})

    def has_frame(self, key: str) -> bool:
        """True when a regular file exists as the entry of ``key`` (it may still fail its checks)."""
        if not (self.enabled and self._ready):
            return False
        try:
            with self._dir() as dfd:
                return stat.S_ISREG(os.stat(f"q-{key}.parquet", dir_fd=dfd, follow_symlinks=False).st_mode)
        except (OSError, _Rejected):
            return False

    def get_frame(self, key: str):
        """The cached polars frame of ``key``, or None on a miss (or an entry that fails a check
        or that polars cannot read, a Rust panic included)."""
        header: dict = {}
        payload = self._read_entry(f"q-{key}.parquet", header)
        if payload is None:
            return None
        from tracekit.analyze.trace.quiet import read_parquet

        frame = read_parquet(payload)  # a panic's text is hidden too (d02)
        if frame is not None and header.get("frame_hash") != _frame_hash(frame):
            # Parquet has no checksum of its values: a damaged page may decode to other values
            # (a kernel name with one letter changed) under a header re-signed for the damage
            frame = None
        if frame is None:
            self.errors += 1
            self.misses += 1
            return None
        self.hits += 1
        return frame

    def put_frame(self, key: str, frame) -> None:
        """Store a polars frame under ``key`` (skipped when the trace changed meanwhile)."""
        if not self.enabled or not self.still_valid() or not self._prepare():
            return
        import io

        try:
            buf = io.BytesIO()
            frame.write_parquet(buf, compression="zstd", compression_level=1, statistics=False)
            self._write_entry(f"q-{key}.parquet", buf.getvalue(), {"frame_hash": _frame_hash(frame)})
            self.writes += 1
        except (Exception, _panic_exception()):
            self.errors += 1

    # ------------------------------------------------------------------ results
    @staticmethod
    def result_key(options: dict, trace: str = "") -> str:
        """Entry key of an analysis result: sha1 of the options, the trace path as given (the
        result names it) and :func:`code_fingerprint`."""
        return _digest(options, trace, code_fingerprint())

    @staticmethod
    def output_key(options: dict, trace: str = "") -> str:
        """Entry key of a stored output (a report's files, a comparison): sha1 of the options and
        the trace path as given, without :func:`code_fingerprint`, so that a new version of
        tracekit replaces the entry instead of adding one beside it; the caller stores the
        fingerprint in the entry and treats another one as a miss."""
        return _digest(options, trace)

    def get_result_text(self, key: str) -> str | None:
        """A cached analysis result as its JSON text (the layout of :func:`format_json`), or None.
        The text passed the entry's checks and holds printable ASCII and newlines only."""
        payload = self._read_entry(f"r-{key}.json")
        if payload is None:
            return None
        data = payload.obj  # the whole entry; its header is printable ASCII too
        if data.translate(None, _JSON_BYTES) or payload[:1] != b"{" or payload[-2:] != b"}\n":
            self.errors += 1
            self.misses += 1
            return None
        self.hits += 1
        return str(payload, "ascii")

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
            self._write_entry(f"r-{key}.json", text.encode("ascii"))
            self.writes += 1
        except (OSError, TypeError, ValueError, _Rejected):
            self.errors += 1

    def get_text(self, key: str) -> str | None:
        """A cached text (e.g. the terminal tables of a result), or None. The text passed the
        entry's checks, is UTF-8 and holds no control characters but newlines, tabs and SGR
        colour sequences (``ESC [ digits;... m``)."""
        payload = self._read_entry(f"t-{key}.txt")
        if payload is None:
            return None
        try:
            text = str(payload, "utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or _BAD_TEXT.search(text):
            self.errors += 1
            self.misses += 1
            return None
        self.hits += 1
        return text

    def put_text(self, key: str, text: str) -> None:
        """Store ``text`` under ``key`` (skipped when the trace changed meanwhile)."""
        if not self.enabled or not self.still_valid() or not self._prepare():
            return
        try:
            self._write_entry(f"t-{key}.txt", text.encode("utf-8"))
            self.writes += 1
        except (OSError, UnicodeError, _Rejected):
            self.errors += 1

    # ------------------------------------------------------------------ output files
    def get_files(self, key: str) -> tuple[dict, list[tuple[str, memoryview]]] | None:
        """A cached set of output files (:meth:`put_files`) as ``(meta, [(name, bytes), ...])``,
        or None. Besides the entry's checks, every name is a plain relative path
        (:data:`_MEMBER`: at most ``dir/file``, no component starting with a dot), names are
        distinct, the sizes add up to the payload, and no string of ``meta`` holds a control
        character (notes are printed from it)."""
        payload = self._read_entry(f"o-{key}.files")
        if payload is None:
            return None
        data, off = payload.obj, len(payload.obj) - len(payload)  # the payload is data[off:]
        nl = data.find(b"\n", off)  # the index line: {"files": [[name, size], ...], "meta": {...}}
        out = None
        try:
            index = json.loads(data[off:nl].decode("ascii")) if nl >= 0 else None
            meta, members = index["meta"], index["files"]
            if isinstance(meta, dict) and isinstance(members, list) and not _has_control(meta):
                pos, files, seen = nl - off + 1, [], set()
                for name, size in members:
                    if (not isinstance(name, str) or not _MEMBER.match(name) or name in seen
                            or type(size) is not int or size < 0):
                        raise ValueError(name)
                    seen.add(name)
                    files.append((name, payload[pos:pos + size]))
                    pos += size
                if pos == len(payload):
                    out = (meta, files)
        except (ValueError, TypeError, KeyError, UnicodeDecodeError):
            out = None
        if out is None:
            self.errors += 1
            self.misses += 1
            return None
        self.hits += 1
        return out

    def put_files(self, key: str, meta: dict, files: list[tuple[str, bytes]]) -> None:
        """Store output files (``[(relative name, bytes)]``, names as :meth:`get_files` accepts
        them) and a JSON-ready ``meta`` dict as one entry under ``key`` (skipped when the
        trace changed meanwhile, or a name or ``meta`` would not read back)."""
        if not self.enabled or not self.still_valid() or not self._prepare():
            return
        try:
            if _has_control(meta) or len({n for n, _ in files}) != len(files) or not all(
                    _MEMBER.match(n) for n, _ in files):
                raise ValueError("names or notes that would not read back")
            index = json.dumps({"meta": meta, "files": [[n, len(b)] for n, b in files]}, ensure_ascii=True,
                               sort_keys=True).encode("ascii")
            self._write_entry(f"o-{key}.files", b"".join([index, b"\n", *(b for _, b in files)]))
            self.writes += 1
        except (OSError, TypeError, ValueError, _Rejected):
            self.errors += 1


def open_trace_cache(path: str | Path, enabled: bool = True) -> TraceCache | None:
    """The :class:`TraceCache` of the trace at ``path`` when ``enabled`` (``Options.cache``),
    the path is a regular file and the cache is usable; else None. Raises nothing: a cache that
    cannot be opened (OSError) is no cache."""
    if not (enabled and Path(path).is_file()):
        return None
    try:
        tc = TraceCache(Path(path))
    except OSError:
        return None
    return tc if tc.enabled else None


def _has_control(obj) -> bool:
    """True when a string anywhere in ``obj`` (keys included) holds a control character."""
    if isinstance(obj, str):
        return bool(_CONTROL.search(obj))
    if isinstance(obj, dict):
        return any(_has_control(k) or _has_control(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return any(_has_control(v) for v in obj)
    return False


def _frame_hash(frame) -> str | None:
    """A digest of a frame's decoded values (polars' row hash, summed, with the height and the
    schema), stored beside a query entry and checked on read: it catches damage that the
    payload's sha256 cannot (a header re-signed after the damage) and that still decodes.
    None when polars cannot hash the frame (the check is then equality of None)."""
    try:
        rows = int(frame.hash_rows(seed=7).sum()) if frame.height and frame.width else 0
    except Exception:
        return None
    return f"{rows:x}:{frame.height}:{hashlib.sha1(str(frame.schema).encode()).hexdigest()[:12]}"


def remove_cache(trace: str | Path) -> bool:
    """Delete the cache of ``trace``: the entries, temporaries and manifest tracekit wrote
    (:meth:`TraceCache.clear`), then the folder when that leaves it empty. A folder that is a
    symbolic link, belongs to someone else or is no cache of tracekit's is left untouched.
    True when there was a cache of ours. Raises OSError when the trace cannot be stat-ed."""
    tc = TraceCache(trace)
    if not tc.enabled:
        return False
    try:
        with tc._dir() as dfd:
            m = tc._read_manifest(dfd)
            if m is None and not any(_ENTRY.match(n) and tc._ours(n, dfd) for n in os.listdir(dfd)):
                return False
    except (OSError, _Rejected):
        return False
    tc.clear()
    try:
        os.rmdir(tc.directory)
    except OSError:
        pass  # files of the user's stay, and their folder with them
    return True
