"""The `jitgemm` command line: precompile shape sets, inspect and clean the cache, explain choices.

jitgemm precompile [SHAPES_FILE] [--m LIST --n LIST --k LIST] [--m LIST --model NAME...] [problem options]
                   [--config JSON]... [--jobs N] [--no-table] [--dry-run] [--json]
jitgemm explain M N K [problem options] [--config JSON] [--json]
jitgemm tune [SHAPES_FILE] [--m LIST --n LIST --k LIST] [--dtype] [--out-dtype] [--layout] [--top N] [--device N]
             [--show] [--json]
jitgemm cache dir | list | show KEY | verify | prune (--older-than | --max-size) | clear [--all]
jitgemm env [--json]

Problem options: --dtype, --out-dtype, --layout, --with-c, --arch, --num-sms. The README's "The
CLI" lists every option (a test keeps it in step with the commands).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from fractions import Fraction
from importlib import metadata
from pathlib import Path

import click
from cuda.bindings import driver
from tqdm import tqdm

from . import (
    __version__,
    compiler,
    decode,
    dispatch,
    envflags,
    heuristics,
    kernels,
    plan,
    registry,
    runtime,
    staging,
    tuned,
    tuning,
)
from .cache import (
    DISPATCH_DIR,
    TUNING_NAMES,
    CacheWarning,
    CorruptEntry,
    KernelCache,
    UnsafeError,
    offline_mode,
    read_entry,
)
from .config import ARCHS, KernelConfig, parse_json
from .fixed_kernels import FixedKernel
from .heuristics import DeviceSpec
from .models import MODELS
from .problem import INPUT_DTYPES, LAYOUTS, MAX_DIM, OUTPUT_DTYPES, Problem
from .render import kernel_name

# SM counts assumed when the target arch is not the local GPU's: H100/H200 SXM and B200.
DEFAULT_ARCH = ARCHS[0]  # the target without a GPU or --arch


def _show_warning(message, category, filename, lineno, file=None, line=None):
    label = "warning" if issubclass(category, CacheWarning) else category.__name__
    click.echo(f"jitgemm: {label}: {message}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="jitgemm")
@click.pass_context
def main(ctx: click.Context):
    """JIT-compiled GEMM kernels: precompile shape sets, manage the kernel cache, explain choices."""
    ctx.with_resource(warnings.catch_warnings())  # restores the warning hooks when the command ends
    warnings.showwarning = _show_warning


# ---- option types ----

MAX_SIZES = 1_000_000  # sizes one --m/--n/--k list may give, and shapes their combinations
MANY_SHAPES = 10_000  # precompile notes that choosing kernels for more shapes than this takes time
SHAPES_PER_SECOND = 2000  # a rough rate of choosing kernels, for that note


def parse_int_list(text: str) -> list[int]:
    """'1,128,4096' and ranges 'start:stop[:step]' (stop included when reached) -> sizes."""
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"empty item in {text!r}")
        parts = item.split(":")
        if len(parts) > 3:
            raise ValueError(f"a range is start:stop[:step], got {item!r}")
        try:
            numbers = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"expected integers or start:stop[:step] ranges, got {item!r}") from None
        if len(numbers) == 1:
            values.append(numbers[0])
            continue
        start, stop, step = numbers if len(numbers) == 3 else (*numbers, 1)
        if step < 1 or stop < start:
            raise ValueError(f"range {item!r} needs start <= stop and step >= 1")
        sizes = range(start, stop + 1, step)
        if len(values) + len(sizes) > MAX_SIZES:  # checked before the range is materialised
            raise ValueError(f"{text!r} gives more than {MAX_SIZES} sizes")
        values.extend(sizes)
    bad = [v for v in values if not 1 <= v <= MAX_DIM]
    if bad:
        raise ValueError(f"sizes must be positive and at most {MAX_DIM}, got {bad[0]}")
    return list(dict.fromkeys(values))


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_duration(text: str) -> float:
    """'30d', '12h', '90m', '45s', '2w' -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not match:
        raise ValueError(f"expected a number and a unit (s, m, h, d or w), e.g. 30d, got {text!r}")
    seconds = float(match[1]) * _DURATION_UNITS[match[2]]
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is too long a duration")
    return seconds


