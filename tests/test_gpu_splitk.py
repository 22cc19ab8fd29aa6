"""Split-K on the GPU (issue 16): the reducer needs no co-residency, its counters are left at zero,
its sums do not depend on which split reduces, threads and streams never share a workspace
unsafely; and the elementwise check itself catches a corrupted block."""

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from gpu_helpers import assert_close, guarded_out, random_operand, worst_error

import jitgemm
from jitgemm import launch, runtime
from jitgemm.config import KernelConfig

pytestmark = pytest.mark.gpu

SPLIT_CONFIGS = [
    KernelConfig(block_m=64, num_consumers=1, block_n=64, num_stages=8, split_k=4),
    KernelConfig(block_n=128, num_stages=5, split_k=3),
    KernelConfig(block_n=128, num_stages=4, cluster_size=2, multicast="B", split_k=2),
    KernelConfig(block_m=64, num_consumers=1, block_n=128, num_stages=8, split_k=6),
]


@pytest.fixture(scope="module")
def gen():
    import torch

    return torch.Generator(device="cuda").manual_seed(1616)


def test_the_check_catches_a_corrupted_block(gen):
    """A normwise bound lets a zeroed 32x32 block of a large result pass; this check may not."""
    import torch

    m, n, k = 2048, 2048, 1024
    a, b = random_operand(m, k, "bf16", "row", gen), random_operand(k, n, "bf16", "row", gen)
    out = jitgemm.gemm(a, b)
    assert_close(out, a, b, "bf16")
    zeroed = out.clone()
    zeroed[1000:1032, 512:544] = 0
    assert worst_error(zeroed, a, b, "bf16") > 1
    missing_k_block = out.clone()  # one block of the result without the first 64 terms of K
    missing_k_block[64:96, 64:96] -= (a[64:96, :64].float() @ b[:64, 64:96].float()).to(torch.bfloat16)
    assert worst_error(missing_k_block, a, b, "bf16") > 1
    one_nan = out.clone()
    one_nan[7, 9] = float("nan")
    assert worst_error(one_nan, a, b, "bf16") == float("inf")


