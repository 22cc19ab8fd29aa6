"""What a test's child Python process needs to import the jitgemm under test."""

import os
from pathlib import Path

import jitgemm


def child_pythonpath() -> str:
    """PYTHONPATH for a child process: the directory the tested jitgemm was imported from (the
    checkout, or an install such as .ci/gpu's /tmp/site with its dependencies), then the
    caller's PYTHONPATH."""
    here = str(Path(jitgemm.__file__).resolve().parent.parent)
    return os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
