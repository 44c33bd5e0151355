"""``torch.export.export`` with ``Dim`` ranges of H and W on the registered models (issue 43): one program per
range equals eager mode at the range's smallest size, an odd size inside it and its largest side. The models
keep their heads per stage (what the graph's reshapes see) at one block per stage and 4 channels per head;
every model, range and the features_only backbone at once, and the full sizes, are in the slow set.
Relative error: max|program - eager| / max|eager|."""

import pytest
import torch
from torch.export import Dim

from laplacianformer.models import create_model, list_models
from laplacianformer.models.registry import model_config

RANGES = [(64, 512), (33, 1024), (224, 2048)]


def _reduced(name: str, features_only: bool = False):
    """``name`` with its heads per stage, one block per stage and 4 channels per head."""
    torch.manual_seed(0)
    heads = model_config(name)["num_heads"]
    size = dict(depths=(1,) * len(heads), embed_dims=tuple(4 * h for h in heads))
    return create_model(name, **size, **(dict(features_only=True) if features_only else dict(num_classes=5))).eval()


def _sizes(low: int, high: int) -> list[tuple[int, int]]:
    """The smallest size, an odd size inside the range (no side a multiple of the strides) and the largest
    side, against the smallest other side (cheap)."""
    return [(low, low), ((low + high) // 2 | 1, (2 * low + high) // 3 | 1), (high, low)]


def _relative(out, ref) -> float:
    if isinstance(ref, (list, tuple)):
        return max(_relative(o, r) for o, r in zip(out, ref))
    assert out.shape == ref.shape
    return float((out - ref).abs().max() / ref.abs().max())


def _agrees(model, program, low: int, high: int, batch: int = 1) -> None:
    run = program.module()
    for h, w in _sizes(low, high):
        x = torch.randn(batch, 3, h, w)
        with torch.no_grad():
            err = _relative(run(x), model(x))
        assert err < 1e-4, ((h, w), err)


def _export(model, low: int, high: int, batch: int = 1):
    """Plain ``torch.export.export`` with a fixed batch and H, W in [low, high]: the call of issue 43."""
    dims = {2: Dim("h", min=low, max=high), 3: Dim("w", min=low, max=high)}
    return torch.export.export(model, (torch.randn(batch, 3, low + 3, low + 1),), dynamic_shapes=(dims,))


def test_plain_torch_export_with_the_range_64_512():
    """The issue's call: a fixed batch of 2 (guards on 2 % (2·grid) failed it), laplacianformer_micro."""
    model = _reduced("laplacianformer_micro")
    _agrees(model, _export(model, 64, 512, batch=2), 64, 512, batch=2)


def test_plain_torch_export_with_the_range_33_1024_of_a_features_only_backbone():
    """From the total stride + 1 (a last stage of 2 tokens) up; every map of laplacianformer_tiny's backbone."""
    model = _reduced("laplacianformer_tiny", features_only=True)
    _agrees(model, _export(model, 33, 1024), 33, 1024)


def test_export_program_with_the_range_224_2048_and_a_dynamic_batch():
    """``export_program(hw_range=...)``: Dims for the batch too, laplacianformer_medium (5 and 10 heads)."""
    from laplacianformer.models.export import export_program

    model = _reduced("laplacianformer_medium")
    program = export_program(model, torch.randn(1, 3, 240, 230), hw_range=(224, 2048))
    _agrees(model, program, 224, 2048, batch=3)


def test_export_program_refuses_a_range_reaching_a_last_stage_of_one_token():
    """At a side <= the total stride the last stage has 1 token, a size torch.export cannot keep dynamic."""
    from laplacianformer.models.export import export_program

    with pytest.raises(ValueError, match=r"^hw_range: expected 32 < min <= max .* got \(32, 1024\)"):
        export_program(_reduced("laplacianformer_micro"), torch.randn(1, 3, 64, 64), hw_range=(32, 1024))


@pytest.mark.slow
@pytest.mark.parametrize("features_only", [False, True], ids=["classifier", "features_only"])
@pytest.mark.parametrize("low, high", RANGES)
@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_exports_every_range(name, low, high, features_only):
    """36 exports of the reduced models (5-10 s each on an idle 2-core machine)."""
    model = _reduced(name, features_only=features_only)
    _agrees(model, _export(model, low, high), low, high)


@pytest.mark.slow
@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_at_full_size_exports_a_range(name):
    """The full sizes (huge: minutes to trace on 2 cores), H, W in [64, 512]."""
    torch.manual_seed(0)
    model = create_model(name, num_classes=5).eval()
    _agrees(model, _export(model, 64, 512), 64, 512)


@pytest.mark.slow
def test_plain_torch_export_names_the_smallest_side_of_a_range():
    """A plain ``torch.export.export`` with min <= the total stride fails in torch's own layout guards on the
    1-token last stage; its message names the bound (33) and suggests the Dim."""
    with pytest.raises(Exception, match=r"(?s)33 <= L\['x'\]\.size\(\)\[2\].*Suggested fixes:.*min=33"):
        _export(_reduced("laplacianformer_micro"), 32, 1024)
