"""The graph boundary of ``LaplacianAttention``: the one place that knows TorchScript (docs/ARCHITECTURE.md,
"Scripting and tracing"). The layer files are eager Python with torch.fx guards only; this module gives

- ``PlainSettings``: the layer's ``AttentionSettings`` as typed plain values (a NamedTuple: a TorchScript type
  and an FX constant), ``plain_settings(settings)`` and back, ``settings_of(plain)`` (made once per distinct
  value, then looked up: validation runs once);
- ``laplacian_attention_leaf``: the operator as one call that a graph does not enter, with its settings as
  ``PlainSettings``: one node of a torch.fx graph (``torch.fx.wrap``, ``notrace``) and a Python call in
  TorchScript (``torch.jit.ignore``: a scripted model runs it, ``torch.jit.save`` cannot save it);
- ``call_operator``: what ``LaplacianAttention.attend`` calls: the operator with the settings object in eager
  mode (and under torch.jit.trace / torch.compile / torch.export, which trace into it), the leaf while
  torch.fx traces;
- ``script_form(layer)``: what ``torch.jit.script`` compiles for a layer (its ``__prepare_scriptable__``): a
  view of the layer (same parameters and submodules, same class plus ``ScriptForm``) whose ``forward``,
  ``attend`` and ``_attend_recompute`` are TorchScript when scripted and the layer's own in eager mode. The
  script forward is the layer's plain path (``TokenAttention._forward_plain``, compiled from the layer file):
  no argument checks, no fused paths, ``recompute`` ignored, the heads merged into DWConv(V) in place;
- ``script_view(module)``: a copy of a module tree sharing its parameters and buffers, for a root's
  ``__prepare_scriptable__`` (``LaplacianFormer``), since ``torch.jit.script`` writes what the layers'
  hooks return into their parents' module dicts: the scripted copy gets the script forms, the model keeps
  its layers.

No ``from __future__ import annotations`` here: TorchScript reads the annotations of ``PlainSettings`` and of
the ignored leaf as types.
"""

import functools
from dataclasses import astuple, fields
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import nn

from ..ops.attention import attention_with_settings
from ..ops.settings import AttentionSettings
from .token_attention import square_grid
from .tracing import is_fx_tracing, notrace

__all__ = ["PlainSettings", "ScriptForm", "call_operator", "laplacian_attention_leaf", "plain_settings",
           "script_form", "script_view", "settings_of"]


class PlainSettings(NamedTuple):
    """Every field of ``AttentionSettings``, in its order, as a typed plain value. ``landmarks``: [] (exact),
    [m] (an int) or [lh, lw] (a grid). lam and qk_scale are the resolved values."""

    head_dim: int
    kernel: str
    lam: float
    qk_scale: float
    landmarks: List[int]
    norm: str
    norm_scale: str
    norm_eps: float
    solver: str
    iters: int
    ns_eps: float
    ns_backward: str


def plain_settings(settings: AttentionSettings) -> PlainSettings:
    """``settings`` as ``PlainSettings`` (TypeError when a field has no plain form here: a field added to
    ``AttentionSettings`` needs one in ``PlainSettings``)."""
    names = tuple(f.name for f in fields(settings))
    if names != PlainSettings._fields:
        raise TypeError(f"plain_settings: AttentionSettings has the fields {list(names)}, PlainSettings "
                        f"{list(PlainSettings._fields)}: give every field a plain form")
    values = dict(zip(names, astuple(settings)))
    landmarks = values["landmarks"]
    values["landmarks"] = [] if landmarks is None else [landmarks] if isinstance(landmarks, int) else list(landmarks)
    return PlainSettings(**values)


@functools.lru_cache(maxsize=None)
def _settings_from(values: tuple) -> AttentionSettings:
    options = dict(zip(PlainSettings._fields, values))
    landmarks = options["landmarks"]
    options["landmarks"] = None if not landmarks else landmarks[0] if len(landmarks) == 1 else landmarks
    return AttentionSettings(**options)


