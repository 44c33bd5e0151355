"""LaplacianFormer: a PVTv2-style hierarchical vision backbone with Laplacian–Nyström attention (docs/DESIGN.md §5).

Paper: "LaplacianFormer: Rethinking Linear Attention with Laplacian Kernel" (arXiv 2604.20368). The paper
names a PVT backbone with self-attention replaced but gives no depths or widths; the macro design here is
ours (docs/DESIGN.md §5): overlapping conv patch embedding (7×7 stride 4, then 3×3 stride 2 per stage), four
stages of pre-norm blocks

    x = x + DropPath(Attention(LayerNorm(x)))
    x = x + DropPath(MLP(LayerNorm(x)))          MLP = fc -> 3×3 depthwise conv -> GELU -> fc

a LayerNorm per stage and a global-average-pool linear head. The attention (token mixer) comes from
``layers.get_token_mixer``: ``LaplacianAttention`` (``attn="laplacian"``), the same module with the
Gaussian kernel (``attn="gaussian"``), or PVTv2's spatial-reduction softmax attention (``attn="softmax"``,
the quadratic baseline). No position embedding: position information comes from the depthwise
convolutions, so any input size works.

Layout (as timm's family files): blocks -> stages -> model -> ``checkpoint_filter_fn`` -> pretrained cfgs
-> the one builder ``create_model`` and the entry points that call it (one ``def`` per
``registry.MODEL_CONFIGS`` name) -> ``register_timm``. timm is imported only inside functions:
``register_timm`` (called by ``laplacianformer.models`` once timm is imported) registers the entry points of this module
with timm's registry, so timm records this family module (``laplacianformer``) as their module, as for its
own families; ``create_model`` uses timm's builder only for the calls that need it. Saving, loading and
reading saved configs live above this package, in ``laplacianformer.hub``, which hands its reader of a
weights file's config to ``set_weights_config_reader``.

TorchScript and torch.fx: every registered model scripts (``torch.jit.script``) and traces
(``torch.fx.symbolic_trace``, timm's / torchvision's feature extractors) with eager's outputs; the
attention operator is one leaf call in both, and TorchScript compiles the attention layers' script forms
(``layers/scripting.py``, docs/ARCHITECTURE.md).
"""

# no ``from __future__ import annotations``: an FX graph copies the root module's forward annotations,
# and TorchScript must read them as types when it scripts that graph (docs/ARCHITECTURE.md)
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers import DropPath, GridConv2d, get_token_mixer, grid_to_tokens, is_fx_tracing, tokens_to_grid
from ..layers.scripting import script_view
from ..ops.validation import check_finite
from .registry import MODEL_CONFIGS, model_config

__all__ = [
    "LaplacianFormer",
    "Mlp",
    "Block",
    "OverlapPatchEmbed",
    "Stage",
    "checkpoint_filter_fn",
    "create_model",
    "default_cfgs",
    "entry_points",
    *MODEL_CONFIGS,
]


