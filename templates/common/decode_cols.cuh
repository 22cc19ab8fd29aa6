// Decode against a K-major weight TMA cannot read: out = alpha * a @ b (+ beta * c) for a of
// M <= 16 rows and a b (K, N) whose columns have unit stride (b = W.t(), W (N, K) as nn.Linear
// holds it) but are not whole 16-byte units (K not a multiple of 8, a misaligned view), read in
// place: no staging pass over b. A translation unit once realign.cuh and decode_common.cuh are
// prepended (no headers: NVRTC from pip has no include path); 16-bit inputs.
//
// A block takes a strip of STRIP columns of b (four blocks of 16) and a group's range of K
// (WARPS splits' rows); its warps take the range's windows of 32 in turn, so together they read
// 512 contiguous bytes of each column per step (a contiguous range per warp, each column read 64
// bytes at a time in 8 places, took up to 1.35x the time: BENCHMARKS.md, session 27). Lane (g, t)
// = (lane / 4, lane % 4) loads elements [8t, 8t + 8) of the window of columns g and g + 8 of each
// block, as the two aligned 16-byte units around them realigned by the column's byte offset
// (`shifted`). Those are the A fragments of two m16n8k16 tensor-core products (the window's k16
// halves; the sum over k does not care which k a slot holds, so slots 2t, 2t + 1, 2t + 8, 2t + 9
// of half s hold k = 8t + 4s + 0..3), and the same k of a's rows g and g + 8 are their B
// fragments: D[column, row of a] in fp32. The block's warps' sums are added in shared memory,
// and the group's written to the workspace; the last group of a strip to finish (a counter per
// strip, reset by it) adds the groups and writes the strip's outputs. Sums are added in warp and
// group order, so results do not depend on timing.

constexpr int STRIP = 64;  // columns of b per warp: BLOCKS blocks of 16 (an m16 product each)
constexpr int BLOCKS = STRIP / 16;
constexpr int WINDOW = 32;  // K per step: 8 per lane of a quad
constexpr int MAX_M = 16;   // rows of a: two n8 products

