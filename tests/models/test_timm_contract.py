"""timm's model-test contract, run on our family (micro keeps it fast), and cross-variant loading."""

import pytest
import torch

from laplacianformer.models import MODEL_CONFIGS, checkpoint_filter_fn, create_model

timm = pytest.importorskip("timm")

NAME = "laplacianformer_micro"


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return timm.create_model(NAME, num_classes=7)


def test_timm_create_model_kwargs_and_registry():
    assert "laplacianformer_tiny" in timm.list_models("laplacianformer_*")
    m = timm.create_model(NAME, num_classes=10, drop_path_rate=0.1, in_chans=1)
    assert m.num_classes == 10 and m.in_chans == 1
    assert m.stages[-1].blocks[-1].drop_path1.p == pytest.approx(0.1)
    assert m(torch.randn(1, 1, 64, 64)).shape == (1, 10)


def test_forward_no_nan_and_every_param_gets_grad(model):
    model.train()
    out = model(torch.randn(2, 3, 64, 64))
    assert torch.isfinite(out).all()
    out.mean().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    model.zero_grad(set_to_none=True)


def test_grad_checkpointing_gives_identical_output(model):
    model.eval()
    x = torch.randn(1, 3, 64, 64)
    ref = model(x)
    model.set_grad_checkpointing(True)
    try:
        with torch.enable_grad():
            out = model(x)
    finally:
        model.set_grad_checkpointing(False)
    torch.testing.assert_close(out, ref)


def test_cfg_names_and_feature_shape(model):
    cfg = model.pretrained_cfg
    names = dict(model.named_modules())
    assert cfg["first_conv"] in names and cfg["classifier"] in names
    x = torch.randn(1, *cfg["input_size"])
    with torch.no_grad():
        feats = model.forward_features(x)
    assert feats.shape == (1, model.num_features, *cfg["pool_size"])
    assert model.head_hidden_size == model.num_features
    assert model.forward_head(feats, pre_logits=True).shape == (1, model.num_features)


def test_reset_classifier():
    m = timm.create_model(NAME, num_classes=7).eval()
    x = torch.randn(1, 3, 64, 64)
    m.reset_classifier(0)
    assert m(x).shape == (1, m.num_features)
    m.reset_classifier(0, "")
    assert m(x).shape == (1, m.num_features, 2, 2)
    m.reset_classifier(3, "avg")
    assert m(x).shape == (1, 3) and m.get_classifier().out_features == 3


def test_features_only_strides_and_channels():
    f = timm.create_model(NAME, features_only=True, out_indices=(0, 1, 2, 3))
    assert f.feature_info.reduction() == [4, 8, 16, 32]
    assert f.feature_info.channels() == [32, 64, 128, 256]
    maps = f(torch.randn(1, 3, 64, 96))
    assert [tuple(m.shape[1:]) for m in maps] == [(32, 16, 24), (64, 8, 12), (128, 4, 6), (256, 2, 3)]
    f = timm.create_model(NAME, features_only=True, out_indices=(2, 3))
    assert f.feature_info.reduction() == [16, 32]


def test_forward_intermediates_and_prune(model):
    model.eval()
    x = torch.randn(1, 3, 96, 64)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        assert torch.equal(final, model.forward_features(x))
        assert len(maps) == 4 and torch.equal(maps[-1], final)
        early = model.forward_intermediates(x, indices=[1], intermediates_only=True)
    assert early[0].shape == (1, 64, 12, 8)
    m = create_model(NAME)
    assert m.prune_intermediate_layers([0, 1]) == [0, 1]
    assert len(m.stages) == 2 and m.num_features == 64


def test_group_matcher_and_no_weight_decay(model):
    matcher = model.group_matcher()
    assert set(matcher) == {"stem", "blocks"}
    assert isinstance(model.no_weight_decay(), set)


