"""The architecture registry: the one place that maps arch names and compute capabilities to
backends (`jitgemm.archs`). A backend module is imported on first use, as Triton loads its
backends, so the heuristics and the rest of the package can ask for one without importing all
of them up front."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .archs import Arch

# name -> (compute capability, backend module)
_BACKENDS = {
    "sm_90a": ((9, 0), "jitgemm.archs.sm90.arch"),
    "sm_100a": ((10, 0), "jitgemm.archs.sm100.arch"),
}
ARCH_NAMES = tuple(_BACKENDS)


def get(name: str) -> Arch:
    """The backend of arch `name`; ValueError for an unknown one."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown arch {name!r}; supported: {list(ARCH_NAMES)}")
    return importlib.import_module(_BACKENDS[name][1]).ARCH


def name_of(compute_capability: tuple) -> str | None:
    """The arch whose kernels run on devices of `compute_capability`, or None."""
    cc = tuple(compute_capability)
    return next((name for name, (arch_cc, _) in _BACKENDS.items() if arch_cc == cc), None)
