"""CPU tests of the heuristics layer (issue 3): selection tables, properties of every selected
config, explain, the expert override (check_config, JITGEMM_CONFIG) and the shared helpers."""

import ast
import json
import os
import random
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from jitgemm import geometry, heuristics
from jitgemm import geometry as tiles
from jitgemm.archs.sm90.layout import layout_of, pair_along, structural_problems
from jitgemm.config import KernelConfig
from jitgemm.heuristics import (
    DeviceSpec,
    check_config,
    config_from_env,
    cost,
    explain,
    rules,
    search,
    select,
    sm90,
    sm90_checks,
)
from jitgemm.problem import LAYOUTS, Problem
from jitgemm.render import render

H200 = DeviceSpec("sm_90a", 132)
CAPACITY = 232448

# ----------------------------------------------------------------------------- the table
# bf16 inputs and output, A K-major and B N-major (layout "nt", B MN-major: loaded in pieces of
# the layout's swizzle width, 64 columns for tiles >= 64 wide (so block_n 176 reads 192), 32 or
# 16 for narrower tiles), 132 SMs. The model (heuristics/RATES.md has each constant of
# device.ArchRates and the measurement that fixes it; H200_MEASURED below has the points):
# - a CTA streaming from DRAM spends per k-block the loaded DRAM latency over its stages in
#   flight plus its share of the read bandwidth, so deep pipelines (m64n64: 13 stages) stream
#   well from few CTAs and splitting K to get more streams pays less than it did;
# - DRAM runs are one row of one TMA box (a piece, for MN-major B): 32-byte pieces stream at
#   67%, 64-byte at 80%, 128-byte at 89%; the overhang of padded pieces comes from DRAM twice;
# - with fewer SMs busy the tensor cores run faster (the clock credit, cost.mma_rate);
# - multicast only past one wave of work units, except pairs sharing B when M is exactly two
#   m blocks (sm90.single_wave_rule): B dominates their traffic, and multicast halves its L2
#   reads even in one wave;
# - chip-wide, the bytes landing in shared memory (a multicast box once per CTA, an N-major
#   tile's 64-column pieces in full) go at 8.75 TB/s, so 224- and 240-wide tiles, which land
#   256 columns of B, lose to 256-wide ones on the large shapes;
# - every launch pays 1.5 us (2.6 us without programmatic dependent launch, which overlaps the
#   difference with the previous kernel), a split-K launch 0.9 us more, measured against
#   unsplit launches (1x4096x7168: m64n64 split 2 18.6 us, unsplit 16.7); plus the fix-up:
#   2 L2 round trips (the other splits' store fence, split 0's load of their count) and one
#   dependent round of loads per batch of splits split 0 reads back (sm90.readback_rounds),
#   ~1200 clocks each.
# Times are the model's (explain's model_us); "x% ahead" means the candidate named models x%
# slower. "measured" times are H200 measurements with PDL (see H200_MEASURED); "measured
# without PDL" marks older ones, taken with the launch's full cost and the workspace nodes;
# "a known misranking" refers to the list below H200_MEASURED.
# Each row: (M, N, K), expected (block_m, block_n, cluster_size, multicast, split_k), why.
DEEPSEEK = [(2112, 7168), (24576, 1536)]  # q/kv down-projection, q up-projection
LLAMA = [(4096, 4096), (14336, 4096)]  # Llama-3-8B attention projection, MLP up
TABLE = [
    # --- DeepSeek (2112, 7168)
    (
        (1, 2112, 7168),
        (64, 64, 1, "none", 4),
        "decode, DRAM bound: 33 column blocks of 64 x 4 splits = 132 CTAs: 13.65 us, 6% ahead of "
        "the unsplit m64n32 (14.48; the choice before the split-0 reducer made splits cheaper; "
        "not measured)",
    ),
    ((16, 2112, 7168), (64, 64, 1, "none", 4), "as M=1: 13.79 us against 14.54 for the unsplit m64n32"),
    ((64, 2112, 7168), (64, 64, 1, "none", 4), "as M=1: 14.27 us against 14.71 for the unsplit m64n32 (was m64n32)"),
    (
        (128, 2112, 7168),
        (64, 128, 2, "B", 3),
        "M is two m blocks of 64, so m64n128 pairs share B (sm90.single_wave_rule's exception): "
        "17 pairs x 3 splits = 51 units, DRAM bound: 17.41 us (measured 15.7; cuBLAS 14.9), 2% "
        "ahead of the former m128n64 split 3 (17.78; measured 15.1, the measured best: a known "
        "misranking), 3% ahead of the unpaired m64n128 split 3 (17.92, measured 17.95); the pairs "
        "split 2 model 18.13 (measured 17.2)",
    ),
    (
        (4096, 2112, 7168),
        (128, 176, 2, "A", 1),
        "2112 = 12 x 176 exactly: 384 tiles = 192 pairs, 3 waves of 66 clusters with a 91% last "
        "wave; pairs on neighbouring n blocks share A; L2 bound, 182.84 us (measured 179-184 "
        "without PDL), 5% ahead of m256n96 pairs; 3 waves of units: split-K is not considered (at "
        "most 2)",
    ),
    (
        (8192, 2112, 7168),
        (128, 224, 2, "B", 1),
        "tensor-core bound: 10 column blocks of 224 x 32 m-block pairs = 5 waves (85% last), 2.6% "
        "ahead of the m128n176 A pairs of M=4096 (6 waves; not measured)",
    ),
    # --- DeepSeek (24576, 1536)
    (
        (1, 24576, 1536),
        (64, 192, 1, "none", 1),
        "decode of a wide N: 128 column blocks of 192, one wave, DRAM bound: 23.6 us; K is only "
        "24 blocks: the best split (m64n192 pairs sharing A, split 2) models 28.5",
    ),
    ((16, 24576, 1536), (64, 192, 1, "none", 1), "as M=1"),
    ((64, 24576, 1536), (64, 192, 1, "none", 1), "as M=1"),
    (
        (128, 24576, 1536),
        (128, 192, 1, "none", 1),
        "one m block of 128: 128 tiles of 192, a single wave, DRAM bound: 25.64 us (measured 23.8), "
        "4% ahead of m64n192 pairs; m64n128 pairs sharing B measured 23.6 (1% faster) but model "
        "27.40; was m128n208 (119 tiles, 3 stages: models 32.32, measured 26.9 without PDL)",
    ),
    (
        (4096, 24576, 1536),
        (128, 256, 2, "B", 1),
        "tensor-core bound: 96 column blocks of 256 x 16 m-block pairs = 24 waves (27% last): "
        "445.41 us, ahead of 25 waves of 240-wide tiles, which land 256 columns of B each and are "
        "delivery bound (device.ArchRates.l2_delivery_bytes_per_clk). Measured 478.0 us against "
        "499.4 for m128n240 pairs",
    ),
    ((8192, 24576, 1536), (128, 256, 2, "B", 1), "as M=4096: 47 waves"),
    # --- Llama (4096, 4096)
    (
        (1, 4096, 4096),
        (64, 64, 1, "none", 1),
        "decode: 64 column blocks of 64, 13 stages (96 KB of B in flight per CTA): 13.26 us, 2% "
        "ahead of m64n32, 12% ahead of the best split (m64n64 split 2: 14.84); as measured at "
        "1x4096x7168 and 64x4096x7168 (see H200_MEASURED); was m64n96 split 3",
    ),
    ((16, 4096, 4096), (64, 64, 1, "none", 1), "as M=1: 13.29 us against 14.99 for split 2"),
    ((64, 4096, 4096), (64, 64, 1, "none", 1), "as M=1: 13.39 us against 15.48 for split 2"),
    (
        (128, 4096, 4096),
        (64, 128, 2, "B", 1),
        "M is two m blocks of 64: 32 column blocks of 128 in 32 pairs sharing B "
        "(sm90.single_wave_rule's exception), shared-memory bound: 15.83 us, tied with the unpaired "
        "m64n128 and m128n64, which move 1.5x the L2 traffic (the tie-break); not measured, but "
        "these pairs measured ahead of the unpaired tiles at 128x7168x2048 and 128x4096x7168; was "
        "the unpaired m64n128",
    ),
    (
        (4096, 4096, 4096),
        (128, 256, 2, "B", 1),
        "the classic: 512 tiles of 128x256, 4 waves (88% last); tensor-core bound (195.31 us, "
        "measured 190-194 without PDL); among the equal-time candidates sharing B over a 256x256 "
        "pair moves the least L2 traffic",
    ),
    (
        (8192, 4096, 4096),
        (128, 256, 2, "B", 1),
        "tensor-core bound: 8 waves of 128x256 pairs; the same time as 256x128 sharing A, with less L2 traffic",
    ),
    # --- Llama (14336, 4096)
    (
        (1, 14336, 4096),
        (64, 128, 1, "none", 1),
        "decode: 112 column blocks of 128 (8 stages), one wave, DRAM bound: 36.62 us, 3% ahead of "
        "m64n64 pairs sharing A, 13% ahead of the best split (m64n128 pairs sharing A, split 2: "
        "41.44); was m64n224 split 2",
    ),
    ((16, 14336, 4096), (64, 128, 1, "none", 1), "as M=1: 36.65 us (was m64n112)"),
    ((64, 14336, 4096), (64, 128, 1, "none", 1), "as M=1: 36.75 us (was m64n112)"),
    (
        (128, 14336, 4096),
        (128, 128, 1, "none", 1),
        "one m block of 128: 112 tiles of 128x128 (6 stages), one wave, DRAM bound: 39.05 us, 9% "
        "ahead of m64n128 pairs sharing B; was m128n112",
    ),
    (
        (4096, 14336, 4096),
        (128, 256, 2, "B", 1),
        "tensor-core bound: 56 column blocks of 256 x 16 m-block pairs = 14 waves (58% last), ahead "
        "of 17 waves of 208-wide tiles, which land 256 columns of B each (was m128n208; not measured)",
    ),
    ((8192, 14336, 4096), (128, 256, 2, "B", 1), "as M=4096: 28 waves"),
]

