"""examples/sweep.py without a GPU (issue 19, item 1): its problems, its check's bound, its
statistics and report. The sweep itself runs in test_gpu_sweep.py (smoke mode)."""

import math
import statistics

import ml_dtypes
import numpy as np
import pytest
from example_scripts import load_example

from jitgemm.problem import LAYOUTS, Problem

SEEDS = range(5)


@pytest.fixture(scope="module")
def sweep():
    return load_example("sweep")


# ---------------------------------------------------------------- the command line
def test_defaults(sweep):
    args = sweep.parse_args([])
    assert (args.count, args.rounds, args.max_work, args.worst, args.calls_per_graph) == (300, 15, 2e12, 15, 20)
    assert isinstance(args.seed, int) and not args.seed_given  # a fresh seed, printed
    assert not (args.smoke or args.list or args.json or args.markdown or args.max_seconds)
    smoke = sweep.parse_args(["--smoke", "--seed", "4"])
    assert (smoke.count, smoke.rounds, smoke.max_work, smoke.seed, smoke.seed_given) == (8, 3, 2e10, 4, True)
    assert sweep.parse_args(["--smoke", "--count", "12"]).count == 12


@pytest.mark.parametrize(
    "bad", [["--count", "0"], ["--rounds", "0"], ["--max-work", "1e6"], ["--jobs", "0"], ["--calls-per-graph", "0"]]
)
def test_bad_arguments(sweep, bad):
    with pytest.raises(SystemExit):
        sweep.parse_args(bad)


def test_the_kernels_are_compiled_up_front_into_the_cache(sweep, tmp_cache):
    from jitgemm import heuristics, kernels
    from jitgemm.heuristics import DeviceSpec

    h200 = DeviceSpec("sm_90a", 132)
    plist = sweep.problems(7, 4, max_work=2e10)
    built, seconds = sweep.compile_kernels(plist, h200, 2)
    names = {heuristics.select(sweep.kernel_problem(p), h200).name for p in plist}
    assert built == len(names) >= 1 and seconds > 0
    cache = kernels.default_cache()
    assert all(kernels.build(heuristics.select(sweep.kernel_problem(p), h200), cache).cache.hit for p in plist)