class Mlp(nn.Module):
    """fc -> 3×3 depthwise conv on the token grid -> GELU -> fc.  x: (B, N, C), hw = (h, w) -> (B, N, C).

    Eager mode works in token layout: the grid is a channels-last view of the tokens, so nothing is copied. An
    ONNX export records the channels-first form instead (``_forward_grid``): ONNX's Conv is channels-first, so
    the token form's graph transposes the hidden-width activations into and out of the depthwise conv; the
    grid form runs both linears as 1×1 convolutions on the (B, C, h, w) grid and transposes only the C-channel
    input and output (same function; onnxruntime 0.88–0.91× the time, docs/DEPLOY.md)."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = GridConv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.act = nn.GELU()
        self.drop = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        if not torch.jit.is_scripting():
            if torch.onnx.is_in_onnx_export():
                return self._forward_grid(x, hw)
        x = grid_to_tokens(self.dwconv(tokens_to_grid(self.fc1(x), hw)))
        x = self.drop(self.act(x))
        return self.drop(self.fc2(x))

    def _forward_grid(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """The same MLP on the channels-first grid (the ONNX export's form): x (B, N, C) -> (B, N, C)."""
        g = nn.functional.conv2d(tokens_to_grid(x, hw), self.fc1.weight[:, :, None, None], self.fc1.bias)
        g = self.drop(self.act(self.dwconv(g)))
        g = nn.functional.conv2d(g, self.fc2.weight[:, :, None, None], self.fc2.bias)
        return self.drop(grid_to_tokens(g))


class Block(nn.Module):
    """Pre-norm transformer block on a token grid.  x: (B, N, C), hw = (h, w) -> (B, N, C).

    ``mixer`` builds the token mixer (``layers.get_token_mixer``; default: Laplacian attention).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        *,
        mixer: Callable[..., nn.Module] | None = None,
        sr_ratio: int = 1,
        landmarks=(7, 7),
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        mixer = mixer or get_token_mixer("laplacian")
        self.attn = mixer(
            dim, num_heads, sr_ratio=sr_ratio, landmarks=landmarks, qkv_bias=qkv_bias, attn_drop=attn_drop,
            proj_drop=proj_drop,
        )
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x), hw))
        return x + self.drop_path2(self.mlp(self.norm2(x), hw))


class OverlapPatchEmbed(nn.Module):
    """Overlapping conv patch embedding + LayerNorm.  x: (B, C_in, H, W) -> (B, C_out, H/s, W/s) (ceil).

    ``check_finite_inputs``: raise ValueError naming ``x`` and the first batch index when x holds NaN or Inf
    (eager mode; the model's stem: every path of the model, timm's ``features_only`` included, runs it first)."""

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int = 7, stride: int = 4,
                 check_finite_inputs: bool = False) -> None:
        super().__init__()
        self.proj = GridConv2d(in_chans, embed_dim, patch_size, stride=stride, padding=patch_size // 2)
        self.norm = nn.LayerNorm(embed_dim)
        self.check_finite_inputs = bool(check_finite_inputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting() and not is_fx_tracing() and self.check_finite_inputs:
            check_finite("x", x)
        x = self.proj(x)
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Stage(nn.Module):
    """Optional 3×3/s2 downsample, ``depth`` blocks, LayerNorm.  x: (B, C_in, H, W) -> (B, C, H', W')."""

    def __init__(
        self, dim_in: int, dim: int, depth: int, *, downsample: bool, drop_path: Sequence[float], **block_kwargs
    ) -> None:
        super().__init__()
        self.grad_checkpointing = False
        self.downsample = OverlapPatchEmbed(dim_in, dim, patch_size=3, stride=2) if downsample else None
        self.blocks = nn.ModuleList(Block(dim, drop_path=drop_path[i], **block_kwargs) for i in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.downsample is not None:
            x = self.downsample(x)
        b, c, h, w = x.shape
        hw = (h, w)
        x = x.flatten(2).transpose(1, 2)
        for blk in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting() and not is_fx_tracing() \
                    and torch.is_grad_enabled():
                x = checkpoint(blk, x, hw, use_reentrant=False)
            else:
                x = blk(x, hw)
        x = self.norm(x)
        return x.transpose(1, 2).reshape(b, c, h, w)


def _take_indices(num: int, indices) -> tuple[list[int], int]:
    """Stage indices to return: None -> all, int n -> last n, sequence -> those (negatives from the end)."""
    if indices is None:
        indices = num
    if isinstance(indices, int):
        if not 0 < indices <= num:
            raise ValueError(f"indices: expected 1..{num} (last n stages), got {indices}")
        take = list(range(num - indices, num))
    else:
        take = [i + num if i < 0 else i for i in indices]
        if not take or any(not 0 <= i < num for i in take):
            raise ValueError(f"indices: expected stage indices in [-{num}, {num}), got {list(indices)}")
    return take, max(take)


def _check_img_size(img_size, stride: int) -> tuple[int, int] | None:
    """``img_size`` as (H, W), or None; ValueError naming it when not positive ints >= the total stride."""
    if img_size is None:
        return None
    size = (img_size, img_size) if isinstance(img_size, int) and not isinstance(img_size, bool) else tuple(img_size)
    if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= stride for s in size):
        raise ValueError(f"img_size: expected an int or (H, W) of ints >= the total stride {stride}, got {img_size!r}")
    return size


def _with_input_size(model: "LaplacianFormer") -> "LaplacianFormer":
    """``pretrained_cfg["input_size"]`` set from the model's ``img_size`` when it was given (timm's convention)."""
    if model.img_size is not None:
        model.pretrained_cfg = dict(model.pretrained_cfg, input_size=(model.in_chans, *model.img_size))
    return model


def _check_global_pool(global_pool: str) -> str:
    if global_pool not in ("avg", ""):
        raise ValueError(f"global_pool: expected 'avg' or '', got {global_pool!r}")
    return global_pool


def _per_stage(name: str, value, n: int) -> tuple:
    if isinstance(value, (int, float)):
        return (value,) * n
    value = tuple(value)
    if len(value) != n:
        raise ValueError(f"{name}: expected {n} values (one per stage), got {len(value)}")
    return value


class LaplacianFormer(nn.Module):
    """Hierarchical LaplacianFormer backbone and classifier (DESIGN.md §5).

    Args:
        in_chans: input channels. num_classes: classes of the linear head (0: no head).
        global_pool: "avg" (pool in ``forward_head``) or "" (keep 4-D maps).
        depths, embed_dims, num_heads, mlp_ratios: per stage (4 stages).
        attn: token mixer of every block, one of ``layers.ATTENTIONS``: "laplacian" | "gaussian" | "softmax".
        attn_kwargs: forwarded to the attention (keys: ``layers.token_mixer``). laplacian/gaussian: lam,
            qk_scale, norm, solver, iters, ns_eps, tie_qk, landmarks, dwconv, recompute (see
            ``LaplacianAttention``); softmax: sr_ratio. Name and keys are checked once here.
        attn_preset: named ``attn_kwargs`` of attn="laplacian" (``layers.ATTN_PRESETS``: "paper", "tuned";
            docs/DESIGN.md §7.6), with ``attn_kwargs`` over them. ``config`` keeps the resulting kwargs.
        landmarks: landmark grid of the Nyström attention in every stage (clamped to the token grid, exact
            kernel when it covers every token: ``resolve_landmarks``, DESIGN.md §2).
        sr_ratios: spatial reduction of the softmax baseline per stage (PVTv2: 8, 4, 2, 1).
        stem_stride: stride of the 7×7 stem conv (4 as in PVTv2; 2 or 1 keep token grids useful for
            28–64 px images). Total stride = stem_stride · 8.
        drop_rate: dropout before the head; proj_drop_rate / attn_drop_rate: inside blocks;
        drop_path_rate: stochastic depth, linearly increasing over all blocks up to this value.
        img_size: the input size the model is meant for (an int or (H, W)), as timm models take it: it goes
            into ``pretrained_cfg["input_size"]`` (``create_model``); the model itself runs at any H, W >= the
            total stride, so nothing else depends on it.
        check_finite_inputs: raise ValueError naming ``x`` and the first batch index when an input image holds
            NaN or Inf (default False, at no cost). Checked once, at the model's input (the stem
            ``patch_embed``, which every path runs first, timm's ``features_only`` included): a NaN in the
            images reaches every layer from there, and one check per call costs one pass over the images, not
            one per attention layer. A runtime guard, not part of the architecture: not in ``config``.

    Input (B, in_chans, H, W) with H, W >= total stride; ``forward`` -> (B, num_classes) logits;
    ``forward_features`` -> (B, num_features, H/stride, W/stride) unpooled maps.
    """

    def __init__(
        self,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "avg",
        depths: Sequence[int] = (2, 2, 2, 2),
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        num_heads: Sequence[int] = (1, 2, 5, 8),
        mlp_ratios: Sequence[float] = (8.0, 8.0, 4.0, 4.0),
        attn: str = "laplacian",
        attn_kwargs: Mapping | None = None,
        attn_preset: str | None = None,
        landmarks=(7, 7),
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        qkv_bias: bool = True,
        stem_stride: int = 4,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        img_size: int | Sequence[int] | None = None,
        check_finite_inputs: bool = False,
    ) -> None:
        super().__init__()
        mixer = get_token_mixer(attn, attn_kwargs, attn_preset)
        self.img_size = _check_img_size(img_size, stem_stride * 8)
        _check_global_pool(global_pool)
        if stem_stride not in (1, 2, 4):
            raise ValueError(f"stem_stride: expected 1, 2 or 4, got {stem_stride!r}")
        if in_chans < 1 or num_classes < 0:
            raise ValueError(f"in_chans, num_classes: expected in_chans >= 1 and num_classes >= 0, got {in_chans}, {num_classes}")
        n = len(depths)
        embed_dims = _per_stage("embed_dims", embed_dims, n)
        num_heads = _per_stage("num_heads", num_heads, n)
        mlp_ratios = _per_stage("mlp_ratios", mlp_ratios, n)
        sr_ratios = _per_stage("sr_ratios", sr_ratios, n)
        if isinstance(landmarks, list):
            landmarks = tuple(landmarks)
        attn_kwargs = dict(mixer.attn_kwargs)
        self.config = dict(
            in_chans=in_chans, num_classes=num_classes, global_pool=global_pool, depths=list(depths),
            embed_dims=list(embed_dims), num_heads=list(num_heads), mlp_ratios=list(mlp_ratios), attn=attn,
            attn_kwargs=attn_kwargs, landmarks=landmarks, sr_ratios=list(sr_ratios), qkv_bias=qkv_bias,
            stem_stride=stem_stride, drop_rate=drop_rate, proj_drop_rate=proj_drop_rate,
            attn_drop_rate=attn_drop_rate, drop_path_rate=drop_path_rate,
        )
        if self.img_size is not None:
            self.config["img_size"] = list(self.img_size)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.global_pool = global_pool
        self.attn = attn
        self.stride = stem_stride * 2 ** (n - 1)
        self.patch_embed = OverlapPatchEmbed(in_chans, embed_dims[0], patch_size=7, stride=stem_stride,
                                             check_finite_inputs=check_finite_inputs)
        total = sum(depths)
        rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        stages, self.feature_info, start, prev = [], [], 0, embed_dims[0]
        for i in range(n):
            stages.append(Stage(
                prev, embed_dims[i], depths[i], downsample=i > 0, drop_path=rates[start:start + depths[i]],
                num_heads=num_heads[i], mlp_ratio=mlp_ratios[i], mixer=mixer,
                sr_ratio=sr_ratios[i], landmarks=landmarks, qkv_bias=qkv_bias, proj_drop=proj_drop_rate,
                attn_drop=attn_drop_rate,
            ))
            start += depths[i]
            prev = embed_dims[i]
            self.feature_info.append(dict(num_chs=prev, reduction=stem_stride * 2**i, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Conv2d):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ValueError naming ``x`` unless x is (B, in_chans, H, W) with H, W >= the total stride.

        Eager mode only: ``forward_features`` and ``forward_intermediates`` skip it while scripted or
        FX-traced (it branches on the shape; ``layers/tracing.py``)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor of shape (B, {self.in_chans}, H, W), got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"x: expected a 4-D image batch (B, {self.in_chans}, H, W), got shape {tuple(x.shape)}")
        if x.shape[1] != self.in_chans:
            raise ValueError(f"x: expected {self.in_chans} channels (B, {self.in_chans}, H, W), got shape {tuple(x.shape)}")
        if x.shape[2] < self.stride or x.shape[3] < self.stride:
            raise ValueError(
                f"x: expected height and width >= the total stride {self.stride}, got shape {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"x: expected a floating-point tensor, got dtype {x.dtype}")

    def __prepare_scriptable__(self) -> "LaplacianFormer":
        """What ``torch.jit.script`` compiles: a copy of the module tree with the same parameters
        (``layers.scripting.script_view``), in which the attention layers become their script forms; this
        model keeps its layers."""
        return script_view(self)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return set()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^patch_embed", blocks=r"^stages\.(\d+)")

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for stage in self.stages:
            stage.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """New head with ``num_classes`` outputs (0: identity); ``global_pool`` "avg" or "" (4-D maps)."""
        if global_pool is not None:
            self.global_pool = _check_global_pool(global_pool)
        self.num_classes = num_classes
        self.config.update(num_classes=num_classes, global_pool=self.global_pool)
        ref = next(self.parameters())
        self.head = (
            nn.Linear(self.num_features, num_classes, device=ref.device, dtype=ref.dtype)
            if num_classes > 0 else nn.Identity()
        )
        self.head.train(self.training)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices=None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """Final features and the NCHW maps of the selected stages (timm's contract; ``norm`` is a no-op:
        every stage already ends in its LayerNorm).  Returns (x, [maps]) or [maps] if ``intermediates_only``."""
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt: expected 'NCHW', got {output_fmt!r}")
        if not torch.jit.is_scripting() and not is_fx_tracing():
            self.check_input(x)
        take, last = _take_indices(len(self.stages), indices)
        x = self.patch_embed(x)
        stages = self.stages[: last + 1] if stop_early or intermediates_only else self.stages
        maps = []
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take:
                maps.append(x)
        return maps if intermediates_only else (x, maps)

    def prune_intermediate_layers(self, indices=1, prune_norm: bool = False, prune_head: bool = True) -> list[int]:
        """Drop stages after the last one in ``indices`` (and the head); returns the kept indices."""
        take, last = _take_indices(len(self.stages), indices)
        if last < len(self.stages) - 1:
            self.stages = self.stages[: last + 1]
            self.num_features = self.head_hidden_size = self.feature_info[last]["num_chs"]
            prune_head = True
        if prune_head:
            self.reset_classifier(0, "")
        return take

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, in_chans, H, W) -> (B, num_features, ceil(H/stride), ceil(W/stride)), unpooled."""
        if not torch.jit.is_scripting() and not is_fx_tracing():
            self.check_input(x)
        return self.stages(self.patch_embed(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """(B, C, h, w) maps -> (B, num_classes) logits, or the pooled (B, C) features if ``pre_logits``."""
        if self.global_pool == "avg":
            x = x.mean(dim=(-1, -2))
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, in_chans, H, W) -> (B, num_classes) logits."""
        return self.forward_head(self.forward_features(x))


def _split_rows(t: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    return list(torch.split(t, list(sizes), dim=0))


def checkpoint_filter_fn(state_dict: Mapping[str, torch.Tensor], model: LaplacianFormer) -> dict[str, torch.Tensor]:
    """Map a LaplacianFormer state dict onto ``model``, also across attention variants.

    - strips a leading ``module.`` (DDP) and unwraps {"state_dict": ...} / {"model": ...};
    - Nyström ``attn.qkv`` (3C or tied 2C rows) <-> softmax ``attn.q`` + ``attn.kv`` rows;
    - parameters the target needs but the source lacks (softmax ``sr``/``norm``, the Nyström value
      ``dwconv``, a head of another size: a UserWarning names it) keep the target's initialisation; source parameters the target
      has no slot for are dropped. Shapes that differ otherwise raise ValueError naming the key.
    Returns a complete state dict for ``model.load_state_dict(..., strict=True)``.
    """
    for wrapper in ("state_dict", "model"):
        if wrapper in state_dict and isinstance(state_dict[wrapper], Mapping):
            state_dict = state_dict[wrapper]
    src = {re.sub(r"^module\.", "", k): v for k, v in state_dict.items()}
    target = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, ref in target.items():
        value = src.get(key)
        m = re.match(r"(.*\.attn\.)(q|kv|qkv)\.(weight|bias)$", key)
        if value is None and m:
            value = _convert_attn_proj(src, m.group(1), m.group(2), m.group(3), ref.shape[0])
        if value is None or (key.startswith("head.") and value.shape != ref.shape):
            if value is not None:  # a head of another class count: said, as timm says it
                warnings.warn(f"state_dict: {key} has shape {tuple(value.shape)}, the model's head "
                              f"{tuple(ref.shape)} (another num_classes): the head keeps its initialisation",
                              UserWarning, stacklevel=2)
            out[key] = ref
            continue
        if value.shape != ref.shape:
            raise ValueError(f"state_dict: {key} has shape {tuple(value.shape)}, the model expects {tuple(ref.shape)}")
        out[key] = value.to(ref.dtype)
    return out


def _convert_attn_proj(src: Mapping, prefix: str, name: str, kind: str, rows: int) -> torch.Tensor | None:
    """Build ``prefix + name`` (q, kv or qkv rows) from the other attention layout found in ``src``."""
    qkv, q, kv = (src.get(f"{prefix}{n}.{kind}") for n in ("qkv", "q", "kv"))
    if name in ("q", "kv") and qkv is not None:
        dim = rows if name == "q" else rows // 2
        if qkv.shape[0] == 3 * dim:
            pq, pk, pv = _split_rows(qkv, (dim, dim, dim))
        elif qkv.shape[0] == 2 * dim:
            pq, pv = _split_rows(qkv, (dim, dim))
            pk = pq
        else:
            return None
        return pq if name == "q" else torch.cat([pk, pv], 0)
    if name == "qkv" and q is not None and kv is not None:
        dim = q.shape[0]
        pk, pv = _split_rows(kv, (dim, dim))
        if rows == 3 * dim:
            return torch.cat([q, pk, pv], 0)
        if rows == 2 * dim:
            return torch.cat([q, pv], 0)
    return None


# --- pretrained cfgs (plain dicts; timm reads ``default_cfgs`` of this module when registering) -----------

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _cfg(**kwargs) -> dict:
    """Preprocessing and module names of a model (timm's pretrained cfg). No weights exist (url "")."""
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7),
        "crop_pct": 0.9, "interpolation": "bicubic", "mean": IMAGENET_MEAN, "std": IMAGENET_STD,
        "first_conv": "patch_embed.proj", "classifier": "head", "fixed_input_size": False, "license": "mit",
        "paper_ids": "arXiv:2604.20368", "paper_name": "LaplacianFormer: Rethinking Linear Attention with Laplacian Kernel",
        **kwargs,
    }


