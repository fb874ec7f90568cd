"""The models' numerical normaliser: raw amounts logged, every feature standardised on training data,
the identity for checkpoints from before it, and the same inputs in an ONNX export."""

import numpy as np
import onnxruntime as ort
import pytest
import torch

from ctrkit.checkpoint import load_checkpoint
from ctrkit.models.numerical import LOG_ABOVE, NumericalNormalizer
from ctrkit.models.registry import create_model, make_config
from tests.conftest import run_cli, small_model_flags


def test_fit_logs_raw_amounts_and_standardises():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(20000, 3, generator=gen)
    x = torch.stack([z[:, 0], torch.exp(1.5 * z[:, 1]) * 1000, 5 + 0.01 * z[:, 2]], 1)  # normal, raw, narrow
    norm = NumericalNormalizer(3)
    torch.testing.assert_close(norm(x), x)  # the identity until fitted
    fitted = norm.fit(x)
    assert fitted["logged"] == [1]  # only the heavy-tailed amount (|x| beyond LOG_ABOVE)
    assert float(x[:, 1].abs().quantile(0.999)) > LOG_ABOVE > float(x[:, 0].abs().quantile(0.999))
    y = norm(x)
    torch.testing.assert_close(y.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(y.std(0), torch.ones(3), atol=1e-3, rtol=0)
    logged = torch.log1p(x[:, 1].double())  # the logged feature is standardised log1p, so normal again here
    expect = (logged - logged.mean()) / logged.std()
    torch.testing.assert_close(y[:, 1].double(), expect, atol=1e-4, rtol=0)
    # negative amounts: the signed log
    signed = NumericalNormalizer(1)
    signed.fit(torch.tensor([[-1e4], [1e4], [0.0], [50.0], [-300.0]]))
    assert signed.log_mask.item() == 1.0
    out = signed(torch.tensor([[-1e4], [1e4]]))
    assert out[0, 0] == pytest.approx(-out[1, 0].item() + 2 * (-signed.shift.item() / signed.scale.item()), abs=1e-5)


def test_checkpoints_from_before_the_normaliser_load_as_identity():
    cfg = make_config("dlrm", dict(num_numerical=2, cardinalities=[5, 7], embedding_dim=4, bottom_mlp=(8, 4)))
    model = create_model("dlrm", cfg)
    old = {k: v for k, v in model.state_dict().items() if not k.startswith("numerical_norm.")}
    fresh = create_model("dlrm", cfg)
    fresh.numerical_norm.fit(torch.randn(100, 2) * 1000)
    fresh.load_state_dict(old)  # strict: no missing-key error
    x = torch.randn(4, 2)
    torch.testing.assert_close(fresh.numerical_norm(x), x)
    with pytest.raises(RuntimeError, match="numerical_norm"):  # a partial normaliser state is still an error
        create_model("dlrm", cfg).load_state_dict({**old, "numerical_norm.shift": torch.zeros(2)})


@pytest.fixture(scope="module")
def raw_dataset(tmp_path_factory):
    """planted-tabular data whose numericals are raw amounts: exp(1.5 x) * 10^j (float32)."""
    out = tmp_path_factory.mktemp("raw") / "data"
    code, _, _ = run_cli("synth", "planted-amounts", "--out", out, "--rows", "6000", "--seed", "3")
    assert code == 0
    return out


def test_normalizer_sample_takes_each_row_once():
    from ctrkit.data.batch import Batch
    from ctrkit.models.numerical import NORMALIZER_ROWS, normalizer_sample

    class Rows:  # row i's numerical value is i
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def slice(self, start, stop):
            ids = torch.arange(start, stop)
            return Batch(ids.float().unsqueeze(1), ids.unsqueeze(1), torch.zeros(stop - start))

    for n in (5, 9000, 9001):  # fewer rows than the cap: all of them, none twice
        assert normalizer_sample(Rows(n)).flatten().tolist() == list(range(n))
    many = normalizer_sample(Rows(10 * NORMALIZER_ROWS)).flatten()
    assert len(many) == NORMALIZER_ROWS and len(many.unique()) == NORMALIZER_ROWS
    assert many.max() > 9 * NORMALIZER_ROWS  # spread over the whole mapping, not its head
    with pytest.raises(ValueError, match=r"expected \(n, 2\)"):
        NumericalNormalizer(2).fit(torch.zeros(4, 3))


def test_training_fits_it_and_the_onnx_export_scores_the_same(raw_dataset, tmp_path, capsys):
    ckpt = tmp_path / "m.pt"
    code, _, _ = run_cli("train", "--dataset", raw_dataset, "--max-steps", "10", "--batch-size", "256",
                         "--numerical-buckets", "16", "--no-progress", "--save-checkpoint", ckpt,
                         *small_model_flags())  # its normaliser and buckets are read below  # fmt: skip
    assert code == 0
    model = load_checkpoint(ckpt).build_model().eval()
    assert model.numerical_norm.log_mask.sum() >= 4  # the large-scale amounts were logged
    assert (model.wide_buckets.cuts < torch.finfo(torch.float32).max).any()  # and the first-order term's buckets cut
    assert model.wide_buckets.weight.abs().max() > 0  # and weighted (the warm start), so the export must add them
    code, _, _ = run_cli("export", "--checkpoint", ckpt, "--format", "onnx", "--out", tmp_path / "onnx", capsys=capsys)
    assert code == 0
    from ctrkit.data.dataset import SplitBinaryDataset

    batch = SplitBinaryDataset(raw_dataset, "test").slice(0, 300)
    with torch.no_grad():
        ref = torch.sigmoid(model(batch.numerical, batch.categorical)).numpy()[:, None]
        inputs = model.numerical_norm(batch.numerical)
    assert float(inputs.abs().max()) < 10  # what the MLPs see: standardised, not amounts up to 1e5+
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(["probability"], {"numerical": batch.numerical.numpy(), "categorical": batch.categorical.numpy()})
    np.testing.assert_allclose(got[0], ref, atol=1e-5)
