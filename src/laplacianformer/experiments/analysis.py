"""Analyses of a (trained) model's attention (DESIGN.md §1, §2, §4): what the paper's claims rest on.

All functions take the queries/keys that the model's ``LaplacianAttention`` modules actually see
(``capture_qk``) and work on small token grids only: the exact N×N matrices are materialised here for
comparison, so keep N (tokens per image at a stage) in the hundreds.

- ``distance_stats``: distribution of query–key L1 and squared-L2 distances per stage (the paper's
  heavy-tail motivation for the Laplacian over the Gaussian kernel).
- ``attention_rows``: one query's normalised attention row, exact Laplacian vs Nyström-Laplacian vs
  exact Gaussian, as token-grid maps.
- ``singular_values``: normalised singular-value profiles of the Laplacian, Gaussian and softmax
  similarity matrices and of the Nyström approximation.
- ``nystrom_error``: relative Frobenius error of C W⁺ Cᵀ against the exact kernel vs landmark count.
- ``output_gain``: how much each normalisation variant (DESIGN.md §4) amplifies the values it mixes.
"""

from __future__ import annotations

import torch

from ..layers import LaplacianAttention
from ..ops.attention import laplacian_attention, pool_landmarks
from ..ops.kernel import laplace_kernel
from ..ops.kernel.composite import pairwise_distance
from ..ops.newton_schulz import regularise, regularised_inverse
from ..ops.normalization import normalize_dense, normalize_nystrom
from ..ops.validation import NORMS, resolve_landmarks


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


@torch.no_grad()
def capture_qk(model: torch.nn.Module, images: torch.Tensor, run=None) -> list[dict]:
    """Runs ``model(images)`` (or ``run(images)``, e.g. a part of the model) and returns, for every ``LaplacianAttention`` module in call order:
    name, hw, scaled q and k (B, H, N, d) as the operator sees them (times qk_scale), v, the effective
    landmark grid (None: exact kernel) and the module's attention settings.  Half precision is upcast
    to float32."""
    records: list[dict] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(module, args, kwargs):
        x = args[0]
        hw = args[1] if len(args) > 1 else kwargs.get("hw")
        n = x.shape[1]
        q, k = module._project_qk(x)
        v = module._heads(module._project_v(x))
        kw = module.attn_kwargs
        scale = module.head_dim**-0.5 if kw["qk_scale"] is None else kw["qk_scale"]
        records.append({
            "name": names[module], "hw": tuple(int(s) for s in hw), "q": _upcast(q) * scale, "k": _upcast(k) * scale,
            "v": _upcast(v), "landmarks": resolve_landmarks(module.landmarks, tuple(hw), n), "settings": dict(kw),
        })

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in model.modules() if isinstance(m, LaplacianAttention)]
    if not handles:
        raise ValueError("model: expected a model with LaplacianAttention modules (attn='laplacian' or 'gaussian')")
    try:
        was_training = model.training
        model.eval()
        (model if run is None else run)(images)
        model.train(was_training)
    finally:
        for h in handles:
            h.remove()
    return records


def _excess_kurtosis(x: torch.Tensor) -> float:
    x = x.double()
    c = x - x.mean()
    return float((c.pow(4).mean() / c.pow(2).mean().pow(2)) - 3.0)


def _sample(x: torch.Tensor, size: int = 200_000) -> torch.Tensor:
    """A seeded random subset of the flattened x (all of it when small), in float64."""
    x = x.flatten().double()
    if x.numel() <= size:
        return x
    return x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(0))[:size]]


def _summary(x: torch.Tensor) -> dict:
    x = x.flatten()
    qs = torch.quantile(_sample(x), torch.tensor([0.01, 0.5, 0.99, 0.999], dtype=torch.float64)).tolist()
    return {"mean": float(x.mean()), "std": float(x.std()), "p01": qs[0], "median": qs[1], "p99": qs[2],
            "p999": qs[3], "p99_over_median": qs[2] / qs[1], "excess_kurtosis": _excess_kurtosis(x)}


