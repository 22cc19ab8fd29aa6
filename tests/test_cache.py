"""CPU tests of the disk cache: keys, publishing, concurrency, integrity, trust and offline mode."""

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from jitgemm import cache as cache_mod
from jitgemm import compiler, kernels
from jitgemm.cache import (
    CACHE_SCHEMA,
    CUBIN_FILE,
    INDEX_DIR,
    META_FILE,
    NVRTC_FILE,
    SOURCE_FILE,
    CacheWarning,
    KernelCache,
    OfflineError,
    cache_key,
)
from jitgemm.config import KernelConfig
from jitgemm.problem import Problem

# Small enough to compile in a fraction of a second.
SMALL = KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=4)
OTHER_UID = 12345
ELF_MAGIC = b"\x7fELF"
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


def fake_compiler(cubin=b"\x7fELF fake cubin", delay=0.0):
    """A compile_fn stand-in that counts its calls (for behaviour that needs no real NVRTC)."""
    calls = []

    def compile_fn(source_path):
        calls.append(source_path)
        time.sleep(delay)
        return SimpleNamespace(cubin=cubin, seconds=delay)

    compile_fn.calls = calls
    return compile_fn


def fake_get(cache, compile_fn, source="// kernel source"):
    return cache.get_or_compile(source, "sm_90a", ("-O3",), "13.0", {"kernel": "k"}, compile_fn)


def cache_warnings(records):
    return [w for w in records if issubclass(w.category, CacheWarning)]