def parse_size(text: str) -> int:
    """'2G', '500M', '1.5GiB', '4096' -> bytes (binary multiples)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not match:
        raise ValueError(f"expected a size such as 2G, 500M or 4096 (bytes), got {text!r}")
    size = int(Fraction(match[1]) * _SIZE_UNITS[match[2]])  # exact: no float overflow
    if size >= 1 << 63:
        raise ValueError(f"{text!r} is more than 2^63 - 1 bytes")
    return size


class _Parsed(click.ParamType):
    def __init__(self, name: str, parse):
        self.name, self._parse = name, parse

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


INT_LIST = _Parsed("LIST", parse_int_list)
DURATION = _Parsed("DURATION", parse_duration)
SIZE = _Parsed("SIZE", parse_size)


# ---- target device ----


def _local_gpu():
    try:
        return runtime.device_info(0) if runtime.device_count() > 0 else None
    except Exception:  # no driver, no device: the CLI works without a GPU
        return None


def _target(arch: str | None, num_sms: int | None) -> DeviceSpec:
    """The device to pick kernels for: the flags, else the local GPU, else sm_90a (with a note)."""
    gpu = _local_gpu()
    notes = []
    if arch is None:
        if gpu is not None and gpu.arch is not None:
            arch = gpu.arch
        else:
            arch = DEFAULT_ARCH
            found = (
                f"GPU 0 ({gpu.name}) is compute capability {'.'.join(map(str, gpu.compute_capability))}"
                if gpu is not None
                else "no CUDA GPU found"
            )
            notes.append(f"{found}; targeting {arch} (choose with --arch)")
    if num_sms is None:
        if gpu is not None and gpu.arch == arch:
            num_sms = gpu.num_sms
        else:
            num_sms = registry.get(arch).default_num_sms
            notes.append(f"assuming {num_sms} SMs for {arch} (choose with --num-sms)")
    if notes:
        click.echo("jitgemm: note: " + "; ".join(notes), err=True)
    return DeviceSpec(arch=arch, num_sms=num_sms)


def _target_name(device: DeviceSpec) -> str | None:
    """The name that keys the tuning file for `device`: the local GPU's when it is the target
    (same arch and SM count), else None (the entries of any GPU of that arch and SM count)."""
    gpu = _local_gpu()
    if gpu is not None and gpu.arch == device.arch and gpu.num_sms == device.num_sms:
        return gpu.name
    return None


def _problem_options(func):
    """--dtype, --out-dtype, --layout, --with-c, --arch and --num-sms, shared by precompile and explain."""
    for option in reversed(
        [
            click.option(
                "--dtype",
                type=click.Choice(INPUT_DTYPES),
                default="bf16",
                show_default=True,
                help="Input element type.",
            ),
            click.option(
                "--out-dtype",
                type=click.Choice(OUTPUT_DTYPES),
                default=None,
                help="Output element type [default: --dtype].",
            ),
            click.option(
                "--layout",
                type=click.Choice(sorted(LAYOUTS)),
                default="nt",
                show_default=True,
                help="Operand majors, A then B: n = K-major, t = M-major (A) or N-major (B); "
                "nt is a @ b with both row-major.",
            ),
            click.option(
                "--with-c",
                "has_c",
                is_flag=True,
                help="The problems add beta * C in the epilogue (gemm's c= argument).",
            ),
            click.option(
                "--arch", type=click.Choice(ARCHS), default=None, help="Target [default: the local GPU, else sm_90a]."
            ),
            click.option(
                "--num-sms",
                type=click.IntRange(min=1),
                default=None,
                help="SM count the heuristics plan for [default: the local GPU's, else the arch's usual].",
            ),
        ]
    ):
        func = option(func)
    return func


def _problem(m, n, k, dtype, out_dtype, layout, has_c=False) -> Problem:
    a_major, b_major = LAYOUTS[layout]
    return Problem(m, n, k, dtype, out_dtype or dtype, a_major, b_major, has_c)


def _problem_dict(p: Problem) -> dict:
    return {"m": p.m, "n": p.n, "k": p.k, "dtype": p.dtype, "out_dtype": p.out_dtype, "layout": p.layout, "c": p.has_c}


# ---- shape files ----

SHAPE_FIELDS = ("m", "n", "k")
OPTIONAL_FIELDS = ("dtype", "out_dtype", "layout", "c", "name")  # per-shape overrides; name is a label
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class ShapeSpec:
    m: int
    n: int
    k: int
    dtype: str | None = None
    out_dtype: str | None = None
    layout: str | None = None
    c: bool | None = None  # the problem adds beta * C


def _spec_from_mapping(data: dict, where: str) -> ShapeSpec:
    data = {str(key).strip().lower().replace("-", "_"): value for key, value in data.items()}
    unknown = sorted(set(data) - set(SHAPE_FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        raise ValueError(
            f"{where}: unknown fields {unknown}; expected m, n, k and optionally {', '.join(OPTIONAL_FIELDS)}"
        )
    missing = [f for f in SHAPE_FIELDS if data.get(f) in (None, "")]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    sizes = [_size(data[f], f"{where}: {f}") for f in SHAPE_FIELDS]
    extra = {
        f: (str(data[f]).strip() or None) if data.get(f) is not None else None for f in ("dtype", "out_dtype", "layout")
    }
    return ShapeSpec(*sizes, **extra, c=_flag(data.get("c"), f"{where}: c"))


def _flag(value, where: str) -> bool | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise ValueError(f"{where} must be true or false, got {value!r}")


def _size(value, where: str) -> int:
    try:
        size = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        size = None
    if size is None or size < 1:
        raise ValueError(f"{where} must be a positive integer, got {value!r}")
    return size


def read_shape_file(path: Path) -> list[ShapeSpec]:
    """Shapes from a file: JSON (a list of [M, N, K] or {"m", "n", "k", ...} objects), CSV (with
    an m,n,k[,dtype,out_dtype,layout,name] header or three bare columns) or text (one `M N K` per
    line, `#` starts a comment)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: not a text shape file (byte 0x{exc.object[exc.start]:02x} at offset {exc.start} is not UTF-8)"
        ) from None
    suffix = path.suffix.lower()
    if suffix == ".json":
        data = parse_json(text, str(path))
        if isinstance(data, dict) and "shapes" in data:
            data = data["shapes"]
        if not isinstance(data, list):
            raise ValueError(f'{path}: expected a list of shapes (or {{"shapes": [...]}})')
        specs = []
        for i, item in enumerate(data):
            where = f"{path}: shape {i}"
            if isinstance(item, dict):
                specs.append(_spec_from_mapping(item, where))
            elif isinstance(item, list) and len(item) == 3:
                specs.append(ShapeSpec(*(_size(v, f"{where}: {f}") for v, f in zip(item, SHAPE_FIELDS))))
            else:
                raise ValueError(f"{where}: expected [M, N, K] or an object with m, n, k, got {item!r}")
        return specs
    if suffix == ".csv":
        rows = [
            (i, row)
            for i, row in enumerate(csv.reader(text.splitlines()), 1)
            if row and not row[0].lstrip().startswith("#")
        ]
        if not rows:
            return []
        header = None
        if not rows[0][1][0].strip().isdigit():
            header = [h.strip() for h in rows[0][1]]
            rows = rows[1:]
        specs = []
        for lineno, row in rows:
            where = f"{path}:{lineno}"
            if header is not None:
                if len(row) != len(header):
                    raise ValueError(f"{where}: {len(row)} columns, the header has {len(header)}")
                specs.append(_spec_from_mapping(dict(zip(header, row)), where))
            elif len(row) == 3:
                specs.append(ShapeSpec(*(_size(v, f"{where}: {f}") for v, f in zip(row, SHAPE_FIELDS))))
            else:
                raise ValueError(f"{where}: expected M,N,K, got {','.join(row)!r}")
        return specs
    specs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].replace(",", " ").split()
        if not fields:
            continue
        if len(fields) != 3:
            raise ValueError(f"{path}:{lineno}: expected 'M N K', got {line.strip()!r}")
        specs.append(ShapeSpec(*(_size(v, f"{path}:{lineno}: {f}") for v, f in zip(fields, SHAPE_FIELDS))))
    return specs


def _resolve_specs(
    specs: list[ShapeSpec], dtype: str, out_dtype: str | None, layout: str, has_c: bool = False
) -> list[Problem]:
    problems = []
    for spec in specs:
        d = spec.dtype or dtype
        lay = spec.layout or layout
        try:
            if lay not in LAYOUTS:
                raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, got {lay!r}")
            problems.append(
                _problem(
                    spec.m,
                    spec.n,
                    spec.k,
                    d,
                    spec.out_dtype or out_dtype or d,
                    lay,
                    has_c if spec.c is None else spec.c,
                )
            )
        except ValueError as exc:
            raise ValueError(f"shape {spec.m} {spec.n} {spec.k}: {exc}") from None
    return list(dict.fromkeys(problems))


