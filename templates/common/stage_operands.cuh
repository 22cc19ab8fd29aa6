// Stages the operands TMA cannot read in place (rows that are not whole 16-byte units, a
// misaligned base, no unit stride) into rows it can: one launch for A and B together, into the
// launch's workspace, before the GEMM. A translation unit once realign.cuh is prepended (no
// headers: NVRTC from pip has no include path); 16-bit elements.
//
// Each operand is `outer` rows of `inner` elements, element (o, i) at src[o * src_outer +
// i * src_inner]; it lands in rows of `pitch_units` 16-byte units, the units past `inner` zero
// (TMA may read a ragged row's last unit whole). The staged rows are one run of `units` units,
// walked flat: the grid is A's `blocks`, then B's, and each thread takes ITEMS units a grid
// stride apart per step, all loads before the stores (bytes in flight hide DRAM latency), so
// consecutive threads read and write consecutive units whatever the rows' width.

struct StageCopy {
    const unsigned short* src;
    uint4* dst;
    long long outer, inner, src_outer, src_inner;
    long long pitch_units, units;  // units: outer * pitch_units, below 2^31 (the host checks)
    long long blocks;  // this operand's blocks (0: not staged)
};

constexpr unsigned ITEMS = 4;  // units per thread and step

struct StageCopies {
    StageCopy operand[2];  // A, B
};

// The source of unit `unit` of staged row `row`: where the row has unit stride, the two aligned
// 16-byte units around it (`lo`, `hi`) and its byte offset into them, loaded whole where both
// lie between the operand's first and last element (inside the caller's allocation); else the
// unit gathered element by element (zero past `inner`) into `lo`, offset 0. Only loads: the
// realignment (`shifted`) waits until every unit of a thread's step is in flight.
__device__ __forceinline__ void load_unit(const StageCopy& op, const unsigned row, const unsigned unit,
                                          const unsigned long long first_byte, const unsigned long long end_byte,
                                          uint4& lo, uint4& hi, unsigned& shift) {
    const unsigned short* src_row = op.src + row * op.src_outer;
    const long long first = unit * 8ll;
    const unsigned long long at = (unsigned long long)(src_row + first);
    const unsigned long long aligned = at & ~15ull;
    if (op.src_inner == 1 && first + 8 <= op.inner && aligned >= first_byte && aligned + 32 <= end_byte) {
        const uint4* chunk = (const uint4*)aligned;
        lo = __ldg(chunk);
        hi = __ldg(chunk + 1);
        shift = (unsigned)(at - aligned);
        return;
    }
    unsigned int half[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const long long col = first + e;
        half[e] = col < op.inner ? src_row[col * op.src_inner] : 0u;
    }
    lo = make_uint4(half[0] | half[1] << 16, half[2] | half[3] << 16, half[4] | half[5] << 16, half[6] | half[7] << 16);
    hi = lo;
    shift = 0;
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
    const unsigned block = blockIdx.x - (of_b ? (unsigned)copies.operand[0].blocks : 0u);
    const unsigned units = (unsigned)op.units, pitch = (unsigned)op.pitch_units;
    const unsigned stride = (unsigned)op.blocks * blockDim.x;  // (units + ITEMS * stride < 2^32)
    const unsigned long long first_byte = (unsigned long long)op.src;
    const unsigned long long end_byte =
        first_byte + 2ull * ((op.outer - 1) * op.src_outer + (op.inner - 1) * op.src_inner + 1);
    for (unsigned first = block * blockDim.x + threadIdx.x; first < units; first += ITEMS * stride) {
        uint4 lo[ITEMS], hi[ITEMS];
        unsigned shift[ITEMS];
#pragma unroll
        for (unsigned j = 0; j < ITEMS; ++j) {
            const unsigned at = first + j * stride;
            if (at < units) load_unit(op, at / pitch, at % pitch, first_byte, end_byte, lo[j], hi[j], shift[j]);
        }
#pragma unroll
        for (unsigned j = 0; j < ITEMS; ++j) {
            const unsigned at = first + j * stride;
            if (at < units) op.dst[at] = shifted(lo[j], hi[j], shift[j]);
        }
    }
}
