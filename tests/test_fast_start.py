"""A fresh process finds a cached kernel without rendering, importing NVRTC's bindings or loading
NVRTC (issue 18, fast start): through the cache's index, which is a hint that can only cost a
render, and the memo of its NVRTC library's version, which can only cost loading NVRTC."""

import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from child_process import child_pythonpath

from jitgemm import compiler, kernels, staging
from jitgemm.cache import INDEX_DIR, NVRTC_FILE, KernelCache, index_name
from jitgemm.config import KernelConfig

ROOT = Path(__file__).resolve().parent.parent
SMALL = KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=4)

CHILD = r"""
import hashlib, json, sys
from jitgemm import compiler, kernels
from jitgemm.config import KernelConfig
searched, search = [], compiler.nvrtc_library
compiler.nvrtc_library = lambda: searched.append(1) or search()  # cuda.pathfinder's own search
built = kernels.build(KernelConfig.from_dict(json.loads(sys.argv[1])))
with open("/proc/self/maps") as maps:
    loaded = any("libnvrtc" in line for line in maps)
print(json.dumps({"hit": built.cache.hit, "key": built.cache.key, "sha": hashlib.sha256(built.cubin).hexdigest(),
                  "rendered": "jinja2" in sys.modules, "nvrtc": "cuda.bindings.nvrtc" in sys.modules,
                  "loaded": loaded, "searched": bool(searched)}))
"""


def _child_json(code: str, *args: str, **env: str):
    """The last line a fresh interpreter running `code` with `args` prints, as JSON (this
    checkout's jitgemm; the environment, plus `env`)."""
    env = dict(os.environ, PYTHONPATH=child_pythonpath(), **env)
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fresh_build(root: Path) -> dict:
    return _child_json(CHILD, SMALL.to_json(), JITGEMM_CACHE_DIR=str(root))


@pytest.fixture
def warm(tmp_path):
    """A cache holding SMALL's kernel, built (and indexed) in this process."""
    root = tmp_path / "cache"
    built = kernels.build(SMALL, KernelCache(root))
    assert not built.cache.hit
    return root, built


def test_a_fresh_process_finds_the_kernel_without_rendering_or_nvrtc_bindings(warm):
    root, built = warm
    (index,) = (root / INDEX_DIR).iterdir()
    assert json.loads(index.read_text())["keys"] == {kernels.compiler.nvrtc_version(): built.cache.key}
    found = _fresh_build(root)
    found.pop("loaded"), found.pop("searched")  # see the next test
    assert found == {
        "hit": True,
        "key": built.cache.key,
        "sha": hashlib.sha256(built.cubin).hexdigest(),
        "rendered": False,
        "nvrtc": False,
    }


@functools.cache
def _fresh_prediction() -> tuple:
    """(the file compiler.nvrtc_library predicts, the file cuda.bindings loads NVRTC from) in a
    fresh process, where nothing has loaded NVRTC yet (the first None where it cannot predict)."""
    code = (
        "import json, os; from jitgemm import compiler; lib = compiler.nvrtc_library(); "
        "from cuda.bindings import nvrtc; nvrtc.nvrtcVersion(); "
        "from cuda.pathfinder import load_nvidia_dynamic_lib; "
        "print(json.dumps([lib and lib[1]['file'], os.path.realpath(load_nvidia_dynamic_lib('nvrtc').abs_path)]))"
    )
    return tuple(_child_json(code))


NOT_PREDICTED = "NVRTC is not in an NVIDIA wheel or conda environment here: its version is always asked"


def test_the_prediction_is_the_library_cuda_bindings_loads():
    predicted, loaded = _fresh_prediction()
    if predicted is None:
        pytest.skip(NOT_PREDICTED)
    assert predicted == loaded


