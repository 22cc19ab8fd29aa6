"""CPU tests of the `jitgemm` command line: precompile, cache, env and explain, end to end."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from jitgemm import cli, compiler, envflags, heuristics, kernels
from jitgemm.cache import CUBIN_FILE, KernelCache
from jitgemm.config import KernelConfig
from jitgemm.heuristics import DeviceSpec
from jitgemm.problem import LAYOUTS, Problem

SMALL = KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=4)
SMALL5 = KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=5)
H200 = DeviceSpec("sm_90a", 132)
TARGET = ["--arch", "sm_90a", "--num-sms", "132"]


def invoke(*args, input=None):
    """Run the CLI in-process; an exception the CLI did not turn into a message fails the test."""
    return CliRunner(catch_exceptions=False).invoke(cli.main, [str(a) for a in args], input=input)


def invoke_json(*args):
    result = invoke(*args, "--json")
    return result, json.loads(result.stdout)


def expected_kernels(shapes, dtype="bf16", layout="nt", device=H200):
    a_major, b_major = LAYOUTS[layout]
    return {heuristics.select(Problem(m, n, k, dtype, dtype, a_major, b_major), device) for m, n, k in shapes}


def kernel_configs(summary):
    return {KernelConfig.from_dict(r["config"]) for r in summary["kernels"]}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A cache holding two small kernels, built once; tests copy it."""
    root = tmp_path_factory.mktemp("seeded") / "cache"
    keys = [kernels.build(cfg, KernelCache(root)).cache.key for cfg in (SMALL, SMALL5)]
    return SimpleNamespace(root=root, keys=keys)


@pytest.fixture
def warm_cache(tmp_cache, seeded):
    shutil.copytree(seeded.root, tmp_cache, symlinks=True)
    return tmp_cache


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(cli, "_local_gpu", lambda: None)


# ---- option parsing ----


def test_int_lists_and_ranges():
    assert cli.parse_int_list("1,128,4096") == [1, 128, 4096]
    assert cli.parse_int_list("128:512:128") == [128, 256, 384, 512]
    assert cli.parse_int_list("1:3, 2,8") == [1, 2, 3, 8]
    assert cli.parse_int_list("100:130:16") == [100, 116]
    for bad in ("0", "a", "5:1", "1:2:0", "1:2:3:4", "", "4,,5", "-3"):
        with pytest.raises(ValueError):
            cli.parse_int_list(bad)


def test_durations_and_sizes():
    assert cli.parse_duration("30d") == 30 * 86400
    assert cli.parse_duration("1.5h") == 5400
    assert cli.parse_size("2G") == 2 << 30
    assert cli.parse_size("500MiB") == 500 << 20
    assert cli.parse_size("4096") == 4096
    for bad in ("30", "d", "3y"):
        with pytest.raises(ValueError):
            cli.parse_duration(bad)
    for bad in ("2X", "", "G"):
        with pytest.raises(ValueError):
            cli.parse_size(bad)


def test_bad_options_name_the_option(tmp_cache):
    result = invoke("precompile", "--m", "0", "--n", "8", "--k", "8")
    assert result.exit_code == 2 and "--m" in result.stderr and "positive" in result.stderr
    result = invoke("precompile", "--m", "8", "--k", "8")
    assert result.exit_code == 2 and "--n" in result.stderr
    result = invoke("precompile", "--config", '{"block_q": 1}')
    assert result.exit_code == 2 and "--config" in result.stderr and "block_q" in result.stderr
    result = invoke("cache", "prune", "--older-than", "soon")
    assert result.exit_code == 2 and "--older-than" in result.stderr
    result = invoke("precompile")
    assert result.exit_code == 2 and "no shapes" in result.stderr


def test_huge_and_malformed_values_are_usage_errors(tmp_cache, no_gpu):
    """Issue 16: each of these raised a traceback (OverflowError, MemoryError, RecursionError...)."""
    nines = "9" * 400
    cases = [
        (("explain", "1e400", 1, 1), "M"),
        (("explain", 1, nines, 1), "N"),
        (("explain", 1, 1, 1 << 31), "K"),
        (("explain", 2_000_000_000, 2_000_000_000, 1), "2^40"),
        (("cache", "prune", "--max-size", "99999999999999999999999999"), "--max-size"),
        (("cache", "prune", "--max-size", nines), "--max-size"),
        (("cache", "prune", "--older-than", nines + "w"), "--older-than"),
        (("precompile", "--m", "1:1e10", "--n", 1, "--k", 1, "--dry-run"), "--m"),
        (("precompile", "--m", "1:10000000000", "--n", 1, "--k", 1, "--dry-run"), "more than 1000000 sizes"),
        (("precompile", "--m", "1:1000", "--n", "1:1000", "--k", "1:2", "--dry-run"), "2000000 shapes"),
        (("precompile", "--m", 1, "--n", 1 << 31, "--k", 1, "--dry-run"), "--n"),
        (("precompile", "--config", "[" * 100_000, "--dry-run"), "--config"),
        (("precompile", "--config", "[1]", "--dry-run"), "mapping"),
        (("precompile", "--config", '{"num_consumers": true}', "--dry-run"), "num_consumers must be int"),
    ]
    for args, words in cases:
        result = invoke(*args)
        assert result.exit_code == 2 and words in result.stderr, (args[:3], result.stderr[-300:])
        assert "Traceback" not in result.stderr


