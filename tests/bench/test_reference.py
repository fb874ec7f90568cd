"""The accuracy panel's reachable reference: the planted generator's own model form, fitted on the training rows."""

from __future__ import annotations

import numpy as np
import torch

from ctrkit.bench.accuracy import splits, targets
from ctrkit.bench.reference import L2_GRID, PlantedForm, fitted_reference
from ctrkit.data.synthetic_planted import PlantedCTR, generate_planted


def test_the_form_holds_the_generators_click_model():
    """Set to the generator's own effects, latent vectors and pair weight, the form gives its log-odds of the ids: it
    is the generator's form, not an approximation of it."""
    planted = PlantedCTR(cardinalities=(5, 40, 300, 2000, 30), num_numerical=0, seed=3, num_pairs=4)
    form = PlantedForm(planted.cardinalities, planted.pairs, planted.latents[0].shape[1], 0)
    with torch.no_grad():
        form.bias.fill_(planted.bias)
        for f, table in enumerate(form.effects):
            table.weight.copy_(torch.from_numpy(planted.effects[f][:, None]))
        for f in form.in_pairs:
            form.latents[str(f)].weight.copy_(torch.from_numpy(planted.latents[f]))
        form.pair_scale.fill_(planted.pair_weight)
        block = planted.sample(np.random.default_rng(0), 2000)
        logits = form(torch.zeros(2000, 0), torch.from_numpy(block.categorical)).double().numpy()
    np.testing.assert_allclose(logits, planted.id_logits(block.categorical), atol=1e-4)


def test_the_reference_is_fitted_on_planted_data_and_read_as_the_target(tmp_path, monkeypatch):
    """On a planted data set (its spec names the interacting pairs) the reference is fitted with an L2 of its grid
    and scores the test rows between chance and Bayes; a data set without the structure has none; the targets read
    each model's share of the regression -> reference gap."""
    monkeypatch.setattr("ctrkit.bench.reference.EPOCHS", 4)  # the test's budget, not the benchmark's
    spec = generate_planted(tmp_path / "p", 12_000, seed=1, progress=False)
    assert spec.metadata["pairs"] and spec.metadata["latent_dim"] == 4
    result = fitted_reference(*splits(tmp_path / "p", 0.1))
    assert result is not None and result["chosen"]["l2"] in L2_GRID and result["chosen"]["epochs"] >= 1
    assert 0.6 < result["auc"] < spec.metadata["bayes_test_auc"], result
    tabular = generate_planted(tmp_path / "t", 3000, family="tabular", progress=False)
    assert "pairs" not in tabular.metadata and fitted_reference(*splits(tmp_path / "t", 0.1)) is None
    results = {"logistic": {"auc": 0.70}, "reference": {"auc": 0.80}, "dlrm": {"auc": 0.79, "model": "dlrm"},
               "dcnv2": {"auc": 0.75, "model": "dcnv2"}}  # fmt: skip
    lines = targets([{"dataset": "p", "results": results}])
    assert (
        "p: share of the logistic regression -> fitted planted form gap (0.7000 -> 0.8000): DLRM 90%, DCNv2 50%"
        in lines
    )
