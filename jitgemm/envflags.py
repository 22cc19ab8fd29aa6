"""jitgemm's environment variables: the list of them (the README's table and `jitgemm env` read
it), and boolean ones (JITGEMM_TUNED, JITGEMM_DISPATCH_TABLE, JITGEMM_PDL) read one way everywhere."""

from __future__ import annotations

import os
from typing import NamedTuple


class Variable(NamedTuple):
    name: str
    default: str  # what applies when it is unset
    what: str
    tests_only: bool = False  # read by the test suite (.ci/gpu), not by the package


VARIABLES = (
    Variable(
        "JITGEMM_CACHE_DIR",
        "the platform's user cache dir",
        "Root of the kernel cache, the tuning file and the dispatch tables.",
    ),
    Variable("JITGEMM_OFFLINE", "0", "1: never compile; a kernel missing from the cache is an error."),
    Variable(
        "JITGEMM_CONFIG",
        "unset",
        "JSON of KernelConfig fields forced on every call without config= (wins over the tuning file).",
    ),
    Variable("JITGEMM_TUNED", "1", "0: ignore the tuning file (`jitgemm tune`); the heuristics decide."),
    Variable(
        "JITGEMM_DISPATCH_TABLE",
        "1",
        "0: ignore the dispatch tables (`jitgemm precompile`); the heuristics decide.",
    ),
    Variable("JITGEMM_PDL", "1", "0: launch without programmatic dependent launch."),
    Variable("JITGEMM_REQUIRE_GPU", "0", "1: the test run fails when the GPU tests cannot run.", tests_only=True),
    Variable(
        "JITGEMM_TEST_TIMEOUT",
        "0: none (.ci/gpu: 600)",
        "Seconds after which a hanging test is ended.",
        tests_only=True,
    ),
)
NAMES = tuple(v.name for v in VARIABLES)

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def flag(name: str, default: bool) -> bool:
    """The value of environment variable `name` as a bool: `default` when it is unset or empty;
    1/true/yes/on and 0/false/no/off (any case, surrounding spaces ignored); ValueError naming the
    variable for anything else."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ValueError(
        f"{name}={raw!r}: expected one of {', '.join(TRUE)} (on) or {', '.join(FALSE)} (off), case-insensitive"
    )
