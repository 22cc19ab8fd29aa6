// Direct output I/O: the ld.global / st.global stand-ins for the TMA load of a C box and the
// TMA store of a D box, for outputs whose rows TMA cannot address (a row stride that is not a
// multiple of 16 bytes, or a base that is not 16-byte aligned: odd N, padding-free views).
//
// A box is `rows` rows of SWIZZLE bytes in shared memory at `buf`, 16-byte units swizzled as
// the TMA box would be; it covers rows [row0, row0 + rows) and columns [col0, col0 + SWIZZLE /
// ELEM) of a row-major (M, N) matrix at `base` with a row stride of `ld` bytes. Outside the
// matrix, a store skips and a load writes zeros. The threads of one warpgroup share a box in
// runs of W bytes (the widest of 16, 8, 4 and ELEM that the base, the stride and the row's
// bytes allow; `direct_width`), consecutive threads on consecutive runs of one row, so that a
// warp's accesses are contiguous. Loads are issued DIRECT_BATCH at a time to overlap their
// latency.

template <u32 W> struct DirectRun;
template <> struct DirectRun<2> { typedef u16 T; };
template <> struct DirectRun<4> { typedef u32 T; };
template <> struct DirectRun<8> { typedef uint2 T; };
template <> struct DirectRun<16> { typedef uint4 T; };

constexpr u32 DIRECT_BATCH = 8;

// The run width for a matrix: the largest power of two <= 16 dividing the base address, the
// row stride and the row's length in bytes (so that a run never straddles the last column).
template <u32 ELEM>
__device__ __forceinline__ u32 direct_width(const void* base, long long ld, int n) {
    const u64 bits = reinterpret_cast<u64>(base) | (u64)ld | (u64)n * ELEM | 16;
    return (u32)(bits & (~bits + 1));   // lowest set bit
}

template <u32 W, u32 ELEM, u32 SWIZZLE>
__device__ __forceinline__ u32 direct_smem_offset(u32 run) {
    constexpr u32 RUNS = SWIZZLE / W;   // runs per box row
    const u32 off = (run / RUNS) * SWIZZLE + (run % RUNS) * W;
    return off ^ (((off >> 7) & (SWIZZLE / 16 - 1)) << 4);
}

template <u32 W, u32 ELEM, u32 SWIZZLE>
__device__ __forceinline__ bool direct_in(u32 run, int row0, int col0, int M, int N) {
    constexpr u32 RUNS = SWIZZLE / W;
    return row0 + (int)(run / RUNS) < M && col0 + (int)((run % RUNS) * (W / ELEM)) < N;
}

template <u32 W, u32 ELEM, u32 SWIZZLE>
__device__ __forceinline__ size_t direct_global_offset(u32 run, long long ld, int row0, int col0) {
    constexpr u32 RUNS = SWIZZLE / W;
    return (size_t)(row0 + (int)(run / RUNS)) * ld + (size_t)(col0 + (run % RUNS) * (W / ELEM)) * ELEM;
}

template <u32 W, u32 ELEM, u32 SWIZZLE>
__device__ __forceinline__ void direct_store_runs(u32 buf, u32 rows, unsigned char* base, long long ld, int row0,
                                                  int col0, int M, int N, u32 tid, u32 threads) {
    typedef typename DirectRun<W>::T T;
    const u32 runs = rows * (SWIZZLE / W);
    for (u32 run = tid; run < runs; run += threads) {
        if (!direct_in<W, ELEM, SWIZZLE>(run, row0, col0, M, N)) continue;
        const u32 src = buf + direct_smem_offset<W, ELEM, SWIZZLE>(run);
        T v;
        if constexpr (W == 2) asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(src));
        else if constexpr (W == 4) asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(src));
        else if constexpr (W == 8) asm volatile("ld.shared.v2.u32 { %0, %1 }, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(src));
        else asm volatile("ld.shared.v4.u32 { %0, %1, %2, %3 }, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(src));
        *reinterpret_cast<T*>(base + direct_global_offset<W, ELEM, SWIZZLE>(run, ld, row0, col0)) = v;
    }
}

