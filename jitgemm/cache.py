"""The on-disk cubin cache: keys, trusted loads, atomic publishing, inspection and cleanup.

Key: sha256 over the rendered source, the compile options, the target arch, the NVRTC version
and CACHE_SCHEMA. Entry: a directory named by the full hex key holding `kernel.cu`,
`kernel.cubin` and `meta.json` (never a pickle). An entry is compiled into a private temporary
directory, fsynced and renamed into place; a file lock per key deduplicates concurrent compiles
across threads and processes, and a lost race is a success. The lock holder records its pid in
the lock file, so a waiter stops waiting for a holder that is stopped (Ctrl-Z, a debugger) or
gone and compiles without the lock: a duplicate compile publishes the same entry.

Trust: the root, each entry and each file must be owned by the user, not be a symlink and not be
writable by group or others (checked with lstat/fstat, never following links); otherwise the
kernel is compiled in memory with a warning. Items owned by root (SHARED_OWNER_UID) pass too,
for reading only: a cache built as root (say, in a container image) is shared read-only with
every user. Such a root is never written (no lock, no entry, no last-use time, no prune or
clear); a kernel it lacks is compiled in memory, with one warning. A cubin whose size or sha256 does not match its
meta file is a miss: it is rebuilt and reported once. A root that cannot be written (read-only,
full disk, a file in its place) means in-memory compilation with one warning, never a crash.
Only regular files are opened (a FIFO in place of a cache file could block forever): anything
else is a corrupt entry. prune/clear rename an entry aside before deleting it, so a reader never
sees half of one, and treat items that vanish or appear meanwhile as another process's work.

Beside the entries the root holds jitgemm.tuned's tuning file (TUNING_NAMES) and
jitgemm.dispatch's tables (DISPATCH_DIR), read under the same trust rules; clear removes the
tables (precompile writes them again) and keeps the tuning file unless asked; prune keeps both.

The index (INDEX_DIR) lets a process find a cached kernel without rendering its source: one
small JSON file per (config, compile options, arch, fingerprint of jitgemm's code and
templates), named by index_name, mapping NVRTC versions to cache keys. It is a hint, read under
the same trust rules and published atomically: an entry it names is used only when that entry
is intact (read_entry) and its meta file records the same config, kernel name, arch, options,
NVRTC version and schema; anything else (missing, corrupt, untrusted, stale) means rendering and
looking up the key as usual, which writes the index again. clear removes it; prune keeps it.

The NVRTC version is part of every key, and loading the NVRTC library to ask it costs more than
the rest of finding a cached kernel. So NVRTC_FILE remembers the version of each NVRTC library
file a process loaded, by the file's identity (path, real path, size, mtime, the
cuda.pathfinder that found it and what its search read; kernels.lookup_nvrtc_version): a hint
read and published under
the same rules as the index, used only while the file is unchanged. clear removes it; prune
keeps it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import stat
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import NamedTuple

from .config import parse_json

CACHE_SCHEMA = 1
SOURCE_FILE, CUBIN_FILE, META_FILE = "kernel.cu", "kernel.cubin", "meta.json"
LOCK_DIR, FAILED_DIR = ".locks", "failed"  # per-key lock files; sources that failed to compile
TMP_PREFIX, TRASH_PREFIX = ".tmp-", ".trash-"  # entries being written; corrupt entries being removed
LOCK_TIMEOUT_S = 120.0  # a compile takes seconds; then compile without the lock
LOCK_POLL_S = 0.05  # how often a waiter retries the lock and checks its holder
HOLDER_GRACE_S = 1.0  # a holder seen stopped or gone this long is not waited for
STALE_TMP_S = 3600.0  # prune/clear remove temporary directories older than this
KEY_RE = re.compile(r"[0-9a-f]{64}")
TUNING_NAMES = ("tuned.json", "tuned.json.lock")  # jitgemm.tuned's file: not a kernel entry, kept by clear
DISPATCH_DIR = "dispatch"  # jitgemm.dispatch's tables, one file per target: removed by clear, kept by prune
INDEX_DIR = "index"  # config -> cache key, so a cached kernel is found without rendering: removed by clear
INDEX_SCHEMA = 1
NVRTC_FILE = "nvrtc.json"  # NVRTC library file -> its version (kernels.lookup_nvrtc_version): removed by clear
NVRTC_SCHEMA = 1
NVRTC_LIBRARIES = 16  # libraries it remembers (one per environment sharing the root), the latest kept
NVRTC_VERSION_RE = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}")
ENV_ROOT, ENV_OFFLINE = "JITGEMM_CACHE_DIR", "JITGEMM_OFFLINE"
SHARED_OWNER_UID = 0  # root: what it owns may be read by anyone (never written by others)


class CacheWarning(UserWarning):
    """The disk cache could not be used as is; the kernel was compiled in memory or rebuilt."""


class OfflineError(RuntimeError):
    """JITGEMM_OFFLINE=1 is set and the kernel a call needs is not (validly) in the disk cache."""


class UnsafeError(Exception):
    """A cache path that is not trusted: not owned by the user, a symlink, or writable by others."""


class CorruptEntry(Exception):
    """A cache entry that is incomplete or does not match its recorded hashes."""


def default_root() -> Path:
    """`JITGEMM_CACHE_DIR` (made absolute, symlinks kept) or the platform's user cache dir."""
    env = os.environ.get(ENV_ROOT, "")
    if env:
        return Path(os.path.abspath(os.path.expanduser(env)))
    # platformdirs (~6-20 ms to import) only when no JITGEMM_CACHE_DIR names the root.
    import platformdirs

    return Path(platformdirs.user_cache_dir("jitgemm"))


