"""``create_model(..., check_finite_inputs=True)`` (issue 43, item 5): a NaN/Inf image is a ValueError naming ``x``
and its batch index, checked once at the model's input (the stem), on every path: forward, forward_features,
timm's features_only; off by default; a scripted model runs without the check."""

import pytest
import torch

from laplacianformer.models import create_model
from laplacianformer.models.laplacianformer import OverlapPatchEmbed


def images(bad_rows=(1,)):
    x = torch.randn(3, 1, 16, 16)
    for row in bad_rows:
        x[row, 0, 5, 7] = float("nan")
    return x


def small(**kw):
    return create_model("laplacianformer_micro", num_classes=3, in_chans=1, stem_stride=2, **kw).eval()


def test_model_names_x_and_the_batch_index():
    model = small(check_finite_inputs=True)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"^x: contains NaN or Inf values at batch index 1$"):
            model(images())
        with pytest.raises(ValueError, match=r"^x: contains NaN or Inf values at batch index 0 \(and 1 more"):
            model.forward_features(images((0, 2)))
        assert model(torch.randn(2, 1, 16, 16)).isfinite().all()
        assert small()(images()).isnan().any()  # off by default: NaN passes through, as before
    assert "check_finite_inputs" not in model.config  # a runtime guard, not the architecture


def test_timm_kwargs_and_features_only():
    timm = pytest.importorskip("timm")
    with torch.no_grad():
        model = timm.create_model("laplacianformer_micro", num_classes=3, in_chans=1, stem_stride=2,
                                  check_finite_inputs=True)
        with pytest.raises(ValueError, match="^x: contains NaN or Inf values at batch index 1"):
            model(images())
        features = timm.create_model("laplacianformer_micro", features_only=True, in_chans=1, stem_stride=2,
                                     check_finite_inputs=True)
        with pytest.raises(ValueError, match="^x: contains NaN or Inf values at batch index 1"):
            features(images())


def test_scripted_stem_has_no_check():
    stem = OverlapPatchEmbed(1, 8, check_finite_inputs=True)
    scripted = torch.jit.script(stem)
    assert scripted(images()).shape == (3, 8, 4, 4)
    with pytest.raises(ValueError, match="^x: contains NaN"):
        stem(images())
