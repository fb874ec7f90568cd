"""A model ready to answer requests: (numerical, categorical) arrays in, click probabilities out.

Backends: ``torch`` (the checkpoint's PyTorch model), ``onnx`` (onnxruntime) and ``torchscript``,
the last two from a directory written by ``ctrkit export``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ctrkit.models.signature import NUMERICAL, PROBABILITY, InferenceModel, Signature, finite_numerical

if TYPE_CHECKING:
    from ctrkit.preprocess.values import BadValues

log = logging.getLogger("ctrkit.serve")


class Predictor:
    """Scores batches; ``meta`` describes the model (``Signature.metadata``), ``signature`` its tensors.

    Shapes: numerical (B, N) float32, categorical (B, F) int64, multi_hot (B, Fm, L) int64 with -1
    padding (models with multi-hot features only) -> (B, 1) float32.
    """

    def __init__(self, meta: dict, backend: str, run):
        self.meta = meta
        self.backend = backend
        self._run = run
        self.signature = Signature.from_config(meta)
        self.num_multi_hot = len(self.signature.multi_hot_cardinalities)
        self.stores: list = []  # memory-mapped embedding stores, when serving with --embedding-store mmap
        self.transform = None  # the preprocessing the model carries (raw rows -> inputs), None if it carries none

    def carry(self, transform) -> None:
        """Serves the raw inputs of ``transform`` (``preprocess.carried``: a ``RowTransform`` or an
        ``OutbrainTransform``; None: the id inputs only)."""
        self.transform = transform
        if transform is not None:
            features = transform.input_specs()
            self.signature = self.signature.with_raw_inputs(features)
            self.meta = {**self.meta, "features": features}

    def __call__(
        self, numerical: np.ndarray, categorical: np.ndarray, multi_hot: np.ndarray | None = None
    ) -> np.ndarray:
        if (multi_hot is None) != (self.num_multi_hot == 0):
            raise ValueError(f"the model has {self.num_multi_hot} multi-hot features: pass multi_hot (B, Fm, L) ids "
                             "exactly when it has some")  # fmt: skip
        arrays: list[np.ndarray] = [np.ascontiguousarray(numerical, np.float32),
                                    np.ascontiguousarray(categorical, np.int64)]  # fmt: skip
        if multi_hot is not None:
            arrays.append(np.ascontiguousarray(multi_hot, np.int64))
        # views of a request body: torch wants memory it may write
        return self._run(*(a if a.flags.writeable else a.copy() for a in arrays))

    def warm(self) -> None:
        """Scores one row of each raw input's type through the carried preprocessing and the model (the id inputs,
        without one), so that the first requests find the vocabularies' indexes, the preprocessing's query and the
        runtime's buffers made: a version loaded under traffic answers at its steady speed from its first request."""
        if self.transform is not None:
            kinds = {"FP32": np.zeros(1, np.float32), "INT64": np.zeros(1, np.int64)}
            row = {s["name"]: kinds.get(s["datatype"], np.array([b"0"], dtype=object))
                   for s in self.transform.input_specs()}  # fmt: skip
            self.transform.index_vocabularies()
            self(*self.transform.from_request(row, 1, "missing"))
            return
        self(*(x.numpy() for x in self.signature.example_inputs(1)))

    def score_named(self, inputs: dict[str, np.ndarray], missing_columns: str = "error",
                    bad: BadValues | None = None) -> np.ndarray:  # fmt: skip
        """(B, 1) float32 probabilities of inputs by name: the id inputs (``numerical``, ``categorical``,
        ``multi_hot``), or the raw columns of a model that carries its preprocessing (each (B,) or (B, 1); text as
        str or UTF-8 bytes, numbers; a column left out or an extra one as ``RowTransform.check_columns`` says with
        ``missing_columns``; a bad value refused, or scored as missing and counted in ``bad``)."""
        ids = self.signature.input_names
        if any(name in inputs for name in ids):
            missing = [n for n in ids if n not in inputs]
            if missing:
                raise ValueError(f"missing input(s) {', '.join(missing)}: send every id input or the raw columns")
            others = [n for n in inputs if n not in ids]
            if others:
                raise ValueError(f"input(s) {', '.join(others)} beside the id inputs: send the id inputs or the raw "
                                 "columns, not both")  # fmt: skip
            return self(*(finite_numerical(inputs[n]) if n == NUMERICAL else inputs[n] for n in ids))
        if self.transform is None:
            raise ValueError(f"this model carries no preprocessing: send the id inputs {', '.join(ids)}")
        if not inputs:
            raise ValueError(f"no inputs: send the raw columns {', '.join(self.transform.column_names)}")
        columns = {name: np.asarray(v).reshape(len(v), -1)[:, 0] if np.ndim(v) > 1 else v for name, v in inputs.items()}
        rows = {len(v) for v in columns.values()}
        if len(rows) > 1:
            raise ValueError(f"the inputs disagree on the batch size: {sorted(rows)}")
        return self(*self.transform.from_request(columns, rows.pop(), missing_columns, bad))

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: str | os.PathLike,
        embedding_store: str = "memory",
        cache_rows: int = 1 << 20,
        dtype: str = "fp32",
        compile: bool = False,
    ) -> Predictor:
        """The checkpoint's PyTorch model; ``embedding_store="mmap"`` keeps its tables on disk (memory-mapped,
        ``cache_rows`` hot rows cached), so tables larger than RAM can be served. ``dtype="bf16"`` converts
        the weights to bfloat16 where the CPU computes bf16 natively, else keeps fp32 and says so (see
        ``device.cpu_bf16_or_fp32``; probabilities come back as float32). ``compile`` runs the model
        through ``torch.compile`` with Inductor's weight freezing (constant-folded, prepacked weights;
        inference only), falling back to eager with a warning when compiling fails."""
        from ctrkit.checkpoint import load_checkpoint
        from ctrkit.checkpoint_shards import sharded_table_views
        from ctrkit.device import cpu_bf16_or_fp32
        from ctrkit.eval.evaluator import SCORE_SLICE, score_in_slices, scoring_team
        from ctrkit.serve.embedding_store import use_mmap_store

        if embedding_store not in ("memory", "mmap"):
            raise ValueError(f"`embedding_store` must be memory or mmap, got '{embedding_store}'")
        if dtype not in ("fp32", "bf16") or (dtype == "bf16" and embedding_store == "mmap"):
            raise ValueError(f"`dtype` must be fp32, or bf16 with the memory store; got '{dtype}' ({embedding_store})")
        lazy = embedding_store == "mmap"
        ckpt = load_checkpoint(checkpoint, mmap=lazy, assemble=not lazy)  # mmap: shards read where they lie
        signature = Signature.from_config(ckpt.model_config)
        meta = signature.metadata(ckpt.model_name, ckpt.step)
        model = ckpt.build_model(assign=lazy)
        views = sharded_table_views(ckpt) if lazy and ckpt.shard_files else None
        stores = use_mmap_store(model, cache_rows, views) if lazy else []
        model = model.cpu()
        model = InferenceModel(model, signature, ckpt.calibration).eval()
        half = dtype == "bf16" and cpu_bf16_or_fp32("--dtype bf16")
        if half:
            model = model.to(torch.bfloat16)
        if compile:
            model = _compiled(model)

        @torch.inference_mode()
        def forward(numerical: np.ndarray, *ids: np.ndarray) -> np.ndarray:
            dense = torch.from_numpy(numerical)  # float32 in: the model's normaliser hands its MLPs bf16
            return model(dense, *map(torch.from_numpy, ids)).float().numpy()

        team = None if compile else scoring_team(torch.device("cpu"))

        def run(numerical: np.ndarray, *ids: np.ndarray) -> np.ndarray:
            """A large batch in slices over the CPU's threads (as ``evaluate`` scores), a small one at once."""
            rows = len(numerical)
            if team is None or rows < 2 * SCORE_SLICE:
                return forward(numerical, *ids)
            out = np.empty((rows, 1), np.float32)
            score_in_slices(team, rows, lambda s: forward(numerical[s], *(i[s] for i in ids)), out)
            return out

        predictor = cls(meta, "torch" + ("+mmap" if lazy else "") + ("-bf16" if half else ""), run)
        predictor.stores = stores
        predictor.carry(ckpt.row_transform())
        return predictor

    @classmethod
    def from_export(
        cls, model_dir: str | os.PathLike, version: str | None = None, repository: Path | None = None
    ) -> Predictor:
        """An export's model; in a Triton repository's model directory, ``version``'s (its own
        ``ctrkit_model.json`` when the version directory has one, else the model directory's). With
        ``repository``, every file read must resolve inside it."""
        from ctrkit.integrity import FILES, check_files
        from ctrkit.serve.names import check_name, check_version, find_model_dir, inside

        root = find_model_dir(model_dir)
        where = root / check_version(version) if version is not None else root
        meta_file = (
            where / "ctrkit_model.json" if (where / "ctrkit_model.json").exists() else root / "ctrkit_model.json"
        )
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            name = check_name(meta["file"], "model file")
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{meta_file}: not an export's metadata ({type(e).__name__}: {e})") from None
        candidates = (where / name,) if version is not None else (root / name, root / "1" / name)
        files = [p for p in candidates if p.exists()]
        if not files:
            raise ValueError(f"{where}: model file '{name}' named in {meta_file.name} not found")
        path = inside(repository, files[0]) if repository is not None else files[0]
        if repository is not None:
            inside(repository, meta_file)
            if os.path.lexists(path.parent / FILES):  # the digests too: a link out of the repository is not read
                inside(repository, path.parent / FILES)
        if not check_files(path.parent):  # every exported file against digests.json, before any is used
            log.warning("%s: no %s (exported before ctrkit sealed exports): its files are not checked", path.parent,
                        FILES)  # fmt: skip
        predictor = cls._from_file(meta, path)
        if meta.get("preprocessing"):  # the raw rows' preprocessing, beside the model file
            from ctrkit.preprocess import carried
            from ctrkit.preprocess.transform import RECORD_FILE

            if repository is not None:
                inside(repository, path.parent / RECORD_FILE)
                for file in carried.files(path.parent):
                    inside(repository, path.parent / file)
            transform = carried.read(path.parent)
            multi = meta.get("multi_hot_cardinalities", [])
            transform.check_tables(meta["num_numerical"], meta["cardinalities"], multi, str(path.parent))
            predictor.carry(transform)
        if meta.get("dynamic_ids"):  # raw ids: the exported id -> row maps, applied before the graph
            from ctrkit.models.dynamic import FrozenIds

            maps = path.parent / check_name(meta["dynamic_ids"], "dynamic ids file")
            if repository is not None:
                inside(repository, maps)
            if not maps.is_file():
                raise ValueError(f"{path.parent}: '{maps.name}' named in {meta_file.name} not found")
            with np.load(maps) as arrays:
                frozen = FrozenIds(dict(arrays))
            inner = predictor._run
            predictor._run = lambda numerical, categorical, *rest: inner(numerical, frozen(categorical), *rest)
        return predictor

    @classmethod
    def _from_file(cls, meta: dict, path: Path) -> Predictor:
        """The predictor of an exported model file (ONNX or TorchScript)."""
        if path.suffix == ".onnx":
            import onnxruntime as ort

            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            names = Signature.from_config(meta).input_names

            def run(*arrays: np.ndarray) -> np.ndarray:
                return session.run([PROBABILITY], dict(zip(names, arrays)))[0]

            return cls(meta, "onnx" + ("-int8" if meta.get("quantize") == "int8" else ""), run)
        module = torch.jit.load(str(path))

        @torch.inference_mode()
        def run_ts(*arrays: np.ndarray) -> np.ndarray:
            return module(*map(torch.from_numpy, arrays)).numpy()

        return cls(meta, "torchscript", run_ts)