# ---- precompile ----


def _shape_problems(
    shapes_file,
    ms,
    ns,
    ks,
    dtype,
    out_dtype,
    layout,
    other_sources: str | None,
    has_c: bool = False,
    models: tuple = (),
) -> list[Problem]:
    """The problems of --m/--n/--k (every combination), of --m with each (N, K) of the --model
    presets, and of SHAPES_FILE; UsageError for a bad file or flag, and for no shapes at all
    unless `other_sources` is None (the command has other work, e.g. precompile's --config);
    `other_sources` ends the "give ..." hint."""
    pairs = list(dict.fromkeys(pair for name in models for pair in MODELS[name].pairs))
    if pairs and ms is None:
        raise click.UsageError("--model needs --m: the M sizes (tokens per call) to cover, e.g. --m 1:8192")
    given = {"--m": ms, "--n": ns, "--k": ks}
    if pairs and ns is None and ks is None:
        given = {}  # --m goes with the presets' N and K
    if any(v is not None for v in given.values()) and not all(v is not None for v in given.values()):
        missing = [name for name, v in given.items() if v is None]
        raise click.UsageError(f"--m, --n and --k go together; missing {', '.join(missing)}")
    if ns is not None and ks is not None:
        pairs = [(n, k) for n in ns for k in ks] + [p for p in pairs if p[0] not in ns or p[1] not in ks]
    if ms is not None and len(ms) * len(pairs) > MAX_SIZES:
        flags = "--m, --n and --k" if not models else "--m and --model" if ns is None else "--m, --n, --k and --model"
        raise click.UsageError(
            f"{flags} give {len(ms) * len(pairs)} shapes, more than {MAX_SIZES}; precompile fewer at a time"
        )
    specs = [ShapeSpec(m, n, k) for m in ms for n, k in pairs] if ms is not None else []
    if shapes_file is not None:
        try:
            from_file = read_shape_file(shapes_file)
        except (OSError, ValueError) as exc:
            raise click.UsageError(str(exc)) from None
        if not from_file:
            raise click.UsageError(f"{shapes_file}: the shape file is empty (no shapes, only blank or comment lines)")
        specs += from_file
    if not specs and other_sources is not None:
        raise click.UsageError(f"no shapes: give --m, --n and --k, {other_sources}")
    try:
        return _resolve_specs(specs, dtype, out_dtype, layout, has_c)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _parse_config(text: str) -> KernelConfig:
    """A --config JSON object as a KernelConfig that its arch can lay out (the structural rules
    and the shared memory: what can be checked without a problem); BadParameter naming
    --config otherwise, before anything is compiled."""
    try:
        cfg = KernelConfig.from_dict(parse_json(text, "KernelConfig JSON"))
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(f"{exc} (in {text!r})", param_hint="--config") from None
    reasons = structural_problems(cfg)
    if reasons:
        raise click.BadParameter(
            f"{cfg.name} cannot be built: {'; '.join(reasons)} (in {text!r})", param_hint="--config"
        )
    return cfg


def structural_problems(cfg: KernelConfig) -> list[str]:
    """Why `cfg` cannot be laid out on its arch, whatever the problem: the arch's structural
    rules, then its shared memory against the arch's capacity."""
    arch = registry.get(cfg.arch)
    reasons = arch.structural_problems(cfg)
    if not reasons:
        lay = arch.layout_of(cfg)
        if lay.smem_bytes > arch.smem_capacity:
            reasons.append(
                f"needs {lay.smem_bytes} bytes of shared memory ({cfg.num_stages} stages), more than the "
                f"{arch.smem_capacity} of {cfg.arch}"
            )
    return reasons


def _build_one(config: KernelConfig) -> dict:
    start = time.perf_counter()
    try:
        built = kernels.build(config)
    except Exception as exc:  # reported per kernel; the others still compile
        return {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}",
            "seconds": round(time.perf_counter() - start, 4),
        }
    result = built.cache
    return {
        "status": "hit" if result.hit else "compiled",
        "key": result.key,
        "seconds": round(time.perf_counter() - start, 4),
        "compile_seconds": round(result.compile_seconds, 4),
        "cached": result.path is not None,
    }


# The kernels of one source that calls beside the GEMMs use: summary key -> (kernel, what it is).
FIXED_KERNELS = {
    "staging": (staging.KERNEL, "operand staging kernel"),  # operands TMA cannot read in place
    # a few rows against a weight TMA cannot read: row-major, K-major
    "decode": (decode.ROWS.kernel, "decode kernel"),
    "decode_cols": (decode.COLS.kernel, "K-major decode kernel"),
}


def _build_fixed(kernel: FixedKernel, arch: str) -> dict:
    """_build_one's record for a fixed-source kernel (FIXED_KERNELS) of `arch`."""
    start = time.perf_counter()
    try:
        result = kernel.build(arch)
    except Exception as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    return {
        "status": "hit" if result.hit else "compiled",
        "key": result.key,
        "seconds": round(time.perf_counter() - start, 4),
        "cached": result.path is not None,
    }


def _lookup_one(cache: KernelCache, config: KernelConfig) -> dict:
    try:
        key = kernels.prepare(config).key
    except Exception as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    found = cache.lookup(key, touch=False)
    record = {"status": found.status, "key": key}
    if found.reason:
        record["reason"] = found.reason
    return record


