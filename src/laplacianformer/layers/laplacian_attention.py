"""``LaplacianAttention``: the attention block of LaplacianFormer as an nn.Module (DESIGN.md §2, §4).

Input (B, N, C) tokens and the grid size (height, width); output (B, N, C):
    q, k, v = projections of x (k = q when ``tie_qk``, the SOFT variant)
    out = proj( laplacian_attention(q, k, v) + DWConv3x3(V) )
The landmarks follow ``resolve_landmarks``, the operator's rule: the grid is clamped to the token grid, and
when it covers every token (m >= N) the exact kernel is used (DESIGN.md §2), so the module works at any
input resolution; an int on a 2-D grid must be a perfect square (ValueError naming ``landmarks``), and on a
1-D sequence a (lh, lw) grid counts lh·lw landmarks, as in the operator (the default is m = 49 either way).
``forward(x, hw=None, key_padding_mask=None)``: a (B, N) padding mask (True = padding) follows
docs/DESIGN.md §2.5 (each sequence gets what it gives alone, whatever its valid count); with Nyström landmarks
only on 1-D sequences. ``check_finite_inputs=True``: a NaN/Inf in x is a ValueError naming x and its batch index.
Prefix tokens (``num_prefix_tokens`` P, docs/DESIGN.md §2.7; timm's ``VisionTransformer`` with a class token and
register tokens): the first P tokens attend and are attended as every token, the landmarks pool the grid of the
N - P tokens after them (``hw``, or a square grid inferred from N - P when not given), DWConv(V) convolves
that grid only. ``LaplacianAttention.with_options(num_prefix_tokens=1, ...)`` is a layer class for builders
that take a class (timm's ``attn_layer``); a layer timm builds without it warns once when its tokens look like
a class or register tokens before a square grid (``token_attention.unstated_prefix_tokens``).

Eager inference without a padding mask or prefix tokens calls ``ops.attention.attention_with_value_conv``
(``_attend_value_conv``): the heads merged + DWConv(V) in one call, the conv fused into the streaming output
pass on CUDA (3 launches fewer per layer; q and k there from one product of their stacked weight rows: 1 more),
the unfused computation with the same result elsewhere.

The operator settings are one ``AttentionSettings`` (``ops/settings.py``), made and validated once in the
constructor and held as ``settings``; every call passes it to the operator, ``recompute`` to the op
``recompute`` with the projection tensors.

Scripting and tracing: ``attend`` calls ``layers.scripting.call_operator``, the operator with ``settings``
(one node ``laplacian_attention_leaf`` of a torch.fx graph, which takes the settings as plain values);
``torch.jit.script`` compiles the layer's script form (``__prepare_scriptable__``: ``layers/scripting.py``,
the one module that knows TorchScript).
"""

from typing import Optional, Tuple

import torch
from torch import nn

from ..ops.attention import PlanCache, attention_from_qkv, attention_with_value_conv, plan_value_conv, remember_plan
from ..ops.dispatch import explain
from ..ops.recompute import recompute_attention
from ..ops.settings import OPERATOR_SETTINGS, settings_from
from ..ops.validation import check_finite
from ..ops.streaming import triton_device
from .scripting import call_operator, script_form
from .token_attention import SHELL_KWARGS, TokenAttention


ONE_PRODUCT_MIN_WIDTH = 256
"""The width C from which CPU inference takes q, k and v from one product with the whole ``qkv`` weight. Tiny's
layers, 1 thread, one product against three contiguous ones (``python -m benchmarks.qkv_product_ab``,
7 December 2026): 0.96–0.98× the layer's time at C = 320 and 512, 1.00–1.01× at C = 128, 1.03–1.04× at C = 64,
where reading q, k and v in rows of stride 3C costs the narrow layer more than the one GEMM saves."""