def _compiled(model: torch.nn.Module):
    """``model`` compiled for inference (Inductor freezing, set only while this model's calls compile and run), or
    itself when compiling is impossible here."""
    import warnings

    import torch._inductor.config as inductor_config

    # weights are constants at inference: fold and prepack them. Inductor reads the flag when a call compiles; it
    # is patched around this model's calls only (as torch.compile's `options` it broke Dynamo's guards around
    # the memory-mapped store's lookups: "Guard failed on the same frame it was created")
    compiled = torch.compile(model, dynamic=True)
    calls = {"eager": False}

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        if not calls["eager"]:
            try:
                with inductor_config.patch(freezing=True):
                    return compiled(*inputs)
            except Exception as e:  # no C++ compiler, an unsupported op: serve eagerly
                warnings.warn(f"torch.compile failed ({type(e).__name__}); serving in eager mode", stacklevel=2)
                calls["eager"] = True
        return model(*inputs)

    return run


def load_predictor(
    checkpoint: Path | None,
    model_dir: Path | None,
    embedding_store: str = "memory",
    cache_rows: int = 1 << 20,
    dtype: str = "fp32",
    compile: bool = False,
) -> Predictor:
    if (checkpoint is None) == (model_dir is None):
        raise ValueError("give exactly one of `checkpoint` and `model_dir`")
    if checkpoint is None:
        assert model_dir is not None  # exactly one of the two
        if embedding_store != "memory" or dtype != "fp32" or compile:
            raise ValueError(
                "`embedding_store` mmap, `dtype` bf16 and `compile` apply to a `checkpoint`, not to exports"
            )
        return Predictor.from_export(model_dir)
    return Predictor.from_checkpoint(checkpoint, embedding_store, cache_rows, dtype, compile)
