"""CPU tests of the operand staging (jitgemm/staging.py): how each layout is staged, and the
kernel as NVRTC compiles it (its one parameter is the launch's packed A and B copies; no
spills) for both archs."""

import ctypes
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from jitgemm import compiler, geometry, staging
from jitgemm.arrays import TMA_ALIGN, View
from jitgemm.render import TEMPLATES
from jitgemm.sass import find_tool, inspect_cubin

needs_cuobjdump = pytest.mark.skipif(find_tool("cuobjdump") is None, reason="needs cuobjdump (nvidia wheels)")


def view(shape, strides, ptr=1 << 20):
    return View(None, None, ptr, shape, strides, "bf16", 2, 0)


@pytest.mark.parametrize(
    "shape, strides, major, expected",
    [
        # row-major, K = 1001 odd: rows of 1001 elements into rows of whole lines, 1024
        ((300, 1001), (1001, 1), 1, (1, 300, 1001, 1001, 1, 1024)),
        # a transposed view read M-major: 1001 rows of M = 257 elements, padded to 264
        ((257, 1001), (1, 257), 0, (0, 1001, 257, 257, 1, 264)),
        # no unit stride: gathered element by element, rows of the kernel's major
        ((64, 40), (80, 2), 1, (1, 64, 40, 80, 2, 40)),
        # a single row: its stride is never used
        ((1, 9), (9, 1), 1, (1, 1, 9, 9, 1, 16)),
    ],
)
def test_each_layout_is_staged_along_the_major_the_kernel_reads(shape, strides, major, expected):
    op = staging.staged_operand(view(shape, strides), major)
    assert (op.major, op.outer, op.inner, op.src_outer, op.src_inner, op.pitch) == expected
    assert op.pitch * 2 % 16 == 0 and op.nbytes == op.outer * op.pitch * 2
    staged = op.kernel_view(view(shape, strides))
    # what TMA needs of the staged rows (their padding is written as zeros)
    assert staged.ptr % 16 == 0 and staged.shape == shape and staged.leading_stride_bytes(major) % 16 == 0


def test_what_the_kernel_cannot_stage_is_left_to_the_library():
    assert staging.staged_operand(view((64, 40), (40, 1), ptr=(1 << 20) + 1), 1) is None  # not element-aligned
    assert staging.staged_operand(View(None, None, 1 << 20, (64, 40), None, "bf16", 2, 0), 1) is None  # N-D, unfolded


def _kernel_params(cubin: bytes) -> list:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stage.cubin"
        path.write_bytes(cubin)
        elf = subprocess.run([find_tool("cuobjdump"), "-elf", str(path)], capture_output=True, text=True, check=True)
    fields = r"Index : 0x[0-9a-f]+\s+Ordinal : (0x[0-9a-f]+)\s+Offset\s+: (0x[0-9a-f]+)\s+Size\s+: (0x[0-9a-f]+)"
    found = re.findall(r"EIATTR_KPARAM_INFO\s+Format:\s+\S+\s+Value:\s+" + fields, elf.stdout)
    return sorted((int(o, 16), int(off, 16), int(size, 16)) for o, off, size in found)


@needs_cuobjdump
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_the_kernel_takes_the_packed_copies_and_does_not_spill(arch):
    source = staging.KERNEL.source()
    cubin = compiler.compile_cubin(source, arch, name="stage.cu").cubin
    copies = (staging._StageCopy * 2)()
    assert _kernel_params(cubin) == [(0, 0, ctypes.sizeof(copies))]
    report = inspect_cubin(cubin)
    assert not report.spills
    # 16-byte stores of the staged units, 16-byte loads of the aligned source units
    assert "STG.E.128" in report.sass and "LDG.E.128" in report.sass


def test_the_host_sizes_the_grid_with_the_kernels_constants():
    """The grid (`operand_blocks`) assumes the kernel's block size and units per thread and step."""
    source = (TEMPLATES / "common/stage_operands.cuh").read_text()
    assert f"constexpr unsigned ITEMS = {staging.ITEMS};" in source
    assert f"__launch_bounds__({staging.THREADS})" in source


@pytest.mark.parametrize(
    "row_bytes, pitch",
    [(2002, 2048), (514, 528), (140, 144), (38286, 38400), (1016, 1024), (900, 912), (8192, 8192), (18, 32)],
)
def test_staged_rows_are_whole_lines_where_that_pads_them_by_an_eighth_at_most(row_bytes, pitch):
    assert geometry.staged_pitch(row_bytes) == pitch
    assert pitch % TMA_ALIGN == 0 and row_bytes <= pitch <= row_bytes * 9 // 8 + 15
    # whole lines, or no more lines than whole units
    assert pitch % 128 == 0 or -(-row_bytes // 128) * 128 - row_bytes > row_bytes / 8


def test_the_row_unit_is_tmas():
    assert geometry.ROW_UNIT_BYTES == TMA_ALIGN


def test_the_launch_packs_one_parameter_with_each_operands_grid():
    from jitgemm import runtime

    kernel = runtime.LoadedKernel(None, None, staging.KERNEL_NAME, 0, staging.THREADS, 1, True)
    a = staging.staged_operand(view((1, 19143), (19143, 1)), 1)  # one wide row
    b = staging.staged_operand(view((19143, 70), (70, 1)), 1)  # tall and narrow
    launch = staging.StageLaunch(kernel, (a, b), 7)
    assert len(launch.params) == 1 and launch.params[0] == ctypes.addressof(launch.copies)
    packed = [(c.outer, c.inner, c.src_outer, c.src_inner, c.pitch_units) for c in launch.copies]
    assert packed == [(1, 19143, 19143, 1, 2400), (19143, 70, 70, 1, 9)]
    assert [(c.units, c.blocks) for c in launch.copies] == [(2400, 10), (19143 * 9, 264)]
    cfg = launch.config
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX) == (274, 1, 1, staging.THREADS)
    assert staging.StageLaunch(kernel, (a, None), 7).copies[1].blocks == 0  # no blocks for B


def _emulated(units: int) -> list:
    """The units each thread of the kernel writes, by its index arithmetic."""
    blocks, threads, items = staging.operand_blocks(units), staging.THREADS, staging.ITEMS
    stride = blocks * threads
    written = []
    for block in range(blocks):
        for t in range(threads):
            first = block * threads + t
            while first < units:
                written += [at for at in range(first, first + items * stride, stride) if at < units]
                first += items * stride
    return written


@pytest.mark.parametrize("units", [1, 9, 1023, 1025, 2393, 300 * 126, 4096 * 513, 19143 * 9, 264 * 256 + 1])
def test_every_unit_is_written_once(units):
    written = _emulated(units)
    assert len(written) == units and set(written) == set(range(units))
    assert staging.operand_blocks(units) <= staging.BLOCKS_PER_OPERAND


def test_operands_of_2_to_the_31_units_are_not_staged():
    """The kernel counts units in 32 bits: larger operands are copied by their library."""
    assert staging.staged_operand(view((2**17, 2**17 + 1), (2**17 + 1, 1)), 1) is None
    # rows padded to whole lines: 2**17 - 9 elements take 2**14 units a row, 2**17 - 72 one line less
    assert staging.staged_operand(view((2**17, 2**17 - 9), (2**17 - 9, 1)), 1) is None
    assert staging.staged_operand(view((2**17, 2**17 - 72), (2**17 - 72, 1)), 1) is not None
