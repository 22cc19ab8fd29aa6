"""The dispatch table (issue 18, item 2): precompile records the heuristics' choices, a fresh
process answers from them without the cost model, runs merge, the trust rules hold, and plan,
explain and the cache commands know the table (CPU only)."""

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from child_process import child_pythonpath
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from jitgemm import cache as cache_mod
from jitgemm import cli, dispatch, plan, tuned
from jitgemm.cache import CacheWarning, KernelCache
from jitgemm.config import KernelConfig
from jitgemm.heuristics import DeviceSpec, check_config, rules, select
from jitgemm.models import MODELS
from jitgemm.problem import Problem

ROOT = Path(__file__).resolve().parent.parent
H200 = DeviceSpec("sm_90a", 132)
TARGET = ["--arch", "sm_90a", "--num-sms", "132"]
OTHER_UID = 12345
N, K = 512, 1024


def P(m, n=N, k=K, **kw):
    return Problem(m, n, k, **kw)


# Configs valid for P(m) with m >= 200: the heuristics' choice for M = 256 and two variants.
X = select(P(256), H200)
Y = rules.with_fields(X, num_stages=X.num_stages - 1)
Z = rules.with_fields(X, num_stages=X.num_stages - 2)


def invoke(*args, env=None):
    return CliRunner(catch_exceptions=False).invoke(cli.main, [str(a) for a in args], env=env)


def table_file(root) -> Path:
    return Path(root) / "dispatch" / "sm_90a-132.json"


def runs_of(root, key=None):
    """{problem key: [(lo, hi, config)]} of the table under `root`."""
    items = dispatch.read_table(table_file(root), H200).items()
    return items if key is None else items[key]


def record(ms, cfg, **kw):
    result = dispatch.record([(P(m, **kw), cfg) for m in ms], H200)
    assert result.written, result.reason
    return result


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("JITGEMM_CONFIG", tuned.ENV_TUNED, dispatch.ENV_TABLE, "JITGEMM_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cli, "_local_gpu", lambda: None)


@contextlib.contextmanager
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ---- runs ----


def test_runs_join_equal_consecutive_ms_only():
    assert dispatch.runs_from_points({1: "a", 2: "a", 3: "b", 5: "b", 6: "b"}) == [
        (1, 2, "a"),
        (3, 3, "b"),
        (5, 6, "b"),  # 4 was not chosen: no run covers it
    ]


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ([(1, 10, "a")], [(11, 20, "a")], [(1, 20, "a")]),  # adjacent, equal: joined
        ([(1, 10, "a")], [(11, 20, "b")], [(1, 10, "a"), (11, 20, "b")]),  # adjacent, different
        ([(1, 10, "a")], [(5, 20, "b")], [(1, 4, "a"), (5, 20, "b")]),  # overlapping: new wins
        ([(1, 10, "a")], [(4, 6, "b")], [(1, 3, "a"), (4, 6, "b"), (7, 10, "a")]),  # inside: split
        ([(1, 10, "a")], [(1, 10, "b")], [(1, 10, "b")]),  # replaced
        ([(1, 3, "a"), (4, 6, "b"), (7, 9, "a")], [(4, 6, "a")], [(1, 9, "a")]),  # replaced, joined
        ([(1, 2, "a"), (5, 6, "b"), (9, 10, "c")], [(2, 9, "d")], [(1, 1, "a"), (2, 9, "d"), (10, 10, "c")]),
        ([(5, 6, "a")], [(1, 2, "b"), (9, 9, "b")], [(1, 2, "b"), (5, 6, "a"), (9, 9, "b")]),  # disjoint
        ([], [(3, 4, "a")], [(3, 4, "a")]),
    ],
)
def test_merge_runs(old, new, expected):
    assert dispatch.merge_runs(old, new) == expected


points = st.dictionaries(st.integers(1, 60), st.sampled_from("abc"), max_size=40)


