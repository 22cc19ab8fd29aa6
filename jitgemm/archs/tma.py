"""The tensor maps both backends' kernels take for the user's arrays: A, B and C/D tiles as the
layout boxes them (a View's pointer and leading stride, the problem's extents)."""

from __future__ import annotations

from .. import runtime
from ..problem import Problem


def map_a(problem: Problem, view, box: tuple, swizzle: int):
    m, k = problem.m, problem.k
    if problem.a_major == "K":
        return runtime.tensor_map_2d(problem.dtype, view.ptr, k, m, view.leading_stride_bytes(1), box, swizzle)
    return runtime.tensor_map_2d(problem.dtype, view.ptr, m, k, view.leading_stride_bytes(0), box, swizzle)


def map_b(problem: Problem, view, box: tuple, swizzle: int):
    k, n = problem.k, problem.n
    if problem.b_major == "N":
        return runtime.tensor_map_2d(problem.dtype, view.ptr, n, k, view.leading_stride_bytes(1), box, swizzle)
    return runtime.tensor_map_2d(problem.dtype, view.ptr, k, n, view.leading_stride_bytes(0), box, swizzle)


def map_output(problem: Problem, view, box: tuple, swizzle: int):
    """C or D: row-major (M, N) in the output dtype."""
    return runtime.tensor_map_2d(
        problem.out_dtype, view.ptr, problem.n, problem.m, view.leading_stride_bytes(1), box, swizzle
    )
