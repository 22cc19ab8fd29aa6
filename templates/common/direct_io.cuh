// Direct output I/O: the ld.global / st.global stand-ins for the TMA load of a C box and the
// TMA store of a D box, for outputs whose rows TMA cannot address (a row stride that is not a
// multiple of 16 bytes, or a base that is not 16-byte aligned: odd N, padding-free views).
//
// A box is `rows` rows of SWIZZLE bytes in shared memory at `buf`, 16-byte units swizzled as
// the TMA box would be; it covers rows [row0, row0 + rows) and columns [col0, col0 + SWIZZLE /
// ELEM) of a row-major (M, N) matrix at `base` with a row stride of `ld` bytes. Outside the
// matrix, a store skips and a load writes zeros. The THREADS threads of a warpgroup share a
// box in runs of W bytes (the widest of 16, 8, 4 and ELEM that the base, the stride and the
// row's bytes allow; `direct_width`), consecutive threads on consecutive runs of one row, so
// that a warp's accesses are contiguous. Loads are issued several rows at a time to
// overlap their latency (`direct_batch`).

template <u32 W> struct DirectRun;
template <> struct DirectRun<2> { typedef u16 T; };
template <> struct DirectRun<4> { typedef u32 T; };
template <> struct DirectRun<8> { typedef uint2 T; };
template <> struct DirectRun<16> { typedef uint4 T; };

// Loads in flight per thread: 32 bytes of registers at most (wider runs, fewer loads).
template <u32 W>
__host__ __device__ constexpr u32 direct_batch() { return W >= 8 ? 32 / W : 8; }

// The run width for a matrix: the largest power of two <= 16 dividing the base address, the
// row stride and the row's length in bytes (so that a run never straddles the last column).
template <u32 ELEM>
__device__ __forceinline__ u32 direct_width(const void* base, long long ld, int n) {
    const u64 bits = reinterpret_cast<u64>(base) | (u64)ld | (u64)n * ELEM | 16;
    return (u32)(bits & (~bits + 1));   // lowest set bit
}

// The runs of a box, THREADS threads: a thread keeps one run column (THREADS is a multiple of
// the runs per row) and steps down the rows, so that the column's offsets are computed once.
template <u32 W, u32 SWIZZLE, u32 THREADS>
struct DirectRuns {   // for THREADS consecutive threads (a warpgroup)
    static constexpr u32 RUNS = SWIZZLE / W;        // runs per box row
    static constexpr u32 ROW_STEP = THREADS / RUNS;   // rows the threads cover at once
    static_assert(THREADS % RUNS == 0, "every thread keeps one run column");
    u32 run_bytes, first_row;
    int col;
    // The thread's index is read here, not passed in: values the compiler could hoist out of
    // the tile loop would stay live across the main loop and crowd its registers.
    __device__ __forceinline__ DirectRuns(int col0, u32 elem) {
        u32 tid;
        asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
        tid %= THREADS;
        run_bytes = (tid % RUNS) * W;
        first_row = tid / RUNS;
        col = col0 + (int)(run_bytes / elem);
    }
    // The swizzled shared-memory offset of this thread's run in box row r.
    __device__ __forceinline__ u32 smem(u32 r) const {
        const u32 off = r * SWIZZLE + run_bytes;
        return off ^ (((off >> 7) & (SWIZZLE / 16 - 1)) << 4);
    }
};

template <u32 W, u32 ELEM, u32 SWIZZLE, u32 THREADS>
__device__ __forceinline__ void direct_store_runs(u32 buf, u32 rows, unsigned char* base, long long ld, int row0,
                                                  int col0, int M, int N) {
    typedef typename DirectRun<W>::T T;
    typedef DirectRuns<W, SWIZZLE, THREADS> Runs;
    const Runs runs(col0, ELEM);
    const int live_rows = min((int)rows, M - row0);   // <= 0: a box wholly past the last row
    if (runs.col >= N || live_rows <= 0) return;
    unsigned char* dst = base + (size_t)(row0 + (int)runs.first_row) * ld + (size_t)runs.col * ELEM;
#pragma unroll 4
    for (u32 r = runs.first_row; r < (u32)live_rows; r += Runs::ROW_STEP, dst += Runs::ROW_STEP * ld) {
        const u32 src = buf + runs.smem(r);
        T v;
        if constexpr (W == 2) asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(src));
        else if constexpr (W == 4) asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(src));
        else if constexpr (W == 8) asm volatile("ld.shared.v2.u32 { %0, %1 }, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(src));
        else asm volatile("ld.shared.v4.u32 { %0, %1, %2, %3 }, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(src));
        *reinterpret_cast<T*>(dst) = v;
    }
}