def distance_stats(records: list[dict], bins: int = 60) -> list[dict]:
    """Per attention module: summaries and histograms of the query–key L1 and squared-L2 distances,
    and the share of pairs whose kernel value exp(-D/lam) falls below 1e-3 for each kernel."""
    out = []
    for r in records:
        lam = r["settings"]["lam"]
        l1 = pairwise_distance(r["q"], r["k"], "laplacian")
        l2 = pairwise_distance(r["q"], r["k"], "gaussian")
        entry = {"name": r["name"], "hw": list(r["hw"]), "lam": lam, "pairs": l1.numel()}
        for key, d in (("l1", l1), ("sq_l2", l2)):
            scaled = (d / d.median()).flatten()
            hi = float(torch.quantile(_sample(scaled), 0.9999))
            hist = torch.histc(scaled.clamp_max(hi), bins=bins, min=0.0, max=hi)
            entry[key] = {**_summary(d), "hist_edges_over_median": torch.linspace(0, hi, bins + 1).tolist(),
                          "hist_density": (hist / hist.sum() / (hi / bins)).tolist(),
                          "kernel_below_1e-3": float((torch.exp(-d / lam) < 1e-3).double().mean())}
        out.append(entry)
    return out


def _module_kernel(r: dict) -> str:
    return r["settings"].get("kernel", "laplacian")


def _nystrom_factors(q, k, hw, grid, lam, kind, solver, iters, eps):
    marks = pool_landmarks(q, hw, grid)
    w_inv = regularised_inverse(laplace_kernel(marks, marks, lam, kind), solver=solver, iters=iters, eps=eps)
    c_q = laplace_kernel(q, marks, lam, kind)
    c_k = laplace_kernel(k, marks, lam, kind)
    return c_q, c_k @ w_inv.transpose(-1, -2)


