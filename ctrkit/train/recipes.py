"""Named recipes: the settings a run starts from, each defined once, here, as data.

A recipe is a layer of training (``TrainConfig``) and model config fields over each model's own defaults;
a run YAML and the command line's flags go over it (``train.run.resolve_run``). Three recipes:

- ``tuned`` (the default): ctrkit's accuracy machinery as each model's defaults and the plan's rules set it
  (docs/training.md), one model, no planned decay, no numerical buckets.
- ``plain``: the published model with what every serious run needs (validation data, best weights kept,
  plateau decay, early stopping) and nothing added: no first-order term, no logistic-regression warm start,
  no numerical buckets, no ensembles, no calibration, no table redraws.
- ``nvidia``: the configuration of NVIDIA's DeepLearningExamples per model, nothing added (plain's switches,
  no early stopping or plateau decay): DLRM and DCNv2 as their TensorFlow 2 scripts' defaults for Criteo 1TB,
  Wide & Deep as its Outbrain recipe. Where ctrkit cannot express the published setting, the recipe keeps
  ctrkit's and docs/recipes.md names the departure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_RECIPE = "tuned"


@dataclass(frozen=True)
class Recipe:
    """A named layer of settings.

    Attributes:
        name: the recipe's name (``--recipe``).
        summary: one line on what it is for.
        train: TrainConfig fields for every model.
        model: model config fields for every model.
        per_model: model name -> (TrainConfig fields, model config fields) over the two above.
    """

    name: str
    summary: str
    train: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    per_model: dict[str, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)

    def layers(self, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(TrainConfig fields, model config fields) this recipe sets for ``model``."""
        train, config = self.per_model.get(model, ({}, {}))
        return {**self.train, **train}, {**self.model, **config}


# what `plain` turns off; `nvidia` too
_NOTHING_ADDED = {
    "linear_warm_start": False,
    "reinit_embeddings": "off",
    "snapshot_ensemble": 1,
    "seed_ensemble": 1,
    "small_batch": 0,
    "calibrate": "off",
}
_NO_FIRST_ORDER = {"linear": False}  # DLRM's and DCNv2's; Wide & Deep's wide part is the model itself
_CRITEO_1TB_SHAPE = {"embedding_dim": 128, "bottom_mlp": (512, 256, 128), "top_mlp": (1024, 1024, 512, 256, 1)}
_ONE_PASS = {"batch_size": 65536, "epochs": 1, "evals_per_epoch": 1, "early_stopping_patience": 0,
             "plateau_patience": 0}  # fmt: skip

RECIPES: dict[str, Recipe] = {
    "tuned": Recipe(
        "tuned",
        "ctrkit's defaults: the accuracy machinery that earned its place in the ablation, one model",
        # no planned decay: it earned at most 0.0002 AUC and tied the result to the maximum of epochs
        # (docs/decisions/ablation.md); plateau decay lowers the rates instead
        train={"snapshot_ensemble": 1, "seed_ensemble": 1, "decay_steps": 0},
        # no numerical buckets: they lost beyond the seed spread on 6 of 28 independent tables
        model={"numerical_buckets": 0},
    ),
    "plain": Recipe(
        "plain",
        "the published model with validation, best weights and early stopping, nothing added",
        train=_NOTHING_ADDED,
        model={"numerical_buckets": 0},
        per_model={"dlrm": ({}, _NO_FIRST_ORDER), "dcnv2": ({}, _NO_FIRST_ORDER)},
    ),
    "nvidia": Recipe(
        "nvidia",
        "the configuration NVIDIA's DeepLearningExamples publish for each model, nothing added",
        train=_NOTHING_ADDED,
        model={"numerical_buckets": 0},
        per_model={
            # TensorFlow 2 DLRM, Criteo 1TB: SGD at 24 for every part, warmup and polynomial decay
            "dlrm": (
                {
                    **_ONE_PASS,
                    "optimizer": "sgd",
                    "embedding_optimizer": "sgd",
                    "lr": 24.0,
                    "embedding_lr": 24.0,
                    "warmup_steps": 8000,
                    "decay_start_step": 48000,
                    "decay_steps": 24000,
                },  # fmt: skip
                {**_NO_FIRST_ORDER, **_CRITEO_1TB_SHAPE},
            ),
            # TensorFlow 2 DCNv2, Criteo 1TB: Adam (lazy on the tables) at 1e-4, 3 cross layers of rank 512
            "dcnv2": (
                {
                    **_ONE_PASS,
                    "optimizer": "adam",
                    "embedding_optimizer": "adam",
                    "lr": 1e-4,
                    "embedding_lr": 1e-4,
                    "warmup_steps": 100,
                    "decay_start_step": 48000,
                    "decay_steps": 24000,
                },  # fmt: skip
                {
                    **_NO_FIRST_ORDER,
                    **_CRITEO_1TB_SHAPE,
                    "cross_layers": 3,
                    "cross_projection_dim": 512,
                    "structure": "stacked",
                },  # fmt: skip
            ),
            # Wide & Deep, Outbrain: FTRL at 0.02 on the wide part (no schedule), RMSprop at 1.2e-4 on the deep
            # part with the step schedule, five 1024-wide layers with dropout 0.1, summed multi-hot bags
            "wide_deep": (
                {
                    "batch_size": 131072,
                    "epochs": 20,
                    "evals_per_epoch": 1,
                    "early_stopping_patience": 0,
                    "plateau_patience": 0,
                    "wide_optimizer": "ftrl",
                    "wide_lr": 0.02,
                    "schedule_wide": False,
                    "optimizer": "rmsprop",
                    "lr": 1.2e-4,
                    "lr_schedule": "step",
                },  # fmt: skip
                {"deep_mlp": (1024, 1024, 1024, 1024, 1024), "dropout": 0.1, "combiner": "sum"},
            ),
        },
    ),
}


def recipe(name: str | None) -> Recipe:
    """The recipe called ``name`` (None: the default); an unknown name is a ValueError listing the known."""
    name = DEFAULT_RECIPE if name is None else name
    if not isinstance(name, str) or name not in RECIPES:
        raise ValueError(f"unknown recipe '{name}'; known: {', '.join(RECIPES)}")
    return RECIPES[name]
