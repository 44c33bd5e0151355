"""Static checks of the package structure of docs/ARCHITECTURE.md, read from the source with ``ast``.

Nothing of ``laplacianformer`` is imported: every check parses the files under ``src/laplacianformer``.

- no import cycles between modules, counting imports at module level and inside functions;
- the layer rule: a unit imports only the units below it (table ``MAY_IMPORT``);
- optional extras (timm, torchvision, onnx, triton, ...) are imported inside functions only, except in
  the gated modules that exist to hold them;
- ops never imports layers (nor anything above them); the attention operator has one Nyström core
  (``ops/nystrom.py``) that the plain op and the lean recompute both run, and its settings travel as one
  ``AttentionSettings`` (only the public keyword entry points take them one by one);
- no file of the repository's code cites documents that live outside the repository.

An import ``from .a import b`` is an edge to the module ``a.b`` when ``a/b.py`` (or ``a/b/``) exists,
else to ``a``; ``import a.b`` is an edge to ``a.b``. Parent packages that Python runs on the way are not
counted as edges (every submodule would otherwise form a cycle with its package's ``__init__``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = "laplacianformer"
ROOT_UNIT = "<package root>"  # laplacianformer/__init__.py, the public facade

# The layer rule (docs/ARCHITECTURE.md). Units are the first component under laplacianformer/; a unit
# may import itself and the units listed here, nothing else.
_BELOW_HUB = {"ops", "layers", "baselines", "models"}
MAY_IMPORT: dict[str, set[str]] = {
    # foundations: import nothing of the package
    "ops": set(),
    "checkpoint": set(),
    "data": set(),
    "cmdline": set(),  # argparse value types of the command lines
    "heap": set(),  # the CPU allocator setting (glibc's mallopt)
    # modules (nn.Module building blocks); baselines use the layers' TokenAttention shell
    "layers": {"ops"},
    "baselines": {"ops", "layers"},
    # backbones, registry, MAC counting, timm entry points, export
    "models": {"ops", "layers", "baselines"},
    # save/load of models: above models
    "hub": _BELOW_HUB | {"checkpoint"},
    # applications; experiments may run training, train and detection do not import each other
    "train": _BELOW_HUB | {"hub", "checkpoint", "data"},
    "detection": _BELOW_HUB | {"hub", "checkpoint", "data", "train", "cmdline"},
    "experiments": _BELOW_HUB | {"hub", "checkpoint", "data", "train"},
    # the benchmarks time everything up to the detectors; the demo trains and shows a model's cost (bench)
    "bench": _BELOW_HUB | {"hub", "checkpoint", "data", "train", "detection", "cmdline", "heap"},
    "demo": _BELOW_HUB | {"hub", "checkpoint", "data", "train", "bench"},
    # the command line sits on top
    "cli": _BELOW_HUB | {"hub", "checkpoint", "data", "train", "detection", "experiments", "bench", "demo", "cmdline",
                         "heap"},
    # the facade re-exports the library part only (keeps `import laplacianformer` light)
    ROOT_UNIT: _BELOW_HUB | {"hub", "checkpoint", "heap"},
    "__main__": {"cli"},
}

# Optional extras: imported inside functions only, so the package imports without them.
OPTIONAL = {"timm", "torchvision", "pycocotools", "onnx", "onnxscript", "onnxruntime", "triton", "sklearn",
            "PIL", "hypothesis"}
# Modules that exist to hold one extra; they import it at module level and are themselves imported lazily
# (at module level only by modules gated by the same extras).
GATED = {
    f"{PKG}.ops._triton_common": {"triton"},
    f"{PKG}.ops.kernel.triton": {"triton"},
    f"{PKG}.ops.newton_schulz.triton": {"triton"},
    f"{PKG}.ops.normalization.triton": {"triton"},
    f"{PKG}.ops.streaming.triton": {"triton"},
    f"{PKG}.ops.streaming.landmarks_triton": {"triton"},
    f"{PKG}.ops.streaming.backward_stats_triton": {"triton"},
    f"{PKG}.ops.streaming.backward_landmarks_triton": {"triton"},
    f"{PKG}.ops.streaming.backward_rows_triton": {"triton"},
}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    lazy: bool  # inside a function body

    def __str__(self) -> str:
        where = "in a function" if self.lazy else "module level"
        return f"{self.src} -> {self.dst} ({_rel(self.src)}:{self.line}, {where})" if self.src in MODULES else \
            f"{self.src} -> {self.dst} (line {self.line}, {where})"


def _modules() -> dict[str, Path]:
    """Dotted module name -> file; a package is its __init__.py."""
    out = {}
    for path in sorted((SRC / PKG).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _rel(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _known_prefix(name: str) -> str | None:
    """The longest prefix of a dotted name that is a module of the package."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in MODULES:
            return cand
        parts.pop()
    return None