def settings_of(plain: PlainSettings) -> AttentionSettings:
    """The ``AttentionSettings`` of ``plain`` (equal to the settings it was made from). Takes any tuple of
    ``PlainSettings``' fields in order: TorchScript hands an ignored function its own NamedTuple class."""
    values = tuple(tuple(v) if isinstance(v, list) else v for v in plain)
    return _settings_from(values)


@notrace
@torch.jit.ignore
def laplacian_attention_leaf(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    hw: Optional[Tuple[int, int]],
    settings: PlainSettings,
    key_padding_mask: Optional[torch.Tensor] = None,
    norm_gain: Optional[torch.Tensor] = None,
    num_prefix_tokens: int = 0,
) -> torch.Tensor:
    """The operator of a layer in a graph: q, k, v (B, H, N, d), hw the grid of the tokens after the
    ``num_prefix_tokens`` prefix tokens or None (1-D) -> (B, H, N, d), the landmarks resolved per call
    (docs/DESIGN.md §2.2), so one graph serves every input size."""
    return attention_with_settings(q, k, v, settings_of(settings), hw=hw, num_prefix_tokens=num_prefix_tokens,
                                   key_padding_mask=key_padding_mask, norm_gain=norm_gain)


torch.fx.wrap("laplacian_attention_leaf")


def call_operator(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, settings: AttentionSettings,
                  hw: Optional[Tuple[int, int]], key_padding_mask: Optional[torch.Tensor],
                  norm_gain: Optional[torch.Tensor], num_prefix_tokens: int) -> torch.Tensor:
    """``attention_with_settings`` for a layer; while torch.fx traces, one ``laplacian_attention_leaf`` node
    with the settings as plain values (a graph holds no settings object)."""
    if is_fx_tracing():
        return laplacian_attention_leaf(q, k, v, hw, plain_settings(settings), key_padding_mask, norm_gain,
                                        num_prefix_tokens)
    return attention_with_settings(q, k, v, settings, hw=hw, num_prefix_tokens=num_prefix_tokens,
                                   key_padding_mask=key_padding_mask, norm_gain=norm_gain)