def test_a_fresh_process_finds_the_kernel_without_loading_nvrtc(warm):
    if _fresh_prediction()[0] is None:
        pytest.skip(NOT_PREDICTED)
    root, built = warm
    memo = root / NVRTC_FILE
    (library,) = json.loads(memo.read_text())["libraries"].values()  # written by the build that compiled
    assert library["version"] == compiler.nvrtc_version() and memo.stat().st_mode & 0o777 == 0o600
    found = _fresh_build(root)
    assert found["hit"] and found["key"] == built.cache.key and not found["rendered"]
    assert not found["loaded"]  # libnvrtc not even mapped
    assert not found["searched"]  # nor cuda.pathfinder's search run (compiler.search_inputs matched)
    memo.unlink()
    assert _fresh_build(root) == dict(found, loaded=True, searched=True)  # asks NVRTC, remembers its answer
    assert _fresh_build(root) == found


STAGING_CHILD = r"""
import json
from jitgemm import staging
built = staging.KERNEL.build("sm_90a")
with open("/proc/self/maps") as maps:
    loaded = any("libnvrtc" in line for line in maps)
print(json.dumps({"hit": built.hit, "key": built.key, "loaded": loaded}))
"""


def test_a_fresh_process_finds_the_staging_kernel_without_loading_nvrtc(warm, monkeypatch):
    if _fresh_prediction()[0] is None:
        pytest.skip(NOT_PREDICTED)
    root, _ = warm  # the memo of the NVRTC version is there
    monkeypatch.setenv("JITGEMM_CACHE_DIR", str(root))
    built = staging.KERNEL.build("sm_90a")
    assert _child_json(STAGING_CHILD) == {"hit": True, "key": built.key, "loaded": False}


def _other_config_entry(root: Path) -> str:
    return kernels.build(KernelConfig(**{**SMALL.to_dict(), "num_stages": 5}), KernelCache(root)).cache.key


@pytest.mark.parametrize("how", ["other config", "missing key", "not json", "not a key", "group-writable", "symlink"])
def test_a_tampered_index_falls_back_to_rendering(warm, how):
    root, built = warm
    other = _other_config_entry(root) if how == "other config" else None
    options = kernels.compiler.options_for(SMALL.arch)
    index = root / INDEX_DIR / f"{index_name(SMALL.to_json(), SMALL.arch, options, kernels.code_fingerprint())}.json"
    record = json.loads(index.read_text())
    version = kernels.compiler.nvrtc_version()
    if how == "other config":  # names an intact entry, but of another config: its meta does not match
        record["keys"][version] = other
    elif how == "missing key":
        record["keys"][version] = "0" * 64
    elif how == "not a key":
        record["keys"][version] = "../" + built.cache.key
    if how == "not json":
        index.write_bytes(b"{not json")
    else:
        index.write_text(json.dumps(record))
    if how == "group-writable":
        index.chmod(0o660)
    if how == "symlink":
        target = root.parent / "planted.json"
        index.rename(target)
        index.symlink_to(target)
    assert kernels._find_indexed(SMALL, KernelCache(root)) is None
    found = _fresh_build(root)
    assert found["hit"] and found["key"] == built.cache.key and found["rendered"]  # the usual path, the right kernel
    if how not in ("group-writable", "symlink"):  # the usual path wrote the index again
        assert kernels._find_indexed(SMALL, KernelCache(root)).cache.key == built.cache.key


def test_a_stale_code_fingerprint_misses_the_index(warm, monkeypatch):
    root, built = warm
    assert kernels._find_indexed(SMALL, KernelCache(root)).cache.key == built.cache.key
    monkeypatch.setattr(kernels, "code_fingerprint", lambda: "another jitgemm")
    assert kernels._find_indexed(SMALL, KernelCache(root)) is None
    assert kernels.build(SMALL, KernelCache(root)).cache.hit  # rendered, found by its key


def test_another_nvrtc_misses_the_index(warm, monkeypatch):
    root, built = warm
    monkeypatch.setattr(kernels.compiler, "nvrtc_version", lambda: "99.9")
    assert kernels._find_indexed(SMALL, KernelCache(root)) is None


def test_clear_removes_the_index(warm):
    root, _ = warm
    KernelCache(root).clear()
    assert not (root / INDEX_DIR).exists()


# ---- the memo of the NVRTC version (kernels.lookup_nvrtc_version, cache.NVRTC_FILE) ----

OTHER_UID = 12345
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


