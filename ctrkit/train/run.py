"""A training run built from one resolved configuration: what ``ctrkit train`` and the Python API call.

Settings resolve once, in ``resolve_run``: explicit values, then the run YAML (``config``, the file
written beside every checkpoint), then the model's defaults. ``Run`` then builds everything the run
needs (device, distributed environment, datasets, model, sharding, resume) and ``Run.fit`` trains.

Example:
    >>> from ctrkit.train.run import train
    >>> result = train("build/demo/data", model="dlrm", epochs=1, save_checkpoint="build/dlrm.pt")
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ctrkit.config import ParallelConfig, TrainConfig
from ctrkit.data.atomic import PathLock
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.field_types import check_fields
from ctrkit.models.registry import config_class, config_to_dict, make_config
from ctrkit.train.members import SeedEnsemble
from ctrkit.train.recipes import DEFAULT_RECIPE
from ctrkit.train.recipes import recipe as get_recipe
from ctrkit.train.run_file import _yaml_mapping, load_run_file
from ctrkit.train.sources import Layer, SettingLayer, Source, sources_of

DEFAULT_MODEL = "dlrm"


@dataclass(frozen=True)
class RunSpec:
    """A resolved run: everything ``Run`` needs, nothing left to default.

    Attributes:
        model: registered model name.
        dataset: dataset directory (holding feature_spec.yaml).
        model_config: the model's config dataclass, shaped to the dataset.
        train: the resolved TrainConfig.
        parallel: sharding of a hybrid-parallel job.
        device: "auto", "cpu", "cuda" or "cuda:N".
        save_checkpoint: checkpoint file to write (None: none).
        load_checkpoint: checkpoint to resume from (None: a new run).
        log_path: JSON-lines log (None: none).
        tensorboard: directory for TensorBoard event files (None: none).
        progress: show a progress bar.
        recipe: the named recipe the settings started from (``train.recipes``).
        sources: the layer each setting that is not a field's default came from (``setting_layers``).
        allow_other_vocabulary: continue from ``load_checkpoint`` on data preprocessed with other vocabularies.
        continue_from: a checkpoint whose model and optimizer states this new run starts from (None: fresh).
    """

    model: str
    dataset: Path
    model_config: Any
    train: TrainConfig
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    device: str = "auto"
    save_checkpoint: Path | None = None
    load_checkpoint: Path | None = None
    log_path: Path | None = None
    progress: bool = True
    tensorboard: Path | None = None
    recipe: str = DEFAULT_RECIPE
    sources: dict[str, Source] = field(default_factory=dict)
    allow_other_vocabulary: bool = False
    continue_from: Path | None = None

    def run_yaml(self) -> dict[str, Any]:
        """The resolved run as written beside the checkpoint (and read back by ``config``)."""
        return {
            "model": self.model,
            "recipe": self.recipe,
            "model_config": config_to_dict(self.model_config),
            "train_config": self.train.to_dict(),
            "dataset": str(self.dataset.resolve()),  # absolute: --config works from any directory
            **({"log_path": str(self.log_path.resolve())} if self.log_path is not None else {}),  # for `report`
        }


def layered(model: str, *layers: dict[str, Any]) -> dict[str, Any]:
    """The model settings of ``layers`` over one another (later ones win), where a layer sets ``embedding_dim`` but
    no ``bottom_mlp`` with the bottom MLP so far (the model's default where none is given) ending in that width: its
    output sits beside the embeddings. The rule every run and the training benchmark build a model's shape by."""
    cfg_cls = config_class(model)
    has_bottom = "bottom_mlp" in cfg_cls.__dataclass_fields__
    values: dict[str, Any] = {}
    for layer in layers:
        values.update(layer)
        if has_bottom and "embedding_dim" in layer and "bottom_mlp" not in layer:
            bottom = values.get("bottom_mlp", cfg_cls.__dataclass_fields__["bottom_mlp"].default)
            values["bottom_mlp"] = tuple(bottom[:-1]) + (layer["embedding_dim"],)
    return values


def resolve_model_config(model: str, spec: FeatureSpec, *layers: dict[str, Any]) -> Any:
    """Model ``model``'s config for ``spec``'s features: the model's defaults, then each of ``layers`` in
    turn (``layered``: a new embedding width ends the bottom MLP in it). A layer's
    ``combiner`` (sum or mean) pools every multi-hot feature so; without one, the layers' or else the
    spec's ``multi_hot_combiners`` apply."""
    cfg_cls = config_class(model)
    values = layered(model, *layers)
    combiner = values.pop("combiner", None)
    sizes = values.pop("embedding_sizes", None)
    if sizes is not None:
        dim = values.get("embedding_dim", cfg_cls.__dataclass_fields__["embedding_dim"].default)
        values["embedding_dims"] = embedding_dims_for(sizes, spec, dim)
    given = values.get("multi_hot_combiners")
    values.update(num_numerical=len(spec.numerical_features), cardinalities=spec.cardinalities)
    dynamic = set(spec.dynamic_features)
    values["dynamic_features"] = tuple(i for i, n in enumerate(spec.onehot_features) if n in dynamic)
    multi = spec.multi_hot_features
    if multi:
        combiners = (combiner,) * len(multi) if combiner else tuple(given or spec.multi_hot_combiners)
        values.update(multi_hot_cardinalities=spec.multi_hot_cardinalities, multi_hot_combiners=combiners)
    else:
        values.pop("multi_hot_combiners", None)
    return make_config(model, values)


def embedding_dims_for(sizes: Any, spec: FeatureSpec, default: int) -> tuple[int, ...]:
    """A width per categorical feature of ``spec`` (one-hot, then multi-hot) from ``sizes``: "auto", a
    JSON file mapping feature names to widths, or such a mapping; features a mapping leaves out get
    ``default``."""
    from ctrkit.train.plan import auto_embedding_width

    names = [*spec.onehot_features, *spec.multi_hot_features]
    cards = [*spec.cardinalities, *spec.multi_hot_cardinalities]
    if sizes == "auto":  # the data's rule, in the plan
        return tuple(auto_embedding_width(c) for c in cards)
    where = "embedding_sizes"
    if isinstance(sizes, (str, os.PathLike)):
        where = str(sizes)
        try:
            sizes = json.loads(Path(sizes).read_text())
        except FileNotFoundError:
            raise ValueError(f"{where}: embedding sizes file not found (expected a JSON file or 'auto')") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg} at line {e.lineno}); expected {{feature: width}}") from None
    if not isinstance(sizes, dict):
        raise ValueError(f"{where}: expected a mapping of feature names to widths, got {type(sizes).__name__}")
    unknown = sorted(set(sizes) - set(names))
    if unknown:
        raise ValueError(f"{where}: no categorical feature(s) {unknown} in the dataset; its features: {names}")
    for name, width in sizes.items():
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ValueError(f"{where}: feature '{name}': expected a positive integer width, got {width!r}")
    return tuple(int(sizes.get(n, default)) for n in names)


