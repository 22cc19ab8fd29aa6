"""The dispatch table: the heuristics' choices over whole ranges of M, written by `jitgemm
precompile` beside the cubins, so that a fresh process answers the problems it covers without
running the cost model (jitgemm.plan consults it after the tuning file, before the heuristics).

Where: ``<cache root>/dispatch/<arch>-<num_sms>.json``, one file per target (arch, SM count).

Format: JSON, ``{"sha256": H, "table": BODY}`` where H is the sha256 of BODY's bytes as they
stand in the file. BODY holds what wrote it (``format``, ``schema``, ``arch``, ``num_sms``,
``fingerprint``, ``jitgemm``), ``configs``: the distinct configs (KernelConfig fields), and
``problems``: for each N, K, dtypes, majors and C (`problem_key`) a sorted list of M runs
``[m_lo, m_hi, config index]``; adjacent Ms with the same config share one run, so
``--m 1:8192`` over a model's layers stays a few kilobytes. A lookup is a dict get and a bisect.

Trust, as for cache entries (jitgemm.cache): the root, the ``dispatch`` directory and the file
must not be symlinks, must not be writable by group or others, and must be owned by the user
(or, to be read only, by root); only a regular file is opened; the sha256 must match; every
field must have its type and every run its order. A table failing any of this is ignored with
one CacheWarning per file state, never an error: the heuristics decide. A table written by
other heuristics (its `fingerprint`: jitgemm's version and the sources selection runs on) is
ignored too, with one warning, as its choices may no longer be what `select` gives; `jitgemm
precompile` writes it again. Each config found is checked against the problem (its arch,
dtypes, majors and C, and the arch's rules, `heuristics.check_config`) before it is used.

Writing (`record`): under a lock, the table is read, the new runs replace the old ones where
they overlap (the other problems are kept), and the result is written to a temporary file,
fsynced and renamed into place. Under JITGEMM_OFFLINE=1, in a shared cache of root's, or where
the root cannot be written, nothing is written and `record` says why.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

from . import envflags, heuristics, registry
from .cache import (
    DISPATCH_DIR,
    ENV_OFFLINE,
    ENV_ROOT,
    LOCK_DIR,
    LOCK_TIMEOUT_S,
    CompileLock,
    CorruptEntry,
    KernelCache,
    UnsafeError,
    _check_trusted,
    _fsync_dir,
    _warn_once,
    check_root,
    hash_parts,
    is_shared,
    make_private_dir,
    offline_mode,
    publish_file,
    read_trusted,
)
from .config import KernelConfig, parse_json
from .heuristics import DeviceSpec
from .heuristics.rules import field_mismatches
from .problem import MAX_DIM, Problem

ENV_TABLE = "JITGEMM_DISPATCH_TABLE"
FORMAT = "jitgemm dispatch table"
SCHEMA = 1
RECORDED_SOURCES = ("heuristics", "table")  # plan.choose's sources whose choices a table records
NAME_RE = re.compile(r"(?P<arch>sm_[0-9a-z]+)-(?P<num_sms>[1-9][0-9]*)\.json")

# The file: _HEAD + 64 hex digits + _MID + BODY + _TAIL (BODY's bytes are what the sha256 covers).
_HEAD, _MID, _TAIL = b'{"sha256": "', b'", "table": ', b"}\n"
_CONFIG_FIELDS = frozenset(f.name for f in fields(KernelConfig))


class TableError(Exception):
    """A dispatch table that is malformed, corrupt or for another target."""


class StaleTable(TableError):
    """A dispatch table written by other heuristics (another fingerprint)."""


def enabled() -> bool:
    """Whether the dispatch table is consulted: JITGEMM_DISPATCH_TABLE, on by default."""
    return envflags.flag(ENV_TABLE, True)


def problem_key(p: Problem) -> str:
    """What a table's runs are listed under: everything about the problem but M."""
    return f"N={p.n} K={p.k} {p.dtype}->{p.out_dtype} A={p.a_major} B={p.b_major}{' C' if p.has_c else ''}"


def file_name(device: DeviceSpec) -> str:
    return f"{device.arch}-{device.num_sms}.json"