def attention_rows(record: dict, query: int | None = None, head: int = 0, max_images: int = 4) -> dict:
    """Normalised attention rows Z_i· of one query (default: the centre token) as (h, w) maps:
    exact Laplacian, Nyström-Laplacian (the module's landmarks, solver and norm), exact Gaussian.
    Returns numpy-free nested lists plus the relative L2 error of the Nyström row."""
    h, w = record["hw"]
    n = h * w
    query = (h // 2) * w + w // 2 if query is None else query
    s = record["settings"]
    grid = record["landmarks"] or (min(7, h), min(7, w))
    q = record["q"][:max_images, head : head + 1].double()
    k = record["k"][:max_images, head : head + 1].double()
    eye = torch.eye(n, dtype=torch.float64).expand(q.shape[0], 1, n, n)
    maps = {}
    for label, kind in (("exact laplacian", "laplacian"), ("exact gaussian", "gaussian")):
        maps[label] = normalize_dense(laplace_kernel(q, k, s["lam"], kind), eye, s["norm"])[:, 0, query]
    c_q, b = _nystrom_factors(q, k, (h, w), grid, s["lam"], "laplacian", s["solver"], s["iters"], s["ns_eps"])
    maps["nystrom laplacian"] = normalize_nystrom(c_q, b, eye, s["norm"])[:, 0, query]
    err = (maps["nystrom laplacian"] - maps["exact laplacian"]).norm(dim=-1) / maps["exact laplacian"].norm(dim=-1)
    return {"name": record["name"], "hw": [h, w], "query": query, "head": head, "landmarks": list(grid),
            "norm": s["norm"], "lam": s["lam"], "rel_error_nystrom": err.tolist(),
            "maps": {kk: vv.reshape(-1, h, w).tolist() for kk, vv in maps.items()}}


def _sv_profile(mat: torch.Tensor) -> torch.Tensor:
    sv = torch.linalg.svdvals(mat.double())
    return (sv / sv[..., :1]).flatten(0, -2).mean(0)


def effective_rank(profile: torch.Tensor) -> float:
    """exp(entropy) of the normalised singular values (Roy & Vetterli)."""
    p = profile / profile.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def singular_values(record: dict) -> dict:
    """Mean normalised singular values σ_i/σ_1 over images and heads of: exact Laplacian, exact Gaussian,
    softmax(q kᵀ · sqrt(d)) (q, k unscaled: the usual softmax logits), and the Nyström-Laplacian C W⁺ Cᵀ."""
    q, k = record["q"].double(), record["k"].double()
    s = record["settings"]
    d = q.shape[-1]
    scale = d**-0.5 if s["qk_scale"] is None else s["qk_scale"]
    logits = (q / scale) @ (k / scale).transpose(-1, -2) * d**-0.5
    grid = record["landmarks"] or (min(7, record["hw"][0]), min(7, record["hw"][1]))
    c_q, b = _nystrom_factors(q, k, record["hw"], grid, s["lam"], "laplacian", s["solver"], s["iters"], s["ns_eps"])
    mats = {
        "laplacian": laplace_kernel(q, k, s["lam"], "laplacian"),
        "gaussian": laplace_kernel(q, k, s["lam"], "gaussian"),
        "softmax": torch.softmax(logits, -1),
        "nystrom laplacian": c_q @ b.transpose(-1, -2),
    }
    profiles = {key: _sv_profile(m) for key, m in mats.items()}
    return {"name": record["name"], "hw": list(record["hw"]), "landmarks": list(grid),
            "profiles": {key: p.tolist() for key, p in profiles.items()},
            "effective_rank": {key: effective_rank(p) for key, p in profiles.items()},
            "count_above_1e-2": {key: int((p > 1e-2).sum()) for key, p in profiles.items()}}


def nystrom_error(record: dict, sides=None, iters: int = 20) -> dict:
    """Relative Frobenius error ||G - C_q W⁺ C_kᵀ|| / ||G|| vs landmark grid side s (m = s²), for the
    Laplacian and Gaussian kernels, with the exact inverse and with ``iters`` Newton–Schulz steps."""
    h, w = record["hw"]
    q, k = record["q"].double(), record["k"].double()
    s = record["settings"]
    sides = sides or [x for x in (2, 3, 4, 5, 6, 7, 8, 10, 12, 14) if x <= min(h, w)]
    out = {"name": record["name"], "hw": [h, w], "m": [x * x for x in sides], "lam": s["lam"], "errors": {}}
    for kind in ("laplacian", "gaussian"):
        g = laplace_kernel(q, k, s["lam"], kind)
        for solver, label in (("exact", "exact inverse"), ("newton_schulz", f"NS {iters} it")):
            errs = []
            for side in sides:
                c_q, b = _nystrom_factors(q, k, (h, w), (side, side), s["lam"], kind, solver, iters, s["ns_eps"])
                approx = c_q @ b.transpose(-1, -2)
                errs.append(float(((approx - g).flatten(-2).norm(dim=-1) / g.flatten(-2).norm(dim=-1)).mean()))
            out["errors"][f"{kind}, {label}"] = errs
    return out


def landmark_matrices_from(records: list[dict]) -> dict[str, torch.Tensor]:
    """P = W + ns_eps·I of every Nyström module, W = k(L, L) from the model's pooled queries: name -> (B·H, m, m)."""
    fams = {}
    for r in records:
        if r["landmarks"] is None:
            continue
        s = r["settings"]
        marks = pool_landmarks(r["q"], r["hw"], r["landmarks"])
        w = laplace_kernel(marks, marks, s["lam"], _module_kernel(r))
        fams[f"W model {r['name']} ({r['hw'][0]}x{r['hw'][1]} tokens, lam={s['lam']:g})"] = regularise(w, s["ns_eps"]).flatten(0, 1)
    return fams


# the normalisation variants of the gain-against-tokens table (docs/DESIGN.md §4.4, §4.6): label -> settings
GAIN_VARIANTS = {
    "injective": {"norm": "injective", "norm_scale": "one"},
    "injective /√N": {"norm": "injective", "norm_scale": "inv_sqrt_n"},
    "injective /N": {"norm": "injective", "norm_scale": "inv_n"},
    "inline": {"norm": "inline"},
    "rowsum": {"norm": "rowsum"},
    "none": {"norm": "none"},
}


@torch.no_grad()
def variant_gain(record: dict, variants: dict = GAIN_VARIANTS) -> dict[str, float]:
    """RMS(core output) / RMS(V) of one captured module (``capture_qk``) per variant of ``variants`` (label ->
    operator settings replacing the module's), in float64 on the module's own q, k, v."""
    base = {k: v for k, v in record["settings"].items() if k not in ("norm", "norm_scale")}
    base["qk_scale"] = 1.0  # the captured q and k are already scaled
    q, k, v = (record[name].double() for name in ("q", "k", "v"))
    v_rms = float(v.square().mean().sqrt())
    out = {}
    for label, settings in variants.items():
        o = laplacian_attention(q, k, v, hw=record["hw"], landmarks=record["landmarks"], **{**base, **settings})
        out[label] = float(o.square().mean().sqrt()) / v_rms
    return out


@torch.no_grad()
def synthetic_gain(tokens: int, variants: dict = GAIN_VARIANTS, heads: int = 2, head_dim: int = 32,
                   seed: int = 0) -> dict[str, float]:
    """Output std of the operator for unit-variance random q, k, v (B 1, ``heads``, ``tokens`` on a square grid
    when it is one, else 1-D; d = ``head_dim``; default settings, 7×7 landmarks clamped as the module clamps)
    per variant, float64, with SDPA softmax (``"softmax (SDPA)"``) for scale."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, tokens, head_dim, generator=gen, dtype=torch.float64) for _ in range(3))
    side = int(round(tokens ** 0.5))
    hw = (side, side) if side * side == tokens else None
    grid = resolve_landmarks((7, 7), hw, tokens)
    out = {label: float(laplacian_attention(q, k, v, hw=hw, landmarks=grid, **settings).std())
           for label, settings in variants.items()}
    out["softmax (SDPA)"] = float(torch.nn.functional.scaled_dot_product_attention(q, k, v).std())
    return out


@torch.no_grad()
def output_gain(records: list[dict], norms=NORMS) -> list[dict]:
    """Per attention module and normalisation variant (DESIGN.md §4): RMS of the attention core's output
    Σ_j z_ij v_j over the RMS of V, on the module's own q, k, v and settings with only ``norm`` changed, each
    map unscaled (``norm_scale="one"``; the scales of §4.6 are ``variant_gain``'s).

    An average of the values (rowsum) keeps the gain at or below 1, the centred rows of inline add small
    corrections to v̄, while the injective map gives every key's column unit spread over the queries, so
    its output grows with the number of keys."""
    out = []
    for r in records:
        settings = {k: v for k, v in r["settings"].items() if k != "norm"}
        settings["qk_scale"] = 1.0  # the captured q and k are already scaled
        settings["norm_scale"] = "one"
        q, k, v = (r[name].double() for name in ("q", "k", "v"))
        v_rms = float(v.square().mean().sqrt())
        gains = {}
        for norm in norms:
            o = laplacian_attention(q, k, v, hw=r["hw"], landmarks=r["landmarks"], norm=norm, **settings)
            gains[norm] = float(o.square().mean().sqrt()) / v_rms
        h, w = r["hw"]
        out.append({"name": r["name"], "hw": [h, w], "tokens": h * w,
                    "landmarks": None if r["landmarks"] is None else list(r["landmarks"]),
                    "model_norm": r["settings"]["norm"], "v_rms": v_rms, "gain": gains,
                    "key_scale_spread": _key_scale_spread(q, k, r)})
    return out


def _key_scale_spread(q: torch.Tensor, k: torch.Tensor, r: dict) -> dict:
    """The injective map's per-key factors r_j = (s_j² + eps)^(-1/2) (DESIGN.md §4.1, s_j² the variance over
    the queries of key j's centred similarity column), relative to their median within each image and head:
    the p99 and the maximum of r_j / median_j r_j, averaged over images and heads."""
    s = r["settings"]
    if r["landmarks"] is None:
        g = laplace_kernel(q, k, s["lam"], _module_kernel(r))
    else:
        c_q, b = _nystrom_factors(q, k, r["hw"], r["landmarks"], s["lam"], _module_kernel(r), s["solver"], s["iters"],
                                  s["ns_eps"])
        g = c_q @ b.transpose(-1, -2)
    h = g - g.mean(-1, keepdim=True)
    scale = torch.rsqrt(h.var(-2, unbiased=False) + 1e-6)  # (B, H, N keys)
    rel = scale / scale.median(-1, keepdim=True).values
    return {"p99_over_median": float(torch.quantile(rel.flatten(0, 1), 0.99, dim=-1).mean()),
            "max_over_median": float(rel.amax(-1).mean())}
