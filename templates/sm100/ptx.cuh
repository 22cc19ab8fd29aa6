// PTX wrappers for sm_100a: mbarrier, cluster, TMA (1-CTA and 2-CTA loads, stores) and tcgen05
// (tensor-memory allocation, UMMA descriptors, mma, commit, tensor-memory loads, fences).
//
// The including template defines TCGEN05_CTA_GROUP as ".cta_group::N", N = 1 or 2 (the 2-CTA MMA):
// every tcgen05 instruction of a kernel must name the same CTA group.
{% include "common/ptx.cuh" %}

// ---- TMA, 2-CTA pair ----
// 2-CTA MMA: the box lands in this CTA's shared memory at `dst`, and the transaction bytes are
// completed on `cluster_bar`, a shared::cluster address that may be in the peer CTA (the even
// CTA of the pair, whose MMA consumes both CTAs' halves).
__device__ __forceinline__ void tma_load_pair(u32 dst, const TensorMap* map, u32 cluster_bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.cta_group::2"
        " [%0], [%1, { %3, %4 }], [%2];"
        :: "r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(cluster_bar), "r"(c0), "r"(c1) : "memory");
}
// ---- tcgen05: tensor memory ----
// Allocates `cols` (a power of two >= 32) TMEM columns; the base address lands in shared memory
// at `slot`. Warp-collective; with cta_group::2 one warp of each CTA of the pair issues it.
__device__ __forceinline__ void tmem_alloc(u32 slot, u32 cols) {
    asm volatile("tcgen05.alloc" TCGEN05_CTA_GROUP ".sync.aligned.shared::cta.b32 [%0], %1;"
                 :: "r"(slot), "r"(cols) : "memory");
}
// Lets other CTAs on this SM allocate; this CTA allocates nothing more afterwards.
__device__ __forceinline__ void tmem_relinquish() {
    asm volatile("tcgen05.relinquish_alloc_permit" TCGEN05_CTA_GROUP ".sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void tmem_dealloc(u32 taddr, u32 cols) {
    asm volatile("tcgen05.dealloc" TCGEN05_CTA_GROUP ".sync.aligned.b32 %0, %1;"
                 :: "r"(taddr), "r"(cols) : "memory");
}
// Order tcgen05 operations before / after a thread synchronisation (barrier, mbarrier).
__device__ __forceinline__ void tcgen05_fence_before() {
    asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}
__device__ __forceinline__ void tcgen05_fence_after() {
    asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}

// ---- tcgen05: MMA ----
// Shared-memory (UMMA) descriptor, sm_100 format: start address, leading and stride byte
// offsets (all >> 4), the fixed version bits 46-48 = 0b001, base offset 0 (every tile starts on
// a 1024-byte swizzle atom), layout type SWIZZLE_128B = 2 in bits 61-63.
__device__ __forceinline__ u64 umma_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFF) >> 4)
         | ((u64)((lbo & 0x3FFFF) >> 4) << 16)
         | ((u64)((sbo & 0x3FFFF) >> 4) << 32)
         | (1ull << 46)
         | (2ull << 61);
}
// D[tmem] (+)= A[smem] * B[smem], one M x N x 16 step, issued by a single thread.
// accumulate = 0 overwrites D (the first K step of a tile), so TMEM never needs zeroing.
__device__ __forceinline__ void umma_f16(u32 d_tmem, u64 desc_a, u64 desc_b, u32 idesc, u32 accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %4, 0;\n"
        "tcgen05.mma" TCGEN05_CTA_GROUP ".kind::f16 [%0], %1, %2, %3, p;\n"
        "}\n"
        :: "r"(d_tmem), "l"(desc_a), "l"(desc_b), "r"(idesc), "r"(accumulate) : "memory");
}
// The barrier at `bar` gets one arrival once every tcgen05.mma this thread issued so far has
// completed (and has finished reading its shared-memory operands).
__device__ __forceinline__ void umma_commit(u32 bar) {
    asm volatile("tcgen05.commit" TCGEN05_CTA_GROUP ".mbarrier::arrive::one.shared::cluster.b64 [%0];"
                 :: "r"(bar) : "memory");
}
// The same, arriving on the barrier at offset `bar` in every CTA of `cta_mask`.
__device__ __forceinline__ void umma_commit_multicast(u32 bar, u16 cta_mask) {
    asm volatile("tcgen05.commit" TCGEN05_CTA_GROUP
                 ".mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 [%0], %1;"
                 :: "r"(bar), "h"(cta_mask) : "memory");
}
