"""The re-layout gate (issue 17): refactors must not change a single kernel.

    python .ci/gate.py record KEYS.json     # before the first step
    python .ci/gate.py check KEYS.json      # after every step: exit 1, listing what changed,
                                            # what is new and what is no longer collected
    python .ci/gate.py check KEYS.json --allow-new   # new kernels expected (a new feature's
                                            # forced configs); every recorded key still holds

(record and check with the same version of this script: it names the keys).

It records the cache key of every kernel `jitgemm precompile --dry-run --json` plans for a broad
set of problems (both archs, both input dtypes, 16-bit and fp32 outputs, all four layouts, with
and without C, M from decode to large, odd sizes) and for every forced configuration of the GPU
tests. A key is a sha256 over the rendered source, the compile options, the arch and the NVRTC
version, so equal keys mean byte-identical kernels (record and check with the same NVRTC). The
checkout is what runs (python -P, cwd = the repository root).
"""

import itertools
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MS, NS, KS = "1,7,64,200,1000,4096", "576,2112,4096,7168,3001", "512,2048,7168"
ARCHS, DTYPES, LAYOUTS = ("sm_90a", "sm_100a"), ("bf16", "fp16"), ("nt", "nn", "tn", "tt")
CLI = "import sys; from jitgemm.cli import main; sys.exit(main())"


def _precompile(args: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CLI, "precompile", *args, "--dry-run", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "", "JITGEMM_CACHE_DIR": tempfile.gettempdir() + "/jitgemm-gate-empty-cache"},
    )
    if out.returncode:
        raise SystemExit(f"precompile {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def _problem_runs() -> list[tuple[str, list[str]]]:
    runs = []
    for arch, dtype, out, layout, c in itertools.product(ARCHS, DTYPES, ("same", "fp32"), LAYOUTS, (False, True)):
        args = (
            [
                "--m",
                MS,
                "--n",
                NS,
                "--k",
                KS,
                "--arch",
                arch,
                "--num-sms",
                "132" if arch == "sm_90a" else "148",
                "--dtype",
                dtype,
                "--layout",
                layout,
            ]
            + (["--out-dtype", "fp32"] if out == "fp32" else [])
            + (["--with-c"] if c else [])
        )
        runs.append((f"{arch}/{dtype}/{out}/{layout}/{'c' if c else 'no_c'}", args))
    return runs


def _forced_configs() -> list[str]:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from test_gpu_configs import all_forced_configs

    return [cfg.to_json() for cfg in all_forced_configs()]


def collect() -> dict:
    keys = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = _problem_runs()
        for (name, _), summary in zip(runs, pool.map(lambda run: _precompile(run[1]), runs)):
            for kernel in summary["kernels"]:
                for p in kernel["problems"]:
                    keys[f"{name}/{p['m']}x{p['n']}x{p['k']}"] = kernel["key"]
    configs = _forced_configs()
    summary = _precompile(["--arch", "sm_90a", "--num-sms", "132"] + [a for c in configs for a in ("--config", c)])
    for kernel in summary["kernels"]:  # (named by kernel: a new config field at its default keeps the name)
        keys[f"forced/{kernel['kernel']}"] = kernel["key"]
    return keys


def main(argv: list[str]) -> int:
    allow_new = "--allow-new" in argv
    argv = [a for a in argv if a != "--allow-new"]
    if len(argv) != 2 or argv[0] not in ("record", "check"):
        print(__doc__)
        return 2
    path = Path(argv[1])
    keys = collect()
    if argv[0] == "record":
        path.write_text(json.dumps(keys, indent=0, sort_keys=True))
        print(f"gate: recorded {len(keys)} problem and config keys ({len(set(keys.values()))} kernels) in {path}")
        return 0
    recorded = json.loads(path.read_text())
    # Every name recorded must be collected now, with its recorded key, and no name may be new
    # (a forced config whose kernel changed gets a new name, where another config may still give
    # the old one), unless --allow-new says the new ones are expected (a new feature's forced
    # configs).
    changed = sorted(name for name in keys.keys() & recorded.keys() if recorded[name] != keys[name])
    new = sorted(keys.keys() - recorded.keys())
    dropped = sorted(recorded.keys() - keys.keys())
    for name in changed[:20]:
        print(f"gate: changed {name}: {recorded[name]} -> {keys[name]}")
    for what, names in (("new", new), ("no longer collected", dropped)):
        for name in names[:20]:
            print(f"gate: {what} {name}")
    print(
        f"gate: {len(keys)} keys ({len(set(keys.values()))} kernels), {len(changed)} changed, "
        f"{len(new)} new{' (allowed)' if allow_new and new else ''}, {len(dropped)} no longer collected"
    )
    return 1 if changed or dropped or (new and not allow_new) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
