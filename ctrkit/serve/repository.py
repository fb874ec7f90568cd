"""A Triton-layout model repository: its models' configs read, and their versions loaded one by one (names and paths
checked by ``names``)."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from ctrkit.serve.names import check_name, inside, version_dirs

log = logging.getLogger("ctrkit.serve")
PLATFORMS = ("onnxruntime_onnx", "pytorch_libtorch", "python")


def read_config(path: Path, model: str) -> str:
    """The platform a model's ``config.pbtxt`` names, after checking it names this model and a platform
    ctrkit serves (a ValueError naming the file otherwise)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file; expected a Triton model configuration") from None
    fields = dict(re.findall(r'^\s*(name|platform|backend)\s*:\s*"([^"]*)"', text, flags=re.MULTILINE))
    if fields.get("backend") == "python" and "platform" not in fields:  # ctrkit's Python-backend model
        fields["platform"] = "python"
    if fields.get("name") != model:
        found = fields.get("name")
        raise ValueError(f'{path}: expected `name: "{model}"` (the model directory\'s name), found {found!r}')
    if fields.get("platform") not in PLATFORMS:
        raise ValueError(
            f"{path}: expected `platform:` one of {', '.join(PLATFORMS)}, found {fields.get('platform')!r}"
        )
    return fields["platform"]


class ModelRepository:
    """A Triton-layout model repository as ``ctrkit export --format triton`` writes it: ``DIR/NAME/``
    holding ``config.pbtxt`` and ``ctrkit_model.json``, and numbered version directories (``1/``,
    ``2/``, ...) each holding the model file (and optionally its own ``ctrkit_model.json``).

    A version that fails to load (an empty or corrupt directory) is left out with its reason in
    ``failed``; the model's other versions serve. A model none of whose versions loads is refused.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if not self.root.is_dir():
            raise ValueError(f"{self.root}: model repository not found")
        self.failed: dict[str, str] = {}  # model or "model/version" -> why it is not served
        if not self.names():
            raise ValueError(f"{self.root}: no model directories (NAME/config.pbtxt) in this repository")

    def names(self) -> list[str]:
        return sorted(p.parent.name for p in self.root.glob("*/config.pbtxt"))

    def folder(self, model: str) -> Path:
        """The model's directory, checked to be a directory of this repository."""
        check_name(model)
        return inside(self.root, self.root / model)

    def versions(self, model: str) -> list[str]:
        folder = self.folder(model)
        return [p.name for p in version_dirs(folder).values()]

    def stamps(self, model: str) -> dict[str, int]:
        """Each version directory of ``model`` with its inode: a version placed anew under the same number (a
        rename of a new directory) has another."""
        folder = self.folder(model)
        return {v: (folder / v).stat().st_ino for v in self.versions(model)}

    def load(self, model: str, only: list[str] | None = None) -> dict:
        """Every version of ``model`` that loads (``only``: those of these versions), as Predictors (a ValueError
        naming what is wrong when none does); the versions that fail are recorded in ``failed`` under
        ``model/version``."""
        from ctrkit.serve.predictor import Predictor

        folder = self.folder(model)
        if not (folder / "config.pbtxt").is_file():
            raise ValueError(f"{folder}: no such model in the repository (expected {folder / 'config.pbtxt'})")
        read_config(inside(self.root, folder / "config.pbtxt"), model)
        versions = self.versions(model)
        if not versions:
            raise ValueError(f"{folder}: no numbered version directories")
        if only is not None:
            versions = [v for v in versions if v in only]
        for key in [k for k in self.failed if k.startswith(f"{model}/") and k.split("/", 1)[1] in versions]:
            del self.failed[key]
        loaded, errors = {}, {}
        for v in versions:
            try:
                loaded[v] = Predictor.from_export(folder, v, repository=self.root)
            except Exception as problem:  # a corrupt or missing file: this version is left out, its reason kept
                said = str(problem).strip()
                errors[v] = said.splitlines()[0] if said else type(problem).__name__
        if not loaded and versions:
            raise ValueError(f"{folder}: no version loads ({'; '.join(f'{v}: {e}' for v, e in errors.items())})")
        for v, e in errors.items():
            log.error("model '%s' version %s not loaded: %s", model, v, e)
            self.failed[f"{model}/{v}"] = e
        return loaded