def resolve_run(
    dataset: str | os.PathLike | None = None,
    model: str | None = None,
    *,
    recipe: str | None = None,
    config: str | os.PathLike | None = None,
    model_config: dict[str, Any] | None = None,
    model_config_file: str | os.PathLike | None = None,
    train: dict[str, Any] | None = None,
    parallel: ParallelConfig | None = None,
    device: str = "auto",
    save_checkpoint: str | os.PathLike | None = None,
    load_checkpoint: str | os.PathLike | None = None,
    log_path: str | os.PathLike | None = None,
    progress: bool = True,
    tensorboard: str | os.PathLike | None = None,
    allow_other_vocabulary: bool = False,
    continue_from: str | os.PathLike | None = None,
) -> RunSpec:
    """Resolves a run once: explicit arguments, then the run YAML ``config``, then the recipe, then the
    model's defaults.

    Args:
        dataset: dataset directory (else the run YAML's).
        model: registered model name (else the run YAML's, else dlrm).
        recipe: a named recipe (``train.recipes``; else the run YAML's, else the default).
        config: a run YAML, e.g. the one written beside a checkpoint.
        model_config: model config fields (e.g. embedding_dim, bottom_mlp), over ``model_config_file``.
        model_config_file: a YAML file of model config fields, over the run YAML's.
        train: TrainConfig fields, over the run YAML's.
        parallel, device, save_checkpoint, load_checkpoint, log_path, progress, tensorboard,
            allow_other_vocabulary, continue_from: as RunSpec's.
    """
    run = load_run_file(config)
    source = load_checkpoint if load_checkpoint is not None else continue_from
    ckpt = None
    if source is not None:  # the model is the checkpoint's, whatever else says
        from ctrkit.checkpoint import load_checkpoint as read

        ckpt = read(source, mmap=True, assemble=False, verify=False)  # name and config; verified when loaded
    name = model or run.get("model") or (ckpt.model_name if ckpt is not None else DEFAULT_MODEL)
    check_fields(config_class(name), run.get("model_config", {}), f"{config}: model_config")
    file_layer = _yaml_mapping(model_config_file) if model_config_file is not None else {}
    check_fields(config_class(name), file_layer, str(model_config_file))
    chosen = get_recipe(recipe or run.get("recipe"))
    recipe_train, recipe_model = chosen.layers(name)
    layers = setting_layers(name, chosen.name, recipe_train, recipe_model, run, config, train, file_layer, model_config)
    chosen_train = {k: v for layer in layers[1:] for k, v in layer.set_train().items()}  # then the model's defaults
    train_cfg = TrainConfig.from_dict(chosen_train).resolve(name)
    dataset = dataset or run.get("dataset")
    if dataset is None:
        raise ValueError("no dataset: name a dataset directory (or a run config naming one)")
    spec = FeatureSpec.from_yaml(Path(dataset))
    if ckpt is not None:
        grow = load_checkpoint is None  # a new run from the model (not a resume): its tables may grow
        model_cfg = _checkpoint_model_config(source, ckpt, name, spec, {**file_layer, **(model_config or {})}, grow)
    else:
        model_cfg = resolve_model_config(name, spec, *(layer.model for layer in layers[1:]))
    sources = sources_of(layers)
    return RunSpec(
        name,
        Path(dataset),
        model_cfg,
        train_cfg,
        parallel or ParallelConfig(),
        device,
        Path(save_checkpoint) if save_checkpoint is not None else None,
        Path(load_checkpoint) if load_checkpoint is not None else None,
        Path(log_path) if log_path is not None else None,
        progress,
        Path(tensorboard) if tensorboard is not None else None,
        chosen.name,
        sources,
        allow_other_vocabulary,
        Path(continue_from) if continue_from is not None else None,
    )