class LaplacianAttention(TokenAttention):
    """Multi-head Laplacian–Nyström attention with a depthwise-conv value path.

    Args:
        dim: channels C (divisible by num_heads).
        num_heads: heads H; head dim d = C / H.
        qkv_bias: bias in the q/k/v projection (default True).
        tie_qk: use K = Q (SOFT's symmetric variant); removes the key projection (default False).
        dwconv: add a 3×3 depthwise conv of V on the token grid (1-D: kernel 3) to the output (default True).
        attn_drop: dropout on the attention output before the projection; proj_drop: after it.
        num_prefix_tokens: P tokens before the grid (default 0; docs/DESIGN.md §2.7): they attend and are
            attended as every token, the landmarks pool the grid of the N - P tokens after them (``hw`` of
            ``forward``, or the square grid of N - P tokens when ``hw`` is not given; ValueError naming
            ``hw`` when N - P is not a square), and DWConv(V) convolves that grid: the prefix tokens get no
            conv term.
        check_finite_inputs: raise ValueError naming ``x`` and the first batch index when the input holds NaN or
            Inf (eager mode; padded tokens are not checked); default False, at no cost.
        recompute: in training, keep x, V, the landmarks, W⁺ and the normalisation's small statistics, and
            recompute the q/k products and the two N×m kernel matrices in the backward (the lean recompute,
            docs/DESIGN.md §5.5; the exact kernel, autocast and graph capture checkpoint the core instead).
        settings: the operator settings (``ops.settings.OPERATOR_SETTINGS``: kernel, lam, qk_scale, landmarks,
            norm, norm_scale, norm_eps, solver, iters, ns_eps, ns_backward; the defaults and checks of
            ``AttentionSettings``): lam and qk_scale None are the kernel's defaults (Laplacian: 4 and d**-0.5;
            Gaussian: SOFT's 2·sqrt(d) on the raw q and k; docs/DESIGN.md §1.4); landmarks: a grid per head
            (default 7×7, m = 49; on a 1-D sequence lh·lw landmarks), an int (a perfect square on a 2-D
            grid) or None (exact), clamped to the token grid per call (§2.2). The module also takes
            norm_scale="learned": "inv_sqrt_n" times a per-head gain ``norm_gain`` (a parameter, initialised
            at 1, no weight decay as a 1-D tensor; docs/DESIGN.md §4.6).

    ``settings`` is the ``AttentionSettings``; ``attn_kwargs`` (read-only) the dict of its operator settings;
    ``landmarks`` the landmark spec.
    """

    takes_prefix_tokens = True
    merges_value_conv = True
    trains_from_qkv = True

    def __init__(self, dim: int, num_heads: int = 8, *, dwconv: bool = True, **kwargs) -> None:
        # the shell's arguments (``SHELL_KWARGS``, defaults of ``TokenAttention``) go to it; the rest are settings
        settings = dict(kwargs)
        super().__init__(dim, num_heads, dwconv=dwconv, **{k: settings.pop(k) for k in SHELL_KWARGS if k in settings})
        learned = settings.get("norm_scale") == "learned"
        if learned:
            settings["norm_scale"] = "inv_sqrt_n"
        # made and checked once; lam and qk_scale hold the kernel's defaults resolved for this head dim
        self.settings = settings_from(self.head_dim, settings, "LaplacianAttention")
        self.landmarks = self.settings.landmarks
        self._lean_calls = PlanCache()  # the lean host path's plans per call signature (docs/DESIGN.md §6.6)
        like = self.proj.weight
        self.register_parameter("norm_gain", nn.Parameter(torch.ones(num_heads, device=like.device, dtype=like.dtype))
                                if learned else None)

    @classmethod
    def with_options(cls, **options) -> type:
        """A subclass of this layer whose constructor takes ``options`` as its keyword defaults (keywords given
        when it is built win), for builders that take a layer class, e.g. timm's
        ``VisionTransformer(attn_layer=LaplacianAttention.with_options(num_prefix_tokens=1))`` (a class token
        before the grid; docs/DESIGN.md §2.7). TypeError for a name the constructor does not take; the values
        are checked when a layer is built."""
        allowed = set(SHELL_KWARGS) | set(OPERATOR_SETTINGS) | {"dwconv"}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise TypeError(f"with_options: {cls.__name__} takes no keyword {unknown}; "
                            f"expected some of {sorted(allowed)}")
        defaults = dict(options)

        def __init__(self, dim: int, num_heads: int = 8, **kwargs) -> None:
            cls.__init__(self, dim, num_heads, **{**defaults, **kwargs})

        def __reduce_ex__(self, protocol):
            # the class is made here, so pickle cannot name it: rebuild it from (cls, options) on load
            return _rebuild_with_options, (cls, defaults, self.__getstate__())

        text = ", ".join(f"{key}={value!r}" for key, value in defaults.items())
        return type(cls.__name__, (cls,), {"__init__": __init__, "__reduce_ex__": __reduce_ex__,
                                           "__module__": cls.__module__,
                                           "__doc__": f"{cls.__name__} with the defaults {text}."})

    @property
    def attn_kwargs(self) -> dict:
        """The operator settings passed to the operator (``AttentionSettings.options()`` but the landmarks)."""
        options = self.settings.options()
        del options["landmarks"]
        return options

    def extra_repr(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.attn_kwargs.items())
        return (
            f"dim={self.dim}, heads={self.num_heads}, landmarks={self.landmarks}, tie_qk={self.tie_qk}, "
            f"recompute={self.recompute}, "
            + (f"num_prefix_tokens={self.num_prefix_tokens}, " if self.num_prefix_tokens else "") + opts
        )

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: Optional[Tuple[int, int]],
               key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """q, k, v: (B, H, N, d), key_padding_mask: (B, N) or None -> the operator's output (B, H, N, d).

        With a padding mask the landmark rule applies per sequence, from its valid tokens (docs/DESIGN.md §2.5), so
        each sequence of a padded batch gets what it gives alone."""
        return call_operator(q, k, v, self.settings, hw, key_padding_mask, self.norm_gain, self.num_prefix_tokens)

    def __prepare_scriptable__(self):
        """What ``torch.jit.script`` compiles for this layer: its script form (``layers.scripting.script_form``)."""
        return script_form(self)

    def _attend_value_conv(self, x: torch.Tensor, hw: Optional[Tuple[int, int]], key=None) -> torch.Tensor:
        """Eager inference without a mask or prefix tokens (the ``value_conv`` path, ``layers/plan.py``): x (B, N, C)
        -> the heads merged + DWConv(V) (B, N, C) by ``ops.attention.attention_with_value_conv``, whose streaming
        output pass adds the conv on CUDA (docs/KERNELS.md, "The fused DWConv(V)"); elsewhere the unfused
        computation of ``forward``, with the same result. Where the Triton passes run (CUDA), q and k come from
        one product (``_project_qk_stacked``: strided views, which the passes read in place) and v from another;
        elsewhere, from ``ONE_PRODUCT_MIN_WIDTH`` up, q, k and v are strided views of one product
        (``_project_qkv``), which the C loops read in place, and three contiguous products below it."""
        if triton_device(x.device):
            q, k = self._project_qk(x) if self.tie_qk else self._project_qk_stacked(x)
            v_tok = self._project_v(x)
        else:
            q, k, v_tok = self._project_cpu(x)
        conv = self.dwconv
        if key is None or self.norm_gain is not None:
            return attention_with_value_conv(q, k, v_tok, self.settings, hw=hw, weight=conv.weight, bias=conv.bias,
                                             norm_gain=self.norm_gain)
        out, plan = plan_value_conv(q, k, v_tok, self.settings, hw=hw, weight=conv.weight, bias=conv.bias)
        remember_plan(self._lean_calls, key, plan)
        return out

    def _project_cpu(self, x: torch.Tensor):
        """q, k (B, H, N, d) and v_tok (B, N, C) of CPU inference: strided views of one product from
        ``ONE_PRODUCT_MIN_WIDTH`` up (``_project_qkv``, which the C loops read in place), else three contiguous
        products (``cpu_projects_in_one_product``)."""
        if self.cpu_projects_in_one_product:
            return self._project_qkv(x)
        (q, k), v_tok = self._project_qk(x), self._project_v(x)
        return q, k, v_tok

    def _lean_value_conv(self, x: torch.Tensor, plan) -> torch.Tensor:
        """A later call of a signature whose first call planned the lean path (``_attend_value_conv`` with a key):
        the projections and the plan's line (``ops.lean.lean_call``, bound to that call's checked ``hw`` and
        landmarks), nothing between them (``check_finite_inputs`` still checks x)."""
        if self.check_finite_inputs:
            check_finite("x", x, None)
        q, k, v_tok = self._project_cpu(x)
        conv = self.dwconv
        return plan(q, k, v_tok, conv.weight, conv.bias)

    @property
    def cpu_projects_in_one_product(self) -> bool:
        """Whether CPU inference takes q, k and v from one product with the whole ``qkv`` weight (C >=
        ``ONE_PRODUCT_MIN_WIDTH``), else from three contiguous ones."""
        return self.dim >= ONE_PRODUCT_MIN_WIDTH

    def _fused_device(self, x: torch.Tensor) -> bool:
        """Whether the fused training passes take x's device (CUDA; the CPU under the Triton interpreter)."""
        return triton_device(x.device)

    def _attend_from_qkv(self, x: torch.Tensor, hw: Optional[Tuple[int, int]]) -> torch.Tensor:
        """A training call where the Triton passes run (``_fused_device``): x (B, N, C) -> the heads merged +
        DWConv(V) (B, N, C) by ``ops.attention.attention_from_qkv`` from one product with the whole ``qkv``
        weight, whose op runs the core and the conv in fused passes forward and backward (docs/KERNELS.md,
        "The fused backward"; the CPU keeps the three contiguous products of ``_project_qk``)."""
        conv = self.dwconv
        return attention_from_qkv(self.qkv(x), self.settings, heads=self.num_heads, tied=self.tie_qk, hw=hw,
                                  weight=None if conv is None else conv.weight,
                                  bias=None if conv is None else conv.bias, norm_gain=self.norm_gain)

    def _projections(self):
        """(q_weight, q_bias, k_weight, k_bias): the q and k row blocks of ``qkv`` (k None when ``tie_qk``)."""
        q_weight, q_bias = self._row_block(0)
        k_weight, k_bias = (None, None) if self.tie_qk else self._row_block(1)
        return q_weight, q_bias, k_weight, k_bias

    def _attend_recompute(self, x: torch.Tensor, v: torch.Tensor, hw: Optional[Tuple[int, int]],
                          key_padding_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """The core with recomputation in the backward: the op ``recompute`` with this layer's projection
        tensors and settings (docs/DESIGN.md §5.5); with ``qk_norm`` (q, k are not plain projections) the
        checkpoint of the shell."""
        if self.qk_norm:
            return super()._attend_recompute(x, v, hw, key_padding_mask)
        return recompute_attention(x, v, self._projections(), self.settings, hw=hw, key_padding_mask=key_padding_mask,
                                   norm_gain=self.norm_gain, num_prefix_tokens=self.num_prefix_tokens)

    def explain_recompute(self, x: torch.Tensor, hw: Optional[Tuple[int, int]] = None,
                          key_padding_mask: Optional[torch.Tensor] = None) -> str:
        """Which recomputation ``recompute=True`` runs for this input (lean or checkpoint) and why the other
        does not. x: (B, N, C) tokens, as for ``forward``."""
        hw = self._layout(x.shape[1], hw)
        return explain("recompute", x, None, self._projections(), self.settings, hw, key_padding_mask, self.norm_gain,
                       self.num_prefix_tokens)


def _rebuild_with_options(base: type, options: dict, state: dict):
    """Unpickles a layer of a ``with_options`` class: the class made again, the module's state set."""
    layer_class = base.with_options(**options)
    layer = layer_class.__new__(layer_class)
    layer.__setstate__(state)
    return layer
