"""Kernels of one fixed source, without a KernelConfig: the operand staging copy (staging.py)
and the decode of unaligned weights (decode.py). Each is compiled once per arch, or read from
the disk cache like the GEMMs, and loaded once per device."""

from __future__ import annotations

import threading

from . import compiler, context, kernels, launch, runtime
from .cache import CacheResult, cache_key
from .render import TEMPLATES


class FixedKernel:
    """The kernel `name` (a `__launch_bounds__(threads)` kernel taking PDL's wait), whose
    source is the files `parts` of templates/common, in order."""

    def __init__(self, name: str, parts: tuple, threads: int, what: str):
        self.name, self.parts, self.threads, self.what = name, parts, threads, what
        self._loaded: dict = {}  # (arch, device ordinal) -> LoadedKernel
        self._lock = threading.Lock()

    def source(self) -> str:
        return "".join((TEMPLATES / "common" / part).read_text() for part in self.parts)

    def is_loaded(self, arch: str, ordinal: int) -> bool:
        return (arch, ordinal) in self._loaded

    def get(self, arch: str, ordinal: int) -> runtime.LoadedKernel:
        """The kernel for `arch`, loaded on device `ordinal`: compiled or read from the disk
        cache once (OfflineError under JITGEMM_OFFLINE=1 when it is not there)."""
        key = (arch, ordinal)
        found = self._loaded.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._loaded.get(key)
            if found is None:
                cubin = self.build(arch).cubin
                context.make_current(ordinal)
                found = self._loaded[key] = runtime.load_kernel(cubin, self.name, 0, self.threads, 1, True)
        return found

    def get_unless_blocked(self, arch: str, ordinal: int, stream: int) -> runtime.LoadedKernel | None:
        """`get`, or None where the kernel cannot be had now: met first inside a CUDA-graph
        capture on `stream` (loading cannot be captured), or not in the disk cache under
        JITGEMM_OFFLINE=1. The caller then does without it."""
        if not self.is_loaded(arch, ordinal) and launch.stream_is_capturing(stream):
            return None
        try:
            return self.get(arch, ordinal)
        except kernels.OfflineError:
            return None

    def build(self, arch: str) -> CacheResult:
        """The kernel for `arch`, from the disk cache or compiled (needs no GPU; `jitgemm
        precompile` builds it with the GEMMs)."""
        source = self.source()
        cache, options = kernels.default_cache(), compiler.options_for(arch)
        # Found with the NVRTC version the cache remembers for this process's library, without
        # loading NVRTC (kernels.lookup_nvrtc_version); one to compile is keyed with the loaded one's.
        key = cache_key(source, options, arch, kernels.lookup_nvrtc_version(cache))
        found = cache.lookup(key)
        if found.status == "hit":
            return CacheResult(found.cubin, key, True, 0.0, cache.entry_dir(key))
        return cache.get_or_compile(
            source,
            arch,
            options,
            compiler.nvrtc_version(),
            {"kernel": self.name},
            lambda path: compiler.compile_cubin(source, arch, name=f"{self.name}.cu", source_path=path and str(path)),
            offline_hint=f"  {self.what}: `jitgemm precompile` builds it with the GEMMs",
        )