def leftovers(root: Path):
    return [p.name for p in root.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A cache holding SMALL's entry, built once; tests copy it."""
    root = tmp_path_factory.mktemp("seeded") / "cache"
    built = kernels.build(SMALL, KernelCache(root))
    assert not built.cache.hit and built.cache.path is not None
    return SimpleNamespace(root=root, key=built.cache.key, cubin=built.cubin)


@pytest.fixture
def warm_cache(tmp_cache, seeded):
    shutil.copytree(seeded.root, tmp_cache, symlinks=True)
    return tmp_cache


@pytest.fixture
def no_compile(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("NVRTC was called")

    monkeypatch.setattr(compiler, "compile_cubin", refuse)


# ---- keys ----


def test_key_is_the_same_across_processes_and_hash_seeds(seeded, tmp_path):
    script = (
        "from jitgemm import kernels; from jitgemm.config import KernelConfig; "
        "print(kernels.prepare(KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=4)).key)"
    )
    keys = set()
    for seed in ("0", "1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
        )
        keys.add(out.stdout.strip())
    assert keys == {seeded.key}
    assert len(seeded.key) == 64 and int(seeded.key, 16) >= 0


@pytest.mark.parametrize("change", ["source", "options", "arch", "nvrtc", "schema"])
def test_key_changes_with_each_input(change):
    base = dict(source="src", options=("-O3", "--std=c++17"), arch="sm_90a", nvrtc_version="13.0", schema=CACHE_SCHEMA)
    changed = dict(base)
    changed.update(
        {
            "source": {"source": "src "},
            "options": {"options": ("-O3",)},
            "arch": {"arch": "sm_100a"},
            "nvrtc": {"nvrtc_version": "13.1"},
            "schema": {"schema": CACHE_SCHEMA + 1},
        }[change]
    )
    assert cache_key(**base) == cache_key(**base)
    assert cache_key(**changed) != cache_key(**base)


def test_parts_cannot_run_into_each_other():
    # Moving bytes between neighbouring parts must change the key (length-prefixed parts).
    assert cache_key("b", ("a",), "sm_90a", "13.0") != cache_key("", ("ab",), "sm_90a", "13.0")


def test_kernel_key_follows_nvrtc_version_options_and_schema(monkeypatch):
    key = kernels.prepare(SMALL).key
    assert kernels.prepare(KernelConfig(**{**SMALL.to_dict(), "num_stages": 5})).key != key
    with monkeypatch.context() as m:
        m.setattr(compiler, "nvrtc_version", lambda: "99.9")
        assert kernels.prepare(SMALL).key != key
    with monkeypatch.context() as m:
        m.setattr(compiler, "options_for", lambda arch: ("-G", f"--gpu-architecture={arch}"))
        assert kernels.prepare(SMALL).key != key
    with monkeypatch.context() as m:
        m.setattr(cache_mod, "CACHE_SCHEMA", CACHE_SCHEMA + 1)
        assert kernels.prepare(SMALL).key != key
    assert kernels.prepare(SMALL).key == key


# ---- entries and publishing ----


def test_entry_is_a_private_directory_of_source_cubin_and_json(tmp_cache, seeded):
    built = kernels.build(SMALL)  # empty root: compiles and publishes
    root = tmp_cache
    entry = root / built.cache.key
    assert not built.cache.hit and built.cache.path == entry
    assert stat.S_IMODE(os.lstat(root).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(entry).st_mode) == 0o700
    assert sorted(p.name for p in entry.iterdir()) == sorted([SOURCE_FILE, CUBIN_FILE, META_FILE])
    for p in entry.iterdir():
        assert stat.S_IMODE(os.lstat(p).st_mode) & 0o077 == 0
    cubin = (entry / CUBIN_FILE).read_bytes()
    assert cubin == built.cubin == seeded.cubin and cubin.startswith(ELF_MAGIC)
    meta = json.loads((entry / META_FILE).read_text())
    assert meta["key"] == built.cache.key
    assert KernelConfig.from_dict(meta["config"]) == SMALL
    assert meta["arch"] == "sm_90a" and meta["nvrtc_version"] == compiler.nvrtc_version()
    assert meta["cubin_sha256"] == hashlib.sha256(cubin).hexdigest()
    assert meta["cubin_bytes"] == len(cubin)
    assert meta["source_bytes"] == len((entry / SOURCE_FILE).read_bytes())
    assert meta["compile_seconds"] > 0 and abs(meta["created"] - time.time()) < 600
    assert leftovers(root) == []

    again = kernels.build(SMALL)
    assert again.cache.hit and again.cubin == built.cubin and again.cache.compile_seconds == 0.0


def test_threads_compile_a_key_once(tmp_path):
    cache = KernelCache(tmp_path / "c")
    compile_fn = fake_compiler(delay=0.3)
    results = []
    threads = [threading.Thread(target=lambda: results.append(fake_get(cache, compile_fn))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(compile_fn.calls) == 1
    assert len(results) == 8 and sum(not r.hit for r in results) == 1
    assert {r.cubin for r in results} == {b"\x7fELF fake cubin"}
    assert leftovers(cache.root) == []


CHILD = r"""
import json, hashlib, os, sys, time
from pathlib import Path
from jitgemm import kernels
from jitgemm.config import KernelConfig
sync = Path(sys.argv[1]); me = sys.argv[2]
(sync / f"ready-{me}").touch()
while not (sync / "go").exists():
    time.sleep(0.002)
built = kernels.build(KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=4))
print(json.dumps({"hit": built.cache.hit, "key": built.cache.key, "path": str(built.cache.path),
                  "sha": hashlib.sha256(built.cubin).hexdigest()}))
"""


@pytest.mark.slow  # 16 interpreters; test_threads_compile_a_key_once and the race tests stay fast
def test_16_processes_publish_one_entry(tmp_cache, tmp_path):
    sync = tmp_path / "sync"
    sync.mkdir()
    env = dict(os.environ, JITGEMM_CACHE_DIR=str(tmp_cache))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(sync), str(i)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(16)
    ]
    try:
        deadline = time.time() + 240
        while len(list(sync.glob("ready-*"))) < 16:
            assert time.time() < deadline, "children did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.01)
        (sync / "go").touch()
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * 16, [err for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]
    keys = {r["key"] for r in results}
    assert len(keys) == 1
    key = keys.pop()
    entries = [
        p.name for p in tmp_cache.iterdir() if not p.name.startswith(".") and p.name not in (INDEX_DIR, NVRTC_FILE)
    ]
    assert entries == [key]
    assert len(list((tmp_cache / INDEX_DIR).iterdir())) == 1  # the kernel's index entry
    on_disk = hashlib.sha256((tmp_cache / key / CUBIN_FILE).read_bytes()).hexdigest()
    assert {r["sha"] for r in results} == {on_disk}
    assert {r["path"] for r in results} == {str(tmp_cache / key)}
    assert sum(not r["hit"] for r in results) == 1, "the lock should let exactly one process compile"
    assert leftovers(tmp_cache) == []
    assert KernelCache(tmp_cache).verify()[0][1] is None


def test_losing_a_publish_race_is_a_success(tmp_path):
    winner = KernelCache(tmp_path / "winner")
    fake_get(winner, fake_compiler())
    cache = KernelCache(tmp_path / "c")
    key = cache_key("// kernel source", ("-O3",), "sm_90a", "13.0")

    def compile_and_lose(source_path):
        # Another writer (one not holding our lock) publishes the key while we compile.
        shutil.copytree(winner.entry_dir(key), cache.entry_dir(key))
        return SimpleNamespace(cubin=b"\x7fELF fake cubin", seconds=0.1)

    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        result = fake_get(cache, compile_and_lose)
    assert result.path == cache.entry_dir(key) and not result.hit
    assert leftovers(cache.root) == []
    assert fake_get(cache, fake_compiler()).hit


def test_a_failed_compile_leaves_its_source_where_the_error_says(tmp_path):
    cache = KernelCache(tmp_path / "c")

    def broken(source_path):
        raise compiler.CompileError(f"NVRTC failed (rendered source: {source_path})")

    with pytest.raises(compiler.CompileError) as info:
        fake_get(cache, broken, source="int broken(")
    path = Path(str(info.value).split("rendered source: ")[1].rstrip(")"))
    assert path.read_text() == "int broken("
    assert path.parent == cache.root / "failed"
    assert leftovers(cache.root) == [] and cache.entries() == []


# ---- integrity ----


def _truncate(p):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _zero(p):
    p.write_bytes(bytes(p.stat().st_size))


def _flip(p):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x10
    p.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated": lambda e: _truncate(e / CUBIN_FILE),
    "zero-filled": lambda e: _zero(e / CUBIN_FILE),
    "bit-flipped": lambda e: _flip(e / CUBIN_FILE),
    "cubin-missing": lambda e: (e / CUBIN_FILE).unlink(),
    "meta-missing": lambda e: (e / META_FILE).unlink(),
    "meta-garbled": lambda e: (e / META_FILE).write_text("{not json"),
    "meta-nested-too-deeply": lambda e: (e / META_FILE).write_text("[" * 100000 + "]" * 100000),
}


@pytest.mark.parametrize("damage", sorted(CORRUPTIONS))
def test_a_damaged_entry_is_detected_rebuilt_and_reported_once(warm_cache, seeded, damage):
    entry = warm_cache / seeded.key
    CORRUPTIONS[damage](entry)
    bad = [(e.key, why) for e, why in KernelCache(warm_cache).verify() if why]
    assert [k for k, _ in bad] == [seeded.key]
    assert KernelCache(warm_cache).lookup(seeded.key).status == "corrupt"

    with pytest.warns(CacheWarning) as records:
        built = kernels.build(SMALL)
    assert not built.cache.hit and built.cache.path == entry
    reports = cache_warnings(records)
    assert len(reports) == 1 and seeded.key in str(reports[0].message) and "corrupt" in str(reports[0].message)
    assert (entry / CUBIN_FILE).read_bytes() == seeded.cubin == built.cubin  # bit-identical rebuild
    assert [why for _, why in KernelCache(warm_cache).verify()] == [None]
    assert leftovers(warm_cache) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert kernels.build(SMALL).cache.hit


def test_verify_rederives_the_key_from_the_stored_source(warm_cache, seeded):
    entry = warm_cache / seeded.key
    (entry / SOURCE_FILE).write_text((entry / SOURCE_FILE).read_text() + "\n// edited")
    # A load only needs the cubin, which is intact; verify also checks the source against the key.
    assert KernelCache(warm_cache).lookup(seeded.key).status == "hit"
    [(info, why)] = KernelCache(warm_cache).verify()
    assert info.key == seeded.key and "key" in why


# ---- trust and unwritable roots ----


def _make_group_writable(root):
    root.mkdir(mode=0o700)
    os.chmod(root, 0o770)
    return "writable by group or others"


def _make_other_owned(root):
    root.mkdir(mode=0o700)
    os.chown(root, OTHER_UID, OTHER_UID)
    return f"owned by uid {OTHER_UID}"


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_make_group_writable, id="group-writable"),
        pytest.param(_make_other_owned, id="other-owner", marks=AS_ROOT),
    ],
)
def test_an_untrusted_root_is_not_used_and_compiles_in_memory(tmp_cache, make):
    why = make(tmp_cache)
    with pytest.warns(CacheWarning) as records:
        first = kernels.build(SMALL)
        second = kernels.build(SMALL)
    for built in (first, second):
        assert built.cache.path is None and not built.cache.hit and built.cubin.startswith(ELF_MAGIC)
    reports = cache_warnings(records)
    assert len(reports) == 1 and why in str(reports[0].message) and str(tmp_cache) in str(reports[0].message)
    assert list(tmp_cache.iterdir()) == []


