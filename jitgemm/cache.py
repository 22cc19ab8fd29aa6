"""On-disk cubin cache.

Key: sha256 over the rendered source, the compile options, the target arch, the NVRTC version
and CACHE_SCHEMA. Entry: a directory named by the full hex key holding `kernel.cu`,
`kernel.cubin` and `meta.json`. Entries are published atomically (written in a private temp
directory, fsynced, renamed into place); a file lock deduplicates concurrent compiles of one key.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import filelock
import platformdirs

CACHE_SCHEMA = 1
SOURCE_FILE, CUBIN_FILE, META_FILE = "kernel.cu", "kernel.cubin", "meta.json"


class CacheWarning(UserWarning):
    """The disk cache could not be used; kernels are compiled in memory instead."""


def default_root() -> Path:
    env = os.environ.get("JITGEMM_CACHE_DIR")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("jitgemm"))


def cache_key(source: str, options: tuple, arch: str, nvrtc_version: str, schema: int = CACHE_SCHEMA) -> str:
    h = hashlib.sha256()
    for part in (f"schema={schema}", f"arch={arch}", f"nvrtc={nvrtc_version}",
                 "options=" + "\x1f".join(options), source):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


@dataclass(frozen=True)
class CacheResult:
    cubin: bytes
    key: str
    hit: bool            # found on disk (no compile happened in this call)
    compile_seconds: float
    path: Path | None    # the entry directory, or None when compiled in memory


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class KernelCache:
    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else default_root()
        self._warned = False

    # ---- paths ----
    def entry_dir(self, key: str) -> Path:
        return self.root / key

    def _ensure_root(self) -> bool:
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            return os.access(self.root, os.W_OK | os.X_OK)
        except OSError:
            return False

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, CacheWarning, stacklevel=3)

    # ---- read ----
    def load(self, key: str) -> bytes | None:
        """The cubin of `key` if its entry is complete and its hash matches, else None."""
        entry = self.entry_dir(key)
        try:
            meta = json.loads((entry / META_FILE).read_text())
            cubin = (entry / CUBIN_FILE).read_bytes()
        except (OSError, ValueError):
            return None
        if hashlib.sha256(cubin).hexdigest() != meta.get("cubin_sha256"):
            return None
        return cubin

    # ---- write ----
    def get_or_compile(self, source: str, arch: str, options: tuple, nvrtc_version: str,
                       meta: dict, compile_fn) -> CacheResult:
        """Return the cubin for `source`, compiling with `compile_fn(source_path)` on a miss.

        `compile_fn` takes the path of the saved source (or None) and returns an object with
        `.cubin` and `.seconds`.
        """
        key = cache_key(source, options, arch, nvrtc_version)
        cubin = self.load(key)
        if cubin is not None:
            return CacheResult(cubin, key, True, 0.0, self.entry_dir(key))
        if not self._ensure_root():
            self._warn(f"jitgemm cache root {self.root} is not writable; compiling in memory")
            result = compile_fn(None)
            return CacheResult(result.cubin, key, False, result.seconds, None)
        lock = filelock.FileLock(str(self.root / f".{key}.lock"))
        with lock:
            cubin = self.load(key)  # another thread or process may have published it meanwhile
            if cubin is not None:
                return CacheResult(cubin, key, True, 0.0, self.entry_dir(key))
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=self.root))
            try:
                _write_file(tmp / SOURCE_FILE, source.encode())
                result = compile_fn(tmp / SOURCE_FILE)
                _write_file(tmp / CUBIN_FILE, result.cubin)
                record = dict(meta, key=key, arch=arch, nvrtc_version=nvrtc_version, options=list(options),
                              schema=CACHE_SCHEMA, compile_seconds=round(result.seconds, 4),
                              cubin_bytes=len(result.cubin), source_bytes=len(source.encode()),
                              cubin_sha256=hashlib.sha256(result.cubin).hexdigest(), created=time.time())
                _write_file(tmp / META_FILE, json.dumps(record, indent=1, sort_keys=True).encode())
                _fsync_dir(tmp)
                entry = self.entry_dir(key)
                if entry.exists():          # a corrupt entry: replace it
                    shutil.rmtree(entry, ignore_errors=True)
                os.rename(tmp, entry)
                _fsync_dir(self.root)
                return CacheResult(result.cubin, key, False, result.seconds, entry)
            except OSError as exc:
                self._warn(f"jitgemm cache at {self.root} could not be written ({exc}); using the kernel in memory")
                shutil.rmtree(tmp, ignore_errors=True)
                if "result" in locals():
                    return CacheResult(result.cubin, key, False, result.seconds, None)
                result = compile_fn(None)
                return CacheResult(result.cubin, key, False, result.seconds, None)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
