"""Autotuning on the GPU: `tune` times real kernels, records its choice, and gemm then runs it."""

import pytest
from gpu_helpers import assert_close, guard_untouched, guarded_out, random_operand

import jitgemm
from jitgemm import api, heuristics, tuned, tuning
from jitgemm.problem import Problem

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "problem",
    [
        Problem(512, 1024, 2048),  # a @ b, both row-major
        Problem(300, 200, 520, "fp16", "fp32", "M", "K", True),  # transposed views, C, fp32 out, ragged
        Problem(128, 576, 7168),  # split-K candidates and their unsplit variants
    ],
    ids=lambda p: p.describe(),
)
# the ragged case: A's rows are not whole 16-byte units
@pytest.mark.filterwarnings("ignore::jitgemm.FallbackCopyWarning")
def test_tune_records_its_choice_and_gemm_runs_it(tmp_cache, problem):
    times = []
    result = tuning.tune(problem, top=3, progress=lambda name, us: times.append((name, us)))
    spec = api.device_spec(0)
    cands = tuning.candidates(problem, spec, 3)
    assert list(result.times_us) == [c.name for c in cands]
    assert result.chosen_by_heuristics == heuristics.select(problem, spec).name
    assert len(times) == tuning.PASSES * len(cands) and all(us > 0 for _, us in times)
    assert result.best.name == tuning.pick(result.passes_us, result.chosen_by_heuristics)
    assert result.path == tmp_cache / "tuned.json"
    assert api.config_for(problem) == result.best

    _check_gemm(problem)


def _check_gemm(problem, seed=1):
    """gemm on fresh random inputs of `problem`'s layouts, against a float64 reference."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    p = problem
    a = random_operand(p.m, p.k, p.dtype, "row" if p.a_major == "K" else "col", gen)
    b = random_operand(p.k, p.n, p.dtype, "row" if p.b_major == "N" else "col", gen)
    c = random_operand(p.m, p.n, p.out_dtype, "row", gen) if p.has_c else None
    buf, out = guarded_out(p.m, p.n, p.out_dtype)
    jitgemm.gemm(a, b, out, c=c)
    torch.cuda.synchronize()
    assert_close(out, a, b, p.out_dtype, c=c)
    assert guard_untouched(buf, p.m, p.n)


def test_gemm_runs_a_tuned_entry_and_tuning_off_the_heuristics(tmp_cache, monkeypatch):
    problem = Problem(512, 1024, 2048)
    spec = api.device_spec(0)
    other = tuning.candidates(problem, spec, 3)[1]
    tuned.write_entry(
        tuned.device_key(api.runtime.device_info(0).name, spec), tuned.problem_key(problem), {"config": other.to_dict()}
    )
    assert api.config_for(problem) == other != heuristics.select(problem, spec)
    _check_gemm(problem)
    monkeypatch.setenv(tuned.ENV_TUNED, "0")
    assert api.config_for(problem) == heuristics.select(problem, spec)


def test_a_candidate_that_leaves_output_unwritten_is_caught(tmp_cache, monkeypatch):
    # The output is NaN-filled before every candidate's check, so a kernel that skips its work
    # cannot pass on the previous candidate's result.
    problem = Problem(256, 512, 1024)
    cands = tuning.candidates(problem, api.device_spec(0), 3)
    real_gemm = api.gemm

    def lazy_gemm(a, b, out=None, *, config=None, **kwargs):
        if config == cands[1]:
            return out
        return real_gemm(a, b, out, config=config, **kwargs)

    monkeypatch.setattr(api, "gemm", lazy_gemm)
    with pytest.raises(RuntimeError, match=f"config {cands[1].name} computed a wrong result"):
        tuning.tune(problem, top=3)
    assert not (tmp_cache / "tuned.json").exists()