@AS_ROOT
def test_an_untrusted_root_hides_its_entries(warm_cache, seeded, no_compile):
    os.chown(warm_cache, OTHER_UID, OTHER_UID)
    assert KernelCache(warm_cache).lookup(seeded.key).status == "unsafe"
    os.chown(warm_cache, os.geteuid(), os.getegid())
    assert KernelCache(warm_cache).lookup(seeded.key).status == "hit"


@pytest.fixture
def as_other_user(monkeypatch):
    """This process seen as another user, and the files' real owner as root (SHARED_OWNER_UID):
    a cache "built as root" used by someone else, faked so it also runs without root."""
    owner = os.geteuid()
    monkeypatch.setattr(cache_mod, "SHARED_OWNER_UID", owner)
    monkeypatch.setattr(os, "geteuid", lambda: OTHER_UID if owner != OTHER_UID else OTHER_UID + 1)


def _read_only_tree(root):
    os.chmod(root, 0o755)
    for entry in root.iterdir():
        if entry.is_dir():
            os.chmod(entry, 0o755)


def test_a_root_owned_cache_is_read_but_never_written_by_another_user(
    warm_cache, seeded, as_other_user, no_compile, monkeypatch
):
    _read_only_tree(warm_cache)
    before = sorted(p.name for p in warm_cache.iterdir())
    stamp = (warm_cache / seeded.key).stat().st_mtime_ns
    time.sleep(0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a trusted shared cache: no warning for a hit
        built = kernels.build(SMALL)
    assert built.cache.hit and built.cubin == seeded.cubin
    assert (warm_cache / seeded.key).stat().st_mtime_ns == stamp  # its last-use time is not written either
    monkeypatch.setenv("JITGEMM_OFFLINE", "1")
    assert kernels.build(SMALL).cache.hit
    monkeypatch.delenv("JITGEMM_OFFLINE")
    compile_fn = fake_compiler()
    with pytest.warns(CacheWarning, match="shared cache owned by root, read-only for you") as records:
        first = fake_get(KernelCache(warm_cache), compile_fn)
        second = fake_get(KernelCache(warm_cache), compile_fn)
    assert len(cache_warnings(records)) == 1 and len(compile_fn.calls) == 2  # compiled in memory
    assert first.path is None and not first.hit and second.path is None
    assert sorted(p.name for p in warm_cache.iterdir()) == before  # no entry, lock or temporary dir
    assert [e.key for e in KernelCache(warm_cache).entries()] == [seeded.key]
    for cleanup in (KernelCache(warm_cache).clear, KernelCache(warm_cache).prune):
        with pytest.raises(cache_mod.UnsafeError, match="owned by root"):
            cleanup()
    assert sorted(p.name for p in warm_cache.iterdir()) == before


@pytest.mark.parametrize("where", ["root", "entry"])
def test_a_root_owned_cache_writable_by_others_is_refused(warm_cache, seeded, as_other_user, where):
    _read_only_tree(warm_cache)
    os.chmod(warm_cache if where == "root" else warm_cache / seeded.key, 0o775)
    assert KernelCache(warm_cache).lookup(seeded.key).status == "unsafe"


@pytest.fixture
def read_only_root(tmp_cache):
    """A really read-only root: mode 0500 for a user; root ignores modes, so chattr +i for root."""
    tmp_cache.mkdir(mode=0o700)
    if os.geteuid() != 0:
        os.chmod(tmp_cache, 0o500)
        yield tmp_cache
        os.chmod(tmp_cache, 0o700)
        return
    if (
        shutil.which("chattr") is None
        or subprocess.run(["chattr", "+i", str(tmp_cache)], capture_output=True).returncode != 0
    ):
        pytest.skip("chattr +i is not available here (the mocked read-only tests still run)")
    yield tmp_cache
    subprocess.run(["chattr", "-i", str(tmp_cache)], check=True)


def test_a_read_only_root_compiles_in_memory_with_one_warning(read_only_root):
    with pytest.warns(CacheWarning) as records:
        first = kernels.build(SMALL)
        second = kernels.build(SMALL)
    for built in (first, second):
        assert built.cache.path is None and built.cubin.startswith(ELF_MAGIC)
    reports = cache_warnings(records)
    assert len(reports) == 1 and "cannot be written" in str(reports[0].message)
    assert list(read_only_root.iterdir()) == []


def _mkdtemp_read_only(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")


def _write_disk_full(path, data):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("failure", ["read-only", "disk-full", "file-in-the-way"])
def test_unwritable_roots_fall_back_to_memory(tmp_path, monkeypatch, failure):
    root = tmp_path / "c"
    if failure == "read-only":
        monkeypatch.setattr(cache_mod.tempfile, "mkdtemp", _mkdtemp_read_only)
    elif failure == "disk-full":
        monkeypatch.setattr(cache_mod, "_write_file", _write_disk_full)
    else:
        root.write_text("not a directory")
    cache = KernelCache(root)
    with pytest.warns(CacheWarning) as records:
        results = [fake_get(cache, fake_compiler()), fake_get(cache, fake_compiler(), source="// another")]
    assert all(r.path is None and r.cubin == b"\x7fELF fake cubin" for r in results)
    assert len(cache_warnings(records)) == 1
    assert "cannot be written" in str(records[0].message)
    if root.is_dir():
        assert leftovers(root) == [] and cache.entries() == []


def _chown_entry(entry):
    os.chown(entry, OTHER_UID, OTHER_UID)
    return f"owned by uid {OTHER_UID}"


def _group_writable_cubin(entry):
    os.chmod(entry / CUBIN_FILE, 0o660)
    return "writable by group or others"


def _symlinked_cubin(entry):
    real = entry.parent / "elsewhere.cubin"
    (entry / CUBIN_FILE).rename(real)
    (entry / CUBIN_FILE).symlink_to(real)
    return "symlink"


def _symlinked_entry(entry):
    real = entry.parent / "elsewhere"
    entry.rename(real)
    entry.symlink_to(real)
    return "symlink"


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_chown_entry, id="other-owner", marks=AS_ROOT),
        pytest.param(_group_writable_cubin, id="group-writable-cubin"),
        pytest.param(_symlinked_cubin, id="symlinked-cubin"),
        pytest.param(_symlinked_entry, id="symlinked-entry"),
    ],
)
def test_an_untrusted_entry_is_not_loaded_nor_replaced(tmp_path, make):
    cache = KernelCache(tmp_path / "c")
    good = fake_get(cache, fake_compiler())
    why = make(good.path)
    before = os.lstat(good.path)
    compile_fn = fake_compiler(cubin=b"\x7fELF in memory")
    with pytest.warns(CacheWarning) as records:
        result = fake_get(cache, compile_fn)
    assert result.path is None and result.cubin == b"\x7fELF in memory" and len(compile_fn.calls) == 1
    reports = cache_warnings(records)
    assert len(reports) == 1 and why in str(reports[0].message)
    after = os.lstat(good.path)
    assert (after.st_ino, after.st_uid, after.st_mode) == (before.st_ino, before.st_uid, before.st_mode)


