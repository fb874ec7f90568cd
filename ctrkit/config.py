"""Typed, frozen configuration of the training run (model configs live beside their models)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class TrainConfig:
    """How to train.

    The learning-rate schedule fields left as None are derived from the run's length (epochs x
    batches per epoch, not ``max_steps``, so a run stopped early and resumed follows the same curve):
    warmup over the first 5% of steps, decay over the last 50%, quadratic, down to 0.

    Attributes:
        epochs: passes over the training mapping.
        max_steps: stop after this many optimizer steps in total (None: run all epochs).
        batch_size: samples per training step. Small batches learn sparse embeddings faster with SGD:
            on 300k synthetic Criteo-like rows, one epoch reached test AUC 0.813 at 128 vs 0.734 at 1024.
        eval_batch_size: samples per forward pass during evaluation.
        lr: peak learning rate of the embeddings and dense layers (SGD).
        warmup_steps, decay_start_step, decay_steps, decay_power, end_lr: the schedule (see LRSchedule).
        seed: seeds weights, batch order and every torch random source.
        evals_per_epoch: evaluations on the test mapping per epoch (0: only at the end).
        print_freq: steps between log lines.
        amp: mixed precision (bf16 autocast on CPU; fp16 with loss scaling or bf16 on CUDA).
        amp_dtype: "bf16" or "fp16"; None picks bf16 on CPU and fp16 on CUDA.
        checkpoint_every: also save a checkpoint every this many steps (None: at evals and the end).
    """

    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 128
    eval_batch_size: int = 16384
    lr: float = 1.0
    warmup_steps: int | None = None
    decay_start_step: int | None = None
    decay_steps: int | None = None
    decay_power: float = 2.0
    end_lr: float = 0.0
    seed: int = 0
    evals_per_epoch: int = 1
    print_freq: int = 50
    amp: bool = False
    amp_dtype: str | None = None
    checkpoint_every: int | None = None

    def validate(self) -> None:
        def positive(name: str, allow_none: bool = False, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
                bound = ">= 0" if allow_zero else ">= 1"
                raise ValueError(f"{name}: expected an integer {bound}, got {v!r}")

        positive("epochs")
        positive("max_steps", allow_none=True)
        positive("batch_size")
        positive("eval_batch_size")
        positive("warmup_steps", allow_none=True, allow_zero=True)
        positive("decay_start_step", allow_none=True, allow_zero=True)
        positive("decay_steps", allow_none=True, allow_zero=True)
        positive("evals_per_epoch", allow_zero=True)
        positive("print_freq")
        positive("checkpoint_every", allow_none=True)
        if not self.lr > 0:
            raise ValueError(f"lr: expected a positive learning rate, got {self.lr}")
        if self.end_lr < 0 or self.end_lr > self.lr:
            raise ValueError(f"end_lr: expected 0 <= end_lr <= lr ({self.lr}), got {self.end_lr}")
        if self.decay_power <= 0:
            raise ValueError(f"decay_power: expected a positive power, got {self.decay_power}")
        if self.amp_dtype not in (None, "bf16", "fp16"):
            raise ValueError(f"amp_dtype: expected 'bf16' or 'fp16', got {self.amp_dtype!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown training option(s) {sorted(unknown)}; known: {sorted(known)}")
        cfg = cls(**values)
        cfg.validate()
        return cfg
