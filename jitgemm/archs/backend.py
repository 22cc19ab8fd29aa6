"""What the backends share: a layout and a render module per arch, the persistent grid over
work units, and the tensor maps of A, B, D and C in the kernels' common parameter order."""

from __future__ import annotations

import importlib
from types import ModuleType

from .. import geometry
from ..config import KernelConfig
from ..problem import Problem
from . import tma


class Backend:
    layout: ModuleType  # layout_of, structural_problems, pair_along, KernelLayout
    renderer: ModuleType  # render
    rules_module: str  # the heuristics' cost model: select, explain, config_with_fields, RATES
    checks: ModuleType  # check_config: whether a config can run a problem
    # Whether the kernels can store D (and read C) with st.global where TMA cannot address the
    # output's rows (KernelConfig.out_direct); otherwise such outputs go through aligned copies.
    direct_epilogue = False

    @property
    def rules(self) -> ModuleType:
        """The cost model, imported on first use as the registry imports backends: a config
        from the caller, the dispatch table or the tuning file needs only `checks`."""
        return importlib.import_module(self.rules_module)

    @property
    def smem_capacity(self) -> int:
        """Dynamic shared memory one CTA may opt into (bytes)."""
        return self.layout.SMEM_CAPACITY

    def layout_of(self, cfg: KernelConfig):
        return self.layout.layout_of(cfg)

    def structural_problems(self, cfg: KernelConfig) -> list[str]:
        return self.layout.structural_problems(cfg)

    def render(self, cfg: KernelConfig) -> str:
        return self.renderer.render(cfg)

    def pair_along(self, cfg: KernelConfig) -> str | None:
        """The kernel dimension ('m' or 'n') along which a 2-CTA cluster pairs its tiles (None
        for one CTA), as the template's scheduler pairs them."""
        return self.layout.pair_along(cfg)

    def cluster_tiles(self, cfg: KernelConfig, m: int, n: int) -> int:
        km, kn = geometry.kernel_shape(cfg, m, n)
        return geometry.cluster_tiles(
            geometry.ceil_div(km, cfg.block_m), geometry.ceil_div(kn, cfg.block_n), self.pair_along(cfg)
        )

    def work_units(self, cfg: KernelConfig, problem: Problem) -> int:
        """Units of work the persistent grid walks: K splits of cluster tiles, or under stream_k
        the K blocks of all cluster tiles (a cluster takes whole tiles, then a range of the K
        blocks of the rest; geometry.stream_k_segments)."""
        tiles = self.cluster_tiles(cfg, problem.m, problem.n)
        if cfg.stream_k:
            return tiles * geometry.k_blocks(cfg, problem.k)
        return tiles * geometry.num_splits(cfg, problem.k)

    def grid_size(self, cfg: KernelConfig, problem: Problem, num_sms: int) -> int:
        return geometry.persistent_grid(self.work_units(cfg, problem), cfg.cluster_size, num_sms)

    def map_operands(self, lay, has_c: bool) -> tuple:
        """The operand each of `tensor_maps`' maps addresses, in their order, as an index into
        (a, b, d, c): a launch made once per problem re-points them at new arrays."""
        if lay.config.out_direct:
            return (0, 1)
        return (0, 1, 2, 3) if has_c else (0, 1, 2)

    def tensor_maps(self, problem: Problem, lay, a, b, d, c) -> list:
        """map_a, map_b, map_d[, map_c] for Views a, b, d and c (or None); without the output
        maps under out_direct (the kernel takes D's and C's pointers and row strides instead)."""
        maps = [
            tma.map_a(problem, a, lay.a.box, lay.a.swizzle),
            tma.map_b(problem, b, lay.b.box, lay.b.swizzle),
        ]
        if not lay.config.out_direct:
            maps.append(tma.map_output(problem, d, lay.out_box, lay.out_swizzle))
            if c is not None:
                maps.append(tma.map_output(problem, c, lay.out_box, lay.out_swizzle))
        return maps