@settings(max_examples=200, deadline=None)
@given(points, points)
def test_merge_runs_is_the_new_points_over_the_old(old, new):
    merged = dispatch.merge_runs(dispatch.runs_from_points(old), dispatch.runs_from_points(new))
    assert merged == dispatch.runs_from_points({**old, **new})


# ---- recording and merging ----


def test_record_merges_runs_and_keeps_other_problems(tmp_cache):
    key = dispatch.problem_key(P(1))
    record(range(200, 221), X)
    record(range(200, 221), X, n=1024)  # another problem: kept by the writes below
    assert runs_of(tmp_cache, key) == [(200, 220, X)]
    assert dispatch.lookup(P(210), H200) == X
    assert dispatch.lookup(P(199), H200) is None and dispatch.lookup(P(221), H200) is None
    record(range(215, 231), Y)  # overlapping
    assert runs_of(tmp_cache, key) == [(200, 214, X), (215, 230, Y)]
    record(range(231, 241), X)  # adjacent
    assert runs_of(tmp_cache, key) == [(200, 214, X), (215, 230, Y), (231, 240, X)]
    result = record(range(215, 231), X)  # replaced: one run again
    assert runs_of(tmp_cache, key) == [(200, 240, X)]
    assert runs_of(tmp_cache)[dispatch.problem_key(P(1, n=1024))] == [(200, 220, X)]
    assert (result.problems, result.runs, result.configs, result.shapes) == (2, 2, 1, 16)
    assert dispatch.lookup(P(222), H200) == X  # the process sees each new version of the file
    assert not any(p.name.startswith(".tmp-") for p in tmp_cache.iterdir())  # no temporary file left


def test_record_refuses_a_config_of_another_problem(tmp_cache):
    with pytest.raises(ValueError, match="dtype"):
        dispatch.record([(P(256, dtype="fp16"), X)], H200)


def test_a_model_over_8192_ms_stays_small_and_answers_from_memory(tmp_cache):
    """--m 1:8192 over four (N, K): runs of equal configs, not one row per M."""
    configs = [rules.with_fields(X, num_stages=s) for s in range(3, 8)]
    choices = [
        (P(m, n, k), configs[(m.bit_length() + i) % len(configs)])
        for i, (n, k) in enumerate(MODELS["llama-3-8b"].pairs)
        for m in range(1, 8193)
    ]
    result = dispatch.record(choices, H200)
    assert result.written and result.shapes == 4 * 8192 and result.runs == 4 * 14
    assert table_file(tmp_cache).stat().st_size < 8000
    table = dispatch.read_table(table_file(tmp_cache), H200)
    assert all(table.find(p) == cfg for p, cfg in choices)
    assert table.find(P(8193, 6144, 4096)) is None


# ---- a fresh process answers from the table (precompile writes it; --dry-run does not) ----

FRESH = r"""
import json, sys
import jitgemm.heuristics as heuristics
from jitgemm import plan, registry
from jitgemm.heuristics import DeviceSpec
from jitgemm.problem import Problem

def no_cost_model(*args, **kwargs):
    raise AssertionError("the cost model ran")

heuristics.select = no_cost_model
registry.get("sm_90a").rules.select = no_cost_model
out = {}
for m in map(int, sys.argv[1:]):
    try:
        cfg, source = plan.choose(Problem(m, 512, 1024), DeviceSpec("sm_90a", 132))
        out[m] = [source, cfg.to_dict()]
    except AssertionError as exc:
        out[m] = ["raised", str(exc)]
print(json.dumps(out))
"""


