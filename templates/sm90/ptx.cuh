// PTX wrappers for sm_90a: TMA multicast loads, wgmma and setmaxnreg, over the shared ones.
{% include "common/ptx.cuh" %}

// ---- TMA multicast ----
// Lands the box at offset `dst` in every CTA of `cta_mask`, signalling each CTA's barrier at `bar`.
__device__ __forceinline__ void tma_load_multicast(u32 dst, const TensorMap* map, u32 bar,
                                                   int c0, int c1, u16 cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, { %3, %4}], [%2], %5;"
        :: "r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(cta_mask) : "memory");
}
// ---- programmatic dependent launch (no-ops when the launch did not ask for it) ----
// The next kernel in the stream may start its prologue while this grid still runs.
__device__ __forceinline__ void griddep_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Blocks until the previous kernel in the stream has finished and its writes are visible.
__device__ __forceinline__ void griddep_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}
// ---- split-K ----
// A named barrier over `threads` threads that also tells each of them whether any passed `pred`.
__device__ __forceinline__ bool named_barrier_any(u32 id, u32 threads, bool pred) {
    u32 any;
    asm volatile("{\n"
                 ".reg .pred p, q;\n"
                 "setp.ne.b32 p, %1, 0;\n"
                 "bar.red.or.pred q, %2, %3, p;\n"
                 "selp.u32 %0, 1, 0, q;\n"
                 "}" : "=r"(any) : "r"((u32)pred), "r"(id), "r"(threads) : "memory");
    return any != 0;
}
// ---- stmatrix ----
// Stores four 8x8 16-bit matrices transposed: register q of a thread holds its two elements
// (row lane / 4, columns 2 * (lane % 4) + {0, 1}) of matrix q; lanes 8q..8q+7 give the addresses
// of the rows of stored matrix q (16 bytes each): stored row i receives column i of the fragment.
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], { %1, %2, %3, %4 };"
                 :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
{% if cfg.block_n % 16 %}
// Two matrices, as stmatrix_x4_trans stores four: lanes 8q..8q+7 (q < 2) give the addresses.
__device__ __forceinline__ void stmatrix_x2_trans(u32 addr, u32 r0, u32 r1) {
    asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], { %1, %2 };" :: "r"(addr), "r"(r0), "r"(r1) : "memory");
}
{% if cfg.has_c %}
__device__ __forceinline__ void ldmatrix_x2_trans(u32 addr, u32& r0, u32& r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 { %0, %1 }, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr) : "memory");
}
{% endif %}
{% endif %}
{% if cfg.swap_ab and cfg.has_c %}
// Loads four 8x8 16-bit matrices transposed, the inverse of stmatrix_x4_trans with the same
// addresses: register q receives the elements stmatrix_x4_trans stores from register q.
__device__ __forceinline__ void ldmatrix_x4_trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3 }, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
{% endif %}
// ---- wgmma ----
// Shared-memory matrix descriptor; `layout` in bits 62-63: 1 = 128B, 2 = 64B, 3 = 32B swizzle.
__device__ __forceinline__ u64 smem_desc(u32 addr, u32 lbo, u32 sbo, u32 layout) {
    return (u64)((addr & 0x3FFFF) >> 4)
         | ((u64)((lbo & 0x3FFFF) >> 4) << 16)
         | ((u64)((sbo & 0x3FFFF) >> 4) << 32)
         | ((u64)layout << 62);
}
__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
template <u32 REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(REGS));
}
template <u32 REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(REGS));
}
