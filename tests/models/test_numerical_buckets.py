"""The first-order term's numerical buckets: cut points at training quantiles, one weight per bucket, nothing
added before fitting or for checkpoints from before them."""

import numpy as np
import pytest
import torch

from ctrkit.models.numerical import MIN_RARER_PER_BUCKET, UNUSED_CUT, NumericalBuckets
from ctrkit.models.registry import create_model, make_config


def test_fit_cuts_continuous_values_into_equal_shares():
    x = torch.randn(16000, 2, generator=torch.Generator().manual_seed(0))
    buckets = NumericalBuckets(2, 8)
    assert (buckets.bucket_ids(x * 1e30)[:, 0] == 0).all()  # unfitted: every value in bucket 0
    assert buckets.fit(x)["buckets"] == [8, 8]
    ids = buckets.bucket_ids(x)
    for f in range(2):
        shares = torch.bincount(ids[:, f] - f * 8, minlength=8).double() / len(x)
        torch.testing.assert_close(shares, torch.full((8,), 1 / 8, dtype=torch.float64), atol=2e-3, rtol=0)
        expect = np.searchsorted(
            np.quantile(x[:, f].numpy(), np.arange(1, 8) / 8, method="lower"), x[:, f].numpy(), side="right"
        )
        assert (ids[:, f] - f * 8).numpy().tolist() == expect.tolist()


def test_few_clicks_cut_fewer_buckets_at_the_coarser_quantiles():
    x = torch.randn(16000, 2, generator=torch.Generator().manual_seed(1))
    coarse = NumericalBuckets(2, 4)
    assert coarse.fit(x)["buckets"] == [4, 4]
    buckets = NumericalBuckets(2, 16)
    assert buckets.fit(x, rarer_label_rows=4 * MIN_RARER_PER_BUCKET + 99)["buckets"] == [4, 4]
    assert torch.equal(buckets.cuts[:, :3], coarse.cuts)  # the 4-bucket cuts, the other slots unused
    assert (buckets.cuts[:, 3:] == UNUSED_CUT).all()
    assert buckets.fit(x, rarer_label_rows=2 * MIN_RARER_PER_BUCKET - 1)["buckets"] == [1, 1]  # one: no cut
    assert (buckets.cuts == UNUSED_CUT).all() and (buckets.bucket_ids(x)[:, 1] == 16).all()
    assert buckets.fit(x, rarer_label_rows=10**6)["buckets"] == [16, 16]  # many: the configured count


def test_counts_with_ties_get_one_bucket_per_distinct_cut_and_none_empty():
    # a count feature: half zeros, then ones, twos and a tail; quantile levels fall on repeated values
    values = torch.tensor([0.0] * 500 + [1.0] * 200 + [2.0] * 100 + list(range(3, 203)), dtype=torch.float32)
    buckets = NumericalBuckets(1, 16)
    (count,) = buckets.fit(values.unsqueeze(1))["buckets"]
    finite = buckets.cuts[0][buckets.cuts[0] < torch.finfo(torch.float32).max]
    assert count == len(finite) + 1 < 16 and (finite[1:] > finite[:-1]).all()  # distinct cuts only
    ids = buckets.bucket_ids(values.unsqueeze(1))[:, 0]
    assert torch.bincount(ids, minlength=count).min() > 0  # no empty bucket (zero is not a cut: it is the minimum)
    assert ids[values == 0].unique().tolist() == [0] and ids[values == 1].unique().tolist() == [1]
    assert not torch.isin(finite, values).any()  # every cut lies between two observed values, never on one
    assert (buckets.cuts[0][count - 1 :] == torch.finfo(torch.float32).max).all()  # unused cuts: finite


def test_a_last_bit_change_of_an_observed_value_keeps_its_bucket():
    values = torch.tensor([0.0] * 50 + [0.6931472] * 30 + [1.0986123] * 20).unsqueeze(1)  # log(1 + count)
    buckets = NumericalBuckets(1, 4)
    buckets.fit(values)
    for v in values.unique():
        nudged = torch.stack([torch.nextafter(v, v - 1), v, torch.nextafter(v, v + 1)]).unsqueeze(1)
        assert buckets.bucket_ids(nudged)[:, 0].unique().numel() == 1


def test_weights_are_summed_over_features_and_start_at_zero():
    buckets = NumericalBuckets(3, 4)
    x = torch.randn(200, 3)
    buckets.fit(x)
    assert (buckets(x) == 0).all()
    with torch.no_grad():
        buckets.weight.copy_(torch.arange(12.0))
    ids = buckets.bucket_ids(x)
    torch.testing.assert_close(buckets(x), ids.float().sum(1))  # weight i is i here
    with pytest.raises(ValueError, match=r"expected \(n, 3\)"):
        buckets.fit(torch.zeros(4, 2))