@main.command()
@click.argument("shapes_file", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--m", "ms", type=INT_LIST, help="M sizes: 1,128,4096 and/or ranges start:stop:step (stop included).")
@click.option("--n", "ns", type=INT_LIST, help="N sizes, as for --m.")
@click.option("--k", "ks", type=INT_LIST, help="K sizes, as for --m.")
@click.option(
    "--model",
    "models",
    multiple=True,
    type=click.Choice(sorted(MODELS), case_sensitive=False),
    help="The (N, K) of this model's linear layers (fused QKV, O, gate_up, down), each with every --m. Repeatable.",
)
@_problem_options
@click.option(
    "--config",
    "configs",
    multiple=True,
    metavar="JSON",
    help='Also build this exact KernelConfig (a JSON object such as `explain --json` prints as "chosen"). Repeatable.',
)
@click.option(
    "--jobs", "-j", type=click.IntRange(min=1), default=None, help="Parallel compiles [default: the number of CPUs]."
)
@click.option(
    "--no-table",
    is_flag=True,
    help="Do not record the heuristics' choices in the dispatch table (written by default).",
)
@click.option(
    "--dry-run", is_flag=True, help="List the distinct kernels and whether they are cached; compile and write nothing."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def precompile(
    shapes_file,
    ms,
    ns,
    ks,
    models,
    dtype,
    out_dtype,
    layout,
    has_c,
    arch,
    num_sms,
    configs,
    jobs,
    no_table,
    dry_run,
    as_json,
):
    """Compile the kernels a shape set needs into the cache, and record the heuristics'
    choices in the dispatch table, from which later processes answer those shapes without
    running the cost model.

    Shapes come from --m/--n/--k (every combination), --m with --model (each layer of the
    model) and/or SHAPES_FILE: one `M N K` per line, a CSV with an m,n,k header, or a JSON list;
    file entries may set their own dtype, out_dtype, layout and c (true: the problem adds
    beta * C). A second run of the same set compiles nothing.
    """
    models = tuple(dict.fromkeys(name.lower() for name in models))
    problems = _shape_problems(
        shapes_file,
        ms,
        ns,
        ks,
        dtype,
        out_dtype,
        layout,
        "--m and --model, a SHAPES_FILE, or --config" if not configs else None,
        has_c,
        models,
    )
    exact = [_parse_config(text) for text in configs]
    try:
        offline = offline_mode()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if offline and not dry_run:
        raise click.ClickException(
            "JITGEMM_OFFLINE=1 forbids compiling; unset it to precompile (or use --dry-run to list what is missing)"
        )
    device = _target(arch, num_sms) if problems else None

    # Map shapes to distinct kernels; a shape the heuristics reject is reported, not fatal.
    # The same precedence as gemm: JITGEMM_CONFIG, the tuning file, the dispatch table, the heuristics.
    users: dict[KernelConfig, list[Problem]] = {c: [] for c in exact}
    sources: dict[str, int] = {}
    chosen_by: dict[Problem, str] = {}
    select_errors: dict[str, list[Problem]] = {}
    select_start = time.perf_counter()
    name = _target_name(device) if device else None
    if len(problems) > MANY_SHAPES:
        click.echo(
            f"jitgemm: note: {len(problems)} shapes: choosing a kernel for each takes a while "
            f"(roughly {len(problems) / SHAPES_PER_SECOND:.0f} s at {SHAPES_PER_SECOND} shapes/s)",
            err=True,
        )
    bar = tqdm(problems, desc="jitgemm: choosing kernels", unit="shape", file=sys.stderr, disable=None, leave=False)
    for p in bar:
        try:
            cfg, source = plan.choose(p, device, name)
        except Exception as exc:
            select_errors.setdefault(f"{type(exc).__name__}: {exc}", []).append(p)
            continue
        users.setdefault(cfg, []).append(p)
        sources[source] = sources.get(source, 0) + 1
        chosen_by[p] = source
    bar.close()

    select_seconds = time.perf_counter() - select_start
    cache = kernels.default_cache()
    start = time.perf_counter()
    configs_list = list(users)
    if dry_run:
        records = [_lookup_one(cache, c) for c in configs_list]
        fixed_records: dict = {name: {} for name in FIXED_KERNELS}
    else:
        records = _build_all(configs_list, jobs or os.cpu_count() or 1)
        archs = sorted({cfg.arch for cfg in configs_list})
        fixed_records = {
            name: {arch: _build_fixed(k, arch) for arch in archs} for name, (k, _) in FIXED_KERNELS.items()
        }
    wall = time.perf_counter() - start
    for cfg, record in zip(configs_list, records):
        record.update(kernel=kernel_name(cfg), config=cfg.to_dict(), problems=[_problem_dict(p) for p in users[cfg]])
    table = None
    if device is not None:
        # The heuristics' own choices (the table's, which are theirs too) of the kernels that built.
        chosen = [
            (p, cfg)
            for cfg, record in zip(configs_list, records)
            if record["status"] != "error"
            for p in users[cfg]
            if chosen_by.get(p) in dispatch.RECORDED_SOURCES
        ]
        if dry_run or no_table:
            why = "dry run" if dry_run else "--no-table"
            table = dispatch.Recorded(dispatch.table_path(device), False, why, len(chosen)).to_dict()
        else:
            table = dispatch.record(chosen, device).to_dict()
    summary = {
        "arch": device.arch if device else None,
        "num_sms": device.num_sms if device else None,
        "cache_root": str(cache.root),
        "dry_run": dry_run,
        "shapes": len(problems),
        "sources": sources,
        "kernels": records,
        "select_errors": [{"error": e, "problems": [_problem_dict(p) for p in ps]} for e, ps in select_errors.items()],
        "compiled": sum(r["status"] == "compiled" for r in records),
        "hits": sum(r["status"] == "hit" for r in records),
        "failed": sum(r["status"] == "error" for r in records)
        + sum(r["status"] == "error" for built in fixed_records.values() for r in built.values()),
        **fixed_records,
        "uncached": sum(r["status"] == "compiled" and not r["cached"] for r in records),
        "models": {name: [list(pair) for pair in MODELS[name].pairs] for name in models},
        "table": table,
        "select_seconds": round(select_seconds, 3),
        "wall_seconds": round(wall, 3),
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        _print_precompile(summary, device)
    if summary["failed"] or summary["uncached"] or select_errors:
        sys.exit(1)


def _build_all(configs: list[KernelConfig], jobs: int) -> list[dict]:
    records: list = [None] * len(configs)
    # Threads suffice: NVRTC releases the GIL while it compiles.
    with (
        ThreadPoolExecutor(max_workers=jobs) as pool,
        tqdm(
            total=len(configs), desc="jitgemm precompile", unit="kernel", file=sys.stderr, disable=None, leave=False
        ) as bar,
    ):
        futures = {pool.submit(_build_one, cfg): i for i, cfg in enumerate(configs)}
        for future in as_completed(futures):
            records[futures[future]] = future.result()
            bar.update()
    return records


def _print_precompile(summary: dict, device: DeviceSpec | None) -> None:
    target = f" for {device.arch} ({device.num_sms} SMs)" if device else ""
    click.echo(
        f"{summary['shapes']} shapes -> {len(summary['kernels'])} kernels{target}; cache {summary['cache_root']}"
    )
    chosen_by = {k: v for k, v in summary["sources"].items() if k != "heuristics"}
    if chosen_by:
        click.echo(
            "configs from "
            + ", ".join(f"{plan.SOURCE_TEXT[k]}: {v} shape{'s' if v != 1 else ''}" for k, v in chosen_by.items())
        )
    labels = {"hit": "cached", "miss": "missing"}
    for r in summary["kernels"]:
        status = labels.get(r["status"], r["status"]) if summary["dry_run"] else r["status"]
        if r["status"] == "compiled" and not r["cached"]:
            status = "uncached"
        count = len(r["problems"])
        uses = f"({count} shape{'s' if count != 1 else ''})" if count else "(--config)"
        timing = f"{r['seconds']:6.2f} s  " if "seconds" in r else ""
        key = r.get("key", "?" * 16)[:16]
        click.echo(f"  {status:9} {timing}{key}  {r['kernel']}  {uses}")
        if r["status"] == "error" or r.get("reason"):
            click.echo("      " + (r.get("error") or r["reason"]).replace("\n", "\n      "), err=True)
    for name, (_, what) in FIXED_KERNELS.items():
        for arch, r in summary.get(name, {}).items():
            click.echo(f"  {r['status']:9} {what} for {arch}")
            if r["status"] == "error":
                click.echo("      " + r["error"].replace("\n", "\n      "), err=True)
    for e in summary["select_errors"]:
        click.echo(
            f"error: no kernel for {len(e['problems'])} shape(s), e.g. "
            f"{e['problems'][0]['m']} {e['problems'][0]['n']} {e['problems'][0]['k']}: {e['error']}",
            err=True,
        )
    for name, pairs in summary["models"].items():
        click.echo(f"--model {name}: (N, K) = {', '.join(f'({n}, {k})' for n, k in pairs)}")
    table = summary["table"]
    if summary["dry_run"]:
        missing = sum(r["status"] != "hit" for r in summary["kernels"])
        recorded = f"; the dispatch table would record {table['shapes']} shapes" if table and table["shapes"] else ""
        click.echo(f"dry run: {missing} to compile, {summary['hits']} already cached{recorded}")
    else:
        if summary["uncached"]:
            click.echo(
                f"error: {summary['uncached']} kernel(s) could not be stored in the cache (see the warning above)",
                err=True,
            )
        click.echo(
            f"{summary['compiled']} compiled, {summary['hits']} already cached, "
            f"{summary['failed']} failed in {summary['wall_seconds']:.2f} s "
            f"(choosing the kernels took {summary['select_seconds']:.2f} s)"
        )
        if table and table["written"]:
            click.echo(
                f"dispatch table {table['path']}: {table['shapes']} shapes recorded; it holds {table['runs']} M "
                f"runs of {table['configs']} configs over {table['problems']} (N, K, dtypes, layout) combinations"
            )
        elif table and table["reason"] not in ("--no-table", "no shapes to record"):
            click.echo(f"jitgemm: warning: the dispatch table was not written: {table['reason']}", err=True)
        if table and table["note"]:
            click.echo(f"jitgemm: note: dispatch table {table['path']}: {table['note']}", err=True)


# ---- explain ----


@main.command()
@click.argument("m", type=click.IntRange(min=1, max=MAX_DIM))
@click.argument("n", type=click.IntRange(min=1, max=MAX_DIM))
@click.argument("k", type=click.IntRange(min=1, max=MAX_DIM))
@_problem_options
@click.option(
    "--config",
    "config_text",
    metavar="JSON",
    default=None,
    help="Check this exact KernelConfig against the problem, as gemm's config= does.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
def explain(m, n, k, dtype, out_dtype, layout, has_c, arch, num_sms, config_text, as_json):
    """Show the kernel an M x N x K GEMM gets and where the choice came from (--config, then
    JITGEMM_CONFIG, then the tuning file, then the dispatch table, then the heuristics, as for
    gemm), the heuristics' best candidates and why others were rejected."""
    try:
        problem = _problem(m, n, k, dtype, out_dtype, layout, has_c)
    except ValueError as exc:  # M x N beyond what the kernels count
        raise click.UsageError(str(exc)) from None
    forced = _parse_config(config_text) if config_text is not None else None
    device = _target(arch, num_sms)
    explain_fn = getattr(heuristics, "explain", None)
    if explain_fn is None:
        raise click.ClickException("this version of jitgemm.heuristics has no explain()")
    try:
        chosen, source = plan.choose(problem, device, _target_name(device), forced)
    except ValueError as exc:  # the --config given, or JITGEMM_CONFIG, cannot run the problem
        if forced is not None:
            raise click.BadParameter(str(exc), param_hint="--config") from None
        raise click.ClickException(str(exc)) from None
    try:
        report = explain_fn(problem, device, top=5)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    report = dict(report)
    if source != "heuristics":
        report["heuristics_choice"] = report.get("chosen")
        report["chosen"] = chosen.to_dict()
    report["source"] = source
    if source == "table":
        report["table"] = str(dispatch.table_path(device))
    note = decode.explain_note(problem) if source not in ("argument", "env") else None
    if note is not None:
        report["decode"] = note
    if as_json:
        try:
            click.echo(json.dumps(report, indent=2))
        except TypeError as exc:
            raise click.ClickException(f"heuristics.explain returned something that is not JSON: {exc}") from None
    else:
        click.echo(format_explanation(report))


@main.command()
@click.argument("shapes_file", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--m", "ms", type=INT_LIST, help="M sizes: 1,128,4096 and/or ranges start:stop:step (stop included).")
@click.option("--n", "ns", type=INT_LIST, help="N sizes, as for --m.")
@click.option("--k", "ks", type=INT_LIST, help="K sizes, as for --m.")
@click.option("--dtype", type=click.Choice(INPUT_DTYPES), default="bf16", show_default=True, help="Input element type.")
@click.option(
    "--out-dtype", type=click.Choice(OUTPUT_DTYPES), default=None, help="Output element type [default: --dtype]."
)
@click.option(
    "--layout",
    type=click.Choice(sorted(LAYOUTS)),
    default="nt",
    show_default=True,
    help="Operand majors, as for precompile.",
)
@click.option(
    "--top",
    type=click.IntRange(min=1, max=32),
    default=6,
    show_default=True,
    help="Modelled candidates to time (each split-K one also unsplit).",
)
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True, help="GPU ordinal.")
@click.option("--show", is_flag=True, help="List the tuning file's entries; time nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def tune(shapes_file, ms, ns, ks, dtype, out_dtype, layout, top, device, show, as_json):
    """Time the heuristics' best candidates for each shape on a local GPU and record the
    fastest (if it beats the heuristics' choice by 2% in every pass) in the tuning file,
    which gemm then follows for those shapes (JITGEMM_TUNED=0 ignores it). Shapes as for
    precompile: --m/--n/--k and/or SHAPES_FILE."""
    if show:
        entries = tuned.read_entries()
        if as_json:
            click.echo(json.dumps({"path": str(tuned.tuning_path()), "devices": entries}, indent=2))
            return
        for dev_key, records in sorted(entries.items()):
            click.echo(dev_key)
            for prob, rec in sorted(records.items()):
                if not isinstance(rec, dict) or not isinstance(rec.get("times_us", {}), dict):
                    click.echo(f"  {prob}: malformed record (ignored by gemm)")
                    continue
                first = rec.get("heuristics_choice")
                click.echo(
                    f"  {prob}: {rec.get('name')} {rec.get('us')} us (heuristics: {first}, "
                    f"{rec.get('times_us', {}).get(first, '?')} us; {rec.get('date')})"
                )
        click.echo(f"{sum(len(r) for r in entries.values())} entries in {tuned.tuning_path()}")
        return
    problems = _shape_problems(shapes_file, ms, ns, ks, dtype, out_dtype, layout, "or a SHAPES_FILE")
    if device >= runtime.device_count():
        raise click.ClickException(f"--device {device}: tuning needs a local GPU; found {runtime.device_count()}")
    results = []
    for p in problems:
        try:
            r = tuning.tune(p, device=device, top=top)
        except Exception as exc:
            raise click.ClickException(f"tuning {p.describe()} failed: {type(exc).__name__}: {exc}") from None
        first = r.chosen_by_heuristics
        results.append(
            {
                "problem": _problem_dict(p),
                "best": r.best.name,
                "best_us": round(r.times_us[r.best.name], 3),
                "heuristics_choice": first,
                "heuristics_us": round(r.times_us[first], 3),
                "times_us": {k: round(v, 3) for k, v in r.times_us.items()},
            }
        )
        if not as_json:
            gain = r.times_us[first] / r.times_us[r.best.name]
            click.echo(
                f"{p.describe()}: {r.best.name} {r.times_us[r.best.name]:.2f} us; the heuristics' "
                f"{first} {r.times_us[first]:.2f} us ({gain:.3f}x)"
            )
    if as_json:
        click.echo(json.dumps({"path": str(tuned.tuning_path()), "results": results}, indent=2))
    else:
        click.echo(f"recorded in {tuned.tuning_path()}")


def _config_label(config) -> str:
    if isinstance(config, dict):
        try:
            return KernelConfig.from_dict(config).name
        except (ValueError, TypeError):
            return ", ".join(f"{k}={v}" for k, v in config.items())
    return str(config)


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return " ".join(f"{k}={_value(x)}" for k, x in v.items())
    return str(v)


MAX_REJECTED_SHOWN = 12


def format_explanation(report: dict) -> str:
    """Human-readable text from whatever keys `heuristics.explain` returned."""
    lines = []
    for key in ("problem", "device"):
        if key in report:
            lines.append(f"{key + ':':10} {_value(report[key])}")
    if "chosen" in report:
        lines.append(f"{'chosen:':10} {_config_label(report['chosen'])}")
    if "source" in report:
        lines.append(f"{'source:':10} {plan.SOURCE_TEXT.get(report['source'], report['source'])}")
    if "heuristics_choice" in report:
        same = report["heuristics_choice"] == report.get("chosen")  # a table's choice is theirs
        lines.append(
            f"{'heuristics:':10} {_config_label(report['heuristics_choice'])} ({'the same' if same else 'not used'})"
        )
    candidates = report.get("candidates") or []
    if candidates:
        lines.append("candidates (best first):")
        for i, cand in enumerate(candidates, 1):
            label = cand.get("name") or _config_label(cand.get("config"))
            cost = cand.get("cost")
            cost_text = f"cost {_value(cost)}  " if cost is not None else ""
            lines.append(f"  {i}. {cost_text}{label}")
            terms = {k: v for k, v in cand.items() if k not in ("config", "name", "cost")}
            if terms:
                lines.append("       " + _value(terms))
    rejected = report.get("rejected") or []
    if rejected:
        lines.append(f"rejected ({len(rejected)}):")
        for r in rejected[:MAX_REJECTED_SHOWN]:
            lines.append(f"  {_config_label(r.get('config'))}: {r.get('rule', '')}")
        if len(rejected) > MAX_REJECTED_SHOWN:
            lines.append(f"  ... and {len(rejected) - MAX_REJECTED_SHOWN} more (all of them with --json)")
    for key, value in report.items():
        if key not in ("problem", "device", "chosen", "source", "heuristics_choice", "candidates", "rejected"):
            lines.append(f"{key + ':':10} {_value(value)}")
    return "\n".join(lines)


# ---- cache ----


def _human_bytes(n: int) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, i = float(n), 0
    while value >= 1024 and i < len(units) - 1:
        value, i = value / 1024, i + 1
    return f"{n} B" if i == 0 else f"{value:.1f} {units[i]}"


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{max(seconds, 0):.0f}s ago"


def _cache_call(fn, *args, **kwargs):
    """Run a cache operation, turning a refused or unreadable root into a clean error."""
    try:
        return fn(*args, **kwargs)
    except (UnsafeError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


def _process_nvrtc() -> str | None:
    """This process's NVRTC version, None when NVRTC cannot be loaded."""
    try:
        return compiler.nvrtc_version()
    except Exception:  # no NVRTC: entries are listed without the comparison
        return None


def _usable_text(e, nvrtc: str | None) -> str:
    why = e.unusable_reason(nvrtc)
    return "yes" if why is None else f"no ({why})"


def _entry_dict(e, nvrtc: str | None = None) -> dict:
    meta = e.meta or {}
    why = e.unusable_reason(nvrtc)
    return {
        "key": e.key,
        "kernel": e.kernel,
        "arch": meta.get("arch"),
        "config": meta.get("config"),
        "size_bytes": e.size_bytes,
        "last_used": e.last_used,
        "created": meta.get("created"),
        "nvrtc_version": meta.get("nvrtc_version"),
        "usable": why is None,
        "unusable_reason": why,
        "compile_seconds": meta.get("compile_seconds"),
        "path": str(e.path),
        "problem": e.problem,
    }


@main.group("cache")
def cache_group():
    """Inspect and clean the kernel cache (JITGEMM_CACHE_DIR moves it)."""


@cache_group.command("dir")
def cache_dir():
    """Print the cache root."""
    click.echo(str(KernelCache().root))


@cache_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--sort",
    type=click.Choice(["age", "size"]),
    default="age",
    show_default=True,
    help="age: most recently used first; size: largest first.",
)
def cache_list(as_json, sort):
    """List the cache entries, with the NVRTC that built each; entries this process cannot
    load (built by another NVRTC or jitgemm) are marked unusable."""
    cache = KernelCache()
    entries = _cache_call(cache.entries)
    nvrtc = _process_nvrtc()
    if sort == "size":
        entries.sort(key=lambda e: (-e.size_bytes, e.key))
    else:
        entries.sort(key=lambda e: (-e.last_used, e.key))
    total = sum(e.size_bytes for e in entries)
    tables = dispatch.describe(cache.root)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "root": str(cache.root),
                    "nvrtc_version": nvrtc,
                    "count": len(entries),
                    "usable": sum(e.unusable_reason(nvrtc) is None for e in entries),
                    "total_bytes": total,
                    "entries": [_entry_dict(e, nvrtc) for e in entries],
                    "dispatch_tables": tables,
                },
                indent=2,
            )
        )
        return
    now = time.time()
    unusable = 0
    for e in entries:
        why = e.unusable_reason(nvrtc)
        unusable += why is not None
        note = f"  (usable: no, {why})" if why else ""
        click.echo(
            f"{e.key[:16]}  {_human_bytes(e.size_bytes):>10}  {_ago(now - e.last_used):>8}  "
            f"nvrtc {e.nvrtc_version or '?':6} {e.kernel}{note}"
        )
    click.echo(f"{len(entries)} entries, {_human_bytes(total)} in {cache.root}")
    if unusable:
        click.echo(
            f"{unusable} of them cannot be used by this process (NVRTC {nvrtc or 'unavailable'}): "
            "the NVRTC version is part of the cache key, so `jitgemm precompile` builds them again for this one"
        )
    for t in tables:
        click.echo(f"dispatch table {t['path']}: {_table_text(t)}")


def _table_text(t: dict) -> str:
    if t["status"] != "ok":
        return t["status"]
    return (
        f"{t['shapes']} shapes in {t['runs']} M runs of {t['configs']} configs over {t['problems']} "
        f"(N, K, dtypes, layout) combinations ({t['arch']}, {t['num_sms']} SMs)"
    )


@cache_group.command("show")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True)
def cache_show(key, as_json):
    """Show one entry (KEY may be a unique prefix) and check its hashes (exit status 1 if bad)."""
    cache = KernelCache()
    try:
        e = _cache_call(cache.find, key)
    except KeyError as exc:
        raise click.ClickException(exc.args[0]) from None
    try:
        read_entry(e.path, e.key, check_source=True)
        problem = None
    except (UnsafeError, CorruptEntry, OSError) as exc:
        problem = str(exc)
    nvrtc = _process_nvrtc()
    files = {}
    if not e.path.is_symlink() and e.path.is_dir():  # never list through a link
        with os.scandir(e.path) as items:
            files = {f.name: f.stat(follow_symlinks=False).st_size for f in items}
    if as_json:
        click.echo(
            json.dumps(
                {
                    "key": e.key,
                    "path": str(e.path),
                    "status": "bad" if problem else "ok",
                    "problem": problem,
                    "nvrtc_version": e.nvrtc_version,
                    "usable": e.unusable_reason(nvrtc) is None and problem is None,
                    "unusable_reason": problem or e.unusable_reason(nvrtc),
                    "files": files,
                    "last_used": e.last_used,
                    "meta": e.meta,
                },
                indent=2,
            )
        )
        sys.exit(1 if problem else 0)
    click.echo(f"{'key:':16} {e.key}\n{'path:':16} {e.path}\n{'status:':16} {'BAD: ' + problem if problem else 'ok'}")
    usable = "no (corrupt)" if problem else _usable_text(e, nvrtc)
    click.echo(f"{'usable:':16} {usable}")
    for name, size in sorted(files.items()):
        click.echo(f"{'file:':16} {name} ({_human_bytes(size)})")
    for name, value in sorted((e.meta or {}).items()):
        if name == "created" and isinstance(value, (int, float)):
            value = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
        elif isinstance(value, (dict, list)):
            value = json.dumps(value)
        if name != "key":
            click.echo(f"{name + ':':16} {value}")
    if problem:
        sys.exit(1)


@cache_group.command("verify")
@click.option("--json", "as_json", is_flag=True)
def cache_verify(as_json):
    """Re-hash every entry and name the bad ones (exit status 1 if any)."""
    cache = KernelCache()
    report = _cache_call(cache.verify)
    bad = [(e, why) for e, why in report if why]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "root": str(cache.root),
                    "checked": len(report),
                    "bad": [{"key": e.key, "kernel": e.kernel, "path": str(e.path), "reason": why} for e, why in bad],
                },
                indent=2,
            )
        )
    else:
        for e, why in bad:
            click.echo(f"BAD  {e.key}  {e.kernel}: {why}")
        click.echo(f"{len(report)} entries checked, {len(bad)} bad ({cache.root})")
    if bad:
        sys.exit(1)