def _checkpoint_model_config(
    source: Any, ckpt: Any, name: str, spec: FeatureSpec, asked: dict[str, Any], grow: bool = False
) -> Any:
    """The model config of a run from checkpoint ``ckpt`` (read from ``source``): the checkpoint's, of model
    ``name``; model settings ``asked`` for that would change it are refused (``_refuse_other_shape``). ``grow``
    (a new run continuing the model): on a dataset whose vocabularies extend the model's (``preprocess table
    --like``), the tables have the dataset's rows (the trainer copies the model's rows into them)."""
    if ckpt.model_name != name:
        raise ValueError(f"{source}: checkpoint holds a '{ckpt.model_name}' model, not '{name}'")
    _refuse_other_shape(source, name, spec, ckpt.model_config, asked)
    cfg = make_config(name, ckpt.model_config)
    if grow and ckpt.extended_by(spec.summary()):
        cfg = replace(cfg, cardinalities=tuple(spec.cardinalities),
                      multi_hot_cardinalities=tuple(spec.multi_hot_cardinalities))  # fmt: skip
    return cfg


def _refuse_other_shape(source: Any, name: str, spec: FeatureSpec, theirs: dict[str, Any], asked: dict[str, Any]
                        ) -> None:  # fmt: skip
    """A one-line ValueError when ``asked`` (model settings from flags or --model-config) would make any field of the
    checkpoint's model config ``theirs`` other than it is: a resumed or continued run trains the checkpoint's model,
    whose shape is fixed. ``embedding_sizes`` and ``combiner`` are compared as what they resolve to (the widths,
    the combiners), so repeating the command that made the checkpoint passes."""
    if not asked:
        return
    derived = {"embedding_sizes": "embedding_dims", "combiner": "multi_hot_combiners"}
    touched = {derived.get(k, k) for k in asked}
    mine = config_to_dict(resolve_model_config(name, spec, theirs, asked))
    kept = config_to_dict(make_config(name, theirs))
    plain = lambda v: [plain(x) for x in v] if isinstance(v, (list, tuple)) else v  # noqa: E731
    other = sorted(k for k in touched if plain(mine.get(k)) != plain(kept.get(k)))
    if other:
        said = ", ".join(f"{k} {plain(mine.get(k))} (the checkpoint's: {plain(kept.get(k))})" for k in other)
        raise ValueError(
            f"{source}: a run from a checkpoint trains its model as it is; it cannot apply {said}: drop those "
            "settings, or train a new model"
        )


