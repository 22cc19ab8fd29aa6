"""NVRTC: CUDA source -> cubin, through cuda-python. The only place that compiles."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import site
import sys
import time
from typing import NamedTuple

# -lineinfo keeps source correlation for profilers at no runtime cost. ptxas warnings that
# mean a silently slow kernel (C7508 setmaxnreg ignored, C7510/C7511/C7512/C7515 wgmma serialised)
# are promoted to errors by checking the log below.
BASE_OPTIONS = ("--std=c++17", "-lineinfo", "--use_fast_math")
SLOW_KERNEL_WARNINGS = ("C7508", "C7510", "C7511", "C7512", "C7515")


class CompileError(RuntimeError):
    """NVRTC rejected the source, or ptxas warned that the kernel would run slowly."""


class CompileResult(NamedTuple):
    cubin: bytes
    log: str
    seconds: float


def _nvrtc():
    # cuda.bindings.nvrtc is imported only to compile: a process whose kernels are all in the
    # disk cache never needs it (nvrtc_version asks the library directly).
    from cuda.bindings import nvrtc

    return nvrtc


@functools.lru_cache(maxsize=1)
def _loaded() -> tuple[str, str | None]:
    """(version "major.minor", library file) of the NVRTC cuda.bindings.nvrtc compiles with,
    loading it; the file is None where cuda.pathfinder did not load it.

    Asked through ctypes of the very library cuda.bindings loads (cuda.pathfinder's
    load_nvidia_dynamic_lib("nvrtc"), which caches the loaded handle per process), so the cache
    key of a kernel in the disk cache is known without importing cuda.bindings.nvrtc.
    """
    try:
        # cuda.pathfinder is already imported by cuda.bindings.driver (jitgemm.runtime).
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = load_nvidia_dynamic_lib("nvrtc").abs_path
        version = _reported_version(ctypes.CDLL(path))
        if version is not None:
            return version, path
    except Exception:  # any failure: ask cuda.bindings, which raises the error that matters
        pass
    err, major_, minor_ = _nvrtc().nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major_}.{minor_}", None


def nvrtc_version() -> str:
    """The NVRTC version, "major.minor", of the library cuda.bindings.nvrtc compiles with
    (loading the library on first use, ~15 ms; kernels.lookup_nvrtc_version avoids that on a
    warm cache)."""
    return _loaded()[0]


def nvrtc_loaded() -> bool:
    """Whether nvrtc_version has loaded NVRTC in this process (asking again costs nothing)."""
    return _loaded.cache_info().currsize > 0


def nvrtc_library() -> tuple[str, dict] | None:
    """(path, identity) of the file cuda.bindings.nvrtc would load NVRTC from, found without
    loading it, or None where that cannot be told cheaply: NVRTC is loaded in this process
    already (then nvrtc_version is cheap), or it is not in an NVIDIA wheel or conda environment
    (the system's loader then picks it), or cuda.pathfinder's internals have changed.

    This follows cuda.pathfinder's documented search order (already loaded, then NVIDIA wheels
    and conda, then the system) through its own find steps. The identity keys the memo of
    kernels.lookup_nvrtc_version (library_identity).
    """
    try:
        # cuda.bindings.driver imported it already; internals, so any failure means "ask".
        from cuda.pathfinder._dynamic_libs import lib_descriptor, platform_loader

        if platform_loader.LOADER.check_if_already_loaded_from_elsewhere(lib_descriptor.LIB_DESCRIPTORS["nvrtc"]):
            return None
    except Exception:
        return None
    return _packaged_library()


def loaded_library() -> tuple[str, dict] | None:
    """(path, identity) of the file nvrtc_version loaded NVRTC from (loading it first) when that
    is the file nvrtc_library names in a process that has not loaded NVRTC, else None: what
    kernels.remember_nvrtc_version may record (so each write checks the prediction again)."""
    loaded = _loaded()[1]
    found = _packaged_library()
    if loaded is None or found is None or found[1]["file"] != os.path.realpath(loaded):
        return None
    return found


def _packaged_library() -> tuple[str, dict] | None:
    """(path, identity) of the NVRTC library of an NVIDIA wheel or the conda environment, the
    one cuda.pathfinder loads unless NVRTC is loaded already (its own find steps), or None."""
    try:
        # cuda.bindings.driver imported these already; internals, so any failure means "ask".
        import cuda.pathfinder
        from cuda.pathfinder._dynamic_libs import lib_descriptor, search_steps

        context = search_steps.SearchContext(lib_descriptor.LIB_DESCRIPTORS["nvrtc"])
        found = search_steps.run_find_steps(context, search_steps.EARLY_FIND_STEPS)
        if found is None:
            return None
        path = str(found.abs_path)
        return path, library_identity(path, str(cuda.pathfinder.__version__))
    except Exception:  # not importable, not found, another layout: ask the library
        return None


def library_identity(path: str, finder: str) -> dict:
    """What identifies the library file `path` (OSError when it cannot be read): its real path,
    size and mtime (a file with all three unchanged is the same library, as Python judges a
    source against its bytecode), `finder`, the version of cuda.pathfinder that found it
    (another one checks again that nvrtc_library names the file it loads), and the search's
    inputs (search_inputs) it was found with."""
    st = os.stat(path)
    return {
        "file": os.path.realpath(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "pathfinder": finder,
        "search": search_inputs(),
    }


@functools.lru_cache(maxsize=1)
def search_inputs() -> dict | None:
    """What cuda.pathfinder's search for NVRTC in NVIDIA wheels and conda reads, gathered
    without importing it (where cuda.bindings.driver does not, that import is most of a warm
    first call: 20-70 ms): the site-packages directories it walks, in order, with when each
    library directory of their NVIDIA wheels last changed (installing or removing a wheel
    changes it), $CONDA_PREFIX and its lib directory's change time, and cuda.pathfinder's own
    file. While these are the same, the search finds the same file
    (kernels.lookup_nvrtc_version then checks that the file is unchanged). None where they
    cannot be read."""
    try:

        def changed(path: str):
            try:
                return os.stat(path).st_mtime_ns
            except OSError:
                return None

        def wheel_dirs(root: str) -> list:
            nvidia = os.path.join(root, "nvidia")
            try:
                children = sorted(os.listdir(nvidia))
            except OSError:
                return []
            return [[child, changed(os.path.join(nvidia, child, "lib"))] for child in children]

        roots = list(site.getsitepackages())
        user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
        finder = importlib.util.find_spec("cuda.pathfinder")
        if finder is None or finder.origin is None:
            return None
        conda = os.environ.get("CONDA_PREFIX")
        return {
            "site": [[root, wheel_dirs(root)] for root in roots],
            "user_site": user and [user, wheel_dirs(user)],
            "venv": sys.prefix != sys.base_prefix,
            "conda": conda and [conda, changed(os.path.join(conda, "lib"))],
            "pathfinder": [finder.origin, changed(finder.origin)],
        }
    except Exception:  # an unusual interpreter or site module: no shortcut
        return None


def mapped_nvrtc() -> list[str] | None:
    """The NVRTC library files mapped into this process already (loaded by anyone, torch say:
    cuda.pathfinder then hands cuda.bindings that library, not what its search finds), or None
    where /proc/self/maps cannot be read (off Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            found = {line.split()[-1] for line in maps if "/libnvrtc.so" in line}
    except OSError:
        return None
    return sorted(found)


def mapped_nvrtc_version(mapped: list[str]) -> str | None:
    """The version of the NVRTC library mapped into this process already, when `mapped`
    (mapped_nvrtc's answer) is one file, asked of it through ctypes (the library is loaded: no
    cost) without importing cuda.pathfinder; None where none or several are mapped or it cannot
    be asked."""
    if len(mapped) != 1:
        return None
    try:
        return _reported_version(ctypes.CDLL(mapped[0], mode=os.RTLD_NOLOAD | os.RTLD_LAZY))
    except (OSError, AttributeError):
        return None


def _reported_version(library: ctypes.CDLL) -> str | None:
    """ "major.minor" as the NVRTC `library` reports it (None where it does not)."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    if library.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
        return f"{major.value}.{minor.value}"
    return None


def options_for(arch: str) -> tuple[str, ...]:
    return BASE_OPTIONS + (f"--gpu-architecture={arch}",)


def _check(err, what: str, log: str = ""):
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise CompileError(f"{what} failed: {msg.decode() if isinstance(msg, bytes) else msg}\n{log}")


def compile_cubin(source: str, arch: str, name: str = "jitgemm.cu", source_path: str | None = None) -> CompileResult:
    """Compile `source` for `arch` (e.g. 'sm_90a'); returns the cubin and NVRTC's log.

    `source_path`, when given, is where the rendered source was saved; errors name it.
    """
    nvrtc = _nvrtc()
    start = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options_for(arch)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = _program_log(prog)
        where = f" (rendered source: {source_path})" if source_path else ""
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC failed to compile {name} for {arch}{where}:\n{log}")
        slow = [w for w in SLOW_KERNEL_WARNINGS if w in log]
        if slow:
            raise CompileError(
                f"ptxas warned {slow} for {name} ({arch}): the kernel would be silently slow{where}:\n{log}"
            )
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(err, "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompileResult(cubin, log, time.perf_counter() - start)


def _program_log(prog) -> str:
    nvrtc = _nvrtc()
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\x00").decode(errors="replace")
