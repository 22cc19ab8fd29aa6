// PTX wrappers both architectures use: mbarrier, cluster, TMA loads and stores, conversions
// and the pipeline-state object. Header-free on purpose: NVRTC compiles this without any
// include path.
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
// The same without cluster-wide release ordering: a bare "done reading" signal (the reads it
// reports, e.g. by wgmma, were completed by other means), so no cluster-wide fence is emitted.
__device__ __forceinline__ void mbar_signal_cluster(u32 bar, u32 cta) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(cluster_addr(bar, cta)) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
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
// Generic-proxy writes to shared memory become visible to the TMA (async proxy).
__device__ __forceinline__ void fence_proxy_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
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
