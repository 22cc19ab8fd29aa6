// Decode against a weight TMA cannot read: out = alpha * a @ b (+ beta * c) for a of M <= 4
// rows and a b (K, N) whose rows have unit stride but are not whole 16-byte units (odd N, a
// misaligned view), read in place: no staging pass over b. A translation unit once realign.cuh
// and decode_common.cuh are prepended (no headers: NVRTC from pip has no include path); 16-bit
// inputs.
//
// Each warp takes a strip of STRIP columns and a range of rows of b (a K split). Per row k,
// lane l loads the l-th aligned 16-byte unit from the one holding the strip's first column;
// lanes 0..30 take the next unit from lane l + 1 and realign the pair by the row's byte offset,
// the same across the warp (`shifted`), into their 8 columns (lane 31 only loads: an extra unit
// of its own would cost every lane its registers). ROWS_IN_FLIGHT rows (6 for 3 or 4 rows of a)
// are loaded before any is used. The products are fp32 FMAs on the CUDA cores (M <= 4 leaves the loads the
// bottleneck). A block's warps are consecutive splits of one strip (a group): their sums are
// added in shared memory, and the group's written to the workspace; the last group of a strip
// to finish (a counter per strip, reset by it) adds the groups and writes the strip's outputs.
// Sums are added in split order, so results do not depend on timing.

constexpr int STRIP = 31 * 8;  // columns per warp: 8 per lane but the last
constexpr int ROWS_IN_FLIGHT = 8;
constexpr int MAX_M = 4;

