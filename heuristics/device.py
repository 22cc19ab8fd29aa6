"""What selection knows about a GPU: `DeviceSpec` (arch, SM count, shared memory per CTA) and the
kind of rates the cost models compare candidates with (`ArchRates`; each arch's rules hold theirs)."""

from __future__ import annotations

from dataclasses import dataclass

from jitgemm import registry


@dataclass(frozen=True)
class ArchRates:
    """Per-SM, per-clock rates of one architecture, used to *compare* candidates: clock cycles at
    `clock_ghz`, H200 numbers for 16-bit inputs by default."""

    # What each rate means, the H200 measurements that fixed it and how: heuristics/RATES.md.
    mma_flops_per_clk: int = 3200  # dense 16-bit tensor-core FLOPs per SM per clock, all SMs busy
    mma_peak_flops_per_clk: int = 4096  # ... with few SMs busy (the clock credit, see cost.mma_rate)
    smem_bytes_per_clk: int = 128  # shared-memory bandwidth per SM
    l2_sm_bytes_per_clk: int = 96  # L2 -> one SM ingress
    l2_total_bytes_per_clk: int = 4500  # L2 -> all SMs (7.9 TB/s at 1.75 GHz, calibrated, see RATES.md)
    l2_delivery_bytes_per_clk: int = 5000  # bytes landing in all SMs' shared memory (multicast counts per CTA)
    l2_shared_wave_gain: float = 1.5  # both L2 rates, in one wave of tiles sharing their operands
    hbm_bytes_per_clk: int = 2400  # DRAM copy bandwidth (H200: 4.2 TB/s at 1.75 GHz)
    dram_read_bytes_per_clk: int = 2550  # DRAM read-only streaming (4.46 TB/s)
    dram_latency_clk: int = 1000  # loaded DRAM round trip the stages in flight must cover
    dram_run_overhead_bytes: int = 16  # DRAM efficiency of a contiguous run: run / (run + this)
    load_latency_clk: int = 2000  # TMA load round trip under load the pipeline must cover
    launch_clk: int = 2600  # per launch: launch, ramp, first load, drain (1.5 us with PDL)
    clock_ghz: float = 1.75  # sustained SM clock the per-clock rates are quoted at


@dataclass(frozen=True)
class DeviceSpec:
    """What selection needs to know about a GPU; built from a live device or from CLI flags."""

    arch: str = "sm_90a"
    num_sms: int = 132

    def __post_init__(self):
        # The arch is checked by `select` (which names the supported ones), not here.
        if not isinstance(self.num_sms, int) or self.num_sms < 1:
            raise ValueError(f"DeviceSpec.num_sms must be a positive int, got {self.num_sms!r}")

    @property
    def smem_capacity(self) -> int:
        """Dynamic shared memory one CTA may request (bytes): what the arch's layouts are sized against."""
        return registry.get(self.arch).smem_capacity

    @property
    def rates(self) -> ArchRates:
        """The arch's rates (each arch's rules module holds its `RATES`)."""
        return registry.get(self.arch).rules.RATES
