"""The resolution rules (laplacianformer.train.geometry): the engine trains the model the protocols check."""

from __future__ import annotations

import pytest

from laplacianformer.train.config import TrainConfig
from laplacianformer.train.engine import build_model
from laplacianformer.train.geometry import SMALL_IMAGE, check_geometry, geometry, model_kwargs_for


def test_small_images_get_stem_stride_2_unless_the_recipe_sets_one():
    assert model_kwargs_for(None, SMALL_IMAGE - 1) == {"stem_stride": 2}
    assert model_kwargs_for({"stem_stride": 4}, 28) == {"stem_stride": 4}
    assert model_kwargs_for({"depths": [1, 1, 1, 1]}, SMALL_IMAGE) == {"depths": [1, 1, 1, 1]}


@pytest.mark.parametrize("img_size, model_kwargs", [(28, {}), (32, {"stem_stride": 4}), (128, {})])
def test_geometry_checks_the_model_the_engine_builds(img_size, model_kwargs):
    """Without stem_stride in the recipe, a 28 px run trains with stride 2: geometry sees 14×14 tokens too."""
    config = TrainConfig(model="laplacianformer_micro", img_size=img_size, model_kwargs=model_kwargs)
    net = build_model(config, num_classes=10, in_chans=1)
    side = -(-img_size // net.feature_info[0]["reduction"])
    geom = geometry(dict(model="laplacianformer_micro", img_size=img_size, model_kwargs=model_kwargs,
                         data="fashion-mnist"))
    assert geom["stage1_tokens"] == side * side and geom["stage1_grid"] == [side, side]


def test_check_geometry_names_the_stride_in_effect():
    rec = dict(model="laplacianformer_micro", img_size=16, data="fashion-mnist")
    with pytest.raises(ValueError, match=r"stage 1 has 64 tokens \(img_size 16, stem stride 2\)"):
        check_geometry(geometry(rec), rec)
