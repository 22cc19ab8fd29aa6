"""Rendering: the Jinja environment over templates/ and the kernels' symbol names; each arch
backend renders its own template (`jitgemm.archs.<arch>.render`)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from . import registry, templates
from .config import KernelConfig

if TYPE_CHECKING:
    import jinja2

TEMPLATES = Path(templates.__file__).parent  # the jitgemm.templates package's directory


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    # Jinja is heavy to import (~35 ms) and only a kernel missing from the cache is rendered.
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: (TEMPLATES / name).read_text()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def kernel_name(cfg: KernelConfig) -> str:
    return "jitgemm_" + cfg.name


def render(cfg: KernelConfig) -> str:
    """The CUDA source of the kernel for `cfg` (what the cache key hashes)."""
    return registry.get(cfg.arch).render(cfg)
