"""Autotuning on the GPU: `tune` times real kernels, records its choice, and gemm then runs it."""
import pytest

import jitgemm
from jitgemm import api, heuristics, tuning
from jitgemm.problem import Problem

from gpu_helpers import TOLERANCE, guard_untouched, guarded_out, random_operand, rel_error

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("problem", [
    Problem(512, 1024, 2048),                                      # a @ b, both row-major
    Problem(300, 200, 520, "fp16", "fp32", "M", "K", True),        # transposed views, C, fp32 out, ragged
    Problem(128, 576, 7168),                                       # split-K candidates and their unsplit variants
], ids=lambda p: p.describe())
@pytest.mark.filterwarnings("ignore::jitgemm.FallbackCopyWarning")   # the ragged case's own gemm call
def test_tune_records_its_choice_and_gemm_runs_it(tmp_cache, problem):
    import torch
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

    gen = torch.Generator(device="cuda").manual_seed(1)
    p = problem
    a = random_operand(p.m, p.k, p.dtype, "row" if p.a_major == "K" else "col", gen)
    b = random_operand(p.k, p.n, p.dtype, "row" if p.b_major == "N" else "col", gen)
    c = random_operand(p.m, p.n, p.out_dtype, "row", gen) if p.has_c else None
    buf, out = guarded_out(p.m, p.n, p.out_dtype)
    jitgemm.gemm(a, b, out, c=c)
    torch.cuda.synchronize()
    assert rel_error(out, a, b, c) <= TOLERANCE[p.out_dtype]
    assert guard_untouched(buf, p.m, p.n)


def test_tuning_off_runs_the_heuristics_choice(tmp_cache, monkeypatch):
    problem = Problem(512, 1024, 2048)
    tuning.write_entry(tuning.device_key(api.runtime.device_info(0).name, api.device_spec(0)),
                       tuning.problem_key(problem), {"config": tuning.candidates(problem, api.device_spec(0), 3)[1].to_dict()})
    assert api.config_for(problem) != heuristics.select(problem, api.device_spec(0))
    monkeypatch.setenv(tuning.ENV_TUNED, "0")
    assert api.config_for(problem) == heuristics.select(problem, api.device_spec(0))