@cache_group.command("prune")
@click.option("--older-than", type=DURATION, default=None, help="Remove entries unused for this long (30d, 12h, ...).")
@click.option(
    "--max-size", type=SIZE, default=None, help="Then remove the least recently used until this size (2G, 500M)."
)
@click.option("--dry-run", is_flag=True, help="Only list what would be removed.")
@click.option("--json", "as_json", is_flag=True)
def cache_prune(older_than, max_size, dry_run, as_json):
    """Remove old entries and temporary leftovers; never anything outside the cache root.
    Give --older-than and/or --max-size (there is no default)."""
    if older_than is None and max_size is None:
        raise click.UsageError(
            "prune has no default: give --older-than DURATION (e.g. 30d) and/or --max-size SIZE (e.g. 2G)"
        )
    cache = KernelCache()
    removed = _cache_call(cache.prune, older_than=older_than, max_size=max_size, dry_run=dry_run)
    freed = sum(e.size_bytes for e in removed)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "root": str(cache.root),
                    "dry_run": dry_run,
                    "freed_bytes": freed,
                    "removed": [_entry_dict(e) for e in removed],
                },
                indent=2,
            )
        )
        return
    verb = "would remove" if dry_run else "removed"
    for e in removed:
        click.echo(f"{verb}  {e.key[:16]}  {_human_bytes(e.size_bytes):>10}  {e.kernel}")
    click.echo(f"{verb} {len(removed)} entries, {_human_bytes(freed)} ({cache.root})")