// d += A (16 x 16, row-major: columns of b by k) * B (16 x 8: k by rows of a), fp32 sums.
template <bool FP16>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const u32 a0, const u32 a1, const u32 a2, const u32 a3,
                                            const u32 b0, const u32 b1) {
    if (FP16)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Elements [k, k + 8) of column `col` of b: the aligned units around them (`lo`, `hi`) and the
// byte offset, loaded where the 8 lie inside K and the units inside b's bytes [first_byte,
// end_byte) (inside the caller's allocation); else `whole` is false and the caller gathers
// them element by element.
struct ColumnUnit {
    uint4 lo, hi;
    u32 shift;
    bool whole;
};

__device__ __forceinline__ ColumnUnit load_column(const DecodeArgs& p, const int col, const int k, const int k_end,
                                                  const u64 first_byte, const u64 end_byte) {
    ColumnUnit u;
    const u64 at = (u64)(p.b + (long long)col * p.b_row + k);
    const u64 unit = at & ~15ull;
    u.shift = (u32)(at & 15ull);
    // (a unit starting the 8 needs no second: `shifted` by 0 takes lo whole)
    u.whole = col < p.n && k + 8 <= k_end && unit >= first_byte && unit + (u.shift ? 32 : 16) <= end_byte;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    u.lo = u.whole ? __ldg((const uint4*)unit) : zero;
    u.hi = u.whole && u.shift ? __ldg((const uint4*)(unit + 16)) : zero;
    return u;
}

// The 8 elements as 4 words (element 2i in the low half of word i), zero past K and N.
__device__ __forceinline__ uint4 column_words(const DecodeArgs& p, const ColumnUnit& u, const int col, const int k,
                                              const int k_end) {
    if (u.whole) return shifted(u.lo, u.hi, u.shift);
    u32 e[8];
    const u16* src = p.b + (long long)col * p.b_row + k;
#pragma unroll
    for (int j = 0; j < 8; ++j) e[j] = col < p.n && k + j < k_end ? src[j] : 0u;
    return make_uint4(e[0] | e[1] << 16, e[2] | e[3] << 16, e[4] | e[5] << 16, e[6] | e[7] << 16);
}

// Elements [k, k + 8) of row `row` of a as 4 words, zero past K and M.
__device__ __forceinline__ uint4 a_words(const DecodeArgs& p, const int row, const int k, const int k_end) {
    u32 e[8];
    const u16* src = p.a + (long long)row * p.a_row;
#pragma unroll
    for (int j = 0; j < 8; ++j) e[j] = row < p.m && k + j < k_end ? src[(long long)(k + j) * p.a_col] : 0u;
    return make_uint4(e[0] | e[1] << 16, e[2] | e[3] << 16, e[4] | e[5] << 16, e[6] | e[7] << 16);
}

// One warp's windows of one strip's group: every WARPS-th window of 32 of the group's K range
// (WARPS splits' rows), from the warp's own. acc[j][h] holds D of block j and rows [8h, 8h + 8)
// of a: lane (g, t) has columns 16j + g (acc[..][0..1]) and 16j + g + 8 (acc[..][2..3]) of rows
// 8h + 2t and 8h + 2t + 1 (zero for a warp with no window inside K).
template <bool FP16, int H>
__device__ __forceinline__ void warp_sums(const DecodeArgs& p, const int strip, const int group, const int warp,
                                          const int lane, float (&acc)[BLOCKS][H][4]) {
    const int g = lane / 4, t = lane % 4;
    const int k0 = group * WARPS * p.rows_per_split, k1 = min(p.k, k0 + WARPS * p.rows_per_split);
    const int col0 = strip * STRIP + g;
    const u64 first_byte = (u64)p.b;
    const u64 end_byte = first_byte + 2ull * ((long long)(p.n - 1) * p.b_row + p.k);
#pragma unroll
    for (int j = 0; j < BLOCKS; ++j)
#pragma unroll
        for (int h = 0; h < H; ++h)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[j][h][r] = 0.f;
    // Loads in flight: every block's for one row group of a; half of them for two (registers).
    constexpr int BATCH = H == 1 ? BLOCKS : BLOCKS / 2;
    for (int kw = k0 + warp * WINDOW; kw < k1; kw += WARPS * WINDOW) {
        const int k = kw + 8 * t;
        uint4 act[H];
#pragma unroll
        for (int h = 0; h < H; ++h) act[h] = a_words(p, 8 * h + g, k, k1);
#pragma unroll
        for (int j0 = 0; j0 < BLOCKS; j0 += BATCH) {
            ColumnUnit units[BATCH][2];  // every load of the batch before any is used
#pragma unroll
            for (int j = 0; j < BATCH; ++j)
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    units[j][i] = load_column(p, col0 + 16 * (j0 + j) + 8 * i, k, k1, first_byte, end_byte);
#pragma unroll
            for (int j = 0; j < BATCH; ++j) {
                const int col = col0 + 16 * (j0 + j);
                const uint4 w0 = column_words(p, units[j][0], col, k, k1);
                const uint4 w8 = column_words(p, units[j][1], col + 8, k, k1);
#pragma unroll
                for (int h = 0; h < H; ++h) {
                    mma_16x8x16<FP16>(acc[j0 + j][h], w0.x, w8.x, w0.y, w8.y, act[h].x, act[h].y);  // k = 8t + 0..3
                    mma_16x8x16<FP16>(acc[j0 + j][h], w0.z, w8.z, w0.w, w8.w, act[h].z, act[h].w);  // k = 8t + 4..7
                }
            }
        }
    }
}

// A block: one group of one strip. Its warps' sums are added in shared memory in
// warp order and written as the group's partial sums (row-major: 8 * H rows of a, STRIP
// columns); the strip's counter then tells the last group to finish, whose block adds the
// groups in order and writes the strip's outputs.
typedef float BlockSums[WARPS][MAX_M * STRIP];

template <bool FP16, int H>
__device__ __forceinline__ void decode_block(const DecodeArgs& p, const int strip, const int group,
                                             BlockSums& block_sums, bool& last_group) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    float acc[BLOCKS][H][4];
    warp_sums<FP16, H>(p, strip, group, warp, lane, acc);
#pragma unroll
    for (int j = 0; j < BLOCKS; ++j)
#pragma unroll
        for (int h = 0; h < H; ++h)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int row = 8 * h + 2 * t + r % 2, col = 16 * j + g + 8 * (r / 2);
                block_sums[warp][row * STRIP + col] = acc[j][h][r];
            }
    __syncthreads();
    constexpr int SUMS = 8 * H * STRIP;  // a group's sums
    float* group_sums = p.partials + ((long long)strip * p.groups + group) * SUMS;
    for (int q = threadIdx.x; q < SUMS; q += THREADS) {
        float sum = block_sums[0][q];
#pragma unroll
        for (int w = 1; w < WARPS; ++w) sum += block_sums[w][q];
        group_sums[q] = sum;
    }
    if (!last_group_of_strip(p, strip, last_group)) return;
    const float* strip_sums = p.partials + (long long)strip * p.groups * SUMS;
    for (int q = threadIdx.x; q < SUMS; q += THREADS) {
        const int row = q / STRIP, col = strip * STRIP + q % STRIP;
        if (row >= p.m) break;  // (the rows past M of a kernel for more)
        if (col >= p.n) continue;
        float sum = 0.f;
#pragma unroll 8
        for (int gr = 0; gr < p.groups; ++gr) sum += __ldcg(strip_sums + (long long)gr * SUMS + q);  // (several in flight)
        store_output<FP16>(p, row, col, sum);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 2) jitgemm_decode_cols(const __grid_constant__ DecodeArgs p) {
    enter_after_previous_grid();
    __shared__ BlockSums block_sums;
    __shared__ bool last_group;
    const int strip = blockIdx.x % p.strips, group = blockIdx.x / p.strips;
    if (p.fp16) {
        if (p.m <= 8)
            decode_block<true, 1>(p, strip, group, block_sums, last_group);
        else
            decode_block<true, 2>(p, strip, group, block_sums, last_group);
    } else {
        if (p.m <= 8)
            decode_block<false, 1>(p, strip, group, block_sums, last_group);
        else
            decode_block<false, 2>(p, strip, group, block_sums, last_group);
    }
}
