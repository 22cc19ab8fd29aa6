"""Config -> compiled, loaded kernel: a per-process table, then the disk cache, then NVRTC."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from . import compiler, runtime
from .cache import CacheResult, KernelCache
from .config import KernelConfig
from .layout import KernelLayout, layout_of
from .render import kernel_name, render


@dataclass(frozen=True)
class BuiltKernel:
    config: KernelConfig
    layout: KernelLayout
    name: str
    cache: CacheResult

    @property
    def cubin(self) -> bytes:
        return self.cache.cubin


_default_cache: KernelCache | None = None
_loaded: dict = {}                 # (config, device ordinal) -> (LoadedKernel, KernelLayout)
_locks: dict = {}
_table_lock = threading.Lock()


def default_cache() -> KernelCache:
    """The process-wide cache (re-resolved if JITGEMM_CACHE_DIR changed)."""
    global _default_cache
    root = KernelCache().root
    if _default_cache is None or _default_cache.root != root:
        _default_cache = KernelCache(root)
    return _default_cache


def build(config: KernelConfig, cache: KernelCache | None = None) -> BuiltKernel:
    """Render and compile `config` (or find it in the disk cache). Needs no GPU."""
    lay = layout_of(config)
    source = render(config)
    name = kernel_name(config)
    options = compiler.options_for(config.arch)

    def compile_fn(source_path: Path | None):
        return compiler.compile_cubin(source, config.arch, name=f"{name}.cu",
                                      source_path=str(source_path) if source_path else None)

    result = (cache or default_cache()).get_or_compile(
        source, config.arch, options, compiler.nvrtc_version(),
        {"config": config.to_dict(), "kernel": name}, compile_fn)
    return BuiltKernel(config, lay, name, result)


def is_loaded(config: KernelConfig, ordinal: int) -> bool:
    return (config, ordinal) in _loaded


def get(config: KernelConfig, ordinal: int):
    """The loaded kernel for `config` on device `ordinal`, compiling or reading the cache once."""
    key = (config, ordinal)
    found = _loaded.get(key)
    if found is not None:
        return found
    with _table_lock:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        found = _loaded.get(key)
        if found is None:
            built = build(config)
            runtime.ensure_context(ordinal)
            kernel = runtime.load_kernel(built.cubin, built.name, built.layout.smem_bytes,
                                         built.layout.num_threads, config.cluster_size)
            found = (kernel, built.layout)
            _loaded[key] = found
    return found