# The rest of the public benchmark set (examples/public_shapes.txt): with TABLE, every shape of
# it is pinned here.
PUBLIC = [
    (
        (128, 576, 7168),
        (64, 64, 1, "none", 4),
        "2 m blocks of 64 x 9 column blocks of 64 x 4 splits = 72 units, L2 bound: 10.20 us "
        "(measured 10.4; cuBLAS 10.3), 2% ahead of m64n48 split 3 (10.44; 13.1 measured in three pieces); split 3 "
        "measured 9.8 (split 4 is 6% slower) but models 11.13 (a known misranking); m64n128 pairs "
        "sharing B, split 8, model 12.37 (measured 12.2); unsplit, m64n16 models 12.21 (its 32-byte "
        "pieces stream at 67%)",
    ),
    (
        (128, 4096, 7168),
        (64, 128, 2, "B", 2),
        "measured best (21.7 us; cuBLAS 21.0): M is two m blocks of 64, so 32 m64n128 pairs share B "
        "(sm90.single_wave_rule's exception), x 2 splits = 64 units, DRAM bound: 25.78 us, 2% "
        "ahead of the former m128n128 split 4 (26.23, measured 25.2); the unsplit pairs, the "
        "unpaired m64n128 and m128n64 all model 26.36 (measured 23.5, 22.9 and 22.9)",
    ),
    (
        (128, 32768, 512),
        (128, 128, 2, "A", 1),
        "one m block: 256 column blocks of 128 in 128 pairs sharing A, 2 waves, DRAM bound: "
        "12.56 us (measured 13.6; cuBLAS 13.8), tied with the unclustered m128n128 (less L2 "
        "traffic; measured 13.2) and 2% ahead of m128n256 (one wave, 3 stages: 12.78, measured "
        "14.2); 8 K blocks leave nothing to split. The measured best, m64n128 pairs sharing B "
        "(13.1, 3% faster), models 13.80",
    ),
    (
        (128, 7168, 16384),
        (128, 128, 1, "none", 2),
        "56 column blocks of 128 x 2 splits = 112 units of 128 K blocks, DRAM bound: 81.71 us "
        "(measured 73.3; cuBLAS 68.2), 1.5% ahead of the unsplit m64n128 pairs sharing B, which "
        "measured 65.9 but model 82.96 (a known misranking), 4% ahead of m128n192 split 3 (85.33, "
        "measured 75.3)",
    ),
    (
        (128, 7168, 2048),
        (64, 128, 2, "B", 1),
        "measured best (11.1 us; cuBLAS 11.2): M is two m blocks of 64, so 56 m64n128 pairs share "
        "B (sm90.single_wave_rule's exception), DRAM bound: 11.93 us, 9% ahead of the unpaired "
        "m64n128 and m128n64 (12.97; measured 12.6 and 11.2) and of the m64n112 pairs (12.97, "
        "measured 12.2); was the unpaired m64n128",
    ),
    (
        (4096, 576, 7168),
        (128, 144, 2, "A", 1, True),
        "measured best (53.3 us; cuBLAS 49.8): 4 column blocks of 144 (a B tail of 16 instead of "
        "a padded 64-wide piece) x 32 m blocks = 128 tiles, one shared wave (sm90.shared_wave: "
        "the L2 rates x 1.5; A pairs allowed), tensor-core bound: 47.63 us, tied with the unpaired "
        "tile (measured 56.0) and ahead on L2 traffic; 7% ahead of the former m128n192 on 96 CTAs "
        "(51.09, measured 58.8)",
    ),
    (
        (4096, 32768, 512),
        (128, 256, 2, "B", 1),
        "tensor-core bound: 128 column blocks of 256 x 16 m-block pairs = 32 waves (3% last): "
        "209.9 us, ahead of the 224-wide pairs (36 waves, delivery bound: each lands 256 columns of "
        "B). Measured 244.4 us against 263.1 for m128n224 pairs and 258.7 for m128n192 A pairs",
    ),
    ((4096, 4096, 7168), (128, 256, 2, "B", 1), "as 4096^3: 4 waves of 128x256 pairs, tensor-core bound"),
    (
        (4096, 7168, 2048),
        (128, 256, 2, "B", 1),
        "tensor-core bound: 28 column blocks of 256 x 16 m-block pairs = 7 waves (79% last); "
        "ties m256n128 sharing A, with less L2 traffic",
    ),
    ((4096, 7168, 16384), (128, 256, 2, "B", 1), "as 4096x7168x2048, 8x the K: 7 waves, no split"),
    (
        (8192, 8192, 8192),
        (128, 256, 2, "B", 1),
        "tensor-core bound: 32 column blocks of 256 x 32 m-block pairs = 16 waves (52% last), "
        "ahead of 18 waves of 224-wide pairs, delivery bound (they land 256 columns of B each)",
    ),
    (
        (1, 4096, 7168),
        (64, 64, 1, "none", 1),
        "measured best (17.0 us; cuBLAS 19.3): 64 column blocks of 64 with 13 stages, DRAM bound: "
        "21.89 us (29% over the measurement: see KNOWN_OFF), 2% ahead of m64n64 split 2 (22.33; "
        "measured 19.4, the best split measured); m64n128 split 4 models 22.68 (measured 19.7)",
    ),
    ((16, 4096, 7168), (64, 64, 1, "none", 1), "as M=1: 21.95 us against 22.50 for split 2"),
    (
        (64, 4096, 7168),
        (64, 64, 1, "none", 1),
        "measured best (17.7 us; cuBLAS 21.1): 22.12 us, 4% ahead of split 2 (23.07, measured 19.95)",
    ),
    (
        (1, 7168, 2048),
        (64, 64, 1, "none", 1),
        "112 column blocks of 64, one wave: 10.68 us (measured 10.3; cuBLAS 10.4), 10% ahead of "
        "m64n128 and m128n64 (11.80; measured 10.6 and 10.2, the measured best by 0.9%)",
    ),
    ((16, 7168, 2048), (64, 64, 1, "none", 1), "as M=1: 10.69 us (measured 10.0, the measured best)"),
    ((64, 7168, 2048), (64, 64, 1, "none", 1), "as M=1: 10.74 us (measured 10.5, the measured best; cuBLAS 10.7)"),
]

# H200 measurements with programmatic dependent launch (bf16, layout nt, 132 SMs; per-call
# medians of CUDA-graph replays of 20 calls rotating through input copies that defeat L2; a
# captured split-K launch keeps its workspace outside the graph). Each row: shape, a faster
# config and its time, a slower config and its time (us), or None for a point that only checks
# the model's accuracy. The model must rank the first ahead of the second, and model every
# config listed within TOLERANCE of its measurement. Config: (block_m, block_n, cluster_size,
# multicast, split_k); stages are as many as fit, as in the kernels measured. Times are from a
# tuning run, or from a probe run (best of 2) where that measured the config: it read 0-3%
# below the tuning run, so pairs that mix the runs are more than 5% apart.
H200_MEASURED = [
    # 1x4096x7168 (cuBLAS 19.3): the deep unsplit m64n64 beats every split (with a_rows, as
    # selected; a probe run of the split-0 reducer)
    ((1, 4096, 7168), (64, 64, 1, "none", 1), 16.72, (64, 64, 1, "none", 2), 18.58),
    ((1, 4096, 7168), (64, 64, 1, "none", 1), 16.72, (64, 32, 1, "none", 1), 20.55),
    # 1x7168x2048 (cuBLAS 10.4), 16x7168x2048 (before the reducer; unsplit tiles)
    ((1, 7168, 2048), (64, 64, 1, "none", 1), 10.31, (64, 32, 1, "none", 1), 11.46),
    ((1, 7168, 2048), (64, 64, 1, "none", 1), 10.31, (64, 192, 1, "none", 1), 11.67),
    ((1, 7168, 2048), (128, 64, 1, "none", 1), 10.22, (128, 128, 1, "none", 1), 12.68),
    ((16, 7168, 2048), (64, 64, 1, "none", 1), 10.01, (64, 128, 1, "none", 1), 10.83),
    # From here on one tuning run with the split-0 reducer (best of 2 interleaved passes; the
    # 4096-row shapes: median of 3). 64x7168x2048 (cuBLAS 10.7), 64x4096x7168 (cuBLAS 21.1)
    ((64, 7168, 2048), (64, 64, 1, "none", 1), 10.50, (64, 128, 1, "none", 1), 11.33),
    ((64, 4096, 7168), (64, 64, 1, "none", 1), 17.75, (64, 64, 1, "none", 2), 19.20),
    ((64, 4096, 7168), (64, 64, 1, "none", 1), 17.75, (64, 128, 1, "none", 1), 21.49),
    ((64, 4096, 7168), (64, 64, 1, "none", 1), 17.75, (128, 128, 1, "none", 4), 23.85),
    ((64, 4096, 7168), (64, 64, 1, "none", 1), 17.75, (128, 128, 1, "none", 1), 35.28),
    # 128x4096x7168 (cuBLAS 21.1): two m blocks of 64, so m64n128 pairs may share B
    ((128, 4096, 7168), (64, 128, 2, "B", 2), 20.57, (64, 128, 1, "none", 1), 22.94),
    ((128, 4096, 7168), (64, 128, 2, "B", 2), 20.57, (64, 128, 2, "B", 1), 23.50),
    ((128, 4096, 7168), (64, 128, 2, "B", 2), 20.57, (128, 128, 1, "none", 4), 23.70),
    ((128, 4096, 7168), (64, 128, 2, "B", 2), 20.57, (64, 192, 1, "none", 1), 28.55),
    ((128, 4096, 7168), (64, 128, 2, "B", 2), 20.57, (128, 128, 1, "none", 1), 35.43),
    ((128, 4096, 7168), (64, 128, 2, "B", 2), 20.57, (64, 112, 1, "none", 1), 36.25),
    # 128x2112x7168 (cuBLAS 15.0)
    ((128, 2112, 7168), (128, 64, 1, "none", 3), 13.93, (64, 128, 2, "B", 2), 16.07),
    ((128, 2112, 7168), (128, 64, 1, "none", 3), 13.93, (64, 64, 1, "none", 1), 16.22),
    ((128, 2112, 7168), (128, 64, 1, "none", 3), 13.93, (64, 128, 1, "none", 3), 17.39),
    ((128, 2112, 7168), (128, 64, 1, "none", 3), 13.93, (64, 128, 1, "none", 1), 21.03),
    ((128, 2112, 7168), (128, 64, 1, "none", 3), 13.93, (128, 64, 1, "none", 1), 22.03),
    ((128, 2112, 7168), (64, 128, 2, "B", 3), 14.03, None, None),
    # 128x7168x2048 (cuBLAS 11.2)
    ((128, 7168, 2048), (64, 128, 2, "B", 1), 11.05, (64, 112, 2, "B", 1), 12.17),
    ((128, 7168, 2048), (64, 128, 2, "B", 1), 11.05, (64, 128, 1, "none", 1), 12.58),
    ((128, 7168, 2048), (64, 128, 2, "B", 1), 11.05, (128, 128, 1, "none", 1), 13.31),
    ((128, 7168, 2048), (64, 128, 2, "B", 1), 11.05, (64, 192, 1, "none", 1), 15.12),
    # 128x576x7168 (cuBLAS 10.4). Its m64n48 rows (21.91 us unsplit, 11.18 split 4) measured B
    # loaded in three 16-column pieces of 32-byte rows, a layout gone since session 21 (one
    # 64-wide piece: 23.9 -> 17.5 and 11.9 -> 10.9 us on an H100, BENCHMARKS.md); left out.
    ((128, 576, 7168), (64, 64, 1, "none", 3), 9.00, (128, 64, 1, "none", 4), 10.75),
    ((128, 576, 7168), (64, 64, 1, "none", 3), 9.00, (64, 64, 1, "none", 2), 11.01),
    ((128, 576, 7168), (64, 64, 1, "none", 3), 9.00, (64, 128, 2, "B", 8), 11.07),
    ((128, 576, 7168), (64, 64, 1, "none", 3), 9.00, (64, 32, 1, "none", 1), 15.51),
    ((128, 576, 7168), (64, 64, 1, "none", 3), 9.00, (64, 64, 1, "none", 1), 15.78),
    ((128, 576, 7168), (64, 64, 1, "none", 3), 9.00, (128, 32, 1, "none", 1), 19.57),
    # 128x7168x16384 (cuBLAS 68.0)
    ((128, 7168, 16384), (64, 128, 2, "B", 1), 65.90, (128, 192, 1, "none", 3), 71.37),
    ((128, 7168, 16384), (64, 128, 2, "B", 1), 65.90, (64, 112, 2, "B", 1), 76.17),
    ((128, 7168, 16384), (64, 128, 2, "B", 1), 65.90, (128, 128, 1, "none", 1), 84.00),
    ((128, 7168, 16384), (64, 128, 2, "B", 1), 65.90, (128, 192, 1, "none", 1), 116.02),
    ((128, 7168, 16384), (128, 128, 1, "none", 2), 69.75, (128, 128, 1, "none", 1), 84.00),
    # 128x32768x512 (cuBLAS 13.7), 128x24576x1536 (cuBLAS 23.8)
    ((128, 32768, 512), (128, 128, 1, "none", 1), 13.18, (128, 256, 1, "none", 1), 14.11),
    ((128, 32768, 512), (128, 128, 1, "none", 1), 13.18, (64, 256, 1, "none", 1), 15.90),
    ((128, 32768, 512), (128, 128, 2, "A", 1), 13.51, (64, 256, 1, "none", 1), 15.90),
    ((128, 24576, 1536), (128, 192, 1, "none", 1), 23.76, (128, 128, 1, "none", 1), 25.63),
    ((128, 24576, 1536), (128, 192, 1, "none", 1), 23.76, (64, 192, 1, "none", 1), 27.91),
    ((128, 24576, 1536), (64, 128, 2, "B", 1), 23.52, None, None),
    # 4096x576x7168 (cuBLAS 49.8): B tails and A pairs in a shared wave (a probe run, 3 passes:
    # the unpaired 128x144 with a tail, 56.0, models the same as the pairs, which win the tie on
    # L2 traffic;
    # the slower configs of the last three rows from an earlier tuning run, which had 128x192 at
    # 53.9), and 4096x512x7168, where 128x128 fills 128 SMs (a probe run)
    ((4096, 576, 7168), (128, 144, 2, "A", 1, True), 53.30, (128, 192, 1, "none", 1), 58.82),
    ((4096, 576, 7168), (128, 144, 2, "A", 1, True), 53.30, (128, 160, 2, "A", 1, True), 55.17),
    ((4096, 576, 7168), (128, 192, 1, "none", 1), 58.82, (128, 96, 2, "A", 1), 72.94),
    ((4096, 576, 7168), (128, 192, 1, "none", 1), 58.82, (256, 96, 1, "none", 1), 75.34),
    ((4096, 576, 7168), (128, 192, 1, "none", 1), 58.82, (128, 208, 1, "none", 1), 78.00),
    ((4096, 512, 7168), (128, 128, 2, "A", 1), 41.17, (128, 192, 1, "none", 1), 60.23),
    # more shared waves (probe runs, 3 passes each; the first choice the model's)
    ((2048, 1536, 7168), (128, 192, 2, "A", 1), 59.98, (128, 256, 1, "none", 1), 74.38),
    ((4096, 768, 4096), (128, 192, 2, "A", 1), 35.92, (128, 256, 1, "none", 1), 43.39),
    ((2048, 576, 7168), (128, 144, 2, "A", 2), 34.51, (128, 96, 2, "A", 1), 41.81),
    ((2048, 576, 7168), (128, 192, 1, "none", 2), 33.64, (128, 96, 2, "A", 1), 41.81),
    # the wide tiles of the large shapes (device.ArchRates.l2_delivery_bytes_per_clk)
    ((4096, 32768, 512), (128, 256, 2, "B", 1), 244.44, (128, 192, 2, "A", 1), 258.69),
    ((4096, 32768, 512), (128, 256, 2, "B", 1), 244.44, (128, 224, 2, "B", 1), 263.05),
    ((4096, 24576, 1536), (128, 256, 2, "B", 1), 477.98, (128, 240, 2, "B", 1), 499.40),
]
# Known misrankings, left out of the pairs above (the heuristics are not fitted to them);
# measured us, modelled in parentheses:
# - past 5% of the measured best: 128x7168x16384, m64n128 B pairs unsplit 65.9 (82.96) against
#   the chosen m128n128 split 2 69.8 (80.61);
# - within 5%: 128x576x7168, m64n64 split 3 9.0 (10.42) against the chosen split 4 9.4 (9.15)
#   and m128n32 split 4 9.2 (10.20); 128x2112x7168, m128n64 split 3 13.9 against the chosen
#   m64n128 B pairs split 3 14.0; 128x32768x512, the unpaired m128n128 13.2 (12.56) against
#   the chosen m128n128 A pairs 13.5 (12.56, a tie the A pairs win on L2 traffic);
#   128x24576x1536, m64n128 B pairs 23.5 (28.28) against the chosen m128n192 23.8 (25.64);
#   1x7168x2048, m128n64 10.2 against the chosen m64n64 10.3;
# - among configs not chosen: 128x24576x1536, m64n192 27.9 (27.73) against m128n128 25.6
#   (27.12); at 1x7168x2048
#   and 16x7168x2048 the m64n32 A pairs (30.6 and 23.9) model the same as the unpaired m64n32
#   (11.5 and 11.4): multicast A loads the whole 64-row box of A (sm90._a_rows), which the
#   model does not see.
# Configs modelled further off than TOLERANCE, with what is known: at 1x4096x7168 the unsplit
# m64n64 runs 16.7 us against 21.89 modelled: the DRAM latency (device.ArchRates.dram_latency_clk)
# was fixed on these tiles without PDL; the same m64n64 at 64x4096x7168 is just inside (17.8
# against 22.12). The unsplit m64n128 B pairs at 128x7168x16384 run 65.9 against 82.96: in the
# model each CTA's DRAM stream takes 81.5 us of it, above the 60.7 us DRAM floor. The unsplit
# m64n128 at 128x2112x7168 runs 21.0 against 26.36.
TOLERANCE = 0.25
KNOWN_OFF = {
    ((1, 4096, 7168), (64, 64, 1, "none", 1)),
    ((128, 7168, 16384), (64, 128, 2, "B", 1)),
    ((128, 2112, 7168), (64, 128, 1, "none", 1)),
}


