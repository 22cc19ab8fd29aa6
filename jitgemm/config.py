"""KernelConfig: every choice a template needs to render one kernel, as one frozen value."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from .problem import A_MAJORS, B_MAJORS, DTYPE_BYTES, INPUT_DTYPES, OUTPUT_DTYPES
from .registry import ARCH_NAMES as ARCHS

K_BLOCK_BYTES = 128  # a k-block is 128 bytes of K (block_k elements), one 128-byte swizzle row


def _exact(value, want: type) -> bool:
    """`value` is a `want` (an int that is not a bool, for int)."""
    return isinstance(value, want) and (want is bool or not isinstance(value, bool))


def parse_json(text: str, source: str):
    """json.loads, with every way the text can fail (deep nesting too) a ValueError naming `source`."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise ValueError(f"{source}: not valid JSON ({reason})") from None


@dataclass(frozen=True)
class KernelConfig:
    arch: str = "sm_90a"
    dtype: str = "bf16"
    out_dtype: str = "bf16"
    a_major: str = "K"
    b_major: str = "N"
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64  # elements; 128 bytes of K for 16-bit inputs
    num_stages: int = 4
    num_consumers: int = 2  # math warpgroups (sm90) / MMA consumers (sm100)
    cluster_size: int = 1  # 1 or 2 CTAs per cluster
    multicast: str = "none"  # "none", "A" (peers share the A tile) or "B"
    group_size: int = 8  # L2 raster group, in tiles along the grouped side
    raster: str = "m"  # "m": groups of block-rows, "n": groups of block-columns
    has_c: bool = False  # epilogue reads C and computes alpha*acc + beta*C
    swap_ab: bool = False  # compute D^T = B^T A^T, the user's M on the MMA's N side; the
    # tiling fields are then in kernel coordinates (jitgemm.geometry)
    split_k: int = 1  # >1: up to this many CTAs share a tile's K range (fp32 fix-up)
    a_rows: int = 0  # >0: rows of A loaded per tile (< block_m for M < block_m decode
    # shapes, so TMA does not fill rows past M); 0 = block_m
    b_tail: bool = False  # N-major B whose block_n is not a multiple of the 128-byte piece:
    # load the last columns as a narrower piece (no padding columns)
    out_direct: bool = False  # the epilogue stores D (and reads C) with st.global / ld.global
    # through a pointer and a row stride: for outputs whose rows TMA cannot address (plan.choose)
    stream_k: bool = False  # sm_90a: the K blocks of the last one to two waves' worth of tiles,
    # end to end, cut into one equal range per CTA (cluster), a tile cut between CTAs summed by
    # the fp32 fix-up (geometry.stream_k_segments); forced configs only, select never picks it

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ValueError("invalid KernelConfig: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Structural checks that hold for every arch; arch rules add their own."""
        # Exact types first (1.0 or True is no block size, a list no flag): the checks below
        # compare and multiply the fields.
        if tuple(map(type, vars(self).values())) != _EXACT_TYPES:  # (the common case at one comparison)
            out = [
                f"{name} must be {want.__name__}, got {type(value).__name__} {value!r}"
                for name, want in _FIELD_TYPES.items()
                if not _exact(value := getattr(self, name), want)
            ]
            if out:
                return out
        out = []
        if self.arch not in ARCHS:
            out.append(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.dtype not in INPUT_DTYPES:
            out.append(f"dtype must be one of {INPUT_DTYPES}, got {self.dtype!r}")
        if self.out_dtype not in OUTPUT_DTYPES:
            out.append(f"out_dtype must be one of {OUTPUT_DTYPES}, got {self.out_dtype!r}")
        if self.a_major not in A_MAJORS:
            out.append(f"a_major must be one of {A_MAJORS}, got {self.a_major!r}")
        if self.b_major not in B_MAJORS:
            out.append(f"b_major must be one of {B_MAJORS}, got {self.b_major!r}")
        if self.block_k * DTYPE_BYTES.get(self.dtype, 2) != K_BLOCK_BYTES:
            out.append(
                f"block_k must be {K_BLOCK_BYTES} bytes of K "
                f"({K_BLOCK_BYTES // DTYPE_BYTES.get(self.dtype, 2)} elements), got {self.block_k}"
            )
        if self.block_m not in (64, 128, 256):
            out.append(f"block_m must be 64, 128 or 256, got {self.block_m}")
        if not (16 <= self.block_n <= 512 and self.block_n % 8 == 0):
            out.append(f"block_n must be a multiple of 8 in [16, 512], got {self.block_n}")
        if self.num_consumers not in (1, 2):
            out.append(f"num_consumers must be 1 or 2, got {self.num_consumers}")
        if self.num_stages < 2 or self.num_stages > 16:
            out.append(f"num_stages must be in [2, 16], got {self.num_stages}")
        if self.cluster_size not in (1, 2):
            out.append(f"cluster_size must be 1 or 2, got {self.cluster_size}")
        if self.multicast not in ("none", "A", "B"):
            out.append(f"multicast must be 'none', 'A' or 'B', got {self.multicast!r}")
        if self.cluster_size == 1 and self.multicast != "none":
            out.append("multicast needs cluster_size 2")
        if not 1 <= self.group_size <= 4096:
            out.append(f"group_size must be in [1, 4096], got {self.group_size}")
        if not 1 <= self.split_k <= 32:
            out.append(f"split_k must be in [1, 32], got {self.split_k}")
        if self.a_rows and not (self.a_rows % 8 == 0 and 8 <= self.a_rows < self.block_m):
            out.append(f"a_rows must be 0 or a multiple of 8 below block_m={self.block_m}, got {self.a_rows}")
        if self.stream_k and self.split_k > 1:
            out.append(f"stream_k cuts K itself: split_k must be 1, got {self.split_k}")
        if self.raster not in ("m", "n"):
            out.append(f"raster must be 'm' or 'n', got {self.raster!r}")
        return out

    def derived(self, **changes) -> KernelConfig:
        """This config with `changes`, not validated again: for the configs the heuristics
        derive from a validated one with values of their own tables (tile sizes, stage counts
        the rules solved for, a B tail), hundreds of them in a first selection. Whatever they
        choose is completed through the validating constructor; anything a user supplies must
        go through it too (`KernelConfig(...)`, `dataclasses.replace`)."""
        if not changes.keys() <= _FIELD_TYPES.keys():
            raise TypeError(f"unknown KernelConfig fields {sorted(changes.keys() - _FIELD_TYPES.keys())}")
        out = object.__new__(KernelConfig)
        out.__dict__.update(vars(self))  # (the field order stays: `problems` compares it)
        out.__dict__.update(changes)
        return out

    # --- serialisation: used by the cache meta file, the CLI and the override variable ---
    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> KernelConfig:
        if not isinstance(data, dict):
            raise ValueError(f"KernelConfig fields must be a mapping (a JSON object), got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(map(str, set(data) - known))
        if unknown:
            raise ValueError(f"unknown KernelConfig fields {unknown}; known: {sorted(known)}")
        return cls(**data)

    @property
    def name(self) -> str:
        """A short, unique, human-readable kernel name (also the CUDA symbol suffix)."""
        return (
            f"{self.arch}_{self.dtype}_{self.out_dtype}_{self.a_major}{self.b_major}"
            f"_m{self.block_m}n{self.block_n}k{self.block_k}_s{self.num_stages}"
            f"_c{self.num_consumers}_cl{self.cluster_size}{self.multicast}"
            f"_g{self.group_size}{self.raster}{'_C' if self.has_c else ''}{'_swap' if self.swap_ab else ''}"
            f"{f'_sk{self.split_k}' if self.split_k > 1 else ''}{f'_ar{self.a_rows}' if self.a_rows else ''}"
            f"{'_bt' if self.b_tail else ''}{'_od' if self.out_direct else ''}{'_stk' if self.stream_k else ''}"
        )


_FIELD_TYPES = {f.name: type(f.default) for f in fields(KernelConfig)}
_FIELD_NAMES = tuple(_FIELD_TYPES)
_EXACT_TYPES = tuple(_FIELD_TYPES.values())
