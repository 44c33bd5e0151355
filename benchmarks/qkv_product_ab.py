"""CPU inference with q, k and v from one product (``TokenAttention._project_qkv``) against three products (the
projections before issue 40), each forced at every width (the layer chooses by ``ONE_PRODUCT_MIN_WIDTH``), side by
side in one process: each attention layer of Tiny at 16×16 and at its 224²
grid (1 thread), then the whole model at 224² and 512² (2 threads). docs/DEPLOY.md, "Where the time goes".

    python -m benchmarks.qkv_product_ab

Repository only (not in the wheel): run from the checkout's root.
"""

from __future__ import annotations

import types

import torch

from laplacianformer import create_model
from laplacianformer.bench.harness import round_robin
from laplacianformer.bench.host_overhead import cases
from laplacianformer.bench.stage_attention import make_layer_case
from laplacianformer.layers.laplacian_attention import LaplacianAttention
from laplacianformer.ops.attention import attention_with_value_conv


def three_products(self, x, hw):
    """``_attend_value_conv`` with q, k and v as three products (contiguous), as before the one product."""
    q, k = self._project_qk(x)
    return attention_with_value_conv(q, k, self._project_v(x), self.settings, hw=hw, weight=self.dwconv.weight,
                                     bias=self.dwconv.bias, norm_gain=self.norm_gain, plans=self._plans)


def one_product(self, x, hw):
    """``_attend_value_conv`` with q, k and v strided views of one product, at any width."""
    q, k, v_tok = self._project_qkv(x)
    return attention_with_value_conv(q, k, v_tok, self.settings, hw=hw, weight=self.dwconv.weight,
                                     bias=self.dwconv.bias, norm_gain=self.norm_gain, plans=self._plans)


def _patched(model, method):
    for layer in model.modules():
        if isinstance(layer, LaplacianAttention):
            layer._attend_value_conv = types.MethodType(method, layer)
    return model


def main() -> None:
    torch.set_num_threads(1)
    for shape in cases("laplacianformer_tiny", 16):
        one, module = make_layer_case("laplacianformer_tiny", "laplacian", shape["stage"], shape, 1, "infer", "cpu")[:2]
        _patched(module, one_product)
        three, module = make_layer_case("laplacianformer_tiny", "laplacian", shape["stage"], shape, 1, "infer", "cpu")[:2]
        _patched(module, three_products)
        t = round_robin({"one": one, "three": three}, device="cpu", repeats=300, max_seconds=6)
        print(f"layer, stage {shape['stage'] + 1} {shape['grid']}: one {t['one'].median_ms:.3f} ms, three "
              f"{t['three'].median_ms:.3f} ms, ratio {t['one'].median_ms / t['three'].median_ms:.3f}")
    torch.set_num_threads(2)
    torch.manual_seed(0)
    a = _patched(create_model("laplacianformer_tiny").eval(), one_product)
    b = _patched(create_model("laplacianformer_tiny").eval(), three_products)
    b.load_state_dict(a.state_dict())
    for size, repeats in ((224, 60), (512, 21)):
        x = torch.randn(1, 3, size, size)
        with torch.no_grad():
            t = round_robin({"one": lambda: a(x), "three": lambda: b(x)}, device="cpu", repeats=repeats, max_seconds=30)
        print(f"model, {size}²: one {t['one'].median_ms:.2f} ms, three {t['three'].median_ms:.2f} ms, ratio "
              f"{t['one'].median_ms / t['three'].median_ms:.3f}")


if __name__ == "__main__":
    main()