def setting_layers(
    model: str,
    recipe: str,
    recipe_train: dict,
    recipe_model: dict,
    run: dict,
    config: Any,
    train: dict | None,
    file_layer: dict,
    model_config: dict | None,
) -> list[SettingLayer]:
    """The layers a run's settings are resolved through, lowest first (a later one wins): the model's training
    defaults, the recipe, the run YAML, a model config file, the flags. ``resolve_run`` merges them in this order
    and the plan names each setting's source from the same list."""
    from ctrkit.models.registry import train_defaults

    return [
        SettingLayer(Source(Layer.MODEL, f"{model}'s default"), train_defaults(model)),
        SettingLayer(Source(Layer.RECIPE, f"recipe {recipe}"), recipe_train, recipe_model),
        SettingLayer(
            Source(Layer.RUN_FILE, f"--config {config}"),
            run.get("train_config", {}),
            run.get("model_config", {}),
            none_unset=True,
        ),
        SettingLayer(Source(Layer.MODEL_FILE, "--model-config"), {}, file_layer),
        SettingLayer(Source(Layer.FLAG, "flag"), train or {}, model_config or {}),
    ]


class Run:
    """A training run built from a RunSpec: device, distributed environment, datasets, the plan, model,
    sharding and resume, ready to ``fit`` (``dry_run``: only as far as the plan, nothing allocated).

    Attributes:
        spec: the resolved run.
        env: this rank's DistEnv in a torchrun job, else None.
        device: the torch device.
        trainer: the Trainer.
        is_main: this process reports (rank 0, or the only process).
    """

    def __init__(self, spec: RunSpec, dry_run: bool = False):
        from ctrkit.distributed.env import init_distributed, launched_by_torchrun

        self.spec, self.dry_run = spec, dry_run
        self.env = init_distributed(spec.device, spec.parallel.dist_timeout) if launched_by_torchrun() else None
        self.lock = None
        if spec.save_checkpoint is not None and (self.env is None or self.env.is_main) and not dry_run:
            # one live run per checkpoint path; released when fit ends, taken over from a dead holder
            self.lock = PathLock(spec.save_checkpoint, "checkpoint").acquire()
        try:
            self._build(spec)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Lets another run write the checkpoint path."""
        if self.lock is not None:
            self.lock.release()

    def _build(self, spec: RunSpec) -> None:
        import torch

        from ctrkit.checkpoint import load_checkpoint
        from ctrkit.data.dataset import SplitBinaryDataset, one_class_problem
        from ctrkit.device import device_facts, resolve_device

        cfg = spec.train
        self.device = self.env.device if self.env is not None else resolve_device(spec.device)
        feature_spec = FeatureSpec.from_yaml(spec.dataset)
        self.train_set = SplitBinaryDataset(feature_spec, "train")
        test_set = SplitBinaryDataset(feature_spec, "test") if "test" in feature_spec.source_spec else None
        mappings = feature_spec.source_spec
        validation_set = SplitBinaryDataset(feature_spec, "validation") if "validation" in mappings else None
        # the held-out tail, once for every member
        self.train_set, validation_set = held_out(self.train_set, validation_set, cfg.validation_fraction)
        problem = one_class_problem(self.train_set, str(spec.dataset))
        if problem is not None:
            raise ValueError(problem)
        ckpt = None
        if spec.load_checkpoint is not None:  # a rank reads only its own file of a sharded checkpoint
            # memory-mapped and checked: restoring copies it into the model's tables (in memory or on disk) a block
            # of pages at a time, so a checkpoint larger than memory resumes
            ckpt = load_checkpoint(spec.load_checkpoint, mmap=True, assemble=self.env is None)
            ckpt.check_spec(feature_spec.summary(), str(feature_spec.base_dir), spec.allow_other_vocabulary)
            continued_from = (ckpt.plan or {}).get("continued_from")
            if continued_from is not None and spec.continue_from is None:
                raise ValueError(
                    f"{spec.load_checkpoint}: written by a run continued from {continued_from}; resume it with "
                    f"--continue-from {continued_from} as well, or its continued settings (rates, half-life, "
                    "no redraws) would give way to a fresh run's"
                )
        self.continued = None  # the checkpoint a new run continues from (``--continue-from``)
        if spec.continue_from is not None:
            self.continued = load_checkpoint(spec.continue_from, mmap=True, assemble=self.env is None)
            summary = feature_spec.summary()
            self.continued.check_spec(summary, str(feature_spec.base_dir), spec.allow_other_vocabulary, growing=True)
            if self.continued.other_vocabulary(summary):  # allowed (--allow-other-vocabulary), never in silence
                print(f"warning: {feature_spec.base_dir} has other vocabularies than {spec.continue_from}'s data "
                      "(--allow-other-vocabulary): each learned row now stands for whatever value has its id there; "
                      "`preprocess table --like` keeps their meanings", file=sys.stderr)  # fmt: skip
        self.is_main = self.env is None or self.env.is_main
        self.feature_spec, self.test_set, self.validation_set = feature_spec, test_set, validation_set
        self.preprocessing = carried_preprocessing(feature_spec)
        from ctrkit.train.plan import make_plan

        held = 0 if validation_set is None else len(validation_set)
        source = "the validation mapping" if "validation" in mappings else f"the last {cfg.validation_fraction:.0%}"
        processes = self.env.world_size if self.env else 1
        # a seed ensemble (``fit``) resumes with the member its checkpoint was taken in, after those done
        self.member = ckpt.member if ckpt is not None and ckpt.member is not None else 0
        self.members_done = list(ckpt.members or []) if ckpt is not None and ckpt.member is not None else []
        self.member_ensemble = ckpt.member_ensemble if ckpt is not None else None
        self.plan = make_plan(
            spec,
            len(self.train_set),
            held,
            source,
            processes,
            self.device.type,
            self.preprocessing,
            device_facts(self.device),
            tuple(m.get("batch_size") for m in self.members_done),
            self.member,
        )
        # what the run computes in, and the autocast dtype evaluations score in, as the plan decided them
        self.precision, self.precision_note = self.plan.precision.name, self.plan.precision.why
        self.amp_dtype, self.eval_amp_dtype = self.plan.precision.autocast, self.plan.precision.scoring
        if self.env is not None and self.amp_dtype == torch.float16:
            raise ValueError("hybrid-parallel training supports mixed precision with bf16 only")
        self.batches = list(self.plan.batches)
        self.members = len(self.plan.members)  # trained one after another (``fit``)
        if self.dry_run:
            return
        # the warm start's first-order regression, fitted once for every member (``Trainer._warm_start``)
        self.warm_start_cache: dict[str, Any] = {}
        self._build_trainer(spec, ckpt)

    def _build_trainer(self, spec: RunSpec, ckpt) -> None:
        """The model and Trainer of member ``self.member`` with its settings in the plan (``Plan.members``), resumed
        from ``ckpt``."""
        import torch

        from ctrkit.checkpoint_shards import assemble_shards
        from ctrkit.distributed.hybrid import shard_for_job
        from ctrkit.models.registry import create_model
        from ctrkit.train.trainer import Placement, RunInfo, RunOutputs, TrainData, Trainer

        par, feature_spec = spec.parallel, self.feature_spec
        cfg = self.plan.members[self.member]
        torch.manual_seed(cfg.seed)
        storage = self._table_storage(cfg)
        model = create_model(spec.model, spec.model_config, storage)
        if self.env is None:  # the rest of the model (tables made on the device, or tiered, stay where they are)
            model = model.to(self.device)
        whole = ckpt.resume_weights if ckpt is not None and not ckpt.shard_files else None
        self.model = shard_for_job(model, self.env, par, whole, device=self.device)
        if ckpt is not None and ckpt.shard_files and ckpt.sharding != self.model.sharding_key():
            # written with another layout: each rank reads its shards' rows and columns from the rank files
            ckpt = assemble_shards(ckpt, lazy=True)
            self.model.load_full_state_dict(ckpt.resume_weights)
        model = self.model
        record = {**spec.run_yaml(), "plan": self.plan.to_dict()}
        self.trainer = Trainer(
            model,
            RunInfo(spec.model, spec.model_config, feature_spec.summary(), self.preprocessing),
            TrainData(self.train_set, self.test_set, self.validation_set),
            cfg,
            Placement(self.device, self.amp_dtype, self.env, self.eval_amp_dtype),
            RunOutputs(spec.save_checkpoint, spec.log_path, spec.tensorboard, record, spec.progress),
        )
        if self.env is None:  # a seed ensemble's members share the data, so their first-order fits are one
            self.trainer.warm_start_cache = self.warm_start_cache
        if ckpt is not None:
            self.trainer.store.restore(ckpt)
        elif self.continued is not None:
            self.trainer.store.continue_from(self.continued, str(spec.continue_from))

    def _member_trainer(self, member: int) -> Any:
        """The trainer of seed-ensemble member ``member``, its model fresh."""
        self.member = member
        self._build_trainer(self.spec, None)
        return self.trainer

    def _table_storage(self, cfg: TrainConfig) -> Any:
        """Where this run's tables live (``models.storage``): each rank of a job allocates and draws only its own
        shards; tables on disk in files with a row cache in memory; in host memory with a row cache on the device;
        else made where the run trains and drawn when training starts, unless a checkpoint wrote them first (on the
        CPU, after the warm start too: less memory at once)."""
        from ctrkit.models.storage import DEFERRED, FILLED_LATER, in_host, on_device, on_disk
        from ctrkit.train.memory import tables_directory

        if self.env is not None:
            return DEFERRED
        if cfg.embedding_storage == "disk":
            return on_disk(tables_directory(self.spec.save_checkpoint), cfg.embedding_cache_rows)
        if cfg.embedding_storage == "host":
            return in_host(cfg.embedding_cache_rows, self.device)
        if self.device.type == "cpu":
            return FILLED_LATER
        return replace(on_device(self.device), fill_later=True)  # a checkpoint's tables loaded, never drawn first

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def describe(self) -> str:
        """One line on what is about to be trained, how and where."""
        amp = f" with {str(self.amp_dtype).replace('torch.', '')} autocast" if self.amp_dtype else ""
        amp += " with TF32 matmuls" if self.precision == "tf32" else ""
        if self.eval_amp_dtype != self.amp_dtype:
            amp += f", scored in {str(self.eval_amp_dtype or 'fp32').replace('torch.', '')}"
        validation = self.trainer.validation_set
        held = f" (validation: {len(validation):,} samples of {validation.mapping})" if validation is not None else ""
        members, seed = self.spec.train.seed_ensemble, self.spec.train.seed
        seeds = f", {members} models with seeds {seed} to {seed + members - 1} (--seed-ensemble)" if members > 1 else ""
        if len(self.batches) > 1:
            seeds += (
                f", {'each ' if members > 1 else ''}at batch {self.batches[0]} and at {self.batches[1]} (--small-batch)"
            )
        return (
            f"training {self.spec.model} (recipe {self.spec.recipe}, {self.num_parameters:,} parameters) on "
            f"{len(self.trainer.train_set):,} "
            f"samples{held}, at most {self.trainer.total_steps} steps of {self.trainer.cfg.batch_size} on "
            f"{self.device}{amp}{seeds}"
        )

    def fit(self) -> dict[str, Any]:
        """Trains; returns the last evaluation (``auc``, ``logloss``, ...) or ``{"step": ...}`` without one, and
        ``precision``: what the run computed in (``device.precision_of``)."""
        from ctrkit.device import tf32_matmuls

        try:
            with tf32_matmuls(self.precision == "tf32"):
                return {**self._fit(), "precision": self.precision}
        finally:
            self.release()

    def _fit(self) -> dict[str, Any]:
        members = self.members
        if members == 1 and not self.members_done:
            return self.trainer.fit()
        ensemble = SeedEnsemble(
            self.spec,
            self.batches,
            self.device,
            self.eval_amp_dtype,
            self._member_trainer,
            self.trainer,
            self.member,
            self.members_done,
            self.member_ensemble,
            self.test_set,
        )
        return ensemble.fit(members)


def carried_preprocessing(feature_spec: FeatureSpec) -> dict[str, Any] | None:
    """The preprocessing that made the dataset (``preprocess/transform.py``), as the checkpoint carries it; None
    for a dataset without a record of it."""
    from ctrkit.data.feature_spec import PREPROCESSING_FILE

    if not (feature_spec.base_dir / PREPROCESSING_FILE).is_file():  # synthetic data: no Polars imported for nothing
        return None
    from ctrkit.preprocess.carried import from_dataset

    transform = from_dataset(feature_spec.base_dir)
    transform.check_features(feature_spec.summary(), str(feature_spec.base_dir))
    return transform.to_state()


def settled(cfg: TrainConfig, model_name: str, data: Any) -> tuple[TrainConfig, Any]:
    """For a ``Trainer`` built by hand (a Run's plan does this for its own): ``cfg`` with the model's training
    defaults and what the data decide (``plan.resolved_train`` on the batches an epoch), and ``data``
    (``trainer.TrainData``) with the last ``validation_fraction`` of its training rows held out where it names no
    validation mapping."""
    from ctrkit.train.plan import resolved_train
    from ctrkit.train.plan_facts import epoch_steps

    cfg = cfg.resolve(model_name)
    train, validation = held_out(data.train, data.validation, cfg.validation_fraction)
    data = replace(data, train=train, validation=validation)
    return resolved_train(cfg, epoch_steps(len(train), cfg.batch_size))[0], data


def held_out(train: Any, validation: Any, fraction: float) -> tuple[Any, Any]:
    """(train, validation): where there is no validation mapping, the last ``fraction`` of the training rows held out
    as one (``split_tail``; none at 0, or from fewer than 2 rows)."""
    from ctrkit.data.dataset import split_tail

    if validation is None and fraction > 0 and len(train) >= 2:
        return split_tail(train, fraction)
    return train, validation


def train(dataset: str | os.PathLike, model: str = DEFAULT_MODEL, **options: Any) -> dict[str, Any]:
    """Trains ``model`` on ``dataset`` in a few lines from Python; returns the final metrics.

    ``options`` are TrainConfig fields (``epochs``, ``lr``, ...), model config fields (``embedding_dim``,
    ``bottom_mlp``, ...; also ``embedding_sizes`` and ``combiner`` as ``ctrkit train`` takes them), ``recipe`` and
    ``resolve_run``'s keywords (``save_checkpoint``, ``device``, ``progress``, ...).
    """
    train_fields = {f.name for f in fields(TrainConfig)}
    model_fields = set(config_class(model).__dataclass_fields__) | {"embedding_sizes", "combiner"}
    # resolve_run's own keywords, from its signature (the settings' mappings are built here)
    run_keys = set(inspect.signature(resolve_run).parameters) - {"dataset", "model", "train", "model_config"}
    unknown = set(options) - train_fields - model_fields - run_keys
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)}: expected training, model or run settings")
    spec = resolve_run(
        dataset,
        model,
        train={k: v for k, v in options.items() if k in train_fields},
        model_config={k: v for k, v in options.items() if k in model_fields and k not in train_fields},
        **{k: v for k, v in options.items() if k in run_keys},
    )
    return Run(spec).fit()
