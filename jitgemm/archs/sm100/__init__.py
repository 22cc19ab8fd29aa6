"""The sm_100a (Blackwell) backend: tcgen05 kernels with tensor-memory accumulators (compiled
and SASS-checked only; never run on hardware yet)."""
