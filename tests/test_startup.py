"""A fast start (issue 42 item 3): ``import laplacianformer`` and the command line's parser import none of the
heavy modules (dynamo, timm, torchvision, onnx, triton) until used, and timm still gets the models when it is
imported before or after us (docs/MODELS.md, "timm"). Each check runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch._dynamo", "torch._inductor", "timm", "torchvision", "onnx", "triton")


def _python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _loaded_heavy() -> str:
    return f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"


def test_import_leaves_heavy_modules_out():
    assert _python("import sys, laplacianformer\n" + _loaded_heavy()).strip() == "[]"


def test_constant_result_marks_as_torch_compiler_does_without_dynamo(monkeypatch):
    import torch

    from laplacianformer.ops._runtime import constant_result

    theirs = vars(torch.compiler.assume_constant_result(lambda: 0))  # imports torch._dynamo
    monkeypatch.delitem(sys.modules, "torch._dynamo")  # as at ``import laplacianformer``
    assert vars(constant_result(lambda: 0)) == theirs != {}


def test_cli_help_and_flag_errors_import_no_heavy_module():
    out = _python("import sys\n"
                  "from laplacianformer.cli import main\n"
                  "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
                  "assert main(['train', '--epochs', '0']) == 2\n" + _loaded_heavy())
    assert out.strip().splitlines()[-1] == "[]", out


def test_timm_gets_the_models_whether_imported_before_or_after():
    check = ("m = timm.create_model('laplacianformer_micro', num_classes=3)\n"
             "assert type(m).__name__ == 'LaplacianFormer' and m.num_classes == 3\n"
             "assert len(timm.list_models(module='laplacianformer')) == 6\n"
             "from laplacianformer.models import register_timm\n"
             "assert register_timm() is True\n"
             "print('ok')\n")
    after = _python("import sys, warnings\nwarnings.simplefilter('error')\nimport laplacianformer\n"
                    "assert 'timm' not in sys.modules\nimport timm\n" + check)
    before = _python("import warnings\nwarnings.simplefilter('error')\nimport timm\nimport laplacianformer\n" + check)
    assert after.strip() == before.strip() == "ok"
