"""benchmarks/ is one script per claim: no benchmark imports another (issue #100). Read from the modules' text with
ast; nothing of benchmarks/ is imported here (the tests import no benchmark).

The rules, over every module under benchmarks/:
  - the harness (benchmarks/_harness/) is the one package any module may import; it imports nothing else of
    benchmarks/;
  - a private module (a name with a leading underscore, e.g. benchmarks/gpu/_kernels.py) is a part of the benchmarks
    of its own topic package and is imported only from that package;
  - a benchmark (any other module) is imported by no module (render_docs finds the renderers by name at run time);
  - no module imports tests/ or research/, and the imports among benchmarks/ form no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = "benchmarks._harness"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(root: Path, path: Path, known: set[str]) -> set[str]:
    """The modules `path` imports: absolute and relative, `from PACKAGE import MODULE` resolved to the module where
    `known` has it."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return found


def graph(root: Path) -> dict[str, set[str]]:
    """{module under root/benchmarks: the modules of benchmarks, tests or research it imports}."""
    files = sorted((root / "benchmarks").rglob("*.py"))
    known = {module_name(root, f) for f in files}
    out = {}
    for f in files:
        deps = imports(root, f, known)
        out[module_name(root, f)] = {d for d in deps if d.split(".")[0] in ("benchmarks", "tests", "research")}
    return out


def private(module: str) -> bool:
    return module.rpartition(".")[2].startswith("_") and module != HARNESS and not module.startswith(HARNESS + ".")


def problems(g: dict[str, set[str]]) -> list[str]:
    out = []
    for mod, deps in sorted(g.items()):
        in_harness = mod == HARNESS or mod.startswith(HARNESS + ".")
        for d in sorted(deps):
            if d.split(".")[0] in ("tests", "research"):
                out.append(f"{mod} imports {d}")
            elif d in ("benchmarks", HARNESS) or d.startswith(HARNESS + "."):
                continue
            elif in_harness:
                out.append(f"{mod} (the harness) imports {d}")
            elif not private(d):
                out.append(f"{mod} imports the benchmark {d}")
            elif d.rpartition(".")[0] != mod.rpartition(".")[0] and d.rpartition(".")[0] != mod:
                out.append(f"{mod} imports {d}, a part of another topic")
    return out + [f"import cycle: {' -> '.join(c)}" for c in cycles(g)]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected knot met by a depth-first walk (enough to name each)."""
    found, state = [], {}

    def walk(node: str, path: list[str]) -> None:
        state[node] = "open"
        for d in sorted(g.get(node, ())):
            if state.get(d) == "open":
                found.append(path[path.index(d) :] + [d])
            elif d not in state:
                walk(d, path + [d])
        state[node] = "done"

    for node in sorted(g):
        if node not in state:
            walk(node, [node])
    return found


def test_no_benchmark_imports_another():
    g = graph(ROOT)
    assert len(g) > 10, "benchmarks/ not found"
    assert not problems(g), "benchmarks/ layout:\n" + "\n".join(problems(g))


def test_every_part_is_used_in_its_topic():
    g = graph(ROOT)
    used = {d for deps in g.values() for d in deps}
    unused = [m for m in g if private(m) and m not in used]
    assert not unused, f"private parts no benchmark of their topic imports: {unused}"


def test_checker_sees_each_kind_of_violation(tmp_path):
    """The oracle for the checker itself: a made-up tree with one violation of each rule, and a clean one."""
    files = {
        "benchmarks/__init__.py": "",
        "benchmarks/_harness/__init__.py": "",
        "benchmarks/_harness/tools.py": "from benchmarks._harness import ROOT\n",
        "benchmarks/a/__init__.py": "",
        "benchmarks/a/one.py": "from benchmarks._harness import ROOT\nfrom benchmarks.a import _part\n",
        "benchmarks/a/_part.py": "from . import _other\n",
        "benchmarks/a/_other.py": "from benchmarks.a._part import X\n",  # a cycle with _part
        "benchmarks/b/__init__.py": "",
        "benchmarks/b/two.py": "from benchmarks.a.one import f\nimport benchmarks.a._part\nfrom tests.x import y\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = problems(graph(tmp_path))
    assert "benchmarks.b.two imports the benchmark benchmarks.a.one" in found
    assert "benchmarks.b.two imports benchmarks.a._part, a part of another topic" in found
    assert "benchmarks.b.two imports tests.x" in found
    assert any(p.startswith("import cycle: benchmarks.a._") for p in found)
    assert len(found) == 4, found
    (tmp_path / "benchmarks/a/_other.py").write_text("X = 1\n")
    (tmp_path / "benchmarks/b/two.py").write_text("from benchmarks._harness.tools import ROOT\n")
    assert problems(graph(tmp_path)) == []
