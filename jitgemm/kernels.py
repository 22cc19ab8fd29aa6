"""Config -> compiled, loaded kernel: a per-process table, then the disk cache, then NVRTC."""

from __future__ import annotations

import functools
import shlex
import threading
from pathlib import Path
from typing import NamedTuple

from . import compiler, context, registry, runtime
from .cache import CacheResult, KernelCache, OfflineError, cache_key, hash_parts, index_name
from .config import KernelConfig
from .problem import Problem
from .render import TEMPLATES, kernel_name

__all__ = [
    "BuiltKernel",
    "KernelSource",
    "OfflineError",
    "build",
    "code_fingerprint",
    "default_cache",
    "get",
    "is_loaded",
    "precompile_commands",
    "prepare",
]


class KernelSource(NamedTuple):
    """Everything about a kernel that is known before compiling it."""

    config: KernelConfig
    layout: object  # the arch's KernelLayout
    name: str
    source: str
    options: tuple
    nvrtc_version: str

    @property
    def key(self) -> str:
        return cache_key(self.source, self.options, self.config.arch, self.nvrtc_version)


class BuiltKernel(NamedTuple):
    config: KernelConfig
    layout: object
    name: str
    cache: CacheResult

    @property
    def cubin(self) -> bytes:
        return self.cache.cubin


_default_cache: KernelCache | None = None
_loaded: dict = {}  # (config, device ordinal) -> (LoadedKernel, KernelLayout)
_locks: dict = {}
_table_lock = threading.Lock()


def default_cache() -> KernelCache:
    """The process-wide cache (re-resolved if JITGEMM_CACHE_DIR changed)."""
    global _default_cache
    root = KernelCache().root
    if _default_cache is None or _default_cache.root != root:
        _default_cache = KernelCache(root)
    return _default_cache


def prepare(config: KernelConfig) -> KernelSource:
    """Render `config` and collect what its cache key covers; compiles nothing."""
    arch = registry.get(config.arch)
    return KernelSource(
        config,
        arch.layout_of(config),
        kernel_name(config),
        arch.render(config),
        compiler.options_for(config.arch),
        compiler.nvrtc_version(),
    )


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over jitgemm's version, the package's Python sources and the templates: what a
    kernel's rendered source depends on besides its config (computed once per process, ~2 ms).
    The disk cache's index (cache.index_name) covers it, so after any change of the code a
    kernel is rendered again before its cache key is trusted."""
    from . import __version__  # not at import: jitgemm/__init__ imports this module first

    files: list = []

    def walk(folder, prefix: str) -> None:
        for item in folder.iterdir():
            if item.name == "__pycache__":
                continue
            if item.is_dir():
                walk(item, f"{prefix}{item.name}/")
            elif prefix.startswith("templates/") or item.name.endswith(".py"):
                files.append((f"{prefix}{item.name}", item))

    walk(TEMPLATES, "templates/")
    walk(Path(__file__).parent / "archs", "archs/")
    for name in Path(__file__).parent.glob("*.py"):
        files.append((name.name, name))
    files.sort(key=lambda f: f[0])
    return hash_parts([f"jitgemm={__version__}"] + [part for name, item in files for part in (name, item.read_bytes())])


_remembered: dict = {}  # cache root -> the NVRTC version its memo holds for this process's library


def lookup_nvrtc_version(cache: KernelCache) -> str:
    """This process's NVRTC version (compiler.nvrtc_version), to find its kernels in `cache`
    through the index: without loading NVRTC where `cache` remembers the version of the library
    file cuda.bindings would load (compiler.nvrtc_library; cache.NVRTC_FILE).

    Exact: the memo holds what a library file said its version is, under the file's identity
    (compiler.library_identity), so a replaced or updated library, or another cuda.pathfinder,
    is asked again; only the files cuda.pathfinder was seen to load where nvrtc_library looks
    are recorded (remember_nvrtc_version), and the file is read and written under the cache's
    trust rules. The wheel's metadata would not do: it names the wheel's NVRTC, not necessarily
    the library cuda.pathfinder loads (conda, a system CUDA, one loaded already by torch or
    CuPy). Before asking cuda.pathfinder, `_without_pathfinder` tries what needs no import of
    it: an NVRTC mapped already is asked its version, and with none mapped, a remembered file
    found with this process's search inputs (compiler.search_inputs) and unchanged gives its
    version. Only finding kernels uses it: a
    kernel is compiled, and its key made, with the version of the library loaded
    (kernels.prepare), and a process that has loaded it asks it.
    """
    if not compiler.nvrtc_loaded():
        version = _remembered.get(cache.root) or _without_pathfinder(cache)
        if version is None:
            library = compiler.nvrtc_library()
            version = None if library is None else cache.find_nvrtc_version(*library)
        if version is not None:
            _remembered[cache.root] = version
            return version
    version = compiler.nvrtc_version()  # loads NVRTC, once per process
    remember_nvrtc_version(cache)
    return version


def _without_pathfinder(cache: KernelCache) -> str | None:
    """The NVRTC version without importing cuda.pathfinder (nvrtc_library does), from one read
    of the process's mappings: the one NVRTC mapped already, asked directly (cuda.pathfinder
    would hand cuda.bindings that one); with none mapped, the version the memo holds for a file
    found with this process's search inputs whose identity is unchanged. None otherwise."""
    mapped = compiler.mapped_nvrtc()
    if mapped:
        return compiler.mapped_nvrtc_version(mapped)
    search = compiler.search_inputs()
    if mapped is None or search is None:
        return None
    for library, identity, version in cache.nvrtc_memo():
        if identity.get("search") != search:
            continue
        try:
            if compiler.library_identity(library, identity["pathfinder"]) == identity:
                return version
        except (OSError, KeyError, TypeError):
            continue
    return None