def config(**extra):
    return make_config("dlrm", dict(num_numerical=2, cardinalities=[5, 7], embedding_dim=4, bottom_mlp=(8, 4), **extra))


def test_checkpoints_from_before_the_buckets_load_with_the_buckets_adding_nothing():
    model = create_model("dlrm", config())
    old = {k: v for k, v in model.state_dict().items() if not k.startswith("wide_buckets.")}
    fresh = create_model("dlrm", config())
    fresh.wide_buckets.fit(torch.randn(100, 2))
    with torch.no_grad():
        fresh.wide_buckets.weight.fill_(1.0)
    fresh.load_state_dict(old)  # strict: no missing-key error
    x = torch.randn(6, 2)
    assert (fresh.wide_buckets(x) == 0).all()
    with torch.device("meta"):  # built without memory, as a memory-mapped checkpoint is loaded
        lazy = create_model("dlrm", config())
    lazy.load_state_dict(old, assign=True)
    assert not lazy.wide_buckets.cuts.is_meta and not lazy.wide_buckets.weight.is_meta
    assert not lazy.numerical_norm.shift.is_meta
    assert (lazy.wide_buckets(x) == 0).all()
    with pytest.raises(RuntimeError, match="wide_buckets"):  # a partial bucket state is still an error
        create_model("dlrm", config()).load_state_dict({**old, "wide_buckets.weight": torch.zeros(2 * 16)})


def test_numerical_buckets_zero_builds_no_buckets_and_bad_counts_are_refused():
    assert create_model("dlrm", config(numerical_buckets=0)).wide_buckets is None
    assert create_model("dlrm", config(linear=False)).wide_buckets is None
    with pytest.raises(ValueError, match="numerical_buckets"):
        create_model("dlrm", config(numerical_buckets=1))


def test_training_on_few_clicks_cuts_fewer_buckets_and_none_where_they_fit_nothing(tmp_path):
    import json

    import polars as pl

    from ctrkit.bench.panel import write_tabular
    from ctrkit.train.run import train

    rng = np.random.default_rng(0)
    n = 6000
    x = rng.normal(size=(n, 2))
    middle = np.abs(x[:, 0]) < 0.674  # the middle two quartiles of x0 click more: no line fits that
    labels = (rng.random(n) < np.where(middle, 0.16, 0.05)).astype(np.uint8)  # x1 has no effect at all
    frame = pl.DataFrame({"c": rng.integers(0, 20, n), "x0": x[:, 0], "x1": x[:, 1], "label": labels})
    write_tabular(tmp_path / "d", frame[:5000], frame[5000:], "label", ["c"], ["x0", "x1"])
    train_rows = frame[:4500]  # the trainer holds out the last 10% of train
    clicks = int(train_rows["label"].sum())
    want = min(16, min(clicks, len(train_rows) - clicks) // MIN_RARER_PER_BUCKET)
    assert 4 <= want < 8
    log = tmp_path / "log.jsonl"
    train(tmp_path / "d", model="wide_deep", max_steps=1, progress=False, log_path=log, numerical_buckets=16)
    fitted = [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "numerical_normalizer"]
    assert fitted[0]["buckets"] == [want, 1]


def test_buckets_are_kept_only_where_the_one_feature_regression_earns_them():
    g = torch.Generator().manual_seed(3)
    n = 40000
    x = torch.randn(n, 3, generator=g)
    logit = -1.0 + 1.5 * (x[:, 0].abs() > 1) + 0.8 * x[:, 1]  # x0: a U shape; x1: linear; x2: nothing
    y = (torch.rand(n, generator=g) < torch.sigmoid(logit)).double()
    buckets = NumericalBuckets(3, 16)
    counts = buckets.fit(x, labels=y, seen=x)["buckets"]
    assert counts[0] >= 4 and counts[1] <= 2 and counts[2] <= 2  # x1's line is the linear term's
    assert (buckets.cuts[0, : counts[0] - 1] < UNUSED_CUT).all() and (
        buckets.cuts[0, counts[0] - 1 :] == UNUSED_CUT
    ).all()
    assert buckets.fit(x, labels=y)["buckets"] == counts  # no normaliser: the linear term sees the raw values
    assert buckets.fit(x)["buckets"] == [16, 16, 16]  # without labels: the configured count
    # the Newton fit against scikit-learn's (almost unpenalised) logistic regression on the same design
    from sklearn.linear_model import LogisticRegression

    from ctrkit.models.numerical import _deviance

    s = x[:, 1].double()
    ours = _deviance(s, y, None, 0)
    ref = LogisticRegression(C=1e6, max_iter=1000).fit(s.numpy()[:, None], y.numpy())
    p = ref.predict_proba(s.numpy()[:, None])[:, 1]
    theirs = float(-2 * (y.numpy() * np.log(p) + (1 - y.numpy()) * np.log(1 - p)).sum())
    assert abs(ours - theirs) < 1e-6 * abs(theirs)


def test_data_without_categorical_features_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="no categorical features"):
        make_config("dcnv2", dict(num_numerical=3, cardinalities=[]))