@cache_group.command("clear")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--all", "everything", is_flag=True, help="Also remove the tuning file (tuned.json, from jitgemm tune).")
def cache_clear(yes, everything):
    """Delete every cache entry and the dispatch tables; the tuning file is kept unless --all
    is given (items jitgemm did not make are left alone)."""
    cache = KernelCache()
    entries = _cache_call(cache.entries)
    tables = [t for t in dispatch.describe(cache.root) if "arch" in t]
    tuning_file = cache.root / TUNING_NAMES[0]
    has_tuning = tuning_file.is_file() and not tuning_file.is_symlink()
    if not yes:
        also = f", {len(tables)} dispatch table(s)" if tables else ""
        also += f" and the tuning file {TUNING_NAMES[0]}" if everything and has_tuning else ""
        click.confirm(
            f"Delete {len(entries)} entries ({_human_bytes(sum(e.size_bytes for e in entries))}){also} "
            f"under {cache.root}?",
            abort=True,
        )
    removed, unknown = _cache_call(cache.clear, tuning=everything)
    click.echo(f"removed {removed} entries from {cache.root}")
    if tables:
        click.echo(f"removed {len(tables)} dispatch table(s) ({DISPATCH_DIR}/; `jitgemm precompile` writes them again)")
    if has_tuning:
        if everything:
            click.echo(f"removed the tuning file {tuning_file}")
        else:
            click.echo(f"kept the tuning file {tuning_file} (jitgemm tune's choices; --all removes it too)")
    if unknown:
        click.echo(f"left alone (not made by jitgemm): {', '.join(unknown)}", err=True)


