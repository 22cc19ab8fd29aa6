"""The tuning file and how gemm consults it (CPU only; tests/test_gpu_tuning.py times kernels)."""

import json
import types
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

from jitgemm import api, cli, plan, tuned, tuning
from jitgemm.arrays import numpy_dtype
from jitgemm.cache import KernelCache
from jitgemm.heuristics import DeviceSpec, check_config, rules, select
from jitgemm.problem import Problem

H200 = DeviceSpec("sm_90a", 132)
GPU = "NVIDIA H200"
P = Problem(128, 576, 7168)


def _other_config(problem):
    """A valid config for `problem` that the heuristics do not choose."""
    chosen = select(problem, H200)
    cfg = rules.with_fields(chosen, split_k=1 if chosen.split_k > 1 else 2)
    assert not check_config(cfg, problem, H200) and cfg != chosen
    return cfg


def _record(cfg):
    return {"config": cfg.to_dict(), "name": cfg.name, "us": 1.0}


def test_keys_tell_problems_and_devices_apart():
    keys = {
        tuned.problem_key(p)
        for p in [
            P,
            Problem(128, 576, 7168, "fp16", "fp16"),
            Problem(576, 128, 7168),
            Problem(128, 576, 7168, a_major="M"),
            Problem(128, 576, 7168, has_c=True),
            Problem(128, 576, 7168, out_dtype="fp32"),
        ]
    }
    assert len(keys) == 6
    assert tuned.device_key(GPU, H200) != tuned.device_key(GPU, DeviceSpec("sm_90a", 114))


def test_entries_round_trip_and_merge(tmp_cache):
    cfg = _other_config(P)
    path = tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), _record(cfg))
    assert path == tmp_cache / "tuned.json"
    q = Problem(64, 4096, 7168)
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(q), _record(select(q, H200)))
    tuned.write_entry("other GPU|sm_90a|132 SMs", tuned.problem_key(P), _record(select(P, H200)))
    devices = tuned.read_entries()
    assert set(devices) == {tuned.device_key(GPU, H200), "other GPU|sm_90a|132 SMs"}
    assert set(devices[tuned.device_key(GPU, H200)]) == {tuned.problem_key(P), tuned.problem_key(q)}
    assert tuned.tuned_config(P, H200, GPU) == cfg
    assert tuned.tuned_config(P, H200, "other GPU") == select(P, H200)
    assert tuned.tuned_config(P, DeviceSpec("sm_90a", 114), GPU) is None  # another SM count
    assert tuned.tuned_config(Problem(129, 576, 7168), H200, GPU) is None  # another shape


def test_a_corrupt_file_is_reported_ignored_and_replaced(tmp_cache):
    tmp_cache.mkdir(parents=True)
    (tmp_cache / "tuned.json").write_text("{not json")
    with pytest.warns(tuned.TuningWarning, match="ignoring the tuning file"):
        assert tuned.read_entries() == {}
    assert tuned.tuned_config(P, H200, GPU) is None
    cfg = _other_config(P)
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), _record(cfg))
    assert json.loads((tmp_cache / "tuned.json").read_text())["schema"] == tuned.SCHEMA
    assert tuned.tuned_config(P, H200, GPU) == cfg


@pytest.mark.parametrize(
    "record",
    [
        {"config": {"block_m": 128, "no_such_field": 1}},  # unknown field
        {"config": {"block_m": 96}},  # invalid value
        {"name": "no config"},
        "not a record",
    ],
)
def test_bad_records_are_ignored(tmp_cache, record):
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), record)
    assert tuned.tuned_config(P, H200, GPU) is None


def test_a_record_that_no_longer_fits_the_problem_is_ignored(tmp_cache):
    fp16 = select(Problem(128, 576, 7168, "fp16", "fp16"), H200)  # the wrong dtype for P
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), _record(fp16))
    assert tuned.tuned_config(P, H200, GPU) is None


def test_a_record_with_a_rows_short_of_m_is_ignored(tmp_cache, monkeypatch):
    """a_rows=8 would load 8 of each tile's rows for M = 4096 (issue 16): the entry is skipped."""
    monkeypatch.setattr(api, "device_spec", lambda dev: H200)
    monkeypatch.setattr(api.runtime, "device_info", lambda dev: types.SimpleNamespace(name=GPU))
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    big = Problem(4096, 4096, 4096)
    short = rules.with_fields(select(big, H200), a_rows=8)
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(big), _record(short))
    assert tuned.tuned_config(big, H200, GPU) is None
    assert api.config_for(big) == select(big, H200)