def offline_mode() -> bool:
    value = os.environ.get(ENV_OFFLINE, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{ENV_OFFLINE} must be 0 or 1, got {os.environ[ENV_OFFLINE]!r}")


def cache_key(source: str, options: tuple, arch: str, nvrtc_version: str, schema: int | None = None) -> str:
    """The entry name: sha256 over length-prefixed parts, so no two inputs share a byte stream."""
    parts = (
        f"schema={CACHE_SCHEMA if schema is None else schema}",
        f"arch={arch}",
        f"nvrtc={nvrtc_version}",
        "options=" + "\x1f".join(options),
        source,
    )
    return hash_parts(parts)


def hash_parts(parts) -> str:
    """sha256 over the parts (str or bytes), each length-prefixed (no two part lists hash alike):
    cache keys, index names and the code fingerprints of the index and the dispatch tables."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def index_name(config_json: str, arch: str, options: tuple, code_fingerprint: str) -> str:
    """The index file's name (without .json) for a config: sha256 over length-prefixed parts."""
    parts = (
        f"schema={CACHE_SCHEMA}",
        f"index={INDEX_SCHEMA}",
        f"arch={arch}",
        "options=" + "\x1f".join(options),
        f"code={code_fingerprint}",
        config_json,
    )
    return hash_parts(parts)


# ---- trust checks (lstat/fstat only: a symlink is judged, never followed) ----


def _check_trusted(st: os.stat_result, path: Path, what: str, write: bool = False) -> None:
    """UnsafeError unless `path` (lstat/fstat `st`) is no symlink, not writable by group or
    others, and owned by the user, or, to be read only (`write` False), by root."""
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeError(f"{what} {path} is a symlink")
    uid = os.geteuid()
    if st.st_uid != uid:
        if st.st_uid == SHARED_OWNER_UID and write:
            raise UnsafeError(
                f"{what} {path} is owned by root: a shared cache is only read by other users (write it as root)"
            )
        if st.st_uid != SHARED_OWNER_UID:
            raise UnsafeError(f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {uid}) or root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeError(f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")


def check_root(root: Path, write: bool = False) -> None:
    """Raise UnsafeError for an untrusted root (to write: one not the user's), FileNotFoundError
    or NotADirectoryError if unusable."""
    st = os.lstat(root)
    _check_trusted(st, root, "cache root", write)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "cache root is not a directory", str(root))


def is_shared(root: Path) -> bool:
    """Whether `root` is a trusted cache of root's that this (other) user only reads."""
    try:
        owner = os.lstat(root).st_uid
    except OSError:
        return False
    return owner == SHARED_OWNER_UID != os.geteuid()


def _open_regular(path: Path, flags: int, what: str) -> int:
    """`path` opened with `flags` once lstat shows a trusted regular file (or, with O_CREAT,
    nothing): a FIFO or device is never opened, as that can block forever. The fd is checked to
    be the file lstat saw. FileNotFoundError when missing, UnsafeError when untrusted,
    CorruptEntry when not a regular file."""
    writing = bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
        before = None
    if before is not None:
        _check_trusted(before, path, "cache file", writing)
        if not stat.S_ISREG(before.st_mode):
            raise CorruptEntry(f"{what} is not a regular file")
    try:  # O_NONBLOCK: should a FIFO be swapped in after the lstat, opening it does not block
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeError(f"{path} is a symlink") from None
        raise
    try:
        st = os.fstat(fd)  # of the file actually opened: no window between check and use
        _check_trusted(st, path, "cache file", writing)
        if not stat.S_ISREG(st.st_mode) or (before is not None and not os.path.samestat(before, st)):
            raise CorruptEntry(f"{what} was replaced while being opened")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_trusted(path: Path, what: str) -> bytes:
    try:
        fd = _open_regular(path, os.O_RDONLY, what)
    except FileNotFoundError:
        raise CorruptEntry(f"{what} is missing") from None
    except OSError as exc:
        raise CorruptEntry(f"{what} cannot be opened ({exc.strerror})") from None
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    except OSError as exc:
        raise CorruptEntry(f"{what} cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)


def read_entry(entry: Path, key: str, check_source: bool = False) -> tuple[dict, bytes]:
    """(meta, cubin) of a trusted, intact entry.

    FileNotFoundError when there is no entry; UnsafeError or CorruptEntry saying why otherwise.
    `check_source` also re-derives the key from the stored source and meta (what `verify` does).
    """
    st = os.lstat(entry)
    _check_trusted(st, entry, "cache entry")
    if not stat.S_ISDIR(st.st_mode):
        raise CorruptEntry("the entry is not a directory")
    try:
        meta = parse_json(read_trusted(entry / META_FILE, META_FILE), META_FILE)
    except ValueError:
        raise CorruptEntry(f"{META_FILE} is not valid JSON") from None
    if not isinstance(meta, dict) or meta.get("key") != key:
        raise CorruptEntry(f"{META_FILE} belongs to another key")
    cubin = read_trusted(entry / CUBIN_FILE, CUBIN_FILE)
    if len(cubin) != meta.get("cubin_bytes"):
        raise CorruptEntry(f"{CUBIN_FILE} has {len(cubin)} bytes, {META_FILE} says {meta.get('cubin_bytes')}")
    if hashlib.sha256(cubin).hexdigest() != meta.get("cubin_sha256"):
        raise CorruptEntry(f"{CUBIN_FILE} does not match the sha256 in {META_FILE}")
    if check_source:
        source = read_trusted(entry / SOURCE_FILE, SOURCE_FILE)
        try:
            derived = cache_key(
                source.decode(), tuple(meta["options"]), meta["arch"], meta["nvrtc_version"], meta["schema"]
            )
        except (KeyError, TypeError, UnicodeDecodeError) as exc:
            raise CorruptEntry(f"{META_FILE} or {SOURCE_FILE} is malformed ({exc!r})") from None
        if derived != key:
            raise CorruptEntry(f"{SOURCE_FILE} and {META_FILE} do not hash to the entry's key")
    return meta, cubin


# ---- writing ----


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def publish_file(path: Path, data: bytes, tmp_dir: Path, suffix: str) -> None:
    """`data` as `path`, atomically: a private temporary file in `tmp_dir` (on path's file
    system; prune removes one a crash leaves), fsynced, renamed into place."""
    fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=TMP_PREFIX, suffix=suffix)  # 0600, never a planted link
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _remove_tree(name: str | Path, dir_fd: int | None = None) -> None:
    """Delete `name` (relative to `dir_fd`) and everything below it. Only directories are
    opened (O_DIRECTORY | O_NOFOLLOW: never a link's target, never a FIFO); anything else is
    unlinked. What vanishes meanwhile was removed by another process, and a directory that
    gains an item meanwhile is left: both are skipped, not errors."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        return
    try:
        with os.scandir(fd) as items:
            names = [item.name for item in items]
        for child in names:
            _remove_tree(child, fd)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY:
            raise


if not {os.open, os.unlink, os.rmdir} <= os.supports_dir_fd:  # _remove_tree stays inside the root with them
    raise ImportError("jitgemm.cache needs a platform with dir_fd support (os.open, os.unlink, os.rmdir)")


# ---- the compile lock ----

_HAVE_PROC = os.path.exists("/proc/self/stat")  # Linux: holders can be checked on


def _proc_state(pid: int) -> tuple[str, str] | None:
    """(state letter, start time) of process `pid`, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0].decode(), fields[19].decode()


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