# ---- env ----


def _driver_version() -> str:
    version = runtime.check(driver.cuDriverGetVersion(), "cuDriverGetVersion")
    return f"{version // 1000}.{version % 1000 // 10}"


def _try(fn):
    try:
        return fn(), None
    except Exception as exc:  # every field of `env` is best effort
        return None, f"{type(exc).__name__}: {exc}".splitlines()[0]


def _environment() -> dict:
    cache = KernelCache()
    nvrtc, nvrtc_error = _try(compiler.nvrtc_version)
    driver_version, driver_error = _try(_driver_version)
    bindings, _ = _try(lambda: metadata.version("cuda-bindings"))
    gpus = []
    for i in range(runtime.device_count()):
        info, error = _try(lambda i=i: runtime.device_info(i))
        gpus.append(
            {"ordinal": i, "error": error}
            if info is None
            else {
                "ordinal": i,
                "name": info.name,
                "arch": info.arch,
                "num_sms": info.num_sms,
                "compute_capability": list(info.compute_capability),
            }
        )
    try:
        entries = cache.entries()
        status = "ok" if cache.root.exists() else "not created yet"
    except (UnsafeError, OSError) as exc:
        entries, status = [], f"not used: {exc}"
    tables, _ = _try(lambda: dispatch.describe(cache.root))
    return {
        "jitgemm": __version__,
        "python": sys.version.split()[0],
        "cuda_bindings": bindings,
        "nvrtc": nvrtc,
        "nvrtc_error": nvrtc_error,
        "driver": driver_version,
        "driver_error": driver_error,
        "gpus": gpus,
        "cache": {
            "root": str(cache.root),
            "status": status,
            "entries": len(entries),
            "bytes": sum(e.size_bytes for e in entries),
            "dispatch_tables": tables or [],
        },
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("JITGEMM_")},
        "variables": _variables(cache),
    }


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def _variables(cache: KernelCache) -> list:
    """Every JITGEMM_* variable jitgemm reads, set or not, with the value in effect (or why the
    value set is refused); then any other JITGEMM_* variable set (a misspelling reads as unknown)."""
    effective = {
        "JITGEMM_CACHE_DIR": lambda: str(cache.root),
        "JITGEMM_OFFLINE": lambda: _on_off(offline_mode()),
        "JITGEMM_CONFIG": lambda: (
            json.loads(os.environ["JITGEMM_CONFIG"])
            if os.environ.get("JITGEMM_CONFIG", "").strip()
            else "unset: the tuning file, the dispatch table, then the heuristics"
        ),
        "JITGEMM_TUNED": lambda: _on_off(tuned.enabled()),
        "JITGEMM_DISPATCH_TABLE": lambda: _on_off(dispatch.enabled()),
        "JITGEMM_PDL": lambda: _on_off(envflags.flag(runtime.ENV_PDL, True)),
        "JITGEMM_REQUIRE_GPU": lambda: _on_off(os.environ.get("JITGEMM_REQUIRE_GPU") == "1"),  # tests/conftest.py
        "JITGEMM_TEST_TIMEOUT": lambda: f"{float(os.environ.get('JITGEMM_TEST_TIMEOUT') or 0):g} s",
    }
    rows = []
    for var in envflags.VARIABLES:
        value, error = _try(effective[var.name])
        rows.append(
            {
                "name": var.name,
                "set": var.name in os.environ,
                "value": os.environ.get(var.name),
                "effective": value if error is None else f"invalid: {error}",
                "default": var.default,
                "what": var.what,
                "tests_only": var.tests_only,
            }
        )
    for name in sorted(os.environ):
        if name.startswith("JITGEMM_") and name not in envflags.NAMES:
            rows.append({"name": name, "set": True, "value": os.environ[name], "effective": "unknown: not read"})
    return rows


