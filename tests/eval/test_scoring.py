"""Scoring split over the CPU's threads (``predict_logits``) against one whole-batch forward pass, and the
precision a run scores in (``--eval-dtype``)."""

from __future__ import annotations

import numpy as np
import torch

from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.loader import BatchLoader
from ctrkit.device import DeviceFacts, cpu_native_bf16, device_facts, eval_dtype_for
from ctrkit.eval import evaluator
from ctrkit.eval.evaluator import predict_logits
from ctrkit.models.registry import create_model, make_config


def test_split_scoring_equals_one_forward_pass(tiny_dataset, two_threads, monkeypatch):
    spec = FeatureSpec.from_yaml(tiny_dataset)
    data = SplitBinaryDataset(spec, "test")
    model = create_model(
        "dlrm",
        make_config(
            "dlrm",
            {
                "num_numerical": 4,
                "cardinalities": spec.cardinalities,
                "embedding_dim": 8,
                "bottom_mlp": [32, 8],
                "top_mlp": [32, 1],
            },
        ),
    )
    model.eval()
    monkeypatch.setattr(evaluator, "SCORE_SLICE", 170)  # slices of 170 rows and a shorter last one
    calls = []
    real = evaluator._score_split
    monkeypatch.setattr(evaluator, "_score_split", lambda *a: calls.append(len(a[1])) or real(*a))
    got = predict_logits(model, data, torch.device("cpu"), batch_size=1000)
    assert calls == [1000, 1000, len(data) - 2000]  # every batch went through the threads
    whole = next(iter(BatchLoader(data, len(data), shuffle=False).epoch(0)))
    with torch.no_grad():
        want = model(whole.numerical, whole.categorical, whole.multi_hot).numpy()
    assert got.std() > 0.01  # scores that tell rows apart
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_eval_dtype_rule():
    cpu = device_facts(torch.device("cpu"))
    assert eval_dtype_for(cpu, None, None, True) is None
    assert eval_dtype_for(cpu, None, torch.bfloat16, True) is torch.bfloat16
    assert eval_dtype_for(cpu, None, torch.bfloat16, False) is None  # the device's default precision: scored in fp32
    assert eval_dtype_for(cpu, "fp32", torch.bfloat16, True) is None
    assert eval_dtype_for(cpu, "bf16", None, False) is (torch.bfloat16 if cpu_native_bf16() else None)
    for native, dtype in ((True, torch.bfloat16), (False, torch.float16)):  # a GPU without bf16 tensor cores: fp16
        assert eval_dtype_for(DeviceFacts("cuda", native), "bf16", None, False) is dtype