default_cfgs: dict[str, dict] = {name: _cfg() for name in MODEL_CONFIGS}


# --- the builder and its entry points ----------------------------------------------------------------------

# keys of a saved pretrained cfg that describe the weights (class count and names, preprocessing)
_WEIGHTS_CFG_KEYS = ("num_classes", "input_size", "pool_size", "mean", "std", "interpolation", "crop_pct",
                     "crop_mode", "label_names", "label_descriptions")
# constructor arguments a saved file supplies when the caller does not give them; the sizes must match
_SAVED_ARCH_DEFAULTS = ("attn", "attn_kwargs", "landmarks", "sr_ratios", "qkv_bias", "stem_stride")
_SIZE_KEYS = ("depths", "embed_dims", "num_heads", "mlp_ratios")
# arguments only timm's builder takes (timm.create_model passes the first three to every entry point)
_TIMM_ARGS = frozenset({"pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "features_only", "out_indices",
                        "feature_cls", "feature_cfg"})


def no_pretrained_weights(name: str) -> RuntimeError:
    """The error for ``pretrained=True`` without a weights source (timm's wording, plus where to load from)."""
    return RuntimeError(
        f"No pretrained weights exist for {name} (the paper released none). Use `pretrained=False` for random "
        "init, or load your own: laplacianformer.from_pretrained(DIR), or timm.create_model(name, "
        "pretrained=True, pretrained_cfg_overlay=dict(file=PATH)) with PATH a model.safetensors written by "
        "laplacianformer.save_pretrained or a training run."
    )


