"""The optimizers' records (``ctrkit/optimizers.py``) against what each optimizer really keeps: the memory estimate,
the configuration's choices and a new id's fresh state all read the records, so a record that lies is caught here."""

import pytest
import torch

from ctrkit.config import TrainConfig
from ctrkit.optimizers import DENSE_OPTIMIZERS, KINDS, TABLE_OPTIMIZERS
from ctrkit.train.memory import table_state_bytes
from ctrkit.train.optim import make_optimizer

ROWS, DIM = 50, 8


def state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(
        v.numel() * v.element_size()
        for s in opt.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dim() >= 1
    )


@pytest.mark.parametrize("name", TABLE_OPTIMIZERS)
def test_a_table_optimizer_keeps_the_state_its_record_says(name):
    table = torch.nn.Parameter(torch.randn(ROWS, DIM))
    opt = make_optimizer(name, [table], 0.1, sparse=True)
    ids = torch.tensor([1, 4, 4, 9])
    torch.nn.functional.embedding(ids, table, sparse=True).sum().backward()
    opt.step()
    assert state_bytes(opt) == table_state_bytes(name, table.numel() * 4, ROWS)
    record = KINDS[name]
    for key, value in opt.state[table].items():  # rows no id touched keep the record's initial value
        if torch.is_tensor(value) and value.dim() >= 1:
            assert torch.all(value[0] == record.initial(key)), key


@pytest.mark.parametrize("name", DENSE_OPTIMIZERS)
def test_a_dense_optimizer_keeps_the_state_its_record_says(name):
    weight = torch.nn.Parameter(torch.randn(ROWS, DIM))
    opt = make_optimizer(name, [weight], 0.1, sparse=False)
    (weight * torch.randn(ROWS, DIM)).sum().backward()
    opt.step()
    assert state_bytes(opt) == KINDS[name].state_copies * weight.numel() * 4


def test_the_configuration_offers_what_the_records_allow():
    fields = TrainConfig.__dataclass_fields__
    assert fields["optimizer"].metadata["choices"] == tuple(k for k in KINDS if KINDS[k].dense)
    assert fields["embedding_optimizer"].metadata["choices"] == tuple(k for k in KINDS if KINDS[k].tables)
    assert fields["wide_optimizer"].metadata["choices"] == fields["embedding_optimizer"].metadata["choices"]
    with pytest.raises(ValueError, match="rowwise_adagrad keeps one accumulator per embedding row"):
        make_optimizer("rowwise_adagrad", [torch.nn.Parameter(torch.randn(3, 2))], 0.1, sparse=False)
