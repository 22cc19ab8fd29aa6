"""Operands TMA cannot read in place, staged: one small kernel per call copies A and B (either or
both) into rows of whole 16-byte units (whole 128-byte lines where that pads a row by at most
an eighth: geometry.staged_pitch) in the launch's workspace (reused across calls on a
stream, and owned by the graph in a capture; see launch.py), and the GEMM's tensor maps point
there. No allocation and no descriptor encoding per call: a call seen before patches the
operands' addresses into the staging launch as it does into the GEMM's maps.

Operands that the kernel cannot stage (an N-D array whose rows do not fold into one stride, a
base address that is not element-aligned) are copied by their library as before.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from typing import NamedTuple

from . import runtime
from .arrays import TMA_ALIGN, View
from .fixed_kernels import FixedKernel
from .geometry import staged_pitch

KERNEL_NAME = "jitgemm_stage_operands"
THREADS = 256  # the kernel's __launch_bounds__
ITEMSIZE = 2  # the kernel copies 16-bit elements
UNIT_ELEMENTS = TMA_ALIGN // ITEMSIZE
ITEMS = 4  # units a thread copies per step (the kernel's ITEMS)
# An operand's blocks: enough for ITEMS units a thread, but at least two per SM of an H200 where
# it has the units (small operands: every SM streams, a unit a thread), at most about two waves
# (larger operands loop).
MIN_BLOCKS, BLOCKS_PER_OPERAND = 264, 1024
MAX_UNITS = 1 << 31  # the kernel counts an operand's staged units in 32 bits
# Where a staged operand's tensor map points until a launch gives it its workspace region.
PLACEHOLDER_ADDRESS = 1 << 40


class StagedOperand(NamedTuple):
    """How one operand is staged: `outer` rows of `inner` elements with dimension `major` of the
    view innermost, element (o, i) at o * src_outer + i * src_inner of the caller's array,
    into rows of `pitch` elements (`geometry.staged_pitch`)."""

    major: int  # the view's dimension that is innermost in the staged rows
    outer: int
    inner: int
    src_outer: int
    src_inner: int
    pitch: int

    @property
    def nbytes(self) -> int:
        return self.outer * self.pitch * ITEMSIZE

    def kernel_view(self, view: View) -> View:
        """The staged rows as the GEMM reads them: `view`'s shape, rows of `pitch`, at
        PLACEHOLDER_ADDRESS (its launch points its maps at the workspace)."""
        strides = (self.pitch, 1) if self.major == 1 else (1, self.pitch)
        return replace(view, array=None, ptr=PLACEHOLDER_ADDRESS, strides=strides, nd=None, keepalive=None)


def staged_operand(view: View, major: int) -> StagedOperand | None:
    """How `view` is staged with dimension `major` innermost, or None when the kernel cannot
    stage it (rows that do not fold into one stride, a base that is not element-aligned, 32 GiB
    or more of staged rows)."""
    if view.strides is None or view.itemsize != ITEMSIZE or view.ptr % ITEMSIZE:
        return None
    inner, outer = view.shape[major], view.shape[1 - major]
    pitch = staged_pitch(inner * ITEMSIZE) // ITEMSIZE
    if outer * pitch // UNIT_ELEMENTS >= MAX_UNITS:
        return None
    return StagedOperand(major, outer, inner, view.strides[1 - major], view.strides[major], pitch)


class _StageCopy(ctypes.Structure):
    """The kernel's StageCopy (its parameter is a StageCopies: one for A, one for B)."""

    _fields_ = [
        ("src", ctypes.c_uint64),
        ("dst", ctypes.c_uint64),
        ("outer", ctypes.c_longlong),
        ("inner", ctypes.c_longlong),
        ("src_outer", ctypes.c_longlong),
        ("src_inner", ctypes.c_longlong),
        ("pitch_units", ctypes.c_longlong),
        ("units", ctypes.c_longlong),
        ("blocks", ctypes.c_longlong),
    ]


class StageLaunch:
    """The staging launch of one GEMM launch, parameters packed once: `launch(src_a, dst_a,
    src_b, dst_b)` fills in the addresses (0 for an operand that is not staged) and queues it on
    the GEMM's stream, before the GEMM. The caller holds the workspace's lock."""

    __slots__ = ("kernel", "copies", "params", "address", "config")

    def __init__(self, kernel: runtime.LoadedKernel, staged: tuple, stream: int):
        self.kernel = kernel
        self.copies = (_StageCopy * 2)()
        for copy, op in zip(self.copies, staged):
            if op is not None:
                copy.outer, copy.inner, copy.src_outer, copy.src_inner = op.outer, op.inner, op.src_outer, op.src_inner
                copy.pitch_units = op.pitch // UNIT_ELEMENTS
                copy.units = op.outer * copy.pitch_units
                copy.blocks = operand_blocks(copy.units)
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(self.copies))
        self.address = ctypes.addressof(self.params)
        self.config = runtime.launch_config(kernel, sum(copy.blocks for copy in self.copies), stream)

    def launch(self, src_a: int, dst_a: int, src_b: int, dst_b: int) -> None:
        a, b = self.copies
        a.src, a.dst, b.src, b.dst = src_a, dst_a, src_b, dst_b
        err = runtime.driver.cuLaunchKernelEx(self.config, self.kernel.function, self.address, 0)[0]
        if err != runtime.driver.CUresult.CUDA_SUCCESS:
            runtime.check((err,), f"cuLaunchKernelEx({KERNEL_NAME})")


def operand_blocks(units: int) -> int:
    """One operand's blocks of the grid: THREADS x ITEMS units each per step, or more blocks
    (fewer units a thread) up to MIN_BLOCKS, at most BLOCKS_PER_OPERAND (then each thread steps
    over the rest, a grid stride apart)."""
    full = -(-units // (THREADS * ITEMS))
    return min(max(full, min(-(-units // THREADS), MIN_BLOCKS)), BLOCKS_PER_OPERAND)


KERNEL = FixedKernel(KERNEL_NAME, ("realign.cuh", "stage_operands.cuh"), THREADS, "the operand staging kernel")
