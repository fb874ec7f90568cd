import numpy as np
import pytest
import torch

from ctrkit.config import TrainConfig
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.synthetic_outbrain import generate_outbrain
from ctrkit.metrics import mean_average_precision
from ctrkit.models import create_model
from ctrkit.models.registry import make_config
from ctrkit.train.trainer import Placement, RunInfo, RunOutputs, TrainData
from tests.conftest import run_cli, trainer_of


@pytest.fixture(scope="module")
def outbrain(tmp_path_factory):
    out = tmp_path_factory.mktemp("ob") / "data"
    generate_outbrain(out, 35_000, test_fraction=0.3, seed=1, progress=False)
    return out


def test_displays_have_two_to_twelve_ads_and_exactly_one_click(outbrain):
    test = SplitBinaryDataset(outbrain, "test")
    groups, labels = test.groups(), test.labels()
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    sizes = np.diff(np.r_[starts, len(groups)])
    assert len(np.unique(groups)) == len(starts)  # each display's rows are contiguous
    assert sizes.min() >= 2 and sizes.max() <= 12 and set(np.unique(sizes)) == set(range(2, 13))
    np.testing.assert_array_equal(np.add.reduceat(labels, starts), 1)
    assert SplitBinaryDataset(outbrain, "train").groups() is None  # the map channel is in test only
    spec = test.spec
    assert spec.multi_hot_features == ("document_topics", "ad_topics") and spec.group_feature == "display_id"


def test_a_model_ranks_displays_better_than_chance(outbrain):
    train, test = SplitBinaryDataset(outbrain, "train"), SplitBinaryDataset(outbrain, "test")
    spec = train.spec
    config = make_config(
        "dlrm",
        {
            "num_numerical": 2,
            "cardinalities": spec.cardinalities,
            "embedding_dim": 8,
            "bottom_mlp": (16, 8),
            "top_mlp": (32, 1),
            "multi_hot_cardinalities": spec.multi_hot_cardinalities,
            "multi_hot_combiners": spec.multi_hot_combiners,
        },
    )
    torch.manual_seed(0)
    model = create_model("dlrm", config)
    result = trainer_of(
        model,
        RunInfo("dlrm", config, spec.summary()),
        TrainData(train, test),
        TrainConfig(epochs=10, evals_per_epoch=2),  # the defaults: the best of up to 10 epochs
        Placement(torch.device("cpu")),
        RunOutputs(progress=False),
    ).fit()
    chance, groups = mean_average_precision(test.groups(), test.labels(), np.random.default_rng(0).random(len(test)))
    assert result["map_groups"] == groups > 1000
    assert result["map@12"] > chance + 0.05, (result["map@12"], chance)


def test_synth_outbrain_command(tmp_path, capsys):
    code = run_cli("synth", "outbrain", "--out", tmp_path / "ob", "--rows", "700", capsys=capsys)
    assert code[0] == 0 and "test displays; 7 one-hot + 2 multi-hot categorical" in code[1]
    code, _, err = run_cli("synth", "outbrain", "--out", tmp_path / "x", "--tables", "3,4", capsys=capsys)
    assert code == 2 and "apply to the criteo-like dataset only" in err
