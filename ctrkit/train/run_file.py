"""The run YAML written beside a checkpoint (read back by ``--config``); YAML files read with one-line errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from ctrkit.config import TrainConfig
from ctrkit.field_types import check_fields

RUN_KEYS = ("model", "recipe", "model_config", "train_config", "dataset", "log_path", "plan")  # plan: written, not read


def load_run_file(path: str | os.PathLike | None) -> dict[str, Any]:
    """A run YAML (the format written beside checkpoints), or an empty dict for None."""
    if path is None:
        return {}
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: run config file not found")
    run = read_yaml(path, "run config") or {}
    if not isinstance(run, dict) or set(run) - set(RUN_KEYS):
        raise ValueError(f"{path}: expected a mapping with keys among {sorted(RUN_KEYS)}")
    for key in ("model_config", "train_config"):
        if not isinstance(run.get(key, {}), dict):
            raise ValueError(f"{path}: '{key}' must be a mapping of fields")
    for key in ("model", "recipe", "dataset", "log_path"):
        if key in run and not isinstance(run[key], str):
            raise ValueError(f"{path}: '{key}' holds {run[key]!r}; expected text (a name or a path)")
    check_fields(TrainConfig, run.get("train_config", {}), f"{path}: train_config")
    return run


def read_yaml(path: str | os.PathLike, what: str) -> Any:
    """``path``'s YAML (safe types only); a file that is missing, not a file or not YAML is a one-line
    ValueError naming it and the line of the problem."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: {what} file {'is a directory' if path.is_dir() else 'not found'}")
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{path}: not valid YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text (UTF-8) YAML file") from None


def _yaml_mapping(path: str | os.PathLike) -> dict[str, Any]:
    loaded = read_yaml(path, "model config") or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping of model config fields")
    return loaded