def fresh_process(root, *ms, **env):
    done = subprocess.run(
        [sys.executable, "-c", FRESH, *map(str, ms)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=dict(os.environ, JITGEMM_CACHE_DIR=str(root), PYTHONPATH=child_pythonpath(), **env),
    )
    assert done.returncode == 0, done.stderr
    return {int(m): v for m, v in json.loads(done.stdout).items()}, done.stderr


def test_precompile_writes_the_table_and_a_fresh_process_answers_from_it(tmp_cache):
    shape = ["--m", "1:8", "--n", N, "--k", K, *TARGET]
    dry = invoke("precompile", *shape, "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    summary = json.loads(dry.stdout)
    assert summary["table"]["written"] is False and summary["table"]["reason"] == "dry run"
    assert summary["table"]["shapes"] == 8
    assert not tmp_cache.exists()  # a dry run writes nothing at all

    real = invoke("precompile", *shape, "--json")
    assert real.exit_code == 0, real.output
    summary = json.loads(real.stdout)
    assert summary["sources"] == {"heuristics": 8}
    assert summary["table"]["written"] and summary["table"]["path"] == str(table_file(tmp_cache))
    chosen = {p["m"]: r["config"] for r in summary["kernels"] for p in r["problems"]}
    assert chosen == {m: select(P(m), H200).to_dict() for m in range(1, 9)}

    answers, stderr = fresh_process(tmp_cache, *range(1, 10))
    assert {m: answers[m] for m in range(1, 9)} == {m: ["table", chosen[m]] for m in range(1, 9)}
    assert answers[9][0] == "raised"  # not covered: the heuristics run
    assert "Warning" not in stderr
    off, _ = fresh_process(tmp_cache, 3, JITGEMM_DISPATCH_TABLE="0")
    assert off[3][0] == "raised"

    again = invoke("precompile", *shape, "--json")  # chosen from the table now, recorded again
    summary = json.loads(again.stdout)
    assert summary["sources"] == {"table": 8} and summary["hits"] == 1 and summary["table"]["written"]
    text = invoke("precompile", *shape).stdout
    assert "configs from the dispatch table" in text and "dispatch table " + str(table_file(tmp_cache)) in text


def _fake_build_all(configs, jobs):
    return [{"status": "hit", "key": "0" * 64, "seconds": 0.0, "compile_seconds": 0.0, "cached": True} for _ in configs]


def test_only_the_heuristics_choices_are_recorded(tmp_cache, monkeypatch):
    monkeypatch.setattr(cli, "_build_all", _fake_build_all)
    monkeypatch.setattr(cli, "_build_fixed", lambda kernel, arch: _fake_build_all([arch], 1)[0])
    shape = ["--m", "256", "--n", N, "--k", K, *TARGET, "--json"]
    result = invoke("precompile", *shape, "--no-table")
    assert json.loads(result.stdout)["table"]["reason"] == "--no-table" and not tmp_cache.exists()
    monkeypatch.setenv("JITGEMM_CONFIG", json.dumps({"num_stages": Y.num_stages}))
    summary = json.loads(invoke("precompile", *shape).stdout)
    assert summary["sources"] == {"env": 1} and summary["table"]["written"] is False
    assert not table_file(tmp_cache).exists()
    monkeypatch.delenv("JITGEMM_CONFIG")
    tuned.write_entry(tuned.device_key("GPU", H200), tuned.problem_key(P(256)), {"config": Y.to_dict()})
    summary = json.loads(invoke("precompile", *shape).stdout)
    assert summary["sources"] == {"tuning": 1} and not table_file(tmp_cache).exists()
    summary = json.loads(invoke("precompile", *shape, "--config", Z.to_json()).stdout)
    assert not table_file(tmp_cache).exists()  # --config builds a kernel, records no choice
    monkeypatch.setenv(tuned.ENV_TUNED, "0")
    summary = json.loads(invoke("precompile", *shape).stdout)
    assert summary["sources"] == {"heuristics": 1} and summary["table"]["written"]
    assert runs_of(tmp_cache, dispatch.problem_key(P(256))) == [(256, 256, X)]


def test_failed_kernels_are_not_recorded(tmp_cache, monkeypatch):
    monkeypatch.setattr(cli, "_build_all", lambda configs, jobs: [{"status": "error", "error": "x"} for _ in configs])
    monkeypatch.setattr(cli, "_build_fixed", lambda kernel, arch: _fake_build_all([arch], 1)[0])
    result = invoke("precompile", "--m", "256", "--n", N, "--k", K, *TARGET, "--json")
    assert result.exit_code == 1 and not table_file(tmp_cache).exists()


# ---- precedence and explain ----


def explained(*extra, env=None):
    result = invoke("explain", 256, N, K, *TARGET, *extra, "--json", env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    return KernelConfig.from_dict(report["chosen"]), report["source"]


def test_precedence_argument_env_tuning_table_heuristics(tmp_cache, monkeypatch):
    p = P(256)
    heur = select(p, H200)
    assert plan.choose(p, H200) == (heur, "heuristics") and explained() == (heur, "heuristics")
    record([256], Z)  # a table normally holds the heuristics' own choice: another tells them apart
    assert plan.choose(p, H200) == (Z, "table") and explained() == (Z, "table")
    text = invoke("explain", 256, N, K, *TARGET).stdout
    assert "source:    the dispatch table" in text and f"table:     {table_file(tmp_cache)}" in text
    monkeypatch.setenv(dispatch.ENV_TABLE, "0")
    assert plan.choose(p, H200) == (heur, "heuristics") and explained() == (heur, "heuristics")
    monkeypatch.delenv(dispatch.ENV_TABLE)
    tuned.write_entry(tuned.device_key("GPU", H200), tuned.problem_key(p), {"config": Y.to_dict()})
    assert plan.choose(p, H200) == (Y, "tuning") and explained() == (Y, "tuning")
    monkeypatch.setenv("JITGEMM_CONFIG", json.dumps(X.to_dict()))
    assert plan.choose(p, H200) == (X, "env") and explained() == (X, "env")
    assert plan.choose(p, H200, config=Z) == (Z, "argument") and explained("--config", Z.to_json()) == (Z, "argument")
    monkeypatch.setenv(dispatch.ENV_TABLE, "maybe")
    with pytest.raises(ValueError, match=dispatch.ENV_TABLE):
        dispatch.enabled()


def test_explain_says_when_the_table_agrees_with_the_heuristics(tmp_cache):
    record([256], X)
    text = invoke("explain", 256, N, K, *TARGET).stdout
    assert f"heuristics: {X.name} (the same)" in text


def test_the_table_of_another_target_is_not_used(tmp_cache):
    record([256], Z)
    other = DeviceSpec("sm_90a", 114)
    assert plan.choose(P(256), other) == (select(P(256), other), "heuristics")
    # a table renamed to another target's name says which one it is for
    path = table_file(tmp_cache)
    path.rename(path.with_name("sm_90a-114.json"))
    with pytest.warns(CacheWarning, match="written for 'sm_90a' with 132 SMs"):
        assert plan.choose(P(256), other)[1] == "heuristics"


# ---- trust rules: ignored with a warning, never a crash, the heuristics decide ----


def _rewrite(path, change):
    data = path.read_bytes()
    path.write_bytes(change(data))


def _body(data):
    return json.loads(data)["table"]


def _with_raw(path, text: bytes):
    """`text` as the table's body, under a valid sha256 (only the content checks can refuse it)."""
    path.write_bytes(dispatch._HEAD + hashlib.sha256(text).hexdigest().encode() + dispatch._MID + text + b"}\n")


def _with_body(path, body):
    _with_raw(path, json.dumps(body, separators=(",", ":")).encode())


def _corrupt_json(path):
    path.write_text("{not json")
    return "not a jitgemm dispatch table"


def _truncated(path):
    _rewrite(path, lambda d: d[: len(d) // 2])
    return "not a jitgemm dispatch table"


def _empty(path):
    path.write_bytes(b"")
    return "not a jitgemm dispatch table"


def _hash_mismatch(path):
    _rewrite(path, lambda d: d.replace(b'"num_stages":', b'"num_stages": '))
    return "does not match its sha256"


def _deep(path):
    _with_raw(path, b"[" * 100_000)  # invalid JSON under a valid hash
    return "nested too deeply|not valid JSON"


def _not_a_table(path):
    _with_body(path, [1, 2])
    return "not a schema-1"


def _bad_run(path):
    body = _body(path.read_bytes())
    key = next(iter(body["problems"]))
    body["problems"][key] = [[256, 256.0, 0]]
    _with_body(path, body)
    return "a run must be"


def _unsorted_runs(path):
    body = _body(path.read_bytes())
    key = next(iter(body["problems"]))
    body["problems"][key] = [[300, 310, 0], [256, 256, 0]]
    _with_body(path, body)
    return "out of order"


def _bad_index(path):
    body = _body(path.read_bytes())
    key = next(iter(body["problems"]))
    body["problems"][key] = [[256, 256, 7]]
    _with_body(path, body)
    return "names no config"


def _bool_field(path):
    body = _body(path.read_bytes())
    body["configs"][0]["split_k"] = True
    _with_body(path, body)
    return "split_k must be"


def _missing_field(path):
    body = _body(path.read_bytes())
    del body["configs"][0]["b_tail"]
    _with_body(path, body)
    return "exactly the KernelConfig fields"


def _group_writable(path):
    path.chmod(0o620)
    return "writable by group or others"


def _world_writable_dir(path):
    path.parent.chmod(0o777)
    return "writable by group or others"


def _symlink(path):
    real = path.with_name("elsewhere.json")
    path.rename(real)
    path.symlink_to(real)
    return "symlink"


def _symlinked_dir(path):
    real = path.parent.with_name("elsewhere")
    path.parent.rename(real)
    path.parent.symlink_to(real, target_is_directory=True)
    return "symlink"


def _fifo(path):
    path.unlink()
    os.mkfifo(path, 0o600)
    return "not a regular file"


def _foreign_uid(path, monkeypatch):
    """Seen as another user, with root's files no longer shared: the cache is someone else's."""
    owner = os.geteuid()
    monkeypatch.setattr(cache_mod, "SHARED_OWNER_UID", OTHER_UID + 2)
    monkeypatch.setattr(os, "geteuid", lambda: OTHER_UID if owner != OTHER_UID else OTHER_UID + 1)
    return "owned by uid"


def _chowned(path):
    os.chown(path, OTHER_UID, OTHER_UID)
    return f"owned by uid {OTHER_UID}"


CASES = [
    _corrupt_json,
    _truncated,
    _empty,
    _hash_mismatch,
    _deep,
    _not_a_table,
    _bad_run,
    _unsorted_runs,
    _bad_index,
    _bool_field,
    _missing_field,
    _group_writable,
    _world_writable_dir,
    _symlink,
    _symlinked_dir,
    _fifo,
    _foreign_uid,
    pytest.param(
        _chowned, marks=pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
    ),
]


@contextlib.contextmanager
def no_hang(seconds=20):
    def timed_out(signum, frame):
        raise TimeoutError(f"hung for {seconds} s")

    previous = signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("spoil", CASES, ids=lambda f: f.__name__.strip("_"))
def test_an_untrusted_or_broken_table_is_ignored_with_one_warning(tmp_cache, monkeypatch, spoil):
    record([256], Z)
    path = table_file(tmp_cache)
    assert dispatch.read_table(path, H200).find(P(256)) == Z
    args = (path, monkeypatch) if spoil is _foreign_uid else (path,)
    reason = spoil(*args)
    heur = (select(P(256), H200), "heuristics")
    with no_hang():
        with pytest.warns(CacheWarning, match=f"ignoring the dispatch table .*({reason})"):
            assert plan.choose(P(256), H200) == heur
        with no_warnings():  # once per file state
            assert plan.choose(P(256), H200) == heur
            assert dispatch.lookup(P(257), H200) is None
        listed = invoke("cache", "list", "--json")  # a crash would raise here
        if spoil is _foreign_uid:  # the whole cache is someone else's: refused, as before
            assert listed.exit_code == 1 and "owned by uid" in listed.output
        else:
            assert listed.exit_code == 0, listed.output
            [shown] = json.loads(listed.stdout)["dispatch_tables"]
            assert shown["status"].startswith("ignored")


@pytest.mark.parametrize("spoil", [_corrupt_json, _hash_mismatch, _symlink, _fifo, _group_writable])
def test_precompile_replaces_an_unusable_table(tmp_cache, spoil):
    record([256], Z)
    path = table_file(tmp_cache)
    spoil(path)
    with no_hang(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        result = dispatch.record([(P(300), Y)], H200)
    assert result.written and "replaced an unusable table" in result.note
    assert path.is_file() and not path.is_symlink() and (path.stat().st_mode & 0o077) == 0
    assert runs_of(tmp_cache, dispatch.problem_key(P(1))) == [(300, 300, Y)]


def test_a_table_from_other_heuristics_is_ignored(tmp_cache, monkeypatch):
    with monkeypatch.context() as patched:
        patched.setattr(dispatch, "fingerprint", lambda: "0" * 64)
        record([256], Z)
    with pytest.warns(CacheWarning, match="written by other heuristics"):
        assert plan.choose(P(256), H200) == (select(P(256), H200), "heuristics")
    [shown] = dispatch.describe()
    assert shown["status"].startswith("stale:")
    result = record([300], Y)  # precompile writes it again, for this heuristics only
    assert "replaced a stale table" in result.note
    assert runs_of(tmp_cache) == {dispatch.problem_key(P(1)): [(300, 300, Y)]}


def test_the_fingerprint_covers_the_heuristics_sources():
    labels = [label for label, _ in dispatch._fingerprint_sources()]
    assert "heuristics/sm90.py" in labels and "heuristics/__init__.py" in labels
    assert "jitgemm/archs/sm90/arch.py" in labels and "jitgemm/geometry.py" in labels
    assert len(dispatch.fingerprint()) == 64 and dispatch.fingerprint() == dispatch.fingerprint()


@pytest.mark.parametrize(
    "wrong, reason",
    [
        (rules.with_fields(X, dtype="fp16", block_k=64), "dtype"),  # another problem's config
        (rules.with_fields(X, has_c=True), "has_c"),
        (rules.with_fields(select(P(8), H200), a_rows=8), "a_rows"),  # for M <= 8, not 256
    ],
)
def test_a_config_that_does_not_fit_the_problem_is_ignored(tmp_cache, wrong, reason):
    record([256], Z)
    body = _body(table_file(tmp_cache).read_bytes())
    body["configs"][0] = wrong.to_dict()
    _with_body(table_file(tmp_cache), body)
    with pytest.warns(CacheWarning, match=f"cannot run it .*{reason}"):
        assert plan.choose(P(256), H200) == (select(P(256), H200), "heuristics")
    assert check_config(wrong, P(256), H200)


def test_no_table_no_warning(tmp_cache):
    with no_warnings():
        assert dispatch.lookup(P(256), H200) is None
        tmp_cache.mkdir()
        assert dispatch.lookup(P(256), H200) is None
        assert dispatch.describe() == []


# ---- offline and shared caches: read, never written ----


def test_offline_reads_the_table_and_writes_nothing(tmp_cache, monkeypatch):
    record([256], Z)
    before = table_file(tmp_cache).read_bytes()
    monkeypatch.setenv("JITGEMM_OFFLINE", "1")
    assert plan.choose(P(256), H200) == (Z, "table")
    result = dispatch.record([(P(300), Y)], H200)
    assert not result.written and "JITGEMM_OFFLINE=1" in result.reason
    assert table_file(tmp_cache).read_bytes() == before


def test_a_shared_cache_of_roots_is_read_never_written(tmp_cache, monkeypatch):
    record([256], Z)
    before = table_file(tmp_cache).read_bytes()
    owner = os.geteuid()
    monkeypatch.setattr(cache_mod, "SHARED_OWNER_UID", owner)
    monkeypatch.setattr(os, "geteuid", lambda: OTHER_UID if owner != OTHER_UID else OTHER_UID + 1)
    with no_warnings():
        assert plan.choose(P(256), H200) == (Z, "table")
    result = dispatch.record([(P(300), Y)], H200)
    assert not result.written and "shared cache" in result.reason
    assert table_file(tmp_cache).read_bytes() == before


def test_an_unwritable_root_is_reported_not_raised(tmp_path, monkeypatch):
    root = tmp_path / "file"
    root.write_text("not a directory")
    monkeypatch.setenv("JITGEMM_CACHE_DIR", str(root))
    result = dispatch.record([(P(300), Y)], H200)
    assert not result.written and "cannot be written" in result.reason


# ---- the cache commands ----


def test_cache_list_clear_prune_and_env_know_the_table(tmp_cache):
    record(range(256, 260), Z)
    (tmp_cache / "stranger.txt").write_text("not ours")
    listed = json.loads(invoke("cache", "list", "--json").stdout)
    assert listed["count"] == 0
    [shown] = listed["dispatch_tables"]
    assert (shown["status"], shown["shapes"], shown["runs"], shown["configs"]) == ("ok", 4, 1, 1)
    assert "dispatch table" in invoke("cache", "list").stdout
    env = json.loads(invoke("env", "--json").stdout)
    assert env["cache"]["dispatch_tables"][0]["path"] == str(table_file(tmp_cache))
    assert any(v["name"] == dispatch.ENV_TABLE and v["effective"] == "on" for v in env["variables"])
    assert invoke("cache", "prune", "--older-than", "0s").exit_code == 0
    assert table_file(tmp_cache).exists()  # prune is about kernels
    assert KernelCache(tmp_cache).entries() == [] and invoke("cache", "verify").exit_code == 0
    cleared = invoke("cache", "clear", "--yes")
    assert cleared.exit_code == 0 and "removed 1 dispatch table" in cleared.stdout
    assert not (tmp_cache / "dispatch").exists() and "stranger.txt" in cleared.stderr
    assert plan.choose(P(256), H200)[1] == "heuristics"


# ---- --model presets ----


def test_model_presets_are_the_public_configs_layers():
    assert MODELS["llama-3-8b"].pairs == [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
    assert MODELS["mistral-7b"].pairs == MODELS["llama-3-8b"].pairs
    assert MODELS["llama-3-70b"].pairs == [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
    assert MODELS["qwen2.5-7b"].pairs == [(4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)]
    assert MODELS["deepseek-v3-mlp"].pairs == [(36864, 7168), (7168, 18432)]
    assert MODELS["deepseek-v3-mla"].pairs == [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384)]


def test_precompile_model_needs_m_and_composes_with_the_other_options(tmp_cache):
    result = invoke("precompile", "--model", "deepseek-v3-mlp", *TARGET, "--dry-run")
    assert result.exit_code == 2 and "--model needs --m" in result.output
    result = invoke("precompile", "--model", "nope", "--m", 1, "--dry-run")
    assert result.exit_code == 2 and "llama-3-8b" in result.output
    result = invoke("precompile", "--model", "DeepSeek-V3-MLP", "--m", "64", "--n", 512, *TARGET, "--dry-run")
    assert result.exit_code == 2 and "--k" in result.output
    result = invoke(
        "precompile", "--model", "deepseek-v3-mlp", "--m", 64, "--layout", "tn", *TARGET, "--dry-run", "--json"
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    shapes = {(p["m"], p["n"], p["k"], p["layout"]) for r in summary["kernels"] for p in r["problems"]}
    assert shapes == {(64, 36864, 7168, "tn"), (64, 7168, 18432, "tn")}
    assert summary["models"] == {"deepseek-v3-mlp": [[36864, 7168], [7168, 18432]]}
    result = invoke(
        "precompile", "--model", "deepseek-v3-mlp", "--m", 64, "--n", 512, "--k", 1024, *TARGET, "--dry-run", "--json"
    )
    assert json.loads(result.stdout)["shapes"] == 3
    assert not tmp_cache.exists()