def _no_saved_config(file: str) -> Mapping | None:
    return None


_weights_config: Callable[[str], Mapping | None] = _no_saved_config


def set_weights_config_reader(reader: Callable[[str], Mapping | None]) -> None:
    """Install how the saved config of a weights file is read: ``reader(file)`` -> {"config": constructor
    arguments, "pretrained_cfg": ...} or None. ``laplacianformer.hub``, the one reader of saved configs and a
    layer above this package, installs its ``weights_config`` when it is imported (``import laplacianformer``
    does); this package reads no files."""
    global _weights_config
    _weights_config = reader


def _pretrained_file_defaults(variant: str, kwargs: dict) -> dict:
    """For ``pretrained=True`` with ``pretrained_cfg_overlay=dict(file=...)``: the file's saved config
    fills what the caller left out: the weights' pretrained cfg (num_classes, input size, mean/std, class
    names: so a 10-class head loads instead of being re-initialised) and the attention arguments. A file
    of other depths or widths than ``variant`` is a ValueError naming the matching registered name."""
    overlay = dict(kwargs.get("pretrained_cfg_overlay") or {})
    file = overlay.get("file")
    saved = _weights_config(file) if file else None
    if saved is None:
        return kwargs
    config, cfg = saved["config"], saved.get("pretrained_cfg") or {}
    arch = dict(MODEL_CONFIGS[variant], **kwargs)
    for key in _SIZE_KEYS:
        if key in config and list(config[key]) != list(arch.get(key, config[key])):
            match = next((n for n, c in MODEL_CONFIGS.items()
                          if all(list(c[k]) == list(config.get(k, c[k])) for k in _SIZE_KEYS)), None)
            hint = f"create it as {match!r}" if match else "load it with laplacianformer.from_pretrained"
            raise ValueError(f"pretrained_cfg_overlay: {file} holds a model with {key}={list(config[key])}, "
                             f"{variant} has {list(arch[key])}; {hint}")
    import dataclasses

    from timm.models import PretrainedCfg

    fields = {f.name for f in dataclasses.fields(PretrainedCfg)}
    overlay.update({k: cfg[k] for k in _WEIGHTS_CFG_KEYS if k in cfg and k in fields and k not in overlay})
    return dict(kwargs, pretrained_cfg_overlay=overlay,
                **{k: config[k] for k in _SAVED_ARCH_DEFAULTS if k in config and k not in kwargs})


