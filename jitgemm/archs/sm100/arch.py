"""The sm_100a backend object (`jitgemm.registry` returns it)."""

from __future__ import annotations

from ...heuristics import sm100
from ..backend import Backend
from . import layout, render


class Sm100(Backend):
    name = "sm_100a"
    compute_capability = (10, 0)
    default_num_sms = 148
    verified_on_hardware = False
    waits_for_previous_grid = False
    rules_module = "jitgemm.heuristics.sm100"
    checks = sm100  # check_config lives beside the cost model
    layout = layout
    renderer = render


ARCH = Sm100()
