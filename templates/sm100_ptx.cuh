// PTX wrappers for sm_100a: mbarrier, cluster, TMA (1-CTA and 2-CTA loads, stores) and tcgen05
// (tensor-memory allocation, UMMA descriptors, mma, commit, tensor-memory loads, fences).
// Header-free on purpose: NVRTC compiles this without any include path.
//
// The including template defines TCGEN05_CTA_GROUP as ".cta_group::N", N = 1 or 2 (the 2-CTA MMA):
// every tcgen05 instruction of a kernel must name the same CTA group.
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;

// The driver's CUtensorMap is an opaque, 64-byte aligned 128-byte blob.
struct alignas(64) TensorMap { u64 opaque[16]; };

__device__ __forceinline__ u32 smem_u32(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ----
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count));
}
// Arrive once and add `bytes` to the transaction count of the current phase.
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" :: "r"(bar), "r"(parity) : "memory");
}
// The shared::cluster address of the object at shared::cta offset `addr` in CTA `cta`.
__device__ __forceinline__ u32 cluster_addr(u32 addr, u32 cta) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(cta));
    return remote;
}
// Arrive on the barrier at the same shared-memory offset in CTA `cta` of the cluster (this CTA
// included; a launch without clusters is a cluster of one).
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 cta) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];"
                 :: "r"(cluster_addr(bar, cta)) : "memory");
}
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// ---- cluster ----
__device__ __forceinline__ u32 cluster_cta_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void named_barrier(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

// ---- TMA ----
__device__ __forceinline__ void tma_prefetch(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<u64>(map)) : "memory");
}
// Box at coordinates (c0, c1) -> this CTA's shared memory at `dst`; completes bytes on `bar`.
__device__ __forceinline__ void tma_load(u32 dst, const TensorMap* map, u32 bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, { %3, %4 }], [%2];"
        :: "r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
// 2-CTA MMA: the box lands in this CTA's shared memory at `dst`, and the transaction bytes are
// completed on `cluster_bar`, a shared::cluster address that may be in the peer CTA (the even
// CTA of the pair, whose MMA consumes both CTAs' halves).
__device__ __forceinline__ void tma_load_pair(u32 dst, const TensorMap* map, u32 cluster_bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.cta_group::2"
        " [%0], [%1, { %3, %4 }], [%2];"
        :: "r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(cluster_bar), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_store(const TensorMap* map, u32 src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, { %2, %3 }], [%1];"
                 :: "l"(reinterpret_cast<u64>(map)), "r"(src), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void tma_store_commit() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Staging buffers may be overwritten once all but the newest N store groups have read them.
template <int N>
__device__ __forceinline__ void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ void tma_store_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
// Generic-proxy writes to shared memory become visible to the TMA (async proxy).
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
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

// ---- conversions (no cuda_fp16.h / cuda_bf16.h) ----
// Packs two floats into a 32-bit pair of 16-bit values: `lo` in the low half.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float bf16_to_f32(u16 v) {
    return __uint_as_float(((u32)v) << 16);
}
__device__ __forceinline__ float f16_to_f32(u16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
}

// A pipeline position: which stage of the ring, and the parity of its current round.
struct PipeState {
    u32 stage;
    u32 phase;
    template <u32 STAGES>
    __device__ __forceinline__ void advance() {
        if (++stage == STAGES) { stage = 0; phase ^= 1; }
    }
};
