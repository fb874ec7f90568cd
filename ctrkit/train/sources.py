"""Where each training and model setting of a run came from, as data: the layer that set it (a ``Layer``), and the
words the plan prints for it. Rules ask the layer (``Source.left_to_defaults``, ``Source.user_set``); they never
read the words, so rewording a label changes no training."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Layer(enum.Enum):
    """The layers a setting is resolved through, in order (a later one wins)."""

    DEFAULT = "default"  # the config field's own default
    MODEL = "model"  # the model's training defaults (``models.registry.train_defaults``)
    RECIPE = "recipe"  # the named recipe (``train.recipes``)
    RUN_FILE = "run file"  # a run YAML given with --config
    MODEL_FILE = "model file"  # a YAML of model settings given with --model-config
    FLAG = "flag"  # a command-line flag, or a keyword of the Python API


@dataclass(frozen=True)
class Source:
    """A setting's source: its ``layer`` and ``label``, the words the plan prints (``dlrm's default``, ``recipe
    tuned``, ``--config run.yaml``, ``flag``)."""

    layer: Layer
    label: str

    @property
    def left_to_defaults(self) -> bool:
        """Set by neither the user nor the recipe: the field's or the model's default."""
        return self.layer in (Layer.DEFAULT, Layer.MODEL)

    @property
    def user_set(self) -> bool:
        """Set by the user: a flag, the run YAML or a model config file."""
        return self.layer in (Layer.RUN_FILE, Layer.MODEL_FILE, Layer.FLAG)

    def __str__(self) -> str:
        return self.label


DEFAULT = Source(Layer.DEFAULT, "default")


def source(sources: dict[str, Source], name: str) -> Source:
    """Setting ``name``'s source in ``sources`` (``DEFAULT`` where no layer set it)."""
    return sources.get(name, DEFAULT)


@dataclass(frozen=True)
class SettingLayer:
    """One layer of a run's settings: its source, the training (``TrainConfig``) and model config fields it sets,
    and whether a ``None`` among its training fields leaves the field to the layers below (a run YAML's unset
    fields) rather than claiming it."""

    source: Source
    train: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    none_unset: bool = False

    def set_train(self) -> dict[str, Any]:
        """The training fields this layer sets (with ``none_unset``, not those it leaves ``None``)."""
        return {k: v for k, v in self.train.items() if not (self.none_unset and v is None)}

    def claims(self) -> list[str]:
        """The fields this layer sets, training then model ones."""
        return [*self.set_train(), *self.model]


def sources_of(layers: list[SettingLayer]) -> dict[str, Source]:
    """Each field's source: the last of ``layers`` (lowest first) that sets it."""
    out: dict[str, Source] = {}
    for layer in layers:
        out.update({k: layer.source for k in layer.claims()})
    return out