def _counters(stream: int) -> list:
    """The tile counters of `stream`'s split-K workspace, read back."""
    import numpy as np
    from cuda.bindings import driver

    ws = launch._workspace(0, stream)
    counters = launch.REGIONS.index("counters")
    nbytes, start = ws.sizes[counters], launch._region_pointers(ws.ptr, ws.sizes)[counters]
    host = np.empty(nbytes // 4, np.int32)
    runtime.check(driver.cuStreamSynchronize(driver.CUstream(stream)), "cuStreamSynchronize")
    runtime.check(driver.cuMemcpyDtoH(host.ctypes.data, start, nbytes), "cuMemcpyDtoH")
    return host


def test_counters_are_left_at_zero_and_sums_do_not_depend_on_the_reducer(gen):
    """Configs alternate on one stream, over shapes where each CTA runs several work units; the
    counters read back as zero after every call, and repeated calls give identical bits
    whichever split happened to finish last."""
    import torch

    stream = torch.cuda.current_stream().cuda_stream
    shapes = [(64, 1000, 4096), (700, 3000, 3 * 64 * 8 + 5), (1000, 2000, 2048)]
    for _ in range(2):
        for cfg in SPLIT_CONFIGS:
            for m, n, k in shapes:
                a, b = random_operand(m, k, "bf16", "row", gen), random_operand(k, n, "bf16", "row", gen)
                buf, out = guarded_out(m, n, "bf16")
                jitgemm.gemm(a, b, out=out, config=cfg)
                assert not _counters(stream).any(), f"{cfg.name} {m}x{n}x{k}: counters left non-zero"
                assert_close(out, a, b, "bf16")
                first = out.clone()
                for _ in range(3):
                    jitgemm.gemm(a, b, out=out, config=cfg)
                    assert torch.equal(out, first), f"{cfg.name} {m}x{n}x{k}: the sum changed between runs"


def test_threads_on_the_per_thread_default_stream_and_many_streams(gen):
    """Each thread's per-thread default stream (one handle, 2, in every thread) and streams of
    its own: work units of different sizes, every result checked."""
    import torch

    inputs = []
    for i in range(8):
        m, n, k = (64 + 96 * i, 1000 + 256 * i, 2048 + 512 * (i % 3))
        inputs.append((random_operand(m, k, "bf16", "row", gen), random_operand(k, n, "bf16", "row", gen)))
    torch.cuda.synchronize()
    errors = []

    def work(i):
        try:
            own = torch.cuda.Stream()
            for rep in range(6):
                a, b = inputs[(i + rep) % len(inputs)]
                cfg = SPLIT_CONFIGS[(i + rep) % len(SPLIT_CONFIGS)]
                stream = 2 if rep % 2 == 0 else own.cuda_stream
                out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=torch.bfloat16)
                torch.cuda.synchronize()
                jitgemm.gemm(a, b, out=out, config=cfg, stream=stream)
                torch.cuda.synchronize()
                assert_close(out, a, b, "bf16")
        except BaseException as exc:  # reported below
            errors.append((i, exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


# Runs in its own process: a kernel holds all SMs but one; two split-K GEMMs (three splits a
# tile, a work unit per CTA) are queued on streams of low and high priority. A reducer that waits
# for splits not yet started would spin on the one free SM forever; the blocker is released only
# once both finished, or after a deadline, so a deadlock fails the test instead of the GPU.
CO_RESIDENCY = textwrap.dedent('''
    import sys, time
    import cupy as cp, numpy as np, torch
    sys.path.insert(0, "tests")
    import jitgemm
    from gpu_helpers import assert_close, random_operand
    from jitgemm.config import KernelConfig
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = KernelConfig(block_m=64, num_consumers=1, block_n=128, num_stages=8, split_k=3)
    m, n, k = 4 * 64, 128 * (sms // 12), 12 * 64       # 3 x (sms // 12) x 4 <= sms work units
    gen = torch.Generator(device="cuda").manual_seed(7)
    ops = [(random_operand(m, k, "bf16", "row", gen), random_operand(k, n, "bf16", "row", gen)) for _ in range(2)]
    streams = [torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1)]
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in ops]
    for stream, (a, b), out in zip(streams, ops, outs):  # load the kernel, make the workspaces
        with torch.cuda.stream(stream):
            jitgemm.gemm(a, b, out=out, config=cfg)
    hold = cp.RawKernel(r"""
    extern "C" __global__ void hold(volatile int* release) {
        extern __shared__ int pad[];
        pad[threadIdx.x] = 0;
        while (release[0] == 0) __nanosleep(2000);
    }""", "hold")
    smem = 200 * 1024                                   # one per SM, and no GEMM CTA beside it
    hold.max_dynamic_shared_size_bytes = smem
    release = cp.zeros(1, cp.int32)
    held = cp.cuda.Stream(non_blocking=True)
    for out in outs:
        out.fill_(float("nan"))
    torch.cuda.synchronize()
    hold((sms - 1,), (32,), (release,), shared_mem=smem, stream=held)
    time.sleep(0.5)
    for stream, (a, b), out in zip(streams, ops, outs):
        with torch.cuda.stream(stream):
            jitgemm.gemm(a, b, out=out, config=cfg)
    deadline = time.monotonic() + 30
    while not all(s.query() for s in streams) and time.monotonic() < deadline:
        time.sleep(0.01)
    finished = all(s.query() for s in streams)
    release.set(np.ones(1, np.int32), stream=cp.cuda.Stream(non_blocking=True))
    torch.cuda.synchronize()
    assert finished, "split-K GEMMs did not finish while all SMs but one were held"
    for out, (a, b) in zip(outs, ops):
        assert_close(out, a, b, "bf16")
    print("co-residency: both finished on one SM")
''')


def test_split_k_needs_no_co_residency():
    pytest.importorskip("cupy")
    result = subprocess.run(
        [sys.executable, "-c", CO_RESIDENCY],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=Path(__file__).parent.parent,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "both finished" in result.stdout
