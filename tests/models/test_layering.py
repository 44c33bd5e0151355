"""The package's import graph (module-level and function-level imports, read from the source): no import
cycles between modules, and each layer imports only layers below it:
ops <- layers <- models <- hub <- train / experiments / baselines <- cli."""

from __future__ import annotations

import ast
from pathlib import Path

import laplacianformer

SRC = Path(laplacianformer.__file__).resolve().parent
# the layer of each top-level part of the package; a module may import only modules of a lower or equal rank
RANK = {
    "checkpoint": 0, "ops": 0, "data": 0,
    "layers": 1,
    "models": 2, "detection": 3, "baselines": 2,
    "hub": 3,
    "train": 4, "experiments": 5,
    "cli": 6, "__main__": 7, "__init__": 7,
}


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in SRC.rglob("*.py"):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, (path, is_pkg) in mods.items():
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = ".".join(base[: len(base) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else (node.module or "")
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            deps |= {n for n in names if n in mods and n != name}
        graph[name] = deps
    return graph


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_import_cycles_outside_ops():
    graph = _graph()
    # cycles inside ops/ (its own package-level re-exports) are the ops package's business
    graph = {m: {d for d in deps if not (_part(m) == _part(d) == "ops")} for m, deps in graph.items()}
    seen, on_path, cycles = set(), [], []

    def visit(m):
        if m in on_path:
            cycles.append(on_path[on_path.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        on_path.append(m)
        for d in sorted(graph[m]):
            visit(d)
        on_path.pop()

    for m in sorted(graph):
        visit(m)
    assert cycles == []


def test_each_layer_imports_only_lower_layers():
    bad = [(m, d) for m, deps in _graph().items() for d in deps
           if _part(m) != _part(d) and RANK[_part(d)] > RANK[_part(m)]]
    assert bad == []
    graph = _graph()
    assert not any(_part(d) == "hub" for m in graph if _part(m) == "models" for d in graph[m])
