"""The package's structure (issue 17): no module-level import cycles, arch names told apart only
by the registry, and a package list in pyproject that ships every module."""

import ast
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
SOURCES = {"jitgemm": ROOT / "jitgemm", "jitgemm.heuristics": ROOT / "heuristics"}


def _modules() -> dict:
    """Dotted module name -> (path, is a package __init__) for every module of the package."""
    found = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = [package] + list(path.relative_to(folder).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return found


def _module_level_imports(name: str, path: Path, is_init: bool, known: dict) -> set:
    """Modules `name` imports when it is imported (TYPE_CHECKING blocks and functions left out).
    `from package import module` counts the module; a package's __init__ is always imported
    before its modules, so edges to parent packages are not cycles of their own."""
    package = name if is_init else name.rsplit(".", 1)[0]
    deps = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                deps.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        elif isinstance(node, ast.Import):
            deps.update(alias.name for alias in node.names)
    return {d for d in deps if d in known and d != name and not name.startswith(d + ".")}


def test_no_module_level_import_cycles():
    known = _modules()
    graph = {name: _module_level_imports(name, path, is_init, known) for name, (path, is_init) in known.items()}
    state: dict = {}

    def visit(node, trail):
        state[node] = "open"
        for dep in sorted(graph[node]):
            assert state.get(dep) != "open", "import cycle: " + " -> ".join(trail + [node, dep])
            if dep not in state:
                visit(dep, trail + [node])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_arch_names_are_compared_only_by_the_registry():
    def is_arch_name(node):
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("sm_")

    offenders = []
    for name, (path, _) in _modules().items():
        if name == "jitgemm.registry":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(is_arch_name(n) for n in [node.left, *node.comparators]):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


def test_pyproject_ships_every_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {name for name, (_, is_init) in _modules().items() if is_init}
    assert packages <= set(config["packages"]), packages - set(config["packages"])
    templates = ROOT / "templates"
    shipped = {p for pattern in config["package-data"]["jitgemm.templates"] for p in templates.glob(pattern)}
    assert {p for p in templates.rglob("*") if p.suffix in (".j2", ".cuh")} == shipped


LAZY = ("jinja2", "click", "cuda.bindings.nvrtc", "platformdirs")


def test_import_leaves_the_renderer_the_compiler_and_the_cli_for_later():
    # `import jitgemm` in a serving process: Jinja (rendering a kernel the cache lacks), NVRTC's
    # bindings (compiling it), platformdirs (the default cache root) and click (the CLI) are
    # imported only when needed. cuda.pathfinder is not in the list: cuda.bindings.driver, which
    # every call needs, imports it.
    code = f"import sys, jitgemm; print(sorted(m for m in {LAZY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_both_kernels_walk_their_tiles_with_the_one_scheduler():
    # templates/common/scheduler.cuh is the one tile walk (jitgemm.geometry.tile_order mirrors
    # it): each arch's template includes it rather than keep a copy.
    for template in sorted((ROOT / "templates").glob("*/gemm.cu.j2")):
        text = template.read_text()
        assert '{% include "common/scheduler.cuh" %}' in text, template
        assert "TileCoord tile_of(" not in text and "struct TileCoord" not in text, template


# What may be imported inside a function: optional or heavy dependencies (each with a comment
# saying why, on the line or just above it) and the package's own __version__ (a cycle otherwise).
FUNCTION_LEVEL_IMPORTS = {
    "jinja2",  # rendering: only a kernel missing from the cache
    "click",  # the CLI
    "cuda.bindings.nvrtc",  # compiling
    "cuda.pathfinder",  # locating NVRTC (cuda.bindings.driver imported it already)
    "cuda.pathfinder._dynamic_libs",  # locating NVRTC without loading it (imported already as well)
    "platformdirs",  # the default cache root, when JITGEMM_CACHE_DIR is unset
    "filelock",  # the tuner's file
    "cuda.core.utils",  # DLPack-only inputs
    "ml_dtypes",  # bfloat16 NumPy arrays
    "cupy",  # optional array libraries
    "torch",
    "nvidia",  # the CUDA binary tools of the nvidia wheels
}


def test_function_level_imports_are_lazy_dependencies_with_a_reason():
    offenders = []
    for path, _ in _modules().values():
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                if isinstance(node, ast.ImportFrom):
                    # `from cuda.bindings import nvrtc` imports cuda.bindings.nvrtc
                    module = node.module or ""
                    targets = (
                        []
                        if node.level
                        else [module if module in FUNCTION_LEVEL_IMPORTS else f"{module}.{a.name}" for a in node.names]
                    )
                    own_version = node.level and [a.name for a in node.names] == ["__version__"]
                    if node.level and not own_version:
                        offenders.append(f"{where}: a function-level import of the package's own module")
                else:
                    targets = [alias.name for alias in node.names]
                offenders += [
                    f"{where}: {t} is not a known lazy dependency" for t in targets if t not in FUNCTION_LEVEL_IMPORTS
                ]
                if not any("#" in line for line in lines[max(0, node.lineno - 3) : node.lineno]):
                    offenders.append(f"{where}: no comment saying why the import is deferred")
    assert not offenders, offenders