def table_path(device: DeviceSpec, root: Path | str | None = None) -> Path:
    """The table of `device` under `root` (default: the cache root, JITGEMM_CACHE_DIR)."""
    if root is not None:
        return KernelCache(root).root / DISPATCH_DIR / file_name(device)
    return _path_for(os.environ.get(ENV_ROOT, ""), device.arch, device.num_sms)


@functools.lru_cache(maxsize=32)
def _path_for(root_setting: str, arch: str, num_sms: int) -> Path:
    """Memoised: resolving the default root is not free, and a plan that is built asks."""
    return KernelCache().root / DISPATCH_DIR / f"{arch}-{num_sms}.json"


# ---- the fingerprint of the heuristics ----


def _fingerprint_sources() -> list[tuple[str, Path]]:
    """The source files selection runs on: the heuristics package and its calibration files
    (the rates), the arch backends (rules, layouts, shared memory) and the values and geometry
    they share."""
    package = Path(__file__).resolve().parent
    rules_dir = Path(heuristics.__file__).resolve().parent
    found = [(f"heuristics/{p.relative_to(rules_dir)}", p) for p in rules_dir.rglob("*.py")]
    found += [(f"heuristics/{p.relative_to(rules_dir)}", p) for p in (rules_dir / "calibration").glob("*.json")]
    if not found:
        raise RuntimeError(f"the heuristics' source files are not in {rules_dir}: no fingerprint, no table")
    found += [(f"jitgemm/{p.relative_to(package)}", p) for p in (package / "archs").rglob("*.py")]
    found += [(f"jitgemm/{name}", package / name) for name in ("config.py", "geometry.py", "problem.py", "registry.py")]
    return sorted(found)


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """sha256 over jitgemm's version and the sources of the heuristics (computed once per
    process, ~2 ms): a table whose fingerprint differs was chosen by other rules."""
    from . import __version__  # not at import: jitgemm/__init__ imports this module first

    sources = _fingerprint_sources()
    return hash_parts(
        [f"jitgemm {__version__}"] + [piece for label, path in sources for piece in (label, path.read_bytes())]
    )


# ---- runs ----


def runs_from_points(points: dict) -> list[tuple[int, int, object]]:
    """{m: value} as sorted runs (lo, hi, value) of consecutive Ms with equal values."""
    runs: list[tuple[int, int, object]] = []
    for m in sorted(points):
        value = points[m]
        if runs and runs[-1][1] == m - 1 and runs[-1][2] == value:
            runs[-1] = (runs[-1][0], m, value)
        else:
            runs.append((m, m, value))
    return runs


def merge_runs(old: list, new: list) -> list[tuple[int, int, object]]:
    """Sorted, disjoint runs (lo, hi, value): `old` where `new` does not cover, `new` where it
    does, adjacent runs of equal values joined. Both inputs sorted and disjoint."""
    starts = [r[0] for r in new]
    ends = [r[1] for r in new]
    out = []
    for lo, hi, value in old:
        cur = lo
        for s, e, _ in new[bisect.bisect_left(ends, lo) : bisect.bisect_right(starts, hi)]:
            if s > cur:
                out.append((cur, s - 1, value))
            cur = max(cur, e + 1)
        if cur <= hi:
            out.append((cur, hi, value))
    out.extend(new)
    out.sort(key=lambda r: r[0])
    joined: list[tuple[int, int, object]] = []
    for run in out:
        if joined and joined[-1][1] + 1 == run[0] and joined[-1][2] == run[2]:
            joined[-1] = (joined[-1][0], run[1], run[2])
        else:
            joined.append(run)
    return joined


# ---- reading ----


class Table(NamedTuple):
    """A trusted table in memory: per problem key, the runs' first Ms, last Ms and configs."""

    path: Path
    jitgemm: str  # the version that wrote it
    configs: tuple
    runs: dict  # problem key -> (los, his, config indices)

    def find(self, problem: Problem) -> KernelConfig | None:
        """The config the table records for `problem`, unchecked; None when it covers no such M."""
        found = self.runs.get(problem_key(problem))
        if found is None:
            return None
        los, his, index = found
        i = bisect.bisect_right(los, problem.m) - 1
        if i < 0 or problem.m > his[i]:
            return None
        return self.configs[index[i]]

    def items(self) -> dict:
        """{problem key: [(m_lo, m_hi, KernelConfig), ...]}."""
        return {key: [(lo, hi, self.configs[i]) for lo, hi, i in zip(*runs)] for key, runs in self.runs.items()}

    @property
    def num_runs(self) -> int:
        return sum(len(runs[0]) for runs in self.runs.values())