def _has_weights_source(kwargs: dict) -> bool:
    cfgs = [kwargs.get("pretrained_cfg_overlay"), kwargs.get("pretrained_cfg")]
    return any(isinstance(c, Mapping) and any(c.get(k) for k in ("file", "url", "state_dict", "hf_hub_id"))
               for c in cfgs)


def create_model(name: str, *, pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Build a registered LaplacianFormer: the one builder, behind every entry point (``timm.create_model``).

    Args:
        name: one of ``registry.list_models()`` (ValueError naming ``name`` otherwise).
        pretrained: no weights were published: True needs a weights source (timm's
            ``pretrained_cfg_overlay=dict(file=PATH)``, ...), else a RuntimeError naming the model, as timm's
            (``no_pretrained_weights``). A file saved by this package also gives its class count,
            preprocessing and attention arguments. Saved models load with ``laplacianformer.from_pretrained``.
        kwargs: ``LaplacianFormer`` arguments over the name's sizes: num_classes, in_chans, attn
            ("laplacian" | "gaussian" | "softmax"), attn_kwargs (laplacian/gaussian: lam, qk_scale, norm,
            solver, iters, ns_eps, tie_qk, landmarks, dwconv, recompute; softmax: sr_ratio), attn_preset
            ("paper" | "tuned": ``layers.ATTN_PRESETS``), drop_rate,
            drop_path_rate, depths, embed_dims, landmarks, stem_stride, check_finite_inputs, ...; and timm's builder arguments
            (``features_only``, ``out_indices``, ``pretrained_cfg``, ...).

    timm builds the model (its pretrained cfg, weights loaded through ``checkpoint_filter_fn``, feature
    extraction) when the call needs it: ``pretrained=True`` or one of timm's arguments, as every call through
    ``timm.create_model`` has. Otherwise the model is built here, without importing timm, and
    ``model.pretrained_cfg`` is the name's cfg.
    """
    arch = model_config(name)
    if pretrained and not _has_weights_source(kwargs):
        raise no_pretrained_weights(name)
    if not pretrained and _TIMM_ARGS.isdisjoint(kwargs):
        model = LaplacianFormer(**dict(arch, **kwargs))
        model.pretrained_cfg = dict(default_cfgs[name], architecture=name)
        return _with_input_size(model)
    from timm.models import build_model_with_cfg

    if pretrained:
        kwargs = _pretrained_file_defaults(name, kwargs)
    out_indices = kwargs.pop("out_indices", (0, 1, 2, 3))
    model = build_model_with_cfg(
        LaplacianFormer,
        name,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(flatten_sequential=True, out_indices=out_indices),
        **dict(arch, **kwargs),
    )
    return _with_input_size(model) if isinstance(model, LaplacianFormer) else model


# timm's entry points: one function per ``registry.MODEL_CONFIGS`` name (tests/models check the pairing),
# registered by ``register_timm``


def laplacianformer_micro(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Micro: not a paper size; a small model for CPU demos, tests and ablations."""
    return create_model("laplacianformer_micro", pretrained=pretrained, **kwargs)


def laplacianformer_tiny(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Tiny: the paper's smallest size (its parameters and MACs: ``registry.PAPER``)."""
    return create_model("laplacianformer_tiny", pretrained=pretrained, **kwargs)


def laplacianformer_small(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Small: a paper size (its parameters and MACs: ``registry.PAPER``)."""
    return create_model("laplacianformer_small", pretrained=pretrained, **kwargs)


def laplacianformer_medium(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Medium: a paper size (its parameters and MACs: ``registry.PAPER``)."""
    return create_model("laplacianformer_medium", pretrained=pretrained, **kwargs)


def laplacianformer_large(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Large: a paper size (its parameters and MACs: ``registry.PAPER``)."""
    return create_model("laplacianformer_large", pretrained=pretrained, **kwargs)


def laplacianformer_huge(pretrained: bool = False, **kwargs) -> LaplacianFormer:
    """Huge: the paper's largest size (its parameters and MACs: ``registry.PAPER``)."""
    return create_model("laplacianformer_huge", pretrained=pretrained, **kwargs)


entry_points: dict[str, Callable[..., LaplacianFormer]] = {
    fn.__name__: fn for fn in (laplacianformer_micro, laplacianformer_tiny, laplacianformer_small,
                               laplacianformer_medium, laplacianformer_large, laplacianformer_huge)
}


_TIMM_REGISTERED = False


def register_timm() -> bool:
    """Register this family's entry points and ``default_cfgs`` with timm, and the layers' FX leaf functions
    with timm's FX helpers, if timm can be imported (this imports it); returns whether timm has them.
    Idempotent.

    ``laplacianformer.models`` calls it once timm is imported (at once if it already is, else from an
    import hook: ``import_hook.after_import``), so the package never imports timm for it."""
    global _TIMM_REGISTERED
    if _TIMM_REGISTERED:
        return True
    import importlib.util

    try:
        if importlib.util.find_spec("timm") is None:
            return False
        from timm.models import register_model
    except (ImportError, ValueError):
        return False
    if _TIMM_REGISTERED:  # importing timm just now ran the import hook, which registered
        return True
    from ..layers.tracing import register_with_timm_fx

    for entry in entry_points.values():
        register_model(entry)
    register_with_timm_fx()
    _TIMM_REGISTERED = True
    return True