@pytest.mark.parametrize(
    "src, dst", [("laplacian", "gaussian"), ("laplacian", "softmax"), ("softmax", "laplacian")]
)
def test_checkpoint_filter_fn_across_attention_variants(src, dst):
    torch.manual_seed(0)
    a = create_model(NAME, attn=src, num_classes=5)
    b = create_model(NAME, attn=dst, num_classes=5)
    sd = {"module." + k: v for k, v in a.state_dict().items()}
    b.load_state_dict(checkpoint_filter_fn(sd, b), strict=True)
    pa, pb = a.state_dict(), b.state_dict()
    torch.testing.assert_close(pb["stages.1.blocks.0.mlp.fc1.weight"], pa["stages.1.blocks.0.mlp.fc1.weight"])
    torch.testing.assert_close(pb["head.weight"], pa["head.weight"])
    prefix = "stages.0.blocks.0.attn."
    dim = 32
    if dst == "softmax":
        torch.testing.assert_close(pb[prefix + "q.weight"], pa[prefix + "qkv.weight"][:dim])
        torch.testing.assert_close(pb[prefix + "kv.weight"], pa[prefix + "qkv.weight"][dim:])
    elif src == "softmax":
        torch.testing.assert_close(pb[prefix + "qkv.weight"], torch.cat([pa[prefix + "q.weight"], pa[prefix + "kv.weight"]]))


def test_checkpoint_filter_fn_tied_keys_and_shape_errors():
    tied = create_model(NAME, attn_kwargs=dict(tie_qk=True))
    soft = create_model(NAME, attn="softmax")
    soft.load_state_dict(checkpoint_filter_fn(tied.state_dict(), soft))
    w = tied.state_dict()["stages.0.blocks.0.attn.qkv.weight"]
    torch.testing.assert_close(soft.state_dict()["stages.0.blocks.0.attn.kv.weight"], torch.cat([w[:32], w[32:]]))
    bigger = create_model("laplacianformer_tiny")
    with pytest.raises(ValueError, match="^state_dict: "):
        checkpoint_filter_fn(bigger.state_dict(), create_model(NAME))


@pytest.mark.parametrize("name", list(MODEL_CONFIGS))
def test_every_table_entry_is_registered_with_a_consistent_cfg(name):
    """One ``MODEL_CONFIGS`` entry is a timm model whose pretrained cfg fits the model it builds."""
    from laplacianformer.models.laplacianformer import default_cfgs

    assert name in timm.list_models("laplacianformer_*")
    cfg = timm.models.get_pretrained_cfg(name).to_dict()
    for key in ("num_classes", "input_size", "pool_size", "first_conv", "classifier", "mean", "std",
                "interpolation", "crop_pct"):
        assert cfg[key] == default_cfgs[name][key], key
    with torch.device("meta"):  # the architecture without allocating the large sizes
        model = timm.create_model(name)
        plain = create_model(name)
    for m in (model, plain):
        assert m.pretrained_cfg["architecture"] == name
        assert {k: m.pretrained_cfg[k] for k in ("num_classes", "input_size", "mean", "std")} == {
            k: cfg[k] for k in ("num_classes", "input_size", "mean", "std")}
        modules = dict(m.named_modules())
        assert modules[cfg["first_conv"]].in_channels == cfg["input_size"][0] == m.in_chans
        assert modules[cfg["classifier"]].out_features == cfg["num_classes"] == m.num_classes
        assert tuple(cfg["pool_size"]) == tuple(s // m.stride for s in cfg["input_size"][1:])
        assert len(cfg["mean"]) == len(cfg["std"]) == cfg["input_size"][0]
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters())


def test_registered_from_the_family_module_like_timm_families():
    """timm records the module of the entry points: ours is models/laplacianformer.py (as pvt_v2 for its
    family), not a registration shim."""
    from laplacianformer.models import laplacianformer as family

    assert set(timm.list_models(module="laplacianformer")) == set(MODEL_CONFIGS)
    assert timm.models.model_entrypoint(NAME) is family.entry_points[NAME]
    assert family.register_timm() is True  # idempotent: no second registration (timm would warn)


