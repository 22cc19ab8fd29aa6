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

from jitgemm import compiler, kernels
from jitgemm.cache import INDEX_DIR, NVRTC_FILE, KernelCache, index_name
from jitgemm.config import KernelConfig

ROOT = Path(__file__).resolve().parent.parent
SMALL = KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=4)

CHILD = r"""
import hashlib, json, sys
from jitgemm import kernels
from jitgemm.config import KernelConfig
built = kernels.build(KernelConfig.from_dict(json.loads(sys.argv[1])))
with open("/proc/self/maps") as maps:
    loaded = any("libnvrtc" in line for line in maps)
print(json.dumps({"hit": built.cache.hit, "key": built.cache.key, "sha": hashlib.sha256(built.cubin).hexdigest(),
                  "rendered": "jinja2" in sys.modules, "nvrtc": "cuda.bindings.nvrtc" in sys.modules,
                  "loaded": loaded}))
"""


def _fresh_build(root: Path) -> dict:
    env = dict(os.environ, JITGEMM_CACHE_DIR=str(root), PYTHONPATH=child_pythonpath())
    out = subprocess.run(
        [sys.executable, "-c", CHILD, SMALL.to_json()], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    found.pop("loaded")  # see the next test
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
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


NOT_PREDICTED = "NVRTC is not in an NVIDIA wheel or conda environment here: its version is always asked"


def test_the_prediction_is_the_library_cuda_bindings_loads():
    predicted, loaded = _fresh_prediction()
    if predicted is None:
        pytest.skip(NOT_PREDICTED)
    assert predicted == loaded


def test_the_next_fresh_process_does_not_even_load_nvrtc(warm):
    if _fresh_prediction()[0] is None:
        pytest.skip(NOT_PREDICTED)
    root, built = warm
    first = _fresh_build(root)  # NVRTC loaded for its version, remembered for its library file
    assert first["hit"] and first["loaded"] and not first["rendered"]
    (library,) = json.loads((root / NVRTC_FILE).read_text())["libraries"].values()
    assert library["version"] == compiler.nvrtc_version()
    assert (root / NVRTC_FILE).stat().st_mode & 0o777 == 0o600
    second = _fresh_build(root)
    assert second == dict(first, loaded=False)  # the same kernel, found without NVRTC


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


@pytest.fixture
def fake_nvrtc(tmp_path, monkeypatch):
    """A process that has not loaded NVRTC, whose NVRTC library is a file of the test's, and
    whose every load of NVRTC (to learn the version: 13.5) is counted."""
    library = tmp_path / "lib" / "libnvrtc.so.13"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF" + bytes(100))
    loads = []
    monkeypatch.setattr(kernels, "_remembered", {})
    monkeypatch.setattr(compiler, "nvrtc_loaded", lambda: False)
    monkeypatch.setattr(
        compiler, "nvrtc_library", lambda: (str(library), compiler.library_identity(str(library), "1.9"))
    )
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: loads.append(1) or "13.5")
    monkeypatch.setattr(compiler, "loaded_library", lambda: str(library))
    cache = KernelCache(tmp_path / "cache")
    cache.ensure_root()
    return library, loads, cache


def _new_process(monkeypatch):
    monkeypatch.setattr(kernels, "_remembered", {})


def test_the_nvrtc_version_is_remembered_for_its_library_file(fake_nvrtc, monkeypatch):
    library, loads, cache = fake_nvrtc
    assert kernels.lookup_nvrtc_version(cache) == "13.5" and len(loads) == 1
    record = json.loads((cache.root / NVRTC_FILE).read_text())
    assert record["libraries"][str(library)]["version"] == "13.5"
    for _ in range(2):
        _new_process(monkeypatch)
        assert kernels.lookup_nvrtc_version(cache) == "13.5"
    assert len(loads) == 1  # remembered: NVRTC not loaded again


@pytest.mark.parametrize("change", ["rewritten", "touched", "another pathfinder", "another file"])
def test_a_changed_library_is_asked_again(fake_nvrtc, monkeypatch, tmp_path, change):
    library, loads, cache = fake_nvrtc
    kernels.lookup_nvrtc_version(cache)
    if change == "rewritten":
        library.write_bytes(b"\x7fELF" + bytes(200))  # e.g. another NVRTC wheel installed in its place
    elif change == "touched":
        st = library.stat()
        os.utime(library, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    elif change == "another pathfinder":
        monkeypatch.setattr(
            compiler, "nvrtc_library", lambda: (str(library), compiler.library_identity(str(library), "2.0"))
        )
    else:  # the same path, now a symlink to another file
        other = tmp_path / "lib" / "libnvrtc.so.13.9"
        library.rename(other)
        library.symlink_to(other)
    _new_process(monkeypatch)
    assert kernels.lookup_nvrtc_version(cache) == "13.5" and len(loads) == 2  # asked the library again
    _new_process(monkeypatch)
    kernels.lookup_nvrtc_version(cache)
    assert len(loads) == 2  # ... and remembered that


def test_only_a_prediction_the_load_confirmed_is_remembered(fake_nvrtc, monkeypatch, tmp_path):
    library, loads, cache = fake_nvrtc
    monkeypatch.setattr(compiler, "loaded_library", lambda: str(tmp_path / "elsewhere" / "libnvrtc.so.13"))
    kernels.lookup_nvrtc_version(cache)
    assert not (cache.root / NVRTC_FILE).exists()


def test_a_process_that_loaded_nvrtc_asks_it(fake_nvrtc, monkeypatch):
    library, loads, cache = fake_nvrtc
    kernels.lookup_nvrtc_version(cache)
    monkeypatch.setattr(compiler, "nvrtc_loaded", lambda: True)
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: "99.9")  # what the loaded library says wins
    assert kernels.lookup_nvrtc_version(cache) == "99.9"


def _planted(library: Path, version: str) -> bytes:
    """A memo file that would give `version` for `library` (as it is now), were it trusted."""
    identity = compiler.library_identity(str(library), "1.9")
    return json.dumps({"schema": 1, "libraries": {str(library): {"identity": identity, "version": version}}}).encode()


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
def test_a_memo_that_is_not_trusted_is_ignored(fake_nvrtc, monkeypatch, tmp_path, how):
    library, loads, cache = fake_nvrtc
    memo = cache.root / NVRTC_FILE
    data = _planted(library, "12.0")
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
        assert version == "12.0" and loads == []
        return
    assert version == "13.5" and len(loads) == 1  # the library asked, the memo not believed
    if how not in ("a directory",):  # replaced by one of ours (never through the link)
        assert not memo.is_symlink() and json.loads(memo.read_text())["libraries"][str(library)]["version"] == "13.5"
    if how == "symlink":
        assert b"12.0" in target.read_bytes()


def test_clear_removes_the_memo_and_prune_keeps_it(fake_nvrtc):
    library, loads, cache = fake_nvrtc
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
    env = dict(os.environ, PYTHONPATH=child_pythonpath())
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    added = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in added if m in LATER] == []
    assert "jitgemm.api" in added  # the check sees what the import brings