def test_training_binary_search_gives_the_comparisons_buckets():
    """In training the buckets come from a binary search of the cuts; evaluation and export count the cuts at
    or below each value. Both give the same ids, for values on a cut, beside it, far beyond every cut, and
    for a feature with unused cuts; and the same term and gradient, bit for bit (13 features, as Criteo's:
    from about that many, a sum over features rounds differently if the ids are laid out column-major)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4000, 13, generator=gen) * torch.logspace(-3, 3, 13)
    x[:, 12] = torch.randint(0, 3, (4000,), generator=gen).float()  # a count of 3 values: 2 cuts, 5 unused
    buckets = NumericalBuckets(13, 8)
    buckets.fit(x)
    cuts = buckets.cuts
    on_cuts = cuts.t().clone()  # (7, 13): every cut
    on_cuts[2:, 12] = cuts[12, 0]  # not the last feature's unused ones (the largest float32)
    nudged = torch.cat([torch.nextafter(on_cuts, on_cuts - 1), torch.nextafter(on_cuts, on_cuts + 1)])
    values = torch.cat([x, on_cuts, nudged, torch.full((2, 13), 3e38), torch.full((2, 13), -3e38)])
    with torch.no_grad():
        counted = buckets.bucket_ids(values)
    searched = buckets.bucket_ids(values)  # grad enabled: the training path
    assert torch.equal(searched, counted)
    assert (cuts[12, 2:] == UNUSED_CUT).all() and counted[:, 12].unique().numel() == 3
    assert counted[:, 0].unique().numel() == 8
    with torch.no_grad():
        buckets.weight.normal_(generator=gen)
    # 2,000 rows: 26,000 ids, under ATen's grain size, where the reference (torch's backward of indexing) adds
    # in one order too (above it, from several threads: see the next test)
    values, counted = values[-2000:], counted[-2000:]
    upstream = torch.randn(len(values), generator=gen)
    out = buckets(values)
    (out * upstream).sum().backward()
    grad, buckets.weight.grad = buckets.weight.grad, None
    ref = buckets.weight[counted].sum(1)  # indexed with the comparison's ids
    (ref * upstream).sum().backward()
    assert torch.equal(out, ref) and torch.equal(grad, buckets.weight.grad)


def test_training_gradient_is_the_same_every_run_at_large_batches():
    """Above ATen's grain (32,768 ids: a batch of 2,521 rows of 13 features) torch's backward of indexing adds
    with atomic operations from several threads, in a varying order; the training path's gradient is the same
    bits every time, and the sum per weight."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(8192, 13, generator=gen)
    buckets = NumericalBuckets(13, 16)
    buckets.fit(x)
    with torch.no_grad():
        buckets.weight.normal_(generator=gen)
    upstream = torch.randn(len(x), generator=gen)
    grads = []
    for _ in range(6):
        (buckets(x) * upstream).sum().backward()
        grads.append(buckets.weight.grad)
        buckets.weight.grad = None
    assert all(torch.equal(grads[0], g) for g in grads[1:])
    reference = torch.zeros(13 * 16, dtype=torch.float64).index_add_(
        0, buckets.bucket_ids(x).flatten(), upstream.double().repeat_interleave(13)
    )
    torch.testing.assert_close(grads[0].double(), reference, rtol=1e-5, atol=1e-4)


def test_the_akaike_fits_over_distinct_values_equal_the_fits_over_rows():
    """The choice's fits run on each distinct value's row count and clicks; the same deviances as over the rows."""
    from ctrkit.models.numerical import _deviance, bucket_of

    gen = torch.Generator().manual_seed(5)
    x = torch.randint(0, 40, (20_000,), generator=gen).double()  # a count: 40 distinct values
    s = (x - x.mean()) / x.std()
    y = (torch.rand(20_000, generator=gen) < torch.sigmoid((x - 20).abs() / 8 - 1.5)).double()
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    clicks = torch.bincount(inverse, y)
    s_value = torch.zeros(len(values), dtype=torch.float64).scatter_(0, inverse, s)
    for cut in (None, torch.tensor([9.5, 19.5, 29.5], dtype=torch.float64)):
        ids, ids_value, k = (None, None, 0) if cut is None else (bucket_of(x, cut), bucket_of(values, cut), 4)
        rows = _deviance(s, y, ids, k)
        grouped = _deviance(s_value, clicks, ids_value, k, weight=counts.double())
        assert grouped == pytest.approx(rows, rel=1e-10)
    assert len(values) == 40 and _deviance(s, y, bucket_of(x, cut), 4) < _deviance(s, y, None, 0) - 100  # a V shape