def _imports(module: str):
    """(node, lazy) for every import statement of a module; lazy = inside a function or lambda."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), filename=str(MODULES[module]))

    def walk(node, lazy):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, lazy
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from walk(child, inner)

    yield from walk(tree, False)


def _targets(module: str, node) -> list[str]:
    """Modules of the package an import statement reaches (see the module docstring)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
        return [t for t in (_known_prefix(n) for n in names if n == PKG or n.startswith(PKG + ".")) if t]
    if node.level:
        base = module.split(".") if _is_package(module) else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        base_name = ".".join(base + ([node.module] if node.module else []))
    else:
        if node.module is None or not (node.module == PKG or node.module.startswith(PKG + ".")):
            return []
        base_name = node.module
    out = []
    for alias in node.names:
        sub = f"{base_name}.{alias.name}"
        target = sub if sub in MODULES else _known_prefix(base_name)
        if target and target not in out:
            out.append(target)
    return out


def _edges() -> list[Edge]:
    edges = []
    for module in MODULES:
        for node, lazy in _imports(module):
            for dst in _targets(module, node):
                if dst != module:
                    edges.append(Edge(module, dst, node.lineno, lazy))
    return edges


EDGES = _edges()


def _unit(module: str) -> str:
    parts = module.split(".")
    return ROOT_UNIT if len(parts) == 1 else parts[1]


