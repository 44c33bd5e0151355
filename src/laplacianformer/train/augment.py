"""Batch-level augmentation driven by an explicit ``torch.Generator`` (seeded per step, so resumable).

Shapes: images uint8 (B, C, S, S) in, float (B, C, S, S) normalised out; targets int64 (B,) in,
soft targets (B, K) out when mixup/CutMix is on. Mixup (Zhang et al.) and CutMix (Yun et al.) follow
the DeiT recipe: per batch, one of the two is chosen (CutMix with probability 1/2 when both are on),
lambda ~ Beta(alpha, alpha), the batch is mixed with its flipped order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_crop_flip(x: torch.Tensor, g: torch.Generator, *, pad: int, crop: bool, flip: bool) -> torch.Tensor:
    """Random translation by up to ``pad`` pixels (zero padding) and horizontal flip, per sample."""
    b, _, h, w = x.shape
    if crop and pad > 0:
        padded = F.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (b,), generator=g)
        dx = torch.randint(0, 2 * pad + 1, (b,), generator=g)
        rows = (dy[:, None] + torch.arange(h)[None]).to(x.device)
        cols = (dx[:, None] + torch.arange(w)[None]).to(x.device)
        idx_r = rows[:, None, :, None].expand(b, x.shape[1], h, padded.shape[-1])
        x = padded.gather(2, idx_r)
        idx_c = cols[:, None, None, :].expand(b, x.shape[1], h, w)
        x = x.gather(3, idx_c)
    if flip:
        mask = (torch.rand(b, generator=g) < 0.5).to(x.device)
        x = torch.where(mask[:, None, None, None], x.flip(-1), x)
    return x


def rand_augment(x: torch.Tensor, seed: int) -> torch.Tensor:
    """torchvision.transforms.v2.RandAugment (2 ops, magnitude 9) per sample, under a forked seeded RNG."""
    try:
        from torchvision.transforms import v2
    except ImportError:
        raise ValueError("randaugment: needs torchvision (pip install torchvision)") from None
    aug = v2.RandAugment(num_ops=2, magnitude=9)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.stack([aug(img) for img in x.cpu()]).to(x.device)


def normalize(x: torch.Tensor, mean, std) -> torch.Tensor:
    """uint8 (B, C, S, S) -> float32 (x / 255 - mean) / std, per channel."""
    m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return (x.float() / 255.0 - m) / s


def one_hot_smooth(y: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    """(B,) -> (B, K) targets with ``smoothing`` spread uniformly over the K classes."""
    off = smoothing / num_classes
    out = torch.full((y.shape[0], num_classes), off, device=y.device)
    return out.scatter_(1, y[:, None], 1.0 - smoothing + off)


def mix_batch(x, y, g: torch.Generator, *, num_classes: int, mixup: float, cutmix: float, prob: float,
              smoothing: float):
    """Returns (mixed x, soft targets (B, K)). With both alphas 0 or the coin says no: plain smoothed targets."""
    target = one_hot_smooth(y, num_classes, smoothing)
    if (mixup <= 0 and cutmix <= 0) or torch.rand((), generator=g).item() >= prob:
        return x, target
    use_cutmix = cutmix > 0 and (mixup <= 0 or torch.rand((), generator=g).item() < 0.5)
    alpha = cutmix if use_cutmix else mixup
    lam = _beta(alpha, g)
    x_flip, t_flip = x.flip(0), target.flip(0)
    if use_cutmix:
        h, w = x.shape[-2:]
        cut = (1.0 - lam) ** 0.5
        ch, cw = int(h * cut), int(w * cut)
        cy = int(torch.randint(0, h, (), generator=g))
        cx = int(torch.randint(0, w, (), generator=g))
        y0, y1 = max(cy - ch // 2, 0), min(cy + ch // 2, h)
        x0, x1 = max(cx - cw // 2, 0), min(cx + cw // 2, w)
        x = x.clone()
        x[..., y0:y1, x0:x1] = x_flip[..., y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
    else:
        x = x * lam + x_flip * (1.0 - lam)
    return x, target * lam + t_flip * (1.0 - lam)


def _beta(alpha: float, g: torch.Generator) -> float:
    """A Beta(alpha, alpha) sample from the generator (two Gamma draws via torch._standard_gamma)."""
    a = torch._standard_gamma(torch.full((2,), float(alpha)), generator=g)
    return float(a[0] / (a[0] + a[1]))
