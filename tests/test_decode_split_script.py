"""examples/decode_split.py: the decode kernels' K split measured on a GPU and the split rule's
block overhead fitted to it. The committed measurements (examples/data/decode-split-*.jsonl,
an H100) give the overhead in force; the measurement itself runs in the GPU test here."""

import pytest
from example_scripts import EXAMPLES, load_example

from jitgemm import decode
from jitgemm.problem import Problem

COLS_FILE = EXAMPLES / "data" / "decode-split-cols-h100-2026-12-07.jsonl"
ROWS_FILE = EXAMPLES / "data" / "decode-split-rows-h100-2026-12-07.jsonl"


@pytest.fixture(scope="module")
def ds():
    return load_example("decode_split")


def test_the_cols_overhead_in_force_is_the_fit_of_the_tuning_seed(ds):
    out = ds.fit(ds.parse_args(["fit", str(COLS_FILE)]))
    assert out["block_overhead"] == pytest.approx(decode.COLS.block_overhead, rel=0.02)
    held = out["in_force"]
    assert held["shapes"] == 16
    assert held["regret_geomean"] <= 1.01  # the fastest measured count, or within noise of it
    assert held["speedup_over_wave_fill_geomean"] >= 1.03 and held["speedup_over_wave_fill_min"] >= 0.99


def test_the_rows_decoder_keeps_wave_fill_as_measured(ds):
    assert decode.ROWS.block_overhead is None
    out = ds.fit(ds.parse_args(["fit", str(ROWS_FILE)]))
    held = out["fitted"]
    assert held["wave_fill_regret_geomean"] < held["regret_geomean"]  # the fitted rule would lose


def test_the_overhead_moves_the_picks(ds):
    head, rows = ds.read_measurements(COLS_FILE)
    held = [r for r in rows if r["set"] == "held"]
    none = ds.report(decode.COLS, held, head["sms"], 0)
    fitted = ds.report(decode.COLS, held, head["sms"], decode.COLS.block_overhead)
    assert fitted["regret_geomean"] < none["regret_geomean"]


@pytest.mark.parametrize("name", ["cols", "rows"])
def test_the_random_shapes_run_the_decoder_and_repeat(ds, name):
    decoder = ds.DECODERS[name]
    for set_name in ("tune", "held"):
        shapes = ds.shapes_of(set_name, decoder)
        assert shapes == ds.shapes_of(set_name, decoder) and len(set(shapes)) == len(shapes) >= 12
        for m, n, k in shapes:
            assert 1 <= m <= decoder.max_m and n * k * 2 <= ds.MAX_W_BYTES
            problem = Problem(m, n, k, "bf16", b_major="K" if decoder is decode.COLS else "N")
            assert decode.decoder_of(problem) is decoder  # b unaligned: the decoder reads it
    assert ds.shapes_of("tune", decoder) != ds.shapes_of("held", decoder)


@pytest.mark.parametrize("name", ["cols", "rows"])
@pytest.mark.parametrize("n, k", [(14336, 4095), (4144, 14084), (1229, 574), (151655, 4097)])
def test_the_candidates_hold_both_rules_picks(ds, name, n, k):
    decoder = ds.DECODERS[name]
    counts = ds.candidates(decoder, n, k, 132)
    assert set(counts) <= set(decoder.group_counts(k))
    assert {g for g in decoder.group_counts(k) if g <= 12} <= set(counts)
    assert decoder.split_for(n, k, 132).groups in counts
    assert ds.wave_fill_count(decoder, n, k, 132) in counts


@pytest.mark.parametrize(
    "argv", [["measure", "--rounds", "0"], ["measure", "--sets", "named,other"], ["fit"], ["other"]]
)
def test_bad_arguments(ds, argv):
    with pytest.raises(SystemExit):
        ds.parse_args(argv)


@pytest.mark.gpu
def test_a_shape_is_measured_at_every_candidate_count(ds):
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    row = ds.measure_shape(decode.COLS, 3, 300, 1001, sms, rounds=1)
    counts = ds.candidates(decode.COLS, 300, 1001, sms)
    assert set(row["us"]) == {f"g{g}" for g in counts} | {"aligned", "torch"}
    assert all(t > 0 for t in row["us"].values())
    assert row["rule"] == decode.COLS.split_for(300, 1001, sms).groups


@pytest.mark.parametrize("path", [COLS_FILE, ROWS_FILE])
def test_the_committed_measurements_are_of_the_scripts_shapes(ds, path):
    head, rows = ds.read_measurements(path)
    decoder = ds.DECODERS[head["decoder"]]
    for set_name in {r["set"] for r in rows}:
        assert [(r["m"], r["n"], r["k"]) for r in rows if r["set"] == set_name] == ds.shapes_of(set_name, decoder)
    for row in rows:  # every count measured is one the rule may pick, wave fill's among them
        assert set(ds.count_times(row)) <= set(decoder.group_counts(row["k"]))
        assert row["wave_fill"] == ds.wave_fill_count(decoder, row["n"], row["k"], head["sms"])