def test_shape_files_nested_too_deeply_are_usage_errors(tmp_cache, tmp_path, no_gpu):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    result = invoke("precompile", deep, "--dry-run")
    assert result.exit_code == 2 and "nested too deeply" in result.stderr


# ---- rough edges (issue 21, item 9) ----


def test_binary_and_empty_shape_files_are_named(tmp_cache, tmp_path, no_gpu):
    binary = tmp_path / "shapes.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    result = invoke("precompile", binary, "--dry-run", *TARGET)
    assert result.exit_code == 2 and str(binary) in result.stderr and "not a text shape file" in result.stderr
    assert "codec" not in result.stderr
    for name, text in (("empty.txt", ""), ("comments.txt", "# nothing yet\n\n"), ("e.json", "[]"), ("e.csv", "")):
        path = tmp_path / name
        path.write_text(text)
        result = invoke("precompile", path, "--dry-run", *TARGET)
        assert result.exit_code == 2 and f"{path}: the shape file is empty" in result.stderr, result.stderr
        assert "no shapes: give" not in result.stderr


def test_precompile_notes_many_shapes_and_shows_progress_on_a_terminal(tmp_cache, no_gpu, monkeypatch):
    monkeypatch.setattr(cli, "MANY_SHAPES", 3)
    shown = []
    real_tqdm = cli.tqdm

    def spy(*args, **kwargs):
        shown.append(kwargs.get("desc"))
        return real_tqdm(*args, **kwargs)

    monkeypatch.setattr(cli, "tqdm", spy)
    result = invoke("precompile", "--m", "1:4", "--n", 64, "--k", 64, "--dry-run", *TARGET)
    assert result.exit_code == 0 and "4 shapes: choosing a kernel for each takes a while" in result.stderr
    assert "jitgemm: choosing kernels" in shown  # tqdm's disable=None: a bar only on a terminal
    result = invoke("precompile", "--m", "1:3", "--n", 64, "--k", 64, "--dry-run", *TARGET)
    assert "takes a while" not in result.stderr


