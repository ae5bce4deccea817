"""The store under :class:`tracekit.analyze.trace.cache.TraceCache`: one trace's cache folder (where
it is, what it trusts) and its entries, each written whole and checked on read (:class:`EntryStore`).

Location: a directory ``<trace>.tracekit-cache/`` beside the trace (for ``run.sqlite``:
``run.sqlite.tracekit-cache/``). When the trace's directory is not writable, or when the
environment variable ``TRACEKIT_CACHE_DIR`` names a root, the directory is
``ROOT/<sha1 of the trace's absolute path>-<trace name>.tracekit-cache/`` instead, with ROOT
defaulting to ``$XDG_CACHE_HOME/tracekit`` (``~/.cache/tracekit``). A name that would be longer
than a file name may be is cut and tagged with a hash of the whole (:func:`cache_dir_name`).
Nothing is ever written into the trace itself: the trace is only ``stat``-ed here and opened
read-only elsewhere.

What the cache trusts, and what it checks (issue 9; docs/performance.md says it for users):

- A cache folder is used only when it is a real directory (not a symbolic link), owned by the
  current user and not writable by group or others, and either holds tracekit's
  ``manifest.json`` (or entries written by tracekit) or is empty. Otherwise it is left
  untouched, a note on stderr says why, and the cache goes to ``ROOT`` above instead (when
  the rejected folder was the one beside the trace) or is off.
- Each entry is one file: ``TKC2 <header JSON>\\n`` then the payload; the header names the
  entry's file, the payload's length and SHA-256, and a digest of the trace identity it was
  computed from. An entry is served only when it is a regular file (opened with
  ``O_NOFOLLOW | O_NONBLOCK``: no FIFO, device or symbolic link is ever read through), owned by
  the current user, and its name, length, checksum and identity all match; stored JSON must be
  printable ASCII, stored terminal text may hold no control characters but newlines, tabs and
  SGR colour sequences. Anything else is a miss: recomputed from the trace and replaced.
  A Parquet payload that polars still cannot read (including a Rust panic, which derives from
  ``BaseException``) is a miss too, and the panic's text is kept off the terminal
  (:mod:`tracekit.analyze.trace.quiet`).
- The folder found (or made) when the cache is opened is the only one written to: every later
  access checks that the path still leads to that folder (device and inode), so a folder of
  the user's moved in where the cache was, while tracekit ran, never receives entries (the
  cache is then off for the rest of the run, with a note).
- Invalidation: ``manifest.json`` records the trace identity (:func:`trace_identity`: size,
  mtime, ctime, inode, the same of the trace's ``-wal`` file, the cache format and tracekit's
  version). When it differs from the trace on disk, the entries tracekit wrote (files named
  like entries that carry the ``TKC2`` header, or are empty) and stale temporaries of its own
  naming are deleted, nothing else.
- Writes (:mod:`tracekit.analyze.trace.temporaries`): ``.tmp-tk-<pid>-<random>-<host>`` created
  exclusively, written, fsynced, then renamed into place, so concurrent analyses of one trace
  never read a partial file and a crash leaves no half-written entry under an entry's name; an
  entry is not written when the trace changed while it was being read. Temporaries left by a
  killed writer (its pid gone on this host, or untouched for an hour) are removed when the cache
  is next opened.
- Not defended against: someone who can write files as the current user can forge entries
  with valid checksums (they could equally replace the trace or tracekit itself).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

import tracekit
from tracekit.analyze.trace.temporaries import (
    _owned,
    remove_stale_temporaries,
    write_replacing,
)

#: Bumped when the layout or meaning of cached entries changes (1: bare files, no checksums).
CACHE_FORMAT = 2
SUFFIX = ".tracekit-cache"
MANIFEST = "manifest.json"
#: Environment variable: a root directory for all caches (instead of beside each trace).
ENV_DIR = "TRACEKIT_CACHE_DIR"
#: First bytes of every entry (and the key in the manifest that says tracekit wrote it).
MAGIC = b"TKC2 "
_MANIFEST_TAG = "tracekit-cache"

_ENTRY = re.compile(r"(?:q-[0-9a-f]{40}\.parquet|r-[0-9a-f]{40}\.json|t-[0-9a-f]{40}-[0-9a-f]{16}\.txt"
                    r"|o-[0-9a-f]{40}\.files)\Z")
_O_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_O_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_MAX_MANIFEST = 1 << 16

_noted: set = set()


def _file_identity(st: os.stat_result) -> dict:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}


def trace_identity(trace: Path) -> dict:
    """What the cache is keyed on: {"size": bytes, "mtime_ns": int, "ctime_ns": int, "inode":
    int, "wal": the same four of ``TRACE-wal`` or None when there is none, "format": int,
    "tracekit": version}.

    ctime catches a trace rewritten in place with its size and mtime put back (``touch -r``),
    which only the kernel's ctime records; the ``-wal`` file holds committed changes of a
    WAL-mode database that are not yet in the main file. The device number is left out: it
    differs between the nodes of a cluster that mount one shared file system.
    Raises OSError when the trace cannot be stat-ed (a -wal that cannot be stat-ed counts as
    none)."""
    trace = Path(trace)
    st = os.stat(trace)
    try:
        wal = _file_identity(os.stat(trace.with_name(trace.name + "-wal")))
    except OSError:
        wal = None
    return {**_file_identity(st), "wal": wal, "format": CACHE_FORMAT, "tracekit": tracekit.__version__}


def _writable_dir(folder: Path) -> bool:
    """Writable for us and meant to be written: ``os.access`` says yes to root for any folder,
    so a folder with no write permission bit at all (e.g. 0555) counts as read-only too."""
    try:
        return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False


def _root_dir() -> Path:
    root = os.environ.get(ENV_DIR)
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracekit"
    return Path(root)


#: the longest file name (bytes) most file systems take (ext4, xfs, btrfs, tmpfs: NAME_MAX)
_NAME_MAX = 255


def cache_dir_name(name: str, prefix: str = "") -> str:
    """``PREFIX NAME.tracekit-cache``, the folder name of a trace named ``name``; when that is
    longer than :data:`_NAME_MAX` bytes (UTF-8), the name is cut and ``-`` plus 16 hex digits
    of its sha1 follow the cut, so that it fits and two long names sharing a start still differ
    (a 245-character trace name disabled the cache, with two notes on every run)."""
    whole = f"{prefix}{name}{SUFFIX}"
    if len(whole.encode("utf-8", "surrogateescape")) <= _NAME_MAX:
        return whole
    tag = "-" + hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    room = _NAME_MAX - len(f"{prefix}{tag}{SUFFIX}".encode("utf-8", "surrogateescape"))
    cut = name.encode("utf-8", "surrogateescape")[:max(room, 0)].decode("utf-8", "ignore")
    return f"{prefix}{cut}{tag}{SUFFIX}"


def _root_cache_dir(trace: Path) -> Path:
    digest = hashlib.sha1(str(trace).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return _root_dir() / cache_dir_name(trace.name, f"{digest}-")


def default_cache_dir(trace: str | Path) -> Path:
    """The cache directory for ``trace`` (see the module doc for the rules); not created here.
    :class:`TraceCache` moves to the ``ROOT`` form when this one is not a cache folder it can
    trust (:attr:`TraceCache.directory` says where it went)."""
    trace = Path(trace).resolve()
    if not os.environ.get(ENV_DIR) and _writable_dir(trace.parent):
        return trace.with_name(cache_dir_name(trace.name))
    return _root_cache_dir(trace)


def _identity_digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def _printable(s: str) -> str:
    """``s`` with control characters escaped (for a note naming a path: never a terminal escape)."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in s)