def test_gemm_follows_config_then_env_then_tuning_then_heuristics(tmp_cache, monkeypatch):
    monkeypatch.setattr(api, "device_spec", lambda dev: H200)
    monkeypatch.setattr(api.runtime, "device_info", lambda dev: types.SimpleNamespace(name=GPU))
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    assert api.config_for(P) == select(P, H200)
    from_file = _other_config(P)
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), _record(from_file))
    assert api.config_for(P) == from_file
    monkeypatch.setenv(tuned.ENV_TUNED, "0")
    assert api.config_for(P) == select(P, H200)
    monkeypatch.delenv(tuned.ENV_TUNED)
    explicit = rules.with_fields(from_file, num_stages=from_file.num_stages - 1)
    assert api._config_for(P, 0, explicit) == explicit
    monkeypatch.setenv("JITGEMM_CONFIG", json.dumps(explicit.to_dict()))
    assert api.config_for(P) == explicit


def test_plan_choose_names_the_source_of_each_choice(tmp_cache, monkeypatch):
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    assert plan.choose(P, H200, GPU) == (select(P, H200), "heuristics")
    from_file = _other_config(P)
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), _record(from_file))
    assert plan.choose(P, H200, GPU) == (from_file, "tuning")
    assert plan.choose(P, H200, lambda: GPU) == (from_file, "tuning")
    assert plan.choose(P, H200, "another GPU") == (select(P, H200), "heuristics")
    assert plan.choose(P, H200) == (from_file, "tuning")  # no name: any GPU of the arch and SM count
    assert plan.choose(P, DeviceSpec("sm_90a", 114)) == (select(P, DeviceSpec("sm_90a", 114)), "heuristics")
    env = rules.with_fields(from_file, num_stages=from_file.num_stages - 1)
    monkeypatch.setenv("JITGEMM_CONFIG", json.dumps(env.to_dict()))
    assert plan.choose(P, H200, GPU) == (env, "env")
    explicit = rules.with_fields(env, num_stages=env.num_stages - 1)
    assert plan.choose(P, H200, GPU, explicit) == (explicit, "argument")
    with pytest.raises(ValueError, match="config"):
        plan.choose(P, H200, GPU, rules.with_fields(explicit, dtype="fp16"))


def test_without_a_gpu_name_disagreeing_tuning_entries_leave_it_to_the_heuristics(tmp_cache, monkeypatch):
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    one = _other_config(P)
    other = rules.with_fields(one, num_stages=one.num_stages - 1)
    tuned.write_entry(tuned.device_key("GPU one", H200), tuned.problem_key(P), _record(one))
    tuned.write_entry(tuned.device_key("GPU two", H200), tuned.problem_key(P), _record(one))
    assert plan.choose(P, H200) == (one, "tuning")  # they agree
    tuned.write_entry(tuned.device_key("GPU two", H200), tuned.problem_key(P), _record(other))
    with pytest.warns(tuned.TuningWarning, match="GPU one, GPU two"):
        assert plan.choose(P, H200) == (select(P, H200), "heuristics")
    assert plan.choose(P, H200, "GPU two") == (other, "tuning")