def test_cache_show_exits_1_on_a_corrupt_entry(warm_cache, seeded):
    cubin = warm_cache / seeded.keys[0] / CUBIN_FILE
    cubin.write_bytes(bytes(cubin.stat().st_size))
    result = invoke("cache", "show", seeded.keys[0])
    assert result.exit_code == 1 and "BAD: " in result.stdout
    result = invoke("cache", "show", seeded.keys[0], "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["status"] == "bad"
    assert invoke("cache", "show", seeded.keys[1]).exit_code == 0


def test_cache_prune_without_options_names_them(warm_cache, seeded):
    result = invoke("cache", "prune")
    assert result.exit_code == 2 and "--older-than" in result.stderr and "--max-size" in result.stderr
    assert "no default" in result.stderr
    assert sorted(e.key for e in KernelCache(warm_cache).entries()) == sorted(seeded.keys)


def test_a_forced_config_that_cannot_be_built_fails_before_compiling(tmp_cache, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("compiled a config that cannot be built")

    monkeypatch.setattr(kernels, "build", refuse)
    too_deep = KernelConfig(block_m=128, block_n=256, num_stages=16).to_json()
    result = invoke("precompile", "--config", too_deep)
    assert result.exit_code == 2 and "--config" in result.stderr and "shared memory" in result.stderr
    no_multicast = KernelConfig(block_m=128, block_n=128, cluster_size=2).to_json()
    result = invoke("precompile", "--config", no_multicast, "--dry-run")
    assert result.exit_code == 2 and "cluster_size 2 needs multicast" in result.stderr
    assert "Traceback" not in result.output
    assert cli.structural_problems(SMALL) == []


def test_cache_clear_says_it_keeps_the_tuning_file_and_all_removes_it(warm_cache, seeded):
    from jitgemm import tuned

    tuned.write_entry("GPU|sm_90a|132 SMs", "p", {"config": SMALL.to_dict()}, warm_cache / "tuned.json")
    result = invoke("cache", "clear", "--yes")
    assert result.exit_code == 0 and "removed 2 entries" in result.stdout
    assert "kept the tuning file" in result.stdout and "--all" in result.stdout
    assert (warm_cache / "tuned.json").exists()
    result = invoke("cache", "clear", "--all", input="y\n")
    assert result.exit_code == 0 and "and the tuning file tuned.json" in result.stdout
    assert "removed the tuning file" in result.stdout and not (warm_cache / "tuned.json").exists()
    assert "tuning file" not in invoke("cache", "clear", "--yes").stdout  # none left to mention


def _commands(group, path=()):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


def test_the_readme_synopsis_matches_every_commands_options():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = readme.split("## The CLI", 1)[1].split("```", 2)[1]
    synopsis: dict = {}
    current = None
    for line in block.splitlines():
        words = line.split("#", 1)[0].split()
        if words[:1] == ["jitgemm"]:
            current = " ".join(words[1:3] if words[1:2] == ["cache"] else words[1:2])
            synopsis[current] = ""
        if current is not None:
            synopsis[current] += " " + line.split("#", 1)[0]
    for path, command in _commands(cli.main):
        name = " ".join(path)
        text = synopsis.get(name) or synopsis.get(path[0])
        assert text is not None, f"the README's CLI synopsis lacks `jitgemm {name}`"
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--") and opt != "--help":
                    assert opt in text, f"the README's synopsis of `jitgemm {name}` lacks {opt}"


# ---- precompile ----


def test_precompile_compiles_once_then_hits(tmp_cache):
    shapes = [(m, 512, 1024) for m in (64, 128)]
    args = ["precompile", "--m", "64,128", "--n", "512", "--k", "1024", "--jobs", "2", *TARGET]
    result, summary = invoke_json(*args)
    assert result.exit_code == 0, result.output
    assert kernel_configs(summary) == expected_kernels(shapes)
    assert summary["shapes"] == 2 and summary["cache_root"] == str(tmp_cache)
    assert summary["compiled"] == len(summary["kernels"]) and summary["hits"] == 0
    for r in summary["kernels"]:
        assert r["status"] == "compiled" and r["cached"] and r["compile_seconds"] > 0
        assert (tmp_cache / r["key"] / CUBIN_FILE).is_file()
    assert sorted(sum(([p["m"] for p in r["problems"]] for r in summary["kernels"]), [])) == [64, 128]

    result, again = invoke_json(*args)
    assert result.exit_code == 0
    assert again["compiled"] == 0 and again["hits"] == len(summary["kernels"])
    assert {r["key"] for r in again["kernels"]} == {r["key"] for r in summary["kernels"]}

    text = invoke(*args)
    assert text.exit_code == 0 and "0 compiled" in text.stdout


def test_precompile_without_a_gpu_targets_sm90a_with_a_note(tmp_cache, no_gpu):
    result, summary = invoke_json("precompile", "--m", "64", "--n", "512", "--k", "1024", "--dry-run")
    assert result.exit_code == 0
    assert summary["arch"] == "sm_90a" and summary["num_sms"] == 132
    assert "no CUDA GPU" in result.stderr and "sm_90a" in result.stderr


SHAPES = [(1, 4096, 4096), (64, 4096, 4096), (4096, 4096, 4096), (128, 7168, 2048), (128, 7168, 2048)]


@pytest.mark.parametrize("fmt", ["txt", "csv-header", "csv-bare", "json-lists", "json-objects"])
def test_dry_run_maps_a_shape_file_to_distinct_kernels(tmp_cache, tmp_path, fmt):
    if fmt == "txt":
        path = tmp_path / "shapes.txt"
        path.write_text("# M N K\n\n" + "\n".join(f"{m} {n} {k}  # layer" for m, n, k in SHAPES) + "\n")
    elif fmt == "csv-header":
        path = tmp_path / "shapes.csv"
        path.write_text("name,m,n,k\n" + "\n".join(f"l{i},{m},{n},{k}" for i, (m, n, k) in enumerate(SHAPES)))
    elif fmt == "csv-bare":
        path = tmp_path / "shapes.csv"
        path.write_text("\n".join(f"{m},{n},{k}" for m, n, k in SHAPES))
    elif fmt == "json-lists":
        path = tmp_path / "shapes.json"
        path.write_text(json.dumps([list(s) for s in SHAPES]))
    else:
        path = tmp_path / "shapes.json"
        path.write_text(json.dumps({"shapes": [{"m": m, "n": n, "k": k, "name": "x"} for m, n, k in SHAPES]}))
    result, summary = invoke_json("precompile", path, "--dry-run", *TARGET)
    assert result.exit_code == 0, result.output
    assert summary["dry_run"] and summary["shapes"] == len(set(SHAPES))
    assert kernel_configs(summary) == expected_kernels(SHAPES)
    assert {r["status"] for r in summary["kernels"]} == {"miss"}
    assert not tmp_cache.exists()  # a dry run compiles and writes nothing


def test_shape_file_entries_may_set_dtype_and_layout(tmp_cache, tmp_path):
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps([{"m": 256, "n": 1024, "k": 512, "dtype": "fp16", "layout": "tn"}, [256, 1024, 512]]))
    result, summary = invoke_json("precompile", path, "--dry-run", *TARGET)
    assert result.exit_code == 0
    problems = sorted((p["dtype"], p["layout"]) for r in summary["kernels"] for p in r["problems"])
    assert problems == [("bf16", "nt"), ("fp16", "tn")]
    want = expected_kernels([(256, 1024, 512)]) | expected_kernels([(256, 1024, 512)], "fp16", "tn")
    assert kernel_configs(summary) == want


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("s.txt", "1 2 3\n4 5\n", "s.txt:2"),
        ("s.txt", "1 2 x\n", "s.txt:1"),
        ("s.csv", "m,n,k\n1,2\n", "s.csv:2"),
        ("s.json", '[{"m": 1, "n": 2, "k": 3, "batch": 4}]', "batch"),
        ("s.json", '[{"m": 1, "n": 2}]', "missing k"),
        ("s.json", "{oops", "not valid JSON"),
        ("s.json", '[{"m": 8, "n": 8, "k": 8, "layout": "xx"}]', "shape 8 8 8: layout"),
        ("s.json", '[{"m": 8, "n": 8, "k": 9, "dtype": "fp8"}]', "shape 8 8 9: Problem.dtype"),
    ],
)
def test_shape_file_errors_name_the_place(tmp_cache, tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    result = invoke("precompile", path, "--dry-run", *TARGET)
    assert result.exit_code == 2 and message in result.stderr


def test_precompile_reports_a_failing_kernel_and_builds_the_rest(tmp_cache, monkeypatch):
    shapes = [(64, 512, 1024), (4096, 4096, 4096)]
    configs = sorted(expected_kernels(shapes), key=lambda c: c.name)
    assert len(configs) == 2
    bad = configs[0]
    real_build = kernels.build

    def build(config, cache=None, problem=None):
        if config == bad:
            raise compiler.CompileError("NVRTC failed to compile it:\nerror: boom")
        return real_build(config, cache, problem)

    monkeypatch.setattr(kernels, "build", build)
    result, summary = invoke_json("precompile", "--m", "64,4096", "--n", "512,4096", "--k", "1024,4096", *TARGET)
    assert result.exit_code == 1
    status = {KernelConfig.from_dict(r["config"]): r for r in summary["kernels"]}
    assert status[bad]["status"] == "error" and "boom" in status[bad]["error"]
    assert status[configs[1]]["status"] == "compiled"
    assert summary["failed"] == 1


def test_precompile_fails_when_nothing_can_be_stored(tmp_cache):
    tmp_cache.write_text("a file where the cache root should be")
    result, summary = invoke_json("precompile", "--m", "64", "--n", "512", "--k", "1024", *TARGET)
    assert result.exit_code == 1
    assert summary["uncached"] == len(summary["kernels"]) == 1 and not summary["kernels"][0]["cached"]
    assert "warning" in result.stderr and "cannot be written" in result.stderr


def test_precompile_for_sm100_succeeds_or_fails_cleanly(tmp_cache):
    # The sm_100a template and heuristics are being written; either way there is no traceback.
    result = invoke("precompile", "--m", "128", "--n", "512", "--k", "1024", "--arch", "sm_100a", "--dry-run")
    assert result.exit_code in (0, 1)
    if result.exit_code == 1:
        assert "error" in result.stderr.lower()


def test_precompile_refuses_to_compile_offline(tmp_cache, monkeypatch):
    monkeypatch.setenv("JITGEMM_OFFLINE", "1")
    result = invoke("precompile", "--m", "64", "--n", "512", "--k", "1024", *TARGET)
    assert result.exit_code == 1 and "JITGEMM_OFFLINE" in result.stderr
    assert invoke("precompile", "--m", "64", "--n", "512", "--k", "1024", "--dry-run", *TARGET).exit_code == 0


@pytest.mark.parametrize("which", [0, 1], ids=["exact-config", "shape"])
def test_the_offline_error_commands_build_the_missing_kernel(tmp_cache, monkeypatch, no_gpu, which):
    problem = Problem(64, 512, 1024)
    config = heuristics.select(problem, H200)
    monkeypatch.setenv("JITGEMM_OFFLINE", "1")
    with pytest.raises(kernels.OfflineError) as info:
        kernels.build(config, problem=problem)
    commands = [line.strip() for line in str(info.value).splitlines() if line.strip().startswith("jitgemm ")]
    assert len(commands) == 2
    monkeypatch.delenv("JITGEMM_OFFLINE")
    result = invoke(*shlex.split(commands[which])[1:])
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("JITGEMM_OFFLINE", "1")
    assert kernels.build(config, problem=problem).cache.hit


# ---- cache commands ----


def test_cache_dir_prints_the_root(tmp_cache):
    assert invoke("cache", "dir").stdout.strip() == str(tmp_cache)


def test_cache_list_sorts_and_reports_json(warm_cache, seeded):
    small, small5 = seeded.keys
    now = time.time()
    os.utime(warm_cache / small, (now - 7200, now - 7200))
    os.utime(warm_cache / small5, (now - 60, now - 60))
    result, listing = invoke_json("cache", "list")
    assert result.exit_code == 0
    assert listing["root"] == str(warm_cache) and listing["count"] == 2
    assert [e["key"] for e in listing["entries"]] == [small5, small]  # most recently used first
    assert all(e["size_bytes"] > 0 and e["problem"] is None for e in listing["entries"])
    assert listing["total_bytes"] == sum(e["size_bytes"] for e in listing["entries"])
    assert KernelConfig.from_dict(listing["entries"][1]["config"]) == SMALL
    _, by_size = invoke_json("cache", "list", "--sort", "size")
    sizes = [e["size_bytes"] for e in by_size["entries"]]
    assert sizes == sorted(sizes, reverse=True)
    text = invoke("cache", "list").stdout
    assert small[:16] in text and "2 entries" in text


def test_cache_show_accepts_a_prefix(warm_cache, seeded):
    key = seeded.keys[0]
    result, shown = invoke_json("cache", "show", key[:10])
    assert result.exit_code == 0
    assert shown["key"] == key and shown["status"] == "ok" and shown["meta"]["key"] == key
    assert set(shown["files"]) == {"kernel.cu", "kernel.cubin", "meta.json"}
    assert key in invoke("cache", "show", key).stdout
    missing = invoke("cache", "show", "ffff" if not key.startswith("ffff") else "0000")
    assert missing.exit_code == 1 and "no cache entry" in missing.stderr
    assert invoke("cache", "show", "xyz").exit_code == 1


def test_cache_list_and_show_mark_entries_of_another_nvrtc(warm_cache, seeded, monkeypatch):
    built_by = compiler.nvrtc_version()
    _, listing = invoke_json("cache", "list")
    assert listing["nvrtc_version"] == built_by and listing["usable"] == 2
    assert all(e["usable"] and e["nvrtc_version"] == built_by for e in listing["entries"])
    assert "usable: no" not in invoke("cache", "list").stdout
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: "99.9")  # another NVRTC installed
    _, listing = invoke_json("cache", "list")
    assert listing["usable"] == 0 and listing["count"] == 2
    for e in listing["entries"]:
        assert e["usable"] is False and e["nvrtc_version"] == built_by
        assert e["unusable_reason"] == f"built by NVRTC {built_by}; this process has NVRTC 99.9"
    text = invoke("cache", "list").stdout
    assert f"nvrtc {built_by}" in text and text.count("usable: no") == 2
    assert "2 of them cannot be used by this process (NVRTC 99.9)" in text
    result, shown = invoke_json("cache", "show", seeded.keys[0])
    assert result.exit_code == 0 and shown["status"] == "ok" and shown["usable"] is False
    assert shown["nvrtc_version"] == built_by and "99.9" in shown["unusable_reason"]
    text = invoke("cache", "show", seeded.keys[0]).stdout
    assert f"usable:          no (built by NVRTC {built_by}; this process has NVRTC 99.9)" in text


