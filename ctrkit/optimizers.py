"""The optimizers a run can name, as records: what each trains (dense parameters, embedding tables), the state it
keeps (per weight value and per table row) and how that state starts. The configuration's choices, the sparse
row optimizer's state, the memory estimate and the plan's memory rule all read these records; adding a table
optimizer is one record here plus its row update in ``train/optim.py``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OptimizerKind:
    """An optimizer a run can name.

    Attributes:
        name: what ``optimizer``, ``embedding_optimizer`` and ``wide_optimizer`` call it.
        dense: it trains dense parameters.
        tables: it trains embedding tables, with sparse row updates.
        value_state: its state per weight value: (name, initial value) of each tensor shaped like the weights.
        row_state: its state per table row (sparse row updates): (name, initial value) of each tensor of one value
            a row.
        dense_state_values: values of state per dense weight value where that differs from ``value_state``'s
            count (a dense optimizer of torch's own); None: as ``value_state``.
    """

    name: str
    dense: bool
    tables: bool
    value_state: tuple[tuple[str, float], ...] = ()
    row_state: tuple[tuple[str, float], ...] = ()
    dense_state_values: int | None = None

    @property
    def state_per_value(self) -> int:
        """Bytes of state per (fp32) weight value."""
        return 4 * (len(self.value_state) if self.dense_state_values is None else self.dense_state_values)

    @property
    def state_per_row(self) -> int:
        """Bytes of state per table row (fp32)."""
        return 4 * len(self.row_state)

    @property
    def state_copies(self) -> int:
        """State in copies of the weights it trains."""
        return self.state_per_value // 4

    def initial(self, state: str) -> float:
        """The value state tensor ``state`` starts at (a row given to a new id starts there again)."""
        return dict(self.value_state + self.row_state).get(state, 0.0)

    @property
    def light(self) -> bool:
        """Keeps no state the size of the weights (what a run short of memory may switch its tables to)."""
        return not self.value_state and self.dense_state_values in (None, 0)


FTRL_INITIAL_ACCUMULATOR = 0.1  # as TensorFlow's Ftrl, which NVIDIA's Wide & Deep trains its wide part with

KINDS: dict[str, OptimizerKind] = {
    k.name: k
    for k in (
        OptimizerKind("sgd", dense=True, tables=True),
        OptimizerKind("adagrad", dense=True, tables=True, value_state=(("sum", 0.0),)),
        # one accumulator a row (the mean of the squared gradient over the row): a D-fold saving, as FBGEMM,
        # TorchRec and MLPerf's DLRM reference keep it
        OptimizerKind("rowwise_adagrad", dense=False, tables=True, row_state=(("sum", 0.0),)),
        OptimizerKind("adam", dense=True, tables=True, value_state=(("exp_avg", 0.0), ("exp_avg_sq", 0.0))),
        OptimizerKind(
            "ftrl",
            dense=False,
            tables=True,
            value_state=(("accumulator", FTRL_INITIAL_ACCUMULATOR), ("linear", 0.0)),
        ),
        OptimizerKind("rmsprop", dense=True, tables=False, dense_state_values=1),  # torch's RMSprop: square_avg
    )
}
OPTIMIZERS = tuple(KINDS)
DENSE_OPTIMIZERS = tuple(k.name for k in KINDS.values() if k.dense)
TABLE_OPTIMIZERS = tuple(k.name for k in KINDS.values() if k.tables)
LIGHT_TABLE_OPTIMIZER = "rowwise_adagrad"  # what the memory rule switches the tables to (docs/decisions/memory-plan.md)


def kind(name: str) -> OptimizerKind:
    """The record of optimizer ``name``; an unknown name is a ValueError listing the known."""
    if name not in KINDS:
        raise ValueError(f"unknown optimizer '{name}'; expected one of {', '.join(OPTIMIZERS)}")
    return KINDS[name]
