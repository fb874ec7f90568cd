"""What a training plan is made from besides the settings (``Facts``): the data's size, the job, the device, the
model's sizes built on the meta device, the memory and disk room measured now; and what it reads of the settings
(``RunSettings``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ctrkit.config import TrainConfig
from ctrkit.device import DeviceFacts
from ctrkit.models.contract import table_parameter_ids, table_parameters
from ctrkit.train.memory import Room, process_rss, room, tables_directory


class RunSettings(Protocol):
    """What a plan reads of a run's resolved settings (``run.RunSpec``): the model and its config, the training
    settings and the layer each came from, the recipe, where the checkpoint goes and the checkpoint a continued run
    starts from."""

    model: str
    model_config: Any
    train: TrainConfig
    sources: dict
    recipe: str
    save_checkpoint: Path | None
    continue_from: Path | None


@dataclass(frozen=True)
class ModelSizes:
    """A model's bytes by part and its deep tables' rows (``sizes_of``).

    Attributes:
        tables: the deep tables' bytes; ``table_rows``: their rows (the first-order tables not counted).
        first_order: the first-order (wide) term's bytes.
        dense: every other parameter's bytes.
        buffers: the buffers' bytes.
    """

    tables: int
    first_order: int
    dense: int
    buffers: int
    table_rows: int


def sizes_of(model: Any) -> ModelSizes:
    """``model``'s sizes (built on the meta device: nothing allocated)."""
    tables = table_parameter_ids(model)
    wide = {id(p) for p in model.wide_parameters()}
    deep = side = dense = 0
    for p in model.parameters():
        n = p.numel() * p.element_size()
        if id(p) in wide:
            side += n
        elif id(p) in tables:
            deep += n
        else:
            dense += n
    rows = sum(p.shape[0] for p in table_parameters(model) if id(p) not in wide)
    return ModelSizes(deep, side, dense, sum(b.numel() * b.element_size() for b in model.buffers()), rows)


@dataclass(frozen=True)
class Facts:
    """What a plan is made from besides the settings: the data, the job and the model's sizes.

    Attributes:
        train_rows, validation_rows: the data's rows; ``validation_source`` says where the validation rows come from.
        processes: the job's processes; ``distributed``: more than one (a one-rank torchrun job plans as one process,
            as it trains the same weights).
        device: ``cpu`` or ``cuda``.
        steps: batches an epoch at the run's batch size.
        sizes: the bytes and table rows of the model built on the meta device.
        linear: the model has a first-order term; ``buckets``: its numerical buckets.
        dynamic: the features of raw ids (dynamic tables); ``multi_hot``: the dataset has multi-hot features.
        continued: the checkpoint a continued run starts from, as given (None: a fresh run).
        sparse: the tables get sparse gradients (a dense gradient updates every row each step).
        room: what the process may still allocate where it trains (``memory.room``, measured).
        process_bytes: what the process holds now (``memory.process_rss``, measured).
        disk_free: bytes free on the disk the tables would go to on disk (``memory.tables_directory``), or None.
        host_room: on a GPU, what the process may still allocate in the CPU's memory (where tables in host memory
            go); None on the CPU (``room`` is the CPU's).
        threads: the CPU threads the tables are drawn on (``torch.get_num_threads``).
        preprocessing: the preprocessing the dataset carries (``RowTransform.to_state``), or None.
        hardware: what the precision rules read of the device (``device.device_facts``): its kind, native bf16,
            TF32 tensor cores.
        trained_batches: the batch size of each seed-ensemble member a resumed checkpoint trained already (None
            where its checkpoint did not record one); () for a fresh run. ``resumed_member``: the member whose
            training the checkpoint was taken in (0 for a fresh run, or a run of one model).
    """

    train_rows: int
    validation_rows: int
    validation_source: str
    processes: int
    distributed: bool
    device: str
    steps: int
    sizes: ModelSizes
    linear: bool
    buckets: bool
    dynamic: tuple[int, ...]
    multi_hot: bool
    continued: Any
    sparse: bool
    room: Room
    process_bytes: int
    disk_free: int | None
    preprocessing: dict[str, Any] | None = None
    hardware: DeviceFacts = DeviceFacts("cpu")
    host_room: Room | None = None
    threads: int = 1
    trained_batches: tuple[int | None, ...] = ()
    resumed_member: int = 0

    @property
    def validation(self) -> bool:
        return self.validation_rows > 0

    @property
    def host(self) -> Room:
        """What the process may still allocate in the CPU's memory."""
        return self.host_room if self.host_room is not None else self.room


def epoch_steps(train_rows: int, batch_size: int) -> int:
    """Batches an epoch of ``train_rows`` rows at ``batch_size`` (the last one partial)."""
    return -(-train_rows // batch_size)


def _batch_size(spec: RunSettings) -> int:
    """The run's batch size: resolved (``run.resolve_run``) before any fact is taken."""
    if spec.train.batch_size is None:
        raise ValueError("the run's batch size is unresolved: settings come from run.resolve_run")
    return spec.train.batch_size


def facts_of(
    spec: RunSettings,
    train_rows: int,
    validation_rows: int,
    validation_source: str,
    processes: int,
    device: str,
    preprocessing: dict[str, Any] | None = None,
    hardware: DeviceFacts | None = None,
    trained_batches: tuple[int | None, ...] = (),
    resumed_member: int = 0,
) -> Facts:
    """The facts of RunSpec ``spec``'s run: its model built on the meta device (nothing allocated), the memory and
    disk room measured now, the device's ``hardware`` (None: a ``device`` without native bf16 or TF32)."""
    import torch

    from ctrkit.data.atomic import free_bytes
    from ctrkit.models.registry import create_model

    with torch.device("meta"):
        model = create_model(spec.model, spec.model_config)
    return Facts(
        train_rows=train_rows,
        validation_rows=validation_rows,
        validation_source=validation_source,
        processes=processes,
        distributed=processes > 1,
        device=device,
        steps=epoch_steps(train_rows, _batch_size(spec)),
        sizes=sizes_of(model),
        linear=model.wide_embeddings is not None,
        buckets=model.wide_buckets is not None,
        dynamic=tuple(spec.model_config.dynamic_features),
        multi_hot=bool(spec.model_config.multi_hot_cardinalities),
        continued=spec.continue_from,
        sparse=spec.model_config.sparse_gradients,
        room=room(device),
        process_bytes=process_rss(),
        disk_free=free_bytes(tables_directory(spec.save_checkpoint)),
        preprocessing=preprocessing,
        hardware=hardware if hardware is not None else DeviceFacts(device),
        host_room=room("cpu") if device != "cpu" else None,
        threads=torch.get_num_threads(),
        trained_batches=tuple(trained_batches),
        resumed_member=resumed_member,
    )