def _select_nt(shape):
    m, n, k = shape
    return select(Problem(m, n, k, "bf16", "bf16", "K", "N"), H200)


def _got(cfg):
    """(block_m, block_n, cluster_size, multicast, split_k), and True last for a B tail."""
    return (cfg.block_m, cfg.block_n, cfg.cluster_size, cfg.multicast, cfg.split_k) + ((True,) if cfg.b_tail else ())


@pytest.mark.parametrize(
    "shape, expected, why", TABLE + PUBLIC, ids=[f"{m}x{n}x{k}" for (m, n, k), _, _ in TABLE + PUBLIC]
)
def test_selection_table(shape, expected, why):
    cfg = _select_nt(shape)
    assert _got(cfg) == expected, f"{shape}: expected {expected} because {why}; got {cfg.name}"


def test_table_covers_the_issue_grid_and_the_public_set():
    ms = {1, 16, 64, 128, 4096, 8192}
    got = {(m, n, k) for (m, n, k), _, _ in TABLE}
    assert got == {(m, n, k) for m in ms for n, k in DEEPSEEK + LLAMA}
    public = {
        tuple(map(int, line.split()))
        for line in (Path(__file__).parent.parent / "examples" / "public_shapes.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    pinned = [shape for shape, _, _ in TABLE + PUBLIC]
    assert len(pinned) == len(set(pinned))
    assert {shape for shape, _, _ in PUBLIC} <= public <= set(pinned)


def _measured_cost(shape, tile):
    block_m, block_n, cluster, multicast, split_k, *b_tail = tile
    p = Problem(*shape, "bf16", "bf16", "K", "N")
    cfg = rules.base_config(
        p,
        H200,
        block_m=block_m,
        block_n=block_n,
        num_consumers=sm90_checks.num_consumers_for(block_m),
        cluster_size=cluster,
        multicast=multicast,
    )
    cfg, _ = sm90.with_stages(rules.with_fields(cfg, split_k=split_k, b_tail=bool(b_tail)), H200)
    assert check_config(cfg, p, H200) == [], (shape, tile)
    return sm90.cost_of(p, H200, cfg)


@pytest.mark.parametrize(
    "shape, better, better_us, worse, worse_us",
    H200_MEASURED,
    ids=[f"{m}x{n}x{k}-{i}" for i, ((m, n, k), *_) in enumerate(H200_MEASURED)],
)
def test_model_ranks_and_times_the_h200_measurements(shape, better, better_us, worse, worse_us):
    good = _measured_cost(shape, better)
    for tile, us, cand in [(better, better_us, good)] + (
        [(worse, worse_us, _measured_cost(shape, worse))] if worse else []
    ):
        if (shape, tile) in KNOWN_OFF:
            continue
        model_us = cand.terms["model_us"]
        assert abs(model_us / us - 1) <= TOLERANCE, f"{shape} {tile}: models {model_us} us, measured {us}"
    if worse:
        bad = _measured_cost(shape, worse)
        assert good.cost < bad.cost, (
            f"{shape}: measured {better} {better_us} us < {worse} {worse_us} us, but the "
            f"model has {good.terms['model_us']} >= {bad.terms['model_us']}"
        )


# Pipeline depth on 4096^3 (bf16, medians of three interleaved passes; the heuristics pick as
# many stages as fit): (block_m, block_n, cluster_size, multicast), (stages, us) deeper, shallower.
H200_STAGES = [
    ((128, 128, 2, "B"), (4, 208.0), (3, 294.1)),
    ((128, 256, 2, "B"), (3, 181.7), (2, 288.6)),
    ((128, 192, 2, "A"), (4, 223.6), (3, 238.8)),
]


@pytest.mark.parametrize("tile, deep, shallow", H200_STAGES, ids=[f"m{t[0]}n{t[1]}" for t, _, _ in H200_STAGES])
def test_model_ranks_pipeline_depth_as_measured(tile, deep, shallow):
    p = Problem(4096, 4096, 4096)
    block_m, block_n, cluster, multicast = tile
    base = rules.base_config(
        p, H200, block_m=block_m, block_n=block_n, num_consumers=2, cluster_size=cluster, multicast=multicast
    )
    costs = [sm90.cost_of(p, H200, rules.with_fields(base, num_stages=stages)) for stages, _ in (deep, shallow)]
    assert costs[0].cost < costs[1].cost, [c.terms["model_us"] for c in costs]
    # and within TOLERANCE of the measured ratio of the two depths
    ratio, measured = costs[1].cost / costs[0].cost, shallow[1] / deep[1]
    assert abs(ratio / measured - 1) <= TOLERANCE, (ratio, measured)


def test_selection_is_close_to_the_measured_best():
    # Where the measurements cover the candidates (H200_MEASURED holds each listed shape's
    # measured best), select picks the measured best or one within 5% of it (128x2112x7168:
    # 3.8%, 128x32768x512: 3.4%). Left out, the known misrankings past 5% (see H200_MEASURED):
    # 128x576x7168 (6%), 128x7168x16384 (11%), 4096x24576x1536 (10%), 4096x32768x512 (14%).
    measured = {}
    for shape, better, better_us, worse, worse_us in H200_MEASURED:
        for tile, us in [(better, better_us)] + ([(worse, worse_us)] if worse else []):
            # a config listed twice carries the same time
            assert measured.setdefault(shape, {}).setdefault(tile, us) == us, (shape, tile)
    for shape in [
        (1, 7168, 2048),
        (16, 7168, 2048),
        (64, 7168, 2048),
        (1, 4096, 7168),
        (64, 4096, 7168),
        (128, 2112, 7168),
        (128, 4096, 7168),
        (128, 7168, 2048),
        (128, 32768, 512),
        (128, 24576, 1536),
        (4096, 576, 7168),
    ]:
        got = _got(_select_nt(shape))
        assert got in measured[shape], (shape, got)
        assert measured[shape][got] <= 1.05 * min(measured[shape].values()), (shape, got)


# ----------------------------------------------------------------------------- properties


def _problems():
    ms = [1, 7, 16, 64, 100, 128, 129, 1000, 4096, 8192]
    nks = [
        (2112, 7168),
        (24576, 1536),
        (4096, 4096),
        (14336, 4096),
        (576, 7168),
        (7168, 2048),
        (1000, 1000),
        (129, 77),
        (32768, 512),
        (16, 16),
    ]
    combos = [
        (d, o, lay, c)
        for d in ("bf16", "fp16")
        for o in ("same", "fp32")
        for lay in sorted(LAYOUTS)
        for c in (False, True)
    ]
    out = []
    for i, (m, (n, k)) in enumerate((m, nk) for m in ms for nk in nks):
        d, o, lay, c = combos[(i * 5) % len(combos)]
        a_major, b_major = LAYOUTS[lay]
        out.append(Problem(m, n, k, d, d if o == "same" else "fp32", a_major, b_major, c))
    return out


PROBLEMS = _problems()
DEVICES = [H200, DeviceSpec("sm_90a", 114), DeviceSpec("sm_90a", 133), DeviceSpec("sm_90a", 78)]


@pytest.mark.parametrize(
    "device",
    [d if d == H200 else pytest.param(d, marks=pytest.mark.slow) for d in DEVICES],
    ids=lambda d: f"{d.num_sms}sms",
)
def test_every_selected_config_is_sound(device):
    for p in PROBLEMS:
        cfg = select(p, device)
        lay = layout_of(cfg)
        where = f"{p.describe()} -> {cfg.name}"
        # the problem's own fields, the device's arch
        assert (cfg.arch, cfg.dtype, cfg.out_dtype, cfg.a_major, cfg.b_major, cfg.has_c) == (
            device.arch,
            p.dtype,
            p.out_dtype,
            p.a_major,
            p.b_major,
            p.has_c,
        ), where
        assert cfg.block_k * 2 == 128, where
        assert not structural_problems(cfg), where
        assert check_config(cfg, p, device) == [], where
        was_swapped = cfg.swap_ab
        if cfg.swap_ab:
            # swapped only where the model costs it, unsplit and 128 kernel rows at most; the
            # rest holds of the config of the transposed problem it runs as
            assert sm90.swap_possible(p) and cfg.block_m <= sm90.SWAP_MAX_BLOCK_M, where
            assert (cfg.split_k, cfg.a_rows, cfg.b_tail) == (1, 0, False), where
            p, cfg = sm90.transposed(p), sm90.unswapped(cfg, p)
            assert layout_of(cfg).smem_bytes == lay.smem_bytes and sm90.with_stages(cfg, device)[0] == cfg, where
        # fits shared memory; at least 3 stages, 4 for tiles under 128x192
        assert lay.smem_bytes <= device.smem_capacity == CAPACITY, where
        assert cfg.num_stages >= 3, where
        if cfg.block_m * cfg.block_n < 128 * 192:
            assert cfg.num_stages >= 4, where
        # and no deeper than the cap, nor shallower than what fits
        assert cfg.num_stages == rules.MAX_STAGES or sm90.stage_smem(cfg, cfg.num_stages + 1) > CAPACITY, where
        # cluster divides the SM count; no multicast on a single wave of work units, except
        # pairs sharing B when M is exactly two m blocks and pairs sharing A in a shared wave
        # (sm90.single_wave_rule)
        assert device.num_sms % cfg.cluster_size == 0, where
        num_m = -(-p.m // cfg.block_m)
        tiles = num_m * -(-p.n // cfg.block_n)
        splits = geometry.num_splits(cfg, p.k)
        if tiles * splits <= device.num_sms:
            assert (
                cfg.cluster_size == 1
                or (cfg.multicast == "B" and num_m == 2)
                or (cfg.multicast == "A" and sm90.shared_wave(p, device, cfg.block_m, cfg.block_n, splits, 2))
            ), where
        # split-K: one of the candidate counts, >= 4 K blocks a split, one wave of units
        assert cfg.split_k in sm90.SPLITS and splits == cfg.split_k, where
        if cfg.split_k > 1:
            assert -(-p.k // cfg.block_k) >= sm90.MIN_KB_PER_SPLIT * cfg.split_k, where
            units = sm90.cluster_tiles_of(p, cfg.block_m, cfg.block_n, cfg.multicast) * cfg.split_k
            assert units <= device.num_sms // cfg.cluster_size, where
        # register budget: 64K per SM after setmaxnreg, accumulators that do not spill
        assert sm90_checks.register_budget(cfg.num_consumers) <= 65536, where
        assert lay.acc_regs <= sm90_checks.ACC_REG_LIMIT, where
        if cfg.split_k > 1:  # the fix-up needs registers of its own
            assert lay.acc_regs <= sm90_checks.SPLITK_ACC_REG_LIMIT, where
        # consumer rule and DeepGEMM's block_m 256 rule
        assert cfg.num_consumers == (1 if cfg.block_m <= 64 else 2), where
        if cfg.block_m == 256:
            assert p.out_dtype != "fp32", where
        # widths step by 16; a swapped tile may be 8 narrower (sm90.narrowed)
        assert cfg.block_m in (64, 128, 256) and cfg.block_n % (8 if was_swapped else 16) == 0, where
        assert cfg.group_size in (8, 16) and cfg.raster in ("m", "n"), where


def test_odd_sm_count_never_clusters():
    dev = DeviceSpec("sm_90a", 133)
    for p in PROBLEMS:
        assert select(p, dev).cluster_size == 1
    rules = {r["rule"] for r in explain(Problem(8192, 8192, 8192), dev)["rejected"]}
    assert any("SM count 133 is odd" in r for r in rules)


def test_large_problems_use_multicast_and_big_tiles():
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 24576, 1536)]:
        cfg = select(Problem(m, n, k), H200)
        assert cfg.cluster_size == 2 and cfg.multicast in ("A", "B")
        assert cfg.block_m * cfg.block_n >= 128 * 176


@pytest.mark.parametrize("b_major", ["N", "K"])
def test_decode_keeps_enough_dram_bytes_in_flight(b_major):
    # With one m block a memory-bound decode GEMM streams B from DRAM; the chip gets its read
    # bandwidth only with enough bytes in flight to cover the DRAM latency (Little's law): the
    # work units x the stages in flight x B's bytes per stage, from more units (N blocks, K
    # splits) or deeper pipelines (H200: m64n64 with 13 stages from 64 CTAs beats splits).
    r = H200.rates
    need = r.dram_latency_clk * r.dram_read_bytes_per_clk
    for n, k in DEEPSEEK + LLAMA + [(7168, 2048), (576, 7168), (4096, 7168)]:
        for m in (1, 16):
            cfg = select(Problem(m, n, k, b_major=b_major), H200)
            units = -(-n // cfg.block_n) * geometry.num_splits(cfg, k)
            assert cfg.block_m * -(-m // cfg.block_m) <= 128
            in_flight = min(units, H200.num_sms) * (cfg.num_stages - 1) * cfg.block_n * cfg.block_k * 2
            assert in_flight >= min(need, n * k * 2), (m, n, k, cfg.name, in_flight, need)


def test_selection_is_deterministic_and_cached():
    p = Problem(4096, 2112, 7168)
    first = select(p, H200)
    select.cache_clear()
    assert select(p, H200) == first
    assert explain(p, H200)["chosen"] == first.to_dict()


def test_selection_does_not_depend_on_hash_seed(tmp_path):
    # Run outside the checkout: in its root, the checkout's jitgemm/ would shadow the installed
    # package.
    code = (
        "from jitgemm.problem import Problem\n"
        "from jitgemm.heuristics import select, DeviceSpec\n"
        "for s in [(1,7168,2048),(4096,4096,4096),(8192,2112,7168),(1000,1000,1000),(333,129,77)]:\n"
        "    print(select(Problem(*s), DeviceSpec()).name)\n"
    )
    outs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, check=True
        )
        outs.add(res.stdout)
    assert len(outs) == 1


def test_select_rejects_unknown_arch():
    with pytest.raises(ValueError, match="unknown arch 'sm_80'; supported: \\['sm_90a', 'sm_100a'\\]"):
        select(Problem(128, 128, 128), DeviceSpec("sm_80", 108))


# ----------------------------------------------------------------------------- cost model


def test_large_problems_do_not_split():
    for m, n, k in [
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (4096, 2112, 7168),
        (4096, 7168, 16384),
        (4096, 24576, 1536),
        (8192, 4096, 4096),
    ]:
        for layout in ("nt", "nn"):
            a_major, b_major = LAYOUTS[layout]
            assert select(Problem(m, n, k, a_major=a_major, b_major=b_major), H200).split_k == 1


def test_cost_model_knows_mn_major_b_padding():
    # Block_n 176 loads three 64-column pieces (192 columns) when B is N-major, 176 when K-major.
    p_n = Problem(4096, 2112, 7168, b_major="N")
    p_k = Problem(4096, 2112, 7168, b_major="K")
    base = dict(block_m=128, block_n=176, num_stages=4, num_consumers=2)
    c_n = sm90.cost_of(p_n, H200, KernelConfig(b_major="N", **base))
    c_k = sm90.cost_of(p_k, H200, KernelConfig(b_major="K", **base))
    assert c_n.terms["l2_bytes"] > c_k.terms["l2_bytes"]
    assert (
        layout_of(KernelConfig(b_major="N", **base)).smem_bytes
        > layout_of(KernelConfig(b_major="K", **base)).smem_bytes
    )
    # A multiple of 64 costs the same either way.
    base["block_n"] = 128
    c_n = sm90.cost_of(p_n, H200, KernelConfig(b_major="N", **base))
    c_k = sm90.cost_of(p_k, H200, KernelConfig(b_major="K", **base))
    assert c_n.terms["l2_bytes"] == c_k.terms["l2_bytes"]


def test_stage_count_keeps_a_whole_tile_of_output_staging_unless_that_leaves_too_few():
    # m128n256: 3 stages beside its whole 64 KB of staging, not 4 beside a ring of 2 boxes
    # (measured slower); m128n384: its whole staging leaves 2 stages, so a ring and 3 stages.
    wide256 = KernelConfig(block_n=256, cluster_size=2, multicast="B")
    assert sm90.with_stages(wide256, H200)[0].num_stages == 3
    assert layout_of(sm90.with_stages(wide256, H200)[0]).out_bufs == 4
    wide384, stages = sm90.with_stages(KernelConfig(block_n=384, cluster_size=2, multicast="B"), H200)
    assert stages == 3 and layout_of(wide384).out_bufs == 2
    p = Problem(4096, 24576, 1536)
    assert not check_config(wide384, p, H200)  # 192 accumulators, one atom: no spill
    too_many = check_config(KernelConfig(block_m=256, block_n=192, num_stages=3), p, H200)
    assert any("192 fp32 accumulator registers" in t for t in too_many)  # two atoms: it would spill
    assert max(c.block_n for c in (select(Problem(*s), H200) for s in ((4096, 24576, 1536), (8192, 8192, 8192)))) == 256


def test_shared_wave_needs_one_wave_of_128_row_tiles_over_16_m_blocks():
    assert sm90.shared_wave(Problem(4096, 576, 7168), H200, 128, 144, 1, 2)  # 128 tiles, 32 m blocks
    assert sm90.shared_wave(Problem(2048, 576, 7168), H200, 128, 144, 2, 2)  # 64 tiles x 2 splits
    assert not sm90.shared_wave(Problem(2048, 576, 7168), H200, 64, 144, 1, 2)  # 64-row tiles
    assert not sm90.shared_wave(Problem(4096, 576, 7168), H200, 128, 96, 1, 1)  # 192 tiles: 2 waves
    assert not sm90.shared_wave(Problem(1024, 576, 7168), H200, 128, 144, 1, 1)  # 8 m blocks
    assert not sm90.shared_wave(Problem(4096, 128, 7168), H200, 128, 128, 1, 1)  # N < 192
    # only there do B tails and A pairs in one wave get costed
    assert select(Problem(4096, 576, 7168), H200).b_tail
    assert not select(Problem(128, 2112, 7168), H200).b_tail


def test_cost_model_knows_b_tails_load_no_padding():
    # 4096x576x7168 in 128x144 tiles: padded, each of the 4 column blocks loads 192 columns; with
    # a B tail exactly 144, so L2 delivers A 4 times and B 32 times, nothing more.
    p = Problem(4096, 576, 7168)
    base = dict(block_m=128, block_n=144, num_stages=5, num_consumers=2)
    padded = sm90.cost_of(p, H200, KernelConfig(**base))
    tailed = sm90.cost_of(p, H200, KernelConfig(b_tail=True, **base))
    assert tailed.terms["l2_bytes"] == (4 * 4096 + 32 * 576) * 7168 * 2 < padded.terms["l2_bytes"]
    assert not check_config(KernelConfig(b_tail=True, **base), p, H200)


def test_cost_model_reads_b_padding_from_the_layout():
    # Narrow N-major tiles load pieces as wide as the layout's swizzle, not 64 columns.
    p = Problem(1, 4096, 4096)
    for block_n in (16, 32, 48, 64, 80, 176):
        cfg = KernelConfig(block_m=64, block_n=block_n, num_consumers=1, num_stages=4)
        b = layout_of(cfg).b
        assert sm90.b_box_of(cfg) == b.num_pieces * b.piece_extent
        assert sm90.cost_of(p, H200, cfg).terms["l2_bytes"] == (
            sm90.traffic(p, 64, block_n, sm90.b_box_of(cfg), "none").l2_reads * 4096 * 2
        )
    assert sm90.b_box_of(KernelConfig(block_n=176)) == 192
    assert sm90.b_box_of(KernelConfig(block_n=176, b_major="K")) == 176


def test_dram_latency_and_run_efficiency():
    r = H200.rates
    # a CTA alone is latency bound: the round trip over the stages in flight
    assert cost.dram_latency_clk(r, 8) == r.dram_latency_clk / 7
    assert cost.dram_latency_clk(r, 13) < cost.dram_latency_clk(r, 6)  # deeper pipelines cover more
    # runs: a box row; 32-, 64-, 128-byte pieces stream at 67%, 80%, 89%
    assert [round(cost.dram_run_efficiency(r, b), 2) for b in (32, 64, 128)] == [0.67, 0.8, 0.89]
    # an N-major B's runs are its pieces: 16 and 32 wide tiles load one piece of their width, a
    # 48-wide one a 64-wide piece (not three 16-wide pieces of 32-byte rows)
    for block_n, run in ((16, 32), (32, 64), (48, 128)):
        cfg = KernelConfig(block_m=64, block_n=block_n, num_consumers=1)
        assert sm90.dram_runs(Problem(1, 576, 7168), cfg) == (128, run)
    assert sm90.dram_runs(Problem(1, 576, 7168), KernelConfig(block_m=64, block_n=192, num_consumers=1)) == (128, 128)
    # the clock credit: 3200 FLOPs/clock with every SM busy, more with fewer, up to 4096
    assert cost.mma_rate(r, 132, 132) == r.mma_flops_per_clk == 3200
    assert cost.mma_rate(r, 132, 96) == r.mma_peak_flops_per_clk == 4096
    assert 3200 < cost.mma_rate(r, 132, 120) < 4096


def test_split_k_cost_terms():
    p = Problem(128, 7168, 16384)
    base = KernelConfig(block_m=128, block_n=128, num_stages=6)
    one = sm90.cost_of(p, H200, base)
    two = sm90.cost_of(p, H200, KernelConfig(**{**base.to_dict(), "split_k": 2}))
    assert (one.terms["split_k"], one.terms["units"], one.terms["kb_per_unit"]) == (1, 56, 256)
    assert (two.terms["split_k"], two.terms["units"], two.terms["kb_per_unit"]) == (2, 112, 128)
    assert one.terms["workspace_bytes"] == one.terms["splitk_cycles"] == 0
    # the workspace: split 1's partials (split 0 keeps its own): 128 rows x 56 tiles x 128 columns of fp32
    assert two.terms["workspace_bytes"] == 1 * 128 * 56 * 128 * 4
    # the fix-up: split 1's store fence, split 0's load of the count, one round of loads
    assert two.terms["splitk_round_trips"] == 2 + 1
    assert two.terms["splitk_cycles"] >= 3 * sm90.L2_ROUND_TRIP_CLK
    assert two.cost < one.cost  # twice the streaming SMs pay for it
    # a launch never uses more splits than K blocks (jitgemm.geometry.num_splits)
    short = Problem(128, 7168, 200)  # 4 K blocks
    cfg = KernelConfig(**{**base.to_dict(), "split_k": 8})
    assert geometry.num_splits(cfg, short.k) == 4 == sm90.cost_of(short, H200, cfg).terms["split_k"]


def test_partial_rows_and_readback_mirror_the_template():
    from importlib import resources

    src = resources.files("jitgemm.templates").joinpath("sm90/gemm.cu.j2").read_text()
    fixup = src[src.index("split-K fix-up") : src.index("---- epilogue")]
    # rows: a thread stores rows r and r + 8 (one float4) when row r is live
    assert "warp * 16 + lane / 4 < rows_left" in fixup
    assert sm90.partial_rows(1, 64, 1) == 2  # M = 1 stores rows 0 and 8
    assert sm90.partial_rows(16, 64, 1) == 16
    assert sm90.partial_rows(20, 64, 1) == 16 + 8
    assert sm90.partial_rows(64, 128, 2) == 64  # the second warpgroup stores nothing
    assert sm90.partial_rows(4096, 128, 2) == 4096
    for block_m, consumers in ((64, 1), (128, 1), (128, 2), (256, 2)):  # 2 x min(8, live) per 16 rows
        wg_m = block_m // consumers
        for m in range(1, 3 * block_m):
            rest = m % block_m
            groups = (rest - wg * wg_m - g for wg in range(consumers) for g in range(0, wg_m, 16))
            assert sm90.partial_rows(m, block_m, consumers) == m - rest + sum(2 * min(8, max(0, r)) for r in groups)
    # the read-back the model assumes, one round trip per batch of splits: in the template the
    # loop over the batches encloses the (unrolled) loops over a batch's splits and the loads
    load = fixup.index("ld.global.cg")
    b_loop, j_loop = fixup.rindex("for (int s0", 0, load), fixup.rindex("for (int j", 0, load)
    assert b_loop < fixup.rindex("for (int b", 0, load) < j_loop < load, (
        "the split-K read-back no longer loops over batches of splits outermost"
    )
    depth, end = 0, None
    for pos in range(fixup.index(") {", b_loop) + 2, len(fixup)):  # the header holds Jinja braces
        depth += {"{": 1, "}": -1}.get(fixup[pos], 0)
        if depth == 0:
            end = pos
            break
    assert end is not None and load < end, "the read-back loads are outside the loop over the batches"
    # m64n64 (32 accumulators) loads 4 splits at a time, m128n128 (64 per warpgroup) 2, m128n192 1
    for (block_m, block_n), rounds in [
        ((64, 64), [0, 1, 1, 1, 2, 8]),
        ((128, 128), [0, 1, 1, 2, 4, 16]),
        ((128, 192), [0, 1, 2, 3, 7, 31]),
    ]:
        cfg = KernelConfig(block_m=block_m, block_n=block_n, num_consumers=1 if block_m == 64 else 2, split_k=32)
        assert [sm90.readback_rounds(layout_of(cfg), s) for s in (1, 2, 3, 4, 8, 32)] == rounds, (block_m, block_n)
    assert render(KernelConfig(block_m=64, block_n=64, num_consumers=1, split_k=4)).count("s0 += 3") == 1
    p = Problem(128, 7168, 16384)
    cfg = KernelConfig(block_m=64, block_n=64, num_consumers=1, num_stages=3, split_k=4)
    assert sm90.cost_of(p, H200, cfg).terms["splitk_round_trips"] == sm90.SPLITK_SYNC_ROUND_TRIPS + 1


def test_multicast_halves_the_shared_operand_traffic():
    p = Problem(4096, 4096, 4096)
    plain = sm90.traffic(p, 128, 256, 256, "none")
    share_a = sm90.traffic(p, 128, 256, 256, "A")
    share_b = sm90.traffic(p, 128, 256, 256, "B")
    a_rows = 16 * 4096  # 16 column blocks each read all 4096 rows of A
    b_cols = 32 * 4096  # 32 row blocks each read all 4096 columns of B
    assert plain.l2_reads == a_rows + b_cols
    assert share_a.l2_reads == a_rows // 2 + b_cols
    assert share_b.l2_reads == a_rows + b_cols // 2
    assert share_a.ingress == plain.ingress == share_b.ingress


def test_odd_pairs_pay_for_the_recomputed_peer():
    # 3 column blocks with multicast A: the second pair's peer recomputes the last block.
    t = sm90.traffic(Problem(512, 384, 64), 128, 128, 128, "A")
    assert t.cluster_tiles == 4 * 2 and t.cta_tiles == 16


def test_wave_quantisation_in_the_cost():
    # Same tile, 132 vs 133 tiles: the 133rd tile costs a whole second wave.
    p132 = Problem(128 * 12, 128 * 11, 16384)
    p133 = Problem(128 * 7, 128 * 19, 16384)
    cfg = KernelConfig(block_m=128, block_n=128, num_stages=4)
    c132, c133 = sm90.cost_of(p132, H200, cfg), sm90.cost_of(p133, H200, cfg)
    assert (c132.terms["waves"], c133.terms["waves"]) == (1, 2)
    assert c133.terms["last_wave_util"] == pytest.approx(1 / 132, abs=1e-3)
    assert c133.terms["bound"] != "hbm"
    assert c133.cost > 1.5 * c132.cost


# ----------------------------------------------------------------------------- explain


def test_explain_is_json_and_complete():
    p = Problem(4096, 2112, 7168)
    e = explain(p, H200, top=4)
    json.loads(json.dumps(e))
    assert set(e) >= {"problem", "device", "chosen", "candidates", "rejected"}
    assert e["problem"]["m"] == 4096 and e["device"] == {"arch": "sm_90a", "num_sms": 132, "smem_capacity": CAPACITY}
    assert e["chosen"] == select(p, H200).to_dict()
    cands = e["candidates"]
    assert len(cands) == 4
    assert cands[0]["config"] == e["chosen"] and cands[0]["name"] == select(p, H200).name
    costs = [c["cost"] for c in cands]
    assert costs == sorted(costs)
    for c in cands:
        assert {
            "config",
            "name",
            "cost",
            "waves",
            "last_wave_util",
            "l2_bytes",
            "smem_bytes",
            "split_k",
            "units",
            "kb_per_unit",
            "splitk_cycles",
            "workspace_bytes",
            "model_us",
        } <= set(c)
        assert c["split_k"] == c["config"]["split_k"]
        KernelConfig.from_dict(c["config"])
    for r in e["rejected"]:
        assert set(r) == {"config", "rule"} and r["rule"]


def test_explain_shows_split_k():
    p = Problem(128, 7168, 16384)
    e = explain(p, H200, top=10)
    chosen = select(p, H200)
    assert chosen.split_k > 1 and e["chosen"]["split_k"] == chosen.split_k
    units = sm90.cluster_tiles_of(p, chosen.block_m, chosen.block_n, chosen.multicast) * chosen.split_k
    assert e["candidates"][0]["split_k"] == chosen.split_k and e["candidates"][0]["units"] == units
    assert len({c["split_k"] for c in e["candidates"]}) > 1  # other split counts were costed
    assert e["candidates"][0]["launch_cycles"] == H200.rates.launch_clk + sm90.SPLITK_LAUNCH_CLK
    assert "split-K" in e["cost_model"]


def test_explain_names_the_rules():
    e = explain(Problem(64, 4096, 512, out_dtype="fp32"), H200, top=3)
    rules = " | ".join(r["rule"] for r in e["rejected"])
    assert "block_m 256 only with a 16-bit output" in rules
    assert "single wave" in rules and "splits <=" in rules  # 8 K blocks: at most 2 splits
    e = explain(Problem(8192, 8192, 8192), H200)
    rules = " | ".join(r["rule"] for r in e["rejected"])
    assert "register budget" in rules
    assert "pipeline stages" in rules
    assert "even number of 64-wide pieces" in rules  # B is N-major: multicast B needs whole pairs


def test_no_pair_shares_a_k_major_a_that_one_block_holds_with_room_to_spare():
    """Where the unpaired tile loads only the rows of a K-major A that exist (a_rows), a pair
    sharing A would load whole boxes, zero-filled past M: it is removed, and explain says so.
    An M-major A (no a_rows) and an M past the block keep their A pairs."""
    p = Problem(2, 29392, 6592, b_major="N")  # chose m64n128 A pairs before the rule
    chosen = heuristics.select(p, H200)
    assert chosen.multicast != "A" and chosen.a_rows == 8, chosen.name
    rejected = [r for r in explain(p, H200)["rejected"] if r["rule"] == sm90.ZERO_FILL_RULE]
    assert rejected and all("multicast A" in r["config"] for r in rejected), rejected
    assert sm90._zero_filled_a(p, np.array([64, 128]), np.array([1, 1])).all()
    m_major = Problem(2, 29392, 6592, a_major="M", b_major="N")
    assert not sm90._zero_filled_a(m_major, np.array([64]), np.array([1])).any()
    assert sm90.ZERO_FILL_RULE not in {r["rule"] for r in explain(m_major, H200)["rejected"]}
    # M = 64 fills a 64-row block: only the taller tiles' A pairs go
    full = [
        r["config"]
        for r in explain(Problem(64, 29392, 6592, b_major="N"), H200)["rejected"]
        if r["rule"] == sm90.ZERO_FILL_RULE
    ]
    assert full and all(not c.startswith("m64n") for c in full), full


# ----------------------------------------------------------------------------- check_config


def _cfg(**kw):
    return KernelConfig(**{**select(Problem(4096, 4096, 4096), H200).to_dict(), **kw})


def test_check_config_accepts_the_selection_and_names_mismatches():
    p = Problem(4096, 4096, 4096)
    assert check_config(_cfg(), p, H200) == []
    reasons = check_config(_cfg(dtype="fp16", b_major="K", has_c=True), p, H200)
    text = " | ".join(reasons)
    assert "dtype is 'fp16' but the problem has 'bf16'" in text
    assert "b_major is 'K' but the problem has 'N'" in text
    assert "has_c is True but the problem has False" in text
    assert check_config(_cfg(arch="sm_100a"), p, H200)[0] == "arch is 'sm_100a' but the device is 'sm_90a'"


def test_check_config_smem_registers_structure():
    p = Problem(4096, 4096, 4096)
    too_deep = check_config(_cfg(num_stages=8), p, H200)
    assert any("shared memory" in r and "232448" in r for r in too_deep)
    spills = check_config(
        _cfg(block_m=128, block_n=256, num_consumers=1, cluster_size=1, multicast="none", num_stages=3), p, H200
    )
    assert any("256 fp32 accumulator registers" in r for r in spills)
    structure = check_config(_cfg(block_m=64, num_consumers=2, block_n=128), p, H200)
    assert any("multiple of 64 rows" in r for r in structure)
    assert any("swap_ab needs" in r for r in check_config(_cfg(swap_ab=True, split_k=2), p, H200))
    assert check_config("not a config", p, H200)


def test_check_config_lets_split_k_run_past_one_wave():
    # no split waits for one that has not started (the last to finish reduces), so a forced
    # config may have more work units than one wave; the heuristics themselves keep to one wave
    p = Problem(64, 4096, 7168)
    cfg = select(p, H200)  # m64n64: 64 tiles
    assert (cfg.block_m, cfg.block_n, cfg.split_k) == (64, 64, 1)
    for split_k in (1, 2, 3, 8):  # 64 to 512 work units over 132 CTAs
        assert check_config(KernelConfig(**{**cfg.to_dict(), "split_k": split_k}), p, H200) == []
    # ... but the reducer holds a split of partials in registers besides its accumulators
    p = Problem(1000, 1000, 4096)
    wide = KernelConfig(block_m=128, block_n=224, num_stages=3, split_k=2)
    assert any("accumulators per math thread" in r for r in check_config(wide, p, H200))
    assert check_config(KernelConfig(**{**wide.to_dict(), "split_k": 1}), p, H200) == []


def test_require_valid_raises_with_reasons():
    p = Problem(4096, 4096, 4096)
    with pytest.raises(ValueError, match=r"config: .* cannot run .*shared memory"):
        heuristics.require_valid(_cfg(num_stages=8), p, H200)
    assert heuristics.require_valid(_cfg(), p, H200) == _cfg()


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_stages", float("nan")),
        ("num_consumers", True),
        ("num_consumers", 1.0),
        ("cluster_size", 2.0),
        ("swap_ab", [1]),
        ("has_c", 1),
        ("arch", 90),
        ("block_m", "128"),
        ("split_k", None),
    ],
)
def test_kernel_config_fields_have_exact_types(field, value):
    with pytest.raises(ValueError, match=f"invalid KernelConfig: {field} must be (int|bool|str), got"):
        KernelConfig(**{field: value})
    with pytest.raises(ValueError, match=field):
        KernelConfig.from_dict({field: value})


def test_kernel_config_from_dict_needs_a_mapping():
    for data in ([1], "x", None, 3):
        with pytest.raises(ValueError, match="must be a mapping"):
            KernelConfig.from_dict(data)


def test_a_rows_must_cover_every_row_of_m():
    """a_rows loads only that many rows of A per tile: valid only when the kernel's M fits them
    (issue 16: a_rows=8 for M=4096 loaded 8 of 128 rows and stored all of them)."""
    big, small = Problem(4096, 4096, 4096), Problem(8, 4096, 4096)
    short = _cfg(a_rows=8)
    assert any("a_rows=8" in r and "M=4096" in r for r in check_config(short, big, H200))
    with pytest.raises(ValueError, match=r"^config: .*a_rows=8 loads only"):
        heuristics.require_valid(short, big, H200)
    assert not any("a_rows" in r for r in check_config(short, small, H200))
    assert not any("a_rows" in r for r in check_config(_cfg(a_rows=16), Problem(9, 4096, 4096), H200))


def test_a_rows_from_the_env_is_checked_against_m(monkeypatch):
    monkeypatch.setenv("JITGEMM_CONFIG", '{"a_rows": 8}')
    with pytest.raises(ValueError, match="JITGEMM_CONFIG=.*a_rows=8 loads only"):
        config_from_env(Problem(4096, 4096, 4096), H200)


def test_tile_counts_that_wrap_int32_are_rejected():
    """The templates count work units and raster groups in 32-bit ints."""
    huge = Problem(1 << 25, 1 << 15, 64)  # 2^40 output elements, the most a Problem takes
    with pytest.raises(ValueError, match="exceed"):
        Problem(1 << 25, (1 << 15) + 1, 64)
    with pytest.raises(ValueError, match=r"Problem.k must be an int in \[1, 2147482624\]"):
        Problem(1, 1, 1 << 31)
    tiny = KernelConfig(block_m=64, block_n=16, num_consumers=1, group_size=16)
    reasons = check_config(rules.with_fields(tiny, split_k=4), huge, H200)
    assert any("32-bit work unit count" in r for r in reasons), reasons
    wide = Problem(1, (1 << 31) - 1024, 64)  # one m block, 2^27 n blocks of 16: group 4096 wraps
    assert any("raster group" in r for r in check_config(rules.with_fields(tiny, group_size=4096), wide, H200))
    # select never picks such a tiling; what it picks passes the checks
    for p in (huge, wide):
        cfg = select(p, H200)
        assert check_config(cfg, p, H200) == [], cfg.name


# ----------------------------------------------------------------------------- JITGEMM_CONFIG


def test_env_unset_or_empty_gives_none(monkeypatch):
    p = Problem(256, 256, 256)
    monkeypatch.delenv("JITGEMM_CONFIG", raising=False)
    assert config_from_env(p, H200) is None
    monkeypatch.setenv("JITGEMM_CONFIG", "  ")
    assert config_from_env(p, H200) is None


def test_env_partial_override_rederives_dependent_fields(monkeypatch):
    p = Problem(4096, 4096, 4096, "fp16", "fp32", "M", "K")
    monkeypatch.setenv("JITGEMM_CONFIG", json.dumps({"block_m": 64, "block_n": 208}))
    cfg = config_from_env(p, H200)
    assert (cfg.block_m, cfg.block_n, cfg.num_consumers) == (64, 208, 1)
    assert (cfg.dtype, cfg.out_dtype, cfg.a_major, cfg.b_major) == ("fp16", "fp32", "M", "K")
    assert cfg.num_stages == rules.max_stages(cfg, CAPACITY, smem_of=sm90.stage_smem)
    assert check_config(cfg, p, H200) == []
    # multicast implies the cluster; cluster 1 implies no multicast
    monkeypatch.setenv("JITGEMM_CONFIG", '{"multicast": "A", "block_m": 128, "block_n": 128}')
    cfg = config_from_env(p, H200)
    assert (cfg.cluster_size, cfg.multicast) == (2, "A")
    monkeypatch.setenv("JITGEMM_CONFIG", '{"cluster_size": 1}')
    assert config_from_env(p, H200).multicast == "none"
    # fields not given come from select
    monkeypatch.setenv("JITGEMM_CONFIG", '{"group_size": 3}')
    cfg = config_from_env(p, H200)
    assert cfg == KernelConfig(**{**select(p, H200).to_dict(), "group_size": 3})


def test_env_tile_rederives_selects_per_tile_extras(monkeypatch):
    """select's B tail and rows of A were for its own tile: a tile given keeps the tail only where
    it can end in one and re-derives the rows of A for its own block_m and pairing; a pair given
    without a side takes the other side where the default one cannot pair the tile. Fields given
    stay as given (and are checked)."""

    def forced(p, fields):
        monkeypatch.setenv("JITGEMM_CONFIG", json.dumps(fields))
        cfg = config_from_env(p, H200)
        assert check_config(cfg, p, H200) == [], cfg.name
        return cfg

    tail = Problem(4096, 576, 7168)
    assert select(tail, H200).b_tail
    assert not forced(tail, {"block_n": 128}).b_tail  # 128 is two whole pieces: no tail
    assert forced(tail, {"block_n": 208}).b_tail  # 208 ends 16 past a piece: the tail stays
    monkeypatch.setenv("JITGEMM_CONFIG", '{"block_n": 128, "b_tail": true}')  # a tail given is kept, and checked
    with pytest.raises(ValueError, match="b_tail needs an N-major B"):
        config_from_env(tail, H200)
    # select's side (A) cannot pair an M-major A tile of one 64-wide piece; B can, without the tail
    tail_m = Problem(4096, 576, 7168, "bf16", None, "M", "N")
    assert select(tail_m, H200).b_tail and select(tail_m, H200).multicast == "A"
    pair_b = forced(tail_m, {"block_m": 64, "block_n": 208, "cluster_size": 2})
    assert (pair_b.multicast, pair_b.b_tail) == ("B", False)
    decode = Problem(81, 2104, 20423, "bf16", "fp32", "K", "N")
    chosen = select(decode, H200)
    assert (chosen.block_m, chosen.a_rows) == (128, 88)
    assert forced(decode, {"block_m": 64}).a_rows == 0  # 88 rows fill more than one 64-row block
    paired = forced(decode, {"cluster_size": 2})
    assert (paired.multicast, paired.a_rows) == ("A", 0)  # a pair sharing A loads all its rows
    assert forced(decode, {"block_n": 128}).a_rows == 88
    monkeypatch.setenv("JITGEMM_CONFIG", '{"block_m": 64, "a_rows": 8}')
    with pytest.raises(ValueError, match="a_rows=8 loads only"):
        config_from_env(decode, H200)
    odd = Problem(575, 810, 2000, "fp16", None, "M", "K")  # a 64-row M-major A tile: one piece
    assert forced(odd, {"cluster_size": 2}).multicast == "B"  # A (the longer side) cannot pair it
    monkeypatch.setenv("JITGEMM_CONFIG", '{"cluster_size": 2, "multicast": "A"}')
    with pytest.raises(ValueError, match="multicast A: an MN-major tile of 64"):
        config_from_env(odd, H200)


def test_env_stream_k(monkeypatch):
    """stream_k alone keeps select's tile and drops its split (stream-K cuts K itself); a swapped
    choice cannot take it (ValueError naming JITGEMM_CONFIG)."""
    p = Problem(417, 1536, 16384, b_major="K")
    chosen = select(p, H200)
    assert chosen.split_k > 1 and not chosen.swap_ab
    monkeypatch.setenv("JITGEMM_CONFIG", '{"stream_k": true}')
    cfg = config_from_env(p, H200)
    assert cfg.stream_k and cfg.split_k == 1 and check_config(cfg, p, H200) == []
    assert (cfg.block_m, cfg.block_n, cfg.cluster_size, cfg.num_stages) == (
        chosen.block_m,
        chosen.block_n,
        chosen.cluster_size,
        chosen.num_stages,
    )
    assert cfg == sm90.with_raster(KernelConfig(**{**chosen.to_dict(), "split_k": 1, "stream_k": True}), p, H200)
    swapped = Problem(640, 4096, 8192, a_major="M")
    assert select(swapped, H200).swap_ab
    with pytest.raises(ValueError, match="JITGEMM_CONFIG.*stream-K"):
        config_from_env(swapped, H200)


def test_env_split_k(monkeypatch):
    p = Problem(64, 4096, 7168)
    chosen = select(p, H200)
    assert chosen.split_k == 1
    # split_k alone keeps select's tile; the raster follows the split
    monkeypatch.setenv("JITGEMM_CONFIG", '{"split_k": 2}')
    cfg = config_from_env(p, H200)
    assert cfg.split_k == 2 and check_config(cfg, p, H200) == []
    assert (cfg.block_m, cfg.block_n, cfg.cluster_size, cfg.num_stages) == (
        chosen.block_m,
        chosen.block_n,
        chosen.cluster_size,
        chosen.num_stages,
    )
    assert cfg == sm90.with_raster(KernelConfig(**{**chosen.to_dict(), "split_k": 2}), p, H200)
    # a split chosen by select is kept when only the raster changes, re-derived with the tile,
    # and turned off by split_k 1
    q = Problem(128, 7168, 16384)
    q_split = select(q, H200).split_k
    assert q_split > 1
    monkeypatch.setenv("JITGEMM_CONFIG", '{"group_size": 3}')
    assert config_from_env(q, H200).split_k == q_split
    monkeypatch.setenv("JITGEMM_CONFIG", '{"block_m": 64, "block_n": 128}')
    cfg = config_from_env(q, H200)
    assert cfg.split_k == sm90.with_split(KernelConfig(**{**cfg.to_dict(), "split_k": 1}), q, H200).split_k
    monkeypatch.setenv("JITGEMM_CONFIG", '{"block_m": 128, "block_n": 128, "split_k": 2}')
    assert config_from_env(q, H200).split_k == 2
    monkeypatch.setenv("JITGEMM_CONFIG", '{"split_k": 1}')
    assert config_from_env(q, H200) == sm90.with_raster(
        KernelConfig(**{**select(q, H200).to_dict(), "split_k": 1}), q, H200
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"split_k": 0}', "JITGEMM_CONFIG=.*split_k must be in \\[1, 32\\]"),
        ('{"split_k": 33}', "JITGEMM_CONFIG=.*split_k must be in \\[1, 32\\]"),
        ('{"split_k": 2.0}', "JITGEMM_CONFIG: field 'split_k' must be int"),
        ("{not json", "JITGEMM_CONFIG must be a JSON object"),
        ("[1, 2]", "JITGEMM_CONFIG must be a JSON object"),
        ('{"block_q": 1}', r"JITGEMM_CONFIG: unknown KernelConfig fields \['block_q'\]"),
        ("[" * 100_000, r"JITGEMM_CONFIG must be a JSON object .*: not valid JSON \(nested too deeply\)"),
        ('{"num_stages": NaN}', "JITGEMM_CONFIG: field 'num_stages' must be int"),
        ('{"block_n": "128"}', "JITGEMM_CONFIG: field 'block_n' must be int"),
        ('{"has_c": 1}', "JITGEMM_CONFIG: field 'has_c' must be bool"),
        ('{"block_n": 100}', "JITGEMM_CONFIG=.*block_n must be a multiple of 8"),
        ('{"dtype": "fp16"}', "JITGEMM_CONFIG=.*dtype is 'fp16' but the problem has 'bf16'"),
        ('{"block_m": 128, "block_n": 256, "num_stages": 9}', "JITGEMM_CONFIG=.*shared memory"),
        ('{"block_m": 128, "block_n": 256, "num_consumers": 1}', "JITGEMM_CONFIG=.*accumulator registers"),
        ('{"block_n": 192, "multicast": "B"}', "JITGEMM_CONFIG=.*even number of 64-wide pieces"),
    ],
)
def test_env_errors_name_the_variable(monkeypatch, text, message):
    monkeypatch.setenv("JITGEMM_CONFIG", text)
    with pytest.raises(ValueError, match=message):
        config_from_env(Problem(4096, 4096, 4096), H200)


