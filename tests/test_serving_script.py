"""examples/serving.py without a GPU: its arguments and its stream of token counts (issue 18,
item 6). The benchmark itself runs in test_gpu_serving.py (smoke mode)."""

import pytest
from example_scripts import load_example


@pytest.fixture(scope="module")
def serving():
    return load_example("serving")


def test_defaults_are_the_issues_scenario(serving):
    args = serving.parse_args([])
    assert (args.calls, args.max_m, args.n, args.k, args.layout, args.dtype) == (300, 2048, 4096, 4096, "nn", "bf16")
    assert not (args.precompile or args.check or args.json)


def test_token_counts_are_distinct_reproducible_and_in_range(serving):
    args = serving.parse_args(["--calls", "300", "--seed", "3"])
    ms = serving.token_counts(args)
    assert len(ms) == len(set(ms)) == 300 and all(1 <= m <= 2048 for m in ms)
    assert ms == serving.token_counts(args)
    assert ms != serving.token_counts(serving.parse_args(["--calls", "300", "--seed", "4"]))
    assert serving.first_m(args, ms) not in ms


def test_bad_arguments(serving):
    with pytest.raises(SystemExit):
        serving.parse_args(["--calls", "5000"])  # more than distinct token counts in 1..2048
    with pytest.raises(SystemExit):
        serving.parse_args(["--layout", "tt"])


def test_stats(serving):
    st = serving.stats([i * 1e-6 for i in range(1, 101)])
    assert st == {"mean_us": 50.5, "p50_us": 50.5, "p99_us": 99.0}