def test_list_needs_no_gpu(sweep, capsys):
    assert sweep.main(["--list", "--seed", "3", "--count", "10"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("seed 3: 10 problems") and "estimated" in out
    assert sum(line.startswith("#") for line in out.splitlines()) == 10


# ---------------------------------------------------------------- the problems
@pytest.mark.parametrize("seed", SEEDS)
def test_the_problems_of_a_seed(sweep, seed):
    ps, redraws = sweep.draw(seed, 300)
    assert len(ps) == 300 and all(isinstance(p, Problem) for p in ps)
    assert all(1 <= p.m <= 16384 and 64 <= p.n <= 32768 and 64 <= p.k <= 32768 for p in ps)
    assert all(sweep.work(p) <= 2e12 for p in ps) and redraws < 30
    unaligned = [p for p in ps if p.n % 8 or p.k % 8]
    assert len(unaligned) == math.ceil(300 * 0.36) >= 75  # at least 25%, by construction
    assert sum(bool(p.n % 8) for p in unaligned) == sum(bool(p.k % 8) for p in unaligned) == 72  # N, K, both: 36 each
    assert {layout: sum(p.layout == layout for p in ps) for layout in LAYOUTS} == dict.fromkeys(LAYOUTS, 75)
    assert sum(p.dtype == "bf16" for p in ps) == sum(p.dtype == "fp16" for p in ps) == 150
    assert sum(p.has_c for p in ps) == 150
    assert sum(p.out_dtype == "fp32" for p in ps) == 60
    assert all(p.out_dtype in (p.dtype, "fp32") for p in ps)
    assert ps == sweep.problems(seed, 300)  # deterministic
    assert ps != sweep.problems(seed + 100, 300)
    assert sweep.estimated_seconds(ps, 15) < 4 * 60  # well under the issue's ~6 minutes
    # lone calls (--calls-per-graph 1) run fewer GEMMs per round
    assert sweep.estimated_seconds(ps, 15, 1) < sweep.estimated_seconds(ps, 15)


def test_every_kind_is_there_in_a_small_draw(sweep):
    ps = sweep.problems(11, 8)
    assert {p.layout for p in ps} == set(LAYOUTS)
    assert {p.dtype for p in ps} == {"bf16", "fp16"} and {p.has_c for p in ps} == {False, True}
    assert sum(p.out_dtype == "fp32" for p in ps) == 2 and sum(bool(p.n % 8 or p.k % 8) for p in ps) == 3
    assert {p.layout for p in sweep.problems(5, 4)} == set(LAYOUTS)


def test_the_dimensions_are_log_uniform(sweep):
    ps, redraws = sweep.draw(0, 6000)
    assert 0.005 < redraws / (redraws + len(ps)) < 0.03  # the cap takes the top of M x N x K
    # log-uniform: half below the geometric middle of the range (the cap moves it a little)
    assert abs(sum(p.m <= 128 for p in ps) / len(ps) - 0.5) < 0.03
    for dim in ("n", "k"):
        values = [getattr(p, dim) for p in ps]
        assert abs(sum(v <= 1448 for v in values) / len(ps) - 0.5) < 0.03
        assert abs(sum(v <= 304 for v in values) / len(ps) - 0.25) < 0.03  # 64 * 512 ** 0.25
        assert min(values) == 64 and max(values) > 30000


def test_the_work_cap(sweep):
    ps, redraws = sweep.draw(2, 50, max_work=2e10)
    assert all(sweep.work(p) <= 2e10 for p in ps) and redraws > 0
    p = Problem(1000, 2000, 3000, "bf16", "fp32", has_c=True)
    assert sweep.call_bytes(p) == (1000 * 3000 + 3000 * 2000) * 2 + 1000 * 2000 * 4 * 2
    assert sweep.work(p) == 2 * 1000 * 2000 * 3000
    wide = Problem(16384, 32768, 64, "bf16", "bf16", has_c=True)
    assert sweep.work(wide) == 200 * sweep.call_bytes(wide)  # bytes, not FLOPs, bound this one
    with pytest.raises(ValueError, match="fits under it"):
        sweep.draw(0, 3, max_work=1e3)


def test_how_jitgemm_sees_the_operands(sweep):
    tn = Problem(1, 64, 128, "bf16", "bf16", "M", "K")
    assert sweep.kernel_problem(tn).a_major == "K"  # a one-row transposed view is K-major too
    assert sweep.kernel_problem(Problem(2, 64, 128, "bf16", "bf16", "M", "K")).a_major == "M"
    assert sweep.copied_operands(Problem(100, 64, 128, "bf16", "bf16", "K", "N")) == ()
    assert sweep.copied_operands(Problem(100, 64, 128, "bf16", "bf16", "M", "N")) == ("a",)  # 100 rows
    assert sweep.copied_operands(Problem(1, 64, 128, "bf16", "bf16", "M", "N")) == ()
    # sm_90a writes (and reads C) in place at any alignment; sm_100a copies ragged outputs
    assert sweep.copied_operands(Problem(104, 100, 130, "fp16", "fp16", "M", "K")) == ("b",)
    assert sweep.copied_operands(Problem(104, 100, 130, "fp16", "fp16", "M", "K"), "sm_100a") == ("b", "out")
    assert sweep.copied_operands(Problem(104, 100, 130, "fp16", "fp16", "M", "N", True)) == ("b",)
    assert sweep.copied_operands(Problem(104, 100, 130, "fp16", "fp16", "M", "N", True), "sm_100a") == ("b", "c", "out")
    assert sweep.copied_operands(Problem(104, 100, 128, "fp16", "fp32", "K", "K", True)) == ()  # 400-byte rows
    # a decode kernel (jitgemm/decode.py) reads b in place: a row-major b of odd N at M <= 4,
    # W.t() of K not a multiple of 8 at M <= 16
    assert sweep.copied_operands(Problem(4, 100, 130, "fp16", "fp16", "M", "N", True)) == ()
    assert sweep.copied_operands(Problem(5, 100, 130, "fp16", "fp16", "M", "N", True)) == ("a", "b")
    assert sweep.copied_operands(Problem(16, 104, 130, "bf16", "bf16", "K", "K")) == ()
    assert sweep.copied_operands(Problem(17, 104, 130, "bf16", "bf16", "K", "K")) == ("a", "b")


def test_rotation(sweep):
    p = Problem(1024, 1024, 1024)  # 6 MiB a call
    assert sweep.rotating_copies(p, 512 << 20) == 64
    assert sweep.rotating_copies(p, 60 << 20) == 10
    assert sweep.rotating_copies(Problem(16384, 16384, 4096), 512 << 20) == 2
    assert [sweep.calls_on_first_copy(20, n) for n in (1, 2, 3, 7, 19, 20, 64)] == [20, 10, 7, 3, 2, 1, 1]


def test_classes(sweep):
    assert [sweep.m_class(m) for m in (1, 64, 65, 512, 513, 4096, 4097, 16384)] == [
        "decode",
        "decode",
        "small",
        "small",
        "medium",
        "medium",
        "large",
        "large",
    ]
    assert [sweep.epilogue(Problem(8, 64, 64, "fp16", o, has_c=c)) for o in ("fp16", "fp32") for c in (0, 1)] == [
        "plain",
        "C",
        "fp32",
        "fp32 + C",
    ]
    assert sweep.epilogue({"out_dtype": "fp32", "has_c": True}) == "fp32 + C"


def test_the_cublas_call_of_each_row(sweep):
    fair = {"mm_out_dtype": True, "addmm_out_dtype": True}
    plain, with_c = Problem(8, 64, 64, "bf16"), Problem(8, 64, 64, "bf16", has_c=True)
    fp32, fp32_c = Problem(8, 64, 64, "fp16", "fp32"), Problem(8, 64, 64, "fp16", "fp32", has_c=True)
    assert sweep.baseline(plain, {}) == (sweep.MATMUL, True, "bf16")
    assert sweep.baseline(with_c, {}) == (sweep.ADDMM_INPLACE, True, "bf16")
    assert sweep.baseline(fp32, fair) == (sweep.MM_FP32, True, "fp32")
    assert sweep.baseline(fp32_c, fair) == (sweep.ADDMM_FP32, True, "fp32")
    # an older torch: the nearest call, marked unfair (left out of the statistics)
    assert sweep.baseline(fp32_c, {"mm_out_dtype": True}) == (sweep.MM_FP32_THEN_ADD, False, "fp32")
    assert sweep.baseline(fp32, {}) == (sweep.MATMUL_IN_DTYPE, False, "fp16")
    assert sweep.baseline(fp32_c, {}) == (sweep.ADDMM_IN_DTYPE, False, "fp16")


# ---------------------------------------------------------------- the check's bound
def _operands(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float16).astype(np.float64)
    b = rng.standard_normal((k, n)).astype(np.float16).astype(np.float64)
    return a, b, a @ b, np.abs(a) @ np.abs(b)


def _round(x, dtype):
    return np.asarray(x, np.float32).astype({"fp16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]).astype(np.float64)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_bound_passes_a_right_result_and_fails_wrong_ones(sweep, dtype):
    m, n, k = 48, 40, 512
    a, b, product, magnitude = _operands(m, n, k)
    got = _round(a.astype(np.float32) @ b.astype(np.float32), dtype)
    assert sweep.error_ratio(got, product, magnitude, k, dtype) <= 1.0
    lost_block = _round(a[:, 64:].astype(np.float32) @ b[64:].astype(np.float32), dtype)
    assert sweep.error_ratio(lost_block, product, magnitude, k, dtype) > 1.0
    unwritten = got.copy()
    unwritten[3, 5] = np.nan
    assert sweep.error_ratio(unwritten, product, magnitude, k, dtype) == math.inf


def test_the_bound_is_gpu_helpers_for_one_call(sweep):
    """calls = 1 is worst_error's formula (tests/gpu_helpers.py), written out here by hand."""
    from gpu_helpers import FP32_ROUNDOFF, ROUNDOFF, SUBNORMAL_ROUNDOFF

    m, n, k = 8, 16, 256
    a, b, product, magnitude = _operands(m, n, k, seed=3)
    c = np.random.default_rng(4).standard_normal((m, n))
    got = _round(0.5 * c + a @ b, "fp16")
    ref = 0.5 * c + product
    bound = (
        ROUNDOFF["fp16"] * np.abs(ref)
        + SUBNORMAL_ROUNDOFF["fp16"]
        + 2 * k * FP32_ROUNDOFF * (magnitude + 0.5 * np.abs(c))
        + 2.0**-40
    )
    want = float((np.abs(got - ref) / bound).max())
    assert sweep.error_ratio(got, product, magnitude, k, "fp16", c, 0.5) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("calls", [1, 2, 3, 7])
def test_the_bound_of_repeated_in_place_calls(sweep, calls):
    """A timed graph calls its first copy `calls` times: c <- beta * c + a @ b, rounded each time."""
    m, n, k = 32, 24, 1024
    a, b, product, magnitude = _operands(m, n, k, seed=calls)
    c0 = _round(np.random.default_rng(9).standard_normal((m, n)) * 30, "fp16")
    acc = a.astype(np.float32) @ b.astype(np.float32)
    c = c0
    history = [c0]
    for _ in range(calls):
        c = _round(np.float32(0.5) * c.astype(np.float32) + acc, "fp16")
        history.append(c)
    assert sweep.error_ratio(c, product, magnitude, k, "fp16", c0, 0.5, calls) <= 1.0
    assert sweep.error_ratio(history[-2], product, magnitude, k, "fp16", c0, 0.5, calls) > 1.0  # one call short


# ---------------------------------------------------------------- statistics and the report
def test_statistics(sweep):
    assert sweep.geomean([0.5, 1.0, 2.0, 4.0]) == pytest.approx(2**0.5)
    values = [i / 100 for i in range(1, 102)]  # 0.01 .. 1.01
    assert sweep.percentile(values, 5) == pytest.approx(0.06)
    assert sweep.percentile(values, 10) == pytest.approx(0.11)
    assert sweep.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert sweep.percentile([1.0, 2.0, 3.0, 4.0], 10) == pytest.approx(1.3)
    assert sweep.percentile([7.0], 5) == 7.0
    for q in (5, 10, 50):
        assert sweep.percentile(values, q) == pytest.approx(
            statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        )
    st = sweep.stats([0.8, 0.85, 0.9, 1.0, 1.25])
    assert (st["n"], st["below_0.9"], st["below_0.85"], st["min"], st["median"]) == (5, 2, 1, 0.8, 0.9)
    assert st["geomean"] == pytest.approx((0.8 * 0.85 * 0.9 * 1.25) ** 0.2)
    assert st["p5"] == pytest.approx(0.81) and st["p10"] == pytest.approx(0.82)
    assert sweep.stats([]) == {"n": 0}


def _row(index, ratio, m=100, layout="nt", dtype="bf16", out_dtype=None, has_c=False, **kw):
    row = {
        "index": index,
        "m": m,
        "n": 256,
        "k": 512,
        "layout": layout,
        "dtype": dtype,
        "out_dtype": out_dtype or dtype,
        "has_c": has_c,
        "ratio": ratio,
        "jitgemm_us": 10.0,
        "cublas_us": 10.0 * ratio,
        "config": f"sm_90a_cfg{index}",
        "copies": [],
        "fair": True,
        "passed": True,
        "checks": {"jitgemm": 0.1, "jitgemm_graph": 0.1},
        "cublas_error": 0.1,
    }
    row.update(kw)
    return row


@pytest.fixture
def rows():
    return [
        _row(0, 1.0, m=1, layout="nt"),
        _row(1, 0.5, m=64, layout="nn", dtype="fp16"),
        _row(2, 2.0, m=65, layout="tn", has_c=True),
        _row(3, 0.8, m=600, layout="tt", out_dtype="fp32"),
        _row(4, 0.5, m=5000, layout="nt", dtype="fp16", has_c=True),  # ties row 1: the lower index first
        _row(5, 0.1, m=5000, layout="nt", passed=False, checks={"jitgemm": 3.0}),  # failed: out
        _row(6, 0.2, m=5000, layout="nt", out_dtype="fp32", fair=False, cublas_error=2.0),  # unfair: apart
        _row(7, 4.0, m=4096, layout="nn", out_dtype="fp32", has_c=True),
    ]


def test_summary_groups_and_worst(sweep, rows):
    s = sweep.summarize(rows, worst_n=3)
    group = {(g["grouping"], g["class"]): g for g in s["groups"]}
    assert (s["problems"], s["in_statistics"], s["failed"]) == (8, 6, [5])
    assert s["unfair"]["indices"] == [6] and s["unfair"]["geomean"] == pytest.approx(0.2)
    assert s["cublas_outside_bound"] == [6]
    everything = group[("all", "all")]
    assert everything["n"] == 6 and everything["worst"] == [1, 4, 3]
    assert everything["geomean"] == pytest.approx((1.0 * 0.5 * 2.0 * 0.8 * 0.5 * 4.0) ** (1 / 6))
    assert (everything["below_0.9"], everything["below_0.85"], everything["min"]) == (3, 3, 0.5)
    assert [group[("layout", x)]["worst"] for x in ("nt", "nn", "tn", "tt")] == [[4, 0], [1, 7], [2], [3]]
    assert [group[("M", x)]["n"] for x in ("decode", "small", "medium", "large")] == [2, 1, 2, 1]
    assert group[("M", "decode")]["worst"] == [1, 0] and group[("M", "medium")]["worst"] == [3, 7]
    assert group[("dtype", "fp16")]["geomean"] == pytest.approx(0.5)
    assert [group[("epilogue", x)]["worst"] for x in ("plain", "C", "fp32", "fp32 + C")] == [[1, 0], [4, 2], [3], [7]]
    assert sweep.summarize(rows, worst_n=15)["groups"][0]["worst"] == [1, 4, 3, 0, 2, 7]


def test_the_reports(sweep, rows):
    result = {
        "seed": 42,
        "count": 8,
        "complete": True,
        "max_work": 2e12,
        "redraws": 1,
        "rounds": 15,
        "rows": rows,
        "summary": sweep.summarize(rows, 15),
        "gpu_before": {"name": "NVIDIA H200", "clocks.sm": "1980 MHz"},
        "gpu_after": {"clocks.sm": "1980 MHz"},
        "date": "2026-01-01T00:00:00+00:00",
        "jitgemm_version": "0.1.0",
        "git_commit": "abc",
        "torch_version": "2.11",
    }
    text = sweep.text_report(result)
    assert text.startswith("seed 42: 8 problems (complete), 6 in the statistics")
    assert "FAILED: 1 problems" in text and "not in the statistics: 1 fp32-output rows" in text
    assert "the 2 worst, layout nt:" in text and "sm_90a_cfg4" in text
    md = sweep.markdown(result)
    assert "`python examples/sweep.py --seed 42 --count 8` (8 problems" in md and "| all | all | 6 |" in md
    assert "(commit abc)" in md
    assert "**The 6 worst, all problems**" in md and "`cfg1`" in md