def _int(value) -> bool:
    return type(value) is int


def decode(data: bytes, path: Path, device: DeviceSpec) -> Table:
    """The table in `data` (the file's bytes), checked whole; TableError saying what is wrong,
    StaleTable when other heuristics wrote it."""
    digest_end = len(_HEAD) + 64
    body_end = len(data.rstrip()) - 1
    if (
        not data.startswith(_HEAD)
        or data[digest_end : digest_end + len(_MID)] != _MID
        or not data.rstrip().endswith(b"}")
        or body_end < digest_end + len(_MID)
    ):
        raise TableError("not a jitgemm dispatch table (or a truncated one)")
    body = data[digest_end + len(_MID) : body_end]
    if hashlib.sha256(body).hexdigest().encode() != data[len(_HEAD) : digest_end]:
        raise TableError("its content does not match its sha256 (corrupt or truncated)")
    try:
        obj = parse_json(body.decode(), "the table")
    except UnicodeDecodeError:
        raise TableError("the table is not UTF-8 text") from None
    except ValueError as exc:
        raise TableError(str(exc)) from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("schema") != SCHEMA:
        raise TableError(f"not a schema-{SCHEMA} {FORMAT}")
    if obj.get("arch") != device.arch or not _int(obj.get("num_sms")) or obj.get("num_sms") != device.num_sms:
        raise TableError(f"written for {obj.get('arch')!r} with {obj.get('num_sms')!r} SMs, not {file_name(device)}")
    writer = obj.get("jitgemm")
    if obj.get("fingerprint") != fingerprint():
        raise StaleTable(
            f"written by other heuristics (jitgemm {writer}, fingerprint {str(obj.get('fingerprint'))[:12]}...; "
            f"this one is {fingerprint()[:12]}...): its choices may not be the heuristics' any more; "
            "`jitgemm precompile` writes it again"
        )
    raw_configs, problems = obj.get("configs"), obj.get("problems")
    if not isinstance(raw_configs, list) or not isinstance(problems, dict):
        raise TableError("configs must be a list and problems a mapping")
    configs = []
    for i, raw in enumerate(raw_configs):
        if not isinstance(raw, dict) or set(raw) != _CONFIG_FIELDS:
            raise TableError(f"config {i} does not have exactly the KernelConfig fields")
        try:
            cfg = KernelConfig.from_dict(raw)
        except (TypeError, ValueError) as exc:
            raise TableError(f"config {i}: {exc}") from None
        if cfg.arch != device.arch:
            raise TableError(f"config {i} is for {cfg.arch}, the table for {device.arch}")
        configs.append(cfg)
    runs = {}
    for key, rows in problems.items():
        if not isinstance(rows, list) or not rows:
            raise TableError(f"{key}: the runs must be a non-empty list")
        los, his, index = [], [], []
        previous = 0
        for row in rows:
            if not (isinstance(row, list) and len(row) == 3 and all(map(_int, row))):
                raise TableError(f"{key}: a run must be [m_lo, m_hi, config index] (ints), got {row!r}")
            lo, hi, i = row
            if not (previous < lo <= hi <= MAX_DIM and 0 <= i < len(configs)):
                raise TableError(f"{key}: run {row} is out of order, out of range or names no config")
            los.append(lo)
            his.append(hi)
            index.append(i)
            previous = hi
        runs[key] = (los, his, index)
    return Table(path, str(writer), tuple(configs), runs)


def read_table(path: Path, device: DeviceSpec) -> Table:
    """The table at `path`, after the trust checks of the root, its directory and the file.
    FileNotFoundError when there is none; UnsafeError, CorruptEntry or TableError otherwise."""
    directory = path.parent
    check_root(directory.parent)
    st = os.lstat(directory)
    _check_trusted(st, directory, "dispatch table directory")
    if not stat.S_ISDIR(st.st_mode):
        raise TableError(f"{directory} is not a directory")
    if not os.path.lexists(path):
        raise FileNotFoundError(path)
    return decode(read_trusted(path, path.name), path, device)


