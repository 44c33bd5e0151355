"""Training and evaluation: ``TrainConfig``, ``train(config) -> metrics``, ``evaluate(model, dataset)``.

    from laplacianformer.train import TrainConfig, train
    result = train(TrainConfig(model="laplacianformer_micro", data="fashion-mnist", epochs=2, out="runs/x"))
    result["top1"], result["history"], result["images_per_s"]
    model = laplacianformer.from_pretrained("runs/x")     # the run's best weights (see docs/TRAINING.md)
    predict("runs/x", ["shoe.png", "photos/"], top_k=3)   # top-k classes of image files (train/predict.py)
"""

from .config import TrainConfig, read_train_config
from .engine import Trainer, build_model, train
from .evaluate import evaluate
from .predict import predict

__all__ = ["TrainConfig", "Trainer", "build_model", "evaluate", "predict", "read_train_config", "train"]
