"""examples/cublaslt_anchor.py without a GPU: its default shapes are the large ones issue 19's
anchor is about, and its arguments parse."""

from example_scripts import load_example


def test_default_shapes_are_large_and_distinct():
    anchor = load_example("cublaslt_anchor")
    args = anchor.parse_args([])
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes]
    assert len(set(shapes)) == len(shapes) >= 10
    assert all(2 * m * n * k >= 100e9 for m, n, k in shapes)
    assert set(anchor.HELD_OUT) <= set(args.shapes) and args.dtype == ["bf16", "fp16"]


def test_shapes_and_dtypes_can_be_chosen():
    args = load_example("cublaslt_anchor").parse_args(["--shapes", "4096,4096,4096", "--dtype", "fp16"])
    assert args.shapes == ["4096,4096,4096"] and args.dtype == ["fp16"]
