"""Render an sm_90a KernelConfig to self-contained CUDA C++ (templates/sm90/gemm.cu.j2)."""

from __future__ import annotations

from ...config import KernelConfig
from ...problem import DTYPE_BYTES
from ...render import environment, kernel_name
from .layout import REDUCER_LEAD_KBLOCKS, KernelLayout, layout_of, pair_along, read_batch

TEMPLATE = "sm90/gemm.cu.j2"


def _operand_vars(name: str, op, major_is_k: bool, swap_ab: bool, tail: bool = False) -> dict:
    """What the producer needs to load one operand's pieces (`tail`: the narrow last part of an
    MN-major tile, after its full-width pieces in the same stage). Tiles start at the kernel
    tile's m0 (A) and n0 (B), the other way round under swap_ab."""
    lower = name.lower()
    parent, op = (op, op.tail) if tail else (None, op)
    origin = "m0" if (name == "A") != swap_ab else "n0"
    return {
        "name": f"{name} tail" if tail else name,
        "multicast": op.multicast,
        "num_pieces": op.num_pieces,
        "pieces_per_rank": op.pieces_per_rank,
        "piece_bytes": op.piece_bytes,
        "piece_extent": op.piece_extent,
        "step": op.step,
        "step_bytes": op.step_bytes,
        "tile_fn": f"{lower}_tile",
        "smem_offset": parent.num_pieces * parent.piece_bytes if tail else 0,
        "map": f"map_{lower}_tail" if tail else f"map_{lower}",
        "origin": f"{origin} + {parent.main_extent}" if tail else origin,
        # TMA coordinates, innermost dimension first.
        "coords": "k0, mn" if major_is_k else "mn, k0",
        # the last block along the operand's rows (layout.OperandLayout.edge): M for A, N for B
        "edge_box": op.edge_box,
        "edge_pieces": op.edge_pieces,
        "rows": "M" if name == "A" else "N",
        "edge_flag": f"{lower}_edge",
        "edge_map": f"map_{lower}_edge",
    }


WGMMA_MAX_N = 256


def b_slices(lay: KernelLayout) -> list[dict]:
    """The wgmma instructions of one m64 atom and k16 step, each over a slice of wgmma's B operand
    tile (`lay.mma_b`: the user's B, or A under swap_ab): at
    most 256 columns (the widest wgmma) of the full-width pieces, then the tail if any. Each
    slice's accumulators follow the previous one's, in the fragment order one wgmma of the
    whole width would have. `offset`: the slice's first byte in that operand's tile; `part`:
    the operand layout its descriptor is built from."""
    b = lay.mma_b
    slices = []
    for first in range(0, b.main_extent, WGMMA_MAX_N):
        offset = first * 128 if b.major_is_k else first // b.piece_extent * b.piece_bytes
        slices.append(
            {
                "n": min(WGMMA_MAX_N, b.main_extent - first),
                "first_acc": first // 2,
                "offset": offset,
                "part": b,
                "what": f"columns {first}..",
            }
        )
    if b.tail:
        slices.append(
            {
                "n": b.tail.extent,
                "first_acc": b.main_extent // 2,
                "offset": b.num_pieces * b.piece_bytes,
                "part": b.tail,
                "what": f"the tail, columns {b.main_extent}..",
            }
        )
    return slices


def render(cfg: KernelConfig) -> str:
    """The CUDA source of the sm_90a kernel for `cfg` (raises ValueError if it cannot be laid out)."""
    lay = layout_of(cfg)
    variables = {
        "cfg": cfg,
        "lay": lay,
        "kernel_name": kernel_name(cfg),
        "b_slices": b_slices(lay),
        "pair_along": pair_along(cfg),  # templates/common/scheduler.cuh
        # the stage's tile each wgmma operand reads
        "mma_a_tile": "b_tile" if cfg.swap_ab else "a_tile",
        "mma_b_tile": "a_tile" if cfg.swap_ab else "b_tile",
        "ab_type": {"bf16": "bf16", "fp16": "f16"}[cfg.dtype],
        # wgmma's transpose flags: 0 reads K-major operands, 1 MN-major ones.
        "trans_a": 0 if lay.mma_a.major_is_k else 1,
        "trans_b": 0 if lay.mma_b.major_is_k else 1,
        "out_elem": DTYPE_BYTES[cfg.out_dtype],
        "pack": {"bf16": "pack_bf16x2", "fp16": "pack_f16x2", "fp32": ""}[cfg.out_dtype],
        "to_f32": {"bf16": "bf16_to_f32", "fp16": "f16_to_f32", "fp32": ""}[cfg.out_dtype],
        "read_batch": read_batch(lay),
        "reducer_lead": REDUCER_LEAD_KBLOCKS,
        "operands": [
            _operand_vars("A", lay.a, cfg.a_major == "K", cfg.swap_ab),
            _operand_vars("B", lay.b, cfg.b_major == "K", cfg.swap_ab),
        ]
        + ([_operand_vars("B", lay.b, False, cfg.swap_ab, tail=True)] if lay.b.tail else []),
    }
    return environment().get_template(TEMPLATE).render(**variables)
