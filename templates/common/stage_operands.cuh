// Stages the operands TMA cannot read in place (rows that are not whole 16-byte units, a
// misaligned base, no unit stride) into rows it can: one launch for A and B together, into the
// launch's workspace, before the GEMM. A complete translation unit (no headers: NVRTC from pip
// has no include path); 16-bit elements.
//
// Each operand is `outer` rows of `inner` elements, element (o, i) at src[o * src_outer +
// i * src_inner]; it lands in rows of `pitch_units` 16-byte units, the units past `inner` zero
// (TMA may read a ragged row's last unit whole). The grid is A's `blocks`, then B's: each
// operand's own grid of `across` blocks per row group, so a tall, narrow B is not walked row by
// row in the grid a wide A needs. A thread writes one unit per step; a row's units go to
// min(pitch_units, threads) consecutive threads, and a block takes as many rows at once as that
// leaves room for.

struct StageCopy {
    const unsigned short* src;
    uint4* dst;
    long long outer, inner, src_outer, src_inner, pitch_units;
    long long blocks, across;  // this operand's blocks (0: not staged), and blocks per row group
};

struct StageCopies {
    StageCopy operand[2];  // A, B
};

// The 16 bytes at `shift` (even, < 16) bytes into the 32 of lo:hi.
__device__ __forceinline__ uint4 shifted(const uint4 lo, const uint4 hi, const int shift) {
    const unsigned w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    unsigned out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        // constant indices in every branch: selects, not local memory
        unsigned first, second;
        switch (shift >> 2) {
            case 0: first = w[i], second = w[i + 1]; break;
            case 1: first = w[i + 1], second = w[i + 2]; break;
            case 2: first = w[i + 2], second = w[i + 3]; break;
            default: first = w[i + 3], second = w[i + 4]; break;
        }
        out[i] = shift & 2 ? __byte_perm(first, second, 0x5432) : first;
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

extern "C" __global__ void __launch_bounds__(256) jitgemm_stage_operands(const __grid_constant__ StageCopies copies) {
    // Programmatic dependent launch: the previous kernel of the stream may still be writing
    // the operands (or, the last call's GEMM, reading the workspace).
    asm volatile("griddepcontrol.wait;" ::: "memory");
    // The GEMM may launch now: its prologue (barriers, descriptor prefetch) overlaps this copy,
    // and it waits for this whole grid to finish before it reads a staged row.
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const bool of_b = blockIdx.x >= copies.operand[0].blocks;
    const StageCopy& op = copies.operand[of_b];
    const long long block = blockIdx.x - (of_b ? copies.operand[0].blocks : 0);
    const long long lanes = op.pitch_units < blockDim.x ? op.pitch_units : blockDim.x;  // threads per row
    const long long rows_at_once = blockDim.x / lanes;
    if (threadIdx.x >= rows_at_once * lanes) return;
    const long long first_row = block / op.across * rows_at_once + threadIdx.x / lanes;
    const long long row_step = op.blocks / op.across * rows_at_once;
    const long long first_unit = block % op.across * lanes + threadIdx.x % lanes;
    const long long unit_step = op.across * lanes;
    // Rows of unit stride are read 16 aligned bytes at a time: the two 16-byte units around a
    // staged unit, where both lie between the operand's first and last element (inside the
    // caller's allocation; the second is read even where the first holds all 16 bytes).
    const bool rows_contiguous = op.src_inner == 1;
    const unsigned long long first_byte = (unsigned long long)op.src;
    const unsigned long long end_byte =
        first_byte + 2ull * ((op.outer - 1) * op.src_outer + (op.inner - 1) * op.src_inner + 1);
    for (long long row = first_row; row < op.outer; row += row_step) {
        const unsigned short* src_row = op.src + row * op.src_outer;
        uint4* dst_row = op.dst + row * op.pitch_units;
        for (long long unit = first_unit; unit < op.pitch_units; unit += unit_step) {
            const long long first = unit * 8;
            const unsigned long long at = (unsigned long long)(src_row + first);
            const unsigned long long lo = at & ~15ull;
            const int shift = (int)(at - lo);
            if (rows_contiguous && first + 8 <= op.inner && lo >= first_byte && lo + 32 <= end_byte) {
                const uint4* chunk = (const uint4*)lo;
                dst_row[unit] = shifted(__ldg(chunk), __ldg(chunk + 1), shift);
            } else {
                unsigned int half[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const long long col = first + e;
                    half[e] = col < op.inner ? src_row[col * op.src_inner] : 0u;
                }
                dst_row[unit] = make_uint4(half[0] | half[1] << 16, half[2] | half[3] << 16,
                                           half[4] | half[5] << 16, half[6] | half[7] << 16);
            }
        }
    }
}