def test_cache_verify_names_the_bad_entries(warm_cache, seeded):
    result, report = invoke_json("cache", "verify")
    assert result.exit_code == 0 and report["checked"] == 2 and report["bad"] == []
    cubin = warm_cache / seeded.keys[1] / CUBIN_FILE
    cubin.write_bytes(bytes(cubin.stat().st_size))
    result, report = invoke_json("cache", "verify")
    assert result.exit_code == 1
    assert [b["key"] for b in report["bad"]] == [seeded.keys[1]] and "sha256" in report["bad"][0]["reason"]
    text = invoke("cache", "verify")
    assert text.exit_code == 1 and f"BAD  {seeded.keys[1]}" in text.stdout and "1 bad" in text.stdout


def test_cache_prune_by_age_and_size(warm_cache, seeded):
    small, small5 = seeded.keys
    now = time.time()
    old = now - 40 * 86400
    os.utime(warm_cache / small, (old, old))
    stale_tmp, fresh_tmp = warm_cache / ".tmp-stale", warm_cache / ".tmp-fresh"
    stale_tmp.mkdir()
    fresh_tmp.mkdir()
    os.utime(stale_tmp, (now - 7200, now - 7200))

    result, plan = invoke_json("cache", "prune", "--older-than", "30d", "--dry-run")
    assert result.exit_code == 0 and plan["dry_run"] and [e["key"] for e in plan["removed"]] == [small]
    assert (warm_cache / small).exists() and stale_tmp.exists()

    result, done = invoke_json("cache", "prune", "--older-than", "30d")
    assert [e["key"] for e in done["removed"]] == [small] and done["freed_bytes"] > 0
    assert not (warm_cache / small).exists() and (warm_cache / small5).exists()
    assert not stale_tmp.exists() and fresh_tmp.exists()

    result, done = invoke_json("cache", "prune", "--max-size", "1K")
    assert [e["key"] for e in done["removed"]] == [small5]
    assert KernelCache(warm_cache).entries() == []
    assert invoke("cache", "prune").exit_code == 2