def test_precompile_and_explain_follow_the_same_precedence_as_gemm(tmp_cache, monkeypatch):
    monkeypatch.setattr(cli, "_local_gpu", lambda: None)
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    target = ["--arch", "sm_90a", "--num-sms", "132"]
    shape = ["--m", str(P.m), "--n", str(P.n), "--k", str(P.k)]
    runner = CliRunner(catch_exceptions=False)

    def precompiled():
        result = runner.invoke(cli.main, ["precompile", *shape, *target, "--dry-run", "--json"])
        summary = json.loads(result.stdout)
        return [c["config"] for c in summary["kernels"]], summary["sources"]

    def explained(*extra):
        result = runner.invoke(cli.main, ["explain", str(P.m), str(P.n), str(P.k), *target, *extra, "--json"])
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        return report["chosen"], report["source"]

    assert precompiled() == ([select(P, H200).to_dict()], {"heuristics": 1})
    assert explained() == (select(P, H200).to_dict(), "heuristics")
    from_file = _other_config(P)
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), _record(from_file))
    assert precompiled() == ([from_file.to_dict()], {"tuning": 1})
    assert explained() == (from_file.to_dict(), "tuning")
    text = runner.invoke(cli.main, ["explain", str(P.m), str(P.n), str(P.k), *target]).stdout
    assert "source:    the tuning file" in text and f"{select(P, H200).name} (not used)" in text
    monkeypatch.setenv(tuned.ENV_TUNED, "0")
    assert explained() == (select(P, H200).to_dict(), "heuristics")
    monkeypatch.delenv(tuned.ENV_TUNED)
    env = rules.with_fields(from_file, num_stages=from_file.num_stages - 1)
    monkeypatch.setenv("JITGEMM_CONFIG", json.dumps(env.to_dict()))
    assert precompiled() == ([env.to_dict()], {"env": 1})
    assert explained() == (env.to_dict(), "env")
    explicit = rules.with_fields(env, num_stages=env.num_stages - 1)
    assert explained("--config", explicit.to_json()) == (explicit.to_dict(), "argument")
    bad = runner.invoke(
        cli.main, ["explain", "1", "2", "3", *target, "--dtype", "fp16", "--config", explicit.to_json()]
    )
    assert bad.exit_code == 2 and "--config" in bad.stderr and "Traceback" not in bad.output


@pytest.mark.parametrize("shape", [(128, 576, 7168), (1, 7168, 2048), (4096, 4096, 4096), (100, 129, 77)])
def test_candidates_start_with_the_heuristics_choice_and_are_all_valid(shape):
    p = Problem(*shape)
    found = tuning.candidates(p, H200, top=6)
    assert found[0] == select(p, H200)
    assert len(found) == len(set(found)) >= 2
    assert all(not check_config(c, p, H200) for c in found)
    for c in found:  # every split-K candidate comes with its unsplit variant
        if c.split_k > 1:
            assert rules.with_fields(c, split_k=1) in found


def _invoke(*args):
    return CliRunner().invoke(cli.main, list(args))


def test_cli_show_lists_the_entries(tmp_cache):
    result = _invoke("tune", "--show")
    assert result.exit_code == 0 and "0 entries" in result.output
    cfg = _other_config(P)
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), _record(cfg))
    result = _invoke("tune", "--show")
    assert result.exit_code == 0 and cfg.name in result.output and "1 entries" in result.output
    shown = json.loads(_invoke("tune", "--show", "--json").output)
    assert shown["devices"][tuned.device_key(GPU, H200)][tuned.problem_key(P)]["name"] == cfg.name


def test_cli_tune_needs_shapes_and_a_gpu(tmp_cache, monkeypatch):
    result = _invoke("tune")
    assert result.exit_code == 2 and "no shapes" in result.output
    result = _invoke("tune", "--m", "128")
    assert result.exit_code == 2 and "--n, --k" in result.output
    monkeypatch.setattr(cli.runtime, "device_count", lambda: 0)
    result = _invoke("tune", "--m", "128", "--n", "576", "--k", "7168")
    assert result.exit_code == 1 and "needs a local GPU" in result.output


def test_cache_clear_keeps_the_tuning_file_and_does_not_call_it_foreign(tmp_cache):
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), _record(select(P, H200)))
    (tmp_cache / "stranger.txt").write_text("not ours")
    removed, unknown = KernelCache(tmp_cache).clear()
    assert unknown == ["stranger.txt"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuned.tuned_config(P, H200, GPU) == select(P, H200)


@pytest.mark.parametrize(
    "passes, expected",
    [
        ({"h": [10.0, 10.0, 10.0], "x": [9.7, 9.7, 9.7]}, "x"),  # 3% faster in every pass
        ({"h": [10.0, 10.0, 10.0], "x": [9.9, 9.9, 9.9]}, "h"),  # 1%: within the drift
        ({"h": [10.0, 10.0, 10.0], "x": [9.0, 9.0, 9.95]}, "h"),  # one pass not clearly faster
        ({"h": [10.0, 10.0, 10.0], "x": [9.5, 9.5, 9.5], "y": [9.0, 9.0, 9.0]}, "y"),
        ({"h": [10.0, 9.0, 10.0], "x": [9.5, 9.5, 9.5]}, "h"),
        ({"h": [9.0, 9.0, 9.0], "x": [9.5, 9.5, 9.5]}, "h"),  # the heuristics were right
    ],
)
def test_pick_keeps_the_heuristics_choice_unless_clearly_beaten(passes, expected):
    assert tuning.pick(passes, "h") == expected


@pytest.mark.parametrize(
    "fields",
    [
        {"block_n": 64.0},  # a float where an int belongs
        {"split_k": True},  # a bool where an int belongs
        {"num_stages": float("nan")},
        {"group_size": 10**30},  # out of range for the kernel's int
        {"swap_ab": 1},  # an int where a bool belongs
    ],
)
def test_records_with_wrongly_typed_fields_are_ignored(tmp_cache, fields):
    cfg = dict(select(P, H200).to_dict(), **fields)
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), {"config": cfg})
    assert tuned.tuned_config(P, H200, GPU) is None


