"""Models registered by name and built by one factory, with a typed config per model family."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, fields, is_dataclass
from typing import Any, Protocol

from torch import nn

from ctrkit.field_types import check_fields
from ctrkit.models.storage import IN_MEMORY, TableStorage


class ModelConfig(Protocol):
    """What a model's config dataclass offers the registry: its own check of its values."""

    def validate(self) -> None: ...


_REGISTRY: dict[str, tuple[type, type[ModelConfig]]] = {}
_TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {}
# what every model must choose for itself: a run that leaves them unset takes the model's
REQUIRED_TRAIN_DEFAULTS = ("optimizer", "lr", "embedding_optimizer", "batch_size")


def register_model(
    name: str, config_cls: type[ModelConfig], train_defaults: dict[str, Any] | None = None
) -> Callable[[type], type]:
    """Class decorator: registers ``cls`` under ``name``, built from a ``config_cls`` instance.

    ``train_defaults`` are the model's own training defaults (optimizer, lr, ...), used where the
    run leaves them unset. A duplicate name is an error, never a silent replacement.
    """

    if name in _REGISTRY:
        raise ValueError(f"model '{name}' is already registered (by {_REGISTRY[name][0].__name__})")
    missing = set(REQUIRED_TRAIN_DEFAULTS) - set(train_defaults or {})
    if missing:
        raise ValueError(f"model '{name}': train_defaults must set {sorted(missing)}")

    def wrap(cls: type) -> type:
        _REGISTRY[name] = (cls, config_cls)
        _TRAIN_DEFAULTS[name] = dict(train_defaults or {})
        return cls

    return wrap


def train_defaults(name: str) -> dict[str, Any]:
    """Model ``name``'s training defaults (TrainConfig fields), e.g. its optimizer and lr."""
    _lookup(name)
    return dict(_TRAIN_DEFAULTS[name])


def list_models() -> list[str]:
    """Names of every registered model."""
    return sorted(_REGISTRY)


def _lookup(name: str) -> tuple[type, type[ModelConfig]]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown model '{name}'; available: {', '.join(list_models())}")
    return _REGISTRY[name]


def config_class(name: str) -> type:
    """The config dataclass of model ``name``."""
    return _lookup(name)[1]


def make_config(name: str, values: dict[str, Any]) -> Any:
    """Builds model ``name``'s config from a dict (e.g. one stored in a checkpoint); rejects unknown keys."""
    cfg_cls = config_class(name)
    known = {f.name for f in fields(cfg_cls)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"model '{name}' has no config field(s) {sorted(unknown)}; known: {sorted(known)}")
    check_fields(cfg_cls, values, f"model '{name}' settings")
    cfg = cfg_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    cfg.validate()
    return cfg


def create_model(name: str, config: Any, storage: TableStorage = IN_MEMORY) -> nn.Module:
    """Builds model ``name`` from its config dataclass (or a dict of its fields), its embedding tables kept where
    ``storage`` says (``models.storage``: in memory and drawn at once by default).

    Example:
        >>> model = create_model("dlrm", DLRMConfig(num_numerical=13, cardinalities=(10, 20)))
    """
    cls, cfg_cls = _lookup(name)
    if isinstance(config, dict):
        config = make_config(name, config)
    if not isinstance(config, cfg_cls):
        raise TypeError(f"model '{name}' takes a {cfg_cls.__name__}, got {type(config).__name__}")
    config.validate()
    return cls(config, storage)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A config dataclass as plain lists/ints/floats (for YAML and checkpoints)."""
    if not is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"expected a config dataclass, got {type(config).__name__}")
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}