template <u32 W, u32 ELEM, u32 SWIZZLE>
__device__ __forceinline__ void direct_load_runs(u32 buf, u32 rows, const unsigned char* base, long long ld, int row0,
                                                 int col0, int M, int N, u32 tid, u32 threads) {
    typedef typename DirectRun<W>::T T;
    const u32 runs = rows * (SWIZZLE / W);
    for (u32 first = tid; first < runs; first += threads * DIRECT_BATCH) {
        T v[DIRECT_BATCH];
#pragma unroll
        for (u32 i = 0; i < DIRECT_BATCH; ++i) {
            const u32 run = first + i * threads;
            v[i] = T{};
            if (run < runs && direct_in<W, ELEM, SWIZZLE>(run, row0, col0, M, N))
                v[i] = *reinterpret_cast<const T*>(base + direct_global_offset<W, ELEM, SWIZZLE>(run, ld, row0, col0));
        }
#pragma unroll
        for (u32 i = 0; i < DIRECT_BATCH; ++i) {
            const u32 run = first + i * threads;
            if (run >= runs) break;
            const u32 dst = buf + direct_smem_offset<W, ELEM, SWIZZLE>(run);
            if constexpr (W == 2) asm volatile("st.shared.u16 [%0], %1;" :: "r"(dst), "h"(v[i]) : "memory");
            else if constexpr (W == 4) asm volatile("st.shared.u32 [%0], %1;" :: "r"(dst), "r"(v[i]) : "memory");
            else if constexpr (W == 8) asm volatile("st.shared.v2.u32 [%0], { %1, %2 };" :: "r"(dst), "r"(v[i].x), "r"(v[i].y) : "memory");
            else asm volatile("st.shared.v4.u32 [%0], { %1, %2, %3, %4 };" :: "r"(dst), "r"(v[i].x), "r"(v[i].y), "r"(v[i].z), "r"(v[i].w) : "memory");
        }
    }
}

// Store one staged box to D (`width` from direct_width, the same for every box of the matrix).
template <u32 ELEM, u32 SWIZZLE>
__device__ __forceinline__ void direct_store_box(u32 width, u32 buf, u32 rows, unsigned char* base, long long ld,
                                                 int row0, int col0, int M, int N, u32 tid, u32 threads) {
    if (width >= 16) direct_store_runs<16, ELEM, SWIZZLE>(buf, rows, base, ld, row0, col0, M, N, tid, threads);
    else if (width == 8) direct_store_runs<8, ELEM, SWIZZLE>(buf, rows, base, ld, row0, col0, M, N, tid, threads);
    else if (ELEM == 2 && width == 2) direct_store_runs<2, ELEM, SWIZZLE>(buf, rows, base, ld, row0, col0, M, N, tid, threads);
    else direct_store_runs<4, ELEM, SWIZZLE>(buf, rows, base, ld, row0, col0, M, N, tid, threads);
}

// Load one box of C into its staging buffer, zeros outside the matrix.
template <u32 ELEM, u32 SWIZZLE>
__device__ __forceinline__ void direct_load_box(u32 width, u32 buf, u32 rows, const unsigned char* base, long long ld,
                                                int row0, int col0, int M, int N, u32 tid, u32 threads) {
    if (width >= 16) direct_load_runs<16, ELEM, SWIZZLE>(buf, rows, base, ld, row0, col0, M, N, tid, threads);
    else if (width == 8) direct_load_runs<8, ELEM, SWIZZLE>(buf, rows, base, ld, row0, col0, M, N, tid, threads);
    else if (ELEM == 2 && width == 2) direct_load_runs<2, ELEM, SWIZZLE>(buf, rows, base, ld, row0, col0, M, N, tid, threads);
    else direct_load_runs<4, ELEM, SWIZZLE>(buf, rows, base, ld, row0, col0, M, N, tid, threads);
}