def test_env_override_swap_ab_on_sm90(monkeypatch):
    # select's B tail, pair and stages belong to its own tile: a swapped tile drops them
    p = Problem(4096, 576, 7168)
    assert select(p, H200).b_tail and select(p, H200).cluster_size == 2
    monkeypatch.setenv("JITGEMM_CONFIG", '{"swap_ab": true, "block_m": 128, "block_n": 160}')
    cfg = config_from_env(p, H200)
    assert (cfg.swap_ab, cfg.b_tail, cfg.split_k, cfg.cluster_size, cfg.num_stages) == (True, False, 1, 1, 5)
    assert check_config(cfg, p, H200) == []
    monkeypatch.setenv("JITGEMM_CONFIG", '{"swap_ab": true, "block_n": 160, "multicast": "B"}')
    assert (lambda c: (c.cluster_size, c.multicast))(config_from_env(p, H200)) == (2, "B")
    monkeypatch.setenv("JITGEMM_CONFIG", '{"swap_ab": true, "split_k": 2}')
    with pytest.raises(ValueError, match="swap_ab needs a 16-bit output"):
        config_from_env(p, H200)


def test_env_override_on_sm100_follows_the_sm100_rules(monkeypatch):
    sm100 = pytest.importorskip("jitgemm.heuristics.sm100")
    dev = DeviceSpec("sm_100a", 148)
    big, small = Problem(4096, 4096, 4096), Problem(64, 4096, 7168)
    # cluster 2 alone: the pair splits the user's B (no swap) ...
    monkeypatch.setenv("JITGEMM_CONFIG", '{"cluster_size": 2, "block_m": 128, "block_n": 128}')
    cfg = config_from_env(big, dev)
    assert (cfg.cluster_size, cfg.multicast, cfg.swap_ab, cfg.num_consumers) == (2, "B", False, 1)
    assert cfg.num_stages == sm100.with_stages(cfg, dev)[0].num_stages > 2
    assert (cfg.raster, cfg.group_size) == (lambda c: (c.raster, c.group_size))(sm100.with_raster(cfg, big, dev))
    assert check_config(cfg, big, dev) == []
    # ... or A under swap_ab; a pair given up drops the multicast
    monkeypatch.setenv("JITGEMM_CONFIG", '{"swap_ab": true, "cluster_size": 2, "block_m": 128, "block_n": 64}')
    cfg = config_from_env(small, dev)
    assert (cfg.cluster_size, cfg.multicast, cfg.swap_ab) == (2, "A", True) and check_config(cfg, small, dev) == []
    monkeypatch.setenv("JITGEMM_CONFIG", '{"swap_ab": true}')  # select's pair, if any, follows
    cfg = config_from_env(small, dev)
    assert cfg.swap_ab and cfg.multicast == ("A" if cfg.cluster_size == 2 else "none")
    monkeypatch.setenv("JITGEMM_CONFIG", '{"cluster_size": 2, "block_m": 128, "swap_ab": false}')
    cfg = config_from_env(big, dev)
    assert (cfg.multicast, cfg.swap_ab) == ("B", False)
    monkeypatch.setenv("JITGEMM_CONFIG", '{"cluster_size": 1}')
    assert config_from_env(big, dev).multicast == "none"
    # num_consumers follows block_m (128 rows per consumer), the stages follow the tile
    monkeypatch.setenv("JITGEMM_CONFIG", '{"block_m": 256, "block_n": 128, "cluster_size": 1}')
    cfg = config_from_env(big, dev)
    assert cfg.num_consumers == 2 and cfg.num_stages == sm100.with_stages(cfg, dev)[0].num_stages
    assert cfg == sm100.with_raster(cfg, big, dev) and check_config(cfg, big, dev) == []
    # fields that only change the schedule keep select's tile and stages
    monkeypatch.setenv("JITGEMM_CONFIG", '{"group_size": 3}')
    assert config_from_env(big, dev) == KernelConfig(**{**select(big, dev).to_dict(), "group_size": 3})


