"""Attention analyses: captured q/k are the operator's, exact limits hold, and the CLI writes its files."""

import json

import pytest
import torch
from torch import nn

from laplacianformer import LaplacianAttention, laplacian_attention
from laplacianformer.experiments import analysis, analyze
from laplacianformer.ops.kernel.naive import pairwise_l1_naive, pairwise_sq_l2_naive


class TinyGridModel(nn.Module):
    """Two LaplacianAttention layers on a fixed (h, w) grid of C-dim tokens."""

    def __init__(self, hw=(5, 6), dim=8, heads=2, landmarks=(2, 3), **kw):
        super().__init__()
        self.hw = hw
        self.a1 = LaplacianAttention(dim, heads, landmarks=landmarks, **kw)
        self.a2 = LaplacianAttention(dim, heads, landmarks=None, **kw)

    def forward(self, x):
        return self.a2(self.a1(x, self.hw), hw=self.hw)


def _records(**kw):
    torch.manual_seed(0)
    model = TinyGridModel(**kw).double()
    return model, analysis.capture_qk(model, torch.randn(3, 30, 8, dtype=torch.float64))


def test_capture_reproduces_the_module_output():
    model, recs = _records(qk_scale=0.7)
    assert [r["name"] for r in recs] == ["a1", "a2"]
    assert recs[0]["landmarks"] == (2, 3) and recs[1]["landmarks"] is None
    x = torch.randn(3, 30, 8, dtype=torch.float64)
    r = analysis.capture_qk(model, x)[0]
    mod = model.a1
    settings = {**r["settings"], "qk_scale": 1.0}
    attn = laplacian_attention(r["q"], r["k"], r["v"], hw=r["hw"], landmarks=r["landmarks"], **settings)
    v_tok = r["v"].transpose(1, 2).reshape(3, 30, 8)
    rebuilt = mod.proj(attn.transpose(1, 2).reshape(3, 30, 8) + mod._value_conv(v_tok, model.hw))
    torch.testing.assert_close(rebuilt, mod(x, model.hw))


def test_capture_refuses_models_without_laplacian_attention():
    with pytest.raises(ValueError, match="^model"):
        analysis.capture_qk(nn.Linear(4, 4), torch.randn(2, 4))


def test_distance_stats_match_naive_distances():
    _, recs = _records()
    stats = analysis.distance_stats(recs[:1], bins=10)[0]
    l1 = pairwise_l1_naive(recs[0]["q"], recs[0]["k"])
    l2 = pairwise_sq_l2_naive(recs[0]["q"], recs[0]["k"])
    assert stats["l1"]["mean"] == pytest.approx(float(l1.mean()), rel=1e-9)
    assert stats["sq_l2"]["mean"] == pytest.approx(float(l2.mean()), rel=1e-6)
    assert stats["pairs"] == l1.numel()
    assert sum(stats["l1"]["hist_density"]) * (stats["l1"]["hist_edges_over_median"][1]) == pytest.approx(1.0)


def test_nystrom_limits_are_exact_when_landmarks_cover_the_grid():
    _, recs = _records(landmarks=(5, 6), solver="exact", ns_eps=0.0)
    rec = dict(recs[0], landmarks=(5, 6))
    rows = analysis.attention_rows(rec, max_images=2)
    assert max(rows["rel_error_nystrom"]) < 1e-5
    assert len(rows["maps"]["exact gaussian"][0]) == 5
    err = analysis.nystrom_error(rec, sides=[2, 5])
    assert err["m"] == [4, 25]
    for key, errs in err["errors"].items():
        assert errs[0] > errs[1]
    sv = analysis.singular_values(rec)
    for prof in sv["profiles"].values():
        assert prof[0] == pytest.approx(1.0)
        assert all(a >= b - 1e-12 for a, b in zip(prof, prof[1:]))
    torch.testing.assert_close(torch.tensor(sv["profiles"]["nystrom laplacian"][:5]),
                               torch.tensor(sv["profiles"]["laplacian"][:5]), rtol=1e-4, atol=1e-6)


def test_landmark_matrices_from_model_are_regularised():
    _, recs = _records()
    fams = analysis.landmark_matrices_from(recs)
    (name, p), = fams.items()
    assert "a1" in name and p.shape == (6, 6, 6)
    assert torch.allclose(torch.diagonal(p, dim1=-2, dim2=-1), torch.full((6, 6), 1.01, dtype=p.dtype))


def test_cli_maps_on_untrained_model(tmp_path, capsys):
    assert analyze.main(["maps", "--untrained", "--images", "1", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "maps.json").read_text())
    assert payload["model"].startswith("UNTRAINED")
    assert (tmp_path / "maps.png").stat().st_size > 1000
    assert analyze.main(["spectrum", "--out", str(tmp_path)]) == 2
    assert "checkpoint:" in capsys.readouterr().err


def test_output_gain_matches_the_operator_and_orders_the_variants():
    """The gain is RMS(core output) / RMS(V) of the operator with only ``norm`` changed; with the exact kernel
    (module a2) rowsum is a convex average of V (gain ≤ 1), and the injective map, whose every key column
    has unit spread over the queries, amplifies more than inline."""
    _, recs = _records()
    res = analysis.output_gain(recs)
    assert [r["name"] for r in res] == ["a1", "a2"]
    assert set(res[0]["gain"]) == {"injective", "inline", "rowsum", "none", "injective_nomean"}
    r = recs[0]
    settings = {**r["settings"], "qk_scale": 1.0, "norm": "inline", "norm_scale": "one"}
    out = laplacian_attention(r["q"], r["k"], r["v"], hw=r["hw"], landmarks=r["landmarks"], **settings)
    assert res[0]["gain"]["inline"] == pytest.approx(float(out.square().mean().sqrt() / r["v"].square().mean().sqrt()))
    exact = res[1]["gain"]
    assert exact["rowsum"] <= 1.0 + 1e-12
    assert exact["injective"] > exact["inline"]


def test_cli_gain_on_untrained_model(tmp_path):
    assert analyze.main(["gain", "--untrained", "--images", "2", "--img-size", "28", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "gain.json").read_text())
    assert payload["model"].startswith("UNTRAINED") and "28 px" in payload["model"]
    assert payload["modules"][0]["tokens"] == 196
    assert "gain injective_nomean" in (tmp_path / "gain.md").read_text()
    assert (tmp_path / "gain.png").stat().st_size > 1000