class ScriptForm:
    """The TorchScript methods of a layer's script form (``script_form``); first in its class's MRO, the layer's
    class after it. In eager mode each method is the layer's own."""

    plain_settings: PlainSettings

    def forward(self, x: torch.Tensor, hw: Optional[Tuple[int, int]] = None,
                key_padding_mask: Optional[torch.Tensor] = None, attn_mask: Optional[torch.Tensor] = None,
                is_causal: bool = False) -> torch.Tensor:
        if not torch.jit.is_scripting():
            return super().forward(x, hw, key_padding_mask, attn_mask, is_causal)
        if attn_mask is not None or is_causal:
            raise ValueError("attn_mask, is_causal: not supported, only key_padding_mask (docs/DESIGN.md §2.5)")
        if hw is None and self.num_prefix_tokens > 0:
            hw = square_grid(x.shape[1], self.num_prefix_tokens)
        return self._forward_plain(x, hw, key_padding_mask, False, True)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Optional[Tuple[int, int]],
               key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not torch.jit.is_scripting():
            return super().attend(q, k, v, hw, key_padding_mask)
        return laplacian_attention_leaf(q, k, v, hw, self.plain_settings, key_padding_mask, self.norm_gain,
                                        self.num_prefix_tokens)

    def _attend_recompute(self, x: torch.Tensor, v: torch.Tensor, hw: Optional[Tuple[int, int]],
                          key_padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
        if not torch.jit.is_scripting():
            return super()._attend_recompute(x, v, hw, key_padding_mask)
        return self._attend_tokens(x, v, hw, key_padding_mask)  # a scripted model does not recompute

    def eager_layer(self) -> nn.Module:
        """The layer this form views, in its own class (same parameters and submodules)."""
        layer = object.__new__(self._eager_class)
        layer.__dict__.update({k: v for k, v in self.__dict__.items()
                               if k not in _FORM_ATTRIBUTES and not k.startswith("__")})  # TorchScript's marks
        return layer

    def __reduce_ex__(self, protocol):
        # pickled (and deep-copied) as the layer it views: the form's class is made at run time
        return _rebuilt, (self.eager_layer().__reduce_ex__(protocol),)


def _rebuilt(reduction: tuple):
    """The object a ``__reduce_ex__`` result (callable, args[, state, ...]) stands for."""
    obj = reduction[0](*reduction[1])
    if len(reduction) > 2 and reduction[2] is not None:
        obj.__setstate__(reduction[2])
    return obj


_FORMS: Dict[type, type] = {}
_FORM_ATTRIBUTES = ("plain_settings",)
"""What ``script_form`` adds to the layer's attributes (besides ``__jit_ignored_attributes__``)."""


def _form_class(base: type) -> type:
    form = _FORMS.get(base)
    if form is None:
        properties = sorted({name for cls in base.__mro__ for name, value in vars(cls).items()
                             if isinstance(value, property)})
        form = type(f"{base.__name__}ScriptForm", (ScriptForm, base), {
            "__module__": __name__, "_eager_class": base,
            # TorchScript compiles a module's properties unless told otherwise; the form needs none
            "__jit_unused_properties__": properties,
            "__doc__": f"``{base.__name__}`` as TorchScript compiles it (``layers.scripting.script_form``)."})
        _FORMS[base] = form
    return form


def _shell_copy(module: nn.Module, cls: type) -> nn.Module:
    """A new ``cls`` object with ``module``'s attributes; its own parameter, buffer and submodule dicts,
    holding the same objects."""
    copy = object.__new__(cls)
    copy.__dict__.update(module.__dict__)
    for name in ("_parameters", "_buffers", "_modules"):
        copy.__dict__[name] = type(module.__dict__[name])(module.__dict__[name])
    return copy


def script_form(layer: nn.Module) -> nn.Module:
    """The layer's script form: a view of ``layer`` (its parameters and submodules, not copies) whose class is
    ``layer``'s with ``ScriptForm`` before it, holding the settings as ``plain_settings``. Its eager calls are
    the layer's; TorchScript compiles ``ScriptForm``'s methods."""
    if isinstance(layer, ScriptForm):  # a form scripted again (left in a parent by an earlier script)
        layer = layer.eager_layer()
    form = _shell_copy(layer, _form_class(type(layer)))
    form.plain_settings = plain_settings(layer.settings)
    # the eager state TorchScript has no type for (the settings object, the host path's call plans)
    form.__jit_ignored_attributes__ = sorted(name for name, value in vars(layer).items()
                                             if name not in _MODULE_STATE and not _plain_value(value))
    return form


_MODULE_STATE = frozenset(vars(nn.Module()))
"""The attributes every nn.Module has (its parameter, buffer, submodule and hook dicts)."""


def _plain_value(value) -> bool:
    """Whether TorchScript types ``value`` as an attribute (a number, string, None, tensor, module or a tuple
    of them)."""
    if isinstance(value, tuple):
        return all(_plain_value(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, torch.Tensor, nn.Module))


def script_view(module: nn.Module, _memo: Optional[Dict[int, nn.Module]] = None) -> nn.Module:
    """A copy of the module tree of ``module``: every module a new object of its class (a module held twice
    copied once), the parameters and buffers the same tensors (so a scripted copy trains the model's
    parameters)."""
    memo: Dict[int, nn.Module] = {} if _memo is None else _memo
    view = memo.get(id(module))
    if view is None:
        view = memo[id(module)] = _shell_copy(module, type(module))
        for name, child in module._modules.items():
            if child is not None:
                view._modules[name] = script_view(child, memo)
    return view
