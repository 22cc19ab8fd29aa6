"""The tuning file: the configs `jitgemm tune` (jitgemm.tuning) measured fastest, kept in
``<cache root>/tuned.json`` under the device (name, arch, SM count) and the problem (shape,
dtypes, layouts, C), together with every time measured.

`gemm` consults the file for problems it has no explicit config for (`JITGEMM_CONFIG` still
wins); ``JITGEMM_TUNED=0`` ignores it. An entry that is malformed or no longer passes the
config checks (a newer jitgemm) is ignored; a file that cannot be read, or that the cache's
trust rules refuse (a symlink, another owner, group- or world-writable), is reported once and
ignored. Plans `gemm` has already built keep the config they were built with.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
import warnings
from pathlib import Path

from . import envflags
from .cache import ENV_ROOT, TMP_PREFIX, TUNING_NAMES, KernelCache, check_root, read_trusted
from .config import KernelConfig
from .heuristics import DeviceSpec, check_config
from .problem import Problem

ENV_TUNED = "JITGEMM_TUNED"
TUNING_FILE = TUNING_NAMES[0]
SCHEMA = 1


class TuningWarning(UserWarning):
    """The tuning file could not be read or written (the heuristics decide instead)."""


def device_key(name: str, spec: DeviceSpec) -> str:
    return f"{name}|{spec.arch}|{spec.num_sms} SMs"


def problem_key(p: Problem) -> str:
    return (
        f"{p.m}x{p.n}x{p.k} {p.dtype}->{p.out_dtype} A {p.a_major}-major B {p.b_major}-major{' +C' if p.has_c else ''}"
    )


def tuning_path() -> Path:
    return _path_for(os.environ.get(ENV_ROOT, ""))


@functools.lru_cache(maxsize=8)
def _path_for(root_setting: str) -> Path:
    """The file under the cache root `JITGEMM_CACHE_DIR` = `root_setting` gives (memoised: a
    gemm call that builds a plan looks the file up, and resolving the root is not free)."""
    return KernelCache().root / TUNING_FILE


def enabled() -> bool:
    """Whether the tuning file is consulted: JITGEMM_TUNED, on by default (0/false/no/off: off)."""
    return envflags.flag(ENV_TUNED, True)


_read_cache: dict = {}  # path -> (file state, entries)
_warned: set = set()


def _warn_once(token, message: str) -> None:
    if token not in _warned:
        _warned.add(token)
        warnings.warn(message, TuningWarning, stacklevel=3)


def read_entries(path: Path | None = None) -> dict:
    """{device key: {problem key: record}} from the tuning file (device entries that are not
    mappings dropped); {} when it is missing, unreadable or refused by the trust rules
    (reported once per file state)."""
    path = path or tuning_path()
    try:
        st = os.lstat(path)
    except OSError:
        return {}
    state = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)  # ctime: chmod and chown too
    cached = _read_cache.get(path)
    if cached is not None and cached[0] == state:
        return cached[1]
    try:
        check_root(path.parent)
        data = json.loads(read_trusted(path, TUNING_FILE))
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("devices"), dict):
            raise ValueError(f"not a schema-{SCHEMA} jitgemm tuning file")
        entries = {d: v for d, v in data["devices"].items() if isinstance(v, dict)}
    except Exception as exc:  # any malformed file (deep nesting too): the heuristics decide
        _warn_once((str(path),) + state, f"jitgemm: ignoring the tuning file {path}: {exc}")
        entries = {}
    _read_cache[path] = (state, entries)
    return entries


def write_entry(device: str, problem: str, record: dict, path: Path | None = None) -> Path:
    """Add or replace one record, under a file lock, by an atomic replace of the file (an
    unreadable file is replaced). The root must pass the cache's trust checks (UnsafeError)."""
    # imported here: only the tuner writes the file, and the import adds ~40 ms to `import jitgemm`
    import filelock

    path = path or tuning_path()
    KernelCache(path.parent).ensure_root()
    with filelock.FileLock(str(path.parent / TUNING_NAMES[1]), timeout=60, mode=0o600):
        _read_cache.pop(path, None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TuningWarning)
            devices = {d: dict(v) for d, v in read_entries(path).items()}
        devices.setdefault(device, {})[problem] = record
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX)  # mode 0600, never a planted link
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"schema": SCHEMA, "devices": devices}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    return path


def tuned_config(problem: Problem, spec: DeviceSpec, device_name: str) -> KernelConfig | None:
    """The tuned config for `problem` on this device, or None (no entry, tuning off, or an
    entry that no longer passes the checks)."""
    if not enabled():
        return None
    return _record_config(
        read_entries().get(device_key(device_name, spec), {}).get(problem_key(problem)), problem, spec
    )


def tuned_config_for_target(problem: Problem, spec: DeviceSpec) -> KernelConfig | None:
    """The tuned config for `problem` on any GPU of `spec`'s arch and SM count (no GPU name:
    the CLI targeting a device it does not have): the entries of every such GPU when they agree,
    None when there are none or they disagree (reported once)."""
    if not enabled():
        return None
    suffix = device_key("", spec)  # "|arch|N SMs", after the GPU name
    found = {}
    for dev, records in read_entries().items():
        if dev.endswith(suffix) and "|" not in dev[: -len(suffix)]:
            cfg = _record_config(records.get(problem_key(problem)), problem, spec)
            if cfg is not None:
                found[dev] = cfg
    configs = set(found.values())
    if len(configs) > 1:
        _warn_once(
            (problem_key(problem), suffix, "disagree"),
            f"jitgemm: the tuning file has different configs for {problem_key(problem)} on "
            f"{', '.join(sorted(d.split('|')[0] for d in found))} ({spec.arch}, {spec.num_sms} SMs); "
            "without a GPU name to choose between them the heuristics decide",
        )
        return None
    return configs.pop() if configs else None


def _record_config(record, problem: Problem, spec: DeviceSpec) -> KernelConfig | None:
    fields = record.get("config") if isinstance(record, dict) else None
    if not isinstance(fields, dict) or not all(_field_ok(k, v) for k, v in fields.items()):
        return None
    try:
        cfg = KernelConfig.from_dict(fields)
    except (TypeError, ValueError):
        return None
    return None if check_config(cfg, problem, spec) else cfg


_FIELD_TYPES = {f.name: type(f.default) for f in dataclasses.fields(KernelConfig)}


def _field_ok(name, value) -> bool:
    """A config field of the exact type (an int, not a bool or a float; a str; a bool)."""
    want = _FIELD_TYPES.get(name)
    return want is not None and type(value) is want