def remember_nvrtc_version(cache: KernelCache) -> None:
    """Record in `cache` the version of the NVRTC this process loaded, for its library file
    (compiler.loaded_library), once per process and root; best effort (a missing, shared or
    unwritable root is tried again next time)."""
    if not compiler.nvrtc_loaded():  # nothing learned: loading NVRTC is what the memo avoids
        return
    version = compiler.nvrtc_version()
    if _remembered.get(cache.root) == version:
        return
    library = compiler.loaded_library()
    if library is not None and cache.remember_nvrtc_version(*library, version):
        _remembered[cache.root] = version


def _find_indexed(config: KernelConfig, cache: KernelCache) -> BuiltKernel | None:
    """`config`'s kernel from the disk cache through its index, without rendering (None: not
    indexed, or the index is stale; then build renders and looks the key up as usual)."""
    try:
        options = compiler.options_for(config.arch)
        name = index_name(config.to_json(), config.arch, options, code_fingerprint())
        nvrtc_version = lookup_nvrtc_version(cache)
    except Exception:  # no NVRTC, unreadable sources: the usual path reports what matters
        return None
    kernel = kernel_name(config)
    meta = {"config": config.to_dict(), "kernel": kernel, "arch": config.arch, "options": list(options)}
    found = cache.find_indexed(name, nvrtc_version, meta)
    if found is None:
        return None
    return BuiltKernel(config, registry.get(config.arch).layout_of(config), kernel, found)


def precompile_commands(config: KernelConfig, problem: Problem | None = None) -> list[str]:
    """Shell commands that put `config`'s kernel in the cache: the exact config, then the shape."""
    commands = [f"jitgemm precompile --config {shlex.quote(config.to_json())}"]
    if problem is not None and not problem.has_c:  # the shape path has no C epilogue flag
        commands.append(
            f"jitgemm precompile --m {problem.m} --n {problem.n} --k {problem.k} "
            f"--dtype {problem.dtype} --out-dtype {problem.out_dtype} "
            f"--layout {problem.layout} --arch {config.arch}"
        )
    return commands


def _offline_hint(src: KernelSource, problem: Problem | None) -> str:
    lines = [
        f"  problem: {problem.describe()}" if problem is not None else "  problem: not given",
        f"  kernel:  {src.name}",
        "  build it (where compiling is allowed, with the same JITGEMM_CACHE_DIR) with:",
    ]
    lines += [f"    {command}" for command in precompile_commands(src.config, problem)]
    return "\n".join(lines)


def build(config: KernelConfig, cache: KernelCache | None = None, problem: Problem | None = None) -> BuiltKernel:
    """Render and compile `config` (or find it in the disk cache). Needs no GPU.

    `problem`, when given, is named in the OfflineError raised under JITGEMM_OFFLINE=1.
    """
    cache = cache or default_cache()
    indexed = _find_indexed(config, cache)
    if indexed is not None:
        return indexed
    src = prepare(config)

    def compile_fn(source_path: Path | None):
        return compiler.compile_cubin(
            src.source, config.arch, name=f"{src.name}.cu", source_path=str(source_path) if source_path else None
        )

    result = cache.get_or_compile(
        src.source,
        config.arch,
        src.options,
        src.nvrtc_version,
        {"config": config.to_dict(), "kernel": src.name},
        compile_fn,
        offline_hint=_offline_hint(src, problem),
    )
    if result.path is not None:  # on disk: index it, so the next process needs no render (nor NVRTC)
        cache.write_index(
            index_name(config.to_json(), config.arch, src.options, code_fingerprint()), src.nvrtc_version, result.key
        )
        remember_nvrtc_version(cache)
    return BuiltKernel(config, src.layout, src.name, result)


def is_loaded(config: KernelConfig, ordinal: int) -> bool:
    return (config, ordinal) in _loaded


def get(config: KernelConfig, ordinal: int, problem: Problem | None = None):
    """The loaded kernel for `config` on device `ordinal`, compiling or reading the cache once.

    After the first call for a (config, ordinal) this is a dictionary lookup: no file I/O.
    """
    key = (config, ordinal)
    found = _loaded.get(key)
    if found is not None:
        return found
    with _table_lock:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        found = _loaded.get(key)
        if found is None:
            built = build(config, problem=problem)
            context.make_current(ordinal)
            kernel = runtime.load_kernel(
                built.cubin,
                built.name,
                built.layout.smem_bytes,
                built.layout.num_threads,
                config.cluster_size,
                registry.get(config.arch).waits_for_previous_grid,
            )
            found = (kernel, built.layout)
            _loaded[key] = found
    return found
