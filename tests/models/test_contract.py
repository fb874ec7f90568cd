"""The model contract (``models.contract.CTRModel``), checked over every registered model: a model added to the
registry is checked by this suite with no test edited (the last test registers a toy one and runs the suite)."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.loader import BatchLoader
from ctrkit.eval.evaluator import Scoring
from ctrkit.models.contract import (
    CTRModel,
    RedrawnTables,
    TableCollection,
    contract_problems,
    redraw_tables,
    table_modules,
    table_parameter_ids,
    table_parameters,
)
from ctrkit.models.registry import config_to_dict, create_model, list_models, make_config
from ctrkit.train.optim import build_optimizers
from ctrkit.train.run import resolve_run, train
from ctrkit.train.warm_start import fit_warm_start

MODELS = list_models()  # at collection: with any model a plugin registered (``-p tests.models.toy_model``)


def build(name: str, dataset) -> torch.nn.Module:
    """Model ``name`` for the tiny data set, its config resolved as a run resolves it."""
    torch.manual_seed(0)
    spec = resolve_run(dataset, name, model_config={"embedding_dim": 8}, progress=False)
    return create_model(name, spec.model_config)


def a_batch(dataset, rows: int = 64):
    return next(iter(BatchLoader(SplitBinaryDataset(FeatureSpec.from_yaml(dataset), "train"), rows).epoch(0)))


@pytest.mark.parametrize("name", MODELS)
def test_a_model_declares_the_contract_and_rebuilds_from_its_config(name, tiny_dataset):
    model = build(name, tiny_dataset)
    assert isinstance(model, CTRModel) and contract_problems(model) == []
    again = create_model(name, make_config(name, config_to_dict(model.config)))
    assert {k: v.shape for k, v in again.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", MODELS)
def test_a_model_scores_a_batch_into_one_logit_a_row(name, tiny_dataset):
    model = build(name, tiny_dataset).eval()
    batch = a_batch(tiny_dataset)
    with torch.no_grad():
        logits = model(batch.numerical, batch.categorical, batch.multi_hot)
        again = model(batch.numerical, batch.categorical, batch.multi_hot)
    assert logits.shape == (64,) and logits.dtype == torch.float32 and bool(torch.isfinite(logits).all())
    assert torch.equal(logits, again)  # scoring is deterministic
    model.train()
    model(batch.numerical, batch.categorical, batch.multi_hot).sum().backward()
    assert all(p.grad is not None for p in table_parameters(model.embeddings))  # every deep table is used


@pytest.mark.parametrize("name", MODELS)
def test_tables_first_order_and_optimizers_cover_every_parameter_once(name, tiny_dataset):
    model = build(name, tiny_dataset)
    tables, wide = table_parameter_ids(model), {id(p) for p in model.wide_parameters()}
    assert tables and all(id(p) in tables for p in table_parameters(model.embeddings))
    assert (model.wide_embeddings is None) == (not wide)
    optimizers = build_optimizers(model, "adam", 1e-3, "adagrad", 0.05, "sgd", 0.02)
    held = [id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]]
    assert sorted(held) == sorted(id(p) for p in model.parameters())  # each parameter in exactly one optimizer
    for opt in optimizers:
        ids = {id(p) for group in opt.param_groups for p in group["params"]}
        assert ids <= wide if opt.is_wide else not ids & wide
        assert ids <= tables if opt.is_table_optimizer else not ids & tables
    # the tables are reached through the declared protocols (``contract.TableCollection``), the deep ones redrawable
    assert table_modules(model) and all(isinstance(m, TableCollection) for m in table_modules(model))
    assert all(isinstance(m, RedrawnTables) for m in table_modules(model.embeddings))


def test_training_reaches_models_and_optimizers_through_declared_interfaces():
    """Issue #81: no attribute probes on models, their tables or optimizers in training (``getattr``/``hasattr`` of
    a name that one may or may not have): the step, the optimizers, the first-order fit, the dynamic rows, the
    states and the scoring ask the declared types and protocols instead."""
    import re
    from pathlib import Path

    train = Path(__file__).resolve().parents[2] / "ctrkit" / "train"
    pattern = r"(?:getattr|hasattr)\((?:self\.model|model|opt|m|module|coll|collection|bags|self\.optimizers\[\w+\])\b"
    files = ("step.py", "optim.py", "linear_fit.py", "dynamic_rows.py", "state.py", "scoring.py")
    probes = {f: re.findall(pattern, (train / f).read_text()) for f in files}
    assert {f: p for f, p in probes.items() if p} == {}


@pytest.mark.parametrize("name", MODELS)
def test_a_redraw_changes_the_deep_tables_and_keeps_the_rest(name, tiny_dataset):
    model = build(name, tiny_dataset)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    deep = {id(p) for p in table_parameters(model.embeddings)}
    drawn = redraw_tables(model, draw=3)
    assert {id(p) for p in drawn} == deep
    names = {id(p): n for n, p in model.named_parameters()}
    redrawn = {names[i] for i in deep}
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]) != (k in redrawn), k


@pytest.mark.parametrize("name", MODELS)
def test_the_warm_start_fits_a_first_order_term_or_leaves_a_model_without_one(name, tiny_dataset):
    model = build(name, tiny_dataset)
    data = FeatureSpec.from_yaml(tiny_dataset)
    train_set, validation = SplitBinaryDataset(data, "train"), SplitBinaryDataset(data, "test")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fit = fit_warm_start(model, model, train_set, validation, None)
    if model.wide_embeddings is None:
        assert fit is None and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        return
    assert 0.5 < fit["validation_auc"] <= 1 and fit["rows"] == len(train_set)
    assert not bool(model.output_layer.weight.any())  # the deep output zeroed: the model is its regression
    assert any(
        not torch.equal(p, before[n])
        for n, p in model.named_parameters()
        if id(p) in {id(q) for q in model.wide_parameters()}
    )


@pytest.mark.parametrize("name", MODELS)
def test_a_trained_model_saves_and_scores_again_as_it_was_tested(name, tiny_dataset, tmp_path):
    path = tmp_path / "m.pt"
    result = train(
        tiny_dataset,
        name,
        embedding_dim=8,
        epochs=1,
        max_steps=15,
        batch_size=512,
        save_checkpoint=path,
        progress=False,
    )
    scoring = Scoring.load(path, tiny_dataset, "test", device="cpu")
    labels = scoring.dataset.labels()
    auc = roc_auc_score(labels, scoring.logits())
    assert np.isfinite(result["auc"]) and auc == pytest.approx(result["auc"], abs=1e-6)


def test_a_fourth_registered_model_is_checked_with_no_test_edited():
    module = sys.modules[__name__]
    cases = [n for n in dir(module) if n.startswith("test_") and hasattr(getattr(module, n), "pytestmark")]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            __file__,
            "-p",
            "tests.models.toy_model",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-k",
            "toy",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"{len(cases)} passed" in done.stdout, done.stdout[-1000:]
