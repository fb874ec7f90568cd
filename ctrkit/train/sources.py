"""Where each training and model setting of a run came from, as data: the layer that set it (a ``Layer``), and the
words the plan prints for it. Rules ask the layer (``Source.left_to_defaults``, ``Source.user_set``); they never
read the words, so rewording a label changes no training."""

from __future__ import annotations

import enum
from dataclasses import dataclass


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
