"""Which kernel configuration a problem gets: one precedence for `gemm`, `jitgemm precompile`
and `jitgemm explain`.

    config= / --config  >  JITGEMM_CONFIG  >  the tuning file (`jitgemm tune`)
        >  the dispatch table (`jitgemm precompile`)  >  the heuristics

The tuning file is keyed by GPU name, arch and SM count. With a GPU (gemm; the CLI when the
target is the local GPU) its name picks the entries. Without one (the CLI targeting an arch on
a CPU-only machine, or another arch or SM count than the local GPU's) the entries of every GPU
with the target's arch and SM count are used when they agree on the problem's config; when
they disagree the heuristics decide (with a TuningWarning), since no one of them is the
target.

The dispatch table (jitgemm.dispatch) is keyed by arch and SM count only: it holds the
heuristics' own choices, recorded by `jitgemm precompile`, so that a process answers the
problems it covers without running the cost model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from . import dispatch, heuristics, registry, tuned
from .config import KernelConfig
from .heuristics import DeviceSpec
from .problem import Problem

SOURCE_TEXT = {
    "argument": "the config given (config= / --config)",
    "env": f"the {heuristics.ENV_VAR} variable",
    "tuning": "the tuning file (jitgemm tune; JITGEMM_TUNED=0 ignores it)",
    "table": f"the dispatch table (jitgemm precompile; {dispatch.ENV_TABLE}=0 ignores it)",
    "heuristics": "the heuristics",
}


def choose(
    problem: Problem,
    device_spec: DeviceSpec,
    device_name: str | Callable[[], str] | None = None,
    config: KernelConfig | None = None,
) -> tuple[KernelConfig, str]:
    """(config, source) for `problem` on `device_spec`; source is a key of SOURCE_TEXT.

    `config` is checked against the problem and device (ValueError naming `config`), as is
    JITGEMM_CONFIG (ValueError naming it). `device_name` keys the tuning file: the GPU's name,
    a function returning it (asked only when the file has entries), or None for "any GPU of
    this arch and SM count".
    """
    if config is not None:
        cfg, source = heuristics.require_valid(config, problem, device_spec, "config"), "argument"
    else:
        cfg, source = _choose_tiles(problem, device_spec, device_name)
    # Like the dtypes, the epilogue follows the problem, whatever chose the tile.
    return with_epilogue(cfg, problem), source


def with_epilogue(cfg: KernelConfig, problem: Problem) -> KernelConfig:
    """`cfg` storing the output the way `problem`'s output needs: directly (out_direct) where
    TMA cannot address its rows and the arch's kernels can, else with TMA (through an aligned
    copy when the rows are not addressable). Every source of a config goes through it: a
    given config's, JITGEMM_CONFIG's, the tuning file's, the dispatch table's."""
    direct = not problem.aligned_out and registry.get(cfg.arch).direct_epilogue
    return cfg if cfg.out_direct == direct else dataclasses.replace(cfg, out_direct=direct)


def _choose_tiles(problem, device_spec, device_name) -> tuple[KernelConfig, str]:
    from_env = heuristics.config_from_env(problem, device_spec)
    if from_env is not None:
        return from_env, "env"
    if tuned.enabled() and tuned.read_entries():
        if device_name is None:
            from_file = tuned.tuned_config_for_target(problem, device_spec)
        else:
            name = device_name() if callable(device_name) else device_name
            from_file = tuned.tuned_config(problem, device_spec, name)
        if from_file is not None:
            return from_file, "tuning"
    if dispatch.enabled():
        from_table = dispatch.lookup(problem, device_spec)
        if from_table is not None:
            return from_table, "table"
    return heuristics.select(problem, device_spec), "heuristics"
