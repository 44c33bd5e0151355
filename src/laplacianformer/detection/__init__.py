"""Detection and instance segmentation with LaplacianFormer backbones (docs/DETECTION.md, docs/DESIGN.md §5).

    from laplacianformer.detection import retinanet, mask_rcnn, fpn_backbone, LaplacianFormerFPN

``builders``: torchvision RetinaNet / Mask R-CNN on an FPN over the backbone's stages. The training,
evaluation and prediction commands (``laplacianformer detect ...``) live in ``detection.cli``.
"""

from .builders import LaplacianFormerFPN, fpn_backbone, mask_rcnn, retinanet

__all__ = ["LaplacianFormerFPN", "fpn_backbone", "retinanet", "mask_rcnn"]
