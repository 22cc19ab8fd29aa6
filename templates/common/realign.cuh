// Realigning 16-bit rows that are not whole 16-byte units: a unit is read as the two aligned
// 16-byte units around it and shifted into place. Shared by the kernels that read such rows
// (prepended to their source: NVRTC from pip has no include path).

// The 16 bytes at `shift` (even, < 16) bytes into the 32 of lo:hi, without branches.
__device__ __forceinline__ uint4 shifted(const uint4 lo, const uint4 hi, const unsigned shift) {
    unsigned w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const bool by8 = shift & 8, by4 = shift & 4;
#pragma unroll
    for (int i = 0; i < 6; ++i) w[i] = by8 ? w[i + 2] : w[i];
#pragma unroll
    for (int i = 0; i < 5; ++i) w[i] = by4 ? w[i + 1] : w[i];
    const unsigned bits = (shift & 3) * 8;
    return make_uint4(__funnelshift_r(w[0], w[1], bits), __funnelshift_r(w[1], w[2], bits),
                      __funnelshift_r(w[2], w[3], bits), __funnelshift_r(w[3], w[4], bits));
}
