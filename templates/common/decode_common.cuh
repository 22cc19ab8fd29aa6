// What the decode kernels (decode_rows.cuh, decode_cols.cuh) share: the parameter block, the
// 16-bit conversions, the handshake that finds a strip's last group, and the output's store.
// Prepended to each kernel's source (NVRTC from pip has no include path); jitgemm/decode.py
// packs DecodeArgs.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;  // a block's splits of one strip (a group)

struct DecodeArgs {
    const u16* a;
    long long a_row, a_col;  // a[m, k] at a[m * a_row + k * a_col]
    const u16* b;
    long long b_row;  // the stride of b's rows (b[k, n] at b[k * b_row + n]), or of its columns (at b[n * b_row + k])
    void* out;
    long long out_row, out_col;  // elements, of the output dtype
    const void* c;
    long long c_row, c_col;
    float* partials;  // per group, the kernel's rows of a x STRIP fp32 sums
    u32* counters;    // per strip: groups done (zero between launches)
    float alpha, beta;
    int m, n, k;
    int strips, groups, rows_per_split;  // a group: WARPS splits of rows_per_split rows of b
    int fp16, out_fp32, has_c;
};

template <bool FP16>
__device__ __forceinline__ float to_float(const u32 bits) {
    if (FP16) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((u16)bits));
        return f;
    }
    return __uint_as_float(bits << 16);
}

template <bool FP16>
__device__ __forceinline__ u16 from_float(const float f) {
    u16 bits;
    if (FP16)
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f));
    else
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(f));
    return bits;
}

// Programmatic dependent launch: the previous kernel of the stream may still be writing a, b or
// c (or reading the workspace), so wait for it; the next may launch now and waits for this grid.
__device__ __forceinline__ void enter_after_previous_grid() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// After this block wrote its group's sums: whether it is the strip's last group to finish
// (in every thread). The last one resets the strip's counter for the next launch, and sees
// every group's sums as they were before its increment.
__device__ __forceinline__ bool last_group_of_strip(const DecodeArgs& p, const int strip, bool& last_group) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last_group = atomicAdd(p.counters + strip, 1u) == (u32)p.groups - 1;
        if (last_group) p.counters[strip] = 0;
    }
    __syncthreads();
    if (!last_group) return false;
    __threadfence();
    return true;
}

// out[row, col] = alpha * sum (+ beta * c[row, col]).
template <bool FP16>
__device__ __forceinline__ void store_output(const DecodeArgs& p, const int row, const int col, const float sum) {
    float v = p.alpha * sum;
    const long long c_at = row * p.c_row + col * p.c_col;
    if (p.has_c) v += p.beta * (p.out_fp32 ? ((const float*)p.c)[c_at] : to_float<FP16>(((const u16*)p.c)[c_at]));
    const long long at = row * p.out_row + col * p.out_col;
    if (p.out_fp32)
        ((float*)p.out)[at] = v;
    else
        ((u16*)p.out)[at] = from_float<FP16>(v);
}