@main.command("env")
@click.option("--json", "as_json", is_flag=True)
def env(as_json):
    """Versions, GPUs, the cache and every JITGEMM_* variable with the value in effect."""
    info = _environment()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"jitgemm        {info['jitgemm']} (Python {info['python']})")
    click.echo(f"cuda-bindings  {info['cuda_bindings'] or 'not installed'}")
    click.echo(f"NVRTC          {info['nvrtc'] or 'unavailable: ' + str(info['nvrtc_error'])}")
    click.echo(f"driver         {info['driver'] or 'unavailable: ' + str(info['driver_error'])}")
    if not info["gpus"]:
        click.echo("GPUs           none found")
    for g in info["gpus"]:
        described = f"{g['name']}, {g['arch']}, {g['num_sms']} SMs" if "name" in g else f"error: {g['error']}"
        click.echo(f"GPU {g['ordinal']}          {described}")
    c = info["cache"]
    click.echo(f"cache          {c['root']} ({c['status']}): {c['entries']} entries, {_human_bytes(c['bytes'])}")
    for t in c["dispatch_tables"]:
        click.echo(f"dispatch table {t['path']}: {_table_text(t)}")
    click.echo("variables      (* = set; the value in effect, set or not)")
    width = max(len(v["name"]) for v in info["variables"])
    for v in info["variables"]:
        mark = "*" if v["set"] else " "
        shown = v["effective"] if isinstance(v["effective"], str) else json.dumps(v["effective"])
        raw = f"  [{v['name']}={v['value']}]" if v["set"] and str(v["value"]) != shown else ""
        click.echo(f"  {mark} {v['name']:<{width}}  {shown}{raw}")


if __name__ == "__main__":
    main()
