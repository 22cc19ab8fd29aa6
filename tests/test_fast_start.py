"""A fresh process finds a cached kernel without rendering or importing NVRTC's bindings (issue
18, fast start): through the cache's index, which is a hint that can only cost a render."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from child_process import child_pythonpath

from jitgemm import kernels
from jitgemm.cache import INDEX_DIR, KernelCache, index_name
from jitgemm.config import KernelConfig

ROOT = Path(__file__).resolve().parent.parent
SMALL = KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=4)

CHILD = r"""
import hashlib, json, sys
from jitgemm import kernels
from jitgemm.config import KernelConfig
built = kernels.build(KernelConfig.from_dict(json.loads(sys.argv[1])))
print(json.dumps({"hit": built.cache.hit, "key": built.cache.key, "sha": hashlib.sha256(built.cubin).hexdigest(),
                  "rendered": "jinja2" in sys.modules, "nvrtc": "cuda.bindings.nvrtc" in sys.modules}))
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
    assert found == {
        "hit": True,
        "key": built.cache.key,
        "sha": hashlib.sha256(built.cubin).hexdigest(),
        "rendered": False,
        "nvrtc": False,
    }


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
