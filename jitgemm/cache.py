"""The on-disk cubin cache: keys, trusted loads, atomic publishing, inspection and cleanup.

Key: sha256 over the rendered source, the compile options, the target arch, the NVRTC version
and CACHE_SCHEMA. Entry: a directory named by the full hex key holding `kernel.cu`,
`kernel.cubin` and `meta.json` (never a pickle). An entry is compiled into a private temporary
directory, fsynced and renamed into place; a file lock per key deduplicates concurrent compiles
across threads and processes, and a lost race is a success.

Trust: the root, each entry and each file must be owned by the user, not be a symlink and not be
writable by group or others (checked with lstat/fstat, never following links); otherwise the
kernel is compiled in memory with a warning. A cubin whose size or sha256 does not match its
meta file is a miss: it is rebuilt and reported once. A root that cannot be written (read-only,
full disk, a file in its place) means in-memory compilation with one warning, never a crash.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import platformdirs

CACHE_SCHEMA = 1
SOURCE_FILE, CUBIN_FILE, META_FILE = "kernel.cu", "kernel.cubin", "meta.json"
LOCK_DIR, FAILED_DIR = ".locks", "failed"       # per-key lock files; sources that failed to compile
TMP_PREFIX, TRASH_PREFIX = ".tmp-", ".trash-"   # entries being written; corrupt entries being removed
LOCK_TIMEOUT_S = 600.0                          # a compile takes about a second; longer means a hung peer
STALE_TMP_S = 3600.0                            # prune removes temporary directories older than this
KEY_RE = re.compile(r"[0-9a-f]{64}")
TUNING_NAMES = ("tuned.json", "tuned.json.lock")   # jitgemm.tuning's file: not a kernel entry, kept by clear
ENV_ROOT, ENV_OFFLINE = "JITGEMM_CACHE_DIR", "JITGEMM_OFFLINE"


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
    return Path(os.path.abspath(os.path.expanduser(env))) if env else Path(platformdirs.user_cache_dir("jitgemm"))


def offline_mode() -> bool:
    value = os.environ.get(ENV_OFFLINE, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{ENV_OFFLINE} must be 0 or 1, got {os.environ[ENV_OFFLINE]!r}")


def cache_key(source: str, options: tuple, arch: str, nvrtc_version: str, schema: int | None = None) -> str:
    """The entry name: sha256 over length-prefixed parts, so no two inputs share a byte stream."""
    h = hashlib.sha256()
    parts = (f"schema={CACHE_SCHEMA if schema is None else schema}", f"arch={arch}",
             f"nvrtc={nvrtc_version}", "options=" + "\x1f".join(options), source)
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


# ---- trust checks (lstat/fstat only: a symlink is judged, never followed) ----

def _check_trusted(st: os.stat_result, path: Path, what: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeError(f"{what} {path} is a symlink")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeError(f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {uid})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeError(f"{what} {path} is writable by group or others "
                          f"(mode {stat.S_IMODE(st.st_mode):04o})")


def check_root(root: Path) -> None:
    """Raise UnsafeError for an untrusted root, FileNotFoundError/NotADirectoryError if unusable."""
    st = os.lstat(root)
    _check_trusted(st, root, "cache root")
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "cache root is not a directory", str(root))


def read_trusted(path: Path, what: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CorruptEntry(f"{what} is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeError(f"{path} is a symlink") from None
        raise CorruptEntry(f"{what} cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)   # of the file actually opened: no window between check and read
        _check_trusted(st, path, "cache file")
        if not stat.S_ISREG(st.st_mode):
            raise CorruptEntry(f"{what} is not a regular file")
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
        meta = json.loads(read_trusted(entry / META_FILE, META_FILE))
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
            derived = cache_key(source.decode(), tuple(meta["options"]), meta["arch"],
                                meta["nvrtc_version"], meta["schema"])
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


def _remove(path: Path) -> None:
    """Delete `path` without following symlinks: a link is unlinked, never its target."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)   # fd-based on Linux: links inside are unlinked, not followed
    else:
        os.unlink(path)


if not shutil.rmtree.avoids_symlink_attacks:   # prune/clear rely on it to stay inside the root
    raise ImportError("jitgemm.cache needs a platform where shutil.rmtree does not follow symlinks")


_warned: set = set()
_warned_lock = threading.Lock()


def _warn_once(token: tuple, message: str) -> None:
    with _warned_lock:
        if token in _warned:
            return
        _warned.add(token)
    warnings.warn(message, CacheWarning, stacklevel=4)


@dataclass(frozen=True)
class CacheResult:
    cubin: bytes
    key: str
    hit: bool               # found on disk (no compile happened in this call)
    compile_seconds: float
    path: Path | None       # the entry directory, or None when compiled in memory


@dataclass(frozen=True)
class Lookup:
    status: str             # "hit", "miss", "corrupt" or "unsafe"
    cubin: bytes | None = None
    reason: str = ""
    root_unsafe: bool = False


