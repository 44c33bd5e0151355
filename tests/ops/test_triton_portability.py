"""Triton source rules that keep the kernels compiling on every Triton a supported torch brings.

The first real GPU run (benchmarks/results/gpu_check, torch 2.11 with Triton 3.6) failed to compile every
kernel-matrix and Newton–Schulz kernel because a ``@triton.jit`` helper had a default argument
(``CACHE: tl.constexpr = ""``): Triton 3.8 wraps such a default as a constexpr, 3.6 passes the plain Python
value and the front end fails. The AOT check compiles with the installed Triton only, so this static rule
guards the older ones: no ``@triton.jit`` function in the package has a default argument.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import laplacianformer

PACKAGE = Path(laplacianformer.__file__).parent


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "jit" and getattr(target.value, "id", "") == "triton"


def _jit_functions_with_defaults() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(_is_triton_jit(d) for d in node.decorator_list):
                if node.args.defaults or any(d is not None for d in node.args.kw_defaults):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    return found


def test_the_rule_sees_the_jit_functions():
    sources = [p.read_text() for p in PACKAGE.rglob("*.py")]
    jitted = sum(s.count("@triton.jit") for s in sources)
    assert jitted >= 10, "the package's Triton kernels were not found: the rule below would check nothing"


def test_no_triton_jit_function_has_a_default_argument():
    assert _jit_functions_with_defaults() == [], (
        "a @triton.jit function with a default argument does not compile on Triton 3.6 (torch 2.11): "
        "pass the value explicitly from every caller"
    )


def test_the_rule_catches_a_default(tmp_path, monkeypatch):
    (tmp_path / "k.py").write_text(
        "import triton\nimport triton.language as tl\n\n@triton.jit\ndef f(x, C: tl.constexpr = ''):\n    pass\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert _jit_functions_with_defaults() == ["k.py:5 f"]