def _note(key: tuple, text: str) -> None:
    """One line on stderr, once per process and ``key``."""
    if key in _noted:
        return
    _noted.add(key)
    print(f"tracekit: note: {_printable(text)}", file=sys.stderr)


def _read_regular(name: str, dfd: int, limit: int | None = None) -> bytes | None:
    """The bytes of ``name`` in the directory ``dfd`` when it is a regular file owned by us
    (never a FIFO, device or symbolic link: checked before and after opening), else None.
    Raises FileNotFoundError when there is no such file, OSError when it cannot be read."""
    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode) or not _owned(st) or (limit is not None and st.st_size > limit):
        return None
    fd = os.open(name, _O_READ, dir_fd=dfd)
    try:
        st2 = os.fstat(fd)
        if not stat.S_ISREG(st2.st_mode) or (st2.st_ino, st2.st_dev) != (st.st_ino, st.st_dev):
            return None
        chunks, left = [], st2.st_size + 1  # one byte more: a file that grew is read whole
        while True:
            b = os.read(fd, max(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def _is_legacy(manifest: dict | None) -> bool:
    """True for the manifest of a format-1 cache (no tag; its identity says format 1)."""
    return (isinstance(manifest, dict) and _MANIFEST_TAG not in manifest and isinstance(manifest.get("trace"), str)
            and isinstance(manifest.get("identity"), dict) and manifest["identity"].get("format") == 1)


class _Rejected(Exception):
    """A cache folder tracekit will not use; the message says why."""


class EntryStore:
    """One trace's cache folder and its entries (see the module doc for what it trusts and checks);
    what the entries hold (frames, results, texts, files) is :class:`~tracekit.analyze.trace.cache.TraceCache`'s,
    whose documentation gives the arguments and attributes."""

    def __init__(self, trace: str | Path, directory: str | Path | None = None):
        self.trace = Path(trace)
        self.identity = trace_identity(self.trace)
        self._id_digest = _identity_digest(self.identity)
        self.hits = self.misses = self.writes = self.errors = 0
        self.enabled = True
        self._legacy = False
        self._dir_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder in use
        if directory is not None:
            candidates = [Path(directory)]
        else:
            first = default_cache_dir(self.trace)
            candidates = [first]
            fallback = _root_cache_dir(self.trace.resolve())
            if fallback != first:
                candidates.append(fallback)
        self._ready = False
        for i, d in enumerate(candidates):
            self.directory, self._dir_id = d, None
            try:
                state = self._inspect(d)
            except _Rejected as e:
                then = f"; caching in {candidates[i + 1]} instead" if i + 1 < len(candidates) else "; not caching"
                _note(("cache", str(d), str(e)), f"cache folder {d} {e}: left untouched{then} "
                      f"(set {ENV_DIR} to choose where caches go)")
                continue
            # entries are readable only when the manifest matches; the directory is made (or
            # emptied) at the first write, so reading a file that is no trace leaves nothing behind
            self._ready = state == "match"
            self._legacy = state == "legacy"
            if state != "missing":
                self._remove_stale_temporaries()
            return
        self.enabled = False

    # ------------------------------------------------------------------ the folder
    @contextmanager
    def _dir(self, check_mode: bool = True):
        """A file descriptor of :attr:`directory`, opened without following a symbolic link and
        checked (a directory owned by us, with ``check_mode`` not writable by group or others,
        and the same folder as at the first call: see the module doc); raises _Rejected."""
        try:
            dfd = os.open(self.directory, _O_DIR)
        except OSError as e:
            if os.path.islink(self.directory):
                raise _Rejected("is a symbolic link") from e
            raise
        try:
            st = os.fstat(dfd)
            if not stat.S_ISDIR(st.st_mode):
                raise _Rejected("is not a folder")
            if not _owned(st):
                raise _Rejected("belongs to another user")
            if check_mode and st.st_mode & 0o022:
                raise _Rejected("is writable by other users")
            if self._dir_id is None:
                self._dir_id = (st.st_dev, st.st_ino)
            elif self._dir_id != (st.st_dev, st.st_ino):
                self.enabled = self._ready = False
                _note(("cache replaced", str(self.directory)), f"cache folder {self.directory} was replaced by "
                      "another folder while tracekit ran: not caching in it")
                raise _Rejected("was replaced by another folder")
            yield dfd
        finally:
            os.close(dfd)

    def _inspect(self, d: Path) -> str:
        """"missing", "match" (our manifest, same identity), "stale" (ours, other identity or a
        damaged manifest), "legacy" (a format-1 cache of this trace) or "empty"; raises
        _Rejected with the reason for a folder that is not ours to use."""
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            return "missing"
        except OSError as e:
            raise _Rejected(f"cannot be read ({e.strerror})") from e
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(d)
            except OSError:
                target = "?"
            raise _Rejected(f"is a symbolic link (to {target})")
        if not stat.S_ISDIR(st.st_mode):
            raise _Rejected("is not a folder")
        try:
            with self._dir(check_mode=False) as dfd:
                manifest = self._read_manifest(dfd)
                if _is_legacy(manifest):
                    # a format-1 cache: never read, cleared at the first write; it may be
                    # group-writable (format 1 made its folder by the umask)
                    return "legacy"
                if os.fstat(dfd).st_mode & 0o022:
                    raise _Rejected("is writable by other users")
                if manifest is not None and manifest.get(_MANIFEST_TAG) == CACHE_FORMAT:
                    return "match" if manifest.get("identity") == self.identity else "stale"
                names = os.listdir(dfd)
                if not names:
                    return "empty"
                if any(_ENTRY.match(n) and self._ours(n, dfd) for n in names):
                    return "stale"  # entries of ours, manifest damaged or missing
        except OSError as e:
            raise _Rejected(f"cannot be read ({e.strerror})") from e
        raise _Rejected("is not a cache folder tracekit made (no tracekit manifest.json)")

    @staticmethod
    def _read_manifest(dfd: int) -> dict | None:
        try:
            data = _read_regular(MANIFEST, dfd, _MAX_MANIFEST)
            m = json.loads(data) if data is not None else None
        except (OSError, ValueError):
            return None
        return m if isinstance(m, dict) else None

    @staticmethod
    def _ours(name: str, dfd: int) -> bool:
        """True for a regular file of ours named like an entry that starts with :data:`MAGIC`
        or is empty (what a crash before fsync leaves)."""
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or not _owned(st):
                return False
            if st.st_size == 0:
                return True
            fd = os.open(name, _O_READ, dir_fd=dfd)
            try:
                return os.read(fd, len(MAGIC)) == MAGIC
            finally:
                os.close(fd)
        except OSError:
            return False

    def _remove_stale_temporaries(self, dfd: int | None = None) -> None:
        """Delete temporaries of our naming whose writer is gone (its pid, on this host) or that
        nobody touched for :data:`STALE_TMP_S`; in a format-1 cache also its mkstemp names
        (:func:`remove_stale_temporaries`)."""
        if dfd is None:
            try:
                with self._dir() as dfd:
                    self._remove_stale_temporaries(dfd)
            except (OSError, _Rejected):
                pass
            return
        remove_stale_temporaries(dfd, legacy=self._legacy)

    def _prepare(self) -> bool:
        """Make the directory and its manifest before the first write (deleting the entries of
        an older identity); False disables the cache."""
        if self._ready:
            return True
        try:
            try:
                os.mkdir(self.directory, 0o755)  # umask may only take bits away: never g+w, o+w
            except FileNotFoundError:
                os.makedirs(self.directory.parent, mode=0o700, exist_ok=True)
                os.mkdir(self.directory, 0o755)
            except FileExistsError:
                pass
            state = self._inspect(self.directory)  # again: it may have been made meanwhile
            if state == "match":
                self._ready = True
                return True
            self._legacy = state == "legacy"
            with self._dir(check_mode=not self._legacy) as dfd:
                if state in ("stale", "legacy"):
                    self._clear(dfd)
                if self._legacy:  # as tracekit makes its folders now: not writable by others
                    os.fchmod(dfd, stat.S_IMODE(os.fstat(dfd).st_mode) & ~0o022)
                manifest = {_MANIFEST_TAG: CACHE_FORMAT, "trace": self.trace.name, "identity": self.identity}
                self._write_file(MANIFEST, json.dumps(manifest, indent=1).encode(), dfd)
        except (OSError, _Rejected):
            self.enabled = False
            self.errors += 1
            return False
        self._legacy = False
        self._ready = True
        return True

    def clear(self) -> None:
        """Delete this cache's entries, stale temporaries and manifest: only files tracekit wrote
        (see the module doc), in a folder that is its own; a user's files stay, and so does
        the folder when they do. Never raises."""
        try:
            with self._dir(check_mode=False) as dfd:
                m = self._read_manifest(dfd)
                self._legacy = _is_legacy(m)
                if not self._legacy and os.fstat(dfd).st_mode & 0o022:
                    return
                if m is None or not (self._legacy or m.get(_MANIFEST_TAG) == CACHE_FORMAT):
                    if not any(_ENTRY.match(n) and self._ours(n, dfd) for n in os.listdir(dfd)):
                        return  # not a cache folder of ours
                self._clear(dfd)
                if m is not None:
                    os.unlink(MANIFEST, dir_fd=dfd)
        except (OSError, _Rejected):
            pass
        self._ready = False

    def _clear(self, dfd: int) -> None:
        for name in os.listdir(dfd):
            if not _ENTRY.match(name):
                continue
            if self._legacy:  # format 1 wrote bare files: its names (40 hex digits) are the mark
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    ok = stat.S_ISREG(st.st_mode) and _owned(st)
                except OSError:
                    ok = False
            else:
                ok = self._ours(name, dfd)
            if ok:
                try:
                    os.unlink(name, dir_fd=dfd)
                except OSError:
                    pass
        self._remove_stale_temporaries(dfd)

    def still_valid(self) -> bool:
        """True while the trace on disk still has the identity it had when the cache was opened."""
        try:
            return trace_identity(self.trace) == self.identity
        except OSError:
            return False

    # ------------------------------------------------------------------ entries
    def _write_file(self, name: str, data: bytes, dfd: int) -> None:
        """Write ``data`` as ``name`` in ``dfd``: exclusive temporary, fsync, rename."""
        write_replacing(name, data, dir_fd=dfd, mode=0o600, fsync=True)

    def _write_entry(self, name: str, payload: bytes, extra: dict | None = None) -> None:
        """Store ``payload`` as entry ``name`` with its header (:data:`MAGIC`, see module doc;
        ``extra`` adds keys to it). Raises OSError / _Rejected."""
        header = {"name": name, "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
                  "identity": self._id_digest, **(extra or {})}
        with self._dir() as dfd:
            self._write_file(name, MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload, dfd)

    def _read_entry(self, name: str, header: dict | None = None) -> memoryview | None:
        """The payload of entry ``name`` when every check passes (module doc); None on a miss
        (counted: :attr:`misses`, and :attr:`errors` for an entry that is there but fails).
        ``header``, when given, receives the entry's header keys."""
        if not self.enabled or not self._ready:
            self.misses += 1
            return None
        try:
            with self._dir() as dfd:
                data = _read_regular(name, dfd)
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, _Rejected):
            data = None
        payload = self._check(name, data, header) if data is not None else None
        if payload is None:
            self.errors += 1
            self.misses += 1
        return payload

    def _check(self, name: str, data: bytes, out: dict | None = None) -> memoryview | None:
        if not data.startswith(MAGIC):
            return None
        end = data.find(b"\n", 0, 1024)
        if end < 0:
            return None
        try:
            header = json.loads(data[len(MAGIC):end])
        except ValueError:
            return None
        payload = memoryview(data)[end + 1:]  # no copy: stored results reach 20 MB and more
        if (not isinstance(header, dict) or header.get("name") != name or header.get("size") != len(payload)
                or header.get("identity") != self._id_digest
                or header.get("sha256") != hashlib.sha256(payload).hexdigest()):
            return None
        if out is not None:
            out.update(header)
        return payload