def _cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One cycle (as its edges) per strongly connected component with more than one module."""
    graph: dict[str, list[Edge]] = {}
    for e in edges:
        graph.setdefault(e.src, []).append(e)
    index, low, on_stack, stack, comps = {}, {}, set(), [], []

    def connect(v):  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in graph.get(v, []):
            if e.dst not in index:
                connect(e.dst)
                low[v] = min(low[v], low[e.dst])
            elif e.dst in on_stack:
                low[v] = min(low[v], index[e.dst])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted({e.src for e in edges} | {e.dst for e in edges}):
        if v not in index:
            connect(v)

    cycles = []
    for comp in comps:
        start = min(comp)
        # breadth-first search inside the component for the shortest way back to start
        prev: dict[str, Edge] = {}
        frontier, closing = [start], None
        while frontier and closing is None:
            nxt = []
            for v in frontier:
                for e in graph.get(v, []):
                    if e.dst not in comp:
                        continue
                    if e.dst == start:
                        closing = e
                        break
                    if e.dst not in prev:
                        prev[e.dst] = e
                        nxt.append(e.dst)
                if closing:
                    break
            frontier = nxt
        path, v = [closing], closing.src
        while v != start:
            path.append(prev[v])
            v = prev[v].src
        cycles.append(path[::-1])
    return cycles


def test_the_scan_sees_the_package():
    assert f"{PKG}.ops.attention" in MODULES and f"{PKG}.cli" in MODULES
    # relative imports resolve: the operator reaches its core, its settings and the validation module
    dsts = {e.dst for e in EDGES if e.src == f"{PKG}.ops.attention"}
    assert {f"{PKG}.ops.nystrom", f"{PKG}.ops.settings", f"{PKG}.ops.validation"} <= dsts, dsts


def test_cycle_finder_on_a_planted_graph():
    a, b, c, d = (f"{PKG}.ops.{x}" for x in "abcd")
    edges = [Edge(a, b, 1, False), Edge(b, c, 2, True), Edge(c, a, 3, False), Edge(c, d, 4, False)]
    (cycle,) = _cycles(edges)
    assert [(e.src, e.dst) for e in cycle] == [(a, b), (b, c), (c, a)]
    assert _cycles(edges[:2] + edges[3:]) == []


def test_no_import_cycles():
    cycles = _cycles(EDGES)
    report = "\n\n".join("cycle:\n  " + "\n  ".join(str(e) for e in cyc) for cyc in cycles)
    assert not cycles, f"{len(cycles)} import cycle(s) between modules of src/{PKG}:\n{report}"


def test_every_unit_is_in_the_layer_table():
    units = {_unit(m) for m in MODULES}
    missing = sorted(units - set(MAY_IMPORT))
    assert not missing, (f"units {missing} are not in MAY_IMPORT: place them in the layer table of "
                         "docs/ARCHITECTURE.md and of this test")


def test_layer_rule():
    bad = [e for e in EDGES
           if _unit(e.dst) != _unit(e.src) and _unit(e.dst) not in MAY_IMPORT.get(_unit(e.src), set())]
    report = "\n  ".join(f"{_unit(e.src)} may not import {_unit(e.dst)}: {e}" for e in bad)
    assert not bad, f"{len(bad)} import(s) break the layer rule of docs/ARCHITECTURE.md:\n  {report}"


def test_optional_extras_are_imported_lazily():
    bad = []
    for module in MODULES:
        allowed = GATED.get(module, set())
        for node, lazy in _imports(module):
            if lazy:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if node.module and not node.level else [])
            for name in names:
                top = name.split(".")[0]
                if top in OPTIONAL and top not in allowed:
                    bad.append(f"{_rel(module)}:{node.lineno} imports {name} at module level")
    # the gated modules themselves are reached only from inside functions, or from modules gated by the same extras
    for e in EDGES:
        if e.dst in GATED and not e.lazy and not GATED[e.dst] <= GATED.get(e.src, set()):
            bad.append(f"{e}: a gated module ({', '.join(sorted(GATED[e.dst]))}) imported at module level")
    assert not bad, "optional extras must be imported inside functions:\n  " + "\n  ".join(bad)


def test_ops_never_imports_layers():
    bad = [e for e in EDGES if _unit(e.src) == "ops" and _unit(e.dst) != "ops"]
    assert not bad, "ops may not import any unit of the package (layers included):\n  " + "\n  ".join(map(str, bad))


def _functions(module: str):
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _settings_fields() -> set[str]:
    """The field names of ``AttentionSettings`` (ops/settings.py), read from the class body."""
    tree = ast.parse(MODULES[f"{PKG}.ops.settings"].read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AttentionSettings"]
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)} - {"head_dim"}


# the public functions whose keyword API spells the settings out (they build one AttentionSettings)
KEYWORD_ENTRY_POINTS = {"laplacian_attention", "laplacian_attention_recompute", "default_bandwidth"}
CORE_USERS = (f"{PKG}.ops.attention", f"{PKG}.ops.recompute", f"{PKG}.ops.nystrom", f"{PKG}.layers.laplacian_attention")
CORE_STEPS = {"regularised_inverse", "normalize_nystrom", "normalize_dense", "laplace_kernel", "laplace_kernel_matmul"}


def test_settings_travel_as_one_object():
    names = _settings_fields()
    assert {"kernel", "lam", "norm", "landmarks", "solver"} <= names, names
    bad = []
    for module in CORE_USERS:
        for fn in _functions(module):
            args = fn.args
            params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
            spelled = sorted(params & names)
            if spelled and fn.name not in KEYWORD_ENTRY_POINTS:
                bad.append(f"{_rel(module)}:{fn.lineno} {fn.name}({', '.join(spelled)})")
    assert not bad, ("pass the operator settings as one AttentionSettings, not one by one:\n  " + "\n  ".join(bad))


def test_one_nystrom_core():
    """The plain operator and the lean recompute run ``ops/nystrom.py``; neither repeats its steps."""
    for module in (f"{PKG}.ops.attention", f"{PKG}.ops.recompute"):
        assert any(e.src == module and e.dst == f"{PKG}.ops.nystrom" for e in EDGES), module
        calls = {n.func.id for n in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8")))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert not calls & CORE_STEPS, f"{_rel(module)} calls {sorted(calls & CORE_STEPS)}: use ops/nystrom.py"


# Documents outside the repository; the names are split so that this file does not match itself.
FOREIGN = ("SPEC" + ".md", "ANCHORS" + ".md", "shared" + "/")
SCANNED = ("src", "benchmarks", "tests")


def _text_files():
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            data = path.read_bytes()
            if b"\0" in data:
                continue
            try:
                yield path, data.decode("utf-8")
            except UnicodeDecodeError:
                continue


def test_no_citation_of_documents_outside_the_repository():
    hits = []
    for path, text in _text_files():
        for lineno, line in enumerate(text.splitlines(), 1):
            for needle in FOREIGN:
                if needle.lower() in line.lower():
                    hits.append(f"{path.relative_to(ROOT)}:{lineno}: {needle}")
    assert not hits, ("cite docs/ of the repository instead of documents outside it:\n  " + "\n  ".join(hits))
