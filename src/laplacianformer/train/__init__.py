"""Training and evaluation: ``TrainConfig``, ``train(config) -> metrics``, ``evaluate(model, dataset)``.

    from laplacianformer.train import TrainConfig, train
    result = train(TrainConfig(model="laplacianformer_micro", data="fashion-mnist", epochs=2, out="runs/x"))
    result["top1"], result["history"], result["images_per_s"]
"""

from .config import TrainConfig
from .engine import Trainer, build_model, train
from .evaluate import evaluate

__all__ = ["TrainConfig", "Trainer", "build_model", "evaluate", "train"]
