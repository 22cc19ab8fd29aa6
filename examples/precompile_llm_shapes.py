"""Precompile the kernels of common LLM layers (examples/llm_shapes.txt) into the jitgemm cache.

    python examples/precompile_llm_shapes.py [precompile options]

e.g. `--jobs 2`, `--dtype fp16`, `--arch sm_90a --num-sms 132` (to build on a machine without
the target GPU), `--dry-run` or `--json`. The same as `jitgemm precompile examples/llm_shapes.txt`.
Run it once at deployment; later processes (even with JITGEMM_OFFLINE=1) load from the cache.
"""

import sys
from pathlib import Path

from jitgemm.cli import main

SHAPES = Path(__file__).with_name("llm_shapes.txt")

if __name__ == "__main__":
    main(["precompile", str(SHAPES), *sys.argv[1:]], prog_name="jitgemm")
