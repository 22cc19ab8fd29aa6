"""Boolean environment variables (JITGEMM_TUNED, JITGEMM_PDL, ...), read one way everywhere."""

from __future__ import annotations

import os

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
