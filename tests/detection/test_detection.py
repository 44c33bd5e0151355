"""Detection: LaplacianFormer-FPN in torchvision RetinaNet and Mask R-CNN on real Fashion-MNIST items.

Each canvas holds real Fashion-MNIST test items pasted at fixed places; the box is the bounding box of
the item's pixels above a threshold and the mask those pixels (labels: class + 1, 0 is background).
"""

import gzip
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchvision")

from laplacianformer.detection import LaplacianFormerFPN, fpn_backbone, mask_rcnn, retinanet  # noqa: E402

ROOT = Path("/usr/share/datasets/fashion-mnist")
THRESHOLD = 40
SIZE = 96


def _fashion_items(n: int):
    images = ROOT / "t10k-images-idx3-ubyte.gz"
    labels = ROOT / "t10k-labels-idx1-ubyte.gz"
    if not images.exists():
        pytest.skip(f"Fashion-MNIST not installed at {ROOT} (apt-get install dataset-fashion-mnist)")
    with gzip.open(images) as f:
        pixels = torch.frombuffer(bytearray(f.read()[16 : 16 + n * 784]), dtype=torch.uint8).view(n, 28, 28)
    with gzip.open(labels) as f:
        classes = torch.frombuffer(bytearray(f.read()[8 : 8 + n]), dtype=torch.uint8).long()
    return pixels, classes


def _scenes():
    pixels, classes = _fashion_items(4)
    places = [[(4, 8), (50, 60)], [(30, 2), (10, 64)]]
    images, targets = [], []
    for s, spots in enumerate(places):
        canvas = torch.zeros(3, SIZE, SIZE)
        boxes, masks, labels = [], [], []
        for j, (top, left) in enumerate(spots):
            item = pixels[2 * s + j]
            canvas[:, top : top + 28, left : left + 28] = torch.maximum(canvas[:, top : top + 28, left : left + 28], item.float() / 255)
            mask = torch.zeros(SIZE, SIZE, dtype=torch.uint8)
            mask[top : top + 28, left : left + 28] = (item > THRESHOLD).to(torch.uint8)
            ys, xs = torch.nonzero(mask, as_tuple=True)
            boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
            masks.append(mask)
            labels.append(int(classes[2 * s + j]) + 1)
        images.append(canvas)
        targets.append(dict(boxes=torch.tensor(boxes, dtype=torch.float32), labels=torch.tensor(labels), masks=torch.stack(masks)))
    return images, targets


def _train_and_infer(detector, with_masks: bool):
    images, targets = _scenes()
    detector.train()
    losses = detector(images, targets)
    total = sum(losses.values())
    assert all(torch.isfinite(v) for v in losses.values()), losses
    total.backward()
    stem = detector.backbone.body.patch_embed.proj.weight.grad
    attn = detector.backbone.body.stages[-1].blocks[0].attn.qkv.weight.grad
    assert stem is not None and attn is not None and stem.abs().sum() > 0 and attn.abs().sum() > 0
    detector.eval()
    with torch.no_grad():
        out = detector(images)
    assert len(out) == 2
    for det in out:
        n = det["boxes"].shape[0]
        assert det["boxes"].shape == (n, 4) and det["scores"].shape == (n,) and det["labels"].shape == (n,)
        if with_masks:
            assert det["masks"].shape == (n, 1, SIZE, SIZE)
    return losses


def test_fpn_backbone_levels_and_strides():
    fpn = fpn_backbone("laplacianformer_micro", out_channels=32)
    assert isinstance(fpn, LaplacianFormerFPN) and fpn.strides == [4, 8, 16, 32]
    feats = fpn(torch.randn(1, 3, 64, 96))
    assert [(k, tuple(v.shape[1:])) for k, v in feats.items()] == [
        ("0", (32, 16, 24)), ("1", (32, 8, 12)), ("2", (32, 4, 6)), ("3", (32, 2, 3)), ("pool", (32, 1, 2))
    ]
    with pytest.raises(ValueError, match="^out_indices"):
        fpn_backbone("laplacianformer_micro", out_indices=(3, 1))


def test_mask_rcnn_train_step_and_inference_on_fashion_mnist_scenes():
    torch.manual_seed(0)
    detector = mask_rcnn(
        "laplacianformer_micro", num_classes=11, out_channels=32, min_size=SIZE, max_size=SIZE,
        rpn_pre_nms_top_n_train=200, rpn_post_nms_top_n_train=100, rpn_pre_nms_top_n_test=100,
        rpn_post_nms_top_n_test=50, box_batch_size_per_image=64,
    )
    losses = _train_and_infer(detector, with_masks=True)
    assert {"loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg"} == set(losses)


def test_retinanet_train_step_and_inference_on_fashion_mnist_scenes():
    torch.manual_seed(0)
    detector = retinanet("laplacianformer_micro", num_classes=11, out_channels=32, min_size=SIZE, max_size=SIZE)
    losses = _train_and_infer(detector, with_masks=False)
    assert {"classification", "bbox_regression"} == set(losses)