# ----------------------------------------------------------------------------- sm_100a dispatch


def test_heuristics_reach_each_arch_through_the_registry(monkeypatch):
    from jitgemm import registry

    calls = []
    fake = types.SimpleNamespace(
        select=lambda p, d: calls.append(("select", p, d)) or "picked",
        explain=lambda p, d, top: calls.append(("explain", p, d, top)) or {"chosen": "x"},
    )
    real = registry.get
    monkeypatch.setattr(
        registry, "get", lambda name: types.SimpleNamespace(rules=fake) if name == "sm_100a" else real(name)
    )
    dev = DeviceSpec("sm_100a", 148)
    p = Problem(1, 2, 3)
    select.cache_clear()  # an answer from before the patch would be a dictionary hit
    try:
        assert select(p, dev) == "picked"
        assert explain(p, dev, top=2) == {"chosen": "x"}
        assert [c[0] for c in calls] == ["select", "explain"] and calls[1][3] == 2
    finally:
        select.cache_clear()  # ... and so would the fake's answer after it


def test_backends_load_on_first_use():
    code = (
        "import sys, jitgemm; from jitgemm.heuristics import DeviceSpec, select; from jitgemm.problem import Problem; "
        "select(Problem(128, 256, 512), DeviceSpec('sm_90a', 132)); "
        "print(sorted(m for m in sys.modules if m.startswith('jitgemm.archs.') and m.endswith('.arch')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert out.stdout.strip() == "['jitgemm.archs.sm90.arch']"


# ----------------------------------------------------------------------------- shared helpers


@pytest.mark.parametrize("module", [cost, heuristics.device, rules, search, tiles], ids=lambda m: m.__name__)
def test_shared_modules_import_no_arch_backend(module):
    tree = ast.parse(Path(module.__file__).read_text())
    imported = [("." * node.level) + (node.module or "") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert not [name for name in imported if name.startswith("jitgemm.archs")], imported
    if module is tiles:  # jitgemm.geometry: below the heuristics and the backends
        assert not [name for name in imported if name.startswith(("jitgemm", ".."))], imported


def test_waves_of():
    w = tiles.waves_of(512, 132)
    assert (w.waves, w.last_wave_tiles) == (4, 116)
    assert w.last_wave_util == pytest.approx(116 / 132)
    assert w.efficiency == pytest.approx(512 / 528)
    assert tiles.waves_of(100, 132).waves == 1
    assert tiles.waves_of(264, 132).last_wave_util == 1.0


def test_max_stages_matches_brute_force():
    for cfg in [
        KernelConfig(),
        KernelConfig(block_m=64, block_n=16, num_consumers=1),
        KernelConfig(block_m=256, block_n=128, out_dtype="fp32"),
        KernelConfig(block_n=112, b_major="N"),
        KernelConfig(block_n=256, out_dtype="fp32"),
    ]:
        brute = 0
        for s in range(2, rules.MAX_STAGES + 1):
            if layout_of(KernelConfig(**{**cfg.to_dict(), "num_stages": s})).smem_bytes <= CAPACITY:
                brute = s
        assert rules.max_stages(cfg, CAPACITY, smem_of=rules.at_stages(lambda c: layout_of(c).smem_bytes)) == brute


def test_stage_smem_from_one_layout_matches_each_stage_counts_layout():
    """sm90.stage_smem reads one layout of the tile for every stage count: the same bytes as the
    layout of the config with that many stages (whole staging where it fits 3 stages)."""
    for cfg in [
        KernelConfig(),
        KernelConfig(block_m=64, block_n=16, num_consumers=1, has_c=True),
        KernelConfig(block_m=256, block_n=128, out_dtype="fp32", b_major="K"),
        KernelConfig(block_n=112, b_major="N", b_tail=True),
        KernelConfig(block_n=256, out_dtype="fp32", cluster_size=2, multicast="B"),
        KernelConfig(block_n=384, cluster_size=2, multicast="B"),
        KernelConfig(block_n=512, num_stages=3),
    ]:
        whole = layout_of(rules.with_fields(cfg, num_stages=rules.MIN_STAGES))
        for s in range(2, rules.MAX_STAGES + 1):
            lay = layout_of(rules.with_fields(cfg, num_stages=s))
            if whole.smem_bytes - whole.out_bytes + whole.out_bytes_whole <= CAPACITY:
                want = lay.smem_bytes - lay.out_bytes + lay.out_bytes_whole
            else:
                want = lay.smem_bytes
            assert sm90.stage_smem(cfg, s) == want, (cfg.name, s)


def test_stage_rule():
    assert rules.stage_rule(128, 256, 3) is None
    assert "need >= 3" in rules.stage_rule(128, 256, 2)
    assert "need >= 4" in rules.stage_rule(128, 128, 3)
    assert rules.stage_rule(128, 128, 4) is None


def test_covered_extent():
    assert tiles.covered_extent(1000, 128, 128) == 1000
    # blocks of 112 loading 128 columns: each re-reads 16 of its neighbour, clipped at the edge
    assert tiles.covered_extent(1000, 112, 128) == 8 * 128 + (1000 - 8 * 112)
    assert tiles.covered_extent(100, 16, 64) == sum(min(64, 100 - j * 16) for j in range(7))


@pytest.mark.parametrize("pair_along", [None, "n", "m"])
@pytest.mark.parametrize("raster", ["m", "n"])
def test_tile_order_visits_every_tile_once(pair_along, raster):
    num_m, num_n = 7, 5
    seen = []
    for item in tiles.tile_order(num_m, num_n, raster, 3, pair_along):
        seen.extend(item)
        if pair_along == "n":
            assert item[0][0] == item[1][0]  # same m block: they share A
        if pair_along == "m":
            assert item[0][1] == item[1][1]  # same n block: they share B
    assert set(seen) == {(m, n) for m in range(num_m) for n in range(num_n)}
    dupes = len(seen) - num_m * num_n
    assert dupes == {None: 0, "n": num_m, "m": num_n}[pair_along]  # peers past the edge


def _walked_footprint(num_m, num_n, rows_per_m, cols_per_n, slots, raster, group, pair_along, max_waves=16):
    """raster_footprint by walking `tile_order` tile by tile (the reference for the closed form)."""
    sizes, ms, ns = [], set(), set()
    for t, item in enumerate(tiles.tile_order(num_m, num_n, raster, group, pair_along)):
        for m, n in item:
            ms.add(m)
            ns.add(n)
        if (t + 1) % slots == 0:
            sizes.append(len(ms) * rows_per_m + len(ns) * cols_per_n)
            ms, ns = set(), set()
            if len(sizes) >= max_waves:
                break
    if ms and len(sizes) < max_waves:
        sizes.append(len(ms) * rows_per_m + len(ns) * cols_per_n)
    return sum(sizes) / len(sizes)


def test_raster_footprint_in_closed_form_equals_walking_the_tiles():
    rng = random.Random(3)
    for _ in range(1500):
        num_m, num_n = rng.randint(1, 70), rng.randint(1, 70)
        slots = rng.choice([1, 2, 3, 7, 16, 33, 66, 132, rng.randint(1, 300)])
        raster, group, pair_along = rng.choice("mn"), rng.choice([1, 2, 3, 8, 16]), rng.choice([None, "m", "n"])
        args = (num_m, num_n, 128, 256, slots, raster, group, pair_along)
        assert tiles.raster_footprint(*args) == _walked_footprint(*args), args


def test_choose_raster_minimises_the_working_set():
    # A tall-thin grid: grouping along M (the long side) keeps fewer B columns live.
    raster, group, fp = tiles.choose_raster(64, 8, 128, 256, 132)
    for r in "mn":
        for g in (8, 16):
            assert fp <= tiles.raster_footprint(64, 8, 128, 256, 132, r, g)
    # Selected configs carry the raster choose_raster picks.
    p = Problem(8192, 8192, 8192)
    cfg = select(p, H200)
    b_box = -(-cfg.block_n // 64) * 64
    r, g, _ = tiles.choose_raster(
        -(-p.m // cfg.block_m),
        -(-p.n // cfg.block_n),
        cfg.block_m,
        b_box,
        H200.num_sms // cfg.cluster_size,
        pair_along(cfg),
    )
    assert (cfg.raster, cfg.group_size) == (r, g)


def test_register_split_matches_the_template():
    from importlib import resources

    src = resources.files("jitgemm.templates").joinpath("sm90/gemm.cu.j2").read_text()
    assert f"setmaxnreg_dec<{sm90_checks.PRODUCER_REGS}>" in src
    assert f"setmaxnreg_inc<{sm90_checks.CONSUMER_REGS}>" in src
    # the math warpgroups take only what the producer gives back
    assert sm90_checks.PRODUCER_REGS + 2 * sm90_checks.CONSUMER_REGS <= 3 * sm90_checks.LAUNCH_REGS
    assert sm90_checks.LAUNCH_REGS == sm90_checks.REGISTER_FILE // 384 // 8 * 8


def test_decode_tiles_load_only_the_rows_of_a_that_exist():
    # A 64-row TMA box for M = 1 is mostly out of bounds and streams slowly (H200, measured
    # without PDL: 32.8 us at 1x4096x7168 vs 19.2 us at M = 64, same kernel), so a single tile
    # row loads ceil(M / 8) * 8.
    one = select(Problem(1, 4096, 7168, "bf16", "bf16", "K", "N"), H200)
    assert one.a_rows == 8 and one.block_m == 64
    assert select(Problem(20, 4096, 7168, "bf16", "bf16", "K", "N"), H200).a_rows == 24
    assert select(Problem(1, 4096, 7168, "bf16", "bf16", "M", "N"), H200).a_rows == 0  # M-major A
    assert select(Problem(4096, 4096, 4096, "bf16", "bf16", "K", "N"), H200).a_rows == 0


def test_swapped_tiles_are_costed_as_the_transposed_problem_and_chosen_where_cheaper():
    # b = W.t(), N = K = 4096, M = 512: measured on the H200 (bf16, us), the swapped m128n128
    # pairs ran 25.5 against 36.3 for the unswapped m256n96 pairs chosen before, cuBLAS 26.2
    p = Problem(512, 4096, 4096, "bf16", "bf16", "K", "K")
    cfg = select(p, H200)
    assert cfg.swap_ab and (cfg.block_m, cfg.block_n, cfg.split_k, cfg.a_rows) == (128, 128, 1, 0), cfg.name
    assert not check_config(cfg, p, H200)
    q, plain = sm90.transposed(p), sm90.unswapped(cfg, p)
    assert (q.m, q.n, q.a_major, q.b_major) == (4096, 512, "K", "K")
    assert sm90.swapped(plain, p) == cfg and plain.multicast == {"A": "B", "B": "A", "none": "none"}[cfg.multicast]
    cost = sm90.cost_of(p, H200, cfg).cost
    assert cost == sm90.cost_of(q, H200, plain).cost == pytest.approx(sm90.costs_of(p, H200, [cfg])[0])
    shown = explain(p, H200, top=3)
    assert shown["chosen"] == cfg.to_dict() and shown["candidates"][0]["name"] == cfg.name
    assert any(not c["config"]["swap_ab"] for c in explain(p, H200, top=40)["candidates"])
    # costed only for a 16-bit output, M < N and M beyond one 64-row atom
    for m, n, out_dtype, has_c in (
        (64, 4096, "bf16", False),
        (4096, 512, "bf16", False),
        (512, 4096, "fp32", False),
        (512, 4096, "fp32", True),
    ):
        other = Problem(m, n, 4096, "bf16", out_dtype, "K", "K", has_c)
        assert not sm90.swap_possible(other) and not select(other, H200).swap_ab


def test_derived_config_equals_the_validated_one_and_refuses_unknown_fields():
    """KernelConfig.derived (the heuristics' configs of their own tables) skips validation only:
    the same value, hash and field order as the validating constructor's; an unknown field is
    an error, and what select returns is a config the constructor accepts."""
    base = KernelConfig(b_major="K")
    derived = base.derived(block_m=64, block_n=208, num_consumers=1, num_stages=7)
    validated = KernelConfig(**{**base.to_dict(), "block_m": 64, "block_n": 208, "num_consumers": 1, "num_stages": 7})
    assert derived == validated and hash(derived) == hash(validated)
    assert list(vars(derived)) == list(vars(validated)) and not derived.problems()
    with pytest.raises(TypeError, match="block_q"):
        base.derived(block_q=1)
    chosen = heuristics.select(Problem(2047, 4096, 4096, dtype="bf16", a_major="K", b_major="K"), H200)
    assert KernelConfig(**chosen.to_dict()) == chosen
