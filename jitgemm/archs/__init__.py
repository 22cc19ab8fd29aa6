"""What an architecture backend provides (`jitgemm.registry` finds them).

Each target (sm_90a, sm_100a) is one object, `ARCH` in `jitgemm.archs.<name>.arch`, that owns
everything about its kernels: the shared-memory/TMA layout of a config, the heuristics' rules,
its template and the variables it renders with, the launch geometry and the kernel's
parameters (tensor maps, scalars). The rest of jitgemm reaches them through the registry and
never compares arch names.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: config.py itself asks the registry for the arch names
    from ..config import KernelConfig
    from ..problem import Problem


class Arch(Protocol):
    name: str  # the NVRTC target, e.g. "sm_90a"
    compute_capability: tuple  # (major, minor) of the devices it runs on
    default_num_sms: int  # what the CLI plans for without a GPU
    verified_on_hardware: bool  # False: compiled and SASS-checked only
    waits_for_previous_grid: bool  # kernels call griddepcontrol.wait (programmatic dependent launch)
    rules: ModuleType  # heuristics: select, explain, config_with_fields, the cost model (imported on first use)
    checks: ModuleType  # check_config: whether a config can run a problem (light to import)
    smem_capacity: int  # dynamic shared memory one CTA may opt into (bytes)

    def layout_of(self, cfg: KernelConfig):
        """The config's layout (raises ValueError when it cannot be laid out)."""

    def structural_problems(self, cfg: KernelConfig) -> list[str]:
        """Why the config cannot be laid out, in words."""

    def render(self, cfg: KernelConfig) -> str:
        """The kernel's CUDA source."""

    def cluster_tiles(self, cfg: KernelConfig, m: int, n: int) -> int:
        """Work items of one K split: tiles, or the pairs a 2-CTA cluster runs."""

    def grid_size(self, cfg: KernelConfig, problem: Problem, num_sms: int) -> int:
        """CTAs of the persistent grid."""

    def work_units(self, cfg: KernelConfig, problem: Problem) -> int:
        """Cluster tiles x K splits."""

    def tensor_maps(self, problem: Problem, lay, a, b, d, c) -> list:
        """The kernel's tensor-map parameters, in order, for operand views a, b, d and c (or None)."""

    def map_operands(self, lay, has_c: bool) -> tuple:
        """For each of tensor_maps' maps, the operand it addresses: an index into (a, b, d, c)."""