def test_a_symlinked_root_is_not_used(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.warns(CacheWarning, match="symlink"):
        result = fake_get(KernelCache(link), fake_compiler())
    assert result.path is None and list(real.iterdir()) == []


def test_cleanup_refuses_a_symlinked_root(tmp_path):
    real = tmp_path / "real"
    fake_get(KernelCache(real), fake_compiler())
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    for cleanup in (lambda c: c.clear(), lambda c: c.prune(max_size=0)):
        with pytest.raises(cache_mod.UnsafeError, match="symlink"):
            cleanup(KernelCache(link))
    assert len(KernelCache(real).entries()) == 1


# ---- offline mode ----


def test_offline_miss_names_the_problem_key_and_command(tmp_cache, monkeypatch, no_compile):
    monkeypatch.setenv("JITGEMM_OFFLINE", "1")
    problem = Problem(64, 512, 1024)
    with pytest.raises(OfflineError) as info:
        kernels.build(SMALL, problem=problem)
    text = str(info.value)
    assert problem.describe() in text
    assert kernels.prepare(SMALL).key in text
    assert "jitgemm precompile --config" in text and "--m 64 --n 512 --k 1024" in text
    assert "not in the cache" in text
    assert not tmp_cache.exists()  # offline never writes either


def test_offline_loads_what_is_cached_and_refuses_a_corrupt_entry(warm_cache, seeded, monkeypatch, no_compile):
    monkeypatch.setenv("JITGEMM_OFFLINE", "1")
    assert kernels.build(SMALL).cache.hit
    _flip(warm_cache / seeded.key / CUBIN_FILE)
    with pytest.raises(OfflineError, match="corrupt"):
        kernels.build(SMALL)
    assert issubclass(kernels.OfflineError, RuntimeError) and kernels.OfflineError is OfflineError


def test_offline_miss_says_which_nvrtc_built_the_same_kernel(warm_cache, seeded, monkeypatch, no_compile):
    built_by = compiler.nvrtc_version()
    monkeypatch.setenv("JITGEMM_OFFLINE", "1")
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: "99.9")  # e.g. torch brought another NVRTC
    with pytest.raises(OfflineError) as info:
        kernels.build(SMALL, problem=Problem(64, 512, 1024))
    text = str(info.value)
    assert "not in the cache" in text
    assert f"kernels for this configuration exist for NVRTC {built_by}; this process has NVRTC 99.9" in text


