"""The package's imports point down the flow and never go in a circle (read with `ast`: nothing is imported).

Every import of a `matgptq` module counts, absolute or relative, at the top of a file or inside a function. A module
may import the modules of its own folder and of lower layers (RANK below); top-level modules of one rank count as one
folder. A new folder or top-level module needs a rank here before its imports pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "matgptq"
SRC = Path(__file__).resolve().parents[1] / "src" / PACKAGE

# The layers, lowest first: a folder (subpackage) or top-level module → rank ("" = matgptq/__init__.py).
RANK: dict[str, int] = {
    "errors": 0,
    "fsutil": 0,
    "untrusted": 0,
    "_version": 0,  # base: import nothing above
    "execution": 1,  # devices, torch.distributed helpers, tables: used by every stage (imports only errors)
    "models": 1,
    "formats": 1,  # the Hugging Face side; bytes on disk (each with its reader and writer)
    "kernels": 2,  # GPU layouts and Triton kernels for a parent (reads formats only; runtime serves with them)
    "quantization": 3,
    "runtime": 3,  # model → parent; parent or slice → a model that runs
    "evaluation": 4,  # scores of a loaded model, and the tables that report them
    "integrations": 4,  # matgptq inside other engines (transformers' from_pretrained): uses runtime
    "exporters": 5,  # GPTQ / GGUF writers (their reports use evaluation's tables)
    "allocation": 5,  # per-layer mixes of a parent under a budget (scores candidates with evaluation's KL)
    "api": 6,  # the Python API: one function per command, each calling its runner
    "cli": 7,  # the command line: parses, calls the API, prints
    "__main__": 8,
    "": 8,  # `python -m matgptq` and the package itself
}

Edge = tuple[str, str, int]  # (importer, imported, line)


def discover(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name → file, for every module and package of the tree under `src`."""
    modules = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(name: str, path: Path) -> Iterator[tuple[list[str], int]]:
    """(candidate targets, line) of every import in module `name`: [X] for `import X`, [X.y, X] for `from X import y`
    (y is a submodule or a name in X)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield [alias.name], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield [f"{base}.{alias.name}", base], node.lineno


def import_graph(modules: dict[str, Path]) -> tuple[list[Edge], list[Edge]]:
    """(edges between modules, imports naming no module of the package)."""
    edges: dict[tuple[str, str], int] = {}
    unknown = []
    for name, path in modules.items():
        for candidates, line in _imported(name, path):
            if candidates[-1].split(".")[0] != PACKAGE:
                continue
            resolved = next((c for c in candidates if c in modules), None)
            if resolved is None:
                unknown.append((name, candidates[-1], line))
            elif resolved != name:
                edges.setdefault((name, resolved), line)
    return [(src, dst, line) for (src, dst), line in edges.items()], unknown


def unit(module: str) -> str:
    """The folder (first subpackage) or top-level module that `module` belongs to ("" for the package itself)."""
    return module.split(".")[1] if "." in module else ""


def upward_imports(edges: list[Edge], modules: dict[str, Path], rank: dict[str, int] = RANK) -> list[str]:
    """Imports of a module in another folder of the same or a higher rank."""

    def folder(module: str) -> str:
        u = unit(module)
        is_package = f"{PACKAGE}.{u}" in modules and modules[f"{PACKAGE}.{u}"].name == "__init__.py"
        return u if is_package and u else f"top-level rank {rank[u]}"

    bad = []
    for src, dst, line in edges:
        if folder(src) != folder(dst) and rank[unit(dst)] >= rank[unit(src)]:
            bad.append(
                f"{src} (line {line}) imports {dst}: {unit(src) or PACKAGE} has rank {rank[unit(src)]}, "
                f"{unit(dst) or PACKAGE} rank {rank[unit(dst)]}"
            )
    return bad


def cycles(edges: list[Edge]) -> list[list[str]]:
    """One cycle (a path ending where it starts) per strongly connected component with more than one module."""
    graph: dict[str, set[str]] = {}
    for src, dst, _ in edges:
        graph.setdefault(src, set()).add(dst)
        graph.setdefault(dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            components.append(comp)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for comp in components:
        if len(comp) < 2:
            continue
        start = min(comp)
        paths = {start: [start]}
        frontier = [start]
        while frontier:  # shortest way back to `start` inside the component
            v = frontier.pop(0)
            for w in sorted(graph[v] & comp):
                if w == start:
                    found.append(paths[v] + [start])
                    frontier = []
                    break
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    frontier.append(w)
    return found


def shadowed(modules: dict[str, Path]) -> list[str]:
    """Names a package's __init__ binds over one of its own submodules (`from .load import load` in runtime/ would
    make `matgptq.runtime.load` the function, not the module)."""
    bad = []
    for pkg, path in modules.items():
        if path.name != "__init__.py":
            continue
        children = {m.rpartition(".")[2] for m in modules if m.rpartition(".")[0] == pkg and m != pkg}
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                base = pkg.rsplit(".", node.level - 1)[0] if node.level else ""
                base = ".".join(p for p in (base, node.module) if p)
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if bound in children and f"{base}.{alias.name}" != f"{pkg}.{bound}":
                        bad.append(f"{pkg} binds {bound!r} (from {base}) over its submodule {pkg}.{bound}")
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in children:
                bad.append(f"{pkg} defines {node.name!r} over its submodule {pkg}.{node.name}")
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id in children:
                        bad.append(f"{pkg} assigns {t.id!r} over its submodule {pkg}.{t.id}")
    return bad


MODULES = discover()
EDGES, UNKNOWN = import_graph(MODULES)


def test_the_graph_is_read():
    assert len(MODULES) > 20 and f"{PACKAGE}.runtime.loader" in MODULES
    assert (f"{PACKAGE}.runtime.loader", f"{PACKAGE}.formats") in {(s, d) for s, d, _ in EDGES}


def test_every_folder_and_top_level_module_has_a_rank():
    missing = sorted({unit(m) for m in MODULES} - set(RANK))
    assert not missing, f"give these a rank in tests/test_imports.py RANK: {missing}"


def test_every_import_of_the_package_names_a_module():
    assert not UNKNOWN, "imports of modules that do not exist:\n" + "\n".join(f"{s}:{n}: {d}" for s, d, n in UNKNOWN)


def test_no_import_cycles():
    found = cycles(EDGES)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_imports_point_down_the_flow():
    bad = upward_imports(EDGES, MODULES)
    assert not bad, "imports against the layer order (tests/test_imports.py RANK):\n" + "\n".join(bad)


def test_no_package_shadows_its_submodules():
    bad = shadowed(MODULES)
    assert not bad, "\n".join(bad)


def test_the_checks_catch_what_they_should(tmp_path):
    """A cycle, an upward import, a missing module and a shadowed submodule in a throwaway tree are all reported."""
    pkg = tmp_path / PACKAGE
    files = {
        "__init__.py": "from .api import run\n",
        "api.py": "from .runtime import load\ndef run(): ...\n",
        "errors.py": "",
        "formats/__init__.py": "from .parent import read\n",
        "formats/parent.py": "from ..errors import E\ndef read():\n    from ..runtime.loader import open_it\n",
        "runtime/__init__.py": "from .loader import load\n",
        "runtime/loader.py": "from ..formats import read\nimport matgptq.gone\ndef load(): ...\ndef open_it(): ...\n",
        "runtime/load.py": "",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    modules = discover(pkg)
    edges, unknown = import_graph(modules)
    assert [(s, d) for s, d, _ in unknown] == [(f"{PACKAGE}.runtime.loader", f"{PACKAGE}.gone")]
    assert [" -> ".join(c) for c in cycles(edges)] == [
        "matgptq.formats -> matgptq.formats.parent -> matgptq.runtime.loader -> matgptq.formats"
    ]
    up = upward_imports(edges, modules)
    assert len(up) == 1 and up[0].startswith(f"{PACKAGE}.formats.parent (line 3) imports {PACKAGE}.runtime.loader")
    assert shadowed(modules) == [
        f"{PACKAGE}.runtime binds 'load' (from {PACKAGE}.runtime.loader) over its submodule {PACKAGE}.runtime.load"
    ]


def test_no_private_name_crosses_a_module():
    """`from X import _name` of a function, class or constant: another module's private name. A private module of the
    importer's own folder (`from . import _triton_src`, kept out of the folder's API) is allowed."""
    modules, crossings = discover(), []
    for name, path in modules.items():
        for candidates, line in _imported(name, path):
            target, base = candidates[0], candidates[-1]
            private = target.rpartition(".")[2]
            if base.split(".")[0] != PACKAGE or not private.startswith("_") or private.startswith("__"):
                continue
            own_folder_module = target in modules and unit(target) == unit(name)
            if not own_folder_module:
                crossings.append(f"{name} (line {line}) imports {target}")
    assert not crossings, "private names used across modules:\n  " + "\n  ".join(crossings)
