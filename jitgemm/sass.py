"""Read compiled kernels without a GPU: cuobjdump's SASS and resource usage of a cubin.

Uses the `nvidia-cuda-cuobjdump` / `nvidia-cuda-nvdisasm` wheels (or tools on PATH).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def find_tool(name: str) -> str | None:
    """Path of a CUDA binary tool from the nvidia wheels or PATH, or None."""
    try:
        import nvidia  # optional: the nvidia wheels that ship the tools (a test dependency)

        for root in nvidia.__path__:
            for candidate in Path(root).glob(f"*/bin/{name}"):
                if os.access(candidate, os.X_OK):
                    return str(candidate)
    except ImportError:
        pass
    return shutil.which(name)


@dataclass(frozen=True)
class SassReport:
    sass: str
    registers: int
    stack_bytes: int
    local_loads: int  # LDL instructions
    local_stores: int  # STL instructions
    mma_counts: dict  # opcode -> count, e.g. {"HGMMA": 64}

    @property
    def spills(self) -> bool:
        return self.local_loads > 0 or self.local_stores > 0 or self.stack_bytes > 0


MMA_OPCODES = ("HGMMA", "QGMMA", "UTCHMMA", "UTCQMMA", "UTCMMA", "HMMA")


def inspect_cubin(cubin: bytes) -> SassReport:
    tool = find_tool("cuobjdump")
    if tool is None:
        raise FileNotFoundError("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        env = dict(os.environ)
        # cuobjdump runs nvdisasm for SASS; make the wheel's copy findable.
        nvdisasm = find_tool("nvdisasm")
        if nvdisasm:
            env["PATH"] = str(Path(nvdisasm).parent) + os.pathsep + env.get("PATH", "")
        sass = subprocess.run(
            [tool, "--dump-sass", str(path)], capture_output=True, text=True, env=env, check=True
        ).stdout
        res = subprocess.run(
            [tool, "--dump-resource-usage", str(path)], capture_output=True, text=True, env=env, check=True
        ).stdout
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    opcodes = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass)
    counts: dict[str, int] = {}
    for op in opcodes:
        counts[op] = counts.get(op, 0) + 1
    return SassReport(
        sass=sass,
        registers=int(regs.group(1)) if regs else -1,
        stack_bytes=int(stack.group(1)) if stack else 0,
        local_loads=counts.get("LDL", 0),
        local_stores=counts.get("STL", 0),
        mma_counts={op: counts[op] for op in MMA_OPCODES if op in counts},
    )