class FakeNvrtc:
    """compiler's view of NVRTC, faked: the library is a file of the test's (`path`, version
    13.5), which nvrtc_library predicts in a process that has not loaded it and which loading
    finds (unless `loaded_from` says otherwise); loads are counted, and `new_process` forgets
    what a process knows."""

    def __init__(self, path: Path, monkeypatch):
        self.path, self.loaded_from, self.finder, self.version = path, path, "1.9", "13.5"
        self.loads, self.loaded, self.monkeypatch = 0, False, monkeypatch
        monkeypatch.setattr(compiler, "nvrtc_loaded", lambda: self.loaded)
        monkeypatch.setattr(compiler, "nvrtc_version", self.nvrtc_version)
        monkeypatch.setattr(compiler, "nvrtc_library", lambda: None if self.loaded else self.identity())
        monkeypatch.setattr(compiler, "loaded_library", lambda: self.identity() if self.loaded_from == path else None)
        # what cuda.pathfinder's search reads: here its version stands for all of it
        monkeypatch.setattr(compiler, "search_inputs", lambda: {"pathfinder": self.finder})
        monkeypatch.setattr(compiler, "mapped_nvrtc", lambda: [str(path)] if self.loaded else [])
        monkeypatch.setattr(compiler, "mapped_nvrtc_version", lambda mapped: None)  # its own test below
        self.new_process()

    def identity(self) -> tuple:
        return str(self.path), compiler.library_identity(str(self.path), self.finder)

    def nvrtc_version(self) -> str:
        if not self.loaded:
            self.loaded, self.loads = True, self.loads + 1
        return self.version

    def new_process(self) -> None:
        self.loaded = False
        self.monkeypatch.setattr(kernels, "_remembered", {})


@pytest.fixture
def fake_nvrtc(tmp_path, monkeypatch):
    library = tmp_path / "lib" / "libnvrtc.so.13"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF" + bytes(100))
    cache = KernelCache(tmp_path / "cache")
    cache.ensure_root()
    return FakeNvrtc(library, monkeypatch), cache


def test_the_nvrtc_version_is_remembered_for_its_library_file(fake_nvrtc):
    nvrtc, cache = fake_nvrtc
    assert kernels.lookup_nvrtc_version(cache) == "13.5" and nvrtc.loads == 1
    record = json.loads((cache.root / NVRTC_FILE).read_text())
    assert record["libraries"][str(nvrtc.path)]["version"] == "13.5"
    for _ in range(2):
        nvrtc.new_process()
        assert kernels.lookup_nvrtc_version(cache) == "13.5" and not nvrtc.loaded
    assert nvrtc.loads == 1  # remembered: NVRTC not loaded again


