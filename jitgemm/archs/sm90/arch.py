"""The sm_90a backend object (`jitgemm.registry` returns it)."""

from __future__ import annotations

from ...heuristics import sm90_checks
from ...problem import Problem
from .. import tma
from ..backend import Backend
from . import layout, render


class Sm90(Backend):
    name = "sm_90a"
    compute_capability = (9, 0)
    default_num_sms = 132
    verified_on_hardware = True
    waits_for_previous_grid = True
    direct_epilogue = True
    rules_module = "jitgemm.heuristics.sm90"
    checks = sm90_checks
    layout = layout
    renderer = render

    def map_operands(self, lay: layout.KernelLayout, has_c: bool) -> tuple:
        roles = super().map_operands(lay, has_c)
        roles += (1,) if lay.b.tail is not None else ()
        return roles + tuple(role for role, op in enumerate((lay.a, lay.b)) if op.edge_box)

    def tensor_maps(self, problem: Problem, lay: layout.KernelLayout, a, b, d, c) -> list:
        """map_a, map_b, map_d[, map_c][, map_b_tail][, map_a_edge][, map_b_edge]: the narrow
        last columns of an N-major B tile have a map of their own, and so has the last block of
        a K-major operand (`layout.OperandLayout.edge`: a box of the rows inside M or N)."""
        maps = super().tensor_maps(problem, lay, a, b, d, c)
        if lay.b.tail is not None:
            maps.append(tma.map_b(problem, b, lay.b.tail.box, lay.b.tail.swizzle))
        if lay.a.edge_box:
            maps.append(tma.map_a(problem, a, (lay.a.box[0], layout.edge_rows(lay.a, problem.m)), lay.a.swizzle))
        if lay.b.edge_box:
            maps.append(tma.map_b(problem, b, (lay.b.box[0], layout.edge_rows(lay.b, problem.n)), lay.b.swizzle))
        return maps


ARCH = Sm90()