@dataclass(frozen=True)
class EntryInfo:
    key: str
    path: Path
    meta: dict | None       # None when meta.json cannot be read
    size_bytes: int         # bytes of the files in the entry, as stored
    last_used: float        # the entry directory's mtime, refreshed on every load
    problem: str | None     # why the entry cannot be read, without re-hashing (see verify)

    @property
    def kernel(self) -> str:
        return (self.meta or {}).get("kernel", "?")


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
        if touch:
            try:
                os.utime(self.entry_dir(key))    # last use, for prune; a read-only root is fine
            except OSError:
                pass
        return Lookup("hit", cubin)

    def get_or_compile(self, source: str, arch: str, options: tuple, nvrtc_version: str, meta: dict,
                       compile_fn, offline_hint: str = "") -> CacheResult:
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
            raise OfflineError(self._offline_message(key, found, offline_hint))
        if found.status == "unsafe":
            return self._in_memory(key, compile_fn, found)
        try:
            self.ensure_root()
            lock = self._file_lock(key)
            lock.acquire()      # filelock.Timeout is an OSError too: a peer hung for LOCK_TIMEOUT_S
        except UnsafeError as exc:
            return self._in_memory(key, compile_fn, Lookup("unsafe", reason=str(exc), root_unsafe=True))
        except OSError as exc:
            return self._in_memory(key, compile_fn, None, exc)
        try:
            found = self.lookup(key)    # another thread or process may have published it meanwhile
            if found.status == "hit":
                return CacheResult(found.cubin, key, True, 0.0, self.entry_dir(key))
            if found.status == "unsafe":
                return self._in_memory(key, compile_fn, found)
            if found.status == "corrupt":
                _warn_once((str(self.root), key, "corrupt"),
                           f"jitgemm cache entry {self.entry_dir(key)} is corrupt ({found.reason}); rebuilding it")
            return self._compile_and_publish(key, source, arch, options, nvrtc_version, meta, compile_fn,
                                             replace=found.status == "corrupt")
        finally:
            lock.release()

    def ensure_root(self) -> None:
        try:
            check_root(self.root)
        except FileNotFoundError:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.root, 0o700)
            except FileExistsError:
                pass
            check_root(self.root)     # whoever created it, it must be trusted now

    def _file_lock(self, key: str):
        import filelock   # only the compile path needs it (keeps the warm path's imports small)
        locks = self.root / LOCK_DIR
        try:
            os.mkdir(locks, 0o700)
        except FileExistsError:
            _check_trusted(os.lstat(locks), locks, "lock directory")
        return filelock.FileLock(str(locks / f"{key}.lock"), timeout=LOCK_TIMEOUT_S, mode=0o600)

    def _in_memory(self, key: str, compile_fn, unsafe: Lookup | None, error: OSError | None = None) -> CacheResult:
        if unsafe is not None:
            token = (str(self.root), "unsafe") if unsafe.root_unsafe else (str(self.root), key, "unsafe")
            _warn_once(token, f"jitgemm cache not used: {unsafe.reason}; compiling the kernel in memory")
        else:
            _warn_once((str(self.root), "unwritable"),
                       f"jitgemm cache at {self.root} cannot be written ({error}); compiling kernels in memory")
        result = compile_fn(None)
        return CacheResult(result.cubin, key, False, result.seconds, None)

    def _compile_and_publish(self, key: str, source: str, arch: str, options: tuple, nvrtc_version: str,
                             meta: dict, compile_fn, replace: bool) -> CacheResult:
        try:     # made before compiling: an unwritable root shows up before the compile time is spent
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
                _warn_once((str(self.root), "unwritable"),
                           f"jitgemm cache at {self.root} cannot be written ({exc}); compiling kernels in memory")
                return CacheResult(result.cubin, key, False, result.seconds, None)
            return CacheResult(result.cubin, key, False, result.seconds, entry)
        finally:
            if os.path.lexists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)

    def _keep_failed_source(self, path: Path, source: str) -> None:
        """Best effort: the compile error names this path, so the source should be there."""
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            tmp = path.with_name(f"{TMP_PREFIX}{secrets.token_hex(4)}.cu")
            _write_file(tmp, source.encode())
            os.replace(tmp, path)
        except OSError:
            pass

    @staticmethod
    def _write_entry(tmp: Path, key: str, source: str, arch: str, options: tuple, nvrtc_version: str,
                     meta: dict, result) -> None:
        src = source.encode()
        record = dict(meta, key=key, arch=arch, nvrtc_version=nvrtc_version, options=list(options),
                      schema=CACHE_SCHEMA, compile_seconds=round(result.seconds, 4),
                      cubin_bytes=len(result.cubin), source_bytes=len(src),
                      cubin_sha256=hashlib.sha256(result.cubin).hexdigest(),
                      source_sha256=hashlib.sha256(src).hexdigest(), created=time.time())
        _write_file(tmp / SOURCE_FILE, src)
        _write_file(tmp / CUBIN_FILE, result.cubin)
        _write_file(tmp / META_FILE, json.dumps(record, indent=1, sort_keys=True).encode())
        _fsync_dir(tmp)

    def _publish(self, tmp: Path, key: str, replace: bool) -> Path:
        entry = self.entry_dir(key)
        trash = None
        if replace:      # move the corrupt entry aside first: rename cannot replace a non-empty dir
            trash = self.root / f"{TRASH_PREFIX}{key[:16]}-{secrets.token_hex(4)}"
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
            shutil.rmtree(trash, ignore_errors=True)
        return entry

    def _offline_message(self, key: str, found: Lookup, hint: str) -> str:
        why = {"miss": "is not in the cache",
               "corrupt": f"has a corrupt cache entry ({found.reason})",
               "unsafe": f"cannot be loaded from the cache ({found.reason})"}[found.status]
        text = (f"{ENV_OFFLINE}=1 forbids compiling, and the kernel with cache key {key} {why} "
                f"(cache root {self.root}).")
        return f"{text}\n{hint}" if hint else text

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
                    out.append(self._entry_info(Path(item.path), item.name))
        return out

    def _entry_info(self, path: Path, key: str) -> EntryInfo:
        st = os.lstat(path)
        problem, meta, size = None, None, 0
        try:
            _check_trusted(st, path, "cache entry")
            if not stat.S_ISDIR(st.st_mode):
                raise CorruptEntry("the entry is not a directory")
            with os.scandir(path) as files:
                size = sum(f.stat(follow_symlinks=False).st_size for f in files)
            meta = json.loads(read_trusted(path / META_FILE, META_FILE))
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
        """Every entry with None when it re-hashes correctly, else the reason it is bad."""
        report = []
        for info in self.entries():
            try:
                read_entry(info.path, info.key, check_source=True)
                report.append((info, None))
            except (UnsafeError, CorruptEntry, OSError) as exc:
                report.append((info, str(exc)))
        return report

    def _cleanup_root(self) -> Path:
        """The real directory prune/clear work in, after the same trust checks as loading."""
        check_root(self.root)
        return Path(os.path.realpath(self.root))

    def prune(self, older_than: float | None = None, max_size: int | None = None,
              dry_run: bool = False, now: float | None = None) -> list[EntryInfo]:
        """Remove entries unused for `older_than` seconds, then the least recently used ones
        until the entries total at most `max_size` bytes; also stale temporary directories and
        leftovers. Returns the entries removed (or that would be, with `dry_run`)."""
        try:
            real = self._cleanup_root()
        except FileNotFoundError:
            return []
        now = time.time() if now is None else now
        entries = sorted(self.entries(), key=lambda e: e.last_used)   # least recently used first
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
            self._delete(real, Path(LOCK_DIR) / f"{e.key}.lock")
        with os.scandir(real) as items:
            for item in items:
                age = now - item.stat(follow_symlinks=False).st_mtime
                if (item.name.startswith(TRASH_PREFIX)
                        or (item.name.startswith(TMP_PREFIX) and age > STALE_TMP_S)):
                    self._delete(real, item.name)
        if older_than is not None and _is_dir(real / FAILED_DIR):
            with os.scandir(real / FAILED_DIR) as items:
                for item in items:
                    if now - item.stat(follow_symlinks=False).st_mtime > older_than:
                        self._delete(real, Path(FAILED_DIR) / item.name)
        return doomed

    def clear(self) -> tuple[int, list[str]]:
        """Remove everything the cache made under the root: (entries removed, names left alone)."""
        try:
            real = self._cleanup_root()
        except FileNotFoundError:
            return 0, []
        removed, unknown = 0, []
        with os.scandir(real) as items:
            names = sorted(item.name for item in items)
        for name in names:
            if KEY_RE.fullmatch(name):
                removed += 1
            elif name in TUNING_NAMES:
                continue
            elif not (name in (LOCK_DIR, FAILED_DIR) or name.startswith((TMP_PREFIX, TRASH_PREFIX))):
                unknown.append(name)   # not ours: a mistyped JITGEMM_CACHE_DIR must not wipe a home dir
                continue
            self._delete(real, name)
        return removed, unknown

    @staticmethod
    def _delete(real_root: Path, relative: Path | str) -> None:
        path = real_root / relative
        # The parent must resolve inside the root; the item itself may be a link (it is unlinked).
        parent = os.path.realpath(path.parent)
        if os.path.commonpath([parent, str(real_root)]) != str(real_root):
            raise UnsafeError(f"refusing to delete {path}: it is outside the cache root {real_root}")
        try:
            _remove(path)
        except FileNotFoundError:
            pass