def test_pretrained_without_weights_is_a_clear_error_naming_the_model():
    for make in (lambda: timm.create_model(NAME, pretrained=True), lambda: create_model(NAME, pretrained=True)):
        with pytest.raises(RuntimeError, match=f"^No pretrained weights exist for {NAME} .*pretrained=False"):
            make()


def _ten_class_model():
    torch.manual_seed(0)
    return create_model(NAME, num_classes=10, attn_kwargs=dict(lam=2.0)).eval()


def test_pretrained_file_loads_its_head_and_settings(tmp_path):
    """A save_pretrained file of 10 classes: timm builds a 10-class model with the saved attention settings
    and loads every weight, the head included; an explicit num_classes still gets a new head."""
    from laplacianformer import save_pretrained

    src = _ten_class_model()
    cfg = dict(src.pretrained_cfg, num_classes=10, label_names=tuple("abcdefghij"))
    file = save_pretrained(src, tmp_path / "saved", pretrained_cfg=cfg) / "model.safetensors"
    (tmp_path / "saved" / "config.json").unlink()  # the file's own metadata is enough
    m = timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay=dict(file=str(file))).eval()
    assert m.num_classes == 10 and m.pretrained_cfg["num_classes"] == 10
    assert m.pretrained_cfg["label_names"] == tuple("abcdefghij")
    assert m.stages[0].blocks[0].attn.attn_kwargs["lam"] == 2.0
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(m(x), src(x))
    m5 = timm.create_model(NAME, pretrained=True, num_classes=5, pretrained_cfg_overlay=dict(file=str(file)))
    assert m5.num_classes == 5
    torch.testing.assert_close(m5.state_dict()["stages.0.blocks.0.attn.qkv.weight"],
                               src.state_dict()["stages.0.blocks.0.attn.qkv.weight"])
    with pytest.raises(ValueError, match="depths=.*create it as 'laplacianformer_micro'"):
        timm.create_model("laplacianformer_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(file)))
    # the same builder without going through timm.create_model
    plain = create_model(NAME, pretrained=True, pretrained_cfg_overlay=dict(file=str(file))).eval()
    assert plain.num_classes == 10 and plain.pretrained_cfg["label_names"] == tuple("abcdefghij")
    with torch.no_grad():
        assert torch.equal(plain(x), src(x))


def test_saved_configs_are_read_by_hub_only():
    """The family module reads no files: hub, the one reader of saved configs, hands it its reader."""
    from laplacianformer import hub
    from laplacianformer.models import laplacianformer as family

    assert family._weights_config is hub.weights_config


def test_create_model_takes_timm_builder_arguments():
    """``create_model`` and the entry points are one builder: timm's arguments work through either."""
    a = create_model(NAME, features_only=True, out_indices=(1, 3))
    b = timm.create_model(NAME, features_only=True, out_indices=(1, 3))
    assert a.feature_info.channels() == b.feature_info.channels() == [64, 256]


def test_pretrained_file_of_a_training_run(tmp_path):
    """A run directory's model.safetensors (training metadata, config.json beside it): the run's class
    count, input channels and stem stride come from the saved config."""
    from laplacianformer.checkpoint import save_weights
    from laplacianformer.hub import write_config

    torch.manual_seed(0)
    src = create_model(NAME, num_classes=10, in_chans=1, stem_stride=2).eval()
    cfg = dict(src.pretrained_cfg, input_size=(1, 32, 32), mean=(0.3,), std=(0.4,), num_classes=10)
    write_config(src, tmp_path, cfg)
    save_weights(src.state_dict(), tmp_path / "model.safetensors", {"model": NAME, "train_config": "{}"})
    m = timm.create_model(NAME, pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "model.safetensors")))
    assert (m.num_classes, m.in_chans, m.stride) == (10, 1, 16)
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        assert torch.equal(m.eval()(x), src(x))
