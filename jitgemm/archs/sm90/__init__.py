"""The sm_90a (Hopper) backend: persistent, warp-specialized wgmma kernels fed by TMA."""