// The 8 columns of one row as fp32 into acc, times each row of a at that k.
template <bool FP16, int M>
__device__ __forceinline__ void add_row(float (&acc)[M][8], const uint4 cols, const float (&a_k)[M]) {
    const u32 w[4] = {cols.x, cols.y, cols.z, cols.w};
    float v[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = to_float<FP16>(w[i] & 0xffffu);
        v[2 * i + 1] = to_float<FP16>(w[i] >> 16);
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[m][j] = fmaf(a_k[m], v[j], acc[m][j]);
}

// Lane `lane`'s unit of row `row` and its offset: loaded where it lies within b's bytes
// [first_byte, end_byte) (inside the caller's allocation), else zero (the lane's columns are
// then gathered element by element).
struct RowUnit {
    uint4 lo;
    u32 shift;
    bool whole;  // lo is a whole unit of b
};

__device__ __forceinline__ RowUnit load_row(const DecodeArgs& p, const int row, const int strip_col,
                                            const u64 first_byte, const u64 end_byte, const int lane) {
    RowUnit r;
    const u64 at = (u64)(p.b + row * p.b_row + strip_col);
    const u64 unit = (at & ~15ull) + 16ull * lane;
    r.shift = (u32)(at & 15ull);
    r.whole = unit >= first_byte && unit + 16 <= end_byte;
    r.lo = r.whole ? __ldg((const uint4*)unit) : make_uint4(0, 0, 0, 0);
    return r;
}

// One warp's split of one strip: the sums over its rows of b (zero for a split past K), its
// 8 columns in `acc` (lane 31: none).
template <bool FP16, int M>
__device__ __forceinline__ void split_sums(const DecodeArgs& p, const int strip, const int split, const int lane,
                                           float (&acc)[M][8]) {
    const int k0 = split * p.rows_per_split, k1 = min(p.k, k0 + p.rows_per_split);
    const int strip_col = strip * STRIP, col0 = strip_col + lane * 8;
    const u64 first_byte = (u64)p.b;
    const u64 end_byte = first_byte + 2ull * ((long long)(p.k - 1) * p.b_row + p.n);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[m][j] = 0.f;
    // Fewer rows in flight for 3 or 4 rows of a: their sums take the registers (8 spill).
    constexpr int ROWS = M <= 2 ? ROWS_IN_FLIGHT : 6;
    for (int k = k0; k < k1; k += ROWS) {
        RowUnit rows[ROWS];
        u16 a_bits[ROWS][M];  // (16-bit until used: registers for 4 rows of a)
#pragma unroll
        for (int d = 0; d < ROWS; ++d) {
            if (k + d >= k1) break;
            rows[d] = load_row(p, k + d, strip_col, first_byte, end_byte, lane);
#pragma unroll
            for (int m = 0; m < M; ++m)  // (M = 4 serves 3 rows: the fourth is zero)
                a_bits[d][m] = m < p.m ? p.a[m * p.a_row + (k + d) * p.a_col] : (u16)0;
        }
#pragma unroll
        for (int d = 0; d < ROWS; ++d) {
            if (k + d >= k1) break;  // (uniform across the warp)
            const RowUnit& r = rows[d];
            uint4 hi;
            hi.x = __shfl_down_sync(0xffffffffu, r.lo.x, 1);
            hi.y = __shfl_down_sync(0xffffffffu, r.lo.y, 1);
            hi.z = __shfl_down_sync(0xffffffffu, r.lo.z, 1);
            hi.w = __shfl_down_sync(0xffffffffu, r.lo.w, 1);
            const bool hi_whole = __shfl_down_sync(0xffffffffu, r.whole, 1);
            if (lane == 31) continue;  // (after the shuffles, which need every lane)
            uint4 cols;
            if (r.whole && hi_whole && col0 + 8 <= p.n) {
                cols = shifted(r.lo, hi, r.shift);
            } else {  // the edges of b, and the last strip's last columns
                const u16* src = p.b + (k + d) * p.b_row + col0;
                u32 e[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) e[j] = col0 + j < p.n ? src[j] : 0u;
                cols = make_uint4(e[0] | e[1] << 16, e[2] | e[3] << 16, e[4] | e[5] << 16, e[6] | e[7] << 16);
            }
            float a_k[M];
#pragma unroll
            for (int m = 0; m < M; ++m) a_k[m] = to_float<FP16>(a_bits[d][m]);
            add_row<FP16, M>(acc, cols, a_k);
        }
    }
}

// A block: WARPS splits of one strip (a group). Its warps' sums are added in shared memory in
// warp order and written as the group's partial sums; the strip's counter then tells the last
// group to finish, whose block adds the groups in order and writes the strip's outputs.
typedef float4 BlockSums[WARPS][MAX_M * STRIP / 4];

template <bool FP16, int M>
__device__ __forceinline__ void decode_block(const DecodeArgs& p, const int strip, const int group,
                                             BlockSums& block_sums, bool& last_group) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float acc[M][8];
    split_sums<FP16, M>(p, strip, group * WARPS + warp, lane, acc);
    if (lane < 31) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
            block_sums[warp][(m * STRIP + lane * 8) / 4] = make_float4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
            block_sums[warp][(m * STRIP + lane * 8) / 4 + 1] = make_float4(acc[m][4], acc[m][5], acc[m][6], acc[m][7]);
        }
    }
    __syncthreads();
    constexpr int QUADS = M * STRIP / 4;  // the block's sums, 4 floats a thread and step
    float4* group_sums = (float4*)p.partials + ((long long)strip * p.groups + group) * QUADS;
    for (int q = threadIdx.x; q < QUADS; q += THREADS) {
        float4 sum = block_sums[0][q];
#pragma unroll
        for (int w = 1; w < WARPS; ++w) {
            const float4 v = block_sums[w][q];
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        group_sums[q] = sum;
    }
    if (!last_group_of_strip(p, strip, last_group)) return;
    const float4* strip_sums = (const float4*)p.partials + (long long)strip * p.groups * QUADS;
    for (int q = threadIdx.x; q < QUADS; q += THREADS) {
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
        for (int g = 0; g < p.groups; ++g) {  // (unrolled: several groups' loads in flight)
            const float4 v = __ldcg(strip_sums + (long long)g * QUADS + q);
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        const float sums[4] = {sum.x, sum.y, sum.z, sum.w};
        const int m = q * 4 / STRIP;
        if (m >= p.m) break;  // (the rows past M of a kernel for more)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = strip * STRIP + q * 4 % STRIP + j;
            if (col >= p.n) break;
            store_output<FP16>(p, m, col, sums[j]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 2) jitgemm_decode_rows(const __grid_constant__ DecodeArgs p) {
    enter_after_previous_grid();
    __shared__ BlockSums block_sums;
    __shared__ bool last_group;
    const int strip = blockIdx.x % p.strips, group = blockIdx.x / p.strips;
    if (p.fp16) {
        if (p.m == 1)
            decode_block<true, 1>(p, strip, group, block_sums, last_group);
        else if (p.m == 2)
            decode_block<true, 2>(p, strip, group, block_sums, last_group);
        else
            decode_block<true, MAX_M>(p, strip, group, block_sums, last_group);
    } else {
        if (p.m == 1)
            decode_block<false, 1>(p, strip, group, block_sums, last_group);
        else if (p.m == 2)
            decode_block<false, 2>(p, strip, group, block_sums, last_group);
        else
            decode_block<false, MAX_M>(p, strip, group, block_sums, last_group);
    }
}
