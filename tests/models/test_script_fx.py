"""TorchScript and torch.fx on every registered model: the checks of timm's model tests, replicated.

timm's ``tests/test_models.py`` (not shipped in the timm wheel) scripts each model, traces it with
torchvision's FX feature extractor (forward in eval, backward in train) and scripts the traced graph. The
same four checks run here on every ``laplacianformer_*`` name, at 64 px so the paper sizes stay cheap, and
compare with eager outputs: FX forward exactly (as timm does), TorchScript within float tolerance.
micro and tiny run by default; the larger sizes are marked slow (``pytest -m slow``).
The rules that keep these passing are in docs/ARCHITECTURE.md ("Scripting and tracing").
"""

import warnings

import pytest
import torch

from laplacianformer.layers import NOTRACE_FUNCTIONS, fx_tracer_kwargs
from laplacianformer.layers.scripting import laplacian_attention_leaf
from laplacianformer.models import MODEL_CONFIGS, create_model

timm = pytest.importorskip("timm")
feature_extraction = pytest.importorskip("torchvision.models.feature_extraction")

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:NOTE. The nodes obtained by tracing the model in eval mode:UserWarning"),
]

SIZE = 64
DEFAULT = ("laplacianformer_micro", "laplacianformer_tiny")
NAMES = [pytest.param(n, marks=() if n in DEFAULT else pytest.mark.slow) for n in MODEL_CONFIGS]


def _fx_model(model, train: bool = False):
    """timm's FX model of its tests: torchvision's feature extractor on the last graph node(s), with
    timm's leaf modules and functions (ours are registered by ``register_timm``)."""
    from timm.layers import get_notrace_functions, get_notrace_modules

    kw = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
              param_shapes_constant=True)
    train_nodes, eval_nodes = feature_extraction.get_graph_node_names(model, tracer_kwargs=kw)
    train_return = [train_nodes[-1]]
    if train:  # the nodes feeding the output of the train-mode graph
        graph = feature_extraction.NodePathTracer(**kw).trace(model)
        nodes = list(reversed(graph.nodes))
        names = [n.name for n in nodes]
        train_return = [train_nodes[-names.index(n.name)] for n in nodes[0]._input_nodes]
    return feature_extraction.create_feature_extractor(
        model, train_return_nodes=train_return, eval_return_nodes=[eval_nodes[-1]], tracer_kwargs=kw)


def _cat(outputs) -> torch.Tensor:
    return torch.cat(tuple(outputs.values()))


def _script(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.jit.script(module)


@pytest.mark.parametrize("name", NAMES)
def test_torchscript_forward_equals_eager(name):
    torch.manual_seed(0)
    with timm.layers.set_layer_config(scriptable=True):
        model = timm.create_model(name).eval()
    x = torch.randn(1, 3, SIZE, SIZE)
    with torch.no_grad():
        ref = model(x)
        out = _script(model)(x)
    assert out.shape == (1, 1000) and not torch.isnan(out).any()
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("name", NAMES)
def test_fx_forward_equals_eager_exactly(name):
    torch.manual_seed(0)
    model = timm.create_model(name).eval()
    x = torch.randn(1, 3, SIZE, SIZE)
    with torch.inference_mode():
        ref = model(x)
        out = _cat(_fx_model(model)(x))
    assert torch.equal(out, ref)
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("name", NAMES)
def test_fx_backward_reaches_every_parameter(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=42, drop_path_rate=0.1).train()
    num_params = sum(p.numel() for p in model.parameters())
    fx = _fx_model(model, train=True)
    out = _cat(fx(torch.randn(2, 3, SIZE, SIZE)))
    out.mean().backward()
    assert [n for n, p in fx.named_parameters() if p.grad is None] == []
    assert sum(p.grad.numel() for p in fx.parameters()) == num_params
    assert out.shape == (2, 42) and not torch.isnan(out).any()


@pytest.mark.parametrize("name", NAMES)
def test_fx_then_torchscript_equals_eager(name):
    torch.manual_seed(0)
    with timm.layers.set_layer_config(scriptable=True):
        model = timm.create_model(name).eval()
    x = torch.randn(1, 3, SIZE, SIZE)
    with torch.no_grad():
        ref = model(x)
        out = _cat(_script(_fx_model(model))(x))
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("attn, attn_kwargs", [
    ("gaussian", None), ("softmax", None), ("laplacian", dict(tie_qk=True, dwconv=False)),
    ("laplacian", dict(landmarks=(2, 2), recompute=True, norm="inline")),
])
def test_attention_variants_script_and_trace(attn, attn_kwargs):
    """Every token mixer of the factory scripts and traces, at two input sizes with one graph: the
    landmark rule and the softmax padding run inside leaves, so a graph is not tied to its trace size."""
    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", num_classes=5, attn=attn, attn_kwargs=attn_kwargs).eval()
    scripted = _script(model)
    traced = torch.fx.symbolic_trace(model)  # plain torch.fx: the leaves are torch.fx.wrap'ed
    for size in (SIZE, 96):
        x = torch.randn(2, 3, size, size)
        with torch.no_grad():
            ref = model(x)
            assert torch.equal(traced(x), ref)
            torch.testing.assert_close(scripted(x), ref)


def test_operator_is_one_leaf_node_and_checks_stay_in_eager():
    model = create_model("laplacianformer_micro", num_classes=3).eval()
    graph = torch.fx.symbolic_trace(model).graph
    leaves = [n for n in graph.nodes if n.op == "call_function" and n.target is laplacian_attention_leaf]
    assert len(leaves) == sum(MODEL_CONFIGS["laplacianformer_micro"]["depths"])
    assert laplacian_attention_leaf in NOTRACE_FUNCTIONS
    assert laplacian_attention_leaf in fx_tracer_kwargs()["autowrap_functions"]
    assert laplacian_attention_leaf in timm.layers.get_notrace_functions()
    with pytest.raises(ValueError, match="^x: expected 3 channels"):
        model(torch.randn(1, 4, 64, 64))  # eager validation is kept


def test_scripted_model_with_grad_checkpointing_and_training_mode():
    """Gradient checkpointing and ``recompute`` are eager-only; a scripted model still trains."""
    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", num_classes=4, attn_kwargs=dict(recompute=True))
    model.set_grad_checkpointing(True)
    scripted = _script(model.train())
    out = scripted(torch.randn(2, 3, 32, 32))
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