template <u32 W, u32 ELEM, u32 SWIZZLE, u32 THREADS>
__device__ __forceinline__ void direct_load_runs(u32 buf, u32 rows, const unsigned char* base, long long ld, int row0,
                                                 int col0, int M, int N) {
    typedef typename DirectRun<W>::T T;
    typedef DirectRuns<W, SWIZZLE, THREADS> Runs;
    const Runs runs(col0, ELEM);
    const bool col_live = runs.col < N;
    const int live_rows = min((int)rows, M - row0);
    const unsigned char* src = base + (size_t)(row0 + (int)runs.first_row) * ld + (size_t)runs.col * ELEM;
    for (u32 first = runs.first_row; first < rows; first += Runs::ROW_STEP * direct_batch<W>()) {
        T v[direct_batch<W>()];
#pragma unroll
        for (u32 i = 0; i < direct_batch<W>(); ++i) {
            const u32 r = first + i * Runs::ROW_STEP;
            v[i] = T{};
            if (col_live && (int)r < live_rows)
                v[i] = *reinterpret_cast<const T*>(src + (long long)(r - runs.first_row) * ld);
        }
#pragma unroll
        for (u32 i = 0; i < direct_batch<W>(); ++i) {
            const u32 r = first + i * Runs::ROW_STEP;
            if (r >= rows) break;
            const u32 dst = buf + runs.smem(r);
            if constexpr (W == 2) asm volatile("st.shared.u16 [%0], %1;" :: "r"(dst), "h"(v[i]) : "memory");
            else if constexpr (W == 4) asm volatile("st.shared.u32 [%0], %1;" :: "r"(dst), "r"(v[i]) : "memory");
            else if constexpr (W == 8) asm volatile("st.shared.v2.u32 [%0], { %1, %2 };" :: "r"(dst), "r"(v[i].x), "r"(v[i].y) : "memory");
            else asm volatile("st.shared.v4.u32 [%0], { %1, %2, %3, %4 };" :: "r"(dst), "r"(v[i].x), "r"(v[i].y), "r"(v[i].z), "r"(v[i].w) : "memory");
        }
    }
}

// Store one staged box to D.
template <u32 ELEM, u32 SWIZZLE, u32 THREADS>
__device__ __forceinline__ void direct_store_box(u32 buf, u32 rows, unsigned char* base, long long ld, int row0,
                                                 int col0, int M, int N) {
    const u32 width = direct_width<ELEM>(base, ld, N);
    if (width >= 16) direct_store_runs<16, ELEM, SWIZZLE, THREADS>(buf, rows, base, ld, row0, col0, M, N);
    else if (width == 8) direct_store_runs<8, ELEM, SWIZZLE, THREADS>(buf, rows, base, ld, row0, col0, M, N);
    else if (ELEM == 2 && width == 2) direct_store_runs<2, ELEM, SWIZZLE, THREADS>(buf, rows, base, ld, row0, col0, M, N);
    else direct_store_runs<4, ELEM, SWIZZLE, THREADS>(buf, rows, base, ld, row0, col0, M, N);
}

// Load one box of C into its staging buffer, zeros outside the matrix.
template <u32 ELEM, u32 SWIZZLE, u32 THREADS>
__device__ __forceinline__ void direct_load_box(u32 buf, u32 rows, const unsigned char* base, long long ld, int row0,
                                                int col0, int M, int N) {
    const u32 width = direct_width<ELEM>(base, ld, N);
    if (width >= 16) direct_load_runs<16, ELEM, SWIZZLE, THREADS>(buf, rows, base, ld, row0, col0, M, N);
    else if (width == 8) direct_load_runs<8, ELEM, SWIZZLE, THREADS>(buf, rows, base, ld, row0, col0, M, N);
    else if (ELEM == 2 && width == 2) direct_load_runs<2, ELEM, SWIZZLE, THREADS>(buf, rows, base, ld, row0, col0, M, N);
    else direct_load_runs<4, ELEM, SWIZZLE, THREADS>(buf, rows, base, ld, row0, col0, M, N);
}