def test_offline_miss_says_when_the_same_config_has_another_source(warm_cache, seeded, monkeypatch, no_compile):
    monkeypatch.setenv("JITGEMM_OFFLINE", "1")
    src = kernels.prepare(SMALL)
    with pytest.raises(OfflineError, match="rendered from another source"):
        KernelCache(warm_cache).get_or_compile(
            src.source + "// changed", "sm_90a", src.options, src.nvrtc_version, {"config": SMALL.to_dict()}, None
        )
    with pytest.raises(OfflineError) as info:  # an unrelated kernel: no such note
        fake_get(KernelCache(warm_cache), fake_compiler())
    assert "exist for NVRTC" not in str(info.value) and "another source" not in str(info.value)


def test_offline_variable_is_validated(tmp_cache, monkeypatch):
    monkeypatch.setenv("JITGEMM_OFFLINE", "maybe")
    with pytest.raises(ValueError, match="JITGEMM_OFFLINE"):
        kernels.build(SMALL)


# ---- the per-process table and import cost ----


def test_a_warm_get_does_no_file_io(warm_cache, monkeypatch, no_compile):
    from jitgemm import context, runtime

    monkeypatch.setattr(context, "make_current", lambda ordinal: None)
    monkeypatch.setattr(runtime, "load_kernel", lambda cubin, name, *rest: SimpleNamespace(cubin=cubin, name=name))
    monkeypatch.setattr(kernels, "_loaded", {})
    assert not kernels.is_loaded(SMALL, 0)
    kernel, layout = kernels.get(SMALL, 0)
    assert kernels.is_loaded(SMALL, 0) and kernel.cubin.startswith(ELF_MAGIC)

    def no_io(*args, **kwargs):
        raise AssertionError("file I/O on a warm call")

    for name in ("open", "lstat", "stat", "scandir"):
        monkeypatch.setattr(os, name, no_io)
    monkeypatch.setattr("builtins.open", no_io)
    assert kernels.get(SMALL, 0) == (kernel, layout)