@pytest.mark.parametrize("change", ["rewritten", "touched", "another pathfinder", "another file"])
def test_a_changed_library_is_asked_again(fake_nvrtc, tmp_path, change):
    nvrtc, cache = fake_nvrtc
    kernels.lookup_nvrtc_version(cache)
    if change == "rewritten":
        nvrtc.path.write_bytes(b"\x7fELF" + bytes(200))  # e.g. another NVRTC wheel installed in its place
    elif change == "touched":
        st = nvrtc.path.stat()
        os.utime(nvrtc.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    elif change == "another pathfinder":
        nvrtc.finder = "2.0"
    else:  # the same path, now a symlink to another file
        other = tmp_path / "lib" / "libnvrtc.so.13.9"
        nvrtc.path.rename(other)
        nvrtc.path.symlink_to(other)
    nvrtc.new_process()
    assert kernels.lookup_nvrtc_version(cache) == "13.5" and nvrtc.loads == 2  # asked the library again
    nvrtc.new_process()
    kernels.lookup_nvrtc_version(cache)
    assert nvrtc.loads == 2  # ... and remembered its answer


def test_unchanged_search_inputs_find_the_version_without_cuda_pathfinder(fake_nvrtc, monkeypatch):
    nvrtc, cache = fake_nvrtc
    kernels.lookup_nvrtc_version(cache)
    nvrtc.new_process()

    def no_pathfinder():
        raise AssertionError("cuda.pathfinder asked")

    monkeypatch.setattr(compiler, "nvrtc_library", no_pathfinder)
    assert kernels.lookup_nvrtc_version(cache) == "13.5" and nvrtc.loads == 1


@pytest.mark.parametrize("change", ["search inputs", "mapped already", "file touched"])
def test_the_search_shortcut_asks_again_when(fake_nvrtc, monkeypatch, change):
    nvrtc, cache = fake_nvrtc
    kernels.lookup_nvrtc_version(cache)
    nvrtc.new_process()
    asked = []
    monkeypatch.setattr(compiler, "nvrtc_library", lambda: asked.append(1) or nvrtc.identity())
    if change == "search inputs":  # e.g. a wheel installed, another venv or conda prefix
        monkeypatch.setattr(compiler, "search_inputs", lambda: {"pathfinder": nvrtc.finder, "other": 1})
    elif change == "mapped already":  # torch (say) loaded a libnvrtc first: cuda.pathfinder returns that one
        monkeypatch.setattr(compiler, "mapped_nvrtc", lambda: ["/elsewhere/libnvrtc.so.13"])
    else:
        st = nvrtc.path.stat()
        os.utime(nvrtc.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    kernels.lookup_nvrtc_version(cache)
    assert asked  # the shortcut declined; cuda.pathfinder's own search decided


def test_search_inputs_are_stable_and_stored_as_read():
    compiler.search_inputs.cache_clear()
    first = compiler.search_inputs()
    compiler.search_inputs.cache_clear()
    assert first is not None and compiler.search_inputs() == first == json.loads(json.dumps(first))


def test_a_mapped_nvrtc_is_asked_directly():
    """The version of an NVRTC another library loaded (torch does at CUDA init) comes from that
    library, as cuda.pathfinder would hand it to cuda.bindings; none mapped: not known."""
    code = (
        "import json, ctypes; from jitgemm import compiler; "
        "before = [compiler.mapped_nvrtc(), compiler.mapped_nvrtc_version(compiler.mapped_nvrtc())]; "
        "from cuda.pathfinder import load_nvidia_dynamic_lib; "
        "ctypes.CDLL(load_nvidia_dynamic_lib('nvrtc').abs_path); "
        "print(json.dumps(before + [compiler.mapped_nvrtc_version(compiler.mapped_nvrtc()), compiler.nvrtc_version()]))"
    )
    mapped_before, version_before, mapped_version, version = _child_json(code)
    assert mapped_before == [] and version_before is None and mapped_version == version


def test_a_library_loaded_from_elsewhere_is_not_remembered(fake_nvrtc, tmp_path):
    # cuda.pathfinder loaded another file than the one nvrtc_library names (torch had loaded
    # its own, or its search order changed): nothing is recorded for the file named.
    nvrtc, cache = fake_nvrtc
    nvrtc.loaded_from = tmp_path / "elsewhere" / "libnvrtc.so.13"
    kernels.lookup_nvrtc_version(cache)
    assert not (cache.root / NVRTC_FILE).exists()


def test_only_the_file_nvrtc_library_names_is_offered_for_the_memo(tmp_path, monkeypatch):
    library = tmp_path / "libnvrtc.so.13.5"
    library.write_bytes(b"\x7fELF")
    link = tmp_path / "libnvrtc.so.13"
    link.symlink_to(library)
    named = (str(link), compiler.library_identity(str(link), "1.9"))
    monkeypatch.setattr(compiler, "_packaged_library", lambda: named)
    for loaded, offered in ((str(link), named), (str(library), named), (str(tmp_path / "other.so"), None)):
        monkeypatch.setattr(compiler, "_loaded", lambda loaded=loaded: ("13.5", loaded))
        assert compiler.loaded_library() == offered, loaded


def test_a_process_that_loaded_nvrtc_asks_it(fake_nvrtc, tmp_path):
    nvrtc, cache = fake_nvrtc
    kernels.lookup_nvrtc_version(cache)  # remembered: 13.5
    nvrtc.new_process()
    nvrtc.loaded, nvrtc.version = True, "13.6"  # e.g. loaded by torch before the first gemm
    nvrtc.loaded_from = tmp_path / "torch" / "libnvrtc.so.13"
    assert kernels.lookup_nvrtc_version(cache) == "13.6"


def test_the_build_that_compiles_remembers_the_version(fake_nvrtc, monkeypatch, tmp_path):
    nvrtc, _ = fake_nvrtc
    cache = KernelCache(tmp_path / "new")  # made by the compile, after the index lookup
    monkeypatch.setattr(compiler, "compile_cubin", lambda *args, **kwargs: compiler.CompileResult(b"cubin", "", 0.0))
    assert not kernels.build(SMALL, cache).cache.hit
    record = json.loads((cache.root / NVRTC_FILE).read_text())
    assert record["libraries"][str(nvrtc.path)]["version"] == "13.5" and nvrtc.loads == 1


def _planted(nvrtc: FakeNvrtc, version: str) -> bytes:
    """A memo file that would give `version` for the library (as it is now), were it trusted."""
    path, identity = nvrtc.identity()
    return json.dumps({"schema": 1, "libraries": {path: {"identity": identity, "version": version}}}).encode()


@pytest.mark.parametrize(
    "how",
    [
        "trusted",
        "not json",
        "not a version",
        "other schema",
        "group-writable",
        "symlink",
        "a directory",
        pytest.param("other owner", marks=AS_ROOT),
    ],
)
def test_a_memo_that_is_not_trusted_is_ignored(fake_nvrtc, tmp_path, how):
    nvrtc, cache = fake_nvrtc
    memo = cache.root / NVRTC_FILE
    data = _planted(nvrtc, "12.0")
    if how == "not json":
        data = b"{not json"
    elif how == "not a version":
        data = data.replace(b'"12.0"', b'"../12.0"')
    elif how == "other schema":
        data = data.replace(b'"schema": 1', b'"schema": 2')
    if how == "symlink":
        target = tmp_path / "planted.json"
        target.write_bytes(data)
        target.chmod(0o600)
        memo.symlink_to(target)
    elif how == "a directory":
        memo.mkdir()
    else:
        memo.write_bytes(data)
        memo.chmod(0o620 if how == "group-writable" else 0o600)
    if how == "other owner":
        os.chown(memo, OTHER_UID, OTHER_UID)
    version = kernels.lookup_nvrtc_version(cache)
    if how == "trusted":  # the planted file as it would be read were it not tampered with
        assert version == "12.0" and nvrtc.loads == 0
        return
    assert version == "13.5" and nvrtc.loads == 1  # the library asked, the memo not believed
    if how not in ("a directory",):  # replaced by one of ours (never through the link)
        assert not memo.is_symlink() and json.loads(memo.read_text())["libraries"][str(nvrtc.path)]["version"] == "13.5"
    if how == "symlink":
        assert b"12.0" in target.read_bytes()


def test_clear_removes_the_memo_and_prune_keeps_it(fake_nvrtc):
    nvrtc, cache = fake_nvrtc
    kernels.lookup_nvrtc_version(cache)
    cache.prune(older_than=0)
    assert (cache.root / NVRTC_FILE).exists()
    assert cache.clear() == (0, [])
    assert not (cache.root / NVRTC_FILE).exists()


# ---- what `import jitgemm` leaves for later ----

# Not needed by `import jitgemm`, nor by a first gemm on a warm cache: rendering, compiling, the
# CLI, the tuner, writing-only helpers. The arch backends and their heuristics come with the
# first selection (jitgemm.registry).
LATER = (
    "jinja2",
    "click",
    "tqdm",
    "filelock",
    "platformdirs",
    "secrets",
    "importlib.resources",
    "cuda.bindings.nvrtc",
    "jitgemm.cli",
    "jitgemm.tuning",
    "jitgemm.archs.sm90.arch",
    "jitgemm.archs.sm100.arch",
    "jitgemm.heuristics.sm90",
    "jitgemm.heuristics.sm100",
)


def test_import_leaves_for_later_what_it_does_not_need():
    # What jitgemm adds to a process that has imported NumPy and the driver bindings (which
    # every call needs, and which import cuda.pathfinder and much of the standard library).
    code = (
        "import json, sys, numpy, cuda.bindings.driver; before = set(sys.modules); import jitgemm; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    added = _child_json(code)
    assert [m for m in added if m in LATER] == []
    assert "jitgemm.api" in added  # the check sees what the import brings