def test_cache_prune_drops_least_recently_used_first(warm_cache, seeded):
    small, small5 = seeded.keys
    now = time.time()
    os.utime(warm_cache / small5, (now - 3600, now - 3600))
    size = max(e.size_bytes for e in KernelCache(warm_cache).entries())
    result, done = invoke_json("cache", "prune", "--max-size", str(size))
    assert [e["key"] for e in done["removed"]] == [small5]
    assert (warm_cache / small).exists()


def test_clear_never_deletes_outside_the_root(warm_cache, seeded, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    (warm_cache / "link-to-outside").symlink_to(outside, target_is_directory=True)
    (warm_cache / ("ab" * 32)).symlink_to(outside, target_is_directory=True)  # named like an entry
    (warm_cache / seeded.keys[0] / "evil").symlink_to(outside, target_is_directory=True)
    (warm_cache / "notes.txt").write_text("mine")

    aborted = invoke("cache", "clear", input="n\n")
    assert aborted.exit_code == 1 and (warm_cache / seeded.keys[0]).exists()

    result = invoke("cache", "clear", "--yes")
    assert result.exit_code == 0 and "removed 3 entries" in result.stdout
    assert (outside / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in warm_cache.iterdir()) == ["link-to-outside", "notes.txt"]
    assert "link-to-outside" in result.stderr and "notes.txt" in result.stderr


def test_prune_and_clear_refuse_a_symlinked_root(tmp_path, seeded, monkeypatch):
    real = tmp_path / "real"
    shutil.copytree(seeded.root, real)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    monkeypatch.setenv("JITGEMM_CACHE_DIR", str(link))
    for args in (("clear", "--yes"), ("prune", "--max-size", "0")):
        result = invoke("cache", *args)
        assert result.exit_code == 1 and "symlink" in result.stderr
    assert len(KernelCache(real).entries()) == 2


def test_prune_does_not_follow_a_symlinked_failed_dir(warm_cache, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.cu").write_text("keep me")
    os.utime(outside / "x.cu", (0, 0))
    (warm_cache / "failed").symlink_to(outside, target_is_directory=True)
    invoke("cache", "prune", "--older-than", "1d")
    assert (outside / "x.cu").read_text() == "keep me"


# ---- env ----


def test_env_reports_versions_cache_and_variables(warm_cache, monkeypatch):
    for name in [name for name in os.environ if name.startswith("JITGEMM_") and name != "JITGEMM_CACHE_DIR"]:
        monkeypatch.delenv(name)  # e.g. the GPU run's JITGEMM_REQUIRE_GPU
    monkeypatch.setenv("JITGEMM_OFFLINE", "0")
    result, info = invoke_json("env")
    assert result.exit_code == 0
    assert info["jitgemm"] == __import__("jitgemm").__version__
    assert info["nvrtc"] == compiler.nvrtc_version() and info["cuda_bindings"]
    assert info["cache"]["root"] == str(warm_cache) and info["cache"]["entries"] == 2
    assert info["cache"]["bytes"] > 0
    assert info["env"] == {"JITGEMM_CACHE_DIR": str(warm_cache), "JITGEMM_OFFLINE": "0"}
    assert isinstance(info["gpus"], list)
    assert info["driver"] or info["driver_error"]
    text = invoke("env").stdout
    assert "NVRTC" in text and str(warm_cache) in text
    assert re.search(r"^  \* JITGEMM_OFFLINE +off  \[JITGEMM_OFFLINE=0\]$", text, re.M)


def test_env_lists_every_variable_with_its_effective_value(tmp_cache, monkeypatch):
    for name in [name for name in os.environ if name.startswith("JITGEMM_") and name != "JITGEMM_CACHE_DIR"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("JITGEMM_TUNED", "false")  # read as off, like 0
    monkeypatch.setenv("JITGEMM_PDL", "maybe")  # refused: shown, not raised
    monkeypatch.setenv("JITGEMM_CONFIG", '{"split_k": 2}')
    monkeypatch.setenv("JITGEMM_TUNE", "0")  # a misspelling
    result, info = invoke_json("env")
    assert result.exit_code == 0
    rows = {row["name"]: row for row in info["variables"]}
    assert [row["name"] for row in info["variables"][: len(envflags.NAMES)]] == list(envflags.NAMES)
    assert rows["JITGEMM_CACHE_DIR"]["effective"] == str(tmp_cache) and rows["JITGEMM_CACHE_DIR"]["set"]
    assert rows["JITGEMM_OFFLINE"] == {**rows["JITGEMM_OFFLINE"], "set": False, "value": None, "effective": "off"}
    assert rows["JITGEMM_TUNED"]["effective"] == "off"
    assert rows["JITGEMM_PDL"]["effective"].startswith("invalid: ValueError: JITGEMM_PDL='maybe'")
    assert rows["JITGEMM_CONFIG"]["effective"] == {"split_k": 2}
    assert rows["JITGEMM_TUNE"]["effective"] == "unknown: not read"
    text = invoke("env").stdout
    for name in envflags.NAMES:
        assert re.search(rf"^  [ *] {name} ", text, re.M), name
    assert re.search(r"^  \* JITGEMM_TUNED +off  \[JITGEMM_TUNED=false\]$", text, re.M)
    assert re.search(r"^    JITGEMM_OFFLINE +off$", text, re.M)


def test_every_variable_read_is_listed_and_in_the_readme():
    """A JITGEMM_* name in the package's source is one `jitgemm env` lists and the README's table has."""
    root = Path(__file__).resolve().parents[1]
    used = set()
    for folder in ("jitgemm", "heuristics", "tests"):
        for path in (root / folder).rglob("*.py"):
            used |= set(re.findall(r"JITGEMM_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text()))
    used -= {"JITGEMM_TUNE", "JITGEMM_X"}  # the tests' unknown and made-up names
    assert used == set(envflags.NAMES)
    readme = (root / "README.md").read_text()
    for var in envflags.VARIABLES:
        assert re.search(rf"^\| `{var.name}` \|", readme, re.M), var.name


# ---- explain ----

STUB_REPORT = {
    "problem": {"m": 128, "n": 7168, "k": 2048},
    "device": {"arch": "sm_90a", "num_sms": 100},
    "chosen": SMALL.to_dict(),
    "candidates": [
        {"config": SMALL.to_dict(), "cost": 12.5, "waves": 2},
        {"config": SMALL5.to_dict(), "cost": 13.25, "waves": 3},
    ],
    "rejected": [{"config": "m256n256", "rule": "register budget exceeded"}],
    "model": "stub",
}


def test_explain_calls_the_heuristics_and_renders_its_report(monkeypatch, no_gpu):
    calls = []

    def stub(problem, device, top=5):
        calls.append((problem, device, top))
        return STUB_REPORT

    monkeypatch.setattr(heuristics, "explain", stub, raising=False)
    result = invoke("explain", 128, 7168, 2048, "--dtype", "fp16", "--layout", "tn", "--num-sms", 100)
    assert result.exit_code == 0
    assert calls == [(Problem(128, 7168, 2048, "fp16", "fp16", "M", "K"), DeviceSpec("sm_90a", 100), 5)]
    text = result.stdout
    assert SMALL.name in text and SMALL5.name in text and "12.5" in text and "waves=2" in text
    assert "register budget exceeded" in text and "model" in text
    assert text.index(SMALL.name) < text.index(SMALL5.name)

    result, report = invoke_json("explain", 128, 7168, 2048, "--out-dtype", "fp32", "--arch", "sm_90a")
    assert report == {**STUB_REPORT, "source": "heuristics"}
    assert calls[-1][0].out_dtype == "fp32" and calls[-1][1] == DeviceSpec("sm_90a", 132)


def test_explain_errors_are_clean(monkeypatch, no_gpu):
    def fails(problem, device, top=5):
        raise ValueError("no heuristics for this")

    monkeypatch.setattr(heuristics, "explain", fails, raising=False)
    result = invoke("explain", 1, 2, 3)
    assert result.exit_code == 1 and "no heuristics for this" in result.stderr
    monkeypatch.delattr(heuristics, "explain")
    result = invoke("explain", 1, 2, 3)
    assert result.exit_code == 1 and "explain" in result.stderr
    assert invoke("explain", 0, 2, 3).exit_code == 2


def test_explain_with_the_real_heuristics():
    if not hasattr(heuristics, "explain"):
        pytest.skip("jitgemm.heuristics.explain is not written yet")
    problem = Problem(128, 7168, 2048)
    result, report = invoke_json("explain", 128, 7168, 2048, *TARGET)
    assert result.exit_code == 0
    assert KernelConfig.from_dict(report["chosen"]) == heuristics.select(problem, H200)
    text = invoke("explain", 128, 7168, 2048, *TARGET).stdout
    assert heuristics.select(problem, H200).name in text


def test_explain_says_where_gemm_runs_the_decode_kernel_instead(monkeypatch):
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    _, report = invoke_json("explain", 2, 50257, 4096, *TARGET)  # a row-major b of odd N
    assert "decode kernel" in report["decode"] and "N = 50257" in report["decode"]
    _, report = invoke_json("explain", 16, 4096, 4097, "--layout", "nn", *TARGET)  # W.t() of odd K
    assert "K-major decode kernel" in report["decode"] and "K = 4097" in report["decode"]
    for args in (
        (5, 50257, 4096),  # 5 rows of a against a row-major b
        (2, 50256, 4096),  # aligned rows
        (2, 50257, 4096, "--layout", "nn"),  # W.t() of aligned K
        (17, 4096, 4097, "--layout", "nn"),  # 17 rows of a against W.t()
    ):
        assert "decode" not in invoke_json("explain", *args, *TARGET)[1]
    forced = heuristics.select(Problem(2, 50257, 4096), H200).to_json()
    assert "decode" not in invoke_json("explain", 2, 50257, 4096, *TARGET, "--config", forced)[1]


# ---- the installed console script ----


def test_console_script_end_to_end(tmp_cache, tmp_path):
    exe = shutil.which("jitgemm")
    base = [exe] if exe else [sys.executable, "-m", "jitgemm.cli"]
    env = dict(os.environ, JITGEMM_CACHE_DIR=str(tmp_cache))

    # cwd away from the checkout, whose jitgemm/ would shadow the installed package
    def run(*args):
        return subprocess.run(base + list(args), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    out = run("precompile", "--m", "64", "--n", "512", "--k", "1024", *TARGET, "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    listing = json.loads(run("cache", "list", "--json").stdout)
    built = [r["key"] for r in summary["kernels"]]
    built += [r["key"] for name in ("staging", "decode", "decode_cols") for r in summary[name].values()]
    assert sorted(e["key"] for e in listing["entries"]) == sorted(built)
    for name in ("staging", "decode", "decode_cols"):
        assert list(summary[name]) == ["sm_90a"] and summary[name]["sm_90a"]["status"] == "compiled"
    assert run("cache", "verify").returncode == 0
    assert run("--version").stdout.strip().endswith(__import__("jitgemm").__version__)


def test_problems_with_c_from_the_flag_and_the_shape_file(tmp_cache, tmp_path):
    # kernels for gemm(..., c=...) add beta * C in the epilogue: a deployment must be able to build them
    shapes = tmp_path / "shapes.json"
    shapes.write_text(
        json.dumps(
            [
                {"m": 128, "n": 4096, "k": 7168, "c": True},
                {"m": 128, "n": 4096, "k": 7168, "c": "no"},
                {"m": 256, "n": 4096, "k": 7168},
            ]
        )
    )
    result, summary = invoke_json("precompile", shapes, "--dry-run", "--arch", "sm_90a", "--num-sms", 132)
    assert result.exit_code == 0
    with_c = {p["m"]: p["c"] for kernel in summary["kernels"] for p in kernel["problems"] if p["c"]}
    assert with_c == {128: True} and all(
        ("C" in k["kernel"].split("_")) == k["config"]["has_c"] for k in summary["kernels"]
    )
    result, summary = invoke_json("precompile", shapes, "--with-c", "--dry-run", "--arch", "sm_90a", "--num-sms", 132)
    assert sorted((p["m"], p["c"]) for kernel in summary["kernels"] for p in kernel["problems"]) == [
        (128, False),
        (128, True),
        (256, True),
    ]  # the file's own "c" wins over the flag
    result, report = invoke_json("explain", 128, 4096, 7168, "--with-c", "--arch", "sm_90a", "--num-sms", 132)
    assert result.exit_code == 0 and report["chosen"]["has_c"]
    shapes.write_text(json.dumps([{"m": 1, "n": 2, "k": 3, "c": "maybe"}]))
    result = invoke("precompile", shapes, "--dry-run", "--arch", "sm_90a")
    assert result.exit_code == 2 and "c must be true or false" in result.output