_loaded: dict = {}  # path -> (file state, Table or None)


def _current(device: DeviceSpec) -> Table | None:
    """The table of `device` under the cache root, read once per file state; None when there
    is none or it is ignored (reported once per file state)."""
    if device.arch not in registry.ARCH_NAMES:
        return None
    path = table_path(device)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    state = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)  # ctime: chmod and chown too
    cached = _loaded.get(path)
    if cached is not None and cached[0] == state:
        return cached[1]
    table = None
    try:
        table = read_table(path, device)
    except FileNotFoundError:
        pass
    except Exception as exc:  # any way a file can be bad (deep nesting too): the heuristics decide
        _warn_once(("dispatch", str(path)) + state, f"jitgemm: ignoring the dispatch table {path}: {exc}")
    _loaded[path] = (state, table)
    return table


def lookup(problem: Problem, device: DeviceSpec) -> KernelConfig | None:
    """The config the dispatch table records for `problem` on `device`, checked against the
    problem; None when the table has none (or is off, missing, untrusted or stale)."""
    if not enabled():
        return None
    table = _current(device)
    if table is None:
        return None
    cfg = table.find(problem)
    if cfg is None:
        return None
    reasons = heuristics.check_config(cfg, problem, device)
    if reasons:
        _warn_once(
            ("dispatch", str(table.path), problem),
            f"jitgemm: the dispatch table {table.path} gives {cfg.name} for {problem.describe()}, which "
            f"cannot run it ({'; '.join(reasons)}); the heuristics decide",
        )
        return None
    return cfg


def describe(root: Path | str | None = None) -> list[dict]:
    """Each table under `root` (default: the cache root): path, arch, num_sms, status ("ok",
    or why it is ignored) and, when ok, its problem keys, runs, configs and the Ms covered."""
    directory = KernelCache(root).root / DISPATCH_DIR
    try:
        check_root(directory.parent)
        st = os.lstat(directory)
        _check_trusted(st, directory, "dispatch table directory")
        if not stat.S_ISDIR(st.st_mode):
            raise TableError(f"{directory} is not a directory")
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except (UnsafeError, TableError, OSError) as exc:
        return [{"path": str(directory), "status": f"ignored: {exc}"}]
    out = []
    for name in names:
        found = NAME_RE.fullmatch(name)
        if found is None:
            continue
        info: dict = {"path": str(directory / name), "arch": found["arch"], "num_sms": int(found["num_sms"])}
        try:
            if found["arch"] not in registry.ARCH_NAMES:
                raise TableError(f"unknown arch {found['arch']}")
            table = read_table(directory / name, DeviceSpec(found["arch"], int(found["num_sms"])))
        except FileNotFoundError:
            continue
        except Exception as exc:  # reported, as lookups would ignore it
            info["status"] = f"{'stale' if isinstance(exc, StaleTable) else 'ignored'}: {exc}"
        else:
            info.update(
                status="ok",
                jitgemm=table.jitgemm,
                problems=len(table.runs),
                runs=table.num_runs,
                configs=len(table.configs),
                shapes=sum(hi - lo + 1 for los, his, _ in table.runs.values() for lo, hi in zip(los, his)),
            )
        out.append(info)
    return out


# ---- writing ----


class Recorded(NamedTuple):
    """What `record` did: the table's path, whether it was written (else `reason`), the shapes
    recorded, and the table's size after it (problem keys, M runs, distinct configs)."""

    path: Path
    written: bool
    reason: str = ""
    shapes: int = 0
    problems: int = 0
    runs: int = 0
    configs: int = 0
    note: str = ""  # e.g. an unreadable or stale table that was replaced

    def to_dict(self) -> dict:
        return {
            "path": str(self.path),
            "written": self.written,
            "reason": self.reason or None,
            "shapes": self.shapes,
            "problems": self.problems,
            "runs": self.runs,
            "configs": self.configs,
            "note": self.note or None,
        }


