"""One answer on every path (issue 21, item 8): the output dtypes a Problem takes, its default
output dtype, and how the boolean environment variables are read."""

import pytest
from click.testing import CliRunner

from jitgemm import cli, envflags, runtime, tuned
from jitgemm.problem import Problem

# ---- output dtypes ----


def test_out_dtype_defaults_to_the_input_dtype():
    assert Problem(64, 64, 64, "fp16").out_dtype == "fp16"
    assert Problem(64, 64, 64).out_dtype == "bf16"
    assert Problem(64, 64, 64, "fp16") == Problem(64, 64, 64, "fp16", "fp16")
    assert hash(Problem(64, 64, 64, "fp16")) == hash(Problem(64, 64, 64, "fp16", "fp16"))
    assert {Problem(64, 64, 64, "fp16"): 1}[Problem(64, 64, 64, "fp16", "fp16")] == 1
    assert Problem(64, 64, 64, "fp16", out_dtype="fp32").out_dtype == "fp32"


@pytest.mark.parametrize("dtype, out_dtype", [("fp16", "bf16"), ("bf16", "fp16")])
def test_an_output_dtype_the_kernels_cannot_write_is_refused(dtype, out_dtype):
    with pytest.raises(ValueError, match=rf"^Problem.out_dtype must be the input dtype \({dtype}\) or fp32"):
        Problem(64, 64, 64, dtype, out_dtype)


@pytest.mark.parametrize("command", ["precompile", "tune"])
def test_the_cli_refuses_it_as_a_usage_error(tmp_cache, command):
    args = [command, "--m", "128", "--n", "128", "--k", "128", "--dtype", "fp16", "--out-dtype", "bf16"]
    result = CliRunner().invoke(cli.main, args + (["--dry-run"] if command == "precompile" else []))
    assert result.exit_code == 2, result.output
    assert "Problem.out_dtype must be the input dtype (fp16) or fp32, got 'bf16'" in result.output


def test_explain_refuses_it_as_a_usage_error():
    result = CliRunner().invoke(cli.main, ["explain", "128", "128", "128", "--dtype", "fp16", "--out-dtype", "bf16"])
    assert result.exit_code == 2, result.output
    assert "Problem.out_dtype must be the input dtype (fp16) or fp32" in result.output


# ---- boolean environment variables ----


@pytest.mark.parametrize("value", ["0", "false", "FALSE", "No", "off", " off "])
def test_false_spellings(monkeypatch, value):
    monkeypatch.setenv("JITGEMM_X", value)
    assert envflags.flag("JITGEMM_X", True) is False


@pytest.mark.parametrize("value", ["1", "true", "True", "YES", "on"])
def test_true_spellings(monkeypatch, value):
    monkeypatch.setenv("JITGEMM_X", value)
    assert envflags.flag("JITGEMM_X", False) is True


def test_unset_or_empty_is_the_default(monkeypatch):
    monkeypatch.delenv("JITGEMM_X", raising=False)
    assert envflags.flag("JITGEMM_X", True) is True and envflags.flag("JITGEMM_X", False) is False
    monkeypatch.setenv("JITGEMM_X", "")
    assert envflags.flag("JITGEMM_X", True) is True


@pytest.mark.parametrize("value", ["2", "disable", "nope", "truee"])
def test_other_values_name_the_variable(monkeypatch, value):
    monkeypatch.setenv("JITGEMM_X", value)
    with pytest.raises(ValueError, match=rf"^JITGEMM_X='{value}': expected one of 1, true, yes, on"):
        envflags.flag("JITGEMM_X", True)


def _waiting_kernel():
    return runtime.LoadedKernel(None, None, "k", 0, 384, 2, waits_for_previous_grid=True)


@pytest.mark.parametrize("value, on", [("false", False), ("off", False), ("0", False), ("yes", True), ("TRUE", True)])
def test_tuned_and_pdl_read_the_usual_spellings(monkeypatch, value, on):
    monkeypatch.setenv(tuned.ENV_TUNED, value)
    monkeypatch.setenv(runtime.ENV_PDL, value)
    assert tuned.enabled() is on
    assert runtime.programmatic_launch(_waiting_kernel()) is on


def test_tuned_and_pdl_refuse_other_values(monkeypatch):
    monkeypatch.setenv(tuned.ENV_TUNED, "maybe")
    with pytest.raises(ValueError, match="^JITGEMM_TUNED="):
        tuned.enabled()
    monkeypatch.setenv(runtime.ENV_PDL, "disabled")
    with pytest.raises(ValueError, match="^JITGEMM_PDL="):
        runtime.programmatic_launch(_waiting_kernel())