def _holder_record() -> bytes:
    """What a lock holder writes into the lock file: pid, start time (pids are reused) and pid
    namespace (another container's pids mean nothing here)."""
    pid = os.getpid()
    found = _proc_state(pid) if _HAVE_PROC else None
    return f"{pid} {found[1] if found else '?'} {_pid_namespace()}".encode()


def _stalled(record: bytes) -> str | None:
    """ "stopped" or "gone" when the holder that wrote `record` cannot be compiling; None when
    it is running or cannot be judged (no /proc, another pid namespace, no record yet)."""
    try:
        pid_text, start, namespace = record.decode().split()
        pid = int(pid_text)
    except ValueError:  # UnicodeDecodeError is one too
        return None
    if not _HAVE_PROC or pid <= 0 or namespace != _pid_namespace():
        return None
    found = _proc_state(pid)
    if found is None or (start != "?" and found[1] != start):
        return "gone"  # the lock is still held: a child that inherited the descriptor
    return "stopped" if found[0] in ("T", "t") else None  # t: stopped by a debugger


class CompileLock:
    """An exclusive flock on `path`, whose holder records who it is (_holder_record) so that a
    waiter can tell a holder that is compiling from one that is stopped or gone."""

    def __init__(self, path: Path, what: str):
        self.path, self.what = path, what
        self._fd = None

    def acquire(self, timeout: float) -> str | None:
        """None once the lock is held. Otherwise why it was not waited for (the holder has been
        stopped or gone for HOLDER_GRACE_S, or `timeout` passed, or the lock file is not a
        regular file): the caller goes on without it. OSError when it cannot be created."""
        start = time.monotonic()
        fd = None
        suspect, since = None, start
        try:
            while True:
                if fd is None:
                    try:
                        fd = self._open()
                    except (UnsafeError, CorruptEntry) as exc:
                        return f"{self.what} cannot be used ({exc})"
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass
                else:
                    if self._still_linked(fd):
                        os.ftruncate(fd, 0)
                        os.pwrite(fd, _holder_record(), 0)
                        self._fd, fd = fd, None
                        return None
                    os.close(fd)  # removed by a cleanup while we waited: take the new file
                    fd = None
                    continue
                now = time.monotonic()
                record = os.pread(fd, 256, 0)
                seen = (record, _stalled(record))
                if seen != suspect:
                    suspect, since = seen, now
                pid = record.split(b" ", 1)[0].decode(errors="replace")
                holder = f"another process (pid {pid})" if pid else "another process"
                if seen[1] == "stopped" and now - since >= HOLDER_GRACE_S:
                    return f"{holder} holding {self.what} is stopped"
                if seen[1] == "gone" and now - since >= HOLDER_GRACE_S:
                    return f"{holder} that took {self.what} has exited, yet the lock is still held"
                if now - start >= timeout:
                    return f"{holder} has held {self.what} for over {timeout:.0f} s"
                time.sleep(LOCK_POLL_S)
        finally:
            if fd is not None:
                os.close(fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing drops the flock

    def _open(self) -> int:
        try:
            return _open_regular(self.path, os.O_RDWR | os.O_CREAT, "the lock file")
        except FileNotFoundError:  # its directory was removed by clear: make it again
            make_private_dir(self.path.parent, "lock directory")
            return _open_regular(self.path, os.O_RDWR | os.O_CREAT, "the lock file")

    def _still_linked(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.lstat(self.path))
        except FileNotFoundError:
            return False


def make_private_dir(path: Path, what: str) -> None:
    """`path` as a directory only the user can write: made so, or checked to be trusted."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        _check_trusted(st, path, what, write=True)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, f"{what} is not a directory", str(path)) from None


def _remove_unheld_lock(path: Path) -> bool:
    """Unlink the lock file `path` unless a process holds it (a compile in progress). A waiter
    that then gets the unlinked file notices and takes the new one (CompileLock._still_linked).
    Something other than a regular file cannot be held: it is unlinked. False if left."""
    try:
        fd = _open_regular(path, os.O_RDWR, "the lock file")
    except FileNotFoundError:
        return True
    except (UnsafeError, CorruptEntry):
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return True
    finally:
        if fd is not None:
            os.close(fd)


_warned: set = set()
_warned_lock = threading.Lock()


def _warn_once(token: tuple, message: str) -> None:
    with _warned_lock:
        if token in _warned:
            return
        _warned.add(token)
    warnings.warn(message, CacheWarning, stacklevel=4)


class CacheResult(NamedTuple):
    cubin: bytes
    key: str
    hit: bool  # found on disk (no compile happened in this call)
    compile_seconds: float
    path: Path | None  # the entry directory, or None when compiled in memory


class Lookup(NamedTuple):
    status: str  # "hit", "miss", "corrupt" or "unsafe"
    cubin: bytes | None = None
    reason: str = ""
    root_unsafe: bool = False


class EntryInfo(NamedTuple):
    key: str
    path: Path
    meta: dict | None  # None when meta.json cannot be read
    size_bytes: int  # bytes of the files in the entry, as stored
    last_used: float  # the entry directory's mtime, refreshed on every load
    problem: str | None  # why the entry cannot be read, without re-hashing (see verify)

    @property
    def kernel(self) -> str:
        return (self.meta or {}).get("kernel", "?")

    @property
    def nvrtc_version(self) -> str | None:
        """The NVRTC that built the entry (from its meta file), None when unknown."""
        value = (self.meta or {}).get("nvrtc_version")
        return value if isinstance(value, str) else None

    def unusable_reason(self, nvrtc_version: str | None) -> str | None:
        """Why a process whose NVRTC is `nvrtc_version` cannot load this entry (its key covers
        the NVRTC version and the cache schema), or None when it can. An entry whose meta file
        cannot be read is unusable; with `nvrtc_version` None (NVRTC unavailable) only the
        entry itself is judged."""
        if self.problem:
            return self.problem
        meta = self.meta or {}
        if meta.get("schema") != CACHE_SCHEMA:
            return f"written by another jitgemm (cache schema {meta.get('schema')}; this one uses {CACHE_SCHEMA})"
        if nvrtc_version is not None and self.nvrtc_version != nvrtc_version:
            return f"built by NVRTC {self.nvrtc_version}; this process has NVRTC {nvrtc_version}"
        return None


class KernelCache:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(os.path.abspath(root)) if root is not None else default_root()

    def entry_dir(self, key: str) -> Path:
        return self.root / key

    # ---- read ----
    def lookup(self, key: str, touch: bool = True) -> Lookup:
        """What the disk holds for `key`; never raises for a bad root or entry. A hit refreshes
        the entry's last-use time (for prune) unless `touch` is False."""
        try:
            check_root(self.root)
        except UnsafeError as exc:
            return Lookup("unsafe", reason=str(exc), root_unsafe=True)
        except OSError:
            return Lookup("miss")
        try:
            _, cubin = read_entry(self.entry_dir(key), key)
        except FileNotFoundError:
            return Lookup("miss")
        except UnsafeError as exc:
            return Lookup("unsafe", reason=str(exc))
        except CorruptEntry as exc:
            return Lookup("corrupt", reason=str(exc))
        if touch and not is_shared(self.root):  # a shared cache is never written
            try:
                os.utime(self.entry_dir(key))  # last use, for prune; a read-only root is fine
            except OSError:
                pass
        return Lookup("hit", cubin)

    def find_indexed(self, name: str, nvrtc_version: str, meta: dict) -> CacheResult | None:
        """The entry the index `name` (index_name) records for `nvrtc_version`, or None (then
        render and look up the key as usual). Never raises for a bad root, index or entry.

        The entry is used only when it is trusted and intact (read_entry) and its meta file
        holds every item of `meta` (config, kernel, arch, options) plus this NVRTC version and
        cache schema: a stale or tampered index can cost a render, never give a wrong kernel.
        """
        if not KEY_RE.fullmatch(name):
            return None
        try:
            check_root(self.root)
            index_dir = self.root / INDEX_DIR
            st = os.lstat(index_dir)
            _check_trusted(st, index_dir, "index directory")
            if not stat.S_ISDIR(st.st_mode):
                return None
            record = parse_json(read_trusted(index_dir / f"{name}.json", "index file"), "index file")
            key = record["keys"][nvrtc_version]
            if not isinstance(key, str) or not KEY_RE.fullmatch(key):
                return None
            found, cubin = read_entry(self.entry_dir(key), key)
        except (OSError, UnsafeError, CorruptEntry, ValueError, KeyError, TypeError):
            return None
        expected = dict(meta, nvrtc_version=nvrtc_version, schema=CACHE_SCHEMA)
        if any(found.get(field) != value for field, value in expected.items()):
            return None
        if not is_shared(self.root):  # last use, for prune, as lookup does
            try:
                os.utime(self.entry_dir(key))
            except OSError:
                pass
        return CacheResult(cubin, key, True, 0.0, self.entry_dir(key))

    def write_index(self, name: str, nvrtc_version: str, key: str) -> None:
        """Record `key` as the entry of index `name` for `nvrtc_version` (keeping the keys of
        other NVRTC versions): best effort, published atomically; a shared or unwritable root,
        or any error, leaves the index as it was."""
        if not KEY_RE.fullmatch(name) or not KEY_RE.fullmatch(key) or is_shared(self.root):
            return
        index_dir = self.root / INDEX_DIR
        try:
            check_root(self.root, write=True)
            make_private_dir(index_dir, "index directory")
            path = index_dir / f"{name}.json"
            try:
                keys = parse_json(read_trusted(path, "index file"), "index file")["keys"]
                keys = {v: k for v, k in keys.items() if isinstance(v, str) and isinstance(k, str)}
            except (CorruptEntry, UnsafeError, ValueError, KeyError, TypeError, AttributeError):
                keys = {}
            if keys.get(nvrtc_version) == key:
                return
            keys[nvrtc_version] = key
            data = json.dumps({"schema": INDEX_SCHEMA, "keys": keys}, indent=1, sort_keys=True).encode()
            publish_file(path, data, index_dir, ".json")
        except (OSError, UnsafeError, CorruptEntry):
            pass

    def find_nvrtc_version(self, library: str, identity: dict) -> str | None:
        """The NVRTC version remembered (NVRTC_FILE) for the library file `library` when the
        file still has `identity` (kernels.lookup_nvrtc_version), else None. Read under the
        trust rules; never raises for a bad root or file."""
        try:
            check_root(self.root)
            record = parse_json(read_trusted(self.root / NVRTC_FILE, NVRTC_FILE), NVRTC_FILE)
            found = record["libraries"][library]
            version = found["version"]
            if record["schema"] != NVRTC_SCHEMA or found["identity"] != identity or not isinstance(version, str):
                return None
        except (OSError, UnsafeError, CorruptEntry, ValueError, KeyError, TypeError):
            return None
        return version if NVRTC_VERSION_RE.fullmatch(version) else None

    def nvrtc_memo(self) -> list:
        """(library, identity, version) of each library file NVRTC_FILE remembers, read under
        the trust rules; empty for a missing, bad or untrusted file or root."""
        try:
            check_root(self.root)
            record = parse_json(read_trusted(self.root / NVRTC_FILE, NVRTC_FILE), NVRTC_FILE)
            if record["schema"] != NVRTC_SCHEMA:
                return []
            return [
                (library, found["identity"], found["version"])
                for library, found in record["libraries"].items()
                if isinstance(found.get("identity"), dict)
                and isinstance(found.get("version"), str)
                and NVRTC_VERSION_RE.fullmatch(found["version"])
            ]
        except (OSError, UnsafeError, CorruptEntry, ValueError, KeyError, TypeError, AttributeError):
            return []

    def remember_nvrtc_version(self, library: str, identity: dict, version: str) -> bool:
        """Record `version` as that of the library file `library` with `identity` (keeping the
        other libraries, at most NVRTC_LIBRARIES), published atomically: whether the file holds
        it now. Best effort: a shared, missing or unwritable root, or any error, leaves the
        file as it was."""
        if not NVRTC_VERSION_RE.fullmatch(version) or is_shared(self.root):
            return False
        if self.find_nvrtc_version(library, identity) == version:
            return True
        path = self.root / NVRTC_FILE
        try:
            check_root(self.root, write=True)
            try:
                libraries = parse_json(read_trusted(path, NVRTC_FILE), NVRTC_FILE)["libraries"]
                libraries = {k: v for k, v in libraries.items() if isinstance(k, str) and k != library}
            except (CorruptEntry, UnsafeError, ValueError, KeyError, TypeError, AttributeError):
                libraries = {}
            libraries[library] = {"identity": identity, "version": version}  # the latest last
            kept = dict(list(libraries.items())[-NVRTC_LIBRARIES:])
            data = json.dumps({"schema": NVRTC_SCHEMA, "libraries": kept}, indent=1).encode()
            publish_file(path, data, self.root, ".json")
        except (OSError, UnsafeError, CorruptEntry):
            return False
        return True

    def get_or_compile(
        self, source: str, arch: str, options: tuple, nvrtc_version: str, meta: dict, compile_fn, offline_hint: str = ""
    ) -> CacheResult:
        """The cubin of `source`: from disk, or compiled with `compile_fn(source_path)` and published.

        `compile_fn` takes the path where a source that fails to compile is kept (None when
        compiling in memory) and returns an object with `.cubin` and `.seconds`. With
        JITGEMM_OFFLINE=1 a miss raises OfflineError, whose message ends with `offline_hint`.
        """
        key = cache_key(source, options, arch, nvrtc_version)
        found = self.lookup(key)
        if found.status == "hit":
            return CacheResult(found.cubin, key, True, 0.0, self.entry_dir(key))
        if offline_mode():
            others = (
                self.other_builds(source, arch, options, nvrtc_version, meta.get("config"))
                if found.status == "miss"
                else ""
            )
            raise OfflineError(self._offline_message(key, found, offline_hint, others))
        if found.status == "unsafe":
            return self._in_memory(key, compile_fn, found)
        if is_shared(self.root):
            return self._in_memory(key, compile_fn, None, shared=True)
        try:
            self.ensure_root()
            make_private_dir(self.root / LOCK_DIR, "lock directory")
            lock = CompileLock(self.root / LOCK_DIR / f"{key}.lock", f"the compile lock for {key}")
            not_held = lock.acquire(LOCK_TIMEOUT_S)
        except UnsafeError as exc:
            return self._in_memory(key, compile_fn, Lookup("unsafe", reason=str(exc), root_unsafe=True))
        except OSError as exc:
            return self._in_memory(key, compile_fn, None, exc)
        if not_held:  # a duplicate compile is safe: publishing is atomic and a lost race a success
            _warn_once((str(self.root), key, "lock"), f"jitgemm: {not_held}; compiling without it")
        try:
            found = self.lookup(key)  # another thread or process may have published it meanwhile
            if found.status == "hit":
                return CacheResult(found.cubin, key, True, 0.0, self.entry_dir(key))
            if found.status == "unsafe":
                return self._in_memory(key, compile_fn, found)
            if found.status == "corrupt":
                _warn_once(
                    (str(self.root), key, "corrupt"),
                    f"jitgemm cache entry {self.entry_dir(key)} is corrupt ({found.reason}); rebuilding it",
                )
            return self._compile_and_publish(
                key, source, arch, options, nvrtc_version, meta, compile_fn, replace=found.status == "corrupt"
            )
        finally:
            lock.release()

    def ensure_root(self) -> None:
        """The root made or checked for writing: the user's own (UnsafeError otherwise)."""
        try:
            check_root(self.root, write=True)
        except FileNotFoundError:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.root, 0o700)
            except FileExistsError:
                pass
            check_root(self.root, write=True)  # whoever created it, it must be trusted now

    def _in_memory(
        self, key: str, compile_fn, unsafe: Lookup | None, error: OSError | None = None, shared: bool = False
    ) -> CacheResult:
        if shared:
            _warn_once(
                (str(self.root), "shared"),
                f"jitgemm cache at {self.root} is a shared cache owned by root, read-only for you: kernels it "
                f"lacks are compiled in memory (point {ENV_ROOT} at a directory of your own to keep them)",
            )
        elif unsafe is not None:
            token = (str(self.root), "unsafe") if unsafe.root_unsafe else (str(self.root), key, "unsafe")
            _warn_once(token, f"jitgemm cache not used: {unsafe.reason}; compiling the kernel in memory")
        else:
            _warn_once(
                (str(self.root), "unwritable"),
                f"jitgemm cache at {self.root} cannot be written ({error}); compiling kernels in memory",
            )
        result = compile_fn(None)
        return CacheResult(result.cubin, key, False, result.seconds, None)

    def _compile_and_publish(
        self,
        key: str,
        source: str,
        arch: str,
        options: tuple,
        nvrtc_version: str,
        meta: dict,
        compile_fn,
        replace: bool,
    ) -> CacheResult:
        try:  # made before compiling: an unwritable root shows up before the compile time is spent
            tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{key[:16]}-", dir=self.root))
        except OSError as exc:
            return self._in_memory(key, compile_fn, None, exc)
        try:
            failed = self.root / FAILED_DIR / f"{key}.cu"
            try:
                result = compile_fn(failed)
            except Exception:
                self._keep_failed_source(failed, source)
                raise
            try:
                self._write_entry(tmp, key, source, arch, options, nvrtc_version, meta, result)
                entry = self._publish(tmp, key, replace)
            except OSError as exc:
                _warn_once(
                    (str(self.root), "unwritable"),
                    f"jitgemm cache at {self.root} cannot be written ({exc}); compiling kernels in memory",
                )
                return CacheResult(result.cubin, key, False, result.seconds, None)
            return CacheResult(result.cubin, key, False, result.seconds, entry)
        finally:
            try:
                _remove_tree(tmp)  # gone already once published
            except OSError:
                pass

    def _keep_failed_source(self, path: Path, source: str) -> None:
        """Best effort: the compile error names this path, so the source should be there."""
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            tmp = path.with_name(f"{TMP_PREFIX}{os.urandom(4).hex()}.cu")
            _write_file(tmp, source.encode())
            os.replace(tmp, path)
        except OSError:
            pass

    @staticmethod
    def _write_entry(
        tmp: Path, key: str, source: str, arch: str, options: tuple, nvrtc_version: str, meta: dict, result
    ) -> None:
        src = source.encode()
        record = dict(
            meta,
            key=key,
            arch=arch,
            nvrtc_version=nvrtc_version,
            options=list(options),
            schema=CACHE_SCHEMA,
            compile_seconds=round(result.seconds, 4),
            cubin_bytes=len(result.cubin),
            source_bytes=len(src),
            cubin_sha256=hashlib.sha256(result.cubin).hexdigest(),
            source_sha256=hashlib.sha256(src).hexdigest(),
            created=time.time(),
        )
        _write_file(tmp / SOURCE_FILE, src)
        _write_file(tmp / CUBIN_FILE, result.cubin)
        _write_file(tmp / META_FILE, json.dumps(record, indent=1, sort_keys=True).encode())
        _fsync_dir(tmp)

    def _publish(self, tmp: Path, key: str, replace: bool) -> Path:
        entry = self.entry_dir(key)
        trash = None
        if replace:  # move the corrupt entry aside first: rename cannot replace a non-empty dir
            trash = self.root / f"{TRASH_PREFIX}{key[:16]}-{os.urandom(4).hex()}"
            try:
                os.rename(entry, trash)
            except FileNotFoundError:
                trash = None
        try:
            os.rename(tmp, entry)
        except OSError as exc:
            # Someone published this key meanwhile (only possible without the lock, e.g. a lock
            # file removed by prune): their entry holds the same cubin, so losing is a success.
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or self.lookup(key).status != "hit":
                raise
        _fsync_dir(self.root)
        if trash is not None:
            try:
                _remove_tree(trash)
            except OSError:
                pass  # prune removes leftover trash
        return entry

    def _offline_message(self, key: str, found: Lookup, hint: str, others: str = "") -> str:
        why = {
            "miss": "is not in the cache",
            "corrupt": f"has a corrupt cache entry ({found.reason})",
            "unsafe": f"cannot be loaded from the cache ({found.reason})",
        }[found.status]
        text = f"{ENV_OFFLINE}=1 forbids compiling, and the kernel with cache key {key} {why} (cache root {self.root})."
        if others:
            text = f"{text}\n  {others}"
        return f"{text}\n{hint}" if hint else text

    def other_builds(
        self, source: str, arch: str, options: tuple, nvrtc_version: str, config: dict | None = None
    ) -> str:
        """Why an entry for `source` is missing although the cache holds the same kernel: "" when
        it does not. The stored source (its sha256 in the meta file) or, failing that, the stored
        config and arch are compared, never the key, which covers the NVRTC version and schema."""
        source_sha = hashlib.sha256(source.encode()).hexdigest()
        same_source, same_config = set(), set()
        try:
            entries = self.entries()
        except (UnsafeError, OSError):
            return ""
        for e in entries:
            meta = e.meta or {}
            if meta.get("arch") != arch:
                continue
            if meta.get("source_sha256") == source_sha:
                same_source.add((e.nvrtc_version or "?", meta.get("schema"), tuple(meta.get("options") or ())))
            elif config is not None and meta.get("config") == config:
                same_config.add(e.nvrtc_version or "?")
        nvrtcs = sorted({v for v, _, _ in same_source if v != nvrtc_version})
        if nvrtcs:
            return (
                f"kernels for this configuration exist for NVRTC {', '.join(nvrtcs)}; this process has NVRTC "
                f"{nvrtc_version} (the NVRTC version is part of the cache key: precompile again with this "
                f"NVRTC, or run with the one that built them)"
            )
        if same_source:
            return (
                "the cache holds this kernel's source built with other compile options or by another "
                "cache schema (another jitgemm version): precompile again with this one"
            )
        if same_config:
            return (
                f"the cache holds this configuration rendered from another source (another jitgemm "
                f"version; NVRTC {', '.join(sorted(same_config))}): precompile again with this one"
            )
        return ""

    # ---- inspection and cleanup (the `jitgemm cache` commands) ----
    def entries(self) -> list[EntryInfo]:
        """Every entry-named item under the root, unverified; symlinks are reported, not followed."""
        try:
            check_root(self.root)
        except FileNotFoundError:
            return []
        out = []
        with os.scandir(self.root) as items:
            for item in items:
                if KEY_RE.fullmatch(item.name):
                    info = self._entry_info(Path(item.path), item.name)
                    if info is not None:
                        out.append(info)
        return out

    def _entry_info(self, path: Path, key: str) -> EntryInfo | None:
        """None when the entry vanished meanwhile (removed by another process)."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        problem, meta, size = None, None, 0
        try:
            _check_trusted(st, path, "cache entry")
            if not stat.S_ISDIR(st.st_mode):
                raise CorruptEntry("the entry is not a directory")
            with os.scandir(path) as files:
                size = sum(f.stat(follow_symlinks=False).st_size for f in files)
            meta = parse_json(read_trusted(path / META_FILE, META_FILE), META_FILE)
        except (UnsafeError, CorruptEntry, OSError) as exc:
            problem = str(exc)
        except ValueError:
            problem = f"{META_FILE} is not valid JSON"
        return EntryInfo(key, path, meta if isinstance(meta, dict) else None, size, st.st_mtime, problem)

    def find(self, prefix: str) -> EntryInfo:
        """The entry whose key starts with `prefix`; KeyError naming the problem otherwise."""
        prefix = prefix.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{1,64}", prefix):
            raise KeyError(f"a cache key is hex digits, got {prefix!r}")
        matches = [e for e in self.entries() if e.key.startswith(prefix)]
        if not matches:
            raise KeyError(f"no cache entry with key {prefix}... under {self.root}")
        if len(matches) > 1:
            raise KeyError(f"key prefix {prefix} is ambiguous: {len(matches)} entries match")
        return matches[0]

    def verify(self) -> list[tuple[EntryInfo, str | None]]:
        """Every entry with None when it re-hashes correctly, else the reason it is bad (an
        entry removed by another process meanwhile is left out)."""
        report = []
        for info in self.entries():
            try:
                read_entry(info.path, info.key, check_source=True)
                report.append((info, None))
            except (UnsafeError, CorruptEntry, OSError) as exc:
                if os.path.lexists(info.path):
                    report.append((info, str(exc)))
        return report

    def _cleanup_root(self) -> Path:
        """The real directory prune/clear work in, after the trust checks of writing (a shared
        cache of root's is cleaned by root only)."""
        check_root(self.root, write=True)
        return Path(os.path.realpath(self.root))

    def prune(
        self,
        older_than: float | None = None,
        max_size: int | None = None,
        dry_run: bool = False,
        now: float | None = None,
    ) -> list[EntryInfo]:
        """Remove entries unused for `older_than` seconds, then the least recently used ones
        until the entries total at most `max_size` bytes; also stale temporary directories and
        leftovers. Returns the entries removed (or that would be, with `dry_run`)."""
        try:
            real = self._cleanup_root()
        except FileNotFoundError:
            return []
        now = time.time() if now is None else now
        entries = sorted(self.entries(), key=lambda e: e.last_used)  # least recently used first
        doomed = [e for e in entries if older_than is not None and now - e.last_used > older_than]
        if max_size is not None:
            kept = [e for e in entries if e not in doomed]
            total = sum(e.size_bytes for e in kept)
            for e in kept:
                if total <= max_size:
                    break
                doomed.append(e)
                total -= e.size_bytes
        if dry_run:
            return doomed
        for e in doomed:
            self._delete(real, e.key)
            if _is_dir(real / LOCK_DIR):  # never through a link
                _remove_unheld_lock(real / LOCK_DIR / f"{e.key}.lock")
        for name in _names(real):
            stale_tmp = name.startswith(TMP_PREFIX) and _age(real / name, now) > STALE_TMP_S
            if stale_tmp or name.startswith(TRASH_PREFIX):
                self._delete(real, name)
        if older_than is not None and _is_dir(real / FAILED_DIR):
            for name in _names(real / FAILED_DIR):
                if _age(real / FAILED_DIR / name, now) > older_than:
                    self._delete(real, Path(FAILED_DIR) / name)
        return doomed

    def clear(self, tuning: bool = False) -> tuple[int, list[str]]:
        """Remove everything the cache made under the root: (entries removed, names left alone).
        Lock files that are held and temporary directories younger than STALE_TMP_S belong to
        compiles in progress: they stay. The tuning file (jitgemm.tuned) stays unless `tuning`;
        the dispatch tables (jitgemm.dispatch: what precompile chose, which it writes again) go."""
        try:
            real = self._cleanup_root()
        except FileNotFoundError:
            return 0, []
        removed, unknown = 0, []
        now = time.time()
        for name in sorted(_names(real)):
            if KEY_RE.fullmatch(name):
                removed += self._delete(real, name)
            elif name in TUNING_NAMES:
                if tuning:
                    self._delete(real, name)
            elif name == LOCK_DIR and _is_dir(real / name):
                if all([_remove_unheld_lock(real / name / lock) for lock in _names(real / name)]):
                    _rmdir_if_empty(real / name)
            elif name.startswith(TMP_PREFIX):
                if _age(real / name, now) > STALE_TMP_S:
                    self._delete(real, name)
            elif name in (LOCK_DIR, FAILED_DIR, DISPATCH_DIR, INDEX_DIR, NVRTC_FILE) or name.startswith(TRASH_PREFIX):
                self._delete(real, name)
            else:
                unknown.append(name)  # not ours: a mistyped JITGEMM_CACHE_DIR must not wipe a home dir
        return removed, unknown

    @staticmethod
    def _delete(real_root: Path, relative: Path | str) -> bool:
        """Remove an item under the root; False if it was gone already. An item of the root
        itself is first renamed to a trash name, so no reader sees it half-deleted."""
        path = real_root / relative
        # The parent must resolve inside the root; the item itself may be a link (it is unlinked).
        parent = os.path.realpath(path.parent)
        if os.path.commonpath([parent, str(real_root)]) != str(real_root):
            raise UnsafeError(f"refusing to delete {path}: it is outside the cache root {real_root}")
        if path.parent == real_root and not path.name.startswith(TRASH_PREFIX):
            trash = real_root / f"{TRASH_PREFIX}{path.name.lstrip('.')[:16]}-{os.urandom(4).hex()}"
            try:
                os.rename(path, trash)
            except FileNotFoundError:
                return False
            path = trash
        elif not os.path.lexists(path):
            return False
        _remove_tree(path)
        return True


def _names(directory: Path) -> list[str]:
    """The names in `directory`; none if it vanished meanwhile."""
    try:
        with os.scandir(directory) as items:
            return [item.name for item in items]
    except FileNotFoundError:
        return []


def _age(path: Path, now: float) -> float:
    """Seconds since `path` was modified; -inf if it vanished meanwhile (never "old")."""
    try:
        return now - os.lstat(path).st_mtime
    except FileNotFoundError:
        return -math.inf


def _rmdir_if_empty(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY):
            raise