def encode(table: dict, device: DeviceSpec) -> bytes:
    """The file's bytes for {problem key: [(m_lo, m_hi, KernelConfig), ...]} (runs sorted, disjoint)."""
    from . import __version__  # not at import: jitgemm/__init__ imports this module first

    configs: list[KernelConfig] = []
    index: dict[KernelConfig, int] = {}
    problems = {}
    for key in sorted(table):
        rows = []
        for lo, hi, cfg in table[key]:
            if cfg not in index:
                index[cfg] = len(configs)
                configs.append(cfg)
            rows.append([lo, hi, index[cfg]])
        problems[key] = rows
    body = json.dumps(
        {
            "format": FORMAT,
            "schema": SCHEMA,
            "arch": device.arch,
            "num_sms": device.num_sms,
            "fingerprint": fingerprint(),
            "jitgemm": __version__,
            "configs": [c.to_dict() for c in configs],
            "problems": problems,
        },
        separators=(",", ":"),
    ).encode()
    return _HEAD + hashlib.sha256(body).hexdigest().encode() + _MID + body + _TAIL


def _publish(root: Path, path: Path, data: bytes) -> None:
    """`data` as `path`, atomically (cache.publish_file, its temporary file in the root)."""
    publish_file(path, data, root, ".dispatch")
    _fsync_dir(path.parent)


def record(
    choices: Iterable[tuple[Problem, KernelConfig]], device: DeviceSpec, root: Path | str | None = None
) -> Recorded:
    """Add the (problem, config) `choices` (the heuristics' choices for `device`) to its table
    under `root` (default: the cache root), replacing what the table had for those Ms and
    keeping the rest. Never raises for a root that cannot be written: `Recorded` says why.
    ValueError for a config that does not belong to its problem."""
    cache = KernelCache(root)
    path = cache.root / DISPATCH_DIR / file_name(device)
    points: dict[str, dict[int, KernelConfig]] = {}
    for problem, cfg in choices:
        wrong = field_mismatches(cfg, problem, device)
        if wrong:
            raise ValueError(f"{cfg.name} does not belong to {problem.describe()}: {'; '.join(wrong)}")
        points.setdefault(problem_key(problem), {})[problem.m] = cfg
    shapes = sum(len(p) for p in points.values())
    if not points:
        return Recorded(path, False, "no shapes to record")
    if offline_mode():
        return Recorded(path, False, f"{ENV_OFFLINE}=1: nothing is written to the cache", shapes)
    if is_shared(cache.root):
        return Recorded(
            path, False, f"the cache at {cache.root} is a shared cache owned by root, read-only for you", shapes
        )
    try:
        cache.ensure_root()
        make_private_dir(cache.root / DISPATCH_DIR, "dispatch table directory")
        make_private_dir(cache.root / LOCK_DIR, "lock directory")
        lock = CompileLock(cache.root / LOCK_DIR / f"dispatch-{file_name(device)}.lock", "the dispatch table's lock")
        not_held = lock.acquire(LOCK_TIMEOUT_S)
    except (UnsafeError, OSError) as exc:
        return Recorded(path, False, f"the cache at {cache.root} cannot be written ({exc})", shapes)
    note = f"written without the lock ({not_held})" if not_held else ""
    try:
        try:
            old = read_table(path, device).items()
        except FileNotFoundError:
            old = {}
        except (UnsafeError, CorruptEntry, TableError, OSError) as exc:  # replaced, never followed
            old = {}
            note = "; ".join(
                filter(
                    None,
                    [note, f"replaced {'a stale' if isinstance(exc, StaleTable) else 'an unusable'} table ({exc})"],
                )
            )
        merged = dict(old)
        for key, by_m in points.items():
            merged[key] = merge_runs(old.get(key, []), runs_from_points(by_m))
        data = encode(merged, device)
        _publish(cache.root, path, data)
    except (UnsafeError, OSError) as exc:
        return Recorded(path, False, f"{path} cannot be written ({exc})", shapes, note=note)
    finally:
        lock.release()
    _loaded.pop(path, None)
    return Recorded(
        path,
        True,
        "",
        shapes,
        len(merged),
        sum(len(runs) for runs in merged.values()),
        len({cfg for runs in merged.values() for _, _, cfg in runs}),
        note,
    )