def test_malformed_files_never_raise(tmp_cache):
    tmp_cache.mkdir(parents=True, mode=0o700)
    path = tmp_cache / "tuned.json"
    for text in [
        "[" * 100000,
        json.dumps({"schema": tuned.SCHEMA, "devices": {tuned.device_key(GPU, H200): []}}),
        json.dumps({"schema": tuned.SCHEMA + 1, "devices": {}}),
        "null",
    ]:
        path.write_text(text)
        path.chmod(0o600)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tuned.TuningWarning)
            assert tuned.tuned_config(P, H200, GPU) is None
            assert _invoke("tune", "--show").exit_code == 0


def test_untrusted_files_are_refused(tmp_cache):
    from jitgemm.cache import UnsafeError

    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), _record(_other_config(P)))
    path = tmp_cache / "tuned.json"
    path.chmod(0o666)  # writable by others
    with pytest.warns(tuned.TuningWarning, match="writable by group or others"):
        assert tuned.tuned_config(P, H200, GPU) is None
    path.chmod(0o600)
    assert tuned.tuned_config(P, H200, GPU) is not None
    real = tmp_cache / "elsewhere.json"
    path.rename(real)
    path.symlink_to(real)  # a planted link is not followed
    with pytest.warns(tuned.TuningWarning, match="symlink"):
        assert tuned.tuned_config(P, H200, GPU) is None
    path.unlink()
    tmp_cache.chmod(0o777)  # an untrusted root is neither read nor written
    with pytest.raises(UnsafeError):
        tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), _record(select(P, H200)))
    tmp_cache.chmod(0o700)


def test_cli_show_survives_bad_records(tmp_cache):
    tuned.write_entry(tuned.device_key(GPU, H200), tuned.problem_key(P), "not a record")
    result = _invoke("tune", "--show")
    assert result.exit_code == 0 and "malformed record" in result.output


@pytest.mark.parametrize("out_dtype", ["bf16", "fp16", "fp32"])
def test_the_output_check_is_elementwise_over_the_whole_output(out_dtype):
    rng = np.random.default_rng(1)
    m, n, k = 256, 192, 1024
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    ref = a @ b
    magnitude = np.linalg.norm(a, axis=1)[:, None] * np.linalg.norm(b, axis=0)[None, :]
    good = ref.astype(np.float32).astype(numpy_dtype(out_dtype))  # fp32 accumulation, rounded output
    assert tuning.output_error(good, ref, out_dtype, magnitude, k) is None

    block = good.astype(np.float64)
    block[96:128, 32:64] = rng.standard_normal((32, 32)) * np.sqrt(k)  # one 32x32 tile of garbage
    assert "out of tolerance" in tuning.output_error(block, ref, out_dtype, magnitude, k)
    stale = good.astype(np.float64)
    stale[:32, 160:192] = 0.0  # one tile never written
    assert tuning.output_error(stale, ref, out_dtype, magnitude, k) is not None
    lost_k_block = good.astype(np.float64)  # one tile without 64 terms of K
    lost_k_block[64:96, 64:96] -= a[64:96, :64] @ b[:64, 64:96]
    assert tuning.output_error(lost_k_block, ref, out_dtype, magnitude, k) is not None
    nan = good.astype(np.float64)
    nan[200, 7] = np.nan
    wrong = tuning.output_error(nan, ref, out_dtype, magnitude, k, row0=1024)
    assert wrong.startswith("1 elements") and "(1224, 7)" in wrong
