"""TorchScript through one adapter (``layers/scripting.py``; docs/ARCHITECTURE.md, "Scripting and tracing").

- a scripted layer or model computes what eager mode computes (1e-6, several input sizes, settings, masks,
  prefix tokens), and so does its torch.fx graph, also after the graph is scripted;
- ``torch.jit.script`` leaves the model's layers as they are (the model scripts a view of its tree); a layer
  scripted inside another module leaves its script form there, which computes, pickles and copies as the layer;
- the settings travel as ``PlainSettings`` and come back equal, for every field of ``AttentionSettings``;
- no layer file but the adapter holds TorchScript code or the settings as a key string.
"""

import copy
import dataclasses
import pickle
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import laplacianformer.layers as layers_package
from laplacianformer.layers import LaplacianAttention
from laplacianformer.layers import scripting
from laplacianformer.layers.scripting import PlainSettings, laplacian_attention_leaf, plain_settings, settings_of
from laplacianformer.models import create_model
from laplacianformer.ops.settings import AttentionSettings

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
    # torch's own GraphModule.__init__, read when a graph is scripted
    pytest.mark.filterwarnings("ignore:The TorchScript type system doesn't support instance-level annotations"),
]

TOL = dict(rtol=1e-6, atol=1e-6)


def _script(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.script(module)


class _Grid(nn.Module):
    """A foreign parent: a layer called on a fixed grid."""

    def __init__(self, layer, hw):
        super().__init__()
        self.attn, self.hw = layer, hw

    def forward(self, x):
        return self.attn(x, self.hw)


LAYERS = {
    "default": dict(),
    "tied-int-landmarks": dict(tie_qk=True, landmarks=4, lam=2.0),
    "exact-gaussian": dict(kernel="gaussian", landmarks=None, norm="inline"),
    "learned-scale-nodwconv": dict(norm_scale="learned", dwconv=False, kernel="cauchy"),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_scripted_layer_equals_eager_at_several_sizes(name):
    torch.manual_seed(0)
    layer = LaplacianAttention(32, 2, **{"landmarks": (3, 3), **LAYERS[name]}).eval()
    if layer.norm_gain is not None:
        with torch.no_grad():
            layer.norm_gain.uniform_(0.5, 1.5)
    scripted = _script(layer)
    assert scripted.original_name == "LaplacianAttentionScriptForm"
    for hw in ((4, 4), (5, 9), (12, 10)):
        x = torch.randn(2, hw[0] * hw[1], 32)
        with torch.no_grad():
            torch.testing.assert_close(scripted(x, hw), layer(x, hw), **TOL)


def test_scripted_layer_with_prefix_tokens_and_padding_mask():
    torch.manual_seed(0)
    prefixed = LaplacianAttention(16, 2, num_prefix_tokens=2, landmarks=(2, 2)).eval()
    scripted = _script(prefixed)
    for side in (3, 6):
        x = torch.randn(2, 2 + side * side, 16)
        with torch.no_grad():
            torch.testing.assert_close(scripted(x), prefixed(x), **TOL)  # the square grid after the prefix
    sequence = LaplacianAttention(16, 2, landmarks=5).eval()
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[1, 21:] = True
    x = torch.randn(2, 30, 16)
    with torch.no_grad():
        torch.testing.assert_close(_script(sequence)(x, None, mask), sequence(x, None, mask), **TOL)
    with pytest.raises(Exception, match="attn_mask, is_causal: not supported"):
        _script(sequence)(x, None, None, None, True)


@pytest.mark.parametrize("attn, attn_kwargs", [("laplacian", None), ("matern32", dict(tie_qk=True, landmarks=(2, 2)))])
def test_scripted_and_fx_model_equal_eager_at_several_sizes(attn, attn_kwargs):
    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", num_classes=7, attn=attn, attn_kwargs=attn_kwargs).eval()
    scripted = _script(model)
    graph = torch.fx.symbolic_trace(model)
    graph_scripted = _script(graph)
    for h, w in ((32, 32), (64, 48), (96, 96)):
        x = torch.randn(2, 3, h, w)
        with torch.no_grad():
            ref = model(x)
            torch.testing.assert_close(scripted(x), ref, **TOL)
            torch.testing.assert_close(graph(x), ref, **TOL)
            torch.testing.assert_close(graph_scripted(x), ref, **TOL)


def test_scripting_leaves_the_model_as_it_is_and_trains_its_parameters():
    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", num_classes=3, drop_path_rate=0.1)
    modules = list(model.modules())
    scripted = _script(model.train())
    assert list(model.modules()) == modules  # the same objects: script forms live in the scripted copy only
    assert all(type(m) is LaplacianAttention for m in modules if isinstance(m, LaplacianAttention))
    assert {id(p) for p in scripted.parameters()} == {id(p) for p in model.parameters()}
    scripted(torch.randn(2, 3, 32, 32)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_script_form_in_a_foreign_parent_is_the_layer():
    """torch.jit.script puts what ``__prepare_scriptable__`` returns into the parent's module dict; there the
    form computes, pickles and copies as the layer."""
    torch.manual_seed(0)
    layer = LaplacianAttention(16, 2, landmarks=(2, 2))
    parent = _Grid(layer, (4, 5)).eval()
    x = torch.randn(2, 20, 16)
    with torch.no_grad():
        want = parent(x)
    scripted = _script(parent)
    form = parent.attn
    assert isinstance(form, LaplacianAttention) and form is not layer and form.settings is layer.settings
    assert form.qkv is layer.qkv and form.dwconv is layer.dwconv
    with torch.no_grad():
        assert torch.equal(parent(x), want)  # the eager path of the layer (its fused inference included)
        torch.testing.assert_close(scripted(x), want, **TOL)
        torch.testing.assert_close(_script(parent)(x), want, **TOL)  # scripted again: a form of the layer
    assert type(parent.attn).__mro__[1:] == type(form).__mro__[1:]
    for again in (pickle.loads(pickle.dumps(parent)), copy.deepcopy(parent)):
        assert type(again.attn) is LaplacianAttention and vars(again.attn).keys() == vars(layer).keys()
        with torch.no_grad():
            assert torch.equal(again(x), want)
    with_options = LaplacianAttention.with_options(num_prefix_tokens=1)(16, 2)
    again = pickle.loads(pickle.dumps(with_options.__prepare_scriptable__()))
    assert isinstance(again, LaplacianAttention) and again.num_prefix_tokens == 1
    assert "ScriptForm" not in type(again).__name__


SETTINGS = [dict(), dict(landmarks=None), dict(landmarks=9, kernel="exponential", lam=0.5),
            dict(kernel="gaussian", norm="inline", iters=7, ns_eps=0.0, qk_scale=0.3),
            dict(norm_scale="inv_sqrt_n", solver="cg", ns_backward="unrolled", norm_eps=1e-4)]


@pytest.mark.parametrize("options", SETTINGS)
def test_plain_settings_round_trip(options):
    settings = AttentionSettings(8, **options)
    plain = plain_settings(settings)
    assert PlainSettings._fields == tuple(f.name for f in dataclasses.fields(AttentionSettings))
    assert all(isinstance(v, (int, float, str, list)) for v in plain)
    assert settings_of(plain) == settings
    as_script_gives_it = tuple(plain)  # TorchScript hands an ignored function its own NamedTuple class
    assert settings_of(as_script_gives_it) is settings_of(plain)


def test_fx_leaf_takes_the_settings_as_plain_values_and_survives_pickling():
    torch.manual_seed(0)
    layer = LaplacianAttention(16, 2, landmarks=(2, 3), lam=3.0).eval()
    graph = torch.fx.symbolic_trace(_Grid(layer, (4, 6)))
    leaves = [n for n in graph.graph.nodes if n.target is laplacian_attention_leaf]
    made = leaves[0].args[4]  # a node that makes the NamedTuple of constants
    assert len(leaves) == 1 and made.target is PlainSettings
    assert PlainSettings(*made.args) == plain_settings(layer.settings)
    x = torch.randn(1, 24, 16)
    with torch.no_grad():
        want = layer(x, (4, 6))
        scripting._settings_from.cache_clear()  # as in another process
        torch.testing.assert_close(pickle.loads(pickle.dumps(graph))(x), want, **TOL)


LAYER_FILES = sorted(p for p in Path(layers_package.__file__).parent.glob("*.py") if p.name != "scripting.py")
FORBIDDEN = {
    "is_scripting": r"is_scripting",
    "torch.jit.ignore": r"torch\.jit\.ignore",
    "torch.jit.unused": r"torch\.jit\.unused",
    "__jit_ attributes": r"__jit_\w+__",
    "settings as a key string": r"settings_key|from_key|settings\.key\b|_BY_KEY",
}
# tracing.is_fx_tracing: model forwards name it after their TorchScript check (an ``and`` TorchScript compiles)
ALLOWED = {("tracing.py", "torch.jit.unused"): 2}


def test_no_layer_file_but_the_adapter_knows_torchscript():
    assert LAYER_FILES and "token_attention.py" in {p.name for p in LAYER_FILES}
    found = {}
    for path in LAYER_FILES:
        text = path.read_text()
        for what, pattern in FORBIDDEN.items():
            count = len(re.findall(pattern, text))
            if count > ALLOWED.get((path.name, what), 0):
                found[f"{path.name}: {what}"] = count
    assert found == {}