def test_importing_jitgemm_stays_cheap(tmp_path):
    code = "import sys, jitgemm; print(sorted(m for m in ('click', 'tqdm', 'filelock') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cache_dir_variable_moves_the_root(tmp_path, monkeypatch):
    monkeypatch.setenv("JITGEMM_CACHE_DIR", str(tmp_path / "x"))
    assert KernelCache().root == tmp_path / "x" == kernels.default_cache().root
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JITGEMM_CACHE_DIR", "relative")
    assert KernelCache().root == tmp_path / "relative"
    monkeypatch.delenv("JITGEMM_CACHE_DIR")
    assert KernelCache().root.name == "jitgemm"


# ---- FIFOs, stopped lock holders and concurrent cleanup (issue #16) ----


def run_guarded(script: str, *args, timeout=30, env=None):
    """Run `script` in a fresh interpreter; a hang fails the test instead of stalling the run."""
    try:
        return subprocess.run(
            [sys.executable, "-c", script, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=Path(__file__).parent.parent,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"timed out after {timeout} s (a hang)")


FIFO_OPS = r"""
import json, sys, warnings
from click.testing import CliRunner
from jitgemm import cli, kernels, tuned
from jitgemm.config import KernelConfig
warnings.simplefilter("ignore")
for op in sys.argv[1:]:
    if op == "build":
        built = kernels.build(KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=4))
        print(json.dumps({"op": op, "path": str(built.cache.path), "cubin": built.cubin.hex()}), flush=True)
    elif op == "tuned":
        print(json.dumps({"op": op, "entries": tuned.read_entries()}), flush=True)
    else:
        args = {"list": ["cache", "list"], "verify": ["cache", "verify"], "show": ["tune", "--show"],
                "clear": ["cache", "clear", "--yes"]}[op]
        result = CliRunner().invoke(cli.main, args)
        print(json.dumps({"op": op, "exit": result.exit_code, "output": result.output}), flush=True)
"""


@pytest.mark.parametrize(
    "where",
    # each case waits out a subprocess timeout: the cubin in the fast subset, the rest in the slow one
    [CUBIN_FILE] + [pytest.param(w, marks=pytest.mark.slow) for w in (META_FILE, SOURCE_FILE, "lock", "tuned.json")],
)
def test_a_fifo_in_place_of_a_cache_file_never_hangs(warm_cache, seeded, where):
    entry = warm_cache / seeded.key
    fifo = {"lock": warm_cache / ".locks" / f"{seeded.key}.lock", "tuned.json": warm_cache / "tuned.json"}.get(
        where, entry / where
    )
    if where == "lock":
        shutil.rmtree(entry)  # a miss, so that the compile path takes the lock
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo, 0o600)
    env = dict(os.environ, JITGEMM_CACHE_DIR=str(warm_cache))
    out = run_guarded(FIFO_OPS, "list", "verify", "show", "tuned", "clear", env=env)
    assert out.returncode == 0, out.stderr
    results = {r["op"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert results["list"]["exit"] == 0 and results["show"]["exit"] == 0 and results["clear"]["exit"] == 0
    assert results["verify"]["exit"] == (1 if where in (CUBIN_FILE, META_FILE, SOURCE_FILE) else 0)
    assert results["tuned"]["entries"] == {}
    assert os.path.lexists(fifo) == (where == "tuned.json")  # clear removes all but the tuning file
    assert not entry.exists()

    # The load path: the FIFO is a corrupt entry (rebuilt) or an unusable lock (compiled without it).
    shutil.rmtree(warm_cache)
    shutil.copytree(seeded.root, warm_cache, symlinks=True)
    if where == "lock":
        shutil.rmtree(entry)
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo, 0o600)
    out = run_guarded(FIFO_OPS, "build", "tuned", env=env)
    assert out.returncode == 0, out.stderr
    results = {r["op"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert bytes.fromhex(results["build"]["cubin"]) == seeded.cubin
    assert results["build"]["path"] == str(entry)
    # A load reads only the cubin and meta file: a FIFO source stays until verify names it.
    expected = "kernel.cu is not a regular file" if where == SOURCE_FILE else None
    assert KernelCache(warm_cache).verify()[0][1] == expected


STOPPED_HOLDER = r"""
import os, signal, sys
from types import SimpleNamespace
from jitgemm.cache import KernelCache

def compile_fn(source_path):   # stops itself holding the compile lock, as Ctrl-Z or a debugger would
    open(sys.argv[2], "w").close()
    os.kill(os.getpid(), signal.SIGSTOP)
    return SimpleNamespace(cubin=b"\x7fELF late", seconds=0.0)

KernelCache(sys.argv[1]).get_or_compile("// kernel source", "sm_90a", ("-O3",), "13.0", {"kernel": "k"}, compile_fn)
"""

WAITER = r"""
import json, sys, time, warnings
from types import SimpleNamespace
from jitgemm.cache import KernelCache
warnings.simplefilter("always")
start = time.monotonic()
with warnings.catch_warnings(record=True) as records:
    result = KernelCache(sys.argv[1]).get_or_compile("// kernel source", "sm_90a", ("-O3",), "13.0",
        {"kernel": "k"}, lambda path: SimpleNamespace(cubin=b"\x7fELF fake cubin", seconds=0.0))
print(json.dumps({"seconds": time.monotonic() - start, "path": str(result.path), "cubin": result.cubin.hex(),
                  "warnings": [str(w.message) for w in records]}))
"""


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_a_stopped_lock_holder_is_not_waited_for(tmp_path):
    root = tmp_path / "c"
    marker = tmp_path / "compiling"
    holder = subprocess.Popen(
        [sys.executable, "-c", STOPPED_HOLDER, str(root), str(marker)], cwd=Path(__file__).parent.parent
    )
    try:
        deadline = time.time() + 60
        while not (marker.exists() and _process_state(holder.pid) == "T"):
            assert time.time() < deadline and holder.poll() is None, "the holder did not take the lock and stop"
            time.sleep(0.02)
        out = run_guarded(WAITER, root, timeout=30)
    finally:
        holder.kill()  # SIGKILL ends a stopped process too
        holder.wait()
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["seconds"] < 10
    assert bytes.fromhex(result["cubin"]) == b"\x7fELF fake cubin"
    assert result["path"] == str(root / cache_key("// kernel source", ("-O3",), "sm_90a", "13.0"))
    assert any(f"pid {holder.pid}" in w and "is stopped" in w and "without it" in w for w in result["warnings"]), (
        result["warnings"]
    )
    assert KernelCache(root).verify()[0][1] is None


def test_a_holder_record_names_a_running_process_not_a_finished_one():
    assert cache_mod._stalled(cache_mod._holder_record()) is None
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = f"{done.stdout.strip()} 1 {cache_mod._pid_namespace()}".encode()
    expected = "gone" if cache_mod._HAVE_PROC else None
    assert cache_mod._stalled(record) == expected
    assert cache_mod._stalled(b"") is None and cache_mod._stalled(b"\xff garbage") is None


def test_clear_leaves_held_locks_and_fresh_temporary_dirs(tmp_path):
    cache = KernelCache(tmp_path / "c")
    fake_get(cache, fake_compiler())
    locks = cache.root / ".locks"
    held = cache_mod.CompileLock(locks / f"{'a' * 64}.lock", "a lock")
    assert held.acquire(5) is None
    (locks / f"{'b' * 64}.lock").touch()
    (cache.root / ".tmp-fresh").mkdir()
    (cache.root / ".tmp-old").mkdir()
    os.utime(cache.root / ".tmp-old", (0, 0))
    try:
        assert cache.clear() == (1, [])
        assert sorted(p.name for p in cache.root.iterdir()) == [".locks", ".tmp-fresh"]
        assert [p.name for p in locks.iterdir()] == [f"{'a' * 64}.lock"]
    finally:
        held.release()
    assert cache.clear() == (0, [])
    assert sorted(p.name for p in cache.root.iterdir()) == [".tmp-fresh"]


CHURN = r"""
import hashlib, random, sys, time, traceback, warnings
from types import SimpleNamespace
from jitgemm.cache import KernelCache
warnings.simplefilter("ignore")
cache, rng = KernelCache(sys.argv[1]), random.Random(int(sys.argv[2]))
deadline = time.monotonic() + float(sys.argv[3])
try:
    while time.monotonic() < deadline:
        op = rng.random()
        if op < 0.6:
            source = f"// kernel {rng.randrange(40)}"
            cubin = b"\x7fELF " + hashlib.sha256(source.encode()).digest()
            result = cache.get_or_compile(source, "sm_90a", ("-O3",), "13.0", {"kernel": "k"},
                                          lambda path: SimpleNamespace(cubin=cubin, seconds=0.0))
            assert result.cubin == cubin, "wrong cubin"
        elif op < 0.8:
            cache.prune(max_size=rng.randrange(0, 2000))
        elif op < 0.9:
            cache.clear()
        else:
            cache.verify()
except BaseException:
    traceback.print_exc()
    sys.exit(1)
"""


@pytest.mark.slow
def test_concurrent_publish_prune_and_clear_stay_consistent(tmp_path):
    root = tmp_path / "c"
    KernelCache(root).ensure_root()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHURN, str(root), str(seed), "6"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent.parent,
        )
        for seed in range(6)
    ]
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * len(procs), [err for _, err in outputs]
    cache = KernelCache(root)
    assert all(why is None for _, why in cache.verify())
    assert leftovers(root) == []
